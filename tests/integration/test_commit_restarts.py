"""Issue 49, items F1 and F3: ranks of a committing job (`Loader(commit_steps=True)`, as a torchft replica group makes
it) that die and come back, without torchft. `stoker dispatch` apart, one worker daemon with one decode process, two
ranks, each a process of its own (this module run as a script) that commits every batch it is given, saves its
position after each commit, and, when told, is SIGKILLed as its n-th batch is given: right after it committed the
last step of its first unit, before that unit's ack left (the ack is held back in that life, so the kill lands in
that window every run; unheld, it did in 3 runs of 3 here).

- F1: a rank killed twice in a row, its second life before it committed anything, is fed by its third life and the
  job ends. The unit whose ack died with the first life went back to the queue, was leased for a consumer whose start
  is past it, and stayed leased to the one worker process (a second unit of the rank beside the one it made), never
  acked: the dispatcher stayed one unit short of done.
- F3: a rank started again only after the other rank finished its whole stream completes its own, and the dispatcher
  counts every unit done and exits (it stayed at 19 of 20 units, for ever). The other rank, saving its position
  after each commit while this one is dead, waits for the dead rank's batch count once, not at each step.

Every rank's committed steps are every step of every epoch once, and the committed documents the planned ones once.
"""

from __future__ import annotations

import argparse
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
WORLD = 2
FIRST_UNIT = 14  # batches of rank 1's first unit in epoch 0 (this corpus, seed 0): a life killed at batch 15 has
# committed that unit's last step and no more
SURVIVOR_S = 90.0  # rank 0's steps with rank 1 dead: seconds here (the test, 30 s); at 2 s a state_dict, 260 s
SHORT = ("--host-timeout", "3", "--stall-report", "20", "--stall-timeout", "90")  # a run that fails in minutes


@pytest.fixture(scope="module")
def token_set(tmp_path_factory) -> Manifest:
    """160 documents in 4 shards: about 70 steps an epoch per rank, 5 units per rank and epoch."""
    return prepared(tmp_path_factory.mktemp("tokens"), count=160, docs_per_shard=40)[0].manifest


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}


def _planned(manifest: Manifest) -> list[list[int]]:
    job = JobConfig(manifest_uri=manifest.uri, dataset="tokens", epochs=EPOCHS, batch_size=4, lm=LMConfig(64),
                    world_size=WORLD)
    plan = job.plan(manifest)
    return [sorted(int(i) for unit in plan.units(epoch) for i in unit.sample_ids()) for epoch in range(EPOCHS)]


class _Job:
    """`stoker dispatch` and one worker daemon with one decode process; ranks started, and killed, at will."""

    def __init__(self, manifest: Manifest, tmp_path: Path, log_dir: Path, dispatch_flags: tuple[str, ...]) -> None:
        self.tmp, self.log_dir = tmp_path, log_dir
        self.control = f"tcp://127.0.0.1:{free_port()}"
        self.secret = tmp_path / "job.key"
        self.dispatcher = subprocess.Popen(
            [sys.executable, "-m", "stoker", "--log-level", "INFO", "dispatch", "--data", manifest.uri, "--dataset",
             "tokens", "--world-size", str(WORLD), "--lm-seq-len", "64", "--batch-size", "4", "--epochs",
             str(EPOCHS), "--control-bind", self.control, "--metrics-port", "-1", "--job-secret", str(self.secret),
             *dispatch_flags], stdout=open(log_dir / "dispatcher.log", "w"), stderr=subprocess.STDOUT, cwd=ROOT,
            env=_env())
        assert wait_for(self.secret.exists, timeout=60), self.dispatcher_log()
        self.daemon = Daemon(self.control, "host0", 1, log_dir)
        self.lives: dict[int, list[subprocess.Popen]] = {rank: [] for rank in range(WORLD)}

    def start(self, rank: int, die_at: int = 0, save: bool = True) -> subprocess.Popen:
        """A life of `rank`, from its saved position if any; SIGKILLed as its `die_at`-th batch is given (0: never).
        `save`: it saves its position after each commit."""
        life = len(self.lives[rank])
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.test_commit_restarts", self.control, str(self.secret),
             str(rank), str(self.state(rank)), str(self.tmp / f"commits{rank}"), str(die_at), str(int(save))],
            stdout=open(self.log_dir / f"rank{rank}-life{life}.log", "w"), stderr=subprocess.STDOUT, cwd=ROOT,
            env=_env())
        self.lives[rank].append(proc)
        return proc

    def state(self, rank: int) -> Path:
        return self.tmp / f"rank{rank}.json"

    def wait(self, proc: subprocess.Popen, timeout: float, what: str) -> int:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{what} did not end in {timeout:.0f} s:\n{self.output()}") from None

    def commits(self, rank: int) -> list[dict]:
        path = self.tmp / f"commits{rank}"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def dispatcher_log(self) -> str:
        return (self.log_dir / "dispatcher.log").read_text()

    def output(self) -> str:
        logs = sorted(self.log_dir.glob("rank*-life*.log"))
        return "".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in logs) + \
            f"--- dispatcher\n{self.dispatcher_log()[-4000:]}--- worker\n{self.daemon.output()[-3000:]}"

    def close(self) -> None:
        for proc in [self.dispatcher, *(p for lives in self.lives.values() for p in lives)]:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        self.daemon.stop()


