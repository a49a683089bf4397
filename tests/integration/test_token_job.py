"""Causal-LM token streams end to end: `stoker prepare tokens` shards, real worker daemons and processes,
the real consumer, `stoker run` and the Loader: every document once per epoch, through a killed process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from stoker.accel.backends.accelerators import SimulatedAccelerator
from stoker.pipeline.text.lm_layout import LMConfig
from tests.helpers import assert_exactly_once, consumer_for, scrape, wait_for
from tests.token_corpus import prepared

LOOPBACK = ["--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0", "--metrics-port", "-1",
            "--worker-metrics-port", "-1", "--no-progress"]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    result, _, _ = prepared(tmp_path_factory.mktemp("tokens"), count=120, docs_per_shard=40)
    return result.manifest


@pytest.mark.parametrize("mode", ["packed", "concat"])
def test_stoker_run_delivers_every_document_once_per_epoch(tokens, tmp_path, mode):
    out = tmp_path / "summary.json"
    run = subprocess.run([sys.executable, "-m", "stoker", "run", "--data", tokens.uri, "--accel", "null", "--epochs",
                          "2", "--lm-seq-len", "64", "--lm-mode", mode, "--batch-size", "8", "--json", str(out),
                          *LOOPBACK], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["dataset"] == "tokens" and summary["unique_samples"] == summary["samples"] == 2 * 120
    assert summary["duplicates_dropped"] == 0 and summary["skipped_samples"] == 0
    assert summary["tokens_per_s"] > 0 and "padding" in run.stdout


def test_killing_a_worker_process_mid_epoch_loses_no_document(tokens, run_job):
    consumer = consumer_for(tokens.uri, epochs=2, accel=SimulatedAccelerator(rate=150), dataset="tokens",
                            batch_size=8, unit_batches=2, lm=LMConfig(64))
    job = run_job(consumer)
    daemon = job.daemons[0]
    assert wait_for(lambda: consumer.ledger.samples > 20 and daemon.children(), timeout=60), job.logs()
    victim = daemon.children()[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: "restarted as" in daemon.output(), timeout=30), daemon.output()

    def counted(name: str) -> float:
        return sum(scrape(d.metrics_port).get(name, 0) for d in job.daemons)

    assert wait_for(lambda: counted("stoker_worker_lm_rows_total") > 0, timeout=30)
    assert counted("stoker_worker_tokens_total") > 0
    summary = job.finish()
    assert_exactly_once(summary, tokens.num_samples, 2)
    assert f"pid {victim}) died" in daemon.output()
    assert summary.tokens > 0 and 0 <= summary.padding_fraction < 1


LOADER = """
    import hashlib, json, sys
    from stoker import JobConfig, Loader
    from stoker.pipeline.text.lm_layout import LMConfig

    job = JobConfig(manifest_uri=sys.argv[1], dataset="tokens", epochs=2, batch_size=8, seed=3, lm=LMConfig(64),
                    job_id="j")
    seen = []
    with Loader(job, workers=2) as loader:  # torch tensors, as a plain PyTorch loop takes them
        while loader.epoch < loader.epochs:
            for batch in loader:
                ids, labels = batch["input_ids"], batch["labels"]
                assert ids.shape == labels.shape and ids.shape[1] == 64
                digest = hashlib.sha256(ids.numpy().tobytes() + labels.numpy().tobytes()).hexdigest()
                seen.append([batch.epoch, sorted(batch.sample_ids.tolist()), digest])
    print(json.dumps(seen))
"""


def test_the_loader_with_two_workers_gives_the_same_batches_on_two_runs(tokens, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(LOADER))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STOKER_", "PROMETHEUS_"))}
    runs = []
    for _ in range(2):
        run = subprocess.run([sys.executable, str(script), tokens.uri], capture_output=True, text=True, timeout=180,
                             cwd=tmp_path, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        runs.append(json.loads(run.stdout.strip().splitlines()[-1]))
    for epoch in (0, 1):
        docs = [d for e, ids, _ in runs[0] if e == epoch for d in ids]
        assert sorted(docs) == list(range(tokens.num_samples))  # every document once per epoch
    assert sorted(map(json.dumps, runs[0])) == sorted(map(json.dumps, runs[1]))  # the same batches


@pytest.mark.parametrize(("flags", "says"), [
    (["--lm-seq-len", "1"], "argument --lm-seq-len: must be an integer >= 2"),
    (["--lm-mode", "sliding"], "argument --lm-mode: invalid choice"),
])
def test_settings_that_cannot_work_are_refused_at_parse_time_in_one_line(tokens, flags, says):
    run = subprocess.run([sys.executable, "-m", "stoker", "run", "--data", tokens.uri, "--accel", "null", *flags],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and says in run.stderr
    assert len([line for line in run.stderr.splitlines() if "error" in line]) == 1
