"""Issue 49, item 3: a fault-tolerant trainer (torchft, from the registry) on a Stoker job, each step counted
only when it commits. examples/train_torchft.py as a user runs it: a torchft lighthouse, `stoker dispatch`
apart (so any replica group may die), a worker daemon, two replica groups (CPU, gloo), each one rank of the
job with `Loader(commit_steps=True)`. Each group is SIGKILLed once inside a step, at its all-reduce
(tests/torchft_crash.py), and started again in place while the other goes on, at the default timeouts.
What the groups committed is every planned document once per epoch; the survivor's step that could not
commit came again and was committed once; each restarted group went on from its last commit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from stoker.pipeline.job import JobConfig
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.lm_layout import LMConfig
from tests.helpers import Daemon, free_port, wait_for
from tests.token_corpus import prepared

ROOT = Path(__file__).resolve().parents[2]
EPOCHS = 2
KILL_AT = {1: 30, 0: 180}  # group -> the all-reduce call it dies in (2 per step: epoch 0 step 14, epoch 1 about 20)
RUN_S = 480.0  # the whole job, deaths and restarts included (about 50 s here alone, 5 minutes beside two busy loops)


@pytest.fixture(scope="module")
def token_set(tmp_path_factory) -> Manifest:
    """160 documents: about 70 steps an epoch per group."""
    return prepared(tmp_path_factory.mktemp("tokens"), count=160, docs_per_shard=40)[0].manifest


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}


class _Group:
    """One replica group: its first run dies at KILL_AT, then it is started again, plain, until it exits."""

    def __init__(self, group: int, args: list[str], log_dir: Path, env: dict[str, str]) -> None:
        self.group, self.args, self.log_dir, self.env = group, args, log_dir, env
        self.runs: list[int] = []  # exit codes so far
        self.proc = self._start(["-m", "tests.torchft_crash", str(KILL_AT[group])])

    def _start(self, launcher: list[str]) -> subprocess.Popen:
        log = open(self.log_dir / f"group{self.group}-run{len(self.runs)}.log", "w")
        return subprocess.Popen([sys.executable, *launcher, "examples/train_torchft.py", *self.args, "--group",
                                 str(self.group)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=self.env)

    def poll(self) -> bool:
        """True once its last run has exited; a killed first run is started again at once."""
        code = self.proc.poll()
        if code is None or len(self.runs) == 2:
            return code is not None
        self.runs.append(code)
        if len(self.runs) == 1 and code == -signal.SIGKILL:
            self.proc = self._start([])
            return False
        return True

    def output(self) -> str:
        return "".join(p.read_text() for p in sorted(self.log_dir.glob(f"group{self.group}-run*.log")))


def _gaps(steps: list[tuple[int, int]]) -> str:
    per_epoch = Counter(epoch for epoch, _ in steps)
    return ", ".join(f"epoch {e}: {n} steps, last {max(s for x, s in steps if x == e)}" for e, n in per_epoch.items())


def _planned(manifest: Manifest) -> list[list[int]]:
    job = JobConfig(manifest_uri=manifest.uri, dataset="tokens", epochs=EPOCHS, batch_size=4, lm=LMConfig(64),
                    world_size=2)
    plan = job.plan(manifest)
    return [sorted(int(i) for unit in plan.units(epoch) for i in unit.sample_ids()) for epoch in range(EPOCHS)]


def _start_services(manifest: Manifest, tmp_path: Path, log_dir: Path) -> tuple[list[subprocess.Popen], str, str]:
    """The lighthouse (torchft's README flags) and the job's dispatcher; returns them, the lighthouse's URL and
    the dispatcher's endpoint."""
    lighthouse_port, control = free_port(), f"tcp://127.0.0.1:{free_port()}"
    lighthouse = subprocess.Popen([str(Path(sys.executable).with_name("torchft_lighthouse")), "--min_replicas", "1",
                                   "--quorum_tick_ms", "100", "--join_timeout_ms", "10000", "--bind",
                                   f"127.0.0.1:{lighthouse_port}"],
                                  stdout=open(log_dir / "lighthouse.log", "w"), stderr=subprocess.STDOUT)
    dispatcher = subprocess.Popen(
        [sys.executable, "-m", "stoker", "--log-level", "INFO", "dispatch", "--data", manifest.uri, "--dataset",
         "tokens", "--world-size", "2", "--lm-seq-len", "64", "--batch-size", "4", "--epochs", str(EPOCHS),
         "--control-bind", control, "--metrics-port", "-1", "--job-secret", str(tmp_path / "job.key")],
        stdout=open(log_dir / "dispatcher.log", "w"), stderr=subprocess.STDOUT, cwd=ROOT, env=_env())
    assert wait_for((tmp_path / "job.key").exists, timeout=60), (log_dir / "dispatcher.log").read_text()
    return [lighthouse, dispatcher], f"http://127.0.0.1:{lighthouse_port}", control


def _run(manifest: Manifest, tmp_path: Path, log_dir: Path) -> tuple[dict[int, _Group], subprocess.Popen]:
    services, lighthouse, control = _start_services(manifest, tmp_path, log_dir)
    (tmp_path / "state").mkdir()
    Daemon(control, "host0", 2, log_dir)
    groups: dict[int, _Group] = {}
    try:
        for group in (0, 1):
            args = [control, "--job-secret", str(tmp_path / "job.key"), "--groups", "2", "--state-dir",
                    str(tmp_path / "state"), "--vocab-size", "300", "--commits", str(tmp_path / f"commits{group}")]
            groups[group] = _Group(group, args, log_dir, _env() | {"TORCHFT_LIGHTHOUSE": lighthouse})
        deadline = time.monotonic() + RUN_S
        while not all([g.poll() for g in groups.values()]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all(g.proc.poll() is not None for g in groups.values()), \
            f"the job did not end in {RUN_S:.0f} s: " + "".join(g.output()[-3000:] for g in groups.values())
        assert services[1].wait(timeout=60) == 0, (log_dir / "dispatcher.log").read_text()[-3000:]
        return groups, services[1]
    finally:
        for proc in [*services, *(g.proc for g in groups.values())]:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.mark.timeout(600)
def test_replica_groups_killed_mid_step_and_restarted_commit_every_document_of_every_epoch_once(
        token_set, tmp_path, log_dir):
    groups, _ = _run(token_set, tmp_path, log_dir)
    for group in groups.values():
        assert group.runs == [-signal.SIGKILL, 0], (group.group, group.runs, group.output()[-3000:])
        assert f"killed inside step {KILL_AT[group.group]}, at its all-reduce" in group.output()
    commits = {g: [json.loads(line) for line in (tmp_path / f"commits{g}").read_text().splitlines()] for g in groups}
    for g, rows in commits.items():
        steps = [(r["epoch"], r["step"]) for r in rows]
        assert steps == sorted(set(steps)), f"group {g}: a step committed twice, or out of order"
        first, second = (r for r in rows if r["pid"] == rows[0]["pid"]), (r for r in rows if r["pid"] != rows[0]["pid"])
        last_before, first_after = list(first)[-1], next(second)
        assert (first_after["epoch"], first_after["step"]) in {(last_before["epoch"], last_before["step"] + 1),
                                                               (last_before["epoch"] + 1, 0)}, \
            f"group {g} went on from {first_after}, not from its last commit {last_before}"
        per_epoch = Counter(epoch for epoch, _ in steps)
        assert steps == [(e, s) for e in range(EPOCHS) for s in range(per_epoch[e])], \
            f"group {g}: its committed steps are not every step of every epoch: {_gaps(steps)}"
    assert len({tuple(Counter(r["epoch"] for r in rows).values()) for rows in commits.values()}) == 1, \
        "the groups committed different numbers of steps in an epoch"
    for epoch, planned in enumerate(_planned(token_set)):
        got = sorted(d for rows in commits.values() for r in rows if r["epoch"] == epoch for d in r["documents"])
        assert got == planned, f"epoch {epoch}: {len(got)} committed, {len(set(got))} distinct, {len(planned)} planned"
    not_committed = [line for g in groups.values() for line in g.output().splitlines() if "not committed" in line]
    assert not_committed, "no survivor's step failed to commit: the kills did not land inside a step"
