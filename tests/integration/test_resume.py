"""A consumer killed mid-epoch and restarted from its checkpoint: nothing repeated, nothing skipped."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest

from stoker.accel import checkpoint
from stoker.accel.backends.accelerators import SimulatedAccelerator
from stoker.accel.consumer import Consumer, ConsumerConfig
from stoker.accel.stepping import given
from stoker.pipeline.job import JobConfig
from tests.helpers import Daemon, RecordingAccelerator, free_port


class Crash(Exception):
    pass


def test_a_restarted_consumer_continues_the_epoch_from_its_checkpoint(manifest, log_dir, tmp_path):
    cfg = ConsumerConfig(data_bind=f"tcp://127.0.0.1:{free_port()}", control_bind=f"tcp://127.0.0.1:{free_port()}",
                         metrics_port=None, host_timeout_s=3.0)
    job = JobConfig(manifest_uri=manifest.uri, epochs=2, batch_size=16, unit_batches=2)
    before = RecordingAccelerator(rate=300)
    first = Consumer(cfg, job, given(before))
    first.start()
    daemons = [Daemon(first.control_endpoint, f"host{i}", 1, log_dir) for i in range(2)]
    saved: dict = {}

    def step_then_maybe_die(consumer: Consumer) -> None:
        if len(before.stepped) * 16 >= 0.4 * 2 * manifest.num_samples:
            saved.update(consumer.state_dict())
            checkpoint.save(saved, tmp_path / "data.json")
            raise Crash  # the process dies right after its checkpoint

    try:
        with pytest.raises(Crash):
            first.run(on_step=step_then_maybe_die)
    finally:
        first.stop()  # sockets gone without a goodbye, like a killed process
    state = checkpoint.load(tmp_path / "data.json")
    assert state["step"] == len(before.stepped) and len(str(state)) < 600  # a position, not a list of units
    after = RecordingAccelerator(rate=300)
    second = Consumer(cfg, job, given(after), resume=state)
    try:
        summary = second.run()
        codes = [d.wait(timeout=60) for d in daemons]  # they hear "finished" from the live dispatcher
    finally:
        second.stop()
    assert codes == [0, 0], "\n".join(d.output()[-2000:] for d in daemons)
    assert second.job.job_id == first.job.job_id
    everything = np.concatenate([before.samples(), after.samples()])
    assert sorted(everything.tolist()) == sorted(list(range(manifest.num_samples)) * 2)  # each once per epoch
    assert summary.samples == len(after.samples()) and second.ledger.collisions == 0


def test_a_checkpoint_of_another_job_is_refused(manifest, tmp_path):
    job = JobConfig(manifest_uri=manifest.uri, epochs=2)
    state = checkpoint.state(job, 0, 3, [(0, 3)], 48)
    state["job"]["seed"] = 99
    cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=None)
    with pytest.raises(ValueError, match="seed"):
        Consumer(cfg, job, given(SimulatedAccelerator(rate=1)), resume=state)
    text = JobConfig(manifest_uri=manifest.uri, epochs=2, dataset="wikipedia")
    with pytest.raises(ValueError, match="was not known exactly"):  # a text rank's place in its unit unsure
        Consumer(cfg, replace(text, world_size=2), given(SimulatedAccelerator(rate=1)), resume=checkpoint.state(
            text, 0, 3, [(0, 3)], 48, unsure=[0]))


def test_a_text_checkpoint_resumed_with_another_sequence_length_is_refused_naming_it(wiki_manifest, tmp_path):
    """The text configuration is part of the job's identity: packed 128-token rows are not 256-token ones."""
    job = JobConfig(manifest_uri=wiki_manifest.uri, epochs=1, dataset="wikipedia", batch_size=8)
    ckpt = tmp_path / "text.json"
    checkpoint.save(checkpoint.state(job, 0, 2, [(0, 2)], 16), ckpt)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "stoker", "train", "--dataset", "wikipedia", "--data",
                             wiki_manifest.uri, "--batch-size", "8", "--seq-len", "256", "--accel", "null",
                             "--resume", str(ckpt), "--no-progress", "--data-bind", "tcp://127.0.0.1:0",
                             "--control-bind", "tcp://127.0.0.1:0", "--metrics-port", "-1"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and time.monotonic() - started < 30
    assert "text.seq_len: checkpoint 128, now 256" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("edit", [
    lambda state: [state],  # a JSON list
    lambda state: {k: v for k, v in state.items() if k != "job"},
    lambda state: state | {"ranks": [[-1, 0]]},
    lambda state: state | {"ranks": [[999, 0]]},
    lambda state: state | {"epoch": 99},
    lambda state: state | {"step": 10 ** 9},
    lambda state: state | {"ranks": [[1, 1000]]},
    lambda state: state | {"epoch": 1, "step": 10 ** 6},
    lambda state: state | {"ranks": [[5, 0]], "step": 0},
    lambda state: state | {"job": state["job"] | {"job_id": ""}},
], ids=["a-list", "no-job", "negative-rank-position", "rank-past-its-stream", "epoch-99", "step-past-the-epoch",
        "batches-past-the-unit", "step-past-epoch-1", "units-past-the-step", "empty-job-id"])
