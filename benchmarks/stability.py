"""Stable under neighbours: `stoker calibrate` and `stoker run` beside two busy loops against the same
commands on a quiet host, for the built-in crop, the TrivialAugment example and BERT packed.

Each figure is a rate per CPU-second (the workers' and the calibration's own clock), measured
`repeats` times quiet and `repeats` times beside one busy loop per core, alternating; the medians
are compared. The wall-clock rate of the same calibrations is printed beside them: it is what
the neighbours take, and what a rate by the clock would have reported. The figures go to
benchmarks/results/stability.{json,md}.

    python -m benchmarks stability [REPEATS]
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import numpy as np
from PIL import Image

from benchmarks.report import header, write_results
from benchmarks.transform_example import EXAMPLE
from stoker.calibrate import _pinned as pinned
from stoker.calibrate import imagenet_rate, wikipedia_rate
from stoker.datasets import default_imagenet, default_wikipedia
from stoker.pipeline.store.shards import Manifest

SECONDS = 4.0  # CPU-seconds per calibration
AGREE = 0.10  # the goal: busy within 10% of quiet
T = TypeVar("T")
TRIVIALAUGMENT = ("stoker_trivialaugment:TrivialAugmentWide", '{"size": 176}')


# a loop that dies with its parent (PR_SET_PDEATHSIG, SIGKILL): a measurement killed before its `finally` (a
# pytest killed mid-test) left two loops spinning on a core for 50 minutes under everything measured after it
SPIN = ("import ctypes, os, sys\nctypes.CDLL(None).prctl(1, 9)\nif os.getppid() == 1: sys.exit()\n"
        "os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass")


@contextlib.contextmanager
def busy_loops(count: int, cores: list[int] | None = None) -> Iterator[None]:
    """`count` processes that spin for ever, loop i pinned to the i-th of `cores` (round robin; every core
    of this process's set by default, so with one per core every core is shared, whatever the load
    balancer would do), killed on the way out."""
    cores = cores or sorted(os.sched_getaffinity(0))
    loops = [subprocess.Popen([sys.executable, "-c", SPIN, str(cores[i % len(cores)])]) for i in range(count)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait(10)


def fixed_work_rate(seconds: float = 0.3) -> float:
    """Rounds of a fixed piece of interpreter work per CPU-second of the calling thread. No CPU clock
    sees what a busy hyperthread sibling or a lower all-core clock takes from a core; a fixed amount
    of work shows it: quiet and busy rates of this loop differ by what the hardware lost, not by the
    time the neighbours took."""
    started, rounds = time.thread_time(), 0
    while time.thread_time() - started < seconds:
        table = {i: i * i for i in range(500)}
        sum(v for k, v in table.items() if k % 3)
        rounds += 1
    return rounds / (time.thread_time() - started)


@functools.cache
def _reference_jpeg() -> bytes:
    """A fixed 500 x 375 JPEG (ImageNet's median size) of seeded noise over a gradient, quality 90."""
    rng = np.random.default_rng(0)
    gradient = np.linspace(0, 200, 500, dtype=np.float32)[None, :, None]
    pixels = np.clip(gradient + rng.normal(0, 25, (375, 500, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


@contextlib.contextmanager
def switched_loops(count: int, cores: list[int]) -> Iterator[Callable[[bool], None]]:
    """`count` spinning processes on `cores` (round robin), stopped at first; the switch it gives runs
    (True) or stops (False) them all, so that one stream of work can alternate quiet and busy slices.
    Killed on the way out."""
    loops = [subprocess.Popen([sys.executable, "-c", SPIN, str(cores[i % len(cores)])]) for i in range(count)]

    def switch(busy: bool) -> None:
        for loop in loops:
            os.kill(loop.pid, signal.SIGCONT if busy else signal.SIGSTOP)

    try:
        time.sleep(0.5)  # pinned and spinning before the first stop
        switch(False)
        yield switch
    finally:
        for loop in loops:
            loop.kill()
            loop.wait(10)


def interleaved(items: Iterable[T], count: Callable[[T], float], switch: Callable[[bool], None],
                slice_s: float = 0.25, total_s: float = 6.0) -> tuple[float, float]:
    """(busy / quiet per CPU-second of this process, busy / quiet by the wall clock) of one stream of work,
    its slices of `slice_s` CPU-seconds alternately quiet and beside the switched loops, until `total_s`
    CPU-seconds are counted (the first item is a warm-up). Each item is counted whole in the state it was
    made in. Alternating within one stream, the same work is measured in both states within a second of
    each other: the host's own drift (tens of percent over a minute here) cancels, which separate
    quiet and busy measurements, even bracketed, could not do."""
    totals = {False: [0.0, 0.0, 0.0], True: [0.0, 0.0, 0.0]}  # state -> [work, CPU-seconds, wall seconds]
    busy, stream = False, iter(items)
    next(stream)
    cpu, wall = time.process_time(), time.perf_counter()
    sliced = cpu
    for item in stream:
        made = count(item)
        now, clock = time.process_time(), time.perf_counter()
        totals[busy][0] += made
        totals[busy][1] += now - cpu
        totals[busy][2] += clock - wall
        if totals[False][1] + totals[True][1] >= total_s:
            break
        if now - sliced >= slice_s:
            busy = not busy
            switch(busy)
            sliced = time.process_time()
        cpu, wall = time.process_time(), time.perf_counter()
    switch(False)
    (quiet_work, quiet_cpu, quiet_wall), (busy_work, busy_cpu, busy_wall) = totals[False], totals[True]
    if not quiet_work or not busy_work:
        raise ValueError(f"no work counted in one state (quiet {quiet_work}, busy {busy_work}): slices too long")
    return ((busy_work / busy_cpu) / (quiet_work / quiet_cpu), (busy_work / busy_wall) / (quiet_work / quiet_wall))


def fixed_decodes() -> Iterator[int]:
    """Decodes of one fixed JPEG, resized to 224 x 224, for ever: 1 for each."""
    data = _reference_jpeg()
    while True:
        with Image.open(io.BytesIO(data)) as image:
            image.convert("RGB").resize((224, 224))
        yield 1


def fixed_decode_rate(seconds: float = 0.3) -> float:
    """Decodes of one fixed JPEG, resized to 224 x 224, per CPU-second of the calling thread: native code
    with a working set like a decode's. A core shared with other processes costs such work through its
    caches, refilled after each switch back, which no CPU clock leaves out; the interpreter loop above,
    with almost no working set, hardly shows it (on a shared CI host it ran faster beside busy loops,
    where the crop calibration lost an eighth)."""
    data = _reference_jpeg()
    started, rounds = time.thread_time(), 0
    while time.thread_time() - started < seconds:
        with Image.open(io.BytesIO(data)) as image:
            image.convert("RGB").resize((224, 224))
        rounds += 1
    return rounds / (time.thread_time() - started)


def _clocked(measure: Callable[[], float]) -> tuple[float, float]:
    """(rate per CPU-second, the same by the wall clock) of one calibration."""
    cpu, wall = time.process_time(), time.perf_counter()
    rate = measure()
    return rate, rate * (time.process_time() - cpu) / (time.perf_counter() - wall)


def _pinned(measure: Callable[[], float]) -> Callable[[], float]:
    """`measure` to run on one core, as `stoker calibrate` runs it."""
    return lambda: pinned(measure)


def calibrations(imagenet: Manifest, wikipedia: Manifest) -> dict[str, Callable[[], float]]:
    sys.path.insert(0, str(EXAMPLE))
    return {"mlperf crop 224": _pinned(lambda: imagenet_rate(imagenet, SECONDS)),
            "trivialaugment 176": _pinned(lambda: imagenet_rate(imagenet, SECONDS, *TRIVIALAUGMENT)),
            "bert 512 packed": _pinned(lambda: wikipedia_rate(wikipedia, SECONDS, pack=True))}


def runs() -> dict[str, list[str]]:
    """`stoker run` arguments of each case (the default device: a simulated A100 at 1/10 scale; text whole)."""
    return {"mlperf crop 224": ["--epochs", "1"],
            "trivialaugment 176": ["--epochs", "1", "--transform", TRIVIALAUGMENT[0],
                                   "--transform-params", TRIVIALAUGMENT[1]],
            "bert 512 packed": ["--dataset", "wikipedia", "--pack", "--seq-len", "512", "--epochs", "1"]}


def run_rate(args: list[str]) -> dict:
    """One `stoker run`: its rows per CPU-second and how long its workers waited for a core."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "summary.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLE), os.environ.get("PYTHONPATH")]))}
        done = subprocess.run([sys.executable, "-m", "stoker", "run", *args, "--no-progress", "--json", str(out),
                               "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                               "--metrics-port", "-1", "--worker-metrics-port", "-1"],
                              capture_output=True, text=True, timeout=900, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"stoker run {' '.join(args)} failed: {done.stderr[-2000:]}")
        summary = json.loads(out.read_text())
    return {"per_core_rate": summary["per_core_rate"], "cpu_wait_fraction": summary["cpu_wait_fraction"],
            "rows_per_s": summary["rows_per_s"]}


def _compare(quiet: list[float], busy: list[float]) -> dict:
    q, b = statistics.median(quiet), statistics.median(busy)
    return {"quiet": quiet, "busy": busy, "quiet_median": q, "busy_median": b, "busy_over_quiet": b / q,
            "agrees": abs(b / q - 1) <= AGREE}


def main(repeats: int = 3) -> dict:
    loops = os.cpu_count() or 2
    imagenet, wikipedia = Manifest.load(str(default_imagenet())), Manifest.load(str(default_wikipedia()))
    result: dict = {**header("stability", "pillow-simd", "torch"), "repeats": repeats, "busy_loops": loops,
                    "calibrate_seconds": SECONDS, "calibrate": {}, "run": {}}
    hardware: dict[str, list[float]] = {"quiet": [], "busy": []}
    for _ in range(repeats):
        hardware["quiet"].append(pinned(fixed_work_rate))
        with busy_loops(loops):
            hardware["busy"].append(pinned(fixed_work_rate))
    result["fixed_work"] = _compare(hardware["quiet"], hardware["busy"])
    print(f"a fixed interpreter loop: busy / quiet {result['fixed_work']['busy_over_quiet']:.3f} per CPU-second "
          "(what the hardware itself lost beside the loops)", flush=True)
    for name, measure in calibrations(imagenet, wikipedia).items():
        found: dict[str, list[tuple[float, float]]] = {"quiet": [], "busy": []}
        for _ in range(repeats):
            found["quiet"].append(_clocked(measure))
            with busy_loops(loops):
                found["busy"].append(_clocked(measure))
        entry = _compare([cpu for cpu, _ in found["quiet"]], [cpu for cpu, _ in found["busy"]])
        entry["wall"] = _compare([wall for _, wall in found["quiet"]], [wall for _, wall in found["busy"]])
        result["calibrate"][name] = entry
        print(f"calibrate {name}: {entry['quiet_median']:,.0f} quiet, {entry['busy_median']:,.0f} busy per CPU-second "
              f"({entry['busy_over_quiet']:.3f}); by the clock {entry['wall']['busy_over_quiet']:.3f}", flush=True)
    for name, args in runs().items():
        measured: dict[str, list[dict]] = {"quiet": [], "busy": []}
        for _ in range(repeats):
            measured["quiet"].append(run_rate(args))
            with busy_loops(loops):
                measured["busy"].append(run_rate(args))
        entry = _compare([m["per_core_rate"] for m in measured["quiet"]],
                         [m["per_core_rate"] for m in measured["busy"]])
        entry["cpu_wait_fraction"] = {k: [m["cpu_wait_fraction"] for m in v] for k, v in measured.items()}
        result["run"][name] = entry
        print(f"run {name}: {entry['quiet_median']:,.0f} quiet, {entry['busy_median']:,.0f} busy rows per CPU-second "
              f"({entry['busy_over_quiet']:.3f})", flush=True)
    write_results("stability", result, markdown(result))
    return result


def markdown(result: dict) -> str:
    lines = [f"Made by `python -m benchmarks stability` ({result['repeats']} quiet and {result['repeats']} busy runs "
             f"each, alternating; busy: {result['busy_loops']} spinning processes, one per core), "
             f"{result['when']}, {result['machine']}; "
             + ", ".join(f"{k} {v}" for k, v in result["versions"].items()) + ". Rates per CPU-second, medians.", "",
             "| command | case | quiet | beside busy loops | busy / quiet | by the wall clock: busy / quiet |",
             "|---|---|---:|---:|---:|---:|"]
    for name, e in result["calibrate"].items():
        lines.append(f"| `stoker calibrate` | {name} | {e['quiet_median']:,.0f} | {e['busy_median']:,.0f} | "
                     f"{e['busy_over_quiet']:.3f} | {e['wall']['busy_over_quiet']:.3f} |")
    for name, e in result["run"].items():
        waits = ", ".join(f"{k} {100 * statistics.median(v):.0f}%" for k, v in e["cpu_wait_fraction"].items()
                          if all(x is not None for x in v))
        lines.append(f"| `stoker run` | {name} | {e['quiet_median']:,.0f} | {e['busy_median']:,.0f} | "
                     f"{e['busy_over_quiet']:.3f} | (waited for a core: {waits}) |")
    if "fixed_work" in result:
        e = result["fixed_work"]
        lines.append(f"| (the hardware) | a fixed interpreter loop, rounds | {e['quiet_median']:,.0f} | "
                     f"{e['busy_median']:,.0f} | {e['busy_over_quiet']:.3f} | |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
