"""`Loader(job, workers=N)`: N worker processes on this machine, started by the loader, dying with it.

Each case runs a training script of its own in a fresh interpreter (as a user runs one), with the
real dispatcher, a real `stoker worker` daemon and its decode processes, and looks at the
machine's process table for what the loader started: nothing of it may outlive the script, however
the script ends, and every sample comes exactly once per epoch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import descendants, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(body))
    return path


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _run(script: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STOKER_", "PROMETHEUS_"))}
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=script.parent, env=env)


EVERY_SAMPLE = """
    import json, sys
    from stoker import JobConfig, Loader

    job = JobConfig(manifest_uri=sys.argv[1], epochs=2, batch_size=16, image_size=64)
    seen = {}
    with Loader(job, workers=2, format="numpy") as loader:
        while loader.epoch < loader.epochs:
            for batch in loader:
                for sample in batch.sample_ids.tolist():
                    seen.setdefault(batch.epoch, []).append(sample)
        port = loader.metrics_port
    print(json.dumps({"seen": seen, "metrics_port": port}))
"""


def test_a_loader_with_workers_delivers_every_sample_once_per_epoch_and_leaves_nothing_behind(manifest, tmp_path):
    """The default single-process shape: no daemon started by hand, free ports, every sample once."""
    run = _run(_script(tmp_path, EVERY_SAMPLE), manifest.uri)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    everything = sorted(range(manifest.num_samples))
    assert {int(e): sorted(ids) for e, ids in out["seen"].items()} == {0: everything, 1: everything}
    assert out["metrics_port"] not in (None, 9560)  # a free port: a second job on the machine does not collide


def test_two_loaders_with_workers_run_side_by_side_on_one_machine(manifest, tmp_path):
    """Two scripts at once, each with its own workers: free ports, so neither takes the other's."""
    script = _script(tmp_path, EVERY_SAMPLE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STOKER_", "PROMETHEUS_"))}
    procs = [subprocess.Popen([sys.executable, str(script), manifest.uri], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    for out, _ in outs:
        seen = json.loads(out.strip().splitlines()[-1])["seen"]
        assert sorted(seen["0"]) == sorted(seen["1"]) == list(range(manifest.num_samples))


STOPPED = """
    import os, sys, time
    from stoker import JobConfig, Loader

    job = JobConfig(manifest_uri=sys.argv[1], epochs=1000, batch_size=16, image_size=64)
    loader = Loader(job, workers=2, format="numpy")
    for step, batch in enumerate(loader):
        if step == 3:
            print("stepping", flush=True)
            if sys.argv[2] == "close":
                loader.close()
                print("closed", flush=True)
                time.sleep(60)  # the test looks at the machine now; the script lives on
            time.sleep(600)  # the test kills the script here
"""


@pytest.mark.parametrize("end", ["close", "SIGKILL"])
def test_the_workers_die_with_the_loader_however_it_ends(manifest, tmp_path, end):
    """close() in the middle of a 1000-epoch job, or the training process killed outright: within the
    deadline, no daemon and no decode process of the loader's is left on the machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STOKER_", "PROMETHEUS_"))}
    script = subprocess.Popen([sys.executable, str(_script(tmp_path, STOPPED)), manifest.uri, end],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        assert script.stdout is not None
        assert script.stdout.readline().strip() == "stepping", script.stderr.read() if script.poll() else ""
        started = set(descendants(script.pid))
        assert len(_alive(started)) >= 3, started  # the daemon and its two decode processes at least
        if end == "close":
            assert script.stdout.readline().strip() == "closed"
        else:
            script.send_signal(signal.SIGKILL)
            script.wait(10)
        # the daemon drains on close and stops at once on its parent's death; its processes follow it
        assert wait_for(lambda: not _alive(started), timeout=30), f"still alive: {_alive(started)}"
    finally:
        script.kill()
        script.wait(10)


def test_a_worker_that_cannot_import_the_jobs_transform_fails_the_loaders_job_with_why(manifest, tmp_path):
    """The transform is importable in the training script (its own folder) but not by the workers, whose
    environment it did not give: the job fails with the workers' reason, it does not hang."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "mine.py").write_text(textwrap.dedent("""
        from stoker.transforms import EvalTransform

        class Small(EvalTransform):
            def __init__(self):
                super().__init__(size=32)
    """))
    script = _script(tmp_path, """
        import sys, time
        sys.path.insert(0, sys.argv[2])
        from stoker import JobConfig, JobFailed, Loader

        job = JobConfig(manifest_uri=sys.argv[1], epochs=1, batch_size=16, transform="mine:Small")
        started = time.monotonic()
        try:
            with Loader(job, workers=1, format="numpy") as loader:
                for batch in loader:
                    pass
        except JobFailed as exc:
            print(f"failed after {time.monotonic() - started:.0f} s: {exc}")
    """)
    run = _run(script, manifest.uri, str(tmp_path / "elsewhere"), timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "failed after" in run.stdout and "mine" in run.stdout, run.stdout + run.stderr[-2000:]
    assert float(run.stdout.split("failed after ")[1].split(" s")[0]) < 60


def test_ranks_in_lockstep_each_with_their_own_workers_get_every_sample_once(manifest, tmp_path):
    """torchrun, two ranks that all-reduce every step, each rank's Loader starting one worker process: two
    daemons serve one plan; every sample once per epoch across the ranks, and equal steps. Each rank also
    keeps step records (issue 49, item 4): `stoker audit` of them says the same, by itself."""
    script = _script(tmp_path, """
        import json, os, sys
        import torch, torch.distributed as dist
        from stoker import JobConfig, Loader, StepRecorder

        dist.init_process_group("gloo")
        job = JobConfig(manifest_uri=sys.argv[1], epochs=2, batch_size=16, image_size=64)
        seen, steps = {}, {}
        with Loader(job, workers=1, format="numpy") as loader:
            recorder = StepRecorder(os.path.join(sys.argv[2], "records"), loader.job, loader.rank)
            while loader.epoch < loader.epochs:
                for batch in loader:
                    dist.all_reduce(torch.ones(1))  # every rank takes each step together
                    recorder.stepped(batch)
                    seen.setdefault(batch.epoch, []).extend(batch.sample_ids.tolist())
                    steps[batch.epoch] = steps.get(batch.epoch, 0) + 1
        out = os.path.join(sys.argv[2], f"rank-{dist.get_rank()}.json")
        with open(out, "w") as f:
            json.dump({"seen": seen, "steps": steps}, f)
        dist.destroy_process_group()
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STOKER_", "PROMETHEUS_"))}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(free_port()), str(script), manifest.uri, str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["steps"] == ranks[1]["steps"]
    for epoch in ("0", "1"):
        together = sorted(ranks[0]["seen"][epoch] + ranks[1]["seen"][epoch])
        assert together == list(range(manifest.num_samples)), epoch
    audit = subprocess.run([sys.executable, "-m", "stoker", "audit", str(tmp_path / "records")], capture_output=True,
                           text=True, timeout=60, cwd=tmp_path, env=env)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    n = manifest.num_samples
    assert [line for line in audit.stdout.splitlines() if line.startswith("epoch")] == [
        f"epoch {e}: exactly once: {n} planned, {n} delivered, 0 duplicated, 0 skipped as unusable, 0 missing"
        for e in (0, 1)]


def test_a_finished_jobs_daemons_leave_at_once_not_after_the_dispatcher_is_gone(manifest, tmp_path):
    """A job shorter than a heartbeat, with more processes than the daemon: the dispatcher keeps answering
    until each host's daemon (not just one of its processes) heard "finished", so the daemons leave by
    themselves at once. Before, a process hearing it counted for its host, the dispatcher closed, and the
    daemon asked a closed port for 15 s more ("no answer from the dispatcher ... nothing listens there")."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STOKER_", "PROMETHEUS_"))}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "stoker", "run", "--data", manifest.uri, "--hosts", "1", "--procs",
                          "4", "--rate", "3000", "--no-progress", "--data-bind", "tcp://127.0.0.1:0", "--control-bind",
                          "tcp://127.0.0.1:0", "--metrics-port", "-1", "--worker-metrics-port", "-1"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    took = time.monotonic() - started
    assert run.returncode == 0, run.stderr[-3000:]
    assert "no answer from the dispatcher" not in run.stderr, run.stderr[-3000:]
    assert took < 15, f"{took:.1f} s for a job of {manifest.num_samples} samples"  # was 20 s and more


def test_two_stoker_runs_at_their_defaults_on_one_machine_both_finish_and_say_where_they_listen(manifest, tmp_path):
    """No port given: a one-machine job takes free ports for its sockets, and a free one for /metrics when
    the default is another job's; each says where, in its first line and its --json."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STOKER_", "PROMETHEUS_"))}
    runs = [subprocess.Popen([sys.executable, "-m", "stoker", "run", "--data", manifest.uri, "--epochs", "3",
                              "--rate", "400", "--no-progress", "--json", str(tmp_path / f"run{i}.json")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
             for i in range(2)]
    outs = [run.communicate(timeout=240) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err[-2000:] for _, err in outs]
    endpoints = [json.loads((tmp_path / f"run{i}.json").read_text())["endpoints"] for i in range(2)]
    for (_, err), where in zip(outs, endpoints, strict=True):
        assert f"metrics on {where['metrics']}" in err and where["control"] in err
    assert len({e["metrics"] for e in endpoints}) == len({e["control"] for e in endpoints}) == 2


AFTER_CLOSE = """
    import gc, json, os, sys, time
    from stoker import JobConfig, Loader, LoaderClosed

    job = JobConfig(manifest_uri=sys.argv[1], epochs=1000, batch_size=16, image_size=64)
    with Loader(job, workers=1, format="numpy") as loader:
        for taken, batch in enumerate(loader):
            if taken == 3:
                before = loader.state_dict()
                break
    after = loader.state_dict()  # a script saves its last checkpoint after its `with`
    try:
        next(iter(loader))
        again = "iterated"
    except LoaderClosed as exc:
        again = str(exc)
    dropped = Loader(job, workers=1, format="numpy")
    for batch in dropped:
        break
    print(json.dumps({"before": before, "after": after, "again": again}), flush=True)
    del dropped, batch
    gc.collect()
    print("dropped", flush=True)
    time.sleep(60)  # the test looks at the machine now
"""


def test_a_closed_loader_keeps_its_position_refuses_to_iterate_and_a_dropped_one_takes_its_workers(manifest,
                                                                                                     tmp_path):
    """After its `with`: state_dict() gives where it stopped (not an error), iterating says it is
    closed. A loader dropped without close() (a notebook cell run again) stops its processes when it
    is collected, not when the interpreter exits."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STOKER_", "PROMETHEUS_"))}
    script = subprocess.Popen([sys.executable, str(_script(tmp_path, AFTER_CLOSE)), manifest.uri],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        assert script.stdout is not None
        line = script.stdout.readline()
        assert line, script.stderr.read() if script.poll() is not None else "no output"
        said = json.loads(line)
        assert said["after"]["epoch"] == said["before"]["epoch"] and said["after"]["step"] >= 3
        assert "closed" in said["again"]
        started = set(descendants(script.pid))
        assert script.stdout.readline().strip() == "dropped"
        assert wait_for(lambda: not _alive(started), timeout=30), f"still alive: {_alive(started)}"
        assert script.poll() is None  # the script lives on: its workers went with the loader
    finally:
        script.kill()
        script.wait(10)


def test_a_dispatcher_that_fails_to_start_is_an_error_at_once_not_a_hang(manifest, monkeypatch):
    """A failure between binding the control socket and serving it (its monitor open, its coroutine
    never run) used to hold the context's term() for ever: `with Loader(...)` never returned."""
    import threading

    from stoker import JobConfig, Loader, StokerError
    from stoker.accel import joining

    def broken(*args, **kwargs):
        raise StokerError("the job spec could not be made")

    monkeypatch.setattr(joining, "job_to_proto", broken)  # rank 0's dispatcher hands out the job it makes
    outcome: list[BaseException | None] = []

    def start() -> None:
        try:
            with Loader(JobConfig(manifest_uri=manifest.uri, batch_size=16), format="numpy"):
                outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - the test reports whatever it was
            outcome.append(exc)

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    thread.join(20)
    assert outcome, "Loader's start hung"
    assert isinstance(outcome[0], StokerError) and "could not be made" in str(outcome[0])
