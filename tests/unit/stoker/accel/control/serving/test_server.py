"""Hostile input to the dispatcher's control socket: never an exception, never a lost unit, bounded memory."""

from __future__ import annotations

import os
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.accel.control.dispatcher import Dispatcher
from stoker.accel.control.journal import Journal, replay
from stoker.accel.control.serving.server import REPLY_CACHE_PEERS, AccessPolicy, ControlServer
from stoker.accel.metrics import ConsumerMetrics
from stoker.accel.receiver import MAX_SENDERS
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.store.shards import Manifest, ShardInfo
from stoker.protos import stoker_pb2 as pb
from tests.unit.stoker.accel.test_receiver import JOB, SIGNER, RecordingSocket, hello, make_receiver

SECRET = b"s" * 64
MANIFEST = Manifest(kind="imagenet", classes=["a"],
                    shards=[ShardInfo("s0", 100, 1, "", 0), ShardInfo("s1", 60, 1, "", 100)])


IN_PROCESS = AccessPolicy(keyed=False)


def make_server(access: AccessPolicy = IN_PROCESS) -> tuple[ControlServer, RecordingSocket]:
    sock = RecordingSocket()
    dispatcher = Dispatcher(EpochPlan(MANIFEST, 16, 2, 0), host_timeout_s=5.0)
    dispatcher.attach_rank(0, "tcp://127.0.0.1:1")
    return ControlServer(sock, dispatcher, pb.JobSpec(job_id=JOB), ConsumerMetrics(), SIGNER, access), sock


hosts = st.sampled_from(["h0", "h1", "h2", "", "x" * 300])
requests = st.one_of(
    st.builds(lambda h, p: pb.ControlRequest(register=pb.Register(host_id=h, procs=p)), hosts, st.integers(0, 99)),
    st.builds(lambda h: pb.ControlRequest(heartbeat=pb.Heartbeat(host_id=h)), hosts),
    st.builds(lambda h, w: pb.ControlRequest(lease=pb.LeaseRequest(host_id=h, worker_id=w)), hosts,
              st.sampled_from(["w0", "w1", "w" * 400])),
    st.builds(lambda h, ws, r: pb.ControlRequest(release=pb.Release(host_id=h, worker_ids=ws, reason=r)), hosts,
              st.lists(st.sampled_from(["w0", "w1"]), max_size=2), st.sampled_from(["crash", ""])),
    st.builds(lambda ids, secret: pb.ControlRequest(ack=pb.Ack(unit_ids=ids), job_credential=secret),
              st.lists(st.integers(0, 40), max_size=5), st.sampled_from([b"", b"guess", SECRET])),
    st.builds(lambda secret: pb.ControlRequest(attach=pb.Attach(consumer_id="c"), job_credential=secret),
              st.sampled_from([b"", SECRET])),
    st.just(pb.ControlRequest()),
)
messages = st.one_of(
    st.builds(lambda r, i, peer: [peer, r.SerializeToString()] if not setattr(r, "request_id", i) else [],
              requests, st.integers(0, 5), st.sampled_from([b"peer", b"other"])),
    st.lists(st.binary(max_size=40), min_size=1, max_size=4).map(lambda frames: [b"peer", *frames]),
)


@settings(max_examples=400, deadline=None)
@given(batch=st.lists(messages, min_size=1, max_size=30), remote=st.booleans())
def test_malformed_and_hostile_control_traffic_keeps_the_books_straight(batch, remote):
    server, sock = make_server(AccessPolicy(keyed=False, consumer_secret=SECRET, remote_consumers=remote))
    total = server.dispatcher.total_units
    acked_by = set()
    for frames in batch:
        done_before = server.dispatcher.stats().done
        server.handle(frames)
        stats = server.dispatcher.stats()
        assert stats.pending + stats.leased + stats.done == total  # every unit in exactly one place
        if stats.done > done_before:
            request = pb.ControlRequest()
            request.ParseFromString(frames[1])
            acked_by.add(request.job_credential)
    assert acked_by <= ({SECRET} if remote else set())  # only the job's consumer ever completed a unit
    answered = len(sock.sent)
    dropped = sum(server.dropped.values())
    refused = server.dropped.get("not_consumer", 0) + server.dropped.get("not_worker", 0)
    assert answered + dropped - refused == len(batch)  # answered, dropped and counted, or refused with a reason


class DiscardingSocket:
    def send_multipart(self, frames, flags=0):
        return None


