"""stoker/embedded.py: the closing lines of `stoker run`, one host-cores answer per accelerator, in CPU time.
(The run itself: tests/integration/test_exactly_once.py and test_data_parallel.py.)"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from stoker import embedded
from stoker.accel.backends.accelerators import AccelSpec
from stoker.accel.summary import STEADY, WHOLE_RUN, Summary, job_totals
from stoker.embedded import cores_answer, cores_line, print_summary, run_manifest


def _rank(rows: int = 2000, cpu: float = 4.0, step: float = 8.0, **more) -> Summary:
    fields = dict(samples=rows, unique_samples=rows, duplicates_dropped=0, epochs=1, elapsed_s=9.0, startup_s=1.0,
                  delivered_samples_per_s=250.0, stall_fraction=0.0, batches=1, hosts=2, procs_per_host=1,
                  skipped_samples=0, skipped=[], frames_dropped={}, units_released=0, rows=rows,
                  stage_seconds={"decode": 0.75 * cpu, "augment": 0.2 * cpu, "send": 0.0, "cpu": cpu,
                                 "wait_for_credit": 4.0, "cpu_wait": 0.0, "receive": 0.1, "copy": 0.0, "step": step,
                                 "stall": 0.0},
                  per_core_rate=rows / cpu if cpu else 0.0, cpu_wait_fraction=0.0)
    return Summary(**{**fields, **more})


def test_cores_are_the_accelerators_rate_over_the_rows_one_cpu_second_made():
    # 2,000 images over 4 CPU-seconds: 500 per CPU-second; a full-size a100 takes 2,500/s
    found = cores_answer(_rank(), AccelSpec("simulated", profile="a100", scale=0.1), "trivialaugment")
    assert (found["accelerator"], found["accelerator_rate"], found["per_core_rate"], found["cores_needed"]) == \
        ("a full-size a100", 2500, 500, 5)
    assert found["unit"] == "images/s" and found["transform"] == "trivialaugment"
    rate = cores_answer(_rank(), AccelSpec("simulated", rate=300), "train")
    assert (rate["accelerator"], rate["cores_needed"]) == ("the simulated device", pytest.approx(0.6))
    torch = cores_answer(_rank(step=4.0), AccelSpec("torch", model="resnet50", device="cuda"), "train")
    assert torch["accelerator"] == "this resnet50 step on cuda" and torch["accelerator_rate"] == 500  # rows/step s


def test_ranks_pool_their_rows_and_worker_cpu_and_the_accelerator_is_one_ranks():
    job = job_totals([_rank(rows=1000, cpu=2.5), _rank(rows=1000, cpu=1.5)])
    assert job.per_core_rate == 500  # 2,000 rows over 4 CPU-seconds, not the mean of 400 and 667
    found = cores_answer(job, AccelSpec("simulated", profile="h100"), "train")
    assert (found["per_core_rate"], found["accelerator_rate"], found["cores_needed"]) == (500, 7000, 14)


def test_a_wait_for_a_core_not_measured_on_one_rank_is_not_measured_for_the_job():
    assert job_totals([_rank(), _rank(cpu_wait_fraction=None)]).cpu_wait_fraction is None
    waited = _rank(stage_seconds={**_rank().stage_seconds, "cpu": 3.0, "cpu_wait": 1.0})
    assert job_totals([waited, _rank()]).cpu_wait_fraction == pytest.approx(1.0 / 8.0)


def test_no_answer_where_the_device_never_computes_or_no_worker_cpu_came():
    assert cores_answer(_rank(), AccelSpec("null"), "train") is None
    assert cores_answer(_rank(cpu=0.0), AccelSpec("simulated", rate=300), "train") is None


def test_text_against_a_profile_is_sized_in_sequences_with_the_packing_factor():
    # the profile counts sequences (210/s at length 512); 1000 rows of 1.27 sequences in 2 CPU-seconds
    text = _rank(dataset="wikipedia", rows=1000, sequences=1270, cpu=2.0, seq_len=512, per_core_spread=[400, 600])
    found = cores_answer(text, AccelSpec("simulated", profile="a100"), "")
    assert found["unit"] == "sequences/s" and found["sequences_per_row"] == pytest.approx(1.27)
    assert found["per_core_rate"] == pytest.approx(635) and found["per_core_spread"] == pytest.approx([508, 762])
    assert found["cores_needed"] == pytest.approx(210 / 635)
    line = cores_line(found)
    assert "210 sequences/s over 635 sequences per CPU-second" in line and "1.27 sequences in a row" in line
    assert "--seq-len" not in line
    # rows of 128 tokens against a rate at 512: said, not hidden
    short = cores_line(cores_answer(replace(text, seq_len=128), AccelSpec("simulated", profile="a100"), ""))
    assert "the profile's rate is at length 512 and this run's rows hold 128 tokens" in short


def test_text_against_a_device_rate_is_sized_in_the_rows_it_steps():
    text = _rank(dataset="wikipedia", rows=1000, sequences=1270, cpu=2.0, seq_len=128)
    found = cores_answer(text, AccelSpec("simulated", rate=300), "")
    assert found["unit"] == "rows/s" and found["cores_needed"] == pytest.approx(300 / 500)
    assert "of the rate" in cores_line(found) and "--seq-len" not in cores_line(found)


@pytest.mark.parametrize(("cores", "shown"), [(0.04, "0.04"), (0.0043, "0.0043"), (0.5, "0.5"), (4.04, "4.0"),
                                              (37.4, "37")])
def test_the_run_ends_with_one_cores_figure_sized_to_its_value(capsys, cores, shown):
    summary = _rank(rows=2500, cpu=cores, bottleneck="compute", bottleneck_detail="waits 0%",
                    rows_per_s=250.0, per_core_spread=[480.0, 520.0])
    print_summary([summary], None, AccelSpec("simulated", profile="a100", scale=0.1), 'mine:Aug {"size":176}')
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if "cores needed" in line] == [lines[-1]]  # one figure, and only one
    assert lines[-1].startswith(f"host cores needed for a full-size a100: {shown} (2,500 images/s over ")
    assert lines[-1].endswith('per CPU-second (10-90% of the run: 480-520); transform mine:Aug {"size":176})')


def test_the_null_device_and_a_run_too_short_to_judge_size_nothing_in_the_json(tmp_path, capsys):
    out = tmp_path / "summary.json"
    print_summary([_rank(bottleneck="compute", cores_needed=8650.9, cores_in_use=0.4)], str(out), AccelSpec("null"))
    data = json.loads(out.read_text())
    assert data["cores_needed"] is None and data["cores"] is None  # a device that never computes needs nothing
    print_summary([_rank(cores_needed=0.0, cores_in_use=0.0)], str(out), AccelSpec("simulated", rate=5))
    data = json.loads(out.read_text())
    assert data["bottleneck"] == "unknown" and data["cores_needed"] is None  # not 0.0
    assert data["cores"]["cores_needed"] == pytest.approx(5 / 500)
    busy = [line for line in capsys.readouterr().out.splitlines() if line.startswith("worker CPU: ")]
    assert busy[-1].startswith("worker CPU: 0.5 cores busy on average")  # 4 CPU-seconds over 8 s, not the window's 0


def test_a_run_reads_the_manifest_given_else_its_datasets_default_set(monkeypatch, tmp_path):
    made = []
    monkeypatch.setattr(embedded, "default_manifest",
                        lambda dataset, images, progress: made.append((dataset, images, progress)) or tmp_path / "m")
    assert run_manifest("given.json", "imagenet", 100) == "given.json" and made == []
    assert run_manifest(None, "wikipedia", 100, progress=False) == str(tmp_path / "m")
    assert made == [("wikipedia", 100, False)]


def test_a_tokens_job_is_sized_in_tokens_per_cpu_second_as_the_token_plan_counts_them():
    """2,000 rows of 60 real tokens (of 64) over 4 CPU-seconds: 30,000 tokens per CPU-second; a device taking 300
    rows/s takes 18,000 tokens/s, and the a100 profile's GPT-2 rate is 104 rows of 1,024 tokens."""
    text = _rank(dataset="tokens", rows=2000, sequences=2500, tokens=120_000, cpu=4.0, seq_len=64,
                 per_core_spread=[400.0, 600.0])
    rate = cores_answer(text, AccelSpec("simulated", rate=300), "")
    assert rate["unit"] == "tokens/s" and rate["per_core_rate"] == pytest.approx(30_000)
    assert rate["accelerator_rate"] == pytest.approx(18_000) and rate["cores_needed"] == pytest.approx(0.6)
    assert rate["per_core_spread"] == pytest.approx([24_000, 36_000])
    line = cores_line(rate)
    assert "18,000 tokens/s over 30,000 tokens per CPU-second" in line and "60.0 in a row of 64" in line
    assert "sequences" not in line and "--seq-len" not in line
    profile = cores_answer(text, AccelSpec("simulated", profile="a100"), "")
    assert profile["accelerator_rate"] == 104 * 1024 and profile["cores_needed"] == pytest.approx(104 * 1024 / 30_000)
    torch = cores_answer(replace(text, stage_seconds={**text.stage_seconds, "step": 2.0}),
                         AccelSpec("torch", model="gpt-tiny", device="cpu"), "")
    assert torch["accelerator_rate"] == pytest.approx(60_000)  # its tokens over its step seconds


