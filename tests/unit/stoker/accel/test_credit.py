"""The credit rules against their invariants, by a hypothesis state machine that plays a rank's
senders, its plan order and its training step in every order they can happen in:

- the books balance: the rank's totals are the sum of its senders', and no count is negative;
- a sender sends only what it was granted, and the books know exactly what it holds;
- memory is bounded: the rank holds at most `budget` batches in hand, and one more (the credit
  that lets the very unit it waits for come);
- nothing deadlocks: the unit the rank waits for can always come; where the steps may wait for the
  stream (steps_wait_on_stream), without a step taken, until the budget is full.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from stoker.accel.credit import CreditBook, Grant

MAX_SENDERS = 3


@dataclass
class Sender:
    credit: int = 0  # what the book granted it and it has not used
    unit: int = -1  # the unit it makes (-1: none)
    sent: int = 0  # batches of that unit it has sent


@dataclass
class Stream:
    """The rank's stream in plan order: batches come early and are held until their turn."""

    sizes: list[int]  # batches per unit, in plan order
    position: int = 0
    index: int = 0
    held: dict[tuple[int, int], int] = field(default_factory=dict)  # (unit, batch) -> its sender

    @property
    def done(self) -> bool:
        return self.position == len(self.sizes)

    def waiting_for(self) -> int | None:
        return None if self.done else self.position

    def offer(self, unit: int, index: int, sender: int) -> list[tuple[int, int, int]]:
        """Hold the batch; what is now next in order, as (sender, unit, index)."""
        self.held[(unit, index)] = sender
        out = []
        while not self.done and (self.position, self.index) in self.held:
            out.append((self.held.pop((self.position, self.index)), self.position, self.index))
            self.index += 1
            if self.index == self.sizes[self.position]:
                self.position, self.index = self.position + 1, 0
        return out


class CreditRules(RuleBasedStateMachine):
    @initialize(window=st.integers(1, 4), budget=st.integers(1, 8),
                sizes=st.lists(st.integers(1, 4), min_size=1, max_size=8), steps_wait_on_stream=st.booleans())
    def start(self, window: int, budget: int, sizes: list[int], steps_wait_on_stream: bool) -> None:
        self.book = CreditBook(window, budget, steps_wait_on_stream)
        self.stream = Stream(sizes)
        self.senders: dict[int, Sender] = {}
        self.next_sender = 0
        self.to_lease = list(range(len(sizes)))  # units in lease order (a redone unit goes back in its place)
        self.admitted: set[tuple[int, int]] = set()
        self.step_queue: list[tuple[int, int, int]] = []  # (sender, unit, index) released to the step

    def _apply(self, grants: list[Grant]) -> None:
        for sender, batches in grants:
            assert batches > 0
            self.senders[sender].credit += batches

    def _idle(self) -> list[int]:
        return [s for s, state in self.senders.items() if state.unit < 0]

    # ---- what senders do ----------------------------------------------------------------
    @precondition(lambda self: len(self.senders) < MAX_SENDERS)
    @rule()
    def a_sender_joins(self) -> None:
        self.senders[self.next_sender] = Sender()
        self.next_sender += 1

    @precondition(lambda self: self.to_lease and any(s.unit < 0 for s in self.senders.values()))
    @rule(data=st.data())
    def an_idle_sender_leases_the_earliest_unit(self, data) -> None:
        sender = data.draw(st.sampled_from(self._idle()))
        unit = self.to_lease.pop(0)
        self.senders[sender].unit, self.senders[sender].sent = unit, 0
        self._apply(self.book.hello(sender, unit, self.stream.waiting_for()))

    def _can_send(self) -> list[int]:
        return [s for s, state in self.senders.items() if state.credit > 0 and state.unit >= 0]

    @precondition(lambda self: self._can_send())
    @rule(data=st.data())
    def a_sender_sends_its_next_batch(self, data) -> None:
        sender = data.draw(st.sampled_from(self._can_send()))
        state = self.senders[sender]
        unit, index = state.unit, state.sent
        state.credit -= 1
        state.sent += 1
        last = state.sent == self.stream.sizes[unit]
        if last:
            state.unit = -1  # it leases the next unit (a rule of its own)
        self.book.arrived(sender)
        if (unit, index) in self.admitted:  # a redone unit's batch that is here already: dropped
            self._apply(self.book.refused(sender))
            return
        self.admitted.add((unit, index))
        if all((unit, i) in self.admitted for i in range(self.stream.sizes[unit])) and unit in self.to_lease:
            self.to_lease.remove(unit)  # all its batches are here: the dispatcher leases it to nobody again
        self.book.admitted(sender, unit, last)
        for owner, released_unit, released_index in self.stream.offer(unit, index, sender):
            self.book.released(owner, released_unit)
            self.step_queue.append((owner, released_unit, released_index))
        self._apply(self.book.after_arrival(sender, self.stream.waiting_for()))

    @precondition(lambda self: self._can_send())
    @rule(data=st.data())
    def a_sender_sends_a_batch_that_is_dropped(self, data) -> None:
        sender = data.draw(st.sampled_from(self._can_send()))
        self.senders[sender].credit -= 1
        self.book.arrived(sender)
        self._apply(self.book.refused(sender))

    def _can_trade(self) -> list[int]:
        return [s for s, state in self.senders.items() if self.to_lease and 0 <= self.to_lease[0] < state.unit]

    @precondition(lambda self: self._can_trade())
    @rule(data=st.data())
    def a_sender_trades_its_unit_for_an_earlier_one(self, data) -> None:
        """An earlier unit was handed back after the sender took its own: the dispatcher trades them
        (accel.control.dispatcher, TRADED), and the sender's unit goes back in its place."""
        sender = data.draw(st.sampled_from(self._can_trade()))
        state = self.senders[sender]
        earlier = self.to_lease.pop(0)
        self.to_lease = sorted([*self.to_lease, state.unit])
        state.unit, state.sent = earlier, 0
        self._apply(self.book.hello(sender, earlier, self.stream.waiting_for()))

    @precondition(lambda self: self.senders)
    @rule(data=st.data())
    def a_sender_dies(self, data) -> None:
        """Its slot is freed; the unit it was making is leased again, from its first batch."""
        sender = data.draw(st.sampled_from(sorted(self.senders)))
        state = self.senders.pop(sender)
        self.book.leave(sender)
        self._apply(self.book.after_leave(self.stream.waiting_for()))
        if state.unit >= 0:
            self.to_lease.insert(0, state.unit)
            self.to_lease.sort()

    # ---- the training step ----------------------------------------------------------------
    @precondition(lambda self: self.step_queue)
    @rule()
    def the_step_takes_a_batch(self) -> None:
        sender, unit, index = self.step_queue.pop(0)
        if index + 1 == self.stream.sizes[unit]:
            self.book.unit_done(unit)
        self._apply([(s, n) for s, n in self.book.stepped(sender, self.stream.waiting_for()) if s in self.senders])

    # ---- invariants --------------------------------------------------------------------
    @invariant()
    def the_books_balance(self) -> None:
        book = self.book
        assert book.in_hand == sum(c.in_hand for c in book.senders.values())
        assert book.queued == sum(c.queued for c in book.senders.values())
        for credit in book.senders.values():
            assert min(credit.outstanding, credit.held, credit.held_current, credit.queued) >= 0, credit

    @invariant()
    def a_sender_holds_exactly_what_it_was_granted(self) -> None:
        assert set(self.book.senders) <= set(self.senders)
        for sender, state in self.senders.items():
            credit = self.book.senders.get(sender)
            assert state.credit == (credit.outstanding if credit else 0), (sender, state, credit)

    @invariant()
    def the_rank_holds_at_most_its_budget_and_one(self) -> None:
        assert self.book.in_hand <= self.book.budget + 1, self.book

    @invariant()
    def the_unit_the_rank_waits_for_can_always_come(self) -> None:
        """Its maker can send, or the step has a batch (whose credit comes back), or it waits to
        be leased and a sender can take it (an idle one, a new one, or one that trades)."""
        waited = self.stream.waiting_for()
        if waited is None:
            return
        makers = [state for state in self.senders.values() if state.unit == waited]
        takers = self._idle() or len(self.senders) < MAX_SENDERS or self._can_trade()
        step_gives_back = bool(self.step_queue) and not self.book.steps_wait_on_stream
        assert (step_gives_back or any(state.credit > 0 for state in makers) or (waited in self.to_lease and takers)
                or self.book.in_hand >= self.book.budget), (waited, self.book, self.senders, self.stream)

