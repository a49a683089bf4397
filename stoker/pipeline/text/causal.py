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

from bisect import bisect_left, insort
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

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


@dataclass(frozen=True)
class FlatDocuments:
    """Documents as one array: a unit's or shard's documents reach the rows without a Python list of
    arrays (a loop per document costs more than the rows). Its maker vouches for the ids (int32, >= 0:
    a token shard checks every one as it is read)."""

    tokens: np.ndarray  # int32: every document's ids, one after another
    sizes: np.ndarray  # int64: each document's token count

    def __len__(self) -> int:
        return int(self.sizes.size)


Documents = Sequence[np.ndarray] | FlatDocuments


def causal_rows(documents: Documents, config: CausalConfig) -> CausalRows:
    """The rows of `documents` in the config's mode."""
    docs = _checked(documents)
    return concat_rows(docs, config) if config.mode == "concat" else packed_rows(docs, config)


def row_tensors(documents: Documents, config: CausalConfig, holes: Sequence[bool] = ()) -> tuple[dict[str, np.ndarray],
                                                                                                np.ndarray]:
    """The tensors of `causal_rows` by name (concat: input_ids, labels, segment_ids; packed: and position_ids;
    `holes` as `packed_rows` takes them) and each document's first row (-1: none): what a worker's batches
    take (stoker.pipeline.text.lm_layout), without the stats and per-row bounds they do not use."""
    docs = _checked(documents)
    if config.mode == "concat":
        arrays, first, _ = _concat_cut(docs, config)
        return arrays, first
    hole = np.asarray(holes, dtype=bool) if len(holes) else np.zeros(len(docs), dtype=bool)
    p = _pieces(docs.sizes, config.seq_len, hole)
    return dict(zip(("input_ids", "labels", "position_ids", "segment_ids"), _write_pieces(docs, p, config),
                    strict=True)), p.first_rows


def concat_rows(documents: Documents, config: CausalConfig) -> CausalRows:
    """The GPT-style cut of the documents' stream (see the module's docstring), by whole-array steps."""
    docs = _checked(documents)
    width = config.seq_len
    arrays, first, real = _concat_cut(docs, config)
    n_rows = real.size
    counts = np.minimum(real, width)
    tokens = int(counts.sum())
    covered = int(real[-1]) + (n_rows - 1) * width if n_rows else 0
    split, pieces = _concat_splits(docs.sizes, width, tokens)
    stats = CausalStats(len(docs), n_rows, tokens, n_rows * width - tokens, split, pieces,
                        docs.tokens.size + len(docs) - covered)
    return CausalRows(
        input_ids=arrays["input_ids"], labels=arrays["labels"],
        position_ids=np.tile(np.arange(width, dtype=np.int32), (n_rows, 1)), segment_ids=arrays["segment_ids"],
        cu_seqlens=tuple(np.array([0, n], dtype=np.int32) for n in counts.tolist()),
        stats=stats, first_rows=first)


