"""Hostile input to the consumer's receiver: never an exception, never a bad batch queued."""

import math
import queue

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.accel.ledger import Ledger
from stoker.accel.metrics import ConsumerMetrics
from stoker.accel.receiver import Receiver
from stoker.accel.schema import schema_of
from stoker.accel.stream import EpochEnd, StreamOrder
from stoker.pipeline.job import JobConfig
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.store.shards import Manifest, ShardInfo
from stoker.pipeline.text.examples import TextConfig
from stoker.protos import stoker_pb2 as pb
from stoker.protos.framing import MAX_FRAME_BYTES
from stoker.protos.leases import LeaseSigner

JOB = "fuzzjob"
PEER = b"peer-1"
HOST, WORKER = "h0", "h0/p0.1"
SIGNER = LeaseSigner(b"k" * 32, JOB)
FUZZ_MANIFEST = Manifest(kind="imagenet", classes=["a"], shards=[ShardInfo("s0", 50, 1, "", 0)])


class RecordingSocket:
    def __init__(self):
        self.sent = []

    def send_multipart(self, frames, flags=0):
        self.sent.append(frames)


IMAGE_JOB = JobConfig("unused", image_size=4)
TEXT_JOB = JobConfig("unused", dataset="wikipedia", text=TextConfig(seq_len=8, pack=True, pack_max_sequences=2))


def hello(unit_id: int = 0, worker_id: str = WORKER, token: bytes | None = None) -> bytes:
    token = SIGNER.token(unit_id, HOST, worker_id) if token is None else token
    return pb.DataMessage(hello=pb.Hello(worker_id=worker_id, job_id=JOB, host_id=HOST, unit_id=unit_id,
                                         lease_token=token)).SerializeToString()


def make_receiver(job: JobConfig = IMAGE_JOB):
    out = queue.Queue()
    plan = EpochPlan(FUZZ_MANIFEST, unit_size=8, epochs=2, seed=0)
    receiver = Receiver(RecordingSocket(), JOB, window=2, ledger=Ledger(plan), out=out, metrics=ConsumerMetrics(),
                        on_unit_done=lambda unit, batches: None, schema=schema_of(job), leases=SIGNER,
                        order=StreamOrder(plan, 0))
    receiver.handle([PEER, hello()])
    return receiver, out


def _spec(tensor: str, dtype: str, shape: list[int], slack: int) -> pb.FrameSpec:
    nbytes = min(max(0, int(np.prod(shape, dtype=object)) + slack), (1 << 64) - 1)
    return pb.FrameSpec(tensor=tensor, dtype=dtype, shape=shape, nbytes=nbytes)


frame_specs = st.builds(
    _spec,
    st.sampled_from(["image", "label", "input_ids", "next_sentence_labels", "other"]),
    st.sampled_from(["|u1", "<i4", "<f4", "|O", "<f8", "bogus"]),
    st.lists(st.integers(-2, 1 << 40), min_size=0, max_size=4),
    st.integers(-2, 2))

headers = st.builds(
    lambda epoch, unit, index, last, ids, specs, job, rows, signed: pb.BatchHeader(
        job_id=job, epoch=epoch, unit_id=unit, batch_index=index, last_in_unit=last, sample_ids=ids, frames=specs,
        rows=rows, worker_id=WORKER, lease_token=SIGNER.token(unit, HOST, WORKER) if signed else b"x" * 16),
    st.integers(0, 3), st.integers(0, 15), st.integers(0, 3), st.booleans(),
    st.lists(st.integers(-5, 60), max_size=4), st.lists(frame_specs, max_size=3), st.sampled_from([JOB, "other"]),
    st.integers(0, 4), st.booleans())


@settings(max_examples=1500, deadline=None)
@given(header=headers, payloads=st.lists(st.binary(max_size=64), max_size=4), raw=st.binary(max_size=64),
       as_raw=st.booleans(), peer=st.sampled_from([PEER, b"stranger"]), job=st.sampled_from([IMAGE_JOB, TEXT_JOB]))
