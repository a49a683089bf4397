"""stoker/pipeline/text/lm_layout.py: a unit's token documents as causal-LM batches, every token once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.pipeline.text.causal import IGNORE
from stoker.pipeline.text.lm_layout import (
    LMConfig,
    cu_seqlens_of,
    planned_batches,
    tensor_specs,
    unit_documents,
    unit_lengths,
    unit_rows,
    unit_token_batches,
)
from stoker.pipeline.text.token_shards import TokenShard
from stoker.pipeline.units import Segment, Unit
from stoker.protos.errors import ConfigError, DataError

EOT, PAD, WIDTH = 0, 1, 16


def _shard(docs: list[list[int]], problems: dict[int, str] | None = None) -> TokenShard:
    """As read_token_shard makes one: an empty document is a problem."""
    sizes = [len(d) for d in docs]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    flat = np.array([t for d in docs for t in d], dtype=np.int32)
    empty = {i: "document has no tokens" for i, d in enumerate(docs) if not d}
    return TokenShard([f"k{i}" for i in range(len(docs))], flat, offsets, empty | (problems or {}))


def _lengths(docs) -> np.ndarray:
    """The lengths file of a shard whose row 0 is sample id 100 (what `stoker prepare tokens` writes)."""
    return np.array([0] * 100 + [len(d) for d in docs], dtype=np.int64)


def _batches(docs, mode, batch_size=3, seed=5, problems=None):
    shard = _shard(docs, problems)
    unit = Unit(7, 1, (Segment(0, 0, len(docs), 100),))
    order = [doc_id - 100 for _, _, doc_id in unit.rows(seed)]
    made = list(unit_token_batches(lambda _i: shard, unit, LMConfig(WIDTH, mode), seed, batch_size, EOT, PAD,
                                   _lengths(docs)))
    return made, order


documents = st.lists(st.lists(st.integers(2, 50), min_size=0, max_size=40), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(documents, st.integers(1, 4))
def test_concat_delivers_the_stream_of_the_unit_in_its_order_once(docs, batch_size):
    made, order = _batches(docs, "concat", batch_size)
    inputs = np.concatenate([b.tensors["input_ids"].reshape(-1)[:b.tokens] for b in made if b.rows] or [[]])
    stream = [t for i in order if docs[i] for t in [*docs[i], EOT]]  # an empty document is skipped
    assert inputs.tolist() == stream[:len(inputs)] and len(inputs) >= len(stream) - 1  # the last eot: maybe a label
    assert all(b.rows == batch_size for b in made[:-2])  # the last two may share a remainder (plan.batch_bounds)
    _listed_once(made, docs)


@settings(max_examples=60, deadline=None)
@given(documents, st.integers(1, 4))
def test_packed_rows_keep_documents_apart_and_every_token_once(docs, batch_size):
    """Every segment is a piece of one document (+ eot): the whole of it, or, for one longer than a row, a
    row-sized cut of it in order; positions restart and labels stay inside it. The pieces delivered are
    exactly the pieces of the unit's documents, each once."""
    made, _ = _batches(docs, "packed", batch_size)
    delivered = []
    for b in made:
        ids, labels, pos, seg = (b.tensors[k] for k in ("input_ids", "labels", "position_ids", "segment_ids"))
        for r in range(b.rows):
            for s in range(1, int(seg[r].max()) + 1):
                at = np.flatnonzero(seg[r] == s)
                assert at.tolist() == list(range(at[0], at[0] + at.size))  # one run
                assert pos[r, at].tolist() == list(range(at.size))  # positions restart per segment
                assert labels[r, at[:-1]].tolist() == ids[r, at[1:]].tolist() and labels[r, at[-1]] == IGNORE
                delivered.append(tuple(ids[r, at].tolist()))
            assert (labels[r, seg[r] == 0] == IGNORE).all() and (ids[r, seg[r] == 0] == PAD).all()
    expected = [tuple(whole[i:i + WIDTH]) for doc in docs if doc for whole in [[*doc, EOT]]
                for i in range(0, len(whole), WIDTH)]
    assert sorted(delivered) == sorted(expected)
    _listed_once(made, docs)


