"""Dispatcher leases, acks, releases and host expiry; the consumer's ledger."""

import numpy as np
import pytest

from stoker.accel.control.dispatcher import Dispatcher, RankError
from stoker.accel.control.journal import Journal
from stoker.accel.ledger import InvalidBatch, Ledger, ShortUnit, Step
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.store.shards import Manifest, ShardInfo


def attached(*args, **kwargs) -> Dispatcher:
    """A dispatcher whose rank 0 has attached (units are leased only to ranks that have)."""
    dispatcher = Dispatcher(*args, **kwargs)
    dispatcher.attach_rank(0, "tcp://127.0.0.1:1")
    return dispatcher


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_released_units_are_leased_again_first(manifest):
    d = attached(EpochPlan(manifest, 32, 2, 0))
    a = d.lease("h0", "h0/p0.1")
    b = d.lease("h1", "h1/p0.1")
    assert d.release("h0", ["h0/p0.1"], "crash") == 1
    assert d.lease("h1", "h1/p0.1").unit_id == a.unit_id
    assert d.ack(b.unit_id) and not d.ack(b.unit_id)


def test_a_release_is_counted_under_a_closed_set_of_reasons_whatever_a_peer_wrote(manifest):
    """A reason is a peer's free text; as a metric label each new one would be a series for ever."""
    counted = []
    d = attached(EpochPlan(manifest, 32, 2, 0), on_release=lambda reason, n: counted.append(reason))
    for reason in ("process exit SIGKILL", "host draining", "x" * 200, "process exit 3; rm -rf", "lease refused"):
        d.lease("h0", "h0/p0.1")
        d.release("h0", ["h0/p0.1"], reason)
    assert counted == ["process exit SIGKILL", "host draining", "other", "other", "lease refused"]


def test_every_unit_is_done_once_even_with_releases(manifest):
    d = attached(EpochPlan(manifest, 32, 2, 0))
    done = []
    while (unit := d.lease("h", "w")) is not None:
        if len(done) % 3 == 0:
            d.release("h", None, "test")
            unit = d.lease("h", "w")
        d.ack(unit.unit_id)
        done.append(unit.unit_id)
    assert d.finished and sorted(done) == list(range(d.total_units))


def test_a_silent_host_loses_its_leases(manifest):
    clock = Clock()
    d = attached(EpochPlan(manifest, 32, 1, 0), host_timeout_s=5, clock=clock)
    d.liveness.heartbeat("h0")
    unit = d.lease("h0", "w")
    clock.now = 3
    d.liveness.heartbeat("h1")
    assert d.expire_hosts() == []
    clock.now = 6
    assert d.expire_hosts() == ["h0"]
    assert d.lease("h1", "w1").unit_id == unit.unit_id


SMALL = Manifest(kind="imagenet", classes=["a"], shards=[ShardInfo("s0", 10, 1, "", 0)])


