"""Strangers on the sockets: they cannot end the job, replace its data, or lock workers out.

Each test starts a real consumer (dispatcher in-process) and real `stoker worker` daemons, and
attacks it from this process over real ZeroMQ sockets, the way a process that is not one of
Stoker's workers (or a worker key that is not the consumer's) would.
"""

from __future__ import annotations

import time

import zmq

from stoker.accel.consumer import Consumer, ConsumerConfig
from stoker.accel.stepping import given
from stoker.pipeline.job import JobConfig
from stoker.protos import stoker_pb2 as pb
from stoker.protos.curve import ClientKeys, add_key, init_keys
from tests.helpers import Daemon, assert_exactly_once, scrape, wait_for
from tests.strangers import PixelAudit, call, data_replies, dealer, zero_batch

IMAGE = 32


def _consumer(manifest, accel, keys=None, **cfg) -> Consumer:
    config = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=0,
                            keys=keys, **cfg)
    job = JobConfig(manifest_uri=manifest.uri, epochs=2, batch_size=16, unit_batches=2, image_size=IMAGE)
    return Consumer(config, job, given(accel))


def _attack(consumer: Consumer, curve: ClientKeys | None = None) -> dict[str, int]:
    """Try to end the job and to poison it; returns what the consumer answered, by kind."""
    seen: dict[str, int] = {}
    ctx = zmq.Context()
    try:
        control = dealer(ctx, consumer.control_endpoint, curve)
        registered = call(control, pb.ControlRequest(register=pb.Register(host_id="mallory", procs=1)), 1)
        assert registered.WhichOneof("kind") == "registered"  # a worker's answer: the job spec, no credential
        job = registered.registered.job
        for i, request in enumerate([
            pb.ControlRequest(attach=pb.Attach(consumer_id="mallory")),
            pb.ControlRequest(ack=pb.Ack(unit_ids=list(range(200)))),
            pb.ControlRequest(ack=pb.Ack(unit_ids=list(range(200))), job_credential=b"0" * 64),
        ], start=2):
            kind = call(control, request, i).WhichOneof("kind")
            seen[kind] = seen.get(kind, 0) + 1
        lease = call(control, pb.ControlRequest(lease=pb.LeaseRequest(host_id="mallory", worker_id="mallory/p0")), 9)
        mine = lease.unit
        data = dealer(ctx, consumer.data_endpoint, curve)
        data.send(pb.DataMessage(hello=pb.Hello(worker_id="mallory/p0", job_id=job.job_id, host_id="mallory",
                                                unit_id=mine.unit_id, lease_token=mine.lease_token))
                  .SerializeToString())
        granted = data_replies(data, 2.0)
        assert granted and granted[0].WhichOneof("kind") == "credit"  # a real lease gets a real slot ...
        for unit in consumer.plan.units(0) + consumer.plan.units(1):
            if unit.unit_id == mine.unit_id:
                continue
            ids = unit.sample_ids().tolist()
            target = pb.WorkUnit(unit_id=unit.unit_id, epoch=unit.epoch)
            # ... but only for its own unit: black images and an empty "last" batch for every other unit
            data.send_multipart(zero_batch(job.job_id, "mallory/p0", target, ids, IMAGE, True, mine.lease_token))
            data.send_multipart(zero_batch(job.job_id, "mallory/p0", target, [], IMAGE, True, b"\x00" * 16, 1))
            data_replies(data, 0.01)
        data_replies(data, 0.5)
        call(control, pb.ControlRequest(release=pb.Release(host_id="mallory", reason="leaving")), 10)
    finally:
        ctx.destroy(linger=0)
    return seen