def _listed_once(made, docs) -> None:
    listed = [d - 100 for b in made for d in b.doc_ids]
    assert sorted(listed) == [i for i, d in enumerate(docs) if d]  # every usable document in exactly one batch
    assert sorted(d - 100 for d, _, _ in made[-1].skipped) == [i for i, d in enumerate(docs) if not d]
    assert made[-1].last and not any(b.last for b in made[:-1])
    assert [b.batch_index for b in made] == list(range(len(made)))


def test_a_document_is_listed_in_the_first_batch_that_holds_any_of_its_tokens():
    docs = [[5] * 40, [6] * 3, [7] * 3]
    made, order = _batches(docs, "concat", batch_size=1)
    for b in made:
        held = set(np.unique(b.tensors["input_ids"])) | set(np.unique(b.tensors["labels"]))
        for d in b.doc_ids:
            assert docs[d - 100][0] in held
    firsts = {d: b.batch_index for b in made for d in b.doc_ids}
    assert firsts[100 + order[0]] == 0


def test_unusable_documents_are_skipped_and_named_in_the_last_batch():
    made, _ = _batches([[5, 6], [], [7]], "packed", problems={1: "document has no tokens"})
    assert made[-1].skipped == [(101, "k1", "document has no tokens")]
    assert sorted(d for b in made for d in b.doc_ids) == [100, 102]
    unreadable = list(unit_token_batches(lambda _i: "unreadable shard: sha256", Unit(0, 0, (Segment(0, 0, 2, 0),)),
                                         LMConfig(WIDTH), 0, 4, EOT, PAD, np.array([3, 4])))
    assert len(unreadable) == 1 and unreadable[0].rows == 0 and len(unreadable[0].skipped) == 2


def test_the_same_unit_gives_the_same_batches_and_stats_add_up():
    docs = [[3] * n for n in (5, 30, 2, 9, 14)]
    one, _ = _batches(docs, "packed")
    two, _ = _batches(docs, "packed")
    assert all(np.array_equal(a.tensors[k], b.tensors[k]) for a, b in zip(one, two, strict=True) for k in a.tensors)
    assert sum(b.tokens for b in one) == sum(len(d) + 1 for d in docs)
    assert all(b.token_slots == b.rows * WIDTH and b.unpacked_slots == b.segments * WIDTH for b in one)


def test_the_layout_and_its_settings():
    assert set(tensor_specs(LMConfig(8, "packed"))) == {"input_ids", "labels", "position_ids", "segment_ids"}
    assert set(tensor_specs(LMConfig(8, "concat"))) == {"input_ids", "labels"}
    assert tensor_specs(LMConfig(8)).get("input_ids").shape == (8,)
    for bad in (1, 0, True, 2.5):
        with pytest.raises(ConfigError, match="seq_len"):
            LMConfig(bad)
    with pytest.raises(ConfigError, match="mode"):
        LMConfig(8, "sliding")


def test_cu_seqlens_follow_the_segments_row_by_row():
    seg = np.array([[1, 1, 2, 0], [1, 1, 1, 1]])
    assert cu_seqlens_of(seg).tolist() == [0, 2, 3, 4, 8]


@settings(max_examples=80, deadline=None)
@given(documents, st.integers(1, 4), st.sampled_from(["concat", "packed"]), st.integers(0, 3))
def test_the_planned_batches_are_the_batches_the_worker_makes(docs, batch_size, mode, seed):
    """`planned_batches` on the lengths file's counts in the unit's visiting order (what every rank works
    out from the plan) is how many batches the worker's rows make."""
    unit = Unit(7, 1, (Segment(0, 0, len(docs), 100),))
    made, _ = _batches(docs, mode, batch_size, seed)
    assert planned_batches(unit_lengths(unit, seed, _lengths(docs)), LMConfig(WIDTH, mode), batch_size) == len(made)
    assert unit_rows(unit_lengths(unit, seed, _lengths(docs)), LMConfig(WIDTH, mode)) == sum(b.rows for b in made)


