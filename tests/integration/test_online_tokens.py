"""Tokenizing online in the workers (issue 48 item 2), end to end on real text and a real BPE: the World English
Bible's chapters prepared twice with the shipped byte-level BPE tokenizer.json, as token shards and `--online`
(text the workers tokenize per unit). `stoker run` takes the online set as it takes the token set, and the
batches real worker daemons send through the Loader are the token set's, tensor for tensor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from stoker.datasets import bible_jsonl, bpe_tokenizer

LOOPBACK = ["--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0", "--metrics-port", "-1",
            "--worker-metrics-port", "-1", "--no-progress"]
CHAPTERS = 40

LOADER = """
    import hashlib, json, sys
    from stoker import JobConfig, Loader
    from stoker.pipeline.text.lm_layout import LMConfig

    job = JobConfig(manifest_uri=sys.argv[1], dataset="tokens", epochs=1, batch_size=8, seed=5, lm=LMConfig(64),
                    job_id="j")
    seen = []
    with Loader(job, workers=2) as loader:
        for batch in loader:
            tensors = {name: hashlib.sha256(batch[name].numpy().tobytes()).hexdigest()
                       for name in ("input_ids", "labels", "position_ids", "segment_ids")}
            seen.append([batch.epoch, batch.sample_ids.tolist(), tensors])
    print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def bible(tmp_path_factory):
    """The token set and the online set of the same chapters, made by the command as a user makes them."""
    folder = tmp_path_factory.mktemp("bible")
    corpus = bible_jsonl(folder / "bible.jsonl", CHAPTERS)
    tok = bpe_tokenizer(folder)
    sets = {}
    for name, flags in (("tokens", []), ("online", ["--online"])):
        run = subprocess.run([sys.executable, "-m", "stoker", "prepare", "tokens", str(corpus), "--tokenizer", str(tok),
                              "--out", str(folder / name), "--docs-per-shard", "16", *flags],
                             capture_output=True, text=True, timeout=180)
        assert run.returncode == 0, run.stderr[-3000:]
        sets[name] = folder / name / "manifest.json"
    assert json.loads(sets["online"].read_text())["tokens"]["online"] is True
    return sets


def test_stoker_run_on_an_online_set_delivers_what_the_token_set_does(bible, tmp_path):
    summaries = {}
    for name, manifest in bible.items():
        out = tmp_path / f"{name}.json"
        run = subprocess.run([sys.executable, "-m", "stoker", "run", "--data", str(manifest), "--dataset", "tokens",
                              "--lm-seq-len", "64", "--accel", "null", "--json", str(out), *LOOPBACK],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        summaries[name] = json.loads(out.read_text())
    online, tokens = summaries["online"], summaries["tokens"]
    assert online["unique_samples"] == online["samples"] == CHAPTERS and online["skipped_samples"] == 0
    for key in ("samples", "unique_samples", "tokens", "steps", "rows", "sequences", "padding_fraction"):
        assert online[key] == tokens[key] and online[key], key  # the same rows from the same documents


def test_the_loaders_batches_of_an_online_set_are_the_token_sets_tensor_for_tensor(bible, tmp_path):
    script = tmp_path / "loader.py"
    script.write_text(textwrap.dedent(LOADER))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STOKER_", "PROMETHEUS_"))}
    seen = {}
    for name, manifest in bible.items():
        run = subprocess.run([sys.executable, str(script), str(manifest)], capture_output=True, text=True,
                             timeout=300, cwd=tmp_path, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        seen[name] = sorted(map(json.dumps, json.loads(run.stdout.strip().splitlines()[-1])))
    assert seen["online"] == seen["tokens"]  # the same batches: sample ids, input_ids, labels, positions, segments
    ids = sorted(i for line in seen["online"] for i in json.loads(line)[1])
    assert ids == list(range(CHAPTERS))  # every chapter once
