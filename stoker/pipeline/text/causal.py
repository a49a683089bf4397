"""Causal-LM rows from tokenized documents: concatenated GPT-style, or best-fit packed.

Both modes give rows of `seq_len` input positions with next-token labels (-100 where nothing
is to be predicted), so a consumer's loss needs no shift of its own.

`concat`: the documents, each followed by `eot`, form one stream; row r is
stream[r*seq_len : r*seq_len + seq_len + 1], inputs its first `seq_len` tokens and labels its
last (the GPT-2/Megatron cut: consecutive rows share one token, the last label of a row being
the first input of the next, so every stream token but the first is a label exactly once).
Attention runs across documents, as GPT-2 trained; one segment per row.

`packed`: each document plus its `eot` goes, in the given order, into the open row with the
least room that still fits it (ties: the earliest row), else a new row. A document longer
than a row is first cut into row-sized pieces (the last holding the rest and the `eot`); no
other document is split. Each piece is a segment: positions restart at 0, labels stay inside
it (its last position is -100, so no document predicts the next), and `cu_seqlens` gives its
bounds as flash-attention's varlen kernels take them. `packing.pack` is not reused: it sorts
longest first (rows would not keep document order) and breaks ties by bucket order, not row.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from stoker.protos.errors import ConfigError, DataError

MODES = ("concat", "packed")
IGNORE = -100  # the label a loss skips (torch's cross_entropy ignore_index)


@dataclass(frozen=True)
class CausalConfig:
    """How documents become causal-LM rows: the row length, the special ids and the mode."""

    seq_len: int
    eot: int
    pad: int
    mode: str = "packed"
    drop_last: bool = True  # concat: drop the final partial row (else pad it)

    def __post_init__(self) -> None:
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len < 2:
            raise ConfigError(f"seq_len must be an integer >= 2 (got {self.seq_len!r})")
        for name in ("eot", "pad"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be a non-negative token id (got {value!r})")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)} (got {self.mode!r})")


@dataclass(frozen=True)
class CausalStats:
    """What a set of rows delivered, for reporting."""

    documents: int  # documents given
    rows: int
    tokens: int  # input positions holding a token (not padding)
    padding: int  # input positions holding padding
    split_documents: int  # documents spread over more than one row
    pieces: int  # (document, row) parts delivered
    dropped_tokens: int = 0  # concat with drop_last: stream tokens in no row

    @property
    def padding_fraction(self) -> float:
        """Padding over all input positions of the rows (0 with no rows)."""
        total = self.tokens + self.padding
        return self.padding / total if total else 0.0


@dataclass(frozen=True)
class CausalRows:
    """The rows, (rows, seq_len) int32 each, with every row's segment bounds and the stats."""

    input_ids: np.ndarray
    labels: np.ndarray  # next token in the same segment, IGNORE elsewhere
    position_ids: np.ndarray  # from 0 at each segment's start
    segment_ids: np.ndarray  # 1, 2, ... per segment of the row, 0 on padding
    cu_seqlens: tuple[np.ndarray, ...]  # per row: int32 [0, end of segment 1, ..., tokens]
    stats: CausalStats
    first_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per document: the first row
    # holding any of its tokens (concat: the row whose labels hold its first, when no input does), -1: none


def causal_rows(documents: Sequence[np.ndarray], config: CausalConfig) -> CausalRows:
    """The rows of `documents` in the config's mode."""
    docs = _checked(documents)
    return concat_rows(docs, config) if config.mode == "concat" else packed_rows(docs, config)


def concat_rows(documents: Sequence[np.ndarray], config: CausalConfig) -> CausalRows:
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


def concat_row_count(stream_tokens: int, width: int, drop_last: bool) -> int:
    """Rows of a concat stream of `stream_tokens` (each document and its eot): the windows of width + 1
    that start every `width` tokens, a partial last one kept unless `drop_last`."""
    full = max(0, (stream_tokens - 1) // width)
    return full + int(not drop_last and stream_tokens - 1 > full * width)


def piece_lengths(lengths: Sequence[int], width: int) -> list[int]:
    """The packed pieces' sizes of documents of these lengths, in order: each plus its eot, cut into
    pieces of `width` only when longer than that (as `packed_rows` cuts them)."""
    return [min(width, n + 1 - start) for n in lengths for start in range(0, int(n) + 1, width)]


def packed_rows(documents: Sequence[np.ndarray], config: CausalConfig, holes: Sequence[bool] = ()) -> CausalRows:
    """Best-fit packed rows, segments kept apart (see the module's docstring). A document marked in
    `holes` takes its place in the packing but is left as padding (an unusable document whose length the
    plan knows: the rows stay the ones the plan counted)."""
    docs = _checked(documents)
    width = config.seq_len
    hole = np.asarray(holes, dtype=bool) if len(holes) else np.zeros(len(docs), dtype=bool)
    pieces, owners = _pieces(docs, config.eot, width)
    rows = best_fit(piece_lengths([d.size for d in docs], width), width)
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


def best_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
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


def batch_cu_seqlens(cu_seqlens: Sequence[np.ndarray], seq_len: int) -> tuple[np.ndarray, int]:
    """One flash-attention `cu_seqlens` (and `max_seqlen`) for rows flattened to one run of
    rows * seq_len tokens: each row's segments shifted to its offset, a padding tail kept as a
    segment of its own (its labels are IGNORE) so the bounds stay contiguous."""
    out = [np.zeros(1, dtype=np.int32)]
    for r, bounds in enumerate(cu_seqlens):
        ends = [int(b) for b in bounds[1:]]
        if not ends or ends[-1] < seq_len:
            ends.append(seq_len)
        out.append(np.asarray(ends, dtype=np.int32) + r * seq_len)
    flat = np.concatenate(out)
    return flat, int(np.diff(flat).max()) if flat.size > 1 else 0


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
