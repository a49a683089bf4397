"""Dispatcher leases, acks, releases and host expiry; the consumer's ledger."""

import numpy as np

from accel.dispatcher import Dispatcher
from accel.ledger import Ledger
from pipeline.plan import EpochPlan


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


def test_ledger_drops_duplicates_and_completes_units():
    ledger = Ledger(num_samples=10, epochs=1)
    ids = np.array([0, 1, 2])
    assert ledger.admit(0, 7, 0, ids)
    assert not ledger.admit(0, 7, 0, ids)
    assert ledger.duplicate_samples == 3
    assert not ledger.stepped(0, 7, 0, False, ids)
    assert ledger.admit(0, 7, 1, np.array([3]))
    assert ledger.stepped(0, 7, 1, True, np.array([3]))
    assert not ledger.admit(0, 7, 1, np.array([3]))  # a redo after completion is a duplicate
    assert ledger.unique_samples == ledger.samples == 4 and ledger.collisions == 0


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
    from accel.journal import Journal

    plan = EpochPlan(manifest, unit_size=16, epochs=1, seed=0)
    job = {"manifest": manifest.uri}
    first = Dispatcher(plan, host_timeout_s=10, journal=Journal(tmp_path / "j", job))
    granted = first.lease("h0", "h0/p0.1", request_id=7)
    first.journal.close()  # the answer never left
    second = Dispatcher(plan, host_timeout_s=10, journal=Journal(tmp_path / "j", job))
    assert second.lease("h0", "h0/p0.1", request_id=7).unit_id == granted.unit_id
    assert second.lease("h0", "h0/p0.1", request_id=8).unit_id != granted.unit_id  # the next request: a new unit
    assert second.lease("h1", "h1/p0.1", request_id=7).unit_id != granted.unit_id  # another worker's ids are its own
