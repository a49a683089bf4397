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
