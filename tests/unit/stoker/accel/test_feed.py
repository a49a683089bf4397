"""stoker/accel/feed.py over a fake step source: prefetch order, hand-back, epoch ends, errors."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.accel.feed import Feed, UncommittedStep
from stoker.accel.steps import EpochDone, Scheduled
from stoker.protos.errors import ConfigError
from tests.unit.stoker.accel.fakes import CONFIG

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
    """`epochs` epochs of `steps` one-row steps (sample 10 * epoch + step); records what the feed tells it
    and keeps the position as a consumer does (accel.consumer)."""

    events: list[str] = field(default_factory=list)
    position: tuple[int, int] = (0, 0)
    cfg: object = CONFIG
    manifest: object = None
    epochs: int = 2
    steps: int = 3

    def __post_init__(self) -> None:
        self.job = type("Job", (), {"epochs": self.epochs, "decode_on": "host"})()
        items: list[object] = []
        for epoch in range(self.epochs):
            for step in range(self.steps):
                received = FakeReceived(1, np.array([10 * epoch + step]))
                last = step == self.steps - 1
                items.append(Scheduled(received, epoch, step, received, last=last))  # type: ignore[arg-type]
            items.append(EpochDone(epoch, self.steps))
        self._schedule = FakeSchedule(items)

    def schedule(self) -> FakeSchedule:
        return self._schedule

    def taken(self, step: Scheduled) -> None:
        self.events.append(f"taken {step.epoch}.{step.step}")
        self.position = (step.epoch + 1, 0) if step.last else (step.epoch, step.step + 1)

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


def _ids(batches) -> list[int]:
    return [int(b.sample_ids[0]) for b in batches]


def _feed(source: FakeSource, overlap: bool = False) -> Feed:
    return Feed(source, format="numpy", overlap=overlap, prepare=lambda received: int(received.sample_ids[0]))


@pytest.mark.parametrize("overlap", [False, True])
def test_a_trainer_that_takes_len_batches_and_calls_iter_again_gets_every_epoch(overlap):
    """Lightning's habit (and steps_per_epoch loops): exactly len(loader) batches per iterator, never
    the extra next() that sees the epoch's end. Before: 3, 0, 3 batches."""
    feed = _feed(FakeSource(epochs=3), overlap)
    passes = []
    for _ in range(3):
        it = iter(feed)
        passes.append(_ids(next(it) for _ in range(3)))
        assert feed.epoch == len(passes) - 1  # the last batch in hand is still its epoch's
    assert passes == [[0, 1, 2], [10, 11, 12], [20, 21, 22]]
    assert list(feed) == [] and feed.epoch == 3


@pytest.mark.parametrize("overlap", [False, True])
def test_an_iterator_left_mid_epoch_is_continued_by_the_next(overlap):
    feed = _feed(FakeSource(), overlap)
    for batch in feed:
        if batch.step == 0:
            break
    assert _ids(feed) == [1, 2] and _ids(feed) == [10, 11, 12] and list(feed) == []


def test_two_iterators_before_a_next_and_for_loops_mixed_with_next_share_one_stream():
    source = FakeSource()
    feed = _feed(source)
    first, second = iter(feed), iter(feed)
    assert _ids([next(second), next(first)]) == [0, 1]
    assert _ids(second) == [2]  # the epoch's end: both are over, each having lost nothing
    assert next(first, None) is None
    late = iter(feed)
    assert _ids([next(late)]) == [10] and _ids(feed) == [11, 12]
    assert next(late, None) is None  # a newer pass saw epoch 1's end
    assert source.events.count("epoch 0 over") == 1 and source.events.count("epoch 1 over") == 1


def test_the_epoch_is_the_batch_in_hand_until_its_end_is_seen():
    feed = _feed(FakeSource())
    assert feed.epoch == 0
    it = iter(feed)
    epochs = [(next(it).epoch, feed.epoch) for _ in range(3)]
    assert epochs == [(0, 0)] * 3  # the last batch's step: a script logging loader.epoch says 0, not 1
    assert next(it, None) is None and feed.epoch == 1


class _Model:
    """What must come out of a feed of `epochs` x `steps` whatever a caller does with iterators: each next()
    gives the stream's next batch while it lies in the epoch of the iterator's first batch (a new iterator
    begins with whatever comes next), else StopIteration for good. The epoch in hand is the last batch's
    until a pass reaches that epoch's end (or a new pass passes over it)."""

    def __init__(self, epochs: int, steps: int) -> None:
        self.stream = [(e, s) for e in range(epochs) for s in range(steps)]
        self.epochs = epochs
        self.pos = 0
        self.in_hand: int | None = None
        self.passes: list[list] = []  # per iterator: [its epoch or None, over]

    def _at_end_of_hand(self) -> bool:
        return self.pos == len(self.stream) or self.stream[self.pos][0] != self.in_hand

    def next(self, i: int) -> tuple[int, int] | None:
        state = self.passes[i]
        if state[1]:
            return None
        if state[0] is None:
            if self.in_hand is not None and self._at_end_of_hand():
                self.in_hand = None
            if self.pos == len(self.stream):
                state[1] = True
                return None
            state[0] = self.stream[self.pos][0]
        if self.pos < len(self.stream) and self.stream[self.pos][0] == state[0]:
            self.pos += 1
            self.in_hand = state[0]
            return self.stream[self.pos - 1]
        state[1] = True
        if self.in_hand == state[0]:
            self.in_hand = None
        return None

    def epoch(self) -> int:
        if self.in_hand is not None:
            return self.in_hand
        return self.stream[self.pos][0] if self.pos < len(self.stream) else self.epochs


