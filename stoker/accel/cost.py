"""What one host core supplies: rows per CPU-second of the worker processes, and how far that rate
moved over a run.

The workers report each batch's whole CPU cost (pipeline.cpu_clock), so the rate holds on a
host that other work shares: a neighbour makes a batch take longer by the clock, not in CPU.
`RateSpread` keeps the run as at most MAX_CHUNKS chunks of equally many batches (two neighbours
merge when there would be more), so its memory is bounded however long the run; the spread is
the 10th to 90th percentile of the chunks' rates. Chunks stay a tenth to a twentieth of the run:
a text unit's cost lands on its first batch, so chunks of a batch or two would spread as wide as
the units are apart, not as the rate moved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_CHUNKS = 20
MIN_CHUNKS = 5  # fewer chunks give no spread worth printing


@dataclass
class RateSpread:
    rows: float = 0.0
    cpu_s: float = 0.0
    per_chunk: int = 1  # batches per chunk
    chunks: list[tuple[float, float]] = field(default_factory=list)  # (rows, CPU seconds), full chunks
    _open: list[float] = field(default_factory=lambda: [0.0, 0.0, 0])  # the chunk being filled: rows, cpu, batches

    def add(self, rows: float, cpu_s: float) -> None:
        self.rows += rows
        self.cpu_s += cpu_s
        filling = self._open
        filling[0] += rows
        filling[1] += cpu_s
        filling[2] += 1
        if filling[2] < self.per_chunk:
            return
        self.chunks.append((filling[0], filling[1]))
        self._open = [0.0, 0.0, 0]
        if len(self.chunks) >= MAX_CHUNKS:
            self.chunks = [(a[0] + b[0], a[1] + b[1]) for a, b in zip(self.chunks[::2], self.chunks[1::2], strict=True)]
            self.per_chunk *= 2

    @property
    def rate(self) -> float:
        """Rows per CPU-second over everything added (0 before any CPU was reported)."""
        return self.rows / self.cpu_s if self.cpu_s > 0 else 0.0

    def spread(self) -> tuple[float, float] | None:
        """(10th, 90th percentile) of the chunks' rates; None with fewer than MIN_CHUNKS chunks."""
        rates = sorted(rows / cpu for rows, cpu in self.chunks if cpu > 0)
        if len(rates) < MIN_CHUNKS:
            return None
        return rates[int(0.1 * (len(rates) - 1))], rates[round(0.9 * (len(rates) - 1))]


def cores_text(cores: float) -> str:
    """A cores figure sized to its value: 0.04 stays 0.04 (not 0.0), 4.04 is 4.0, 37.4 is 37."""
    if cores <= 0:
        return "0"
    if cores < 1:
        return f"{cores:.2g}"
    return f"{cores:.1f}" if cores < 10 else f"{cores:,.0f}"


def rate_figure(rate: float) -> str:
    """A rate sized to its value: 1,160 as is, 0.5 as 0.5 (not 0), a nonsense 1e-9 as 1e-09."""
    return f"{rate:,.0f}" if rate >= 10 or rate == 0 else f"{rate:.2g}"
