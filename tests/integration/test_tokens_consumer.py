"""What a tokens job's consumer gives and says, end to end (real sets, daemons and `stoker run`): empty
batches keep their tensors, the simulated device steps tokens at its stated rate, several ranks on the
null device add up, and a worker's refusal reaches the last line with its reason."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from stoker.pipeline.text.lm_layout import LMConfig
from tests.token_corpus import jsonl, prepared, texts, tokenizer_json

LOOPBACK = ["--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0", "--metrics-port", "-1",
            "--worker-metrics-port", "-1", "--no-progress"]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    result, _, _ = prepared(tmp_path_factory.mktemp("tokens"), count=120, docs_per_shard=40)
    return result.manifest


@pytest.fixture(scope="module")
def replaced(tmp_path_factory):
    """A token set whose shards were overwritten by another set's of the same names: every one fails its sha256."""
    folder = tmp_path_factory.mktemp("replaced")
    victim, _, _ = prepared(folder / "victim", count=120, docs_per_shard=40)
    other, _, _ = prepared(folder / "other", count=90, docs_per_shard=30)
    for shard in (folder / "victim" / "shards").glob("tokens-*"):
        shutil.copy(folder / "other" / "shards" / shard.name, shard)
    return victim.manifest


def _run(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stoker", "run", *args, *LOOPBACK], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("format", ["numpy", "torch"])
def test_an_unusable_units_empty_batches_carry_the_jobs_tensors_with_no_rows(replaced, format):
    from stoker.loader import Loader
    from stoker.pipeline.job import JobConfig

    job = JobConfig(manifest_uri=replaced.uri, dataset="tokens", batch_size=8, lm=LMConfig(seq_len=64))
    with Loader(job, workers=1, format=format) as loader:
        batches = list(loader)
    assert batches and all(b.rows == 0 for b in batches)  # every planned step, each empty
    for batch in batches:
        assert sorted(batch) == ["input_ids", "labels", "position_ids", "segment_ids"]
        for tensor in batch.values():
            assert tuple(tensor.shape) == (0, 64) and str(tensor.dtype).endswith("int32")
        assert isinstance(batch["input_ids"], np.ndarray) == (format == "numpy")


@pytest.mark.parametrize("seq_len", [64, 1024])
def test_the_default_simulated_device_steps_a_tokens_job_at_its_stated_tokens_per_second(tokens, tmp_path, seq_len):
    out = tmp_path / "summary.json"
    run = _run("--data", tokens.uri, "--lm-seq-len", str(seq_len), "--batch-size", "4", "--json", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    s = json.loads(out.read_text())
    stated = s["cores"]["accelerator_rate"]
    assert stated == pytest.approx(106_496) and "106,496 tokens/s" in run.stdout
    slots_per_s = s["rows"] * seq_len / s["stage_seconds"]["step"]
    assert slots_per_s == pytest.approx(stated, rel=0.1)


@pytest.mark.parametrize("data", ["tokens", "wikipedia", "imagenet"])
def test_two_ranks_on_the_null_device_finish_and_write_the_jobs_summary(data, tokens, wiki_manifest, manifest,
                                                                         tmp_path):
    uri = {"tokens": tokens.uri, "wikipedia": wiki_manifest.uri, "imagenet": manifest.uri}[data]
    samples = {"tokens": tokens.num_samples, "wikipedia": wiki_manifest.num_samples,
               "imagenet": manifest.num_samples}[data]
    out = tmp_path / "summary.json"
    extra = ["--lm-seq-len", "64"] if data == "tokens" else []
    run = _run("--data", uri, "--accel", "null", "--world-size", "2", "--batch-size", "8", "--json", str(out),
               *extra, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["world_size"] == 2 and len(s["ranks"]) == 2 and s["cores_needed"] is None
    assert s["unique_samples"] == samples - s["skipped_samples"]


def test_a_worker_refusing_an_online_set_whose_tokenizer_was_replaced_says_why_last(tmp_path):
    corpus = texts(60)
    tok = tokenizer_json(tmp_path / "tokenizer-src.json", corpus)
    made = subprocess.run([sys.executable, "-m", "stoker", "prepare", "tokens", str(jsonl(tmp_path / "c.jsonl", corpus,
                                                                                          bad=False)),
                           "--tokenizer", str(tok), "--out", str(tmp_path / "set"), "--online"],
                          capture_output=True, text=True, timeout=180)
    assert made.returncode == 0, made.stderr[-3000:]
    tokenizer_json(tmp_path / "set" / "tokenizer.json", texts(60, seed=5))  # another tokenizer, after prepare
    run = _run("--data", str(tmp_path / "set" / "manifest.json"), "--accel", "null", "--lm-seq-len", "64",
               timeout=120)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("stoker: error:") and "refused the job" in last, run.stderr[-3000:]
    assert "tokenizer" in last and "the job was pinned to sha256:" in last
