"""Data-parallel jobs in lock-step: what a fleet smaller than the rank count delivers, and what a
killed host costs.

(1) Fewer worker processes than ranks. A torchrun job of 4 ranks (gloo, an all-reduce every
step, benchmarks/ddp_job.py) over the default 2,000-image set at 64 px is fed by one `stoker
worker` daemon of 1, 2 or 4 processes; beside it, 1 rank fed by 1 process. The job's rate is
images stepped by all ranks per second, from each run's first step to its last (start-up left
out); medians of 3. On this 2-core machine the ranks and the workers share the cores, so the
figure to read is the ratio: 4 ranks fed by 1 process against 1 rank fed by 1 process (before
the lock-step fix, 4 ranks fed by 1 process never finished).

(2) A host killed. 2 ranks fed by 2 daemons of 1 process, host timeout 30 s; host 0 (daemon and
process) is SIGKILLed once it has sent a batch, so it dies holding a lease. The longest wait
between two steps on any rank, against the median wait; medians of 3. Its connections close, so
the dispatcher re-leases its units in about a second, not the host timeout.

Results: benchmarks/results/data_parallel.{json,md}.
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
import urllib.request
from pathlib import Path

from benchmarks.common import free_port
from benchmarks.report import header, write_results
from stoker.datasets import default_imagenet

JOB = Path(__file__).with_name("ddp_job.py")
ROOT = Path(__file__).parents[1]
FLEETS = ((1, 1), (4, 1), (4, 2), (4, 4))  # (ranks, worker processes)
KILL_TIMEOUT_S = 30.0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _daemon(port: int, host: str, procs: int, metrics_port: int = -1) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "stoker", "worker", "--dispatcher", f"tcp://127.0.0.1:{port}",
                             "--procs", str(procs), "--host-id", host, "--once", "--metrics-port", str(metrics_port)],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _torchrun(manifest: str, out: Path, port: int, ranks: int, host_timeout_s: float) -> subprocess.Popen:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return subprocess.Popen([torchrun, "--nproc-per-node", str(ranks), "--master-port", str(free_port()), str(JOB),
                             manifest, str(out), str(port), str(host_timeout_s)], env=_env(),
                            stdout=open(out / "torchrun.log", "w"), stderr=subprocess.STDOUT)


def _finish(job: subprocess.Popen, daemons: list[subprocess.Popen], out: Path, ranks: int) -> list[dict]:
    code = job.wait(timeout=600)
    for daemon in daemons:
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
    if code != 0:
        raise RuntimeError(f"the job failed ({code}): {(out / 'torchrun.log').read_text()[-2000:]}")
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)]


def job_rate(manifest: str, ranks: int, procs: int) -> float:
    """Images per second all ranks stepped together, first step to last."""
    with tempfile.TemporaryDirectory() as folder:
        out, port = Path(folder), free_port()
        job = _torchrun(manifest, out, port, ranks, 10.0)
        records = _finish(job, [_daemon(port, "bench", procs)], out, ranks)
    first, last = min(r["times"][0] for r in records), max(r["times"][-1] for r in records)
    rows = sum(r["rows"] for r in records)
    return rows * (1 - 1 / len(records[0]["times"])) / (last - first)  # the first step's rows came before `first`


def _batches_sent(metrics_port: int) -> float:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2).read().decode()
    except OSError:
        return 0.0
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("stoker_worker_batches_total"))


def host_kill_gap(manifest: str) -> tuple[float, float]:
    """(longest, median) seconds between two steps on any rank when a host is killed mid-job."""
    with tempfile.TemporaryDirectory() as folder:
        out, port, metrics = Path(folder), free_port(), free_port()
        job = _torchrun(manifest, out, port, 2, KILL_TIMEOUT_S)
        daemons = [_daemon(port, "host0", 1, metrics), _daemon(port, "host1", 1)]
        deadline = time.monotonic() + 120
        while _batches_sent(metrics) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(daemons[0].pid, signal.SIGKILL)  # the daemon and its decode process
        records = _finish(job, daemons[1:], out, 2)
    gaps = [b - a for r in records for a, b in zip(r["times"], r["times"][1:], strict=False)]
    return max(gaps), statistics.median(gaps)


def main(repeats: int = 3) -> dict:
    manifest = str(default_imagenet())
    rates: dict[str, list[float]] = {f"{r}x{p}": [] for r, p in FLEETS}
    kills: list[tuple[float, float]] = []
    for i in range(repeats):
        for ranks, procs in FLEETS:
            rates[f"{ranks}x{procs}"].append(job_rate(manifest, ranks, procs))
        kills.append(host_kill_gap(manifest))
        print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.0f} img/s" for k, v in rates.items())
              + f"; host kill: longest gap {kills[-1][0]:.2f} s (median {kills[-1][1]:.3f} s)", flush=True)
    medians = {k: statistics.median(v) for k, v in rates.items()}
    longest = statistics.median(k[0] for k in kills)
    typical = statistics.median(k[1] for k in kills)
    result = {**header("data_parallel", "torch"), "image_size": 64, "batch_size": 32, "images": 2000,
              "rates": rates, "medians": medians, "ratio_4_ranks_1_proc": medians["4x1"] / medians["1x1"],
              "host_kill": {"host_timeout_s": KILL_TIMEOUT_S, "longest_gap_s": [k[0] for k in kills],
                            "median_gap_s": [k[1] for k in kills], "longest_median": longest,
                            "typical_median": typical}}
    table = ("| lock-step torchrun job (gloo, all-reduce every step), 2,000 images at 64 px, batch 32 | img/s, "
             "median of 3 |\n|---|---|\n"
             + "".join(f"| {r} rank{'s' * (r > 1)} fed by {p} worker process{'es' * (p > 1)} | "
                       f"{medians[f'{r}x{p}']:.0f} |\n" for r, p in FLEETS)
             + f"| 4 ranks fed by 1 process / 1 rank fed by 1 process | {result['ratio_4_ranks_1_proc']:.2f} |\n"
             f"| a host killed (2 ranks, 2 hosts, host timeout 30 s): longest wait between two steps | "
             f"{longest:.2f} s (median wait {typical:.3f} s) |\n")
    write_results("data_parallel", result, table)
    print(table)
    return result


if __name__ == "__main__":
    main()
