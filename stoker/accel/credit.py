"""A rank's credit rules as a pure object: what each event on the data socket lets the senders send.

No sockets, no clock: the receiver (accel.receiver) tells the book what happened and sends the
credit each transition returns. A sender may send a batch only while it holds credit; credit for
a batch comes back when the training step has finished with it, so the batches a rank holds
are bounded:

- every sender has at most `window` batches in flight (credit granted and not yet used), queued
  for the step, or held early (they wait for their turn in plan order, accel.stream), plus the
  batches of the unit it is on, so that it can always finish that unit and lease the next
  (which is the earliest pending one: accel.control.dispatcher);
- all senders together hold at most `budget` batches in hand, and one more: the sender of the
  very unit the rank waits for gets a credit whenever order, not the step, holds it back and
  the step has nothing else to step (the budget may be all in early batches that wait for this
  unit). That one credit is what keeps a rank waiting for its own next batch from waiting for
  ever, whatever another rank, stepping in lock-step, holds back.

Where the rank's steps may wait for its whole epoch stream (`steps_wait_on_stream`: BERT ranks in
lockstep, whose epoch's steps are settled only from every rank's count, accel.assembly), a step
in hand is no promise that credit comes back: the rank's DDP all-reduce can wait on a rank that
waits for this one's count. There batches released to the step do not count against a sender's
window, only against the budget, so the rank's stream comes in whole, whatever the step does,
as far as the budget holds it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

Grant = tuple[Hashable, int]  # (sender, batches it may send now)


@dataclass
class SenderCredit:
    """One sender's place in the books."""

    outstanding: int = 0  # credits granted whose batch has not arrived yet
    held: int = 0  # its batches of earlier units waiting here for their turn in plan order
    held_current: int = 0  # ... of the unit it is on
    queued: int = 0  # its batches released to the step (queued or being stepped)
    unit: int = -1  # the unit it said it works on last
    unit_complete: bool = False  # that unit's last batch has come

    def working_on(self, unit_id: int) -> None:
        if unit_id != self.unit:
            self.held += self.held_current
            self.held_current = 0
            self.unit = unit_id
            self.unit_complete = False

    @property
    def in_hand(self) -> int:
        return self.outstanding + self.held + self.held_current + self.queued