def test_malformed_batches_are_dropped_not_raised(header, payloads, raw, as_raw, peer, job):
    receiver, out = make_receiver(job)
    first = raw if as_raw else pb.DataMessage(batch=header).SerializeToString()
    receiver.handle([peer, first, *payloads])
    while not out.empty():  # anything that got through must be a consistent batch
        batch = out.get_nowait()
        if isinstance(batch, EpochEnd):
            continue
        if batch.size == 0:  # an empty closing batch of a unit carries no tensors
            assert batch.tensors.parts == {}
            continue
        for name, spec in receiver.schema.tensors.items():
            array = batch.tensor(name)
            assert array.shape == (batch.size, *spec.shape) and array.dtype.str == spec.dtype
    assert sum(receiver.dropped.values()) + receiver.ledger.duplicate_batches + out.qsize() + receiver.order.held <= 2


def image_batch(unit_id: int, ids: list[int], index: int = 0, last: bool = True, worker_id: str = WORKER,
                token: bytes | None = None) -> list:
    """[header, image, label] of a 4x4 image batch of `ids`, signed for `unit_id` unless told otherwise."""
    images = np.full((len(ids), 4, 4, 3), 7, np.uint8)
    labels = np.zeros(len(ids), np.int32)
    token = SIGNER.token(unit_id, HOST, worker_id) if token is None else token
    header = pb.BatchHeader(job_id=JOB, epoch=unit_id // 7, unit_id=unit_id, batch_index=index, last_in_unit=last,
                            sample_ids=ids, rows=len(ids), worker_id=worker_id, lease_token=token)
    header.frames.add(tensor="image", dtype="|u1", shape=list(images.shape), nbytes=images.nbytes)
    header.frames.add(tensor="label", dtype="<i4", shape=[len(ids)], nbytes=labels.nbytes)
    return [pb.DataMessage(batch=header).SerializeToString(), images.tobytes(), labels.tobytes()]


def unit_ids(receiver, unit_id: int) -> list[int]:
    return receiver.ledger.plan.unit(unit_id).sample_ids().tolist()


def replies(receiver, peer: bytes) -> list[pb.DataReply]:
    out = []
    for frames in receiver.socket.sent:
        if frames[0] == peer:
            reply = pb.DataReply()
            reply.ParseFromString(frames[1])
            out.append(reply)
    return out


def test_a_valid_batch_passes_and_credit_flows_back():
    receiver, out = make_receiver()
    head = receiver.order.next_unit().unit_id
    ids = unit_ids(receiver, head)
    receiver.handle([PEER, *image_batch(head, ids)])
    batch = out.get_nowait()
    assert batch.size == len(ids) and receiver.dropped == {}
    credits_before = len(receiver.socket.sent)
    receiver.step_done(batch)
    assert len(receiver.socket.sent) == credits_before + 1
    receiver.handle([PEER, *image_batch(head, ids)])
    assert out.empty() and receiver.ledger.duplicate_samples == len(ids)


def test_batches_leave_in_plan_order_whatever_order_they_come_in():
    receiver, out = make_receiver()
    units = receiver.ledger.plan.rank_units(0, 0)
    for unit in reversed(units):
        receiver.handle([PEER, *image_batch(unit.unit_id, unit_ids(receiver, unit.unit_id))])
        if unit is not units[0]:
            assert out.empty()  # held: an earlier unit is still missing
    released = [out.get_nowait() for _ in range(out.qsize())]
    assert [b.header.unit_id for b in released[:-1]] == [u.unit_id for u in units]
    assert isinstance(released[-1], EpochEnd) and released[-1].batches == len(units)


def test_a_hello_without_a_lease_gets_no_slot():
    receiver, _ = make_receiver()
    for i, token in enumerate((b"", b"x" * 16, SIGNER.token(0, HOST, "someone-else"))):
        receiver.handle([b"stranger%d" % i, hello(token=token)])
    assert set(receiver.peers) == {PEER} and receiver.dropped == {"not_leaseholder": 3}
    assert all(r.reject.code == "not_leaseholder" for r in replies(receiver, b"stranger1"))