CreditRules.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
test_the_credit_rules_keep_their_invariants = CreditRules.TestCase


def _stream_in_without_a_step(book: CreditBook, units: dict[int, list[int]], sizes: list[int]) -> int:
    """Senders (sender -> its units, in the order it makes them) send whatever credit allows, the step takes
    nothing (its all-reduce waits on another rank); the batches that came in."""
    stream, sent, arrived = Stream(sizes), {s: 0 for s in units}, 0
    credit = {s: 0 for s in units}
    for sender, made in units.items():
        credit[sender] += sum(n for _, n in book.hello(sender, made[0], stream.waiting_for()))
    while any(credit[s] and units[s] for s in units):
        sender = next(s for s in units if credit[s] and units[s])
        unit = units[sender][0]
        credit[sender] -= 1
        book.arrived(sender)
        last = sent[sender] + 1 == sizes[unit]
        book.admitted(sender, unit, last)
        for owner, released, _ in stream.offer(unit, sent[sender], sender):
            book.released(owner, released)
        sent[sender] += 1
        arrived += 1
        grants = book.after_arrival(sender, stream.waiting_for())
        if last:
            units[sender].pop(0)
            sent[sender] = 0
            if units[sender]:
                grants += book.hello(sender, units[sender][0], stream.waiting_for())
        for owner, n in grants:
            credit[owner] += n
    return arrived


def test_where_the_steps_wait_for_the_stream_it_comes_in_whole_while_no_step_is_taken():
    """A BERT rank in lockstep with one that waits for its count: its stream must come in whole while its own step
    waits in the all-reduce. Two senders at the default window of 3, units of 5 batches, a roomy budget: with
    released batches counted against the window it stops short; with steps_wait_on_stream every batch comes."""
    sizes = [5, 5, 5, 5]
    makers = {"a": [0, 2], "b": [1, 3]}
    assert _stream_in_without_a_step(CreditBook(3, 1000), {k: list(v) for k, v in makers.items()}, sizes) < 20
    assert _stream_in_without_a_step(CreditBook(3, 1000, steps_wait_on_stream=True), makers, sizes) == 20


def test_where_the_steps_wait_for_the_stream_the_budget_still_bounds_what_the_rank_holds():
    """Released batches leave the window, not the budget: a stream longer than the budget stops at it."""
    book = CreditBook(3, 12, steps_wait_on_stream=True)
    arrived = _stream_in_without_a_step(book, {"a": [0, 2], "b": [1, 3]}, [5, 5, 5, 5])
    assert arrived <= 12 and book.in_hand <= book.budget + 1
