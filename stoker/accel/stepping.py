"""What a training step can do, said once: the contracts a backend declares, and the one adapter
the built-in loop runs any of them through.

- `Step`: `step(batch)` takes a received batch and blocks until the device is done with it.
- `PreparedStep`: also splits the work into `prepare(batch)` (host conversion, host-to-device
  copy, decoding: what may run ahead on the prefetch thread while the previous step computes)
  and `step_prepared(prepared)`.
- `Stateful`: has a model and optimizer a checkpoint saves beside the data position.

A backend says which it is by its base classes; nothing probes for methods. `StepRunner` is the
adapter: it hands the loader the backend's `prepare` (or none) and runs each step.
A backend is made once the job is known, by a `StepFactory` of (job, manifest), so that a rank
that learns its job from the dispatcher builds the right model for it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import torch

    from stoker.accel.batch import ReceivedBatch
    from stoker.pipeline.job import JobConfig
    from stoker.pipeline.store.shards import Manifest


class Step(ABC):
    """A backend that steps whole received batches."""

    name: str = "step"
    device: str | torch.device = "cpu"  # where its tensors live: decoding on the accelerator decodes there

    @abstractmethod
    def step(self, batch: ReceivedBatch) -> None:
        """Run one training step on `batch`, blocking until it is done."""


P = TypeVar("P")  # what a PreparedStep's prepare makes and its step_prepared takes


class PreparedStep(Step, Generic[P]):
    """A backend whose step splits in two, so the host half of batch N+1 overlaps the device half of N."""

    @abstractmethod
    def prepare(self, batch: ReceivedBatch) -> P:
        """Everything before the device computes; runs on the prefetch thread."""

    @abstractmethod
    def step_prepared(self, prepared: P) -> None:
        """Compute on what `prepare` made."""

    def step(self, batch: ReceivedBatch) -> None:
        """Both halves in turn, when nothing runs ahead."""
        self.step_prepared(self.prepare(batch))


class Stateful(ABC):
    """A backend with training state that a checkpoint keeps beside the data position."""

    @abstractmethod
    def state_dict(self) -> dict:
        """What a checkpoint saves (torch.save-able)."""

    @abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved `state_dict()`."""


StepFactory = Callable[["JobConfig", "Manifest"], Step]


def given(step: Step) -> StepFactory:
    """The factory of a backend made beforehand (tests, benchmarks, a script's own model)."""
    return lambda job, manifest: step


class StepRunner:
    """Runs any `Step`: `prepare` is the loader's per-batch hook when the backend has one, and
    `run` takes what the loader handed over (prepared, or the received batch)."""

    def __init__(self, step: Step) -> None:
        self.inner = step
        self.prepare: Callable[[ReceivedBatch], object] | None = (
            step.prepare if isinstance(step, PreparedStep) else None)

    def run(self, received: ReceivedBatch, prepared: object) -> None:
        """One step: on `prepared` when the backend prepares, else on the received batch."""
        if isinstance(self.inner, PreparedStep):
            self.inner.step_prepared(prepared)
        else:
            self.inner.step(received)


class NullAccelerator(Step):
    """Consumes instantly: measures what the data path alone delivers (the step a rank takes when it is
    given none)."""

    name: str = "null"

    def step(self, batch: ReceivedBatch) -> None:
        return None
