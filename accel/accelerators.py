"""Training-step backends. A backend consumes one received batch per `step` call."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from accel.batch import ReceivedBatch


class Accelerator(Protocol):
    name: str

    def step(self, batch: ReceivedBatch) -> None:
        """Run one training step on `batch` (blocking until it is done)."""


@dataclass
class NullAccelerator:
    """Consumes instantly: measures what the data path alone delivers."""

    name: str = "null"

    def step(self, batch: ReceivedBatch) -> None:
        return None


@dataclass
class SimulatedAccelerator:
    """Takes len(batch) / rate seconds per step, like a device with that throughput."""

    rate: float  # samples per second
    name: str = "simulated"

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"simulated accelerator rate must be positive, not {self.rate}")

    def step(self, batch: ReceivedBatch) -> None:
        deadline = time.perf_counter() + batch.size / self.rate
        while (left := deadline - time.perf_counter()) > 0:
            time.sleep(left)


def make_accelerator(kind: str, rate: float | None) -> Accelerator:
    if kind == "null":
        return NullAccelerator()
    if kind == "simulated":
        if rate is None:
            raise ValueError("--accel simulated needs --rate SAMPLES_PER_S")
        return SimulatedAccelerator(rate)
    raise ValueError(f"unknown accelerator {kind!r} (choose null or simulated)")
