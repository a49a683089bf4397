"""stoker/pipeline/text/docs.py: the document shards and their checks."""

from __future__ import annotations

import pytest

from stoker.pipeline.text.docs import ShardError, read_doc_shard


def test_a_malformed_or_replaced_shard_is_refused(wiki_manifest, vocab, tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ShardError, match="Parquet"):
        read_doc_shard(str(bad), None, vocab.size)
    with pytest.raises(ShardError, match="sha256"):  # shard 1's file where the manifest expects shard 0
        read_doc_shard(wiki_manifest.shard_uri(1), wiki_manifest.shards[0], vocab.size)


def test_writing_over_a_hard_linked_doc_shard_replaces_the_name_and_leaves_the_link_as_it_was(tmp_path):
    from stoker.pipeline.text.docs import write_doc_shard

    shard, kept = tmp_path / "docs-00000.parquet", tmp_path / "kept.parquet"
    write_doc_shard(str(shard), ["a"], [[[1, 2], [3]]])
    kept.hardlink_to(shard)
    before = kept.read_bytes()
    write_doc_shard(str(shard), ["b"], [[[4, 5, 6]]])
    assert kept.read_bytes() == before and shard.read_bytes() != before
    assert read_doc_shard(str(shard), None, 10).keys == ["b"]