def test_stoker_run_on_a_tokens_job_reports_the_jobs_rows_and_answers_in_tokens(tmp_path):
    """Through the command line: the JSON's seq_len and lm_mode are the job's --lm-seq-len and --lm-mode (not
    BERT's 128), and the cores answer is in tokens per CPU-second."""
    import subprocess
    import sys

    from tests.token_corpus import prepared

    result, _, _ = prepared(tmp_path / "set", count=80)
    out = tmp_path / "summary.json"
    run = subprocess.run([sys.executable, "-m", "stoker", "run", "--data", result.manifest.uri, "--lm-seq-len", "16",
                          "--lm-mode", "concat", "--batch-size", "4", "--accel", "simulated", "--rate", "400",
                          "--no-progress", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    assert (data["seq_len"], data["lm_mode"]) == (16, "concat")
    assert data["cores"]["unit"] == "tokens/s" and data["cores"]["seq_len"] == 16
    assert "tokens per CPU-second" in run.stdout.splitlines()[-2]  # the cores line, before "summary written"


def test_a_run_too_short_after_start_up_prints_its_figures_over_the_whole_run(tmp_path, capsys):
    """300 documents arrived with the first batch: 3.6 s of start-up, 1 ms after it. Over that millisecond the
    workers' 0.27 CPU-seconds read 270 cores busy; over the whole run they are 0.075, and the lines say so."""
    out = tmp_path / "summary.json"
    short = _rank(dataset="tokens", rows=52, samples=300, unique_samples=300, sequences=307, tokens=52_000, cpu=0.27,
                  elapsed_s=3.6, startup_s=3.599, delivered_samples_per_s=300 / 3.6, stall_fraction=1.0,
                  rates_over=WHOLE_RUN, tokens_per_s=52_000 / 3.6, sequences_per_s=307 / 3.6,
                  bottleneck_detail="too short after start-up: 0.00 s and 1 step(s) after the first batch")
    print_summary([short], str(out), AccelSpec("simulated", rate=50))
    lines = capsys.readouterr().out.splitlines()
    assert "83 documents/s and stall 100.0% over the whole run, start-up included" in lines[0]
    assert "14444 tokens/s (over the whole run)" in next(line for line in lines if line.startswith("text: "))
    assert any(line.startswith("bottleneck: not judged (too short after start-up: 0.00 s and 1 step(s)")
               for line in lines)
    assert any(line.startswith("worker CPU: 0.075 cores busy on average over the whole run,") for line in lines)
    data = json.loads(out.read_text())
    assert data["rates_over"] == WHOLE_RUN and data["delivered_samples_per_s"] == pytest.approx(300 / 3.6)
    assert data["cores_needed"] is None and data["cores_in_use"] is None  # nothing sized over no window
    print_summary([short, replace(short, rank=1, rates_over=STEADY)], None, AccelSpec("null"))
    lines = capsys.readouterr().out.splitlines()  # a rank's line says which ranks' rates are the whole run's
    assert lines[0].endswith("(over the whole run: too short for a steady rate)") and lines[1].endswith("%")
    assert "over the whole run, start-up included" in lines[2]  # and the job's with it


@pytest.mark.parametrize(("dataset", "model", "stepped"), [
    ("tokens", "resnet18", "gpt-tiny"), ("tokens", "gpt-tiny", "gpt-tiny"), ("wikipedia", "resnet18", "bert-tiny"),
    ("wikipedia", "bert-base", "bert-base"), ("imagenet", "resnet50", "resnet50")])
def test_the_torch_answer_names_the_model_the_step_ran_not_the_model_flags_default(dataset, model, stepped):
    """--model defaults to resnet18, the images' model; a tokens job steps gpt-tiny and a BERT job bert-tiny."""
    rank = _rank(dataset=dataset, rows=2000, sequences=2500, tokens=120_000, seq_len=64)
    found = cores_answer(rank, AccelSpec("torch", model=model, device="cpu"), "")
    assert found["accelerator"] == f"this {stepped} step on cpu"
    assert cores_line(found).startswith(f"host cores needed for this {stepped} step on cpu: ")