def test_a_stranger_without_keys_cannot_end_the_job_or_replace_its_data(manifest, log_dir):
    audit = PixelAudit()
    consumer = _consumer(manifest, audit)
    consumer.start()
    try:
        answers = _attack(consumer)
        assert answers == {"error": 3}  # attach and both acks refused, with the reason
        assert not consumer.dispatcher.finished and consumer.dispatcher.stats().done == 0
        daemons = [Daemon(consumer.control_endpoint, f"host{i}", 1, log_dir) for i in range(2)]
        summary = consumer.run()
        assert [d.wait(timeout=30) for d in daemons] == [0, 0], "\n".join(d.output()[-2000:] for d in daemons)
        metrics = scrape(consumer.metrics_port)
    finally:
        consumer.stop()
    assert_exactly_once(summary, manifest.num_samples, 2)
    assert audit.black == [] and audit.stepped == 2 * manifest.num_samples  # every image stepped was a real one
    # mallory registered and leased, but delivered nothing; the real hosts delivered every row
    # (one of them may have made every unit before the other got one: decoding is quick here)
    rows_by_host = {key: value for key, value in metrics.items() if key.startswith("stoker_consumer_host_rows_total")}
    assert not any("host=mallory" in key for key in rows_by_host), rows_by_host
    assert sum(rows_by_host.values()) >= 2 * manifest.num_samples and 1 <= summary.hosts <= 2
    assert metrics["stoker_dispatcher_messages_dropped_total{reason=not_consumer}"] == 3
    assert summary.frames_dropped["not_leaseholder"] >= 2 * (len(consumer.plan.units(0)) - 1)


def test_an_allow_listed_worker_key_cannot_act_as_the_consumer(manifest, tmp_path, log_dir):
    keys = init_keys(tmp_path / "keys")
    add_key(keys, "good")
    add_key(keys, "rogue")  # a worker key like any other: allow-listed, but a worker
    audit = PixelAudit()
    consumer = _consumer(manifest, audit, keys=str(keys))
    consumer.start()
    try:
        answers = _attack(consumer, ClientKeys.load(keys, "rogue"))
        assert answers == {"error": 3}
        good = Daemon(consumer.control_endpoint, "good", 1, log_dir, extra=("--keys", str(keys)))
        summary = consumer.run()
        assert good.wait(timeout=30) == 0, good.output()
        metrics = scrape(consumer.metrics_port)
    finally:
        consumer.stop()
    assert_exactly_once(summary, manifest.num_samples, 2)
    assert audit.black == []
    assert metrics["stoker_dispatcher_messages_dropped_total{reason=not_consumer}"] == 3
    assert summary.frames_dropped["not_leaseholder"] > 0


def test_a_flood_of_hellos_does_not_lock_out_a_worker(manifest, log_dir):
    """10,000 identities say hello and close before any worker starts; a worker that comes later finishes."""
    consumer = _consumer(manifest, PixelAudit())
    consumer.start()
    ctx = zmq.Context()
    hello = pb.DataMessage(hello=pb.Hello(worker_id="w", job_id=consumer.job.job_id)).SerializeToString()
    refused = 0
    try:
        for _ in range(20):
            socks = [dealer(ctx, consumer.data_endpoint) for _ in range(500)]
            for sock in socks:
                sock.send(hello)
            for sock in socks:
                if sock.poll(5000):
                    reply = pb.DataReply()
                    reply.ParseFromString(sock.recv())
                    refused += reply.reject.code == "not_leaseholder"
                sock.close(0)
        assert refused == 10_000  # every hello was heard, and refused
        assert len(consumer.receiver.peers) == 0
        daemon = Daemon(consumer.control_endpoint, "late", 1, log_dir)
        summary = consumer.run()
        assert daemon.wait(timeout=30) == 0, daemon.output()
    finally:
        ctx.destroy(linger=0)
        consumer.stop()
    assert_exactly_once(summary, manifest.num_samples, 2)
    assert "too_many_senders" not in summary.frames_dropped


