"""stoker/pipeline/text/prepare.py: raw text to tokenized Parquet shards."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.prepare import TextPrepareConfig, prepare_wikipedia, raw_documents
from tests.unit.stoker.pipeline.text.support import vocab_file


def test_token_ids_round_trip_to_the_original_words(wiki_corpus, wiki_manifest, vocab):
    tokenizer = vocab.tokenizer()
    originals = {key: raw.decode() for key, raw in raw_documents([wiki_corpus.text])}
    table = pq.read_table(wiki_manifest.shard_uri(0))
    checked = 0
    for key, sentences in zip(table.column("doc_key").to_pylist()[:200], table.column("sentences").to_pylist()[:200],
                              strict=True):
        words = []
        for line in originals[key].splitlines():
            normalized = tokenizer.normalizer.normalize_str(line)
            words += [w for w, _ in tokenizer.pre_tokenizer.pre_tokenize_str(normalized)]
        decoded = []
        for ids in sentences:
            pieces = [vocab.tokens[i] for i in ids]
            for piece in pieces:
                if piece.startswith("##"):
                    decoded[-1] += piece[2:]
                else:
                    decoded.append(piece)
        if "[UNK]" in decoded:  # a character outside the vocabulary cannot round-trip
            continue
        assert decoded == words, key
        checked += 1
    assert checked >= 190


def test_prepare_skips_undecodable_and_empty_documents(vocab, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"First sentence here. Second one.\nA third line.\n\n"
                       b"\xff\xfe broken bytes\n\n"
                       b"\x00\x01\n\n"
                       b"Last document.\n")
    result = prepare_wikipedia(corpus, tmp_path / "out", vocab_file(tmp_path, vocab), TextPrepareConfig(progress=False))
    assert result.manifest.num_samples == 2 and result.sentences == 4
    reasons = sorted(item["reason"].split(":")[0] for item in result.skipped)
    assert reasons == ["document has no tokens", "not UTF-8 text"]


def _token_documents(manifest) -> dict[str, list[list[int]]]:
    table = pq.read_table(manifest.shard_uri(0))
    return dict(zip(table.column("doc_key").to_pylist(), table.column("sentences").to_pylist(), strict=True))


def test_documents_from_jsonl_become_the_sentences_bert_text_gives(wiki_corpus, vocab, tmp_path):
    docs = [raw.decode() for _, raw in raw_documents([wiki_corpus.text])][:40]
    bert = tmp_path / "corpus.txt"
    bert.write_text("\n\n".join(docs) + "\n")
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    vocab_path = vocab_file(tmp_path, vocab)
    cfg = TextPrepareConfig(progress=False)
    as_text = prepare_wikipedia(bert, tmp_path / "text", vocab_path, cfg)
    as_docs = prepare_wikipedia(jsonl, tmp_path / "docs", vocab_path, cfg)
    assert as_text.manifest.tokens == {"source": "corpus.txt", "read_as": "bert-text"}
    assert as_docs.manifest.tokens == {"source": "corpus.jsonl", "read_as": "documents", "text_field": "text"}
    by_text, by_docs = _token_documents(as_text.manifest), _token_documents(as_docs.manifest)
    assert sorted(by_docs) == sorted(f"corpus.jsonl:{n}" for n in range(1, 41))
    assert all(by_docs[f"corpus.jsonl:{n + 1}"] == by_text[f"corpus.txt#{n}"] for n in range(40))
    assert (as_docs.sentences, as_docs.tokens) == (as_text.sentences, as_text.tokens)


def test_bad_documents_are_skipped_counted_and_named_in_the_manifest(vocab, tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"text": "A good document. With two sentences."}\nnot json\n{"title": "no text"}\n'
                      '{"text": ""}\n{"text": "\\u0000\\u0001"}\n')
    result = prepare_wikipedia(corpus, tmp_path / "out", vocab_file(tmp_path, vocab), TextPrepareConfig(progress=False))
    assert (result.manifest.num_samples, result.sentences) == (1, 2)
    named = {item["path"]: item["reason"] for item in result.manifest.skipped}
    assert list(named) == [f"{corpus}:{n}" for n in (2, 3, 4)] + [f"{corpus}:5"]
    assert named[f"{corpus}:2"].startswith("not JSON") and named[f"{corpus}:3"].startswith("no text field 'text'")
    assert named[f"{corpus}:4"] == "empty" and named[f"{corpus}:5"] == "document has no tokens"
    assert Manifest.load(tmp_path / "out").skipped == result.skipped


def test_a_dst_that_is_inside_or_holds_src_is_refused_before_anything_is_written(vocab, tmp_path):
    import subprocess
    import sys

    src = tmp_path / "corpus"
    src.mkdir()
    (src / "a.txt").write_text("First sentence here. Second one.\n\nAnother document.\n")
    words = vocab_file(tmp_path, vocab)
    for dst, where in ((src, "is SRC"), (src / "inner", "is inside SRC"), (tmp_path, "holds SRC")):
        run = subprocess.run([sys.executable, "-m", "stoker", "prepare", "wikipedia", str(src), str(dst), "--vocab",
                              str(words)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and f"DST {dst} {where} " in run.stderr and "apart from SRC" in run.stderr, \
            run.stderr
        assert len([line for line in run.stderr.splitlines() if "error" in line]) == 1, run.stderr
        assert sorted(p.name for p in src.rglob("*")) == ["a.txt"]
        assert not (tmp_path / "manifest.json").exists()
