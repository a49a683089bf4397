"""Dispatcher leases, acks, releases and host expiry; the consumer's ledger."""

import numpy as np
import pytest

from accel.dispatcher import Dispatcher
from accel.journal import Journal
from accel.ledger import InvalidBatch, Ledger, Step
from pipeline.plan import EpochPlan
from pipeline.shards import Manifest, ShardInfo


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_released_units_are_leased_again_first(manifest):
    d = Dispatcher(EpochPlan(manifest, 32, 2, 0))
    a = d.lease("h0", "h0/p0.1")
    b = d.lease("h1", "h1/p0.1")
    assert d.release("h0", ["h0/p0.1"], "crash") == 1
    assert d.lease("h1", "h1/p0.1").unit_id == a.unit_id
    assert d.ack(b.unit_id) and not d.ack(b.unit_id)


def test_every_unit_is_done_once_even_with_releases(manifest):
    d = Dispatcher(EpochPlan(manifest, 32, 2, 0))
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
    d = Dispatcher(EpochPlan(manifest, 32, 1, 0), host_timeout_s=5, clock=clock)
    d.heartbeat("h0")
    unit = d.lease("h0", "w")
    clock.now = 3
    d.heartbeat("h1")
    assert d.expire_hosts() == []
    clock.now = 6
    assert d.expire_hosts() == ["h0"]
    assert d.lease("h1", "w1").unit_id == unit.unit_id


SMALL = Manifest(kind="imagenet", classes=["a"], shards=[ShardInfo("s0", 10, 1, "", 0)])


def _ids(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def test_ledger_drops_duplicates_and_completes_units():
    ledger = Ledger(EpochPlan(SMALL, unit_size=4, epochs=1, seed=0))
    unit = ledger.plan.unit(1)  # rows 4..7
    ids = _ids(4, 5, 6)
    assert ledger.admit(0, 1, 0, ids)
    assert not ledger.admit(0, 1, 0, ids)
    assert ledger.duplicate_samples == 3
    assert ledger.stepped(0, 1, 0, False, ids, _ids()) is Step.OPEN
    assert ledger.admit(0, 1, 1, _ids(7))
    assert ledger.stepped(0, 1, 1, True, _ids(7), _ids()) is Step.DONE
    assert not ledger.admit(0, 1, 1, _ids(7))  # a redo after completion is a duplicate
    assert ledger.unique_samples == ledger.samples == unit.size and ledger.collisions == 0


def test_an_empty_last_batch_cannot_close_a_unit():
    ledger = Ledger(EpochPlan(SMALL, unit_size=4, epochs=1, seed=0))
    assert ledger.admit(0, 0, 0, _ids(0, 1))
    assert ledger.stepped(0, 0, 0, False, _ids(0, 1), _ids()) is Step.OPEN
    assert ledger.admit(0, 0, 1, _ids())  # "last", but rows 2 and 3 never came
    assert ledger.stepped(0, 0, 1, True, _ids(), _ids()) is Step.INCOMPLETE
    assert ledger.incomplete_units == 1
    for index, ids in enumerate((_ids(0, 1), _ids(2, 3))):  # the honest redo is admitted afresh and completes
        assert ledger.admit(0, 0, index, ids)
        state = ledger.stepped(0, 0, index, index == 1, ids, _ids())
    assert state is Step.DONE


def test_a_batch_must_hold_samples_of_its_own_unit():
    ledger = Ledger(EpochPlan(SMALL, unit_size=4, epochs=2, seed=0))
    with pytest.raises(InvalidBatch, match="outside unit 0"):
        ledger.admit(0, 0, 0, _ids(0, 9))  # sample 9 is unit 2's
    with pytest.raises(InvalidBatch, match="epoch 1"):
        ledger.admit(0, 3, 0, _ids(0))  # unit 3 is epoch 1's first
    with pytest.raises(InvalidBatch, match="not in the job's plan"):
        ledger.admit(0, 99, 0, _ids(0))
    with pytest.raises(InvalidBatch, match="outside unit 0"):
        ledger.admit(0, 0, 0, _ids(1), skipped_ids=_ids(5))  # a "skipped" sample must be the unit's too


def test_batches_stepped_before_a_restart_are_credited_by_their_duplicates():
    ledger = Ledger(EpochPlan(SMALL, unit_size=4, epochs=1, seed=0))
    ledger.restore(set(), {"0": {"stepped": [0], "batches": 2}})
    assert ledger.admit(0, 0, 1, _ids(2, 3))
    assert ledger.stepped(0, 0, 1, True, _ids(2, 3), _ids()) is Step.OPEN  # batch 0's samples are not known yet
    assert not ledger.admit(0, 0, 0, _ids(0, 1))  # its byte-identical redo: a duplicate that tells them
    assert ledger.settle(0) is Step.DONE


def test_a_lease_held_too_long_by_a_live_host_is_handed_out_again(manifest):
    clock = Clock()
    d = Dispatcher(EpochPlan(manifest, 32, 1, 0), host_timeout_s=10, lease_timeout_s=60, clock=clock)
    stuck = d.lease("h0", "h0/p0.1")
    for t in range(0, 70, 5):  # h0 keeps sending heartbeats, but its process never finishes
        clock.now = t
        d.heartbeat("h0")
        d.expire_hosts()
    assert d.stats().releases == 1
    assert d.lease("h1", "h1/p0.1").unit_id == stuck.unit_id


def test_a_repeated_lease_request_gets_the_same_unit_from_a_restarted_dispatcher(manifest, tmp_path):
    """The dispatcher journals a lease and dies before answering; the worker repeats its request
    (same request id) to the restarted dispatcher and must get that unit, not a second one."""
    plan = EpochPlan(manifest, unit_size=16, epochs=1, seed=0)
    job = {"manifest": manifest.uri}
    first = Dispatcher(plan, host_timeout_s=10, journal=Journal(tmp_path / "j", job, b"k" * 32))
    granted = first.lease("h0", "h0/p0.1", request_id=7)
    first.journal.close()  # the answer never left
    second = Dispatcher(plan, host_timeout_s=10, journal=Journal(tmp_path / "j", job, b"n" * 32))
    assert second.journal.lease_key == b"k" * 32  # tokens handed out before the restart stay valid
    assert second.lease("h0", "h0/p0.1", request_id=7).unit_id == granted.unit_id
    assert second.lease("h0", "h0/p0.1", request_id=8).unit_id != granted.unit_id  # the next request: a new unit
    assert second.lease("h1", "h1/p0.1", request_id=7).unit_id != granted.unit_id  # another worker's ids are its own
    third = second.lease("h0", "h0/p0.1", request_id=9, key="cpu-0")
    assert second.lease("h0", "h0/p0.1", request_id=9, key="rogue").unit_id != third.unit_id  # nor another key's
