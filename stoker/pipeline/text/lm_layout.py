"""Causal-LM batches of a `tokens` job: a unit's documents as rows of `seq_len`, cut into batches.

A sample of the plan is one tokenized document. A unit's documents, in the unit's seeded order,
become causal-LM rows (pipeline.text.causal: `concat`, one stream cut GPT-style, or `packed`,
best-fit with each document's positions restarting), kept in order and cut into batches of
`batch_size` rows; only the unit's last batch can be short. Each document is listed (in
`doc_ids`) in exactly one batch, the first that holds any of its tokens, so the consumer's
exactly-once ledger counts documents. Unusable documents are listed in `skipped` of the last batch.

Tensors, (B, L) int32 each, L = `seq_len`:
  input_ids     the tokens, padding where none (the tokenizer's pad id)
  labels        the next token, -100 where nothing is predicted (padding; packed: a segment's end)
  position_ids  packed only: from 0 at each segment's start
  segment_ids   packed only: 1, 2, ... per segment of the row, 0 on padding
A packed batch carries no `cu_seqlens` (its length varies, and a batch's shapes are fixed):
`segment_ids` holds it, and `causal.batch_cu_seqlens` or `cu_seqlens_of` makes it on the device side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from stoker.pipeline.cpu_clock import stage_clock
from stoker.pipeline.plan import Unit, batch_bounds
from stoker.pipeline.tensors import TensorSpec
from stoker.pipeline.text.causal import MODES, CausalConfig, causal_rows
from stoker.pipeline.text.token_shards import TokenShard
from stoker.protos.errors import ConfigError

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


def unit_documents(source_of: Callable[[int], TokenShard | str], unit: Unit, seed: int
                   ) -> tuple[list[int], list[np.ndarray], list[tuple[int, str, str]]]:
    """The unit's usable documents in its seeded order (ids, tokens), and the unusable ones
    (`source_of` gives a shard, or why it cannot be read)."""
    ids: list[int] = []
    docs: list[np.ndarray] = []
    skipped: list[tuple[int, str, str]] = []
    for shard_index, row, doc_id in unit.rows(seed):
        shard = source_of(shard_index)
        if isinstance(shard, str):
            skipped.append((doc_id, f"shard {shard_index} row {row}", shard))
            continue
        problem = shard.problem(row)
        if problem:
            skipped.append((doc_id, shard.key(row), problem))
            continue
        ids.append(doc_id)
        docs.append(shard.document(row))
    return ids, docs, skipped


def unit_token_batches(source_of: Callable[[int], TokenShard | str], unit: Unit, cfg: LMConfig, seed: int,
                       batch_size: int, eot: int, pad: int) -> Iterator[TokenBatch]:
    """Every batch of a unit (see the module's docstring); a unit with no usable document gives one
    empty last batch that names what it skipped."""
    started = stage_clock()
    ids, docs, skipped = unit_documents(source_of, unit, seed)
    made = causal_rows(docs, cfg.causal(eot, pad))
    bounds = batch_bounds(made.stats.rows, batch_size)
    starts = np.array([start for start, _ in bounds], dtype=np.int64)
    # a document in no row (concat: a unit whose whole stream is its one end-of-text) is listed in the last batch
    first_batch = np.where(made.first_rows >= 0, np.searchsorted(starts, made.first_rows, side="right") - 1,
                           len(bounds) - 1)
    built = stage_clock() - started
    packed = cfg.mode == "packed"
    for index, (start, stop) in enumerate(bounds):
        sliced = stage_clock()
        tensors = {"input_ids": made.input_ids[start:stop], "labels": made.labels[start:stop]}
        if packed:
            tensors |= {"position_ids": made.position_ids[start:stop], "segment_ids": made.segment_ids[start:stop]}
        segs = made.segment_ids[start:stop]
        pieces = int(segs.max(axis=1, initial=0).sum()) if packed else int(np.count_nonzero(segs.any(axis=1)))
        tokens = int(np.count_nonzero(segs))
        rows = stop - start
        last = index == len(bounds) - 1
        yield TokenBatch(
            tensors={k: np.ascontiguousarray(v) for k, v in tensors.items()},
            doc_ids=[ids[i] for i in np.flatnonzero(first_batch == index)], skipped=skipped if last else [],
            batch_index=index, last=last, rows=rows, segments=pieces, tokens=tokens,
            token_slots=rows * cfg.seq_len, unpacked_slots=(pieces if packed else rows) * cfg.seq_len,
            pack_s=(built if index == 0 else 0.0) + stage_clock() - sliced,
            lengths=[int(n) for n in np.count_nonzero(segs, axis=1)])
