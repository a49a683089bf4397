"""`stoker prepare wikipedia` reads the token path's sources: the real World English Bible as JSONL and as
a Parquet export, prepared for BERT from the command line, each run as a wikipedia job that delivers every
document once."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq

from stoker.datasets import bible_jsonl
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.shipped import write_bible_parquet

CHAPTERS = 120


def stoker(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stoker", *args], capture_output=True, text=True, timeout=timeout)


def _sentences(manifest: Manifest) -> list[list[list[int]]]:
    """Every document's token sentences, in a fixed order (the shards' order is a seeded shuffle)."""
    docs = [d for i in range(len(manifest.shards)) for d in pq.read_table(manifest.shard_uri(i))
            .column("sentences").to_pylist()]
    return sorted(docs)


def test_the_bible_as_jsonl_and_parquet_trains_bert_with_every_chapter_once(wiki_corpus, tmp_path):
    sources = {"jsonl": bible_jsonl(tmp_path / "bible.jsonl", CHAPTERS),
               "parquet": write_bible_parquet(tmp_path / "export" / "train-00000.parquet", CHAPTERS)}
    made = {}
    for name, src in sources.items():
        where = src if name == "jsonl" else src.parent  # a file, and a folder of Parquet files
        done = stoker("prepare", "wikipedia", str(where), str(tmp_path / name), "--vocab", str(wiki_corpus.vocab),
                      "--docs-per-shard", str(CHAPTERS // 3), "--source-name", f"bible-{name}")
        assert done.returncode == 0, done.stderr
        assert f"wrote {CHAPTERS} documents" in done.stdout and "SRC read as documents" in done.stdout
        made[name] = Manifest.load(tmp_path / name)
        assert made[name].kind == "wikipedia" and made[name].num_samples == CHAPTERS and not made[name].skipped
        assert made[name].tokens == {"source": f"bible-{name}", "read_as": "documents", "text_field": "text"}
    assert _sentences(made["jsonl"]) == _sentences(made["parquet"])  # one corpus, two exports, the same documents
    for name, manifest in made.items():
        out = tmp_path / f"{name}-summary.json"
        ran = stoker("run", "--dataset", "wikipedia", "--data", manifest.uri, "--seq-len", "128", "--accel", "null",
                     "--epochs", "2", "--json", str(out), "--no-progress", "--data-bind", "tcp://127.0.0.1:0",
                     "--control-bind", "tcp://127.0.0.1:0", "--metrics-port", "0", "--worker-metrics-port", "-1")
        assert ran.returncode == 0, ran.stderr
        summary = json.loads(out.read_text())
        assert summary["samples"] == summary["unique_samples"] == 2 * CHAPTERS, name
        assert summary["per_epoch_unique"] == [CHAPTERS, CHAPTERS] and summary["duplicates_dropped"] == 0, name


def test_bad_documents_are_skipped_counted_and_named_and_an_unclear_source_refused(wiki_corpus, tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    bible_jsonl(src / "bible.jsonl", 10)
    (src / "bad.jsonl").write_text('{"text": "Fine. Two sentences."}\n{"id": 7\n{"id": "no text"}\n{"text": " "}\n')
    done = stoker("prepare", "wikipedia", str(src), str(tmp_path / "out"), "--vocab", str(wiki_corpus.vocab))
    assert done.returncode == 0, done.stderr
    assert "wrote 11 documents" in done.stdout and "skipped 3 document(s)" in done.stdout
    skipped = Manifest.load(tmp_path / "out").skipped
    assert [(s["path"].rsplit("/", 1)[-1], s["reason"].split(" (")[0]) for s in skipped] == [
        ("bad.jsonl:2", "not JSON"), ("bad.jsonl:3", "no text field 'text'"), ("bad.jsonl:4", "empty")]
    for item in skipped:
        assert f"skipped {item['path']}: {item['reason']}" in done.stderr
    (src / "notes.txt").write_text("A BERT-format line.\n")
    mixed = stoker("prepare", "wikipedia", str(src), str(tmp_path / "mixed"), "--vocab", str(wiki_corpus.vocab))
    assert mixed.returncode == 2 and "both BERT-format text" in mixed.stderr and "--documents" in mixed.stderr
    assert not (tmp_path / "mixed").exists()
    both = stoker("prepare", "wikipedia", str(src), str(tmp_path / "both"), "--vocab", str(wiki_corpus.vocab),
                  "--documents")
    assert both.returncode == 0 and "wrote 12 documents" in both.stdout, both.stderr