def _killed_after_its_first_unit(job: _Job, proc: subprocess.Popen) -> None:
    """Rank 1's first life died as batch FIRST_UNIT + 1 was given: its saved position is past its first unit,
    exactly (else the kill did not land where the test needs it)."""
    assert job.wait(proc, 120, "rank 1's first life") == -signal.SIGKILL, job.output()
    saved = json.loads(job.state(1).read_text())
    assert (saved["epoch"], saved["step"], saved["ranks"][1]) == (0, FIRST_UNIT, [1, 0]), saved


def _check(job: _Job, manifest: Manifest) -> None:
    """The dispatcher counted every unit done and exited; every rank committed every step of every epoch once, in
    order; the committed documents are the planned ones once."""
    assert job.wait(job.dispatcher, 60, "the dispatcher") == 0, job.output()
    assert "dispatcher done: 20/20 units" in job.dispatcher_log(), job.output()
    commits = {rank: job.commits(rank) for rank in range(WORLD)}
    for rank, rows in commits.items():
        steps = [(r["epoch"], r["step"]) for r in rows]
        per_epoch = Counter(epoch for epoch, _ in steps)
        assert steps == [(e, s) for e in range(EPOCHS) for s in range(per_epoch[e])], \
            f"rank {rank}: its committed steps are not every step of every epoch once: {per_epoch}"
    for epoch, planned in enumerate(_planned(manifest)):
        got = sorted(d for rows in commits.values() for r in rows if r["epoch"] == epoch for d in r["documents"])
        assert got == planned, f"epoch {epoch}: {len(got)} committed, {len(set(got))} distinct, {len(planned)} planned"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("flags", [(), SHORT], ids=["default-timeouts", "short-timeouts"])
def test_a_rank_killed_twice_in_a_row_before_its_second_life_commits_is_fed_by_its_third(token_set, tmp_path,
                                                                                         log_dir, flags):
    job = _Job(token_set, tmp_path, log_dir, flags)
    try:
        other = job.start(0, save=False)
        _killed_after_its_first_unit(job, job.start(1, die_at=FIRST_UNIT + 1))
        assert job.wait(job.start(1, die_at=1), 120, "rank 1's second life") == -signal.SIGKILL, job.output()
        assert len(job.commits(1)) == FIRST_UNIT, "rank 1's second life committed a step"
        assert job.wait(job.start(1), 240, "rank 1's third life") == 0, job.output()
        assert job.wait(other, 60, "rank 0") == 0, job.output()
        _check(job, token_set)
    finally:
        job.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("flags", [(), SHORT], ids=["default-timeouts", "short-timeouts"])
def test_a_rank_started_again_after_the_other_finished_the_job_completes_and_the_dispatcher_exits(token_set, tmp_path,
                                                                                                 log_dir, flags):
    job = _Job(token_set, tmp_path, log_dir, flags)
    try:
        other = job.start(0)  # saves its position after each commit, as a torchft group does
        _killed_after_its_first_unit(job, job.start(1, die_at=FIRST_UNIT + 1))
        alone = time.monotonic()
        assert job.wait(other, 180, "rank 0") == 0, job.output()
        # its state_dict waits for the dead rank's batch count once, not 2 s at each of its ~130 steps left
        assert time.monotonic() - alone < SURVIVOR_S, f"rank 0 took {time.monotonic() - alone:.0f} s alone"
        assert job.wait(job.start(1), 240, "rank 1's second life") == 0, job.output()
        _check(job, token_set)
    finally:
        job.close()


def _rank_main() -> None:
    """One rank, as a torchft replica group runs it (examples/train_torchft.py) with the model left out. A life told
    to die holds back the ack of its last commit's unit (as a kill right after the commit loses it) and is
    SIGKILLed as its next batch is given."""
    from stoker import ConsumerConfig, Loader
    from stoker.accel.control.remote import RemoteDispatcher

    parser = argparse.ArgumentParser()
    for name in ("dispatcher", "secret", "rank", "state", "commits", "die_at", "save"):
        parser.add_argument(name)
    args = parser.parse_args()
    state, die_at, given = Path(args.state), int(args.die_at), 0
    config = ConsumerConfig(data_bind="tcp://127.0.0.1:0", dispatcher=args.dispatcher, job_secret=args.secret,
                            metrics_port=None)
    loader = Loader(config=config, rank=int(args.rank), world_size=WORLD, commit_steps=True, format="numpy")
    if state.exists():
        loader.load_state_dict(json.loads(state.read_text()))
    with loader:
        while loader.epoch < loader.epochs:
            for batch in loader:
                given += 1
                if given == die_at:
                    print(f"killed as batch {given} (epoch {batch.epoch} step {batch.step}) is given", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                if given == die_at - 1:
                    RemoteDispatcher.ack = lambda self, unit_id, batches=None: True  # type: ignore[method-assign]
                time.sleep(0.02)  # a step
                loader.commit(batch)
                if args.save == "1":
                    state.with_suffix(".tmp").write_text(json.dumps(loader.state_dict()))
                    os.replace(state.with_suffix(".tmp"), state)
                with open(args.commits, "a") as log:
                    log.write(json.dumps({"pid": os.getpid(), "epoch": batch.epoch, "step": batch.step,
                                          "documents": batch.sample_ids.tolist()}) + "\n")


if __name__ == "__main__":
    _rank_main()
