"""A token set's bytes per token and its tokenizer's own cost, read from what `stoker prepare tokens` wrote."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.token_cost import (
    INT32_BYTES,
    bytes_per_token,
    manifest_texts,
    manifest_tokenizer,
    tokenize_rate,
)
from stoker.pipeline.text.token_prepare import TokenPrepareConfig, prepare_tokens
from stoker.pipeline.text.token_shards import read_token_shard
from tests.token_corpus import jsonl, texts, tokenizer_json


@pytest.fixture(scope="module")
def token_set(tmp_path_factory):
    """A prepared set whose byte-level BPE decodes (ByteLevel decoder), as a real tokenizer.json does."""
    from tokenizers import Tokenizer, decoders

    folder = tmp_path_factory.mktemp("tokens")
    corpus = texts(120)
    path = tokenizer_json(folder / "tokenizer.json", corpus)
    tok = Tokenizer.from_file(str(path))
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path))
    result = prepare_tokens(jsonl(folder / "corpus.jsonl", corpus, bad=False), folder / "shards", str(path),
                            TokenPrepareConfig(docs_per_shard=40, progress=False))
    return result, corpus


def test_bytes_per_token_is_the_shards_bytes_over_their_tokens(token_set):
    result, _ = token_set
    manifest = Manifest.load(result.manifest.uri)
    on_disk = sum(Path(manifest.relative_uri(s.path)).stat().st_size for s in manifest.shards)
    assert bytes_per_token(manifest) == pytest.approx(on_disk / result.tokens)
    assert 0 < bytes_per_token(manifest) < INT32_BYTES  # zstd Parquet holds an int32 id in fewer bytes


def test_the_sets_own_tokenizer_gives_back_its_documents(token_set):
    result, corpus = token_set
    manifest = Manifest.load(result.manifest.uri)
    tok = manifest_tokenizer(manifest)
    assert tok.fingerprint == manifest.tokens["fingerprint"]
    texts = manifest_texts(manifest, tok, documents=50)
    assert texts == corpus[:50]  # every document of the corpus was usable, in shard order
    first = read_token_shard(manifest.shard_uri(0), manifest.shards[0], tok.vocab_size)
    assert np.array_equal(tok.encode_batch(texts[:1])[0], first.document(0))


def test_tokenize_rate_counts_the_tokens_it_made_per_cpu_second(token_set):
    result, corpus = token_set
    tok = manifest_tokenizer(Manifest.load(result.manifest.uri))
    rate, tokens = tokenize_rate(tok, corpus, seconds=0.2)
    assert rate > 0 and tokens >= sum(ids.size for ids in tok.encode_batch(corpus[:1]))
    with pytest.raises(ValueError, match="no documents"):
        tokenize_rate(tok, [], seconds=0.1)


def test_a_set_that_is_not_a_token_set_is_refused_in_one_line(token_set):
    result, _ = token_set
    manifest = Manifest.load(result.manifest.uri)
    manifest.kind, manifest.tokens = "wikipedia", {}
    with pytest.raises(ValueError, match="is not a token set .*`stoker prepare tokens"):
        bytes_per_token(manifest)


def test_an_online_sets_texts_are_its_text_shards_and_its_bytes_per_token_their_bytes(token_set, tmp_path):
    result, corpus = token_set
    tok_path = Path(result.manifest.relative_uri("tokenizer.json"))
    online = prepare_tokens(jsonl(tmp_path / "c.jsonl", corpus, bad=False), tmp_path / "on", str(tok_path),
                            TokenPrepareConfig(docs_per_shard=40, progress=False, online=True)).manifest
    tok = manifest_tokenizer(online)
    assert manifest_texts(online, tok, documents=70) == corpus[:70]
    on_disk = sum(Path(online.relative_uri(s.path)).stat().st_size for s in online.shards)
    assert bytes_per_token(online) == pytest.approx(on_disk / result.tokens)
