"""Bad flags fail at once: exit 2, one line that names the flag and what it allows, no traceback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest


def _stoker(*args: str, timeout: float = 10) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "stoker", *args], capture_output=True, text=True, timeout=timeout)
    return result, time.monotonic() - started


@pytest.mark.parametrize("args,flag", [
    (["run", "--procs", "0"], "--procs"),
    (["run", "--hosts", "0"], "--hosts"),
    (["run", "--credit-window", "0"], "--credit-window"),
    (["run", "--image-size", "0"], "--image-size"),
    (["run", "--image-size", "4000"], "--image-size"),
    (["dispatch", "--data", "x", "--image-size", "2000", "--batch-size", "256"], "--batch-size 256"),
    (["run", "--metrics-port", "70000"], "--metrics-port"),
    (["run", "--worker-metrics-port", "65535", "--hosts", "2"], "--worker-metrics-port"),
    (["run", "--epochs", "-1"], "--epochs"),
    (["run", "--masked-lm-prob", "1.5"], "--masked-lm-prob"),
    (["run", "--metrics-addr", "0.0.0.0"], "--metrics-addr"),
    (["train", "--data", "x", "--checkpoint-every", "0"], "--checkpoint-every"),
    (["train", "--data", "x", "--host-timeout", "0"], "--host-timeout"),
    (["train", "--data", "x", "--data-bind", "tcp://0.0.0.0:5560"], "--data-bind"),
    (["worker", "--dispatcher", "tcp://127.0.0.1:1", "--procs", "0"], "--procs"),
    (["worker", "--dispatcher", "tcp://127.0.0.1:1", "--procs", "300"], "--procs"),  # 86 tracebacks, 0 samples
    (["run", "--procs", "300"], "--procs"),
    (["run", "--stall-report", "60", "--stall-timeout", "30"], "--stall-report"),
    (["dispatch", "--data", "x", "--stall-timeout", "-1"], "--stall-timeout"),
    (["worker", "--dispatcher", "tcp://127.0.0.1:1", "--metrics-addr", "0.0.0.0"], "--metrics-addr"),
    (["worker", "--dispatcher", "tcp://127.0.0.1:1", "--shard-cache-gb", "0"], "--shard-cache-gb"),
    (["run", "--shard-cache-gb", "-2"], "--shard-cache-gb"),
    (["dispatch", "--data", "x", "--metrics-port", "-7"], "--metrics-port"),
    (["dispatch", "--data", "x", "--control-bind", "tcp://127.0.0.1:0"], "--control-bind"),  # its secret's name
    (["run", "--world-size", "0"], "--world-size"),
    (["run", "--dataset", "wikipedia", "--drop-last"], "--drop-last"),
    (["run", "--corrupt-jpegs", "ignore"], "--corrupt-jpegs"),
    (["run", "--transform-timeout", "1e-9"], "--transform-timeout"),  # its timer would fire inside its handler
    (["run", "--dataset", "wikipedia", "--corrupt-jpegs", "keep"], "--corrupt-jpegs"),
    (["sweep", "--hosts", "0,1"], "--hosts"),
    (["run", "--fleet", "tcp://127.0.0.1:1", "--weight", "0"], "--weight"),
    (["run", "--fleet", "not-an-endpoint"], "--fleet"),
    (["run", "--weight", "2"], "--fleet"),  # an ask of a fleet without the fleet
    (["train", "--data", "x", "--fleet", "tcp://127.0.0.1:1", "--min-cores", "3", "--max-cores", "2"], "max-cores"),
    (["train", "--data", "x", "--fleet", "tcp://127.0.0.1:1", "--fleet-start-cores", "0"], "--fleet-start-cores"),
    (["worker"], "--dispatcher"),
    (["worker", "--fleet", "tcp://127.0.0.1:1", "--dispatcher", "tcp://127.0.0.1:2"], "--fleet"),
    (["fleet", "--bind", "tcp://0.0.0.0:5570"], "--bind"),
    (["fleet", "--max-moves", "0"], "--max-moves"),
    (["fleet", "--host-timeout", "0"], "--host-timeout"),
    (["lab", "up", "--fleet", "--", "--epochs", "2"], "--fleet"),
    (["run", "--fleet-start-cores", "2"], "--fleet"),  # an ask of a fleet without the fleet
    (["run", "--fleet", "tcp://127.0.0.1:1", "--fleet-start-cores", "5e9"], "--fleet-start-cores"),
    (["run", "--fleet", "tcp://127.0.0.1:1", "--weight", "1e-300"], "--weight"),
    (["run", "--fleet", "tcp://127.0.0.1:1", "--hosts", "2"], "--hosts"),
    (["run", "--fleet", "tcp://127.0.0.1:1", "--fleet-key-name", "a"], "--fleet-key-name"),  # run takes no keys
    (["train", "--dispatcher", "tcp://127.0.0.1:2", "--job-secret", "x", "--fleet", "tcp://127.0.0.1:1"], "--fleet"),
])
def test_a_flag_that_cannot_work_is_refused_at_parse_time(args, flag):
    result, took = _stoker(*args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert flag in lines[0] and "Traceback" not in result.stderr
    assert took < 10


def test_a_shard_cache_limit_from_the_environment_is_checked_as_the_flag_is():
    env = {**os.environ, "STOKER_SHARD_CACHE_GB": "lots"}
    result = subprocess.run([sys.executable, "-m", "stoker", "worker", "--dispatcher", "tcp://127.0.0.1:1"],
                            capture_output=True, text=True, timeout=10, env=env)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "stoker: error: worker: $STOKER_SHARD_CACHE_GB: must be a number > 0 (GB) and at most 1e+06, not 'lots' "
        "(see stoker --help)"]


def test_a_process_count_from_the_environment_is_checked_as_the_flag_is():
    """$STOKER_PROCS=300 on a host of a few cores: refused at once (it used to start them, run out of memory
    and print 86 tracebacks for 0 samples)."""
    env = {**os.environ, "STOKER_PROCS": "300"}
    result = subprocess.run([sys.executable, "-m", "stoker", "worker", "--dispatcher", "tcp://127.0.0.1:1"],
                            capture_output=True, text=True, timeout=10, env=env)
    most = max(8, 4 * len(os.sched_getaffinity(0)))
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"stoker: error: worker: $STOKER_PROCS: must be an integer >= 1 and at most {most}, not '300' "
        "(see stoker --help)"]


def test_an_image_size_whose_batches_cannot_travel_is_refused_with_the_largest_that_fits():
    """At 4,000 px one image is over the 32 MB frame limit: the consumer's socket would drop every
    batch unseen and the units would go round for ever. Refused before anything starts instead."""
    result, took = _stoker("run", "--image-size", "4000")
    line = result.stderr.strip()
    assert result.returncode == 2 and len(line.splitlines()) == 1, result.stderr
    assert "--image-size 4000 with --batch-size 64 does not fit a data message" in line, line
    assert "the largest --image-size that fits --batch-size 64 is 2362" in line and took < 10


def test_a_worker_daemon_that_cannot_start_fails_stoker_run(manifest):
    """Its metrics port taken: said once, naming the flag `stoker run` was given (--worker-metrics-port)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result, took = _stoker("run", "--data", manifest.uri, "--hosts", "1", "--no-progress", "--metrics-port", "-1",
                               "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                               "--worker-metrics-port", str(port), timeout=30)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("stoker: error: worker daemon host0 exited with code 2") and str(port) in last, last
    assert last.endswith("(pick another with --worker-metrics-port)"), last
    assert result.stderr.count(str(port)) == 1, result.stderr
    assert "Traceback" not in result.stderr and took < 10


def test_a_worker_whose_metrics_port_is_taken_names_its_own_flag():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result, took = _stoker("worker", "--dispatcher", "tcp://127.0.0.1:1", "--metrics-port", str(port))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert str(port) in lines[0] and lines[0].endswith("(pick another with --metrics-port)") and took < 10


def test_a_manifest_that_is_not_json_is_named(tmp_path):
    bad = tmp_path / "manifest.json"
    bad.write_text("<html>not a manifest</html>")
    result, _ = _stoker("train", "--data", str(bad), "--metrics-port", "-1")
    assert result.returncode == 2 and str(bad) in result.stderr and "not JSON" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args,says", [
    (["run", "--json", "/nonexistent/dir/out.json"],
     "stoker run: error: argument --json: cannot write '/nonexistent/dir/out.json': the folder '/nonexistent/dir' "
     "does not exist (see stoker run --help)"),
    (["train", "--data", "x", "--checkpoint", "/nonexistent/dir/ck.pt"],
     "stoker train: error: argument --checkpoint: cannot write '/nonexistent/dir/ck.pt': the folder "
     "'/nonexistent/dir' does not exist (see stoker train --help)"),
    (["train", "--data", "x", "--checkpoint", "{file}/ck.pt"], "argument --checkpoint: cannot write '{file}/ck.pt': "
                                                                "'{file}' is not a folder"),
    (["run", "--json", "{tmp}"], "argument --json: cannot write '{tmp}': it is a folder"),
])
def test_an_output_file_whose_folder_cannot_take_it_is_refused_at_parse_time(tmp_path, args, says):
    """`stoker run --json /nonexistent/dir/out.json` used to run the whole job and fail writing its summary;
    `stoker train --checkpoint` likewise, at its first save. Now: exit 2 at once, one line naming the flag."""
    (tmp_path / "file").write_text("")
    where = {"file": str(tmp_path / "file"), "tmp": str(tmp_path)}
    result, took = _stoker(*(arg.format(**where) for arg in args))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert says.format(**where) in lines[0] and took < 10


