"""A seeded shuffle of a stream of rows larger than memory, for `stoker prepare`.

Shards are written shuffled so that a contiguous work unit mixes classes. A folder's file list
can be shuffled before any file is read, but tars and tables come as a stream (often in class
order), and holding a whole data set to shuffle it is not an option. So prepare writes the rows
it checked, as they come, to one Arrow IPC file with the shards' columns beside the shards, then
reads that file back memory-mapped in a seeded random order. It costs one more write of the data
set and room for it twice while prepare runs; the spill file is gone afterwards.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pyarrow as pa

from stoker.pipeline.store.shards import IMAGE_SCHEMA

Row = tuple[str, int, bytes, bytes | None]  # key, label, jpeg, restarts
SPILL_NAME = ".prepare-spill.arrow"


class Spill:
    """Rows written in arrival order to `path`, read back once in a seeded order, then removed
    (also when the block that holds it fails)."""

    def __init__(self, path: str | Path, rows_per_batch: int = 256) -> None:
        self.path = Path(path)
        self.rows_per_batch = rows_per_batch
        self._rows: list[Row] = []
        self._writer: pa.ipc.RecordBatchFileWriter | None = pa.ipc.new_file(str(self.path), IMAGE_SCHEMA)
        self.count = 0

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def add(self, key: str, label: int, data: bytes, restarts: bytes | None) -> None:
        self._rows.append((key, label, data, restarts))
        self.count += 1
        if len(self._rows) >= self.rows_per_batch:
            self._flush()

    def _flush(self) -> None:
        if self._rows and self._writer is not None:
            keys, labels, data, restarts = zip(*self._rows, strict=True)
            self._writer.write_batch(pa.record_batch(
                [pa.array(keys, pa.string()), pa.array(labels, pa.int32()), pa.array(data, pa.binary()),
                 pa.array(restarts, pa.binary())], schema=IMAGE_SCHEMA))
        self._rows = []

    def shuffled(self, seed: int) -> Iterator[Row]:
        """Every row added, once each, in the order random.Random(seed) shuffles their positions to."""
        self._flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        order = list(range(self.count))
        random.Random(seed).shuffle(order)
        with pa.memory_map(str(self.path), "r") as source:
            reader = pa.ipc.open_file(source)
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            starts = [0]
            for batch in batches:
                starts.append(starts[-1] + batch.num_rows)
            for position in order:
                index = bisect.bisect_right(starts, position) - 1
                batch, row = batches[index], position - starts[index]
                restarts = batch.column(3)[row].as_py()
                yield (batch.column(0)[row].as_py(), batch.column(1)[row].as_py(), batch.column(2)[row].as_py(),
                       restarts)
            del batches, reader  # nothing may keep the map open

    def close(self) -> None:
        """Remove the spill file (safe to repeat)."""
        if self._writer is not None:
            try:
                self._writer.close()
            except (OSError, pa.ArrowException):
                pass
            self._writer = None
        self._rows = []
        self.path.unlink(missing_ok=True)
