"""stoker/pipeline/text/token_shards.py: token documents written, read back, and checked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.pipeline.store.shards import ShardInfo, file_sha256
from stoker.pipeline.text.docs import ShardError
from stoker.pipeline.text.token_shards import read_token_shard, write_token_shard


def _write(path, docs, keys=None):
    keys = keys or [f"d{i}" for i in range(len(docs))]
    write_token_shard(str(path), keys, [np.asarray(d, dtype=np.int32) for d in docs])
    return ShardInfo(path.name, len(docs), path.stat().st_size, file_sha256(path), 0)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, 99), min_size=1, max_size=40), min_size=1, max_size=30))
def test_every_document_reads_back_as_written(tmp_path_factory, docs):
    path = tmp_path_factory.mktemp("t") / "s.parquet"
    info = _write(path, docs)
    shard = read_token_shard(str(path), info, vocab_size=100)
    assert len(shard) == len(docs) and not shard.problems
    for row, doc in enumerate(docs):
        assert shard.document(row).tolist() == doc and shard.key(row) == f"d{row}"


@pytest.mark.parametrize(("top", "bytes_per_id"), [(65_535, 2), (65_536, 4), (200_000, 4)])
def test_a_shard_is_arrow_ipc_its_ids_in_two_bytes_while_they_fit(tmp_path, top, bytes_per_id):
    """Uncompressed Arrow IPC, read as views of its bytes: ids under 65,536 (GPT-2's, BERT's vocabularies) in
    2 bytes, a larger vocabulary's in 4; either reads back as int32 ids."""
    import pyarrow as pa

    docs = [[0, 1, top], [top - 1] * 1000]
    info = _write(tmp_path / "tokens-00000.arrow", docs)
    data = (tmp_path / "tokens-00000.arrow").read_bytes()
    assert data.startswith(b"ARROW1")
    table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
    assert table.schema.field("tokens").type.value_type.bit_width == 8 * bytes_per_id
    shard = read_token_shard(str(tmp_path / "tokens-00000.arrow"), info, vocab_size=top + 1)
    assert shard.tokens.dtype == np.int32 and [shard.document(r).tolist() for r in range(2)] == docs


def test_a_token_shard_an_older_stoker_wrote_as_parquet_still_reads(tmp_path):
    """Token sets prepared before the Arrow IPC layout keep working: the same columns, told by the first bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stoker.pipeline.text.token_shards import TOKEN_SCHEMA

    path = tmp_path / "tokens-00000.parquet"
    pq.write_table(pa.table([pa.array(["a", "b"]), pa.array([[5, 6], [7]], pa.list_(pa.int32()))],
                            schema=TOKEN_SCHEMA), path, compression="lz4")
    info = ShardInfo(path.name, 2, path.stat().st_size, file_sha256(path), 0)
    shard = read_token_shard(str(path), info, vocab_size=10)
    assert [shard.document(0).tolist(), shard.document(1).tolist(), shard.key(1)] == [[5, 6], [7], "b"]


def test_the_same_rows_give_the_same_bytes(tmp_path):
    docs = [[1, 2, 3], [4], [5, 6]]
    _write(tmp_path / "a.parquet", docs)
    _write(tmp_path / "b.parquet", docs)
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_empty_and_out_of_vocabulary_documents_are_named_not_read(tmp_path):
    info = _write(tmp_path / "s.parquet", [[1, 2], [], [3, 250]])
    shard = read_token_shard(str(tmp_path / "s.parquet"), info, vocab_size=100)
    assert shard.problem(0) is None
    assert shard.problem(1) == "document has no tokens"
    assert "token id 250 outside the tokenizer's vocabulary (size 100)" == shard.problem(2)


def test_a_changed_shard_or_another_row_count_is_refused_whole(tmp_path):
    path = tmp_path / "s.parquet"
    info = _write(path, [[1, 2], [3]])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="sha256"):
        read_token_shard(str(path), info, 100)
    info = _write(path, [[1, 2], [3]])
    info.num_samples = 3
    with pytest.raises(ShardError, match="2 documents, the manifest says 3"):
        read_token_shard(str(path), info, 100)
    with pytest.raises(ShardError, match="unreadable"):
        read_token_shard(str(tmp_path / "missing.parquet"), None, 100)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.integers(-3, 120), max_size=12)), max_size=30), st.integers(0, 4))
def test_flattening_by_whole_arrays_finds_the_problems_the_loop_per_document_found(docs, cut):
    """Null, empty and out-of-vocabulary documents, in a table sliced as a row group's read can be."""
    import pyarrow as pa

    from stoker.pipeline.text.token_shards import TOKEN_SCHEMA, flatten_tokens
    from tests.unit.stoker.pipeline.text.causal_reference import old_flatten_tokens

    table = pa.table([pa.array([f"d{i}" for i in range(len(docs))]), pa.array(docs, pa.list_(pa.int32()))],
                     schema=TOKEN_SCHEMA).slice(min(cut, len(docs)))
    fast, old = flatten_tokens(table, 100), old_flatten_tokens(table, 100)
    assert [fast.key(i) for i in range(len(fast))] == old.keys and fast.problems == old.problems
    assert np.array_equal(fast.tokens, old.tokens) and np.array_equal(fast.offsets, old.offsets)


def test_writing_over_a_hard_linked_shard_or_lengths_file_replaces_the_name_and_leaves_the_link_as_it_was(tmp_path):
    """A mixture hard-links its sources' files: a rerun into either folder must never write through the link."""
    from stoker.pipeline.text.token_shards import LENGTHS_FILE, write_lengths

    shard, kept = tmp_path / "tokens-00000.parquet", tmp_path / "linked.parquet"
    write_token_shard(str(shard), ["a"], [np.arange(5, dtype=np.int32)])
    write_lengths(tmp_path, np.array([5]))
    kept.hardlink_to(shard)
    (tmp_path / "kept.npy").hardlink_to(tmp_path / LENGTHS_FILE)
    before = kept.read_bytes(), (tmp_path / "kept.npy").read_bytes()
    write_token_shard(str(shard), ["b", "c"], [np.arange(9, dtype=np.int32), np.arange(2, dtype=np.int32)])
    write_lengths(tmp_path, np.array([9, 2]))
    assert (kept.read_bytes(), (tmp_path / "kept.npy").read_bytes()) == before
    assert shard.read_bytes() != before[0] and (tmp_path / LENGTHS_FILE).read_bytes() != before[1]
    read = read_token_shard(str(shard), None, 16)
    assert [read.key(0), read.key(1)] == ["b", "c"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.npy", "lengths.npy", "linked.parquet",
                                                          "tokens-00000.parquet"]  # no temporary file left
