"""stoker/pipeline/job_wire.py: the job survives the wire exactly; a field the sender left out takes the default."""

from __future__ import annotations

from dataclasses import fields

import pytest

from stoker.pipeline.images.layout import DecodeOn
from stoker.pipeline.job import JOB_DEFAULTS, JobConfig
from stoker.pipeline.job_wire import job_from_proto, job_identity, job_to_proto
from stoker.pipeline.text.examples import TextConfig
from stoker.protos import stoker_pb2 as pb
from stoker.protos.errors import ConfigError, PeerError


def test_a_job_survives_the_wire_exactly():
    job = JobConfig(manifest_uri="s3://b/m.json", dataset="wikipedia", epochs=3, batch_size=7, seed=11,
                    text=TextConfig(seq_len=512, pack=True, pack_max_sequences=6), world_size=4, checksum=True)
    spec = job_to_proto(job, "tcp://h:1")
    assert spec.data_endpoint == "tcp://h:1"
    assert job_from_proto(spec) == job
    decoded_there = JobConfig(manifest_uri="m", decode_on=DecodeOn.ACCELERATOR)
    assert job_to_proto(decoded_there).decode_on == "accelerator"
    assert job_from_proto(job_to_proto(decoded_there)).decode_on is DecodeOn.ACCELERATOR
    keeps_corrupt = JobConfig(manifest_uri="m", corrupt_jpegs="keep")  # the workers must hear it to honour it
    assert job_to_proto(keeps_corrupt).corrupt_jpegs == "keep" and job_from_proto(job_to_proto(keeps_corrupt)) == \
        keeps_corrupt
    assert job_from_proto(pb.JobSpec(manifest_uri="m")).corrupt_jpegs == "skip"  # an older sender's: the default


def test_a_zero_the_sender_set_stays_zero_and_a_field_it_left_out_takes_the_default():
    job = JobConfig(manifest_uri="m", dataset="wikipedia", text=TextConfig(short_seq_prob=0.0))
    assert job_from_proto(job_to_proto(job)).text.short_seq_prob == 0.0  # a proto3 zero would read as unset
    bare = job_from_proto(pb.JobSpec(job_id="j", manifest_uri="m"))  # an older sender: most fields absent
    unpinned = {name: value for name, value in JOB_DEFAULTS.items() if name != "transform_version"}
    assert {name: getattr(bare, name) for name in unpinned} == unpinned
    assert not bare.pinned  # no pin sent: a worker runs what it imports, a rank serving it pins its own
    assert bare.pin().transform_version.startswith("stoker ")
    assert bare.job_id == "j"


def test_every_field_of_the_job_has_a_wire_field_of_its_name():
    for config, message in ((JobConfig, pb.JobSpec), (TextConfig, pb.TextSpec)):
        assert {f.name for f in fields(config)} <= set(message.DESCRIPTOR.fields_by_name)


def test_a_job_from_the_wire_that_cannot_hold_is_the_peers_error_in_the_jobs_own_words():
    spec = job_to_proto(JobConfig(manifest_uri="m"))
    spec.corrupt_jpegs = "sometimes"
    with pytest.raises(PeerError) as raised:
        job_from_proto(spec)
    assert not isinstance(raised.value, ConfigError) and "corrupt" in str(raised.value)


def test_a_jobs_identity_names_what_decides_its_samples_bytes_by_kind():
    """Another crop size is another image job; another sequence length another text job; the text settings
    are no part of an image job's identity, nor the crop of a text job's."""
    images = job_identity(JobConfig(manifest_uri="m", image_size=160, world_size=2))
    assert images["image_size"] == 160 and images["world_size"] == 2 and "text" not in images
    assert images != job_identity(JobConfig(manifest_uri="m", image_size=192, world_size=2))
    text = job_identity(JobConfig(manifest_uri="m", dataset="wikipedia", text=TextConfig(seq_len=128)))
    assert text["text"]["seq_len"] == 128 and "image_size" not in text
    assert text != job_identity(JobConfig(manifest_uri="m", dataset="wikipedia", text=TextConfig(seq_len=512)))