def test_an_output_file_in_a_folder_that_exists_or_standard_output_is_taken(tmp_path):
    from stoker.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["run", "--json", str(tmp_path / "out.json")]).json == str(tmp_path / "out.json")
    assert parser.parse_args(["run", "--json"]).json == parser.parse_args(["run", "--json", "-"]).json == "-"
    checkpoint = parser.parse_args(["train", "--data", "x", "--checkpoint", str(tmp_path / "ck.pt")]).checkpoint
    assert checkpoint == str(tmp_path / "ck.pt")


def test_a_summary_on_a_full_disk_is_one_line_naming_it_and_the_summary_before_stays(manifest, full_disk):
    """`stoker run --json` whose disk is full by the job's end: one line naming the file and the flag (it was
    "[Errno 28] No space left on device" alone, with the summary before truncated to nothing)."""
    folder, fill = full_disk
    summary = folder / "summary.json"
    summary.write_text('{"samples": 1}')
    fill()
    result, _ = _stoker("run", "--data", manifest.uri, "--hosts", "1", "--accel", "null", "--no-progress",
                        "--metrics-port", "-1", "--json", str(summary), timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"stoker: error: cannot write summary {summary}: no space left on device (free space there or pass --json "
        f"elsewhere)"), result.stderr[-3000:]
    assert summary.read_text() == '{"samples": 1}' and sorted(p.name for p in folder.iterdir()) == [
        "filler", "summary.json"]


