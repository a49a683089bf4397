"""Causal-LM batches of a `tokens` job: a unit's documents as rows of `seq_len`, cut into batches.

A sample of the plan is one tokenized document. A unit's documents, in the unit's seeded order,
become causal-LM rows (pipeline.text.causal: `concat`, one stream cut GPT-style, or `packed`,
best-fit with each document's positions restarting), kept in order and cut into batches of
`batch_size` rows; only the unit's last batch can be short. Each document is listed (in
`doc_ids`) in exactly one batch, the first that holds any of its tokens, so the consumer's
exactly-once ledger counts documents. Unusable documents are listed in `skipped` of the last batch.

A unit's batches are known ahead, from its documents' token counts (the token set's lengths file) in
its visiting order: `planned_batches` runs the same arithmetic (concat) and the same best fit (packed)
the rows are made with, so every rank knows every rank's steps of an epoch from the plan alone. The
worker sends exactly that many whatever turns out unusable: packed, an unusable document keeps its
place as padding (a hole: the rows are the planned ones); concat, it leaves the stream shorter, and
batches the rows no longer fill go as empty ones (zero rows), each still a step.

Tensors, (B, L) int32 each, L = `seq_len`:
  input_ids     the tokens, padding where none (the tokenizer's pad id)
  labels        the next token, -100 where nothing is predicted (padding; packed: a segment's end)
  position_ids  packed only: from 0 at each segment's start
  segment_ids   packed only: 1, 2, ... per segment of the row, 0 on padding
A packed batch carries no `cu_seqlens` (its length varies, and a batch's shapes are fixed):
`segment_ids` holds it, and `causal.batch_cu_seqlens` or `cu_seqlens_of` makes it on the device side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from stoker.pipeline.cpu_clock import stage_clock
from stoker.pipeline.tensors import TensorSpec
from stoker.pipeline.text.causal import (
    MODES,
    CausalConfig,
    FlatDocuments,
    concat_row_count,
    fit_rows,
    piece_lengths,
    row_tensors,
)
from stoker.pipeline.text.token_shards import TokenShard
from stoker.pipeline.units import Unit, batch_bounds
from stoker.protos.errors import ConfigError, DataError

MAX_SEQ_LEN = 1 << 20


@dataclass(frozen=True)
class LMConfig:
    """How a tokens job's documents become rows: the row length and the mode."""

    # a field with a help line is also a command-line option (stoker.configured)
    seq_len: int = field(default=1024, metadata={
        "help": "tokens: input positions per row (default %(default)s)", "flag": "--lm-seq-len",
        "dest": "lm_seq_len", "check": "lm-seq-len"})
    mode: str = field(default="packed", metadata={
        "help": "tokens: packed (best-fit, a document split only when longer than a row; positions restart per "
                "document; default) or concat (one stream cut into rows, GPT-style)", "flag": "--lm-mode",
        "dest": "lm_mode", "choices": MODES})

    def __post_init__(self) -> None:
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or not 2 <= self.seq_len <= MAX_SEQ_LEN:
            raise ConfigError(f"seq_len must be an integer in 2..{MAX_SEQ_LEN} (got {self.seq_len!r})")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)} (got {self.mode!r})")

    def causal(self, eot: int, pad: int) -> CausalConfig:
        """The rows' config: every token of a unit kept (a short last row is padded, not dropped)."""
        return CausalConfig(self.seq_len, eot, pad, self.mode, drop_last=False)


def tensor_specs(cfg: LMConfig) -> dict[str, TensorSpec]:
    names = ("input_ids", "labels") + (("position_ids", "segment_ids") if cfg.mode == "packed" else ())
    return {name: TensorSpec("<i4", (cfg.seq_len,)) for name in names}


def cu_seqlens_of(segment_ids: np.ndarray) -> np.ndarray:
    """Flash-attention's cumulative lengths for a packed batch flattened to one run of B * L tokens
    (each row's padding tail a segment of its own), from its `segment_ids`."""
    flat = np.asarray(segment_ids).reshape(-1)
    width = np.asarray(segment_ids).shape[-1]
    starts = np.flatnonzero(np.diff(flat, prepend=-1) != 0)
    starts = np.union1d(starts, np.arange(0, flat.size, width))  # a row always starts a segment
    return np.append(starts, flat.size).astype(np.int32)


