"""stoker/accel/control/remote.py: a rank's link to a dispatcher in another process. Its traffic with a live
dispatcher: tests/integration/test_dispatch.py and test_data_parallel.py; here, a dispatcher gone."""

from __future__ import annotations

import asyncio
import threading
import time

import zmq.asyncio

from stoker.accel.control.failures import DISPATCHER_GONE, failure_kind
from stoker.accel.control.remote import RemoteDispatcher
from stoker.protos import stoker_pb2 as pb
from tests.helpers import free_port


def _silent_call(give_up_s: float, wait_s: float) -> tuple[list[str], float]:
    """Ack through a link whose dispatcher is gone (nobody listens); stop after `wait_s`: the failures it
    reported, and when the first came."""
    link = RemoteDispatcher(f"tcp://127.0.0.1:{free_port()}", "rank1-test", 4, None, rank=1, world_size=2,
                            give_up_s=give_up_s)
    failures: list[str] = []
    first: list[float] = []
    stop = threading.Event()
    link.on_failure = lambda reason: (failures.append(reason), first.append(time.monotonic()))

    async def run() -> None:
        link._ctx = zmq.asyncio.Context()
        link._lock = asyncio.Lock()
        asyncio.get_running_loop().call_later(wait_s, stop.set)
        try:
            assert await link.call(pb.ControlRequest(ack=pb.Ack()), stop, reply_timeout_s=0.2) is None
        finally:
            link._ctx.destroy(0)

    started = time.monotonic()
    asyncio.run(run())
    return failures, (first[0] - started if first else -1.0)


def test_a_rank_whose_dispatcher_is_gone_fails_the_job_once_after_the_stall_timeout():
    """Rank 0 killed: only the dispatcher watched for stalls, so the other ranks waited for ever."""
    failures, after_s = _silent_call(give_up_s=1.0, wait_s=3.0)
    assert len(failures) == 1 and 1.0 <= after_s < 2.5
    assert "has not answered for 1 s (--stall-timeout 1 s): rank 0 or the `stoker dispatch` process is gone" \
        in failures[0] and "from its last checkpoint" in failures[0]
    assert failure_kind(failures[0]) == DISPATCHER_GONE


def test_with_no_stall_timeout_a_rank_waits_for_its_dispatcher_to_come_back():
    failures, _ = _silent_call(give_up_s=0.0, wait_s=1.5)
    assert failures == []