def test_floods_of_new_identities_do_not_grow_memory():
    server, _ = make_server()
    receiver, _ = make_receiver()
    server.socket = receiver.socket = DiscardingSocket()  # keep only what Stoker itself keeps
    leased = hello()  # a real lease, replayed from new identities: one slot, however many
    forged = hello(token=SIGNER.token(0, "h0", "nobody"))
    heartbeat = pb.ControlRequest(request_id=1, heartbeat=pb.Heartbeat(host_id="h0")).SerializeToString()
    tracemalloc.start()
    for i in range(2 * REPLY_CACHE_PEERS):  # warm up to the caps
        server.handle([b"id%d" % i, heartbeat])
        receiver.handle([b"id%d" % i, leased if i % 2 else forged])
    settled = tracemalloc.get_traced_memory()[0]
    for i in range(2 * REPLY_CACHE_PEERS, 6 * REPLY_CACHE_PEERS):
        server.handle([b"id%d" % i, heartbeat])
        receiver.handle([b"id%d" % i, leased if i % 2 else forged])
    grown = tracemalloc.get_traced_memory()[0] - settled
    tracemalloc.stop()
    assert len(server.replies) <= REPLY_CACHE_PEERS and len(receiver.peers) == 1 < MAX_SENDERS
    assert receiver.dropped["not_leaseholder"] == 3 * REPLY_CACHE_PEERS
    assert grown < 2 << 20, f"{grown} bytes more after another {4 * REPLY_CACHE_PEERS} identities"




def test_a_batch_of_requests_is_journaled_with_one_fsync_before_any_answer_leaves(tmp_path, monkeypatch):
    """Group commit: answers wait for the journal's sync, and one sync serves the whole batch;
    the metrics show the group's size, the compactions and the journal's size."""
    events: list[str] = []
    sock = RecordingSocket()
    sock.send_multipart = lambda frames, flags=0: events.append("send")
    journal = Journal(tmp_path / "j", {"job": JOB}, b"k" * 32)
    dispatcher = Dispatcher(EpochPlan(MANIFEST, 16, 2, 0), host_timeout_s=5.0, journal=journal)
    dispatcher.attach_rank(0, "tcp://127.0.0.1:1")
    server = ControlServer(sock, dispatcher, pb.JobSpec(job_id=JOB), ConsumerMetrics(), SIGNER, IN_PROCESS)
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    leases = [[f"w{i}".encode(), pb.ControlRequest(request_id=1, lease=pb.LeaseRequest(
        host_id="h0", worker_id=f"w{i}")).SerializeToString()] for i in range(8)]
    server.handle_all(leases)
    assert events == ["fsync"] + ["send"] * 8
    assert len(replay(tmp_path / "j").leases) == 8  # what was answered is on disk
    metric = server.metrics.registry.get_sample_value
    assert metric("stoker_dispatcher_journal_group_requests_count") == 1
    assert metric("stoker_dispatcher_journal_group_requests_sum") == 8
    for unit in dispatcher.plan.units(0):  # epoch 0 done: the journal is compacted to a snapshot
        dispatcher.ack(unit.unit_id)
    server.update_gauges()
    assert metric("stoker_dispatcher_journal_compactions_total") == 1
    assert metric("stoker_dispatcher_journal_bytes") == (tmp_path / "j").stat().st_size


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _connected_server():
    """A ControlServer on the service's own ROUTER (handover included: a bare one may leave a
    reconnected client's message unrouted under load), its monitor, and a fake clock."""
    import zmq

    from stoker.accel.control.serving.server import control_router

    ctx = zmq.Context()
    router, monitor = control_router(ctx, None)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    clock = _Clock()
    dispatcher = Dispatcher(EpochPlan(MANIFEST, 16, 2, 0), host_timeout_s=60.0, clock=clock)
    dispatcher.attach_rank(0, "tcp://127.0.0.1:1")
    server = ControlServer(router, dispatcher, pb.JobSpec(job_id=JOB), ConsumerMetrics(), SIGNER, IN_PROCESS)
    return ctx, router, monitor, f"tcp://127.0.0.1:{port}", server, clock


def _lease_from(ctx, endpoint: str, router, server, worker: str):
    import zmq

    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt_string(zmq.IDENTITY, worker)
    dealer.connect(endpoint)
    dealer.send(pb.ControlRequest(request_id=1, lease=pb.LeaseRequest(host_id="h", worker_id=worker))
                .SerializeToString())
    assert router.poll(5000)
    server.handle(router.recv_multipart(copy=False))
    assert dealer.poll(5000)
    reply = pb.ControlReply.FromString(dealer.recv())
    assert reply.WhichOneof("kind") == "unit"
    return dealer, reply.unit.unit_id