def test_the_most_epochs_a_job_takes_start_at_once_and_stop_at_ctrl_c(manifest, tmp_path):
    """`stoker run --epochs 2147483647` (the most --epochs takes: the wire's epoch is a uint32, the flag an
    int32) was silent for 20 s and more before its first line: the plan summed its units epoch by epoch.
    Started now in a few seconds; Ctrl-C ends it with a summary of the epochs it was in, not a list of
    2**31 - 1 of them."""
    summary = tmp_path / "summary.json"
    started = time.monotonic()
    job = subprocess.Popen([sys.executable, "-m", "stoker", "run", "--data", manifest.uri, "--epochs", "2147483647",
                            "--hosts", "1", "--accel", "null", "--no-progress", "--metrics-port", "-1",
                            "--json", str(summary)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           # as from a terminal: a shell without job control starts a background command (a
                           # test run started with `&`) with SIGINT ignored, and its children inherit that
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = job.stderr.readline()
        took = time.monotonic() - started
        assert first.startswith("stoker: job ") and took < 10, (first, took)
        time.sleep(2)
        interrupted = time.monotonic()
        job.send_signal(signal.SIGINT)
        _, err = job.communicate(timeout=30)
        took = time.monotonic() - interrupted
    finally:
        job.kill()
    assert job.returncode == 130 and "Traceback" not in err, err[-3000:]
    # the worker daemons leave while the dispatcher still answers their hand-backs: about 1-2 s (it took 6 s
    # when they were told after it had closed, each waiting out a request's 5 s timeout)
    assert took < 5, f"Ctrl-C took {took:.1f} s"
    data = json.loads(summary.read_text())
    assert data["epochs"] == 2147483647 and 1 <= len(data["per_epoch_unique"]) < 100, data["per_epoch_unique"]
    assert sum(data["per_epoch_unique"]) == data["unique_samples"]


def _taken_ports(count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held.append(taken)
    return held


def test_a_worker_takes_its_options_from_a_flag_then_a_variable_then_its_config_file(tmp_path):
    """The metrics port each way (a taken one, so the daemon says which it tried and exits): the
    flag beats $STOKER_METRICS_PORT, which beats the --config file, which beats the default."""
    held = _taken_ports(3)
    flag, variable, in_file = (str(s.getsockname()[1]) for s in held)
    config = tmp_path / "worker.toml"
    config.write_text(f'dispatcher = "tcp://127.0.0.1:1"\nmetrics-port = {in_file}\nprocs = 2\n')
    base = {k: v for k, v in os.environ.items() if not k.startswith("STOKER_")}
    try:
        for argv, env, port in (
                (["--metrics-port", flag], {"STOKER_METRICS_PORT": variable}, flag),
                ([], {"STOKER_METRICS_PORT": variable}, variable),
                ([], {"STOKER_METRICS_PORT": ""}, in_file)):
            result = subprocess.run([sys.executable, "-m", "stoker", "worker", "--config", str(config), *argv],
                                    capture_output=True, text=True, timeout=10, env={**base, **env})
            lines = result.stderr.strip().splitlines()
            assert result.returncode == 2 and len(lines) == 1 and f":{port}" in lines[0], (argv, env, result.stderr)
    finally:
        for s in held:
            s.close()


@pytest.mark.parametrize("env,text,line", [
    ({"STOKER_PROCS": "0"}, "", "stoker: error: worker: $STOKER_PROCS: must be an integer >= 1, not '0' "
                                "(see stoker --help)"),
    ({"STOKER_INSECURE": "perhaps"}, "", "stoker: error: worker: $STOKER_INSECURE: must be true or false"),
    ({}, "leave-after = -3\n", "worker.toml: leave-after: must be a number > 0, not '-3'"),
    ({}, "dispatcher = 'tcp://127.0.0.1:1'\nprocess = 3\n", "worker.toml: process: no such setting"),
    ({}, "procs = [\n", "stoker: error: worker: --config {config}: not TOML"),
])
def test_a_bad_value_in_a_variable_or_the_config_file_is_refused_naming_where(tmp_path, env, text, line):
    config = tmp_path / "worker.toml"
    config.write_text(text)
    base = {k: v for k, v in os.environ.items() if not k.startswith("STOKER_")}
    result = subprocess.run([sys.executable, "-m", "stoker", "worker", "--dispatcher", "tcp://127.0.0.1:1",
                             "--config", str(config)], capture_output=True, text=True, timeout=10,
                            env={**base, **env})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and line.format(config=config) in lines[0], result.stderr
