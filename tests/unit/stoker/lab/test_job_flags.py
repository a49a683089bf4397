"""stoker/lab/job_flags.py: a lab's ranks other than 0 take how rank 0 steps, never what the job is."""

from __future__ import annotations

from stoker.configured import options_of
from stoker.lab.job_flags import job_flags, step_options
from stoker.pipeline.job import JobConfig
from stoker.pipeline.text.examples import TextConfig


def test_every_job_field_is_a_job_flag_from_the_parser_s_own_table():
    valued, switches = job_flags()
    for option in options_of(JobConfig) + options_of(TextConfig):
        assert option.flag in (switches if option.switch else valued), option.flag
    assert {"--data", "--dataset", "--crop-area", "--world-size"} <= valued
    assert {"--transform-params", "--transform-timeout"} <= valued and "--drop-last" in switches  # once left out


def test_a_rank_keeps_its_step_options_and_drops_the_job_s():
    args = ["--data", "m.json", "--transform-params", '{"size": 96}', "--transform-timeout=5", "--drop-last",
            "--accel", "torch", "--epochs", "2", "--model=resnet18", "--pack", "--no-overlap"]
    assert step_options(args) == ["--accel", "torch", "--model=resnet18", "--no-overlap"]