CALLS = st.lists(st.one_of(st.just("iter"), st.integers(0, 3)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(calls=CALLS, epochs=st.integers(1, 3), steps=st.integers(1, 4), overlap=st.booleans())
def test_any_sequence_of_iter_and_next_gives_every_batch_once_in_order(calls, epochs, steps, overlap):
    """Property: any interleaving of iter() and next() over any of the iterators made so far matches the
    model, batch for batch; then a plain epoch loop gets the rest, and the whole is every batch once, in
    order, each handed back once."""
    source = FakeSource(epochs=epochs, steps=steps)
    feed = _feed(source, overlap)
    model = _Model(epochs, steps)
    iterators: list = []
    given_out: list[tuple[int, int]] = []
    for call in calls:
        if call == "iter" or not iterators:
            iterators.append(iter(feed))
            model.passes.append([None, False])
            continue
        i = call % len(iterators)
        batch = next(iterators[i], None)
        got = None if batch is None else (batch.epoch, batch.step)
        assert got == model.next(i)
        if got is not None:
            given_out.append(got)
        assert feed.epoch == model.epoch()
    while feed.epoch < epochs:
        given_out += [(b.epoch, b.step) for b in feed]
    assert given_out == model.stream
    assert [e for e in source.events if e.startswith("done")] == [f"done {e}.{s}" for e, s in model.stream]


def _committing(source: FakeSource, overlap: bool = False) -> Feed:
    return Feed(source, format="numpy", overlap=overlap, prepare=lambda received: int(received.sample_ids[0]),
                commit_steps=True)


@pytest.mark.parametrize("overlap", [False, True])
def test_with_commit_steps_a_batch_not_committed_comes_again_and_counts_only_at_its_commit(overlap):
    """torchft's shape: a step whose should_commit() was false is taken again with the same batch; the position
    and the books move at the commit, never at the yield."""
    source = FakeSource(epochs=1)
    feed = _committing(source, overlap)
    it = iter(feed)
    first = next(it)
    assert source.events == [] and source.position == (0, 0)  # given, not yet a step
    assert next(it) is first and next(it) is first  # rolled back twice: the same batch each time
    feed.commit(first)
    assert source.events == ["taken 0.0", "done 0.0"] and source.position == (0, 1)
    second = next(it)
    assert second.step == 1 and source.position == (0, 1)
    feed.commit()
    last = next(it)
    assert next(iter(feed)) is last  # a new pass gives the uncommitted batch too, not the epoch's end
    feed.commit()
    assert next(it, None) is None and source.position == (1, 0)
    assert [e for e in source.events if e.startswith("done")] == ["done 0.0", "done 0.1", "done 0.2"]


def test_commit_is_refused_without_a_batch_in_hand_twice_for_one_batch_and_for_another_batch():
    feed = _committing(FakeSource())
    with pytest.raises(UncommittedStep, match="no batch is in hand"):
        feed.commit()
    it = iter(feed)
    first = next(it)
    feed.commit()
    with pytest.raises(UncommittedStep, match="no batch is in hand"):
        feed.commit(first)  # committed already: a second commit would count it twice
    next(it)
    with pytest.raises(UncommittedStep, match="epoch 0 step 1, not the one given .epoch 0 step 0"):
        feed.commit(first)
    with pytest.raises(UncommittedStep, match="give the Batch the loader gave .or nothing, for the one in hand., not a "
                                              "int"):
        feed.commit(1)  # type: ignore[arg-type]  # the step number, as issue 49's `commit(step)` sketch reads
    with pytest.raises(ConfigError, match="commit_steps=True"):
        _feed(FakeSource()).commit()


def test_a_feed_closed_with_its_batch_uncommitted_hands_nothing_back():
    source = FakeSource()
    feed = _committing(source)
    next(iter(feed))
    feed.hand_back()  # what Loader.close() does
    assert source.events == [] and feed.uncommitted is not None


def test_a_closed_feed_gives_no_batch_to_an_iterator_made_before():
    feed = _committing(FakeSource())
    it = iter(feed)
    next(it)
    feed.close(RuntimeError("closed"))
    with pytest.raises(RuntimeError, match="closed"):
        next(it)  # not the uncommitted batch again, nor the prefetched next one
