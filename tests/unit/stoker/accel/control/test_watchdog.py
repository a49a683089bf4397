"""The stall watchdog: who holds what a waiting rank needs, in one line, and when a wait is a data stall."""

import pytest

from stoker.accel.control.dispatcher import Dispatcher
from stoker.accel.control.watchdog import StallBounds, Watchdog
from stoker.pipeline.plan import EpochPlan
from stoker.protos import stoker_pb2 as pb


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _job(manifest, clock):
    dispatcher = Dispatcher(EpochPlan(manifest, 32, 2, 0), clock=clock)
    dispatcher.attach_rank(0, "tcp://127.0.0.1:1")
    watchdog = Watchdog(StallBounds(report_s=60, fail_s=300), clock)
    clock.now += 1000  # the dispatcher has run a while
    return dispatcher, watchdog


def test_a_rank_waiting_past_the_report_bound_is_told_who_holds_its_unit_and_what_it_does(manifest):
    clock = Clock()
    dispatcher, watchdog = _job(manifest, clock)
    unit = dispatcher.lease("h0", "h0/p0.1")
    watchdog.heard_host("h0", [pb.ProcessActivity(worker_id="h0/p0.1", phase="transforming", unit_id=unit.unit_id,
                                                  sample_id=1234, for_s=50)])
    watchdog.rank_waiting(0, 59)
    assert watchdog.check(dispatcher) is None  # under the bound: nothing said
    clock.now += 2
    watchdog.rank_waiting(0, 61)
    stall = watchdog.check(dispatcher)
    assert stall is not None and stall.has_work and stall.rank == 0 and round(stall.waited_s) == 61
    assert stall.line.startswith(f"rank 0 has waited 61 s for its next batch: unit {unit.unit_id} is held by "
                                 f"h0/p0.1, transforming sample 1234 for 52 s; ")
    assert stall.line.endswith("more pending")
    assert [(h.host_id, h.worker_id, h.phase, h.sample_id) for h in stall.holders] == [
        ("h0", "h0/p0.1", "transforming", 1234)]


def test_a_pending_unit_that_nobody_leases_is_named_with_the_live_hosts(manifest):
    clock = Clock()
    dispatcher, watchdog = _job(manifest, clock)
    watchdog.rank_waiting(0, 70)
    stall = watchdog.check(dispatcher)
    assert stall is not None and stall.has_work and not stall.holders
    assert stall.line == ("rank 0 has waited 70 s for its next batch: its next unit 0 is pending and no worker "
                          "process has leased it (0 worker hosts alive)")


def test_a_rank_with_nothing_left_to_receive_waits_for_the_other_ranks_and_that_is_no_data_stall(manifest):
    clock = Clock()
    dispatcher, watchdog = _job(manifest, clock)
    while (unit := dispatcher.lease("h0", "h0/p0.1")) is not None:
        dispatcher.ack(unit.unit_id)
    watchdog.rank_waiting(0, 400)
    stall = watchdog.check(dispatcher)
    assert stall is not None and not stall.has_work and "it waits for the other ranks" in stall.line


def test_a_wait_counts_from_the_dispatchers_start_at_the_earliest_and_a_silent_rank_is_left_out(manifest):
    clock = Clock()
    dispatcher, watchdog = _job(manifest, clock)
    watchdog.rank_waiting(0, 5000)  # it waited through a dispatcher restart: not this dispatcher's stall
    assert watchdog.waited() == {0: 1000.0}
    clock.now += 31
    assert watchdog.waited() == {}  # not heard from for 30 s: the rank is gone, another line says so
    watchdog.rank_waiting(0, 0)
    assert watchdog.check(dispatcher) is None


def test_a_process_its_daemon_no_longer_names_is_unknown(manifest):
    clock = Clock()
    dispatcher, watchdog = _job(manifest, clock)
    dispatcher.lease("h0", "h0/p0.1")
    watchdog.heard_host("h0", [pb.ProcessActivity(worker_id="h0/p0.1", phase="sending", unit_id=0, sample_id=-1)])
    watchdog.heard_host("h0", [])  # the process died; its daemon's next heartbeat does not name it
    clock.now += 100
    watchdog.rank_waiting(0, 100)
    assert "h0/p0.1, unknown for 0 s" in watchdog.check(dispatcher).line


@pytest.mark.parametrize("report, timeout", [(0, 300), (300, 300), (400, 300), (10, -1)])
def test_bounds_that_cannot_work_are_refused(report, timeout):
    with pytest.raises(ValueError):
        StallBounds(report, timeout)
    assert StallBounds(60, 0).fail_s == 0  # 0: wait for ever


def test_the_defaults_users_run_with_are_the_documented_ones():
    from stoker.accel.consumer_config import ConsumerConfig
    from stoker.accel.control.dispatch_config import DispatchConfig

    assert StallBounds() == StallBounds(report_s=60.0, fail_s=300.0)
    for config in (ConsumerConfig(), DispatchConfig()):
        assert (config.stall_report_s, config.stall_timeout_s) == (60.0, 300.0)