def _concat_cut(docs: FlatDocuments, config: CausalConfig) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """concat's input ids, labels and segments, each document's first row, and each row's window (the stream
    tokens it covers, its last label included: width + 1, but for a short last row). Only a short window
    needs its tail masked, so the full ones are plain views and copies of the stream."""
    width = config.seq_len
    size = docs.tokens.size + len(docs)
    n_rows = concat_row_count(size, width, config.drop_last)
    flat = n_rows * width
    padded = _stream(docs, config.eot, flat + 1, config.pad)
    real = np.clip(size - np.arange(n_rows, dtype=np.int64) * width, 0, width + 1)  # tokens in each window
    labels = padded[1:flat + 1].reshape(n_rows, width).copy()
    segments = np.ones((n_rows, width), dtype=np.int32)
    for row, held in zip(np.flatnonzero(real <= width).tolist(), real[real <= width].tolist(), strict=True):
        labels[row, max(held - 1, 0):] = IGNORE
        segments[row, held:] = 0
    covered = int(real[-1]) + (n_rows - 1) * width if n_rows else 0
    starts = np.cumsum(docs.sizes + 1) - (docs.sizes + 1)
    first = np.minimum(starts // width, n_rows - 1)
    first[starts >= covered] = -1  # drop_last: in no row
    arrays = {"input_ids": padded[:flat].reshape(n_rows, width), "labels": labels, "segment_ids": segments}
    return arrays, first, real


def concat_row_count(stream_tokens: int, width: int, drop_last: bool) -> int:
    """Rows of a concat stream of `stream_tokens` (each document and its eot): the windows of width + 1
    that start every `width` tokens, a partial last one kept unless `drop_last`."""
    full = max(0, (stream_tokens - 1) // width)
    return full + int(not drop_last and stream_tokens - 1 > full * width)


def piece_lengths(lengths: Sequence[int] | np.ndarray, width: int) -> list[int]:
    """The packed pieces' sizes of documents of these lengths, in order: each plus its eot, cut into
    pieces of `width` only when longer than that (as `packed_rows` cuts them)."""
    return _piece_spans(np.asarray(lengths, dtype=np.int64).reshape(-1), width)[1].tolist()


def packed_rows(documents: Documents, config: CausalConfig, holes: Sequence[bool] = ()) -> CausalRows:
    """Best-fit packed rows, segments kept apart (see the module's docstring). A document marked in
    `holes` takes its place in the packing but is left as padding (an unusable document whose length the
    plan knows: the rows stay the ones the plan counted). The fit is decided piece by piece; the rows are
    then written by whole-array steps over every token at once."""
    docs = _checked(documents)
    width = config.seq_len
    hole = np.asarray(holes, dtype=bool) if len(holes) else np.zeros(len(docs), dtype=bool)
    p = _pieces(docs.sizes, width, hole)
    n_rows = p.starts.size
    bounds = np.split(np.insert(p.stop.astype(np.int32), p.starts, 0), p.starts[1:] + np.arange(1, n_rows))
    tokens = int(p.size[p.real].sum())
    per_doc = np.bincount(p.owner[p.real], minlength=len(docs))
    stats = CausalStats(len(docs) - int(hole.sum()), n_rows, tokens, n_rows * width - tokens,
                        int(np.count_nonzero(per_doc > 1)), int(p.real.sum()))
    return CausalRows(*_write_pieces(docs, p, config), tuple(bounds) if n_rows else (), stats, p.first_rows)


class _Pieces(NamedTuple):
    """A packing's pieces in row order, and where each document went."""

    at: np.ndarray  # the piece's first token in the stream
    size: np.ndarray
    owner: np.ndarray  # its document
    row: np.ndarray
    stop: np.ndarray  # its end within its row
    real: np.ndarray  # not a hole's
    starts: np.ndarray  # each row's first piece
    first_rows: np.ndarray  # per document: the first row holding any of its tokens, -1: none (a hole)


def _pieces(sizes: np.ndarray, width: int, hole: np.ndarray) -> _Pieces:
    """The documents' pieces fitted into rows (`fit_rows`) and put in row order."""
    at, size, owner = _piece_spans(sizes, width)
    fitted = np.array(fit_rows(size.tolist(), width), dtype=np.int64)  # each piece's row, in document order
    first = np.minimum.reduceat(fitted, np.flatnonzero(np.diff(owner, prepend=-1))) if fitted.size else fitted
    first[hole] = -1
    order = np.argsort(fitted, kind="stable")  # a row's pieces stay in document order
    at, size, owner, row = at[order], size[order], owner[order], fitted[order]
    starts = np.flatnonzero(np.diff(row, prepend=-1))
    ends = np.cumsum(size)
    return _Pieces(at, size, owner, row, ends - (ends - size)[starts][row], ~hole[owner], starts, first)


def _write_pieces(docs: FlatDocuments, p: _Pieces, config: CausalConfig
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Input ids, labels, positions and segments of the packed rows. A row's pieces lie one after another
    from its start, so the rows' tokens in row-major order are the pieces' tokens in row order: each tensor
    is one gather from the stream put in by one row mask (a hole's pieces: padding)."""
    shape = (p.starts.size, config.seq_len)
    ids, labels = np.full(shape, config.pad, dtype=np.int32), np.full(shape, IGNORE, dtype=np.int32)
    positions, segments = np.zeros(shape, dtype=np.int32), np.zeros(shape, dtype=np.int32)
    if not p.size.size:
        return ids, labels, positions, segments
    stream = _stream(docs, config.eot, docs.tokens.size + len(docs) + 1)  # one more: the last token's next
    begin = np.cumsum(p.size) - p.size  # each piece's first token among the rows' tokens
    source = runs(p.at, p.size)
    step = np.ones(source.size, dtype=np.int32)
    step[0] = 0
    step[begin[1:]] = 1 - p.size[:-1]
    within = np.cumsum(step, dtype=np.int32)  # 0, 1, ... in each piece
    counts = np.cumsum(p.real)
    segment = (counts - (counts - p.real)[p.starts][p.row]) * p.real  # 1, 2, ... among a row's real pieces
    values, following = np.take(stream, source), np.take(stream[1:], source)
    following[begin + p.size - 1] = IGNORE  # a piece's last token predicts nothing
    if not p.real.all():
        gone = np.repeat(~p.real, p.size)
        values[gone], following[gone], within[gone] = config.pad, IGNORE, 0
    mask = np.arange(shape[1]) < np.add.reduceat(p.size, p.starts)[:, None]
    ids[mask], labels[mask], positions[mask] = values, following, within
    segments[mask] = np.repeat(segment.astype(np.int32), p.size)
    return ids, labels, positions, segments


def best_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Rows of item indices, items taken in order: each into the open row with the least room
    that still fits it (ties: the earliest row), else into a new row. Every length must be
    1..capacity; a full row closes."""
    rows: list[list[int]] = []
    for index, row in enumerate(fit_rows(lengths, capacity)):
        if row == len(rows):
            rows.append([index])
        else:
            rows[row].append(index)
    return rows


def fit_rows(lengths: Sequence[int], capacity: int) -> list[int]:
    """Each item's row under `best_fit` (rows numbered as they open). The open rows are one sorted list of
    room * span + row, so the row an item takes is the first key at or after need * span, and what it
    leaves is that key less need * span: one bisect and one insort an item, no other arithmetic."""
    needs = list(map(int, lengths))
    if needs and not 0 < min(needs) <= max(needs) <= capacity:
        index = next(i for i, need in enumerate(needs) if not 0 < need <= capacity)
        raise DataError(f"item {index} has length {needs[index]}, outside 1..{capacity}")
    span = len(needs) + 1  # more than any row index
    keys: list[int] = []  # the open rows, by (room, row)
    rows: list[int] = []
    take, put = keys.pop, rows.append
    opened = capacity * span  # the key of the next new row
    for need in needs:
        need *= span
        at = bisect_left(keys, need)
        if at < len(keys):
            key = take(at)
        else:
            key, opened = opened, opened + 1
        put(key % span)
        if key - need >= span:
            insort(keys, key - need)
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


def _checked(documents: Documents) -> FlatDocuments:
    """The documents as one array of non-negative int32 ids; anything else is a DataError."""
    if isinstance(documents, FlatDocuments):
        return FlatDocuments(documents.tokens, documents.sizes.astype(np.int64, copy=False))
    arrays = [np.asarray(doc) for doc in documents]
    for i, arr in enumerate(arrays):
        if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
            raise DataError(f"document {i} is not a 1-D array of integer token ids "
                            f"(shape {arr.shape}, dtype {arr.dtype})")
    sizes = np.fromiter((arr.size for arr in arrays), dtype=np.int64, count=len(arrays))
    tokens = np.concatenate(arrays, dtype=np.int64, casting="unsafe") if arrays else np.zeros(0, np.int64)
    negative = np.flatnonzero(tokens < 0)
    if negative.size:
        i = int(np.searchsorted(np.cumsum(sizes), negative[0], side="right"))
        raise DataError(f"document {i} holds a negative token id {int(arrays[i].min())}")
    return FlatDocuments(tokens.astype(np.int32, copy=False), sizes)


def runs(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """starts[k], starts[k] + 1, ..., starts[k] + sizes[k] - 1 for every k, one after another (int64): the
    indices that gather or place runs of tokens, made by one cumsum (a repeat per run costs more)."""
    live = sizes > 0
    starts, sizes = np.asarray(starts, dtype=np.int64)[live], np.asarray(sizes, dtype=np.int64)[live]
    if not sizes.size:
        return np.zeros(0, dtype=np.int64)
    step = np.ones(int(sizes.sum()), dtype=np.int64)
    step[0] = starts[0]
    step[np.cumsum(sizes[:-1])] = starts[1:] - starts[:-1] - sizes[:-1] + 1
    return np.cumsum(step)


def _stream(docs: FlatDocuments, eot: int, length: int = -1, fill: int = 0) -> np.ndarray:
    """Every document followed by `eot`, one array; with `length`, cut to it or filled with `fill` up to it."""
    size = docs.tokens.size + len(docs)
    stream = np.empty(max(size, length), dtype=np.int32)
    stream[size:] = fill
    ends = np.cumsum(docs.sizes + 1) - 1
    is_text = np.ones(size, dtype=bool)
    is_text[ends] = False
    stream[:size][is_text] = docs.tokens
    stream[ends] = eot
    return stream if length < 0 else stream[:length]


def _concat_splits(sizes: np.ndarray, width: int, delivered: int) -> tuple[int, int]:
    """Documents whose input positions span rows, and (document, row) parts, among the first
    `delivered` stream positions (the rows' inputs)."""
    ends = np.cumsum(sizes + 1)
    starts = ends - (sizes + 1)
    keep = starts < delivered
    first = starts[keep] // width
    last = (np.minimum(ends[keep], delivered) - 1) // width
    return int(np.count_nonzero(last > first)), int((last - first + 1).sum())


def _piece_spans(sizes: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each document plus its eot, cut into pieces of `width` only when longer than that: each piece's
    start in the stream, its size and its document."""
    whole = np.asarray(sizes, dtype=np.int64) + 1
    count = -(-whole // width)
    owner = np.repeat(np.arange(whole.size, dtype=np.int64), count)
    k = np.arange(owner.size, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    at = np.repeat(np.cumsum(whole) - whole, count) + k * width
    return at, np.minimum(width, whole[owner] - k * width), owner
