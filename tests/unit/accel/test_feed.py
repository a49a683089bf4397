"""accel/feed.py over a fake step source: prefetch order, hand-back, epoch ends, errors."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import pytest

from stoker.accel.feed import Feed
from stoker.accel.steps import EpochDone, Scheduled
from tests.unit.accel.fakes import CONFIG

END = object()


@dataclass
class FakeReceived:
    size: int
    sample_ids: np.ndarray


@dataclass
class FakeSchedule:
    items: list[object]

    def next(self) -> object:
        return self.items.pop(0) if self.items else END


@dataclass
class FakeSource:
    """Two epochs of three one-row steps; records what the feed tells it."""

    events: list[str] = field(default_factory=list)
    position: tuple[int, int] = (0, 0)
    cfg: object = CONFIG
    manifest: object = None

    def __post_init__(self) -> None:
        self.job = type("Job", (), {"epochs": 2, "decode_on": "host"})()
        items: list[object] = []
        for epoch in range(2):
            for step in range(3):
                received = FakeReceived(1, np.array([10 * epoch + step]))
                items.append(Scheduled(received, epoch, step, received, last=step == 2))  # type: ignore[arg-type]
            items.append(EpochDone(epoch, 3))
        self._schedule = FakeSchedule(items)

    def schedule(self) -> FakeSchedule:
        return self._schedule

    def taken(self, step: Scheduled) -> None:
        self.events.append(f"taken {step.epoch}.{step.step}")

    def step_done(self, step: Scheduled) -> None:
        self.events.append(f"done {step.epoch}.{step.step}")

    def epoch_done(self, end: EpochDone) -> None:
        self.events.append(f"epoch {end.epoch} over")
        self.position = (end.epoch + 1, 0)


def test_each_pass_is_an_epoch_and_each_step_goes_back_when_the_next_is_asked_for():
    source = FakeSource()
    feed = Feed(source, format="numpy", overlap=False, prepare=lambda received: int(received.sample_ids[0]))
    assert [b.prepared for b in feed] == [0, 1, 2]
    assert feed.epoch_steps == {0: 3}
    assert source.events == ["taken 0.0", "done 0.0", "taken 0.1", "done 0.1", "taken 0.2", "done 0.2",
                             "epoch 0 over"]
    assert [b.prepared for b in feed] == [10, 11, 12]
    assert list(feed) == []  # every epoch done


def test_with_overlap_the_next_batch_is_prepared_on_the_prefetch_thread_during_the_step():
    source = FakeSource()
    prepared = []
    in_step = threading.Event()
    next_prepared = threading.Event()

    def prepare(received: FakeReceived) -> int:
        prepared.append((int(received.sample_ids[0]), threading.current_thread().name))
        if in_step.is_set():
            next_prepared.set()
        return int(received.sample_ids[0])

    batches = iter(Feed(source, format="numpy", overlap=True, prepare=prepare))
    first = next(batches)
    in_step.set()  # step 0 runs now; batch 1 is made meanwhile
    assert next_prepared.wait(10) and first.prepared == 0 and "done 0.0" not in source.events
    assert prepared[1] == (1, "stoker-prefetch")


def test_an_error_while_preparing_reaches_the_training_thread():
    def prepare(received: FakeReceived) -> int:
        raise FloatingPointError("bad batch")

    with pytest.raises(FloatingPointError, match="bad batch"):
        next(iter(Feed(FakeSource(), format="numpy", overlap=True, prepare=prepare)))


def test_formats_are_checked():
    with pytest.raises(ValueError, match="not 'arrow'"):
        Feed(FakeSource(), format="arrow")
