"""stoker/configured.py: a config dataclass's fields as options, and the config made back from them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from enum import StrEnum

import pytest

from stoker.configured import add_options, config_of, options_of
from stoker.flags import Parser


@dataclass(frozen=True)
class Demo:
    endpoint: str = field(metadata={"help": "where", "flag": "--to", "metavar": "URL"})
    procs: int = field(default=2, metadata={"help": "processes (default %(default)s)", "check": "positive"})
    wait_s: float = field(default=1.5, metadata={"help": "seconds", "flag": "--wait", "check": "seconds"})
    port: int | None = field(default=None, metadata={"help": "port (default %(default)s)", "check": "metrics-port",
                                                     "off": -1})
    mode: str = field(default="a", metadata={"help": "a or b", "choices": ("a", "b")})
    fast: bool = field(default=False, metadata={"help": "go fast"})
    overlap: bool = field(default=True, metadata={"help": "do not overlap", "flag": "--no-overlap"})
    internal: int = 0  # no help line: no option


def parser(layered: bool = False) -> argparse.ArgumentParser:
    p = Parser(prog="demo")
    add_options(p, Demo, layered=layered)
    return p


def test_only_fields_with_a_help_line_are_options_named_by_flag_or_field():
    assert [(o.name, o.flag) for o in options_of(Demo)] == [
        ("endpoint", "--to"), ("procs", "--procs"), ("wait_s", "--wait"), ("port", "--port"), ("mode", "--mode"),
        ("fast", "--fast"), ("overlap", "--no-overlap")]
    assert [o.name for o in options_of(Demo, ["procs", "fast"])] == ["procs", "fast"]
    with pytest.raises(KeyError, match="internal"):
        options_of(Demo, ["internal"])


def test_no_options_give_the_defaults_and_the_config_back():
    args = parser().parse_args([])
    assert (args.procs, args.wait_s, args.port, args.mode, args.fast, args.overlap) == (2, 1.5, -1, "a", False, True)
    assert config_of(Demo, args, endpoint="e") == Demo(endpoint="e")


def test_given_options_reach_the_config_with_off_as_none():
    args = parser().parse_args(["--to", "tcp://x:1", "--procs", "3", "--wait", "0.5", "--port", "9000", "--mode", "b",
                                "--fast", "--no-overlap"])
    assert config_of(Demo, args) == Demo("tcp://x:1", 3, 0.5, 9000, "b", True, False)
    assert config_of(Demo, parser().parse_args(["--to", "e", "--port", "-1"])).port is None


@pytest.mark.parametrize("argv,message", [
    (["--procs", "0"], "argument --procs: must be an integer >= 1, not '0'"),
    (["--wait", "soon"], "argument --wait: must be a number > 0, not 'soon'"),
    (["--port", "70000"], "argument --port: must be a port 0-65535"),
    (["--mode", "c"], "argument --mode: invalid choice: 'c'"),
])
def test_a_bad_value_is_refused_by_the_fields_check(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_help_shows_the_fields_default_and_layered_options_are_absent_until_given():
    text = parser().format_help()
    assert "processes (default 2)" in text and "port (default -1)" in text and "--to URL" in text
    assert "internal" not in text
    assert vars(parser(layered=True).parse_args(["--procs", "4"])) == {"procs": 4}


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Painted:
    colour: Colour = field(default=Colour.RED, metadata={"help": "the colour (default %(default)s)",
                                                         "choices": tuple(c.value for c in Colour)})


def test_a_str_enum_field_is_read_and_refused_as_its_values():
    p = Parser(prog="demo")
    add_options(p, Painted)
    assert "the colour (default red)" in p.format_help()
    assert p.parse_args(["--colour", "blue"]).colour == Colour.BLUE
    (option,) = options_of(Painted)
    assert option.kind is str and option.parse("blue") == "blue"
    with pytest.raises(argparse.ArgumentTypeError, match="must be one of red, blue, not 'green'"):
        option.parse("green")


@pytest.mark.parametrize("config", [
    {"connect": "tcp://127.0.0.1:5561"},
    {"connect": "tcp://10.0.0.5:5561", "procs": 3, "host_id": "h-1", "metrics_port": None, "once": True,
     "parent_pid": 4242, "shard_cache_gb": 1.5, "metrics_flag": "--worker-metrics-port", "leave_after_s": 12.5},
    {"connect": "tcp://10.0.0.5:5561", "metrics_port": 0, "metrics_addr": "10.0.0.9", "keys": "/keys",
     "key_name": "cpu-0", "insecure": True},
])
def test_a_child_is_told_its_config_by_the_flags_the_parser_reads_back(config, monkeypatch):
    """One builder for child command lines (stoker run's hosts, the lab's, a loader's workers): what
    command_line writes, `stoker worker` parses back into the same config, defaults left out."""
    import os

    from stoker.cli import build_parser, check_args
    from stoker.configured import command_line
    from stoker.workers.worker_config import WorkerConfig

    for name in [n for n in os.environ if n.startswith("STOKER_")]:
        monkeypatch.delenv(name)
    made = WorkerConfig(**config)
    argv = command_line(made)
    assert all(arg.startswith("--") for arg in argv)  # FLAG=VALUE: a value such as -1 is never read as a flag
    parser = build_parser()
    args = parser.parse_args(["worker", *argv])
    check_args(parser, args)
    assert config_of(WorkerConfig, args) == made


@pytest.mark.parametrize("consumer, accel", [
    ({"dispatcher": "tcp://127.0.0.1:5561", "data_bind": "tcp://127.0.0.1:0"}, {}),
    ({"dispatcher": "tcp://10.0.0.5:5561", "data_bind": "tcp://10.0.0.6:0", "advertise_host": "10.0.0.6",
      "metrics_addr": "10.0.0.6", "keys": "/keys", "key_name": "rank1", "credit_window": 5, "overlap": False,
      "decode_threads": 2, "sender_timeout_s": 12.5, "host_timeout_s": 7.0, "credit_budget_mb": 64.0},
     {"kind": "simulated", "profile": "a100", "scale": 0.1}),
    ({"dispatcher": "tcp://127.0.0.1:5561"},
     {"kind": "torch", "model": "bert-tiny", "lr": 0.1, "optimizer": "lamb", "precision": "bf16", "convert": True}),
])
def test_a_rank_is_told_its_consumer_and_device_by_the_flags_stoker_train_reads_back(consumer, accel, monkeypatch):
    """The same builder for a rank's `stoker train` (stoker run's ranks 1.., the lab's ranks): its
    consumer settings and the device rank 0 resolved come back whole, including a BERT learning
    rate of 0.1 that `stoker train` would otherwise default to 1e-4."""
    import os

    from stoker import options
    from stoker.accel.backends.accelerators import AccelSpec
    from stoker.accel.consumer_config import ConsumerConfig
    from stoker.cli import build_parser, check_args
    from stoker.commands.common import accel_spec
    from stoker.configured import command_line

    for name in [n for n in os.environ if n.startswith("STOKER_")]:
        monkeypatch.delenv(name)
    made, spec = ConsumerConfig(**consumer), AccelSpec(**accel)
    argv = ["train", "--rank", "1", "--world-size", "2", *command_line(made), *command_line(spec)]
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    assert options.consumer_config(args, 1) == replace(made, metrics_port=options.consumer_metrics_port(args, 1))
    assert accel_spec(args) == spec


def test_a_config_s_problem_is_said_as_the_flag_of_its_field():
    from stoker.accel.consumer_config import ConsumerConfig
    from stoker.configured import as_flag_problem, flag_of
    from stoker.pipeline.job import JobConfig

    assert flag_of(ConsumerConfig, "stall_report_s") == "--stall-report"
    assert flag_of(ConsumerConfig, "rank_wait_s") is None
    assert as_flag_problem(ConsumerConfig, "ConsumerConfig: stall_report_s (60) must be below stall_timeout_s (30)") \
        == "argument --stall-report: --stall-report (60) must be below --stall-timeout (30)"
    assert as_flag_problem(ConsumerConfig, "fleet: at rank 0 only") == "argument --fleet: at rank 0 only"
    assert as_flag_problem(JobConfig, "--drop-last applies to imagenet jobs only") == \
        "argument --drop-last: applies to imagenet jobs only"
    assert as_flag_problem(ConsumerConfig, "nothing a field names") == "nothing a field names"


@dataclass(frozen=True)
class Inner:
    weight: float = field(default=1.0, metadata={"help": "weight", "check": "above-zero"})
    key_name: str = field(default="job", metadata={"help": "its key", "flag": "--inner-key", "dest": "inner_key"})

    def __post_init__(self) -> None:
        if self.weight > 10:
            from stoker.protos.errors import ConfigError

            raise ConfigError(f"weight must be at most 10, not {self.weight}")


@dataclass(frozen=True)
class Holder:
    key_name: str = field(default="me", metadata={"help": "my key"})
    inner: Inner = field(default=Inner(), metadata={"options": True})


def test_a_held_config_s_options_are_its_holder_s_and_make_it_back_whole():
    from stoker.configured import command_line, flag_of
    from stoker.protos.errors import ConfigError

    assert [(o.name, o.flag, o.within) for o in options_of(Holder)] == [
        ("key_name", "--key-name", None), ("weight", "--weight", "inner"), ("key_name", "--inner-key", "inner")]
    assert [o.flag for o in options_of(Holder, ["inner"])] == ["--weight", "--inner-key"]
    p = Parser(prog="demo")
    add_options(p, Holder)
    made = config_of(Holder, p.parse_args(["--weight", "2", "--inner-key", "k", "--key-name", "x"]))
    assert made == Holder("x", Inner(2.0, "k"))
    assert config_of(Holder, p.parse_args([])) == Holder()
    assert command_line(made) == ["--key-name=x", "--weight=2.0", "--inner-key=k"]
    assert flag_of(Holder, "key_name") == "--key-name" and flag_of(Holder, "inner_key") == "--inner-key"
    with pytest.raises(ConfigError, match="at most 10"):  # the held config's own check, as it is made
        config_of(Holder, p.parse_args(["--weight", "11"]))