def test_waiting_for_credit_keeps_a_slot_and_silence_loses_it(manifest, log_dir):
    """A slow consumer and a 1 s sender timeout: the real worker waits for credit far longer than
    that and keeps its slot; a leaseholder that stops answering pings loses its own."""
    from stoker.accel.backends.accelerators import SimulatedAccelerator

    consumer = _consumer(manifest, SimulatedAccelerator(rate=60), credit_window=1, sender_timeout_s=1.0,
                         host_timeout_s=3.0)
    consumer.start()
    ctx = zmq.Context()
    try:
        control = dealer(ctx, consumer.control_endpoint)
        unit = call(control, pb.ControlRequest(lease=pb.LeaseRequest(host_id="mute", worker_id="mute/p0")), 1).unit
        mute = dealer(ctx, consumer.data_endpoint)
        mute.send(pb.DataMessage(hello=pb.Hello(worker_id="mute/p0", job_id=consumer.job.job_id, host_id="mute",
                                                unit_id=unit.unit_id, lease_token=unit.lease_token))
                  .SerializeToString())
        assert wait_for(lambda: len(consumer.receiver.peers) == 1, timeout=10)
        daemon = Daemon(consumer.control_endpoint, "busy", 1, log_dir)
        started = time.monotonic()
        summary = consumer.run()  # the mute host's unit goes back after its host timeout
        assert daemon.wait(timeout=30) == 0, daemon.output()
        metrics = scrape(consumer.metrics_port)
    finally:
        ctx.destroy(linger=0)
        consumer.stop()
    assert_exactly_once(summary, manifest.num_samples, 2)
    assert time.monotonic() - started > 4  # the worker spent seconds waiting for credit ...
    assert metrics["stoker_consumer_senders_freed_total{reason=silent}"] == 1  # ... and only the mute one was freed
    assert summary.stage_seconds["wait_for_credit"] > 1.0


def test_a_leaseholders_empty_last_batch_has_its_unit_made_again_and_every_sample_trained(manifest, log_dir):
    """A stranger registers as a worker (no keys: that is allowed), leases a unit, sends an empty
    batch marked last for it and stays: the batch is dropped and counted (`short_unit`), the unit is
    leased again to a real host, and every sample of every epoch is trained; nothing is skipped."""
    audit = PixelAudit()
    consumer = _consumer(manifest, audit, host_timeout_s=120)  # the redo, not the stranger's silence
    consumer.start()
    ctx = zmq.Context()
    try:
        control = dealer(ctx, consumer.control_endpoint)
        job = call(control, pb.ControlRequest(register=pb.Register(host_id="mallory", procs=1)), 1).registered.job
        mine = call(control, pb.ControlRequest(lease=pb.LeaseRequest(host_id="mallory", worker_id="mallory/p0")),
                    2).unit
        data = dealer(ctx, consumer.data_endpoint)
        data.send(pb.DataMessage(hello=pb.Hello(worker_id="mallory/p0", job_id=job.job_id, host_id="mallory",
                                                unit_id=mine.unit_id, lease_token=mine.lease_token))
                  .SerializeToString())
        assert data_replies(data, 2.0)[0].WhichOneof("kind") == "credit"
        data.send_multipart(zero_batch(job.job_id, "mallory/p0", mine, [], IMAGE, True, mine.lease_token))
        assert wait_for(lambda: consumer.dispatcher.stats().releases == 1, timeout=10)
        daemons = [Daemon(consumer.control_endpoint, f"host{i}", 1, log_dir) for i in range(2)]
        started = time.monotonic()
        summary = consumer.run()
        assert [d.wait(timeout=30) for d in daemons] == [0, 0], "\n".join(d.output()[-2000:] for d in daemons)
    finally:
        ctx.destroy(linger=0)
        consumer.stop()
    assert time.monotonic() - started < 60  # not the stranger's host timeout (120 s)
    assert_exactly_once(summary, manifest.num_samples, 2)
    assert summary.skipped_samples == 0 and audit.stepped == 2 * manifest.num_samples
    assert summary.frames_dropped.get("short_unit") == 1 and summary.units_released == 1
