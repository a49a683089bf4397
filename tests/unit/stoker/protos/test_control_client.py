"""stoker/protos/control_client.py: a request is answered, retried under the same id when unanswered, given up
on with the reason, and never matched to a late reply of an earlier request."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from stoker.protos import stoker_pb2 as pb
from stoker.protos.control_client import ControlClient, DispatcherUnreachable
from tests.helpers import free_port


def _dispatcher(ctx, endpoint: str, answer, stop: threading.Event) -> threading.Thread:
    """A ROUTER that hands every request it gets to `answer(request, seen)`, which returns the replies to send."""
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    seen: list[pb.ControlRequest] = []

    def serve() -> None:
        try:
            while not stop.is_set():
                if router.poll(20):
                    peer, data = router.recv_multipart()
                    request = pb.ControlRequest.FromString(data)
                    seen.append(request)
                    for reply in answer(request, seen):
                        router.send_multipart([peer, reply.SerializeToString()])
        finally:
            router.close(0)

    thread = threading.Thread(target=serve, daemon=True)
    thread.seen = seen  # type: ignore[attr-defined]
    thread.start()
    return thread


def _error(request: pb.ControlRequest, message: str, request_id: int | None = None) -> pb.ControlReply:
    return pb.ControlReply(request_id=request.request_id if request_id is None else request_id,
                           error=pb.Error(message=message))


def test_an_unanswered_request_is_sent_again_under_its_id_and_a_stale_reply_is_skipped(ctx):
    endpoint, stop = f"tcp://127.0.0.1:{free_port()}", threading.Event()

    def answer(request, seen):
        if len(seen) == 1:
            return []  # the first try goes unanswered: the client times out and asks again
        return [_error(request, "stale", request.request_id - 1), _error(request, f"answer to try {len(seen)}")]

    server = _dispatcher(ctx, endpoint, answer, stop)
    try:
        client = ControlClient(ctx, endpoint, "host0/daemon", reply_timeout_s=0.3)
        reply = client.request(pb.ControlRequest(register=pb.Register(host_id="host0")), give_up_after_s=10)
        assert reply.error.message == "answer to try 2"
        # the same request every try, so answered once; on a loaded host the second answer can outlast the
        # 0.3 s wait too and a third try goes out, whose late answer the next request must skip
        assert len(server.seen) >= 2 and {r.request_id for r in server.seen} == {reply.request_id}
        next_reply = client.request(pb.ControlRequest(register=pb.Register(host_id="host0")), give_up_after_s=10)
        assert next_reply.request_id == reply.request_id + 1
        client.close()
    finally:
        stop.set()
        server.join(5)


def test_nobody_there_is_given_up_on_with_what_a_connection_meets(ctx):
    client = ControlClient(ctx, f"tcp://127.0.0.1:{free_port()}", "host0/daemon", reply_timeout_s=0.1)
    with pytest.raises(DispatcherUnreachable, match=r"no answer from the dispatcher .* for 1 s: nothing listens"):
        client.request(pb.ControlRequest(register=pb.Register(host_id="host0")), give_up_after_s=1.0)
    client.close()


def test_a_stopping_caller_is_let_go_at_once(ctx):
    client = ControlClient(ctx, f"tcp://127.0.0.1:{free_port()}", "host0/daemon")
    with pytest.raises(DispatcherUnreachable, match="stopping"):
        client.request(pb.ControlRequest(), give_up_after_s=None, should_stop=lambda: True)
    client.close()


def test_a_dispatcher_that_comes_up_late_is_asked_as_soon_as_it_listens(ctx):
    """Three clients at three phases of their 2 s back-off are all answered within a second of the
    bind: a blind sleep would keep one of them waiting well over a second."""
    endpoint, stop = f"tcp://127.0.0.1:{free_port()}", threading.Event()
    answered: dict[str, float] = {}

    def ask(name: str) -> None:
        client = ControlClient(ctx, endpoint, name, reply_timeout_s=2.0)
        client.request(pb.ControlRequest(register=pb.Register(host_id=name)), give_up_after_s=30)
        answered[name] = time.monotonic()
        client.close()

    askers = []
    for index in range(3):  # each reaches the 2 s cap after ~3 s of asking; started 0.7 s apart
        askers.append(threading.Thread(target=ask, args=(f"host{index}/daemon",), daemon=True))
        askers[-1].start()
        time.sleep(0.7)
    time.sleep(3.0)
    bound = time.monotonic()
    server = _dispatcher(ctx, endpoint, lambda request, seen: [_error(request, "welcome")], stop)
    try:
        for asker in askers:
            asker.join(10)
        assert len(answered) == 3
        assert max(answered.values()) - bound < 1.0, {name: at - bound for name, at in answered.items()}
    finally:
        stop.set()
        server.join(5)


def test_a_fleet_request_is_answered_in_the_fleet_s_envelope(ctx):
    """A FleetRequest's answer is read as a FleetReply (its kinds are no ControlReply's), a ControlRequest's as a
    ControlReply."""
    endpoint, stop = f"tcp://127.0.0.1:{free_port()}", threading.Event()

    def answer(request, seen):  # the request as a ControlRequest: a fleet's kind is an unknown field of it
        return [pb.FleetReply(request_id=request.request_id, fleet_share=pb.FleetShare(target=3))]

    server = _dispatcher(ctx, endpoint, answer, stop)
    try:
        client = ControlClient(ctx, endpoint, "job/j", reply_timeout_s=1.0, fleet=True)
        reply = client.request(pb.FleetRequest(fleet_job=pb.FleetJob(job_id="j")), give_up_after_s=10)
        assert isinstance(reply, pb.FleetReply) and reply.WhichOneof("kind") == "fleet_share"
        assert reply.fleet_share.target == 3 and server.seen[0].WhichOneof("kind") is None
        client.close()
    finally:
        stop.set()
        server.join(5)
