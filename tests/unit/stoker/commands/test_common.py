"""stoker/commands/common.py: the job checks run, train and dispatch share, each rule its config's own."""

from __future__ import annotations

import pytest

from stoker.cli import build_parser, check_args
from stoker.commands.common import exit_code_of, is_ranked, transform_named


def _refused(argv: list[str], capsys) -> str:
    parser = build_parser()
    args = parser.parse_args(argv)
    with pytest.raises(SystemExit) as exited:
        check_args(parser, args)
    assert exited.value.code == 2
    return capsys.readouterr().err.strip()


@pytest.mark.parametrize("argv,says", [
    (["run", "--stall-report", "60", "--stall-timeout", "30"],
     "run: argument --stall-report: --stall-report (60) must be below --stall-timeout (30)"),
    (["dispatch", "--data", "x", "--stall-report", "9", "--stall-timeout", "9", "--journal", "j"],
     "dispatch: argument --stall-report: --stall-report (9) must be below --stall-timeout (9)"),
    (["dispatch", "--data", "x", "--control-bind", "tcp://127.0.0.1:0"],
     "dispatch: argument --control-bind: a free port (0) needs --job-secret FILE, --journal or --keys"),
    (["train", "--data", "x", "--dataset", "wikipedia", "--drop-last"],
     "train: argument --drop-last: applies to imagenet jobs only"),
    (["run", "--dataset", "wikipedia", "--corrupt-jpegs", "keep"],
     "run: argument --corrupt-jpegs: applies to imagenet (JPEG) jobs only"),
    (["run", "--fleet", "tcp://127.0.0.1:1", "--fleet-key-name", "a"], "run: argument --fleet-key-name:"),
    (["train", "--dispatcher", "tcp://127.0.0.1:2", "--job-secret", "x", "--fleet", "tcp://127.0.0.1:1"],
     "train: argument --fleet: the job registers where its dispatcher runs"),
    (["worker"], "worker: argument --dispatcher: give one of"),
    (["run", "--metrics-addr", "0.0.0.0"], "run: argument --metrics-addr: 0.0.0.0 is beyond loopback"),
    (["fleet", "--bind", "tcp://10.0.0.2:5570"], "fleet: argument --bind: tcp://10.0.0.2:5570 is beyond loopback; "
     "without CURVE keys anyone who reaches it could act on the job: pass --keys DIR, or --insecure on a trusted "
     "network"),  # the configs' rule (protos.exposure), its field said as the flag, in the words users saw before
])
def test_a_rule_is_said_with_the_flag_it_refuses(argv, says, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    for name in ("STOKER_PROCS", "STOKER_DISPATCHER", "STOKER_FLEET"):
        monkeypatch.delenv(name, raising=False)
    line = _refused(argv, capsys)
    assert says in line and len(line.splitlines()) == 1, line


def test_a_rank_is_told_by_its_flag_or_its_environment(monkeypatch):
    args = build_parser().parse_args(["train", "--data", "x"])
    monkeypatch.setenv("RANK", "0")
    assert not is_ranked(args)
    monkeypatch.setenv("RANK", "2")
    assert is_ranked(args)


def test_the_transform_is_named_with_its_parameters():
    assert transform_named("train", "") == "train"
    assert transform_named("mine:crop", '{"size": 96}') == 'mine:crop {"size": 96}'


def test_an_interrupted_job_exits_130(capsys):
    class Interrupted:
        interrupted = True

    assert exit_code_of(Interrupted()) == 130  # type: ignore[arg-type]
    assert "interrupted" in capsys.readouterr().err
