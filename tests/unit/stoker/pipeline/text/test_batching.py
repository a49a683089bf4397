"""stoker/pipeline/text/batching.py: a unit's documents to text batches."""

from __future__ import annotations

import hashlib
import multiprocessing as mp

import pyarrow as pa

from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.batching import TextUnitSource
from stoker.pipeline.text.docs import DOC_SCHEMA, flatten
from stoker.pipeline.text.examples import Specials, TextConfig
from tests.unit.stoker.pipeline.text.support import one_range, source, whole_shard_unit


def _digest(manifest_uri: str, shard: int, seed: int) -> str:
    manifest = Manifest.load(manifest_uri)
    digest = hashlib.sha256()
    unit = whole_shard_unit(manifest, shard, epoch=1)
    for batch in source(manifest, shard, TextConfig(pack=True, whole_word_mask=True), seed).batches(unit, 16):
        for name in sorted(batch.tensors):
            digest.update(batch.tensors[name].tobytes())
        digest.update(str(batch.doc_ids).encode())
    return digest.hexdigest()


def test_the_same_seed_gives_identical_batches_in_another_process(wiki_manifest):
    here = _digest(wiki_manifest.uri, 1, seed=7)
    with mp.get_context("spawn").Pool(1) as pool:
        there = pool.apply(_digest, (wiki_manifest.uri, 1, 7))
    assert here == there
    assert _digest(wiki_manifest.uri, 1, seed=8) != here


def test_unusable_documents_are_reported_not_batched(vocab, tmp_path):
    keys = ["good", "empty", "nulls", "out-of-vocab", "negative", "also-good"]
    sentences = [[[2023, 2003], [1037, 3231]], [], None, [[2023, 40000]], [[-5]], [[2023, 2003, 1037]]]
    table = pa.table([pa.array(keys), pa.array(sentences, DOC_SCHEMA.field("sentences").type)], schema=DOC_SCHEMA)
    docs = flatten(table, vocab.size)
    assert set(docs.problems) == {1, 2, 3, 4}
    assert "outside the vocabulary" in docs.problems[3]
    src = TextUnitSource(docs, TextConfig(), Specials.of(vocab), seed=0)
    batches = list(src.batches(one_range(0, 0, 0, 0, len(keys), 100), batch_size=64))
    assert sorted(d for b in batches for d in b.doc_ids) == [100, 105]
    assert sorted(key for b in batches for _, key, _ in b.skipped) == sorted(keys[1:5])
