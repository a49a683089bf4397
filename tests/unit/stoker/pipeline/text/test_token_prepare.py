"""stoker/pipeline/text/token_prepare.py: `stoker prepare tokens`, from a corpus to checked token shards."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.token_prepare import TokenPrepareConfig, prepare_tokens
from stoker.pipeline.text.token_shards import lengths_of, read_token_shard
from stoker.pipeline.text.tokenizer import TokenizerConfig, TokenizerError
from stoker.protos.errors import DataError
from tests.token_corpus import jsonl, prepared, texts, tokenizer_json


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return prepared(tmp_path_factory.mktemp("tokens"))


def test_every_document_round_trips_to_its_tokens_in_source_order(made):
    result, corpus, tok_path = made
    manifest = Manifest.load(result.manifest.uri)
    tok = TokenizerConfig(path=str(tok_path)).load()
    assert manifest.kind == "tokens" and manifest.num_samples == len(corpus) == result.documents
    got = []
    for index, info in enumerate(manifest.shards):
        shard = read_token_shard(manifest.shard_uri(index), info, manifest.tokens["vocab_size"])
        assert not shard.problems
        got += [shard.document(row).tolist() for row in range(len(shard))]
        assert manifest.tokens["shard_tokens"][index] == shard.tokens.size
    assert got == [ids.tolist() for ids in tok.encode_batch(corpus)]
    assert sum(manifest.tokens["shard_tokens"]) == manifest.tokens["total"] == result.tokens


def test_the_tokenizer_is_copied_beside_the_manifest_with_its_fingerprint_and_special_ids(made):
    result, _, tok_path = made
    info = result.manifest.tokens
    copied = TokenizerConfig(path=result.manifest.relative_uri(info["tokenizer"]), fingerprint=info["fingerprint"])
    loaded = copied.load()  # the pinned fingerprint holds for the copy
    assert (loaded.eot_id, loaded.pad_id, loaded.vocab_size) == (info["eot"], info["pad"], info["vocab_size"]) == (
        0, 1, 300)
    assert info["source"] == "corpus.jsonl"


def test_skipped_documents_are_counted_and_named_in_the_manifest(made):
    result, corpus, _ = made
    reasons = {item["path"].rsplit(":", 1)[1]: item["reason"] for item in result.manifest.skipped}
    assert set(reasons) == {str(len(corpus) + 1), str(len(corpus) + 2)}
    assert reasons[str(len(corpus) + 1)].startswith("not JSON") and reasons[str(len(corpus) + 2)] == "empty"


def test_the_same_input_gives_the_same_bytes(tmp_path, made):
    _, corpus, tok_path = made
    src = jsonl(tmp_path / "c.jsonl", corpus[:50])
    outs = []
    for name in ("a", "b"):
        prepare_tokens(src, tmp_path / name, str(tok_path), TokenPrepareConfig(docs_per_shard=16, progress=False))
        outs.append({p.name: p.read_bytes() for p in sorted((tmp_path / name).iterdir())})
    assert outs[0] == outs[1] and len(outs[0]) == 4 + 3  # 4 shards, the manifest, the tokenizer and the lengths


def test_a_bad_tokenizer_is_refused_before_any_document_and_nothing_left_is_an_error(tmp_path, made):
    _, corpus, tok_path = made
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not JSON"):
        prepare_tokens(jsonl(tmp_path / "c.jsonl", corpus), tmp_path / "o", str(tmp_path / "bad.json"))
    empty = jsonl(tmp_path / "e.jsonl", [], bad=True)
    with pytest.raises(DataError, match="no documents"):
        prepare_tokens(empty, tmp_path / "o2", str(tok_path), TokenPrepareConfig(progress=False))


def test_the_command_prints_what_it_wrote_and_skipped(tmp_path):
    corpus = texts(30, seed=3)
    tok = tokenizer_json(tmp_path / "tokenizer.json", corpus)
    src = jsonl(tmp_path / "c.jsonl", corpus)
    run = subprocess.run([sys.executable, "-m", "stoker", "prepare", "tokens", str(src), "--tokenizer", str(tok),
                          "--out", str(tmp_path / "out"), "--docs-per-shard", "10", "--source-name", "mine",
                          "--text-field", "text"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "wrote 30 documents" in run.stdout and "in 3 shard(s)" in run.stdout and "skipped 2" in run.stdout
    assert Manifest.load(tmp_path / "out").tokens["source"] == "mine"


def test_the_lengths_file_holds_every_documents_tokens_and_an_old_set_without_it_is_refused(tmp_path, made):
    _, corpus, tok_path = made
    src = jsonl(tmp_path / "c.jsonl", corpus[:30])
    result = prepare_tokens(src, tmp_path / "t", str(tok_path), TokenPrepareConfig(docs_per_shard=16, progress=False))
    manifest = result.manifest
    sizes = [len(read_token_shard(manifest.shard_uri(i), s, manifest.vocab_size).document(r))
             for i, s in enumerate(manifest.shards) for r in range(s.num_samples)]
    assert lengths_of(manifest).tolist() == sizes and sum(sizes) == result.tokens
    manifest.tokens = {k: v for k, v in manifest.tokens.items() if not k.startswith("lengths")}
    with pytest.raises(DataError, match="prepare tokens` .*again"):
        lengths_of(manifest)
