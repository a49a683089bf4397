"""stoker/options.py: one grammar for the command line; defaults are the configs' own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stoker import options
from stoker.accel.consumer_config import ConsumerConfig
from stoker.cli import build_parser, main
from stoker.pipeline.job import JOB_DEFAULTS
from stoker.pipeline.text.examples import TextConfig


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_a_job_from_no_options_is_the_default_job():
    args = parse("train", "--data", "m.json", "--dataset", "imagenet")
    job = options.job_config(args)
    unpinned = {name: value for name, value in JOB_DEFAULTS.items() if name != "transform_version"}
    assert {name: getattr(job, name) for name in unpinned} == unpinned
    assert job.transform_version.startswith("stoker ")  # the built-in's provider, pinned where the job is made
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
    assert args.connect == "tcp://10.0.0.5:5561" and args.metrics_port == -1  # WorkerConfig.connect
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
    from stoker.cli import check_args

    parser = build_parser()
    for argv in (["worker", "--dispatcher", "tcp://127.0.0.1:1"], ["run"]):
        args = parser.parse_args([*argv, "--shard-cache-gb", "0.5"])
        check_args(parser, args)
        assert args.shard_cache_gb == 0.5
        monkeypatch.setenv("STOKER_SHARD_CACHE_GB", "2")
        args = parser.parse_args(argv)
        check_args(parser, args)
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


def _commands(parser, name="stoker"):
    """Every parser under `parser`, by its command line: stoker, stoker prepare, stoker prepare imagenet, ..."""
    import argparse

    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                if sub.prog.endswith(" " + sub_name):  # an alias (prepare arrow) is walked under its name
                    yield from _commands(sub, f"{name} {sub_name}")


def test_every_option_and_argument_of_every_command_has_a_help_line():
    import argparse

    bare = [f"{name} {action.option_strings[0] if action.option_strings else action.dest}"
            for name, parser in _commands(build_parser()) for action in parser._actions
            if not isinstance(action, argparse._SubParsersAction) and action.help != argparse.SUPPRESS
            and not (action.help or "").strip()]
    assert bare == []


def test_a_worker_option_left_out_is_absent_until_settled_then_the_configs_default(monkeypatch):
    from stoker import configured
    from stoker.cli import check_args
    from stoker.workers.worker_config import WorkerConfig

    parser = build_parser()
    args = parser.parse_args(["worker", "--dispatcher", "tcp://127.0.0.1:1"])
    assert set(vars(args)) == {"command", "log_level", "config", "connect"}  # the old spellings set nothing either
    for name in [n for n in os.environ if n.startswith("STOKER_")]:
        monkeypatch.delenv(name)
    check_args(parser, args)
    assert configured.config_of(WorkerConfig, args) == WorkerConfig("tcp://127.0.0.1:1")


def test_the_consumers_options_reach_its_config_under_the_fields_names():
    args = parse("train", "--dispatcher", "tcp://10.0.0.5:5561", "--no-overlap", "--host-timeout", "4",
                 "--lease-timeout", "9", "--sender-timeout", "7", "--attach-timeout", "5", "--credit-budget-mb", "64",
                 "--key-name", "c1", "--job-secret", "s", "--decode-threads", "2", "--metrics-port", "-1")
    assert options.consumer_config(args, 0) == ConsumerConfig(
        dispatcher="tcp://10.0.0.5:5561", overlap=False, host_timeout_s=4.0, lease_timeout_s=9.0,
        sender_timeout_s=7.0, attach_timeout_s=5.0, credit_budget_mb=64.0, key_name="c1", job_secret="s",
        decode_threads=2, metrics_port=None)
    run = parse("run", "--insecure")
    # run takes no --dispatcher: the default; its sockets take free ports (nobody else must find them)
    assert options.consumer_config(run) == ConsumerConfig(insecure=True, data_bind="tcp://127.0.0.1:0",
                                                          control_bind="tcp://127.0.0.1:0")


def test_the_job_options_reach_the_job_under_the_fields_names():
    args = parse("run", "--epochs", "2", "--transform-timeout", "5", "--decoder", "pillow", "--checksum",
                 "--seq-len", "256", "--pack", "--crop-area", "torchvision", "--dataset", "imagenet")
    job = options.job_config(args, manifest_uri="default/manifest.json")  # `stoker run` resolves its own manifest
    assert (job.manifest_uri, job.epochs, job.transform_timeout_s, job.decoder, job.checksum) == \
        ("default/manifest.json", 2, 5.0, "pillow", True)
    assert job.text == TextConfig(seq_len=256, pack=True) and (job.min_area, job.max_area) == (0.08, 1.0)
    assert job.pinned


@pytest.mark.parametrize(("dataset", "flags", "named"), [
    ("wikipedia", ("--lm-seq-len", "64"), "--lm-seq-len"), ("wikipedia", ("--lm-mode", "concat"), "--lm-mode"),
    ("tokens", ("--seq-len", "64"), "--seq-len"),
    # given at the other kind's default value, or a switch: still not this job's (it was taken silently)
    ("tokens", ("--seq-len", "128"), "--seq-len"), ("tokens", ("--pack",), "--pack"),
    ("tokens", ("--whole-word-mask", "--masked-lm-prob", "0.15"), "--masked-lm-prob, --whole-word-mask"),
    ("wikipedia", ("--lm-seq-len", "1024"), "--lm-seq-len")])
def test_a_row_flag_of_another_kind_of_job_is_refused_naming_it_not_ignored(dataset, flags, named):
    args = parse("train", "--data", "m.json", "--dataset", dataset, *flags)
    with pytest.raises(options.ConfigError, match=f"^{named}: the rows of another kind of job; this is a {dataset}"):
        options.job_config(args)
    own = {"wikipedia": ("--seq-len", "64"), "tokens": ("--lm-seq-len", "64", "--lm-mode", "concat")}
    job = options.job_config(parse("train", "--data", "m.json", "--dataset", dataset, *own[dataset]))
    assert job.dataset == dataset


def test_a_jobconfig_refuses_the_other_text_kinds_rows_and_names_its_own_kind():
    from stoker import JobConfig, LMConfig

    with pytest.raises(options.ConfigError, match="a tokens job's rows are lm=LMConfig"):
        JobConfig(manifest_uri="m.json", dataset="tokens", text=TextConfig(seq_len=256))
    with pytest.raises(options.ConfigError, match="makes a tokens job's rows; a wikipedia job's are text="):
        JobConfig(manifest_uri="m.json", dataset="wikipedia", lm=LMConfig(seq_len=64))
    with pytest.raises(options.ConfigError, match="a tokens job's rows are set by its lm options"):
        JobConfig(manifest_uri="m.json", dataset="tokens", transform="eval")