def test_an_edited_checkpoint_is_refused_with_one_line_within_seconds(manifest, tmp_path, edit):
    job = JobConfig(manifest_uri=manifest.uri, epochs=2, batch_size=16, unit_batches=2)
    ckpt = tmp_path / "data.json"
    ckpt.write_text(json.dumps(edit(checkpoint.state(job, 0, 3, [(1, 1)], 48))))
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "stoker", "train", "--data", manifest.uri, "--epochs", "2",
                             "--batch-size", "16", "--unit-batches", "2", "--accel", "null", "--resume", str(ckpt),
                             "--no-progress", "--data-bind", "tcp://127.0.0.1:0", "--control-bind",
                             "tcp://127.0.0.1:0", "--metrics-port", "-1"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and time.monotonic() - started < 30, result.stdout[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("stoker: error:")]
    assert len(errors) == 1 and "checkpoint" in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_train_cli_checkpoints_model_and_data_and_resumes(manifest, tmp_path, log_dir):
    """`stoker train --checkpoint` with a real model; a second run with --resume restores both."""
    import subprocess
    import sys

    import torch

    ckpt = tmp_path / "ckpt.json"
    control = f"tcp://127.0.0.1:{free_port()}"
    common = [sys.executable, "-m", "stoker", "train", "--data", manifest.uri, "--epochs", "1", "--batch-size", "16",
              "--image-size", "64", "--accel", "torch", "--width", "16", "--no-progress", "--metrics-port", "-1",
              "--data-bind", f"tcp://127.0.0.1:{free_port()}", "--control-bind", control,
              "--checkpoint", str(ckpt), "--checkpoint-every", "3"]
    train = subprocess.Popen(common, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    worker = Daemon(control, "h0", 1, log_dir)
    out, _ = train.communicate(timeout=180)
    assert train.returncode == 0, out
    assert worker.wait(timeout=60) == 0
    state = checkpoint.load(ckpt)
    assert state["epoch"] == 1 and checkpoint.model_path(ckpt).exists()  # saved at the end: the job is done
    model = torch.load(checkpoint.model_path(ckpt), weights_only=False)
    assert model["steps"] >= 10 and state["samples_stepped"] == manifest.num_samples  # saved at the end
    again = subprocess.run([*common, "--resume", str(ckpt)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "model and optimizer restored" in again.stdout and "delivered 0 samples" in again.stdout


def test_train_on_a_full_disk_says_which_checkpoint_in_one_line_and_keeps_the_last(manifest, full_disk, log_dir):
    """`stoker train --checkpoint` whose disk fills up: it used to end in "stoker: error: [Errno 28] No space
    left on device" and leave ckpt.json.tmp beside the checkpoint; now one line names the file and the flag,
    and the checkpoint before stays as it was."""
    folder, fill = full_disk
    ckpt = folder / "ckpt.json"
    ckpt.write_text('{"version": 3}')  # the one before (its content does not matter here)
    fill()
    control = f"tcp://127.0.0.1:{free_port()}"
    train = subprocess.Popen(
        [sys.executable, "-m", "stoker", "train", "--data", manifest.uri, "--epochs", "1", "--batch-size", "16",
         "--image-size", "64", "--accel", "simulated", "--rate", "500", "--no-progress", "--metrics-port", "-1",
         "--data-bind", f"tcp://127.0.0.1:{free_port()}", "--control-bind", control, "--checkpoint", str(ckpt),
         "--checkpoint-every", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    Daemon(control, "h0", 1, log_dir)
    _, err = train.communicate(timeout=120)
    assert train.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (f"stoker: error: cannot write checkpoint {ckpt}: no space left on device "
                                            f"(free space there or pass --checkpoint elsewhere)"), err[-3000:]
    assert ckpt.read_text() == '{"version": 3}' and sorted(p.name for p in folder.iterdir()) == ["ckpt.json", "filler"]
