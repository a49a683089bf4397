"""Hostile input to the consumer's receiver: never an exception, never a bad batch queued."""

import queue

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from accel.job import JobConfig
from accel.ledger import Ledger
from accel.metrics import ConsumerMetrics
from accel.receiver import Receiver
from accel.schema import schema_of
from pipeline.text.examples import TextConfig
from protos import stoker_pb2 as pb

JOB = "fuzzjob"
PEER = b"peer-1"


class RecordingSocket:
    def __init__(self):
        self.sent = []

    def send_multipart(self, frames, flags=0):
        self.sent.append(frames)


IMAGE_JOB = JobConfig("unused", image_size=4)
TEXT_JOB = JobConfig("unused", dataset="wikipedia", text=TextConfig(seq_len=8, pack=True, pack_max_sequences=2))


def make_receiver(job: JobConfig = IMAGE_JOB):
    out = queue.Queue()
    receiver = Receiver(RecordingSocket(), JOB, window=2, ledger=Ledger(num_samples=50, epochs=2), out=out,
                        metrics=ConsumerMetrics(), on_unit_done=lambda unit: None, schema=schema_of(job))
    receiver.handle([PEER, pb.DataMessage(hello=pb.Hello(worker_id="w", job_id=JOB)).SerializeToString()])
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
    lambda epoch, unit, index, last, ids, specs, job, rows: pb.BatchHeader(
        job_id=job, epoch=epoch, unit_id=unit, batch_index=index, last_in_unit=last, sample_ids=ids, frames=specs,
        rows=rows),
    st.integers(0, 3), st.integers(0, 5), st.integers(0, 3), st.booleans(),
    st.lists(st.integers(-5, 60), max_size=4), st.lists(frame_specs, max_size=3), st.sampled_from([JOB, "other"]),
    st.integers(0, 4))


@settings(max_examples=1500, deadline=None)
@given(header=headers, payloads=st.lists(st.binary(max_size=64), max_size=4), raw=st.binary(max_size=64),
       as_raw=st.booleans(), peer=st.sampled_from([PEER, b"stranger"]), job=st.sampled_from([IMAGE_JOB, TEXT_JOB]))
def test_malformed_batches_are_dropped_not_raised(header, payloads, raw, as_raw, peer, job):
    receiver, out = make_receiver(job)
    first = raw if as_raw else pb.DataMessage(batch=header).SerializeToString()
    receiver.handle([peer, first, *payloads])
    while not out.empty():  # anything that got through must be a consistent batch
        batch = out.get_nowait()
        if batch.size == 0:  # an empty closing batch of a unit carries no tensors
            assert batch.tensors.parts == {}
            continue
        for name, spec in receiver.schema.tensors.items():
            array = batch.tensor(name)
            assert array.shape == (batch.size, *spec.shape) and array.dtype.str == spec.dtype
    assert sum(receiver.dropped.values()) + receiver.ledger.duplicate_batches + out.qsize() <= 1


def test_a_valid_batch_passes_and_credit_flows_back():
    receiver, out = make_receiver()
    images = np.zeros((2, 4, 4, 3), np.uint8)
    labels = np.array([1, 2], np.int32)
    header = pb.BatchHeader(job_id=JOB, epoch=0, unit_id=1, batch_index=0, last_in_unit=True, sample_ids=[3, 4],
                            rows=2)
    header.frames.add(tensor="image", dtype="|u1", shape=[2, 4, 4, 3], nbytes=images.nbytes)
    header.frames.add(tensor="label", dtype="<i4", shape=[2], nbytes=labels.nbytes)
    receiver.handle([PEER, pb.DataMessage(batch=header).SerializeToString(), images.tobytes(), labels.tobytes()])
    batch = out.get_nowait()
    assert batch.size == 2 and receiver.dropped == {}
    credits_before = len(receiver.socket.sent)
    receiver.step_done(batch)
    assert len(receiver.socket.sent) == credits_before + 1
    receiver.handle([PEER, pb.DataMessage(batch=header).SerializeToString(), images.tobytes(), labels.tobytes()])
    assert out.empty() and receiver.ledger.duplicate_samples == 2
