"""The causal-LM rows, token shard flattening and unit gathering as they were before the whole-array
rewrite (a loop per document and per row): the oracle the fast path is checked against, byte for byte."""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from stoker.pipeline.text.causal import IGNORE, CausalConfig, CausalRows, CausalStats, concat_row_count
from stoker.pipeline.text.token_shards import TokenShard
from stoker.pipeline.units import Unit
from stoker.protos.errors import DataError


def old_concat_rows(documents: Sequence[np.ndarray], config: CausalConfig) -> CausalRows:
    """The GPT-style cut of the documents' stream (see the module's docstring)."""
    docs = _checked(documents)
    width = config.seq_len
    stream = _stream(docs, config.eot)
    n_rows = concat_row_count(stream.size, width, config.drop_last)
    windows = np.full((n_rows, width + 1), config.pad, dtype=np.int32)
    real = np.zeros(n_rows, dtype=np.int64)  # stream tokens in each row's window
    for r in range(n_rows):
        part = stream[r * width:r * width + width + 1]
        windows[r, :part.size] = part
        real[r] = part.size
    cols = np.arange(width)
    input_real = cols[None, :] < np.minimum(real, width)[:, None]
    labels = np.where(cols[None, :] + 1 < real[:, None], windows[:, 1:], IGNORE).astype(np.int32)
    tokens = int(input_real.sum())
    covered = int(real[-1]) + (n_rows - 1) * width if n_rows else 0
    split, pieces = _concat_splits(docs, width, tokens)
    stats = CausalStats(len(docs), n_rows, tokens, n_rows * width - tokens, split, pieces,
                        stream.size - covered)
    starts = np.cumsum([d.size + 1 for d in docs], dtype=np.int64) - [d.size + 1 for d in docs]
    first = np.minimum(starts // width, n_rows - 1)
    first[starts >= covered] = -1  # drop_last: in no row
    return CausalRows(
        input_ids=np.ascontiguousarray(windows[:, :-1]), labels=labels,
        position_ids=np.tile(cols.astype(np.int32), (n_rows, 1)),
        segment_ids=input_real.astype(np.int32),
        cu_seqlens=tuple(np.array([0, n], dtype=np.int32) for n in input_real.sum(axis=1)),
        stats=stats, first_rows=first.astype(np.int64))


def old_piece_lengths(lengths: Sequence[int], width: int) -> list[int]:
    """The packed pieces' sizes of documents of these lengths, in order: each plus its eot, cut into
    pieces of `width` only when longer than that (as `packed_rows` cuts them)."""
    return [min(width, n + 1 - start) for n in lengths for start in range(0, int(n) + 1, width)]


def old_packed_rows(documents: Sequence[np.ndarray], config: CausalConfig, holes: Sequence[bool] = ()) -> CausalRows:
    """Best-fit packed rows, segments kept apart (see the module's docstring). A document marked in
    `holes` takes its place in the packing but is left as padding (an unusable document whose length the
    plan knows: the rows stay the ones the plan counted)."""
    docs = _checked(documents)
    width = config.seq_len
    hole = np.asarray(holes, dtype=bool) if len(holes) else np.zeros(len(docs), dtype=bool)
    pieces, owners = _pieces(docs, config.eot, width)
    rows = old_best_fit(old_piece_lengths([d.size for d in docs], width), width)
    n_rows = len(rows)
    ids = np.full((n_rows, width), config.pad, dtype=np.int32)
    labels = np.full((n_rows, width), IGNORE, dtype=np.int32)
    positions = np.zeros((n_rows, width), dtype=np.int32)
    segments = np.zeros((n_rows, width), dtype=np.int32)
    bounds: list[np.ndarray] = []
    first_rows = np.full(len(docs), -1, dtype=np.int64)
    for r, members in enumerate(rows):
        start = 0
        ends = [0]  # a hole's span is a bound of its own, as a padding tail is
        k = 0
        for index in members:
            piece = pieces[index]
            stop = start + piece.size
            if not hole[owners[index]]:
                if first_rows[owners[index]] < 0:
                    first_rows[owners[index]] = r
                k += 1
                ids[r, start:stop] = piece
                labels[r, start:stop - 1] = piece[1:]
                positions[r, start:stop] = np.arange(piece.size)
                segments[r, start:stop] = k
            ends.append(stop)
            start = stop
        bounds.append(np.array(ends, dtype=np.int32))
    real = [i for i, owner in enumerate(owners) if not hole[owner]]
    tokens = sum(pieces[i].size for i in real)
    per_doc = np.bincount([owners[i] for i in real], minlength=len(docs))
    stats = CausalStats(len(docs) - int(hole.sum()), n_rows, tokens, n_rows * width - tokens,
                        int(np.count_nonzero(per_doc > 1)), len(real))
    return CausalRows(ids, labels, positions, segments, tuple(bounds), stats, first_rows)


def old_best_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Rows of item indices, items taken in order: each into the open row with the least room
    that still fits it (ties: the earliest row), else into a new row. Every length must be
    1..capacity; a full row closes."""
    rows: list[list[int]] = []
    free: list[int] = []
    open_at: list[list[int]] = [[] for _ in range(capacity + 1)]  # room -> open rows, ascending
    has_open = np.zeros(capacity + 1, dtype=bool)
    for index, need in enumerate(lengths):
        need = int(need)
        if not 0 < need <= capacity:
            raise DataError(f"item {index} has length {need}, outside 1..{capacity}")
        hits = np.flatnonzero(has_open[need:])
        if hits.size:
            room = need + int(hits[0])
            row = open_at[room].pop(0)
            has_open[room] = bool(open_at[room])
        else:
            row = len(rows)
            rows.append([])
            free.append(capacity)
        rows[row].append(index)
        free[row] -= need
        if free[row]:
            insort(open_at[free[row]], row)
            has_open[free[row]] = True
    return rows


def _checked(documents: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The documents as 1-D int arrays of non-negative ids; anything else is a DataError."""
    out = []
    for i, doc in enumerate(documents):
        arr = np.asarray(doc)
        if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
            raise DataError(f"document {i} is not a 1-D array of integer token ids "
                            f"(shape {arr.shape}, dtype {arr.dtype})")
        if arr.size and int(arr.min()) < 0:
            raise DataError(f"document {i} holds a negative token id {int(arr.min())}")
        out.append(arr.astype(np.int32, copy=False))
    return out


def _stream(docs: list[np.ndarray], eot: int) -> np.ndarray:
    end = np.array([eot], dtype=np.int32)
    parts = [p for doc in docs for p in (doc, end)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def _concat_splits(docs: list[np.ndarray], width: int, delivered: int) -> tuple[int, int]:
    """Documents whose input positions span rows, and (document, row) parts, among the first
    `delivered` stream positions (the rows' inputs)."""
    sizes = np.array([d.size + 1 for d in docs], dtype=np.int64)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    keep = starts < delivered
    first = starts[keep] // width
    last = (np.minimum(ends[keep], delivered) - 1) // width
    return int(np.count_nonzero(last > first)), int((last - first + 1).sum())


def _pieces(docs: list[np.ndarray], eot: int, width: int) -> tuple[list[np.ndarray], list[int]]:
    """Each document plus `eot`, cut into pieces of `width` only when longer than that; with
    each piece's document index."""
    pieces: list[np.ndarray] = []
    owners: list[int] = []
    for i, doc in enumerate(docs):
        whole = np.append(doc, np.int32(eot)).astype(np.int32)
        for start in range(0, whole.size, width):
            pieces.append(whole[start:start + width])
            owners.append(i)
    return pieces, owners


def old_flatten_tokens(table: pa.Table, vocab_size: int) -> TokenShard:
    keys = table.column("key").to_pylist()
    docs = table.column("tokens").combine_chunks()
    offsets = np.asarray(docs.offsets, dtype=np.int64)
    offsets -= offsets[0]  # a sliced array's offsets are not rebased; flatten() is
    tokens = np.asarray(docs.flatten().fill_null(-1), dtype=np.int32)
    nulls = docs.is_null().to_numpy(zero_copy_only=False)
    bad = (tokens < 0) | (tokens >= vocab_size)
    problems: dict[int, str] = {}
    for row in range(len(keys)):
        a, b = offsets[row], offsets[row + 1]
        if nulls[row] or b == a:
            problems[row] = "document has no tokens"
        elif bad[a:b].any():
            first = int(tokens[a:b][bad[a:b]][0])
            problems[row] = f"token id {first} outside the tokenizer's vocabulary (size {vocab_size})"
    return TokenShard(keys, tokens, offsets, problems)


def old_unit_documents(source_of: Callable[[int], TokenShard | str], unit: Unit, seed: int, lengths: np.ndarray,
                   holes: bool = False) -> tuple[list[int], list[np.ndarray], list[tuple[int, str, str]], list[bool]]:
    """The unit's documents in its seeded order (ids, tokens), the unusable ones (`source_of` gives a
    shard, or why it cannot be read), and which documents are holes: with `holes`, an unusable document
    the plan counts (its planned length > 0) stays in the list as that many placeholder tokens."""
    ids: list[int] = []
    docs: list[np.ndarray] = []
    skipped: list[tuple[int, str, str]] = []
    hole: list[bool] = []
    for shard_index, row, doc_id in unit.rows(seed):
        shard = source_of(shard_index)
        problem = shard if isinstance(shard, str) else shard.problem(row)
        if problem:
            skipped.append((doc_id, f"shard {shard_index} row {row}" if isinstance(shard, str) else shard.key(row),
                            problem))
            planned = int(lengths[doc_id % lengths.size])
            if holes and planned:
                ids.append(doc_id)
                docs.append(np.zeros(planned, dtype=np.int32))
                hole.append(True)
            continue
        assert not isinstance(shard, str)
        ids.append(doc_id)
        docs.append(shard.document(row))
        hole.append(False)
    return ids, docs, skipped, hole
