"""A value its wire field cannot hold is refused where the config is made, naming the field."""

from __future__ import annotations

import pytest

from stoker.pipeline.job import JobConfig
from stoker.pipeline.text.examples import TextConfig
from stoker.pipeline.wire_values import wire_problem
from stoker.protos import stoker_pb2 as pb
from stoker.protos.errors import ConfigError


@pytest.mark.parametrize("given, says", [
    ({"seed": 2**64}, "seed 18446744073709551616 is out of range (0 to 18446744073709551615)"),
    ({"seed": -1}, "seed -1 is out of range"),
    ({"epochs": 2**40}, "epochs 1099511627776 is out of range (0 to 4294967295)"),
    ({"batch_size": True}, "batch_size True is not an integer"),
    ({"epochs": "2"}, "epochs '2' is not an integer"),
    ({"epochs": 2.5}, "epochs 2.5 is not an integer"),
    ({"transform": None}, "transform None is not a string"),
    ({"checksum": "yes"}, "checksum 'yes' is not True or False"),
    ({"heartbeat_s": float("nan")}, "heartbeat_s nan is not a finite number"),
    ({"text": "x"}, "text 'x' is not a TextConfig"),
])
def test_a_job_whose_value_cannot_travel_is_refused_when_made(given, says):
    with pytest.raises(ConfigError, match=f"^JobConfig: {says.replace('(', '[(]').replace(')', '[)]')}"):
        JobConfig("m", **given)


def test_a_nested_config_names_its_field_by_path_and_a_good_job_passes():
    job = JobConfig("m", dataset="wikipedia", text=TextConfig(seq_len=128))
    assert wire_problem(job, pb.JobSpec.DESCRIPTOR) is None
    object.__setattr__(job.text, "seq_len", 2**33)  # frozen: only a test reaches past the check
    assert wire_problem(job, pb.JobSpec.DESCRIPTOR) == "text.seq_len 8589934592 is out of range (0 to 4294967295)"


def test_a_float_field_takes_an_int_and_the_largest_values_that_fit():
    assert wire_problem(JobConfig("m", heartbeat_s=2, seed=2**64 - 1), pb.JobSpec.DESCRIPTOR) is None
