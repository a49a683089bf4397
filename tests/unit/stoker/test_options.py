"""stoker/options.py: one grammar for the command line; defaults are the configs' own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from accel.consumer_config import ConsumerConfig
from pipeline.text.examples import TextConfig
from protos.job import JOB_DEFAULTS
from stoker import options
from stoker.cli import build_parser, main


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_a_job_from_no_options_is_the_default_job():
    args = parse("train", "--data", "m.json", "--dataset", "imagenet")
    job = options.job_config(args)
    assert {name: getattr(job, name) for name in JOB_DEFAULTS} == JOB_DEFAULTS
    assert job.text == TextConfig()
    cfg = options.consumer_config(args)
    for name in ("data_bind", "control_bind", "credit_window", "host_timeout_s", "sender_timeout_s", "metrics_addr"):
        assert getattr(cfg, name) == getattr(ConsumerConfig(), name), name


def test_each_command_takes_only_the_options_it_honours(capsys):
    for argv, refused in ((["dispatch", "--data", "m", "--data-bind", "tcp://127.0.0.1:1"], "--data-bind"),
                          (["worker", "--dispatcher", "tcp://127.0.0.1:1", "--epochs", "2"], "--epochs"),
                          (["dispatch", "--data", "m", "--accel", "torch"], "--accel")):
        with pytest.raises(SystemExit) as exit_:
            parse(*argv)
        assert exit_.value.code == 2 and refused in capsys.readouterr().err


def test_run_refuses_keys_with_the_reason(capsys):
    with pytest.raises(SystemExit):
        parse("run", "--keys", "k")
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--keys" in err and "stoker worker --keys" in err


def test_old_spellings_still_work_and_say_so_once_each(capsys):
    args = parse("worker", "--connect", "tcp://10.0.0.5:5561", "--no-metrics")
    assert args.dispatcher == "tcp://10.0.0.5:5561" and args.metrics_port == -1
    err = capsys.readouterr().err.splitlines()
    assert err == ["stoker worker: --connect is deprecated and will go; use --dispatcher",
                   "stoker worker: --no-metrics is deprecated and will go; use --metrics-port -1"]


def test_json_is_a_path_or_standard_output_on_every_command():
    assert parse("run", "--json").json == "-"
    assert parse("run", "--json", "out.json").json == "out.json"
    assert parse("status", "--json").json == "-"
    assert parse("plan", "--json", "p.json").json == "p.json"


def test_the_command_line_loads_no_prometheus_client_before_a_worker_sets_its_folder():
    code = "import sys, stoker.cli; print(sorted(m for m in ('prometheus_client', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_the_shard_cache_limit_is_for_the_commands_that_fetch_shards(capsys, monkeypatch):
    from stoker.cli import _check_args

    parser = build_parser()
    for argv in (["worker", "--dispatcher", "tcp://127.0.0.1:1"], ["run"]):
        args = parser.parse_args([*argv, "--shard-cache-gb", "0.5"])
        _check_args(parser, args)
        assert args.shard_cache_gb == 0.5
        monkeypatch.setenv("STOKER_SHARD_CACHE_GB", "2")
        args = parser.parse_args(argv)
        _check_args(parser, args)
        assert args.shard_cache_gb == 2.0  # the flag's default: the environment's
        monkeypatch.delenv("STOKER_SHARD_CACHE_GB")
    with pytest.raises(SystemExit):
        parse("train", "--data", "m", "--shard-cache-gb", "1")
    assert "--shard-cache-gb" in capsys.readouterr().err


def test_an_image_size_too_big_for_the_batch_size_is_refused_at_parse_time_naming_both(capsys):
    for argv, fix in ((["run", "--image-size", "4000"], "the largest --image-size that fits --batch-size 64 is 2362"),
                      (["train", "--data", "m", "--dataset", "imagenet", "--batch-size", "256", "--image-size", "1500"],
                       "the largest --image-size that fits --batch-size 256 is 1494")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 2 and len(err.splitlines()) == 1 and fix in err, err
    assert options.image_fit_error(parse("run", "--image-size", "2362")) is None
    assert "2362" in options.image_fit_error(parse("run", "--image-size", "4000", "--decode-on", "accelerator"))
    assert options.image_fit_error(parse("run", "--image-size", "4000", "--dataset", "wikipedia")) is None
