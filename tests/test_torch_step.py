"""Real PyTorch training steps on batches that came through real worker processes and sockets."""

from __future__ import annotations

import numpy as np
import pytest

from accel.accelerators import AccelSpec, make_accelerator
from accel.models.resnet import resnet18, resnet50
from tests.helpers import assert_exactly_once, consumer_for


def test_resnet_parameter_counts_match_torchvision():
    assert sum(p.numel() for p in resnet50().parameters()) == 25_557_032
    assert sum(p.numel() for p in resnet18().parameters()) == 11_689_512


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "serial"])
def test_resnet18_learns_from_stoker_batches_and_times_add_up(manifest, run_job, overlap):
    consumer = consumer_for(manifest.uri, epochs=6, batch_size=16, unit_batches=2, image_size=112, transform="eval")
    consumer.cfg = type(consumer.cfg)(**{**consumer.cfg.__dict__, "overlap": overlap})
    accel = make_accelerator(AccelSpec(kind="torch", model="resnet18", width=16, lr=0.1), "imagenet",
                             len(manifest.classes))
    consumer.accelerator = accel
    job = run_job(consumer)
    summary = job.finish(timeout=300)
    assert_exactly_once(summary, manifest.num_samples, 6)
    per_epoch = len(accel.losses) // 6
    first, last = np.mean(accel.losses[:per_epoch]), np.mean(accel.losses[-per_epoch:])
    assert last < 0.7 * first, f"loss did not fall: {first:.3f} -> {last:.3f}"
    s = summary.stage_seconds
    accounted = summary.startup_s + s["stall"] + s["step"] + (0 if overlap else s["copy"])
    assert abs(accounted - summary.elapsed_s) < 0.05 * summary.elapsed_s, (accounted, summary.elapsed_s)
    assert s["copy"] > 0
