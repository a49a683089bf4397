"""Soak: each restart-in-place and kill shape, run again and again, at the default timeouts.

A real torchrun DDP job (tests/ddp_script.py: gloo, an all-reduce every step, every stepped
sample id recorded) of 3 ranks is fed by long-lived `stoker worker` daemons at their defaults
(--leave-after included). Rank 0 saves the data position at a step, every rank crashes a few
steps later (no goodbye), and the same script is run again from the checkpoint while the daemons
run on. Shapes:

- same-world-epoch0: 3 ranks again, the checkpoint in epoch 0, 2 daemons
- same-world-later-epoch: 3 ranks again, the checkpoint in epoch 1, 2 daemons
- fewer-ranks: resumed by 2 ranks, 2 daemons
- more-ranks-4-daemons: resumed by 4 ranks, 4 daemons
- host-killed-in-restart: 3 ranks again, 4 daemons, one SIGKILLed 2 s into the restart

A run passes when the resumed job exits 0 within RESUME_TIMEOUT_S, every sample is stepped once
per epoch across the two runs (the checkpoint's epoch: the steps before it plus the resumed ones),
and every rank of the resumed run takes the same steps each epoch. Half the runs of each shape go
beside two busy loops (two cores' worth of competing work on this 2-core machine). Reported per
shape: passes of runs, and the longest gap between two steps of the resumed run, counting the
time from its launch to its first step (wall clock: what a stalled restart costs).

`python -m benchmarks soak [RUNS]` (default 10 per shape); results: benchmarks/results/soak.{json,md}.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import free_port
from benchmarks.report import header, write_results
from stoker.pipeline.images.synth import SynthConfig, generate
from stoker.pipeline.prepare import PrepareConfig, prepare_imagenet

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "tests" / "ddp_script.py"
IMAGES = 157  # divides by neither the world size nor the batch size: ranks' streams differ
CLASSES = 4  # the script's linear model has 4 outputs
RANKS = 3
COMMON = ("--model", "linear", "--batch-size", "8", "--epochs", "3")
CRASH_TIMEOUT_S = 180.0
RESUME_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Shape:
    name: str
    save_at: int  # rank 0 saves the data position after this many steps (7 steps an epoch at 3 ranks)
    crash_after: int  # every rank dies after this many
    resume_ranks: int
    daemons: int
    kill_host_in_restart: bool = False


SHAPES = (Shape("same-world-epoch0", 4, 10, 3, 2), Shape("same-world-later-epoch", 9, 16, 3, 2),
          Shape("fewer-ranks", 9, 14, 2, 2), Shape("more-ranks-4-daemons", 9, 14, 4, 4),
          Shape("host-killed-in-restart", 9, 14, 3, 4, kill_host_in_restart=True))


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["PYTHONPATH"] = str(ROOT)
    return env


class _Fleet:
    """Daemons at their defaults that outlive jobs, as systemd units do."""

    def __init__(self, port: int, count: int, logs: Path) -> None:
        self.logs = [logs / f"host{i}.log" for i in range(count)]
        self.procs = [subprocess.Popen([sys.executable, "-m", "stoker", "--log-level", "INFO", "worker",
                                        "--dispatcher", f"tcp://127.0.0.1:{port}", "--procs", "1", "--host-id",
                                        f"host{i}", "--metrics-port", "-1"], env=_env(),
                                       stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
                      for i, log in enumerate(self.logs)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all("registering with" in log.read_text() for log in self.logs):
            time.sleep(0.2)

    def kill(self, index: int) -> None:
        os.killpg(self.procs[index].pid, signal.SIGKILL)

    def stop(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)


def _torchrun(manifest: str, out: Path, port: int, ranks: int, *extra: str) -> subprocess.Popen:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return subprocess.Popen([torchrun, "--nproc-per-node", str(ranks), "--master-port", str(free_port()), str(SCRIPT),
                             "--data", manifest, "--out", str(out), "--control-port", str(port), *COMMON, *extra],
                            env=_env(), stdout=open(out / "torchrun.log", "a"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _finish(job: subprocess.Popen, out: Path, timeout_s: float) -> int | None:
    """The job's exit code, or None when it ran past `timeout_s` (then it and its ranks are killed)."""
    try:
        code: int | None = job.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.wait()
    subprocess.run(["pkill", "-KILL", "-f", f"ddp_script.py .*--out {out}( |$)"], capture_output=True)
    return code


def _records(out: Path, ranks: int, suffix: str) -> dict[int, list[dict]]:
    found = {}
    for rank in range(ranks):
        lines = [json.loads(line) for line in (out / f"rank-{rank}{suffix}.jsonl").read_text().splitlines()]
        found[rank] = [x for x in lines if "step" in x]
    return found


