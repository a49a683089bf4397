"""What every real training backend shares: loss bookkeeping, logging and checkpoints."""

from __future__ import annotations

import logging
import math

import torch

from stoker.accel.stepping import PreparedStep, Stateful
from stoker.protos.errors import StateError

log = logging.getLogger("stoker.loss")  # the CLI shows it at INFO when training with --accel torch


class TrainingDiverged(StateError, FloatingPointError):
    """The loss became NaN or infinite: stepping on would train on garbage."""


class TrainingStep(PreparedStep, Stateful):
    """A real model's step: needs `self.model`, `self.optimizer`, `self.losses`, `self.log_every`,
    `self.steps`; subclasses write `prepare` and `step_prepared`."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    losses: list[float]
    log_every: int
    steps: int

    def record(self, loss: torch.Tensor) -> None:
        value = float(loss.detach())
        if not math.isfinite(value):
            raise TrainingDiverged(f"loss became {value} at step {self.steps}")
        self.losses.append(value)
        self.steps += 1
        if self.log_every and self.steps % self.log_every == 0:
            recent = self.losses[-self.log_every:]
            log.info("step %d: loss %.4f (mean of the last %d)", self.steps, sum(recent) / len(recent), len(recent))

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = state["steps"]