def _closed_events(monitor, server, count: int) -> None:
    """Hand the server the next `count` closed connections, each waited for (not a quiet spell)."""
    from zmq.utils.monitor import recv_monitor_message

    for _ in range(count):
        assert monitor.poll(5000), "a closed connection was never reported"
        server.connection_event(recv_monitor_message(monitor))


def test_a_worker_whose_connection_closes_loses_its_units_after_the_grace_and_one_that_comes_back_does_not():
    import zmq

    from stoker.accel.control.serving.server import CLOSE_GRACE_S

    ctx, router, monitor, endpoint, server, clock = _connected_server()
    try:
        gone, unit = _lease_from(ctx, endpoint, router, server, "h/p0.1")
        back, other = _lease_from(ctx, endpoint, router, server, "h/p1.1")
        gone.close(0)
        back.close(0)
        _closed_events(monitor, server, 2)
        again = ctx.socket(zmq.DEALER)  # p1 reconnects (a client that timed out does) and speaks at once
        again.setsockopt_string(zmq.IDENTITY, "h/p1.1")
        again.connect(endpoint)
        again.send(pb.ControlRequest(request_id=2, heartbeat=pb.Heartbeat(host_id="h")).SerializeToString())
        assert router.poll(5000)
        server.handle(router.recv_multipart(copy=False))
        clock.now += CLOSE_GRACE_S / 2
        server.tick()
        assert server.dispatcher.stats().releases == 0  # within the grace: nobody loses anything yet
        clock.now += CLOSE_GRACE_S
        server.tick()
        assert server.dispatcher.stats().releases == 1  # p0's unit only: p1 is back
        assert server.dispatcher.lease("h2", "w").unit_id == unit
        assert server.dispatcher.lease("h2", "w2").unit_id != other
        again.close(0)
    finally:
        monitor.close(0)
        router.close(0)
        ctx.term()


def test_a_message_read_after_its_connection_closed_does_not_save_the_units():
    """The dying worker's last request was still queued when its connection closed: it is read after
    the close event, and must not count as the worker coming back."""
    ctx, router, monitor, endpoint, server, clock = _connected_server()
    try:
        dealer, unit = _lease_from(ctx, endpoint, router, server, "h/p0.1")
        dealer.send(pb.ControlRequest(request_id=3, heartbeat=pb.Heartbeat(host_id="h")).SerializeToString())
        assert router.poll(5000)
        queued = router.recv_multipart(copy=False)
        dealer.close(0)
        _closed_events(monitor, server, 1)
        server.handle(queued)
        clock.now += 2.0
        server.tick()
        assert server.dispatcher.stats().releases == 1
        assert server.dispatcher.lease("h2", "w").unit_id == unit
    finally:
        monitor.close(0)
        router.close(0)
        ctx.term()


def test_a_host_that_registers_again_gets_its_earlier_leases_put_back():
    """A daemon that left the job (or restarted) and registers again runs new processes under the
    same worker ids; what a restarted dispatcher's journal says those ids hold, nobody holds."""
    server, sock = make_server()
    d = server.dispatcher
    held = d.lease("h0", "h0/p0.1").unit_id
    other = d.lease("h1", "h1/p0.1").unit_id
    server.handle_all([[b"h0", pb.ControlRequest(request_id=1, register=pb.Register(host_id="h0", procs=1))
                        .SerializeToString()]])
    assert d.stats().releases == 1
    assert d.lease("h0", "h0/p0.1").unit_id == held  # back at its place: the next one handed out
    assert d.lease("h2", "h2/p0.1").unit_id != other  # h1's lease is still h1's


def _answer(server: ControlServer, sock: RecordingSocket, request: pb.ControlRequest, peer: bytes = b"p"):
    request.request_id = len(sock.sent) + 1
    server.handle([peer, request.SerializeToString()])
    reply = pb.ControlReply()
    reply.ParseFromString(sock.sent[-1][1])
    return reply