def _ids(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _unit_ids(ledger, unit_id):
    return ledger.plan.unit(unit_id).sample_ids()


def test_ledger_drops_duplicates_and_completes_units():
    ledger = Ledger(EpochPlan(SMALL, unit_size=4, epochs=1, seed=0))
    ids = _unit_ids(ledger, 1)
    assert ledger.admit(0, 1, 0, ids[:3])
    assert not ledger.admit(0, 1, 0, ids[:3])
    assert ledger.duplicate_samples == 3
    assert ledger.stepped(0, 1, 0, False, ids[:3], _ids()) is Step.OPEN
    assert ledger.admit(0, 1, 1, ids[3:])
    assert ledger.stepped(0, 1, 1, True, ids[3:], _ids()) is Step.DONE
    assert not ledger.admit(0, 1, 1, ids[3:])  # a redo after completion is a duplicate
    assert ledger.unique_samples == ledger.samples == len(ids) and ledger.collisions == 0


def test_a_last_batch_that_leaves_samples_out_is_refused_and_the_unit_stays_open_for_its_redo():
    ledger = Ledger(EpochPlan(SMALL, unit_size=4, epochs=1, seed=0))
    ids = _unit_ids(ledger, 0)
    assert ledger.admit(0, 0, 0, ids[:2])
    assert ledger.stepped(0, 0, 0, False, ids[:2], _ids()) is Step.OPEN
    with pytest.raises(ShortUnit, match="leaves 2 of its 4 samples out"):
        ledger.admit(0, 0, 1, _ids(), last=True)  # an empty "last" batch: the other rows never came
    assert not ledger.received(0)
    assert not ledger.admit(0, 0, 0, ids[:2])  # the redo: its first batch was stepped already
    assert ledger.admit(0, 0, 1, ids[2:], last=True) and ledger.received(0)
    assert ledger.stepped(0, 0, 1, True, ids[2:], _ids()) is Step.DONE
    assert ledger.samples == 4 and not ledger.skipped and ledger.incomplete_units == 0


def test_a_unit_whose_stepped_batches_still_end_short_reports_the_missing_samples_as_skipped():
    """The backstop behind the admission check: never counted as delivered."""
    ledger = Ledger(EpochPlan(SMALL, unit_size=4, epochs=1, seed=0))
    ids = _unit_ids(ledger, 0)
    assert ledger.admit(0, 0, 0, ids[:2])
    assert ledger.stepped(0, 0, 0, True, ids[:2], _ids()) is Step.INCOMPLETE
    assert sorted(s.sample_id for s in ledger.skipped.values()) == sorted(ids[2:].tolist())
    assert ledger.samples == 2


def test_a_unit_ended_short_is_leased_again_to_another_host_first(manifest):
    clock = [0.0]
    d = attached(EpochPlan(manifest, unit_size=16, epochs=1, seed=0), clock=lambda: clock[0])
    d.lease("h1", "h1/p0.1")  # h1 is a host too
    unit = d.lease("h0", "h0/p0.1")
    assert d.redo(unit.unit_id) and d.stats().releases == 1
    assert d.lease("h0", "h0/p0.1", holding=[]).unit_id != unit.unit_id  # not back to the host that ended it short
    assert d.lease("h1", "h1/p0.2").unit_id == unit.unit_id
    assert not d.redo(99999)


def test_a_batch_must_hold_samples_of_its_own_unit():
    ledger = Ledger(EpochPlan(SMALL, unit_size=4, epochs=2, seed=0))
    other = _unit_ids(ledger, 1)
    with pytest.raises(InvalidBatch, match="outside unit 0"):
        ledger.admit(0, 0, 0, other[:1])
    with pytest.raises(InvalidBatch, match="epoch 1"):
        ledger.admit(0, 3, 0, _unit_ids(ledger, 3)[:1])  # unit 3 is epoch 1's first
    with pytest.raises(InvalidBatch, match="not in the job's plan"):
        ledger.admit(0, 99, 0, _ids(0))
    with pytest.raises(InvalidBatch, match="outside unit 0"):
        ledger.admit(0, 0, 0, _unit_ids(ledger, 0)[:1], skipped_ids=other[:1])  # a "skipped" sample too


def test_a_lease_held_too_long_by_a_live_host_is_handed_out_again(manifest):
    clock = Clock()
    d = attached(EpochPlan(manifest, 32, 1, 0), host_timeout_s=10, lease_timeout_s=60, clock=clock)
    stuck = d.lease("h0", "h0/p0.1")
    for t in range(0, 70, 5):  # h0 keeps sending heartbeats, but its process never finishes
        clock.now = t
        d.liveness.heartbeat("h0")
        d.expire_hosts()
    assert d.stats().releases == 1
    assert d.lease("h1", "h1/p0.1").unit_id == stuck.unit_id


def test_a_repeated_lease_request_gets_the_same_unit_from_a_restarted_dispatcher(manifest, tmp_path):
    """The dispatcher journals a lease and dies before answering; the worker repeats its request
    (same request id) to the restarted dispatcher and must get that unit, not a second one."""
    plan = EpochPlan(manifest, unit_size=16, epochs=1, seed=0)
    job = {"manifest": manifest.uri}
    first = attached(plan, host_timeout_s=10, journal=Journal(tmp_path / "j", job, b"k" * 32))
    granted = first.lease("h0", "h0/p0.1", request_id=7)
    first.journal.close()  # the answer never left
    second = attached(plan, host_timeout_s=10, journal=Journal(tmp_path / "j", job, b"n" * 32))
    assert second.journal.lease_key == b"k" * 32  # tokens handed out before the restart stay valid
    assert second.lease("h0", "h0/p0.1", request_id=7).unit_id == granted.unit_id
    assert second.lease("h0", "h0/p0.1", request_id=8).unit_id != granted.unit_id  # the next request: a new unit
    assert second.lease("h1", "h1/p0.1", request_id=7).unit_id != granted.unit_id  # another worker's ids are its own
    third = second.lease("h0", "h0/p0.1", request_id=9, key="cpu-0")
    assert second.lease("h0", "h0/p0.1", request_id=9, key="rogue").unit_id != third.unit_id  # nor another key's


def test_units_go_in_plan_order_with_at_most_two_epochs_loaded(manifest):
    """Epochs are made as leasing nears them, also when every unit of one is leased and none acked."""
    plan = EpochPlan(manifest, unit_size=32, epochs=5, seed=0)
    d = attached(plan)
    leased = []
    while (unit := d.lease("h", "w")) is not None:
        leased.append(unit.unit_id)
        assert len(d.queue) <= 2 * plan.units_per_epoch  # the epoch being leased and the next, being made
    assert leased == [u.unit_id for e in range(plan.epochs) for u in plan.lease_order(e)]
    assert d.stats().pending == 0 and d.stats().leased == d.total_units


def test_a_compacted_journal_restarts_with_the_same_units_done_and_leases_open(manifest, tmp_path):
    plan = EpochPlan(manifest, unit_size=32, epochs=3, seed=0)
    job, path = {"manifest": manifest.uri}, tmp_path / "j"
    first = attached(plan, host_timeout_s=10, journal=Journal(path, job, b"k" * 32))
    acked = []
    for _ in range(plan.units_per_epoch + 3):  # epoch 0 and three units of epoch 1
        unit = first.lease("h0", "h0/p0.1")
        assert first.ack(unit.unit_id)
        acked.append(unit.unit_id)
    held = [first.lease("h0", "h0/p0.1", request_id=i).unit_id for i in (1, 2)]
    first.journal.sync()  # what the control server does before it answers; then the process dies
    first.journal.close()  # (its lock goes with it)
    assert len(path.read_text().splitlines()) == 2 + 3 * 2 + 2  # header, snapshot, 3 leases + 3 acks, 2 leases
    second = attached(plan, host_timeout_s=10, journal=Journal(path, job, b"n" * 32))
    assert second.progress.done_units() == sorted(acked)
    assert second.lease("h0", "h0/p0.1", request_id=2).unit_id == held[1]  # an open lease survived the snapshot
    second.release("h0", None, "crash")
    while (unit := second.lease("h1", "h1/p0.1")) is not None:
        assert second.ack(unit.unit_id)
        acked.append(unit.unit_id)
    assert sorted(acked) == list(range(plan.units_per_epoch * plan.epochs)) and second.finished
    assert len(path.read_text().splitlines()) == 2  # the last epoch compacted too


def _ranks(manifest, world_size: int, **kwargs) -> Dispatcher:
    d = Dispatcher(EpochPlan(manifest, 16, 2, 0, world_size, 8), **kwargs)
    for rank in range(world_size):
        d.attach_rank(rank, f"tcp://127.0.0.1:{rank + 1}")
    return d


def test_a_process_holds_one_unit_per_rank_and_gets_the_earliest_of_the_others(manifest):
    d = _ranks(manifest, 3)
    held = []
    for _ in range(3):
        held.append(d.lease("h", "w", holding=[u.unit_id for u in held]))
    assert [(u.position, u.rank) for u in held] == [(0, 0), (0, 1), (0, 2)]
    assert d.lease("h", "w", holding=[u.unit_id for u in held]) is None  # it holds every rank: wait
    assert d.lease("h2", "w2").position == 1  # another process gets the next position


def test_an_earlier_pending_unit_of_a_held_rank_is_traded_for_the_held_one(manifest):
    """Host a died holding position 0 of rank 0 after process b took position 1 of rank 0: b, which
    can send nothing more of position 1 until position 0 arrives, is given position 0 instead."""
    d = _ranks(manifest, 2)
    first = d.lease("a", "a/p0")  # (0, rank 0)
    others = [d.lease("b", "b/p0")]  # (0, rank 1)
    others.append(d.lease("b", "b/p0", holding=[]))  # (1, rank 0): b finished (0, rank 1)
    assert (others[1].position, others[1].rank) == (1, 0)
    d.release("a", None, "host_timeout")
    traded = d.lease("b", "b/p0", holding=[others[1].unit_id])
    assert traded.unit_id == first.unit_id
    stats = d.stats()
    assert stats.handed_back == 1 and stats.releases == 1
    assert d.lease("c", "c/p0").unit_id == others[1].unit_id  # the traded unit is next in line


def test_a_process_holding_a_unit_the_dispatcher_took_back_is_not_held_to_it(manifest):
    d = _ranks(manifest, 2)
    unit = d.lease("h", "w")
    d.release("h", None, "host_timeout")
    again = d.lease("h", "w", holding=[unit.unit_id])  # its claim is stale: the unit is simply pending
    assert again.unit_id == unit.unit_id


def test_a_sample_that_killed_two_processes_is_skipped_in_every_lease_of_its_unit_from_then_on(manifest):
    d = attached(EpochPlan(manifest, 32, 2, 0))
    unit = d.lease("h0", "h0/p0.1")
    sample = int(unit.sample_ids()[3])
    assert not d.poison.crashed(sample, "h0/p0.1, process exit SIGSEGV")  # once may be bad luck
    assert d.poison.in_unit(unit) == {}
    assert d.poison.crashed(sample, "h1/p0.1, process exit SIGSEGV")
    assert not d.poison.crashed(sample, "h1/p0.2, process exit SIGSEGV")  # already skipped: said once
    why = "the transform killed 2 worker processes on it (last: h1/p0.1, process exit SIGSEGV)"
    assert d.poison.in_unit(unit) == {sample: why} and d.poison.why(sample) == why
    other = d.lease("h0", "h0/p0.1")
    assert d.poison.in_unit(other) == {}


def test_a_new_consumer_starting_behind_the_dispatcher_gets_what_was_done_past_its_start_again(manifest):
    """A rank attached to a `stoker dispatch` crashed after its checkpoint; the dispatcher counts done what
    the dead consumer stepped since. The restarted consumer's start takes those units back, in order, also
    from an epoch the dispatcher had closed; its re-attach after a reconnect changes nothing."""
    plan = EpochPlan(manifest, 16, 2, 0)  # units of 16 rows, 2 epochs
    d = attached(plan, planned_batches=lambda unit: 1)
    stream0 = [u.unit_id for u in plan.rank_units(0, 0)]
    done = []
    while len(done) < len(stream0) + 2:  # all of epoch 0 (closed into a count) and two units of epoch 1
        unit = d.lease("h0", "h0/p0.1")
        d.ack(unit.unit_id, 1)
        done.append(unit.unit_id)
    assert d.rewind_rank(0, "c2", 0, 3, 3, 0) == len(stream0) - 3 + 2
    again = [d.lease("h0", "h0/p0.1").unit_id for _ in range(len(stream0) - 3)]
    assert again == stream0[3:]  # the rest of epoch 0, in its stream's order
    assert d.rewind_rank(0, "c2", 0, 3, 3, 0) == 0  # the same consumer again (a reconnect): nothing
    assert not d.finished and d.stats().done == 3
    for unit_id in again:
        d.ack(unit_id, 1)
    while (unit := d.lease("h0", "h0/p0.1")) is not None:
        d.ack(unit.unit_id, 1)
    assert d.finished


def test_a_text_job_too_far_ahead_of_the_consumers_start_is_refused_with_what_to_do(manifest):
    d = attached(EpochPlan(manifest, 16, 3, 0))  # text: no planned_batches
    while (unit := d.lease("h0", "h0/p0.1")) is not None and unit.epoch < 2:
        d.ack(unit.unit_id, 1)
    with pytest.raises(RankError, match="start the dispatcher again without its journal"):
        d.rewind_rank(0, "c2", 0, 0, 0, 0)


def _consumers(manifest, clock: Clock) -> Dispatcher:
    """Two ranks, each attached by its consumer ("c0", "c1"), one unit a batch (images)."""
    d = Dispatcher(EpochPlan(manifest, 16, 2, 0, 2, 16), clock=clock, planned_batches=lambda unit: 1)
    for rank in range(2):
        d.attach_rank(rank, f"tcp://127.0.0.1:{rank + 1}", f"c{rank}")
    return d


def _replace(d: Dispatcher, clock: Clock, rank: int, consumer: str, units: int) -> None:
    """The rank's consumer died; a new one attaches once the old is silent, starting after `units` units."""
    clock.now += d.host_timeout_s + 1
    d.liveness.heartbeat("h")
    d.attach_rank(rank, "tcp://127.0.0.1:9", consumer)
    d.rewind_rank(rank, consumer, 0, units, units, 0)


def test_a_unit_stepped_by_a_consumer_that_died_before_its_ack_counts_done_when_the_next_starts_past_it(manifest):
    """Issue 49: a rank committed its first unit's last step and was killed before the ack left; the next
    consumer starts after that unit (its saved position). The unit is done, never leased again for a rank
    that will never ask for it, and the job finishes (it stayed one unit short of done, and never exited)."""
    clock = Clock()
    d = _consumers(manifest, clock)
    first = d.lease("h", "w")  # (0, rank 0)
    stepped = d.lease("h", "w", holding=[first.unit_id])  # (0, rank 1): every batch at its rank, never acked
    assert stepped.rank == 1
    d.received(stepped.unit_id)
    d.ack(first.unit_id, 1)
    _replace(d, clock, 1, "c1-again", units=1)
    assert d.progress.is_done(stepped.unit_id)
    leased = []
    while (unit := d.lease("h", "w")) is not None:
        leased.append(unit.unit_id)
        d.received(unit.unit_id)
        d.ack(unit.unit_id, 1)
    assert stepped.unit_id not in leased and d.finished


def test_a_unit_sent_whole_to_a_consumer_that_died_before_it_said_so_is_leased_again_for_the_next(manifest):
    """Issue 49: a worker process sent a unit's last batch to rank 1's consumer, which died before it said the
    unit arrived; the process (holding none of it now) leased the rank's next unit. The rank's next consumer,
    starting before both, gets them: neither stays leased to a process that no longer makes it (that stale
    lease kept the unit from the rank until --lease-timeout, past the stall timeout)."""
    clock = Clock()
    d = _consumers(manifest, clock)
    first = d.lease("h", "w")  # (0, rank 0)
    sent = d.lease("h", "w", holding=[first.unit_id])  # (0, rank 1), sent whole: the process holds it no more
    d.ack(first.unit_id, 1)
    making = d.lease("h", "w", holding=[])  # (1, rank 0)
    after = d.lease("h", "w", holding=[making.unit_id])  # (1, rank 1), for the consumer that is gone
    assert (sent.rank, after.rank) == (1, 1) and sent.position < after.position
    _replace(d, clock, 1, "c1-again", units=0)
    assert sent.unit_id not in d.leases and after.unit_id not in d.leases
    again = d.lease("h", "w", holding=[making.unit_id, after.unit_id])  # it still names the old one: not held to it
    assert again.unit_id == sent.unit_id
    assert d.lease("h2", "w2").unit_id == after.unit_id