def test_a_batch_for_a_unit_the_sender_does_not_lease_is_dropped():
    receiver, out = make_receiver()
    ids = unit_ids(receiver, 2)
    receiver.handle([PEER, *image_batch(2, ids, token=SIGNER.token(3, HOST, WORKER))])  # unit 3's lease, unit 2's data
    receiver.handle([PEER, *image_batch(2, ids, worker_id="h0/p9.1")])  # another worker's lease
    receiver.handle([b"stranger", *image_batch(2, ids)])  # the right token, from a peer without a slot
    assert out.empty()
    assert receiver.dropped == {"not_leaseholder": 2, "unknown_peer": 1}
    assert [r.reject.code for r in replies(receiver, b"stranger")] == ["unknown_sender"]
    assert [r.reject.unit_id for r in replies(receiver, PEER) if r.HasField("reject")] == [2, 2]


def test_a_frame_over_the_size_limit_is_dropped_and_counted_with_its_reason():
    """A batch whose image frame is bigger than a frame may be (as a 3,400 px image would be) is
    dropped, counted as `frame_too_large` in the summary and on /metrics, and its credit given back."""
    receiver, out = make_receiver()
    head = receiver.order.next_unit().unit_id
    ids = unit_ids(receiver, head)[:1]
    side = math.isqrt(MAX_FRAME_BYTES // 3) + 1  # one (side, side, 3) image is over the limit
    images = np.zeros((1, side, side, 3), np.uint8)
    header = pb.BatchHeader(job_id=JOB, epoch=0, unit_id=head, rows=1, sample_ids=ids, worker_id=WORKER,
                            lease_token=SIGNER.token(head, HOST, WORKER))
    header.frames.add(tensor="image", dtype="|u1", shape=list(images.shape), nbytes=images.nbytes)
    header.frames.add(tensor="label", dtype="<i4", shape=[1], nbytes=4)
    credits = sum(r.credit.batches for r in replies(receiver, PEER))
    receiver.handle([PEER, pb.DataMessage(batch=header).SerializeToString(), images.data, b"\0" * 4])
    assert out.empty() and receiver.dropped == {"frame_too_large": 1}
    assert receiver.metrics.frames_dropped.labels(reason="frame_too_large")._value.get() == 1
    assert sum(r.credit.batches for r in replies(receiver, PEER)) == credits + 1


def test_one_slot_per_worker_process_and_silent_slots_are_freed():
    clock = [0.0]
    receiver, _ = make_receiver()
    receiver.clock = lambda: clock[0]
    receiver.sender_timeout_s = 10.0
    for i in range(50):  # the same lease from many routing ids: still one slot
        receiver.handle([b"copy%d" % i, hello()])
    assert len(receiver.peers) == 1 and receiver.freed == {"replaced": 50}
    receiver.handle([b"other", hello(worker_id="h0/p1.1")])
    clock[0] = 5.0
    receiver.sweep()  # both quiet for 5 s: pinged
    assert any(r.WhichOneof("kind") == "ping" for r in replies(receiver, b"other"))
    receiver.handle([b"other", pb.DataMessage(pong=pb.Pong()).SerializeToString()])
    clock[0] = 12.0
    receiver.sweep()  # copy49 never answered: freed; "other" answered at 5 s: kept
    assert set(receiver.peers) == {b"other"} and receiver.freed["silent"] == 1


def test_a_sender_that_goes_silent_in_the_middle_of_a_unit_has_the_unit_leased_again():
    """A frozen process (SIGSTOP, a hang in C) on a live host: its host heartbeats on, so only its
    silence says it; the unit it was making is leased again when its slot is freed, not at the
    dispatcher's lease timeout. One whose unit had all its batches here is not redone."""
    clock = [0.0]
    receiver, _ = make_receiver()
    redone: list[int] = []
    receiver.on_unit_short = redone.append
    receiver.clock = lambda: clock[0]
    receiver.sender_timeout_s = 10.0
    receiver.peers[PEER].heard = 0.0  # its hello came before the test's clock
    receiver.handle([b"done", hello(worker_id="h0/p1.1")])
    receiver.credit.senders[b"done"].unit_complete = True
    for at in (5.0, 12.0):
        clock[0] = at
        receiver.sweep()
    assert receiver.freed["silent"] == 2 and redone == [0]