@dataclass
class CreditBook:
    """The credit of one rank's senders; every transition returns the grants it makes."""

    window: int
    budget: int
    steps_wait_on_stream: bool = False  # released batches count against the budget only (the module says why)
    senders: dict[Hashable, SenderCredit] = field(default_factory=dict)
    in_hand: int = 0  # credits outstanding plus batches held or queued here, over every sender
    queued: int = 0  # batches released in plan order and not yet stepped, over every sender
    _holder: dict[int, Hashable] = field(default_factory=dict)  # unit -> the sender that said it works on it

    def hello(self, sender: Hashable, unit_id: int, waiting_for: int | None) -> list[Grant]:
        """A sender that proved its lease of `unit_id` says it works on it (a new sender gets a slot)."""
        credit = self.senders.setdefault(sender, SenderCredit())
        self._holder[unit_id] = sender
        credit.working_on(unit_id)
        return self._top_up(sender) + self._unblock(waiting_for)

    def readmit(self, sender: Hashable) -> None:
        """A freed sender is back with a batch its lease proves: a slot, with that batch's credit owed."""
        self.senders[sender] = SenderCredit(outstanding=1)
        self.in_hand += 1

    def arrived(self, sender: Hashable) -> None:
        """A batch came from the sender: the credit it used is spent (whatever becomes of the batch)."""
        credit = self.senders[sender]
        if credit.outstanding > 0:
            credit.outstanding -= 1
            self.in_hand -= 1

    def refused(self, sender: Hashable) -> list[Grant]:
        """The batch that came was dropped (bad, a duplicate, not its lease): its credit goes back."""
        return self._grant(sender, 1)

    def admitted(self, sender: Hashable, unit_id: int, last_in_unit: bool) -> None:
        """The batch that came is new and waits here for its turn."""
        credit = self.senders[sender]
        self._holder[unit_id] = sender
        credit.working_on(unit_id)
        credit.unit_complete = credit.unit_complete or last_in_unit
        credit.held_current += 1
        self.in_hand += 1

    def released(self, sender: Hashable, unit_id: int) -> None:
        """A batch of the sender's reached its turn and went to the step."""
        credit = self.senders.get(sender)
        if credit is None:
            return
        if unit_id == credit.unit and credit.held_current:
            credit.held_current -= 1
        elif credit.held:
            credit.held -= 1
        credit.queued += 1
        self.queued += 1

    def after_arrival(self, sender: Hashable, waiting_for: int | None) -> list[Grant]:
        """Once an admitted batch and what it unblocked are placed: a batch that waits for its turn
        frees its place in the window, and the unit the rank waits for must be able to come."""
        return self._top_up(sender) + self._unblock(waiting_for)

    def stepped(self, sender: Hashable, waiting_for: int | None) -> list[Grant]:
        """The step is done with a batch of the sender's: its credit comes back."""
        credit = self.senders.get(sender)
        grants: list[Grant] = []
        if credit is not None and credit.queued:
            credit.queued -= 1
            self.queued -= 1
            self.in_hand -= 1
            grants = self._top_up(sender)
        return grants + self._unblock(waiting_for)

    def unit_done(self, unit_id: int) -> None:
        self._holder.pop(unit_id, None)

    def leave(self, sender: Hashable) -> SenderCredit | None:
        """The sender's slot is freed: what it had in hand no longer counts (its batches already
        queued still reach the step; they return no credit)."""
        credit = self.senders.pop(sender, None)
        if credit is not None:
            self.in_hand -= credit.in_hand
            self.queued -= credit.queued
        return credit

    def after_leave(self, waiting_for: int | None) -> list[Grant]:
        """Once a sender's slot is freed: what it held no longer counts, so the unit the rank waits for may come
        now (where the steps wait for the stream, no step would ask for it again)."""
        return self._unblock(waiting_for)

    # ---- the rules ------------------------------------------------------------------------
    def _top_up(self, sender: Hashable) -> list[Grant]:
        """Credit up to the sender's window, as far as the budget allows; a sender whose window is
        full of held batches still gets one at a time to finish a unit it has started."""
        credit = self.senders[sender]
        room = min(self.window - self._in_window(credit), self.budget - self.in_hand)
        if (room <= 0 and credit.held_current and not credit.unit_complete and self._blocked_by_order(credit)
                and self.in_hand < self.budget):
            room = 1
        return self._grant(sender, room)

    def _in_window(self, credit: SenderCredit) -> int:
        """What counts against a sender's window: all but the batches of the unit it is on (and, where the
        steps may wait for the stream, but those released to the step)."""
        return credit.outstanding + credit.held + (0 if self.steps_wait_on_stream else credit.queued)

    def _blocked_by_order(self, credit: SenderCredit) -> bool:
        """Out of credit because batches of its wait for their turn (not because the step is behind:
        that is ordinary back-pressure, except where the steps may wait for the stream)."""
        return credit.outstanding == 0 and (self.steps_wait_on_stream or credit.queued < self.window)

    def _unblock(self, waiting_for: int | None) -> list[Grant]:
        """The one credit over the budget (the module says why)."""
        sender = self._holder.get(waiting_for) if waiting_for is not None else None
        credit = self.senders.get(sender) if sender is not None else None
        if credit is None or credit.unit != waiting_for or not self._blocked_by_order(credit):
            return []  # nobody makes it now, or its maker can send already
        if self.in_hand < self.budget or self.queued == 0:  # over budget only when the step has nothing else
            return self._grant(sender, 1)
        return []

    def _grant(self, sender: Hashable, batches: int) -> list[Grant]:
        credit = self.senders.get(sender)
        if batches <= 0 or credit is None:
            return []
        credit.outstanding += batches
        self.in_hand += batches
        return [(sender, batches)]
