"""A mixture of two token sources end to end: `stoker prepare mixture`, real worker daemons and processes, the real
consumer and `stoker run`: each epoch's planned documents (a small source's repeats included) exactly once each,
through a killed worker process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from stoker.accel.backends.accelerators import SimulatedAccelerator
from stoker.pipeline.job import JobConfig
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.lm_layout import LMConfig
from stoker.pipeline.text.mixture_prepare import SourceSpec, prepare_mixture
from tests.helpers import consumer_for, wait_for
from tests.integration.test_token_job import LOOPBACK
from tests.token_corpus import two_sources


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixture")
    parts = two_sources(folder, sizes=(160, 40))
    specs = [SourceSpec("web", str(parts["web"]), 0.75), SourceSpec("books", str(parts["books"]), 0.25)]
    result = prepare_mixture(specs, folder / "mix", budget=6000)
    return Manifest.load(result.manifest.uri)


def _planned(manifest: Manifest, epochs: int) -> list[int]:
    """Documents each epoch of `stoker run --epochs N --batch-size 8` plans (its blocks are its units)."""
    plan = JobConfig(manifest_uri=manifest.uri, dataset="tokens", epochs=epochs, batch_size=8).plan(manifest)
    return [plan.epoch_rank_sizes(epoch)[0] for epoch in range(epochs)]


def test_stoker_run_delivers_each_epochs_planned_documents_once(mixture, tmp_path):
    out = tmp_path / "summary.json"
    run = subprocess.run([sys.executable, "-m", "stoker", "run", "--data", mixture.uri, "--accel", "null", "--epochs",
                          "2", "--lm-seq-len", "64", "--batch-size", "8", "--json", str(out), *LOOPBACK],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(out.read_text())
    planned = _planned(mixture, 2)
    assert planned[0] > mixture.num_samples  # the small source repeats within an epoch
    assert summary["unique_samples"] == summary["samples"] == sum(planned)
    assert summary["duplicates_dropped"] == 0 and summary["skipped_samples"] == 0


def test_killing_a_worker_process_mid_epoch_loses_and_repeats_no_document(mixture, run_job):
    consumer = consumer_for(mixture.uri, epochs=2, accel=SimulatedAccelerator(rate=300), dataset="tokens",
                            batch_size=8, unit_batches=2, lm=LMConfig(64))
    job = run_job(consumer)
    daemon = job.daemons[0]
    assert wait_for(lambda: consumer.ledger.samples > 40 and daemon.children(), timeout=60), job.logs()
    victim = daemon.children()[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: "restarted as" in daemon.output(), timeout=30), daemon.output()
    summary = job.finish()
    planned = [consumer.plan.epoch_rank_sizes(epoch)[0] for epoch in range(2)]
    assert summary.samples == summary.unique_samples == sum(planned)
    assert summary.per_epoch_unique == planned
    assert f"pid {victim}) died" in daemon.output()