@settings(max_examples=60, deadline=None)
@given(documents, st.integers(1, 4), st.sampled_from(["concat", "packed"]), st.data())
def test_unusable_documents_leave_the_planned_batch_count(docs, batch_size, mode, data):
    """A document that turns out unusable (its shard failed its sha256, an id out of the vocabulary) still
    counted in the plan: the unit gives the planned batches all the same (packed: its place left as
    padding, a row of nothing dropped; concat: empty batches at the end), the others each listed once."""
    bad = data.draw(st.sets(st.integers(0, len(docs) - 1)))
    made, _ = _batches(docs, mode, batch_size, problems={i: "token id 999 outside the vocabulary" for i in bad})
    clean, _ = _batches(docs, mode, batch_size)
    assert len(made) == len(clean)
    assert sorted(d - 100 for b in made for d in b.doc_ids) == [i for i, d in enumerate(docs) if d and i not in bad]
    assert all(b.rows == 0 or b.tokens for b in made)  # no row of padding alone
    rows = [b.rows for b in made]
    assert sorted(rows, key=lambda r: r == 0) == rows  # the empty batches come last
    assert made[-1].last and sorted(d - 100 for d, _, _ in made[-1].skipped) == sorted(
        {i for i, d in enumerate(docs) if not d} | bad)


@pytest.mark.parametrize("mode", ["concat", "packed"])
def test_a_lengths_file_that_does_not_match_the_shards_is_refused_or_its_count_kept(mode):
    """Packed counts the planned batches from the rows it just made only when every document has its
    planned length; a lengths file that plans fewer rows than the shards make is refused, one that plans
    more gets its count (empty batches at the end)."""
    docs = [[5] * 12 for _ in range(8)]
    unit = Unit(7, 1, (Segment(0, 0, len(docs), 100),))
    short = _lengths(docs)
    short[100:] = 1
    with pytest.raises(DataError, match="lengths file that does not match"):
        list(unit_token_batches(lambda _i: _shard(docs), unit, LMConfig(WIDTH, mode), 0, 1, EOT, PAD, short))
    long = _lengths(docs)
    long[100:] = 40
    made = list(unit_token_batches(lambda _i: _shard(docs), unit, LMConfig(WIDTH, mode), 0, 1, EOT, PAD, long))
    assert len(made) == planned_batches(unit_lengths(unit, 0, long), LMConfig(WIDTH, mode), 1)
    assert len(made) > len(_batches(docs, mode, batch_size=1)[0]) and made[-1].rows == 0


def test_a_whole_unit_of_unreadable_documents_gives_its_planned_batches_empty():
    lengths = np.array([20, 30, 5, 40, 9])
    unit = Unit(0, 0, (Segment(0, 0, 5, 0),))
    for mode in ("packed", "concat"):
        made = list(unit_token_batches(lambda _i: "unreadable shard: sha256", unit, LMConfig(WIDTH, mode), 0, 2,
                                       EOT, PAD, lengths))
        assert len(made) == planned_batches(unit_lengths(unit, 0, lengths), LMConfig(WIDTH, mode), 2) > 1
        assert all(b.rows == 0 and not b.doc_ids for b in made) and len(made[-1].skipped) == 5


@settings(max_examples=100, deadline=None)
@given(st.lists(documents, min_size=1, max_size=3), st.integers(0, 3), st.booleans(), st.data())
def test_gathering_a_unit_by_whole_arrays_equals_the_loop_per_document(shards, seed, holes, data):
    """Several shards, one unreadable, some documents unusable: the same ids, tokens, skips and holes."""
    from tests.unit.stoker.pipeline.text.causal_reference import old_unit_documents

    made = [_shard(docs, {r: "bad id" for r in data.draw(st.sets(st.integers(0, max(0, len(docs) - 1))))})
            for docs in shards]
    unreadable = data.draw(st.integers(-1, len(shards) - 1))
    segments, first = [], 0
    for index, docs in enumerate(shards):
        segments.append(Segment(index, 0, len(docs), first))
        first += len(docs)
    unit = Unit(0, 0, tuple(segments))
    lengths = np.array([len(d) for docs in shards for d in docs], dtype=np.int64)

    def source_of(index):
        return "unreadable shard: gone" if index == unreadable else made[index]

    ids, flat, skipped, hole = unit_documents(source_of, unit, seed, lengths, holes)
    old_ids, old_docs, old_skipped, old_hole = old_unit_documents(source_of, unit, seed, lengths, holes)
    assert ids == old_ids and skipped == old_skipped and hole == old_hole
    assert flat.sizes.tolist() == [d.size for d in old_docs]
    assert flat.tokens.dtype == np.int32 and flat.tokens.tolist() == [int(t) for d in old_docs for t in d]