@dataclass
class TokenBatch:
    tensors: dict[str, np.ndarray]
    doc_ids: list[int]
    skipped: list[tuple[int, str, str]]  # (doc id, key, reason)
    batch_index: int
    last: bool
    rows: int
    segments: int  # (document, row) pieces
    tokens: int  # input positions holding a token
    token_slots: int  # rows * seq_len
    unpacked_slots: int  # one piece per row: segments * seq_len (concat: token_slots)
    pack_s: float = 0.0  # the unit's row-making time, on its first batch, and this batch's slicing
    lengths: list[int] = field(default_factory=list)
    batches: int = 0  # the unit's


def unit_lengths(unit: Unit, seed: int, lengths: np.ndarray) -> np.ndarray:
    """The planned tokens of the unit's documents in its seeded visiting order (`lengths` by sample id;
    a mixture's repeated document has its id plus a multiple of the documents)."""
    return _planned(unit.visits(seed), lengths)


def _planned(visits: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    return lengths[visits[:, 2] % lengths.size] if lengths.size else np.zeros(len(visits), np.int64)




def unit_rows(lengths: Sequence[int] | np.ndarray, cfg: LMConfig) -> int:
    """The rows documents of these token counts make, in this order (0: a document never delivered)."""
    counts = np.asarray(lengths, dtype=np.int64).reshape(-1)
    kept = counts[counts > 0]
    if cfg.mode == "concat":
        return concat_row_count(int(kept.sum()) + kept.size, cfg.seq_len, drop_last=False)
    fitted = fit_rows(piece_lengths(kept, cfg.seq_len), cfg.seq_len)
    return max(fitted) + 1 if fitted else 0


def planned_batches(lengths: Sequence[int] | np.ndarray, cfg: LMConfig, batch_size: int) -> int:
    """The batches of a unit whose documents have these token counts in its visiting order."""
    return len(batch_bounds(unit_rows(lengths, cfg), batch_size))


def unit_documents(source_of: Callable[[int], TokenShard | str], unit: Unit, seed: int, lengths: np.ndarray,
                   holes: bool = False, visits: np.ndarray | None = None
                   ) -> tuple[list[int], FlatDocuments, list[tuple[int, str, str]], list[bool]]:
    """The unit's documents in its seeded order (ids, tokens), the unusable ones (`source_of` gives a
    shard, or why it cannot be read), and which documents are holes: with `holes`, an unusable document
    the plan counts (its planned length > 0) stays in the list as that many placeholder tokens. Each shard
    is asked for once, and the tokens are gathered by whole-array steps (no step per document). `visits`:
    the unit's `visits`, where the caller has them."""
    visits = unit.visits(seed) if visits is None else visits
    shard_of, row, doc_id = visits[:, 0], visits[:, 1], visits[:, 2]
    start, size = np.zeros(len(visits), np.int64), np.zeros(len(visits), np.int64)
    problems: dict[int, tuple[str, str]] = {}  # visit -> (key, why)
    shards: dict[int, TokenShard] = {}
    for index in np.unique(shard_of).tolist():
        shard, at = source_of(index), np.flatnonzero(shard_of == index)
        if isinstance(shard, str):
            problems |= {i: (f"shard {index} row {row[i]}", shard) for i in at.tolist()}
            continue
        shards[index] = shard
        start[at], size[at] = shard.offsets[row[at]], shard.offsets[row[at] + 1] - shard.offsets[row[at]]
        if shard.problems:
            hit = at[np.isin(row[at], list(shard.problems))].tolist()
            problems |= {i: (shard.key(int(row[i])), str(shard.problem(int(row[i])))) for i in hit}
    bad = np.zeros(len(visits), dtype=bool)
    bad[list(problems)] = True
    planned = _planned(visits, lengths)
    hole = bad & (planned > 0) & holes
    keep = ~bad | hole
    size[hole] = planned[hole]
    tokens = _gathered(shards, shard_of[keep], start[keep], size[keep], hole[keep])
    skipped = [(int(doc_id[i]), *problems[i]) for i in sorted(problems)]
    return doc_id[keep].tolist(), FlatDocuments(tokens, size[keep]), skipped, hole[keep].tolist()


def _gathered(shards: dict[int, TokenShard], shard_of: np.ndarray, start: np.ndarray, size: np.ndarray,
              hole: np.ndarray) -> np.ndarray:
    """The documents' tokens one after another (int32; a hole: that many zeros), as one concatenate of slices:
    a view per document costs less than the index arrays a gather by runs needs, at any document length."""
    pieces = [np.zeros(n, np.int32) if gap else shards[s].tokens[a: a + n]
              for s, a, n, gap in zip(shard_of.tolist(), start.tolist(), size.tolist(), hole.tolist(), strict=True)]
    return np.concatenate(pieces).astype(np.int32, copy=False) if pieces else np.zeros(0, np.int32)


def unit_token_batches(source_of: Callable[[int], TokenShard | str], unit: Unit, cfg: LMConfig, seed: int,
                       batch_size: int, eot: int, pad: int, lengths: np.ndarray) -> Iterator[TokenBatch]:
    """Every batch of a unit (see the module's docstring), exactly `planned_batches` of them (`lengths`:
    every document's tokens by sample id); a unit with no usable document gives empty batches, the last
    naming what it skipped."""
    started = stage_clock()
    packed = cfg.mode == "packed"
    visits = unit.visits(seed)
    ids, docs, skipped, holes = unit_documents(source_of, unit, seed, lengths, holes=packed, visits=visits)
    arrays, first_rows, fitted = _rows(docs, holes, cfg.causal(eot, pad))
    hole = np.asarray(holes, dtype=bool)
    n_rows = len(arrays["input_ids"])
    bounds = batch_bounds(n_rows, batch_size)
    plan = _planned(visits, lengths)
    # packed: documents of the planned sizes in the planned order make the planned rows, so the fit just run
    # counts them (no second best fit); anything else is counted from the plan's lengths
    same = packed and np.array_equal(docs.sizes, plan[plan > 0])
    planned = len(batch_bounds(fitted, batch_size)) if same else planned_batches(plan, cfg, batch_size)
    if len(bounds) > planned:
        raise DataError(f"unit {unit.unit_id}: {len(bounds)} batches where the token set's lengths file plans "
                        f"{planned} (a lengths file that does not match the shards: prepare the token set again)")
    bounds += [(n_rows, n_rows)] * (planned - len(bounds))  # empty batches: each still a step
    starts = np.array([start for start, _ in bounds], dtype=np.int64)
    # a document in no row (concat: a unit whose whole stream is its one end-of-text) is listed in the last batch
    first_batch = np.where(first_rows >= 0, np.searchsorted(starts, first_rows, side="right") - 1, len(bounds) - 1)
    doc_ids = np.asarray(ids, dtype=np.int64)[~hole]
    first_batch = first_batch[~hole]
    built = stage_clock() - started
    for index, (start, stop) in enumerate(bounds):
        sliced = stage_clock()
        tensors = {name: arrays[name][start:stop] for name in _NAMES[cfg.mode]}
        segs = arrays["segment_ids"][start:stop]
        pieces = int(segs.max(axis=1, initial=0).sum()) if packed else int(np.count_nonzero(segs.any(axis=1)))
        tokens = int(np.count_nonzero(segs))
        rows = stop - start
        last = index == len(bounds) - 1
        yield TokenBatch(
            tensors={k: np.ascontiguousarray(v) for k, v in tensors.items()},
            doc_ids=doc_ids[first_batch == index].tolist(),
            skipped=skipped if last else [], batch_index=index, last=last, rows=rows, segments=pieces,
            tokens=tokens, token_slots=rows * cfg.seq_len, unpacked_slots=(pieces if packed else rows) * cfg.seq_len,
            pack_s=(built if index == 0 else 0.0) + stage_clock() - sliced,
            lengths=np.count_nonzero(segs, axis=1).tolist(), batches=len(bounds))


_NAMES = {"concat": ("input_ids", "labels"), "packed": ("input_ids", "labels", "position_ids", "segment_ids")}


def _rows(docs: FlatDocuments, holes: list[bool], config: CausalConfig
          ) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """The unit's rows (each tensor, and `segment_ids`), each document's first row, and the rows made before
    any was dropped. Packed, holes keep their places and a row left with no token at all goes (its batch may
    then be one of the empty ones)."""
    arrays, first_rows = row_tensors(docs, config, holes)
    made = len(arrays["input_ids"])
    if config.mode == "concat" or not any(holes):
        return arrays, first_rows, made
    keep = arrays["segment_ids"].any(axis=1)
    moved = np.cumsum(keep) - 1  # a kept row's new index
    first = np.where(first_rows >= 0, moved[np.maximum(first_rows, 0)], -1)
    return {name: a[keep] for name, a in arrays.items()}, first, made
