"""protos/job.py: the job in one shape; to_proto/from_proto are the only translation."""

from __future__ import annotations

from dataclasses import fields

import pytest

from pipeline.text.examples import TextConfig
from protos import stoker_pb2 as pb
from protos.job import JOB_DEFAULTS, JobConfig


def test_a_job_survives_the_wire_exactly():
    job = JobConfig(manifest_uri="s3://b/m.json", dataset="wikipedia", epochs=3, batch_size=7, seed=11,
                    text=TextConfig(seq_len=512, pack=True, pack_max_sequences=6), world_size=4, checksum=True)
    assert JobConfig.from_proto(job.to_proto("tcp://h:1")) == job


def test_a_zero_the_sender_set_stays_zero_and_a_field_it_left_out_takes_the_default():
    job = JobConfig(manifest_uri="m", dataset="wikipedia", text=TextConfig(short_seq_prob=0.0))
    assert JobConfig.from_proto(job.to_proto()).text.short_seq_prob == 0.0  # a proto3 zero would read as unset
    bare = JobConfig.from_proto(pb.JobSpec(job_id="j", manifest_uri="m"))  # an older sender: most fields absent
    assert {name: getattr(bare, name) for name in JOB_DEFAULTS} == JOB_DEFAULTS
    assert bare.job_id == "j"


def test_every_field_of_the_job_has_a_wire_field_of_its_name():
    for config, message in ((JobConfig, pb.JobSpec), (TextConfig, pb.TextSpec)):
        assert {f.name for f in fields(config)} <= set(message.DESCRIPTOR.fields_by_name)


def test_a_job_that_cannot_work_is_refused_when_made():
    with pytest.raises(ValueError, match="dataset must be one of imagenet, wikipedia"):
        JobConfig(manifest_uri="m", dataset="audio")
    with pytest.raises(ValueError, match="--drop-last applies to imagenet"):
        JobConfig(manifest_uri="m", dataset="wikipedia", drop_last=True)
    with pytest.raises(ValueError, match="--decode-on accelerator applies to imagenet"):
        JobConfig(manifest_uri="m", dataset="wikipedia", decode_on="accelerator")


def test_shards_of_another_kind_are_refused_with_the_fix(manifest):
    with pytest.raises(ValueError, match="holds 'imagenet' shards, not wikipedia: run with --dataset imagenet"):
        JobConfig(manifest_uri=manifest.uri, dataset="wikipedia").check_fits(manifest)
    JobConfig(manifest_uri=manifest.uri).check_fits(manifest)
