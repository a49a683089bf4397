"""A run's closing summary: one dataclass for one rank and for a whole job, `as_dict()` for JSON.

`Consumer.run` returns it; `stoker run` and `stoker lab wait` add the ranks of a data-parallel
job up with `job_totals` (each rank's summary under `ranks`); a rank's JSON read back is
`Summary.from_dict`. `rate_window` is what its rates are over: the run after start-up, or the
whole run where that is too short to mean anything. `Books` is what the rank's books hold when
the run ends, the part of the figures the training loop does not count itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from itertools import zip_longest
from typing import Any

from stoker.accel.control.dispatcher import DispatcherStats
from stoker.accel.ledger import Skipped
from stoker.accel.receiver import StageTotals, TextTotals
from stoker.pipeline.images.layout import DecodeOn

# counts and rates that add up over the ranks of a job (the text ones only where the job has text)
ADDED_UP = ("samples", "unique_samples", "duplicates_dropped", "batches", "skipped_samples", "rows",
            "bytes_received", "delivered_samples_per_s", "rows_per_s", "sequences", "sequences_per_s",
            "tokens", "tokens_per_s")
UNSIZED = ("cores_needed", "cores_in_use")  # what `stoker.embedded.print_summary` writes as null where it sizes nothing
# The least run after start-up (the wait for the first batch) that a steady rate, stall or bottleneck is measured
# over: a small job can arrive whole with its first batch, and figures divided by a window of a millisecond are
# absurd (hundreds of thousands of samples/s, hundreds of cores busy). Shorter: over the whole run (`rates_over`).
MIN_STEADY_S = 1.0
MIN_STEADY_STEPS = 2  # steps after the first batch
STEADY, WHOLE_RUN = "steady", "whole_run"


@dataclass
class Summary:
    samples: int
    unique_samples: int
    duplicates_dropped: int
    epochs: int
    elapsed_s: float
    startup_s: float
    delivered_samples_per_s: float
    stall_fraction: float
    batches: int
    hosts: int
    procs_per_host: int
    skipped_samples: int
    skipped: list[dict]
    frames_dropped: dict[str, int]
    units_released: int  # units taken from a lost host (or a stale lease) and made again
    stage_seconds: dict[str, float]
    per_epoch_unique: list[int] = field(default_factory=list)  # epochs 0.. up to the one the rank was in
    dataset: str = "imagenet"
    rank: int | None = 0  # None: a job's figures over its ranks (`ranks`)
    world_size: int = 1
    steps: int = 0  # steps taken (equal on every rank)
    rows: int = 0  # rows stepped: images, or rows of tokens
    rows_per_s: float = 0.0  # rows stepped per second after start-up: what the device consumed
    bytes_received: int = 0  # tensor bytes that crossed the wire
    time_boxed: bool = False  # stopped by max_seconds before the job was complete
    interrupted: bool = False  # stopped by SIGINT (Ctrl-C) before the job was complete
    units_handed_back: int = 0  # units a worker process gave back while waiting for credit: nothing lost
    decode_on: DecodeOn = DecodeOn.HOST  # where JPEGs were decoded; ACCELERATOR: failures there are in `skipped`
    metrics: str = ""  # this rank's /metrics URL ("" without one): a free port on one machine is found here
    # what bounded the run after start-up (accel.bottleneck's rules over the whole run, not a window)
    bottleneck: str = "unknown"
    bottleneck_detail: str = ""
    cores_needed: float = 0.0  # host cores (CPU time) that keep this run's device fed, over the last window
    cores_in_use: float = 0.0  # ... that the workers used then
    per_core_rate: float = 0.0  # rows per CPU-second of the worker processes, over the whole run
    per_core_spread: list[float] = field(default_factory=list)  # [10th, 90th percentile] over the run's chunks
    cpu_wait_fraction: float | None = None  # of the workers' runnable time, waiting for a core; None: not measured
    # text only (None for images): BERT examples and tokens stepped, and padding as sent
    sequences: int | None = None
    seq_len: int | None = None  # tokens a row holds
    lm_mode: str | None = None  # a tokens job's --lm-mode (packed or concat); None for BERT
    sequences_per_s: float | None = None
    tokens: int | None = None
    tokens_per_s: float | None = None
    padding_fraction: float | None = None  # padding share of the token slots that were sent
    padding_fraction_before_packing: float | None = None  # ... had each sequence had its own row
    masked_fraction: float | None = None  # masked-LM targets per real token
    random_next_fraction: float | None = None  # sequences whose B is a random next sentence
    ranks: list[Summary] = field(default_factory=list)  # a job's figures: each rank's own, rank 0's first
    # what the rates (*_per_s) and the stall are over: STEADY, the run after start-up; WHOLE_RUN, start-up included,
    # where the run after it was shorter than MIN_STEADY_S or MIN_STEADY_STEPS (and no bottleneck was judged)
    rates_over: str = STEADY

    def rate_seconds(self) -> float:
        """The wall seconds the rates are over (`rates_over`): what a figure per second divides by."""
        return max(self.elapsed_s if self.rates_over == WHOLE_RUN else self.elapsed_s - self.startup_s, 1e-9)

    def as_dict(self) -> dict[str, Any]:
        """For JSON; a rank's own summary has no `ranks`."""
        data = asdict(self)
        if not self.ranks:
            del data["ranks"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        """A summary read back from JSON (what a printer added beside the figures is left out)."""
        known = {f.name for f in fields(cls)}
        values = {name: value for name, value in data.items() if name in known}
        for name in UNSIZED:  # a printer's null (not sized) reads back as 0.0, so a job's ranks add up
            if values.get(name, 0.0) is None:
                values[name] = 0.0
        values["ranks"] = [cls.from_dict(rank) for rank in data.get("ranks", [])]
        return cls(**values)


def job_totals(ranks: list[Summary]) -> Summary:
    """The job's figures from its ranks': counts and rates add up, the stall (and so the bottleneck)
    is the worst rank's, the job took as long as its slowest rank."""
    first = ranks[0]
    added = {name: sum(getattr(r, name) for r in ranks) for name in ADDED_UP if getattr(first, name) is not None}
    worst = max(ranks, key=lambda r: r.stall_fraction)
    return replace(first, **added, rank=None, ranks=list(ranks),
                   per_epoch_unique=_per_epoch_unique(ranks),
                   stall_fraction=worst.stall_fraction, elapsed_s=max(r.elapsed_s for r in ranks),
                   skipped=[s for r in ranks for s in r.skipped], hosts=max(r.hosts for r in ranks),
                   cores_needed=sum(r.cores_needed for r in ranks),  # each rank's device wants its own supply
                   cores_in_use=sum(r.cores_in_use for r in ranks), **_cpu_totals(ranks),
                   bottleneck=worst.bottleneck, bottleneck_detail=worst.bottleneck_detail,
                   interrupted=any(r.interrupted for r in ranks),
                   rates_over=WHOLE_RUN if any(r.rates_over == WHOLE_RUN for r in ranks) else STEADY)


def rate_window(elapsed: float, startup: float, batches: int, stall_s: float) -> tuple[float, float, str | None]:
    """The seconds a run's rates divide by, its stall over them, and why they are the whole run's (None: the
    steady run's, after start-up). A job that arrives within its first batch or two leaves a window after
    start-up of a millisecond: rates over it would be absurd, so under MIN_STEADY_S or MIN_STEADY_STEPS they
    are over the whole run, the wait for the first batch (`startup`) counted as stall."""
    steady, steps = elapsed - startup, max(batches - 1, 0)
    if steady >= MIN_STEADY_S and steps >= MIN_STEADY_STEPS:
        return steady, stall_s / steady, None
    whole = max(elapsed, 1e-9)
    why = (f"too short after start-up: {steady:.2f} s and {steps} step(s) after the first batch; a steady figure "
           f"needs at least {MIN_STEADY_S:g} s and {MIN_STEADY_STEPS} steps")
    return whole, min(1.0, (startup + stall_s) / whole), why


def _per_epoch_unique(ranks: list[Summary]) -> list[int]:
    """Each epoch's unique samples over the ranks: an interrupted rank's list ends at the epoch it was in,
    which may be one before another rank's."""
    return [sum(epoch) for epoch in zip_longest(*(r.per_epoch_unique for r in ranks), fillvalue=0)]


def _cpu_totals(ranks: list[Summary]) -> dict[str, Any]:
    """The job's rate per CPU-second (rows over the workers' CPU, every rank), the widest of the ranks'
    spreads, and its wait for a core (None when a rank's was not measured)."""
    cpu = sum(r.stage_seconds.get("cpu", 0.0) for r in ranks)
    waited = sum(r.stage_seconds.get("cpu_wait", 0.0) for r in ranks)
    spreads = [r.per_core_spread for r in ranks if r.per_core_spread]
    measured = all(r.cpu_wait_fraction is not None for r in ranks) and cpu + waited > 0
    return dict(per_core_rate=sum(r.rows for r in ranks) / cpu if cpu > 0 else 0.0,
                per_core_spread=[min(s[0] for s in spreads), max(s[1] for s in spreads)] if spreads else [],
                cpu_wait_fraction=waited / (cpu + waited) if measured else None)


@dataclass(frozen=True)
class Books:
    """What a rank's books hold once its steps are settled: the ledger's counts, what its data
    socket took in, and the job's dispatch figures."""

    samples: int
    unique_samples: int
    duplicates: int
    skipped: list[Skipped]  # in (epoch, sample) order
    per_epoch_unique: list[int]
    stages: StageTotals  # the workers' seconds per stage, as their batches reported them
    hosts: int  # hosts whose batches were admitted
    frames_dropped: dict[str, int]
    bytes_received: int
    text: TextTotals
    dispatch: DispatcherStats
