"""Wikipedia/BERT batches end to end: real worker daemons, real sockets, the real consumer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from stoker.accel.backends.accelerators import SimulatedAccelerator
from stoker.accel.batch import ReceivedBatch
from stoker.pipeline.job import JobConfig
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.examples import TextConfig
from stoker.pipeline.text.layout import attention_blocks
from tests.helpers import assert_exactly_once, consumer_for, scrape


class CheckingAccelerator(SimulatedAccelerator):
    """A simulated device that also checks every packed row it is given."""

    def __init__(self, rate: float) -> None:
        super().__init__(rate)
        self.rows = 0
        self.leaks = 0

    def step(self, batch: ReceivedBatch) -> None:
        mask = batch.tensor("attention_mask")
        allowed = attention_blocks(mask)
        self.leaks += int(np.count_nonzero(allowed & (mask[:, :, None] != mask[:, None, :])))
        self.rows += batch.size
        super().step(batch)


def test_every_document_once_per_epoch_with_packing_and_padding_metrics(wiki_manifest, run_job):
    accel = CheckingAccelerator(rate=3000)
    consumer = consumer_for(wiki_manifest.uri, epochs=2, accel=accel, dataset="wikipedia", batch_size=32,
                            text=TextConfig(seq_len=128, pack=True))
    job = run_job(consumer)
    summary = job.finish()
    assert_exactly_once(summary, wiki_manifest.num_samples, 2)
    assert consumer.ledger.collisions == 0 and summary.duplicates_dropped == 0 and summary.frames_dropped == {}
    assert accel.leaks == 0 and accel.rows == summary.rows > 0
    assert summary.sequences > summary.rows  # rows hold several sequences
    assert 0 < summary.padding_fraction < summary.padding_fraction_before_packing
    assert summary.tokens_per_s > 0 and abs(summary.masked_fraction - 0.15) < 0.01
    metrics = scrape(consumer.metrics_port)
    assert metrics["stoker_consumer_tokens_total"] == summary.tokens
    assert metrics["stoker_consumer_sequences_total"] == summary.sequences
    assert metrics["stoker_consumer_padding_fraction{packing=after}"] == pytest.approx(summary.padding_fraction)
    assert metrics["stoker_consumer_padding_fraction{packing=before}"] == pytest.approx(
        summary.padding_fraction_before_packing)
    assert set(summary.stage_seconds) >= {"examples", "pack"} and summary.stage_seconds["examples"] > 0


def test_a_corrupt_shard_is_reported_document_by_document_and_the_job_finishes(wiki_manifest, run_job, tmp_path):
    folder = tmp_path / "shards"
    shutil.copytree(str(wiki_manifest.uri).rsplit("/", 1)[0], folder)
    victim = folder / wiki_manifest.shards[1].path
    data = bytearray(victim.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = b"\0" * 64
    victim.write_bytes(bytes(data))
    manifest = Manifest.load(folder / "manifest.json")
    consumer = consumer_for(manifest.uri, epochs=1, dataset="wikipedia", batch_size=32)
    job = run_job(consumer)
    summary = job.finish()
    lost = manifest.shards[1].num_samples
    assert_exactly_once(summary, manifest.num_samples, 1, skipped_per_epoch=lost)
    assert summary.skipped_samples == lost
    assert all("sha256" in item["reason"] for item in summary.skipped)
    assert "restarted" not in job.logs()


def test_a_job_that_does_not_fit_its_shards_fails_at_start(wiki_manifest, manifest):
    with pytest.raises(ValueError, match="stoker prepare wikipedia"):
        consumer_for(manifest.uri, dataset="wikipedia")
    with pytest.raises(ValueError, match="--dataset wikipedia"):
        consumer_for(wiki_manifest.uri, dataset="imagenet")


def test_stoker_run_wikipedia_writes_padding_and_tokens_per_second(wiki_manifest, tmp_path):
    out = tmp_path / "summary.json"
    result = subprocess.run([sys.executable, "-m", "stoker", "run", "--dataset", "wikipedia", "--data",
                             wiki_manifest.uri, "--seq-len", "512", "--pack", "--accel", "null", "--json", str(out),
                             "--no-progress",
                             "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                             "--metrics-port", "0", "--worker-metrics-port", "-1"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    assert summary["dataset"] == "wikipedia" and summary["unique_samples"] == wiki_manifest.num_samples
    assert summary["tokens_per_s"] > 0
    assert summary["padding_fraction"] < 0.5 * summary["padding_fraction_before_packing"]
    assert "padding" in result.stdout


def test_a_process_that_cannot_serve_the_job_exits_with_its_own_code(tmp_path, wiki_manifest):
    from stoker.workers.process import EXIT_BAD_JOB, ProcessSpec, run_process

    folder = tmp_path / "shards"
    shutil.copytree(str(wiki_manifest.uri).rsplit("/", 1)[0], folder)
    (folder / "vocab.txt").write_text("[PAD]\nnot a wordpiece vocabulary\n")
    job = JobConfig(manifest_uri=str(folder / "manifest.json"), dataset="wikipedia", job_id="j")
    spec = ProcessSpec("h", "h/p0.1", "tcp://127.0.0.1:1", job, os.getppid())
    assert run_process(spec) == EXIT_BAD_JOB


def test_stoker_run_sizes_bert_in_sequences_with_the_packing_factor_and_says_the_length(wiki_manifest, tmp_path):
    """The profile's BERT rate counts sequences of 512 tokens; the run's supply is rows of 128 per CPU-second,
    each row holding more than one sequence when packed. The answer divides sequences by sequences."""
    out = tmp_path / "summary.json"
    result = subprocess.run([sys.executable, "-m", "stoker", "run", "--dataset", "wikipedia", "--data",
                             wiki_manifest.uri, "--pack", "--json", str(out), "--no-progress",
                             "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                             "--metrics-port", "-1", "--worker-metrics-port", "-1"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    answer, per_row = summary["cores"], summary["sequences"] / summary["rows"]
    assert per_row > 1.05 and answer["unit"] == "sequences/s" and answer["sequences_per_row"] == pytest.approx(per_row)
    assert answer["per_core_rate"] == pytest.approx(summary["per_core_rate"] * per_row)
    assert answer["cores_needed"] == pytest.approx(answer["accelerator_rate"] / answer["per_core_rate"])
    last = next(line for line in result.stdout.splitlines() if line.startswith("host cores needed"))
    assert last.startswith("host cores needed for a full-size a100: ") and "sequences/s over" in last, last
    assert "this run's rows hold 128 tokens: run --seq-len 512" in last, last
