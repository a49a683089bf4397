"""stoker/embedded.py: the closing line of `stoker run`, host cores per accelerator for the job's transform.
(The run itself: tests/integration/test_exactly_once.py and test_data_parallel.py.)"""

from __future__ import annotations

import pytest

from accel.accelerators import AccelSpec
from accel.summary import Summary
from stoker.embedded import print_summary, transform_cores


def _rank(rows: int = 2000, decode: float = 3.0, augment: float = 1.0, step: float = 8.0, **more) -> Summary:
    return Summary(samples=rows, unique_samples=rows, duplicates_dropped=0, epochs=1, elapsed_s=9.0, startup_s=1.0,
                   delivered_samples_per_s=250.0, stall_fraction=0.0, batches=1, hosts=2, procs_per_host=1,
                   skipped_samples=0, skipped=[], frames_dropped={}, units_released=0, rows=rows,
                   stage_seconds={"decode": decode, "augment": augment, "send": 0.0, "wait_for_credit": 4.0,
                                  "receive": 0.1, "copy": 0.0, "step": step, "stall": 0.0}, **more)


def test_cores_are_the_accelerators_rate_over_what_one_busy_worker_core_made():
    # 2,000 images over 4 s of decode + augment: 500 per core; a full-size a100 takes 2,500/s
    found = transform_cores([_rank()], AccelSpec("simulated", profile="a100", scale=0.1), "trivialaugment")
    assert found == {"transform": "trivialaugment", "accelerator": "a full-size a100", "accelerator_rate": 2500,
                     "per_core_rate": 500, "cores_needed": 5}
    rate = transform_cores([_rank()], AccelSpec("simulated", rate=300), "train")
    assert (rate["accelerator"], rate["cores_needed"]) == ("the simulated device", pytest.approx(0.6))
    torch = transform_cores([_rank(step=4.0)], AccelSpec("torch", model="resnet50", device="cuda"), "train")
    assert torch["accelerator"] == "this resnet50 step on cuda" and torch["accelerator_rate"] == 500  # rows/step s


def test_ranks_pool_their_rows_and_worker_seconds_and_the_accelerator_is_one_ranks():
    ranks = [_rank(rows=1000, decode=1.0, augment=1.0), _rank(rows=1000, decode=1.5, augment=0.5)]
    found = transform_cores(ranks, AccelSpec("simulated", profile="h100"), "train")
    assert (found["per_core_rate"], found["accelerator_rate"], found["cores_needed"]) == (500, 7000, 14)


def test_no_line_where_no_transform_ran_on_the_hosts_or_the_device_never_computes():
    assert transform_cores([_rank()], AccelSpec("null"), "train") is None
    assert transform_cores([_rank(decode_on="accelerator")], AccelSpec("simulated", rate=300), "train") is None
    assert transform_cores([_rank(dataset="wikipedia")], AccelSpec("simulated", rate=300), "train") is None
    assert transform_cores([_rank(rows=0)], AccelSpec("simulated", rate=300), "train") is None


def test_the_run_ends_with_the_transforms_cores(capsys):
    summary = _rank(bottleneck="compute", bottleneck_detail="waits 0%", rows_per_s=250.0, cores_needed=0.5,
                    cores_in_use=0.5)
    print_summary([summary], None, AccelSpec("simulated", profile="a100", scale=0.1), 'mine:Aug {"size":176}')
    assert capsys.readouterr().out.splitlines()[-1] == ("host cores needed for a full-size a100 (2,500 images/s): "
                                                        '5.0 (transform mine:Aug {"size":176}, 500 images/s per core)')
