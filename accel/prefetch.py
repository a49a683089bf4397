"""Overlap of host work with compute: batch N+1 is converted and copied while step N runs.

A side thread takes received batches from the prefetch queue, runs the accelerator's
`prepare` (uint8 frames to normalised device tensors, with pinned buffers and a side
stream on CUDA), and hands at most one prepared batch ahead to the training loop. With
overlap off the loop does the same work itself, between steps, which is what the overlap
gain is measured against.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable


class Prefetcher:
    def __init__(self, source: Callable[[], object], prepare: Callable[[object], object], end: object,
                 on_copy: Callable[[float], None]) -> None:
        self.source = source
        self.prepare = prepare
        self.end = end
        self.on_copy = on_copy
        self.out: queue.Queue = queue.Queue(maxsize=1)
        self.thread = threading.Thread(target=self._run, name="stoker-prefetch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.source()
            if item is self.end:
                self.out.put((item, None, None))
                return
            started = time.perf_counter()
            try:
                prepared = self.prepare(item)
            except BaseException as exc:  # surfaced by next() on the training thread
                self.out.put((self.end, None, exc))
                return
            self.on_copy(time.perf_counter() - started)
            self.out.put((item, prepared, None))

    def next(self) -> tuple[object, object]:
        item, prepared, error = self.out.get()
        if error is not None:
            raise error
        return item, prepared