def test_a_daemon_of_an_earlier_run_of_the_same_job_is_told_to_register_again():
    """A job resumed in place keeps its job id; its new dispatcher's run id tells apart what a daemon
    still holds from the run before: its heartbeat and its processes' leases are answered OtherJob
    (naming the new run), and their releases release nothing of the new run's units."""
    server, sock = make_server()
    registered = _answer(server, sock, pb.ControlRequest(register=pb.Register(host_id="h0", procs=1)))
    run = registered.registered.run_id
    assert len(run) >= 16 and run != make_server()[0].run_id  # a new dispatcher is a new run
    lease = _answer(server, sock, pb.ControlRequest(lease=pb.LeaseRequest(
        host_id="h0", worker_id="h0/p0.2", job_id=JOB, run_id=run)))
    assert lease.WhichOneof("kind") == "unit"
    for request in (pb.ControlRequest(heartbeat=pb.Heartbeat(host_id="h0", job_id=JOB, run_id="earlier")),
                    pb.ControlRequest(lease=pb.LeaseRequest(host_id="h0", worker_id="h0/p0.1", job_id=JOB,
                                                            run_id="earlier"))):
        reply = _answer(server, sock, request)
        assert reply.WhichOneof("kind") == "other_job" and reply.other_job.run_id == run
    stale = _answer(server, sock, pb.ControlRequest(release=pb.Release(
        host_id="h0", worker_ids=["h0/p0.2"], reason="process exit", run_id="earlier")))
    assert stale.WhichOneof("kind") == "other_job" and server.dispatcher.stats().leased == 1
    beat = _answer(server, sock, pb.ControlRequest(heartbeat=pb.Heartbeat(host_id="h0", job_id=JOB, run_id=run)))
    assert beat.WhichOneof("kind") == "ok"


def test_a_fleet_s_request_sent_to_the_dispatcher_is_counted_and_answered_with_what_this_is():
    server, sock = make_server()
    beat = pb.FleetRequest(request_id=1, fleet_job=pb.FleetJob(job_id="j", endpoint="tcp://127.0.0.1:1", weight=1.0))
    host = pb.FleetRequest(request_id=2, fleet_host=pb.FleetHost(host_id="h0", procs=2))
    for request in (beat, host):
        server.handle([b"p", request.SerializeToString()])
    assert server.dropped.get("misdirected") == 2 and server.dispatcher.stats().hosts_alive == 0
    answers = [pb.FleetReply.FromString(frames[-1]) for frames in sock.sent]  # as the fleet's client reads them
    assert [a.request_id for a in answers] == [1, 2]
    assert all("dispatcher, not a fleet (stoker fleet)" in a.error.message for a in answers)


def test_a_name_that_could_forge_a_log_line_is_dropped():
    server, sock = make_server()
    for host in ("h0\n2026-12-03 dispatcher INFO host h9 registered", "h0\x1b[2K"):
        request = pb.ControlRequest(request_id=1, register=pb.Register(host_id=host, procs=1))
        server.handle([b"p", request.SerializeToString()])
    assert server.dropped.get("bad_header") == 2 and not sock.sent


def test_a_second_daemon_of_a_live_host_id_is_refused_until_the_first_falls_silent():
    server, sock = make_server()
    now = [100.0]
    server.dispatcher.clock = lambda: now[0]
    register = pb.ControlRequest(register=pb.Register(host_id="h0", procs=1))
    assert _answer(server, sock, register, peer=b"h0/daemon.a").WhichOneof("kind") == "registered"
    now[0] += 1.0
    refused = _answer(server, sock, register, peer=b"h0/daemon.b")
    assert refused.WhichOneof("kind") == "error" and "host id h0 is in use by a live daemon" in refused.error.message
    beat = _answer(server, sock, pb.ControlRequest(heartbeat=pb.Heartbeat(host_id="h0")), peer=b"h0/daemon.b")
    assert beat.WhichOneof("kind") == "error"  # its heartbeats do not keep the host alive either
    assert _answer(server, sock, pb.ControlRequest(heartbeat=pb.Heartbeat(host_id="h0")),
                   peer=b"h0/daemon.a").WhichOneof("kind") == "ok"  # the first goes on
    now[0] += 3.5  # the first died (a restart): silent for three heartbeats
    assert _answer(server, sock, register, peer=b"h0/daemon.b").WhichOneof("kind") == "registered"


def test_every_control_request_of_the_proto_has_one_handler_that_says_who_may_send_it():
    """stoker/protos/stoker.proto's ControlRequest oneof and the server's handlers agree, both ways: a new kind of
    request cannot be added without saying who may send it, and no handler answers a kind that is gone."""
    from stoker.accel.control.serving.server import HANDLERS
    from stoker.protos import stoker_pb2 as pb
    from stoker.protos.curve import CONSUMER, WORKER

    kinds = {f.name for f in pb.ControlRequest.DESCRIPTOR.oneofs_by_name["kind"].fields}
    assert set(HANDLERS) == kinds
    assert {kind for kind, h in HANDLERS.items() if h.role == WORKER} == {"register", "heartbeat", "lease", "release",
                                                                           "refuse", "hung", "poison"}
    assert all(h.role in (WORKER, CONSUMER) for h in HANDLERS.values())
    assert all(h.role == CONSUMER for h in HANDLERS.values() if h.attached)  # only a consumer attaches
