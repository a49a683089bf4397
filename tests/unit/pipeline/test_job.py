"""pipeline/job.py: the job in one shape, refused when made if it cannot work or cannot travel."""

from __future__ import annotations

import json

import pytest

from stoker.pipeline.image_layout import DecodeOn
from stoker.pipeline.job import JobConfig
from stoker.pipeline.text.examples import TextConfig


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


def test_a_job_that_cannot_travel_is_refused_naming_both_flags_and_the_fix():
    with pytest.raises(ValueError, match="--image-size 3400 with --batch-size 64 does not fit a data message .*"
                                         "the largest --image-size that fits --batch-size 64 is 2362"):
        JobConfig("m", image_size=3400)
    with pytest.raises(ValueError, match="--batch-size 1000000 does not fit"):
        JobConfig("m", dataset="wikipedia", batch_size=1_000_000, text=TextConfig())
    with pytest.raises(ValueError, match="the largest --image-size that fits --batch-size 64 is 2362"):
        JobConfig("m", image_size=4000, decode_on="accelerator")  # the consumer would make the same batch itself
    JobConfig("m", image_size=2362)


def test_where_jpegs_are_decoded_is_a_closed_choice_that_keeps_its_string():
    job = JobConfig("m", decode_on="accelerator")  # as the CLI and the wire give it
    assert job.decode_on is DecodeOn.ACCELERATOR and json.dumps({"decode_on": job.decode_on}) == \
        '{"decode_on": "accelerator"}'
    assert JobConfig("m").decode_on is DecodeOn.HOST
    with pytest.raises(ValueError, match="decode_on must be one of host, accelerator, not 'gpu'"):
        JobConfig("m", decode_on="gpu")
