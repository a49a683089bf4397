"""stoker/pipeline/text/causal.py: causal-LM rows, concatenated or best-fit packed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.pipeline.text.causal import (
    IGNORE,
    CausalConfig,
    FlatDocuments,
    batch_cu_seqlens,
    best_fit,
    causal_rows,
    concat_rows,
    fit_rows,
    packed_rows,
    piece_lengths,
    row_tensors,
    runs,
)
from stoker.protos.errors import ConfigError, DataError
from tests.unit.stoker.pipeline.text.causal_reference import (
    old_best_fit,
    old_concat_rows,
    old_packed_rows,
    old_piece_lengths,
)

EOT, PAD = 0, 1  # documents use ids >= 2, so a token's value says whether it is eot or padding


@st.composite
def corpora(draw):
    """seq_len and documents of every awkward size: empty, one token, exactly seq_len,
    seq_len - 1 (fits with its eot), longer than several rows, and random."""
    seq_len = draw(st.integers(2, 24))
    size = st.one_of(st.sampled_from([0, 1, seq_len - 1, seq_len, seq_len + 1, 3 * seq_len + 2]),
                     st.integers(0, 4 * seq_len))
    sizes = draw(st.lists(size, max_size=25))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    return seq_len, [rng.integers(2, 50_000, size=n).astype(np.int32) for n in sizes]


def stream_of(docs):
    return [t for d in docs for t in [*d.tolist(), EOT]]


@settings(max_examples=150, deadline=None)
@given(corpora(), st.booleans())
def test_concat_rows_are_the_stream_cut_with_labels_shifted(corpus, drop_last):
    seq_len, docs = corpus
    out = concat_rows(docs, CausalConfig(seq_len, EOT, PAD, mode="concat", drop_last=drop_last))
    stream = stream_of(docs)
    n = out.stats.rows
    assert out.input_ids.shape == out.labels.shape == (n, seq_len)
    joined = []
    for r in range(n):
        real = int(out.segment_ids[r].sum())
        assert np.all(out.segment_ids[r, :real] == 1) and np.all(out.segment_ids[r, real:] == 0)
        assert np.all(out.input_ids[r, real:] == PAD) and np.all(out.labels[r, real:] == IGNORE)
        valid = out.labels[r] != IGNORE
        # labels are the inputs shifted by one, and the next row's first input ends this row
        assert np.array_equal(out.labels[r, :-1][valid[:-1]], out.input_ids[r, 1:][valid[:-1]])
        if r + 1 < n:
            assert out.labels[r, -1] == out.input_ids[r + 1, 0]
        window = out.input_ids[r, :real].tolist() + out.labels[r][valid][real - 1:].tolist()
        joined += window if r == 0 else window[1:]
        assert np.array_equal(out.cu_seqlens[r], [0, real])
    if drop_last:
        assert n == max(0, (len(stream) - 1) // seq_len) and joined == stream[:len(joined)]
        assert out.stats.padding == 0 and out.stats.dropped_tokens == len(stream) - len(joined)
    else:
        assert joined == (stream if len(stream) > 1 else [])
    assert out.stats.tokens == int(out.segment_ids.sum())
    assert out.stats.padding_fraction == pytest.approx(out.stats.padding / (n * seq_len) if n else 0.0)


def test_concat_rows_share_one_token_and_pad_the_rest():
    docs = [np.array([5, 6, 7]), np.array([8])]  # stream 5 6 7 0 8 0
    out = concat_rows(docs, CausalConfig(4, EOT, PAD, mode="concat", drop_last=False))
    assert out.input_ids.tolist() == [[5, 6, 7, 0], [8, 0, PAD, PAD]]
    assert out.labels.tolist() == [[6, 7, 0, 8], [0, IGNORE, IGNORE, IGNORE]]
    assert (out.stats.tokens, out.stats.padding, out.stats.split_documents, out.stats.pieces) == (6, 2, 0, 2)
    dropped = concat_rows(docs, CausalConfig(4, EOT, PAD, mode="concat"))
    assert dropped.input_ids.tolist() == [[5, 6, 7, 0]] and dropped.stats.dropped_tokens == 1


def check_packed(out, docs, seq_len):
    """Every packed-row property the module promises; returns each piece as (document, tokens)."""
    pieces = []
    for r in range(out.stats.rows):
        ids, labels, pos, seg, cu = (out.input_ids[r], out.labels[r], out.position_ids[r],
                                     out.segment_ids[r], out.cu_seqlens[r])
        real = int(np.count_nonzero(seg))
        assert np.all(seg[:real] > 0) and np.all(seg[real:] == 0)  # padding only at the end
        assert np.all(ids[real:] == PAD) and np.all(labels[real:] == IGNORE)
        assert cu[0] == 0 and cu[-1] == real and len(cu) == seg.max(initial=0) + 1
        for k, (a, b) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
            assert b > a and np.all(seg[a:b] == k + 1)
            assert np.array_equal(pos[a:b], np.arange(b - a))
            assert np.array_equal(labels[a:b - 1], ids[a + 1:b]) and labels[b - 1] == IGNORE
            pieces.append(ids[a:b].tolist())
    # the pieces, read in document order, give back each document plus eot exactly once
    wholes = [[*d.tolist(), EOT] for d in docs]
    by_doc: dict[int, list[int]] = {}
    remaining = list(pieces)  # in row order, so a split document's pieces come in its order
    for i, whole in enumerate(wholes):
        got: list[int] = []
        while len(got) < len(whole):
            nxt = next((p for p in remaining if whole[len(got):len(got) + len(p)] == p), None)
            assert nxt is not None, f"document {i} is missing tokens"
            remaining.remove(nxt)
            assert len(whole) > seq_len or len(nxt) == len(whole)  # split only when longer than a row
            got += nxt
        by_doc[i] = got
    assert not remaining and [by_doc[i] for i in range(len(docs))] == wholes
    assert out.stats.padding == out.stats.rows * seq_len - sum(map(len, pieces))
    return pieces


@settings(max_examples=150, deadline=None)
@given(corpora())
def test_packed_rows_keep_documents_whole_apart_and_in_order(corpus):
    seq_len, docs = corpus
    out = packed_rows(docs, CausalConfig(seq_len, EOT, PAD))
    check_packed(out, docs, seq_len)
    assert out.stats.split_documents == sum(d.size + 1 > seq_len for d in docs)
    assert out.stats.pieces == sum(-(-(d.size + 1) // seq_len) for d in docs)
    assert out.stats.padding_fraction == pytest.approx(
        out.stats.padding / (out.stats.rows * seq_len) if out.stats.rows else 0.0)
    again = causal_rows([d.copy() for d in docs], CausalConfig(seq_len, EOT, PAD))
    for name in ("input_ids", "labels", "position_ids", "segment_ids"):
        assert np.array_equal(getattr(out, name), getattr(again, name))
    assert all(np.array_equal(a, b) for a, b in zip(out.cu_seqlens, again.cu_seqlens, strict=True))
    assert out.stats == again.stats


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40).flatmap(lambda cap: st.tuples(st.just(cap), st.lists(st.integers(1, cap), max_size=60))))
def test_best_fit_takes_the_fullest_row_that_fits_earliest_first(case):
    capacity, lengths = case
    rows = best_fit(lengths, capacity)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(row == sorted(row) for row in rows)
    where = {i: r for r, row in enumerate(rows) for i in row}
    free: list[int] = []
    for i, need in enumerate(lengths):  # replay: at each placement, no better row existed
        fits = [(room, r) for r, room in enumerate(free) if room >= need]
        if where[i] == len(free):
            assert not fits
            free.append(capacity)
        else:
            assert min(fits) == (free[where[i]], where[i])
        free[where[i]] -= need
        assert free[where[i]] >= 0


def test_packed_rows_follow_best_fit_on_a_known_case():
    docs = [np.arange(2, 2 + n) for n in (5, 2, 4, 1, 0)]  # with eot: 6, 3, 5, 2, 1 into rows of 8
    out = packed_rows(docs, CausalConfig(8, EOT, PAD))
    assert best_fit([6, 3, 5, 2, 1], 8) == [[0, 3], [1, 2], [4]]
    assert out.segment_ids.tolist() == [[1] * 6 + [2] * 2, [1] * 3 + [2] * 5, [1] + [0] * 7]
    assert [c.tolist() for c in out.cu_seqlens] == [[0, 6, 8], [0, 3, 8], [0, 1]]
    assert out.labels[0].tolist() == [3, 4, 5, 6, EOT, IGNORE, EOT, IGNORE]
    assert out.stats.padding == 7 and out.stats.padding_fraction == pytest.approx(7 / 24)


def test_a_long_document_is_cut_into_row_sized_pieces():
    out = packed_rows([np.arange(2, 12)], CausalConfig(4, EOT, PAD))  # 10 tokens + eot = 4 + 4 + 3
    assert out.input_ids.tolist() == [[2, 3, 4, 5], [6, 7, 8, 9], [10, 11, EOT, PAD]]
    assert out.position_ids[1].tolist() == [0, 1, 2, 3]
    assert (out.stats.split_documents, out.stats.pieces, out.stats.padding) == (1, 3, 1)


def test_batch_cu_seqlens_spans_the_flattened_rows():
    out = packed_rows([np.arange(2, 7), np.arange(2, 4), np.array([9])], CausalConfig(8, EOT, PAD))
    cu, longest = batch_cu_seqlens(out.cu_seqlens, 8)
    assert cu.tolist() == [0, 6, 8, 11, 16] and longest == 6  # row 1: [2, 3, eot], then a padding tail
    assert batch_cu_seqlens((), 8)[0].tolist() == [0]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"seq_len": 1}, "seq_len"), ({"seq_len": 2.5}, "seq_len"), ({"eot": -1}, "eot"),
    ({"pad": -3}, "pad"), ({"mode": "sliding"}, "mode"),
])
def test_settings_that_cannot_work_are_refused_by_name(kwargs, field):
    settings_ = {"seq_len": 8, "eot": EOT, "pad": PAD, **kwargs}
    with pytest.raises(ConfigError, match=field):
        CausalConfig(**settings_)


def test_documents_that_are_not_token_ids_are_refused():
    cfg = CausalConfig(8, EOT, PAD)
    with pytest.raises(DataError, match="document 1"):
        causal_rows([np.arange(3), np.zeros((2, 2), dtype=int)], cfg)
    with pytest.raises(DataError, match="negative"):
        causal_rows([np.array([4, -2])], cfg)
    with pytest.raises(DataError, match="outside"):
        best_fit([3, 9], 8)
    empty = causal_rows([], cfg)
    assert empty.input_ids.shape == (0, 8) and empty.stats.padding_fraction == 0.0


def _same_rows(fast, old) -> None:
    """Every tensor, bound, stat and first row of two CausalRows equal, dtype included."""
    for name in ("input_ids", "labels", "position_ids", "segment_ids", "first_rows"):
        a, b = getattr(fast, name), getattr(old, name)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
    assert len(fast.cu_seqlens) == len(old.cu_seqlens)
    pairs = zip(fast.cu_seqlens, old.cu_seqlens, strict=True)
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in pairs)
    assert fast.stats == old.stats


_DOCS = st.lists(st.lists(st.integers(0, 500), max_size=40), max_size=30)


@settings(max_examples=300, deadline=None)
@given(_DOCS, st.integers(2, 24), st.booleans(), st.integers(0, 3), st.integers(0, 3))
def test_concat_rows_by_whole_arrays_equal_the_row_by_row_cut(docs, width, drop_last, eot, pad):
    config = CausalConfig(width, eot, pad, "concat", drop_last)
    arrays = [np.array(d, dtype=np.int64) for d in docs]
    _same_rows(concat_rows(arrays, config), old_concat_rows(arrays, config))


@settings(max_examples=300, deadline=None)
@given(_DOCS, st.integers(2, 24), st.data())
def test_packed_rows_by_whole_arrays_equal_the_piece_by_piece_packing(docs, width, data):
    holes = data.draw(st.lists(st.booleans(), min_size=len(docs), max_size=len(docs))) if docs else []
    config = CausalConfig(width, 0, 1, "packed")
    arrays = [np.array(d, dtype=np.int32) for d in docs]
    _same_rows(packed_rows(arrays, config, holes), old_packed_rows(arrays, config, holes))
    flat = FlatDocuments(np.array([t for d in docs for t in d], dtype=np.int32),
                         np.array([len(d) for d in docs], np.int64))
    _same_rows(packed_rows(flat, config, holes), old_packed_rows(arrays, config, holes))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 20), max_size=60), st.integers(20, 30))
def test_best_fit_by_one_sorted_list_equals_the_rooms_table(lengths, capacity):
    assert best_fit(lengths, capacity) == old_best_fit(lengths, capacity)
    assert piece_lengths(lengths, 7) == old_piece_lengths(lengths, 7)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 20), max_size=60), st.integers(20, 30))
def test_fit_rows_gives_each_item_the_row_best_fit_puts_it_in(lengths, capacity):
    rows = fit_rows(lengths, capacity)
    assert rows == [r for i in range(len(lengths)) for r, members in enumerate(old_best_fit(lengths, capacity))
                    if i in members]
    with pytest.raises(DataError, match="item 1 has length 21"):
        fit_rows([3, 21, 0], 20)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 9)), max_size=30))
def test_runs_are_the_ranges_one_after_another(spans):
    starts = np.array([a for a, _ in spans], dtype=np.int64)
    sizes = np.array([n for _, n in spans], dtype=np.int64)
    made = runs(starts, sizes)
    assert made.dtype == np.int64 and made.tolist() == [a + k for a, n in spans for k in range(n)]


@settings(max_examples=300, deadline=None)
@given(_DOCS, st.integers(2, 24), st.sampled_from(["concat", "packed"]), st.booleans(), st.data())
def test_row_tensors_are_the_rows_tensors_and_first_rows(docs, width, mode, drop_last, data):
    """What a worker's batches take is exactly what causal_rows makes (the old row-by-row cut as well)."""
    holes = data.draw(st.lists(st.booleans(), min_size=len(docs), max_size=len(docs))) if mode == "packed" else []
    config = CausalConfig(width, 0, 1, mode, drop_last)
    arrays = [np.array(d, dtype=np.int32) for d in docs]
    tensors, first = row_tensors(arrays, config, holes)
    full = packed_rows(arrays, config, holes) if mode == "packed" else concat_rows(arrays, config)
    old = old_packed_rows(arrays, config, holes) if mode == "packed" else old_concat_rows(arrays, config)
    names = ("input_ids", "labels", "segment_ids") + (("position_ids",) if mode == "packed" else ())
    assert sorted(tensors) == sorted(names)
    for made in (full, old):
        for name in names:
            a, b = tensors[name], getattr(made, name)
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
        assert first.dtype == made.first_rows.dtype and np.array_equal(first, made.first_rows)