def _check(before: dict[int, list[dict]], state: dict, rest: dict[int, list[dict]]) -> str:
    """"" when the two runs stepped every sample once per epoch with equal steps per rank; else what broke."""
    stepped_before = [s for steps in before.values() for s in steps
                      if (s["epoch"], s["step"]) < (state["epoch"], state["step"])]
    for epoch in range(state["epoch"], 3):
        streams = [[s for s in steps if s["epoch"] == epoch] for steps in rest.values()]
        if len({len(stream) for stream in streams}) != 1:
            return f"epoch {epoch}: unequal steps per rank {[len(s) for s in streams]}"
        ids = [i for stream in streams for s in stream for i in s["ids"]]
        if epoch == state["epoch"]:
            ids += [i for s in stepped_before if s["epoch"] == epoch for i in s["ids"]]
        if sorted(ids) != list(range(IMAGES)):
            return f"epoch {epoch}: {len(ids)} samples stepped, {len(set(ids))} of {IMAGES} distinct"
    return ""


def _longest_gap(launched: float, steps: list[dict]) -> float:
    times = [launched] + [s["at"] for s in steps]
    return max(b - a for a, b in zip(times, times[1:], strict=False))


def make_data(folder: Path) -> str:
    """The job's images: synthetic JPEGs of CLASSES classes, prepared into shards; the manifest's path."""
    generate(folder / "raw", SynthConfig(images=IMAGES, classes=CLASSES), processes=2, progress=False)
    prepared = prepare_imagenet(folder / "raw", folder / "shards", PrepareConfig(progress=False, processes=2))
    return prepared.manifest.uri


def soak_once(manifest: str, shape: Shape, busy: bool, logs: Path) -> dict:
    """One run of a shape: crash, then resume; its verdict and the longest gap after the restart."""
    out = Path(tempfile.mkdtemp(prefix=f"soak-{shape.name}-", dir=logs))
    port = free_port()
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 if busy else 0)]
    fleet = _Fleet(port, shape.daemons, out)
    try:
        crashed = _finish(_torchrun(manifest, out, port, RANKS, "--save-at", str(shape.save_at), "--crash-after",
                                    str(shape.crash_after)), out, CRASH_TIMEOUT_S)
        if crashed in (0, None):
            return {"passed": False, "why": f"the first run exited {crashed}, not by its crash", "out": str(out)}
        state = json.loads((out / "state.json").read_text())
        before = _records(out, RANKS, "")
        launched = time.time()
        job = _torchrun(manifest, out, port, shape.resume_ranks, "--resume")
        if shape.kill_host_in_restart:
            time.sleep(2)
            fleet.kill(0)
        code = _finish(job, out, RESUME_TIMEOUT_S)
        if code != 0:
            return {"passed": False, "why": f"the resumed run exited {code} (None: hung past "
                                            f"{RESUME_TIMEOUT_S:.0f} s)", "out": str(out)}
        rest = _records(out, shape.resume_ranks, "-resumed")
        why = _check(before, state, rest)
        gap = _longest_gap(launched, rest[0])
        return {"passed": not why, "why": why, "longest_gap_s": round(gap, 2), "out": str(out)}
    finally:
        fleet.stop()
        for loop in loops:
            loop.kill()
            loop.wait()


def main(runs: int = 10) -> None:
    logs = Path(tempfile.mkdtemp(prefix="stoker-soak-"))
    manifest = make_data(logs / "data")
    result = header("soak", "torch", "pyzmq")
    result |= {"runs_per_shape": runs, "shapes": {}, "logs": str(logs)}
    rows = []
    for shape in SHAPES:
        outcomes = []
        for i in range(runs):
            busy = i % 2 == 1
            outcome = soak_once(manifest, shape, busy, logs) | {"busy": busy}
            outcomes.append(outcome)
            verdict = "pass" if outcome["passed"] else f"FAIL: {outcome['why']} (logs: {outcome['out']})"
            gap = f", longest gap {outcome['longest_gap_s']} s" if "longest_gap_s" in outcome else ""
            print(f"{shape.name} run {i + 1}/{runs}{' (busy)' if busy else ''}: {verdict}{gap}", flush=True)
        gaps = [o["longest_gap_s"] for o in outcomes if "longest_gap_s" in o]
        passed = sum(o["passed"] for o in outcomes)
        busy_passed = sum(o["passed"] for o in outcomes if o["busy"])
        result["shapes"][shape.name] = {"passed": passed, "runs": runs, "busy_passed": busy_passed,
                                        "busy_runs": sum(o["busy"] for o in outcomes),
                                        "longest_gap_s": max(gaps, default=None),
                                        "median_longest_gap_s": statistics.median(gaps) if gaps else None,
                                        "runs_detail": outcomes}
        rows.append(f"| {shape.name} | {passed} of {runs} | {busy_passed} of {sum(o['busy'] for o in outcomes)} | "
                    f"{max(gaps, default=float('nan')):.1f} | "
                    f"{statistics.median(gaps) if gaps else float('nan'):.1f} |")
    table = ("| shape | passed | of them beside two busy loops | longest gap after the restart, s (worst run) "
             "| median run's longest gap, s |\n|---|---|---|---|---|\n" + "\n".join(rows))
    print(table)
    write_results("soak", result, table)


if __name__ == "__main__":
    main()
