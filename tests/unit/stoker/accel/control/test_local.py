"""stoker/accel/control/local.py: rank 0's dispatcher as its DispatcherLink (served for real: tests/integration)."""

from __future__ import annotations

import asyncio
import threading

import zmq.asyncio

from stoker.accel.control.dispatcher import Dispatcher
from stoker.accel.control.local import Closing, ControlSocket, InProcessDispatcher
from stoker.accel.control.metrics import ControlMetrics
from stoker.accel.control.progress import RankPositions
from stoker.accel.control.serving.server import AccessPolicy
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.store.shards import Manifest, ShardInfo
from stoker.protos import stoker_pb2 as pb
from stoker.protos.leases import LeaseSigner


def _link(world_size: int = 1) -> InProcessDispatcher:
    manifest = Manifest(kind="imagenet", classes=["a"], shards=[ShardInfo("s0", 100, 1, "", 0)])
    plan = EpochPlan(manifest, 32, 1, 0, world_size)
    return InProcessDispatcher(Dispatcher(plan), ControlSocket("tcp://127.0.0.1:0", None, None, AccessPolicy(False)),
                               lambda data: pb.JobSpec(data_endpoint=data), ControlMetrics(), LeaseSigner.new("j"),
                               "rank0", Closing(rank_wait_s=60.0, linger_s=3.0))


def test_acks_and_questions_go_straight_to_the_dispatcher():
    link = _link(world_size=2)
    unit = link.dispatcher.plan.rank_units(0, 0)[0]
    assert link.ack(unit.unit_id, 2) and not link.ack(unit.unit_id, 2)
    assert link.stats().done == 1 and link.total_units == link.dispatcher.total_units
    assert asyncio.run(link.epoch_steps(0, 0, 5, threading.Event())) is None  # rank 1 has not reported
    assert asyncio.run(link.epoch_steps(0, 1, 4, threading.Event())) == 5
    where = asyncio.run(link.position(0, 2, threading.Event()))
    assert where is not None and where.ranks == [(1, 0), (0, 2)] and where.unsure == [1]  # rank 1's count not come
    link.counted(link.dispatcher.plan.rank_units(0, 1)[0].unit_id, 3)  # its first batch says it sends 3
    assert asyncio.run(link.position(0, 2, threading.Event())) == RankPositions([(1, 0), (0, 2)], [])


def test_it_binds_the_control_socket_attaches_rank_zero_and_waits_for_the_ranks_before_closing():
    link = _link(world_size=2)
    assert list(link.close_waits(stream_done=True)) == []  # never served: nothing to wait for
    ctx = zmq.asyncio.Context()
    try:
        tasks = link.open(ctx, "tcp://127.0.0.1:7", lambda reason: None, threading.Event(), lambda: 0.0)
        for task in tasks:
            task.close()  # not run here
        assert link.control_endpoint.startswith("tcp://127.0.0.1:")
        assert link.dispatcher.liveness.endpoint(0) == "tcp://127.0.0.1:7"
        waits = list(link.close_waits(stream_done=True))
        assert [w.seconds for w in waits] == [60.0] and waits[0].waiting()  # the job is not finished
    finally:
        link.close()
        ctx.destroy(linger=0)  # and the control socket's monitor, which the unrun tasks would have closed
