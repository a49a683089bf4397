"""A language model from your own text, end to end on real text and a real BPE tokenizer.json: the README's
example (examples/tiny_gpt.py) run as written, and `stoker run --accel torch` stepping the tiny GPT on a
tokens job; in both the loss falls."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from stoker.datasets import bpe_tokenizer, wikipedia_jsonl

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "examples/tiny_gpt.py"
LOOPBACK = ["--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0", "--metrics-port", "-1",
            "--worker-metrics-port", "-1", "--no-progress"]


def test_the_readme_example_trains_and_its_loss_falls(tmp_path):
    readme = (ROOT / "README.md").read_text()
    assert f"python {EXAMPLE} --steps" in readme  # the command the README shows, with fewer steps here
    run = subprocess.run([sys.executable, EXAMPLE, "--steps", "20", "--docs", "100", "--out", str(tmp_path / "gpt")],
                         capture_output=True, text=True, timeout=480, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    for name in ("wikipedia", "bible"):  # both corpora prepared as token shards, each with its manifest
        manifest = json.loads((tmp_path / "gpt" / name / "manifest.json").read_text())
        assert manifest["kind"] == "tokens" and manifest["num_samples"] == 100
    mixture = json.loads((tmp_path / "gpt" / "mixture" / "manifest.json").read_text())  # what it trained on
    assert mixture["num_samples"] == 200 and mixture["tokens"]["mixture"]["budget"] == 200_000
    assert re.findall(r"step (\d+): loss", run.stdout) == ["10", "20"]
    first, last = map(float, re.search(r"loss fell from ([\d.]+) \(first steps\) to ([\d.]+)", run.stdout).groups())
    assert 9.5 < first < 11.5 and last < first - 0.3, run.stdout  # from about ln(65,000), down


def test_stoker_run_steps_the_tiny_gpt_on_a_tokens_job_and_its_loss_falls(tmp_path):
    corpus = wikipedia_jsonl(tmp_path / "wikipedia.jsonl", 60)
    prepare = subprocess.run([sys.executable, "-m", "stoker", "prepare", "tokens", str(corpus), "--tokenizer",
                              str(bpe_tokenizer(tmp_path)), "--out", str(tmp_path / "tokens")],
                             capture_output=True, text=True, timeout=120)
    assert prepare.returncode == 0, prepare.stderr[-3000:]
    out = tmp_path / "summary.json"
    run = subprocess.run([sys.executable, "-m", "stoker", "run", "--data", str(tmp_path / "tokens" / "manifest.json"),
                          "--accel", "torch", "--epochs", "2", "--lm-seq-len", "64", "--batch-size", "4", "--json",
                          str(out), *LOOPBACK], capture_output=True, text=True, timeout=480)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["dataset"] == "tokens" and summary["unique_samples"] == summary["samples"] == 2 * 60
    logged = [float(x) for x in re.findall(r"step \d+: loss ([\d.]+)", run.stdout + run.stderr)]
    assert len(logged) >= 2 and logged[-1] < logged[0] - 0.5, run.stderr[-3000:]  # lr 1e-3 (the GPT's default)
