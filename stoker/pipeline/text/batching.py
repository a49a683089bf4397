"""Whole text batches from one work unit: examples, masking, optional packing, fixed shapes.

A unit is a range of one shard's documents. Its documents are visited in the unit's seeded
order, every example of every document is made, then the unit's sequences are packed (or
kept one per row), the rows shuffled, and cut into batches of `batch_size` rows; only the
unit's last batch can be short. Each document is listed (in `doc_ids`) in exactly one batch:
the first that holds one of its sequences. Unusable documents are listed in `skipped` of
the last batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from stoker.pipeline.cpu_clock import stage_clock
from stoker.pipeline.seeds import ReseededRng, derived_rng
from stoker.pipeline.text.docs import DocShard
from stoker.pipeline.text.examples import Sequence, Specials, TextConfig, document_sequences, valid_rows
from stoker.pipeline.text.layout import assemble
from stoker.pipeline.text.packing import pack
from stoker.pipeline.units import Unit, batch_bounds


@dataclass
class TextBatch:
    tensors: dict[str, np.ndarray]
    doc_ids: list[int]
    skipped: list[tuple[int, str, str]]  # (doc id, key, reason)
    batch_index: int
    last: bool
    rows: int
    sequences: int
    real_tokens: int
    token_slots: int  # rows * seq_len: what was sent
    unpacked_slots: int  # sequences * seq_len: what one sequence per row would have sent
    examples_s: float = 0.0  # the unit's example-making time, on its first batch
    pack_s: float = 0.0
    masked: int = 0
    random_next: int = 0
    lengths: list[int] = field(default_factory=list)
    batches: int = 0  # the unit's


@dataclass
class TextUnitSource:
    """One shard's documents: their examples (the shard's valid rows are the random-next pool),
    and the batches of a unit that lies in this shard. A unit whose rows span several shards
    goes through `unit_text_batches` with a source for each."""

    shard: DocShard
    cfg: TextConfig
    specials: Specials
    seed: int

    def __post_init__(self) -> None:
        self.pool = valid_rows(self.shard)
        self._rng = ReseededRng()  # one document at a time: document_sequences is eager

    def document(self, row: int, doc_id: int, epoch: int) -> list[Sequence] | str:
        """Every example of one document this epoch, or why the document is unusable."""
        problem = self.shard.problem(row)
        if problem:
            return problem
        rng = self._rng.reseed(self.seed, epoch, self.shard.key(row))
        return document_sequences(self.shard, row, doc_id, self.pool, self.cfg, self.specials, rng)

    def sequences(self, unit: Unit) -> tuple[list[Sequence], list[tuple[int, str, str]]]:
        return unit_sequences(self._only_me(unit), unit, self.seed)

    def batches(self, unit: Unit, batch_size: int) -> Iterator[TextBatch]:
        return unit_text_batches(self._only_me(unit), unit, self.cfg, self.seed, batch_size)

    def _only_me(self, unit: Unit) -> Callable[[int], TextUnitSource]:
        shards = {s.shard_index for s in unit.segments}
        if len(shards) > 1:
            raise ValueError(f"unit {unit.unit_id} spans shards {sorted(shards)}: use unit_text_batches")
        return lambda _shard: self


def unit_sequences(source_of: Callable[[int], TextUnitSource | str], unit: Unit,
                   seed: int) -> tuple[list[Sequence], list[tuple[int, str, str]]]:
    """The examples of every document of the unit, in its seeded order, and the unusable documents
    (`source_of` gives a shard's source, or why the shard cannot be read)."""
    sequences: list[Sequence] = []
    skipped: list[tuple[int, str, str]] = []
    for shard, row, doc_id in unit.rows(seed):
        source = source_of(shard)
        if isinstance(source, str):
            skipped.append((doc_id, f"shard {shard} row {row}", source))
            continue
        made = source.document(row, doc_id, unit.epoch)
        if isinstance(made, str):
            skipped.append((doc_id, source.shard.key(row), made))
        else:
            sequences += made
    return sequences, skipped


def unit_text_batches(source_of: Callable[[int], TextUnitSource | str], unit: Unit, cfg: TextConfig, seed: int,
                      batch_size: int) -> Iterator[TextBatch]:
    """Every batch of a unit: its sequences packed (or one per row), the rows shuffled and cut
    into batches of `batch_size` rows; each document is listed in the first batch that holds it."""
    started = stage_clock()
    sequences, skipped = unit_sequences(source_of, unit, seed)
    made = stage_clock()
    rows = _rows(unit, sequences, cfg, seed)
    packed = stage_clock()
    claimed: set[int] = set()
    bounds = batch_bounds(len(rows), batch_size)
    count = len(bounds)
    for index, (start, stop) in enumerate(bounds):
        chunk = rows[start:stop]
        flat = [seq for row in chunk for seq in row]
        doc_ids = list(dict.fromkeys(s.doc_id for s in flat if s.doc_id not in claimed))
        claimed.update(doc_ids)
        build_from = stage_clock()
        tensors = assemble(chunk, cfg)
        assemble_s = stage_clock() - build_from
        last = index == count - 1
        real = sum(len(s) for s in flat)
        yield TextBatch(
            tensors=tensors, doc_ids=doc_ids, skipped=skipped if last else [], batch_index=index, last=last,
            rows=len(chunk), sequences=len(flat), real_tokens=real,
            token_slots=len(chunk) * cfg.seq_len, unpacked_slots=len(flat) * cfg.seq_len,
            examples_s=(made - started) if index == 0 else 0.0,
            pack_s=((packed - made) if index == 0 else 0.0) + assemble_s,
            masked=sum(s.masked_positions.size for s in flat),
            random_next=sum(s.is_random_next for s in flat),
            lengths=[len(s) for s in flat], batches=count)


def _rows(unit: Unit, sequences: list[Sequence], cfg: TextConfig, seed: int) -> list[list[Sequence]]:
    first = unit.segments[0] if unit.segments else None
    key = f"rows-{first.shard_index}-{first.start}-{unit.size}" if first else "rows-empty"
    rng = derived_rng(seed, unit.epoch, key)
    if not cfg.pack:
        return [[sequences[int(i)]] for i in rng.permutation(len(sequences))]
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    preds = np.fromiter((s.masked_positions.size for s in sequences), dtype=np.int64, count=len(sequences))
    packs = pack(lengths, preds, cfg.seq_len, cfg.pack_max_sequences, cfg.predictions_per_row)
    return [[sequences[i] for i in packs[int(p)]] for p in rng.permutation(len(packs))]
