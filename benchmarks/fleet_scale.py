"""The fleet at scale (issue 50, item 2): how long an allocation round takes, and what the real `stoker fleet`
spends answering the beats of 1,000 hosts and 10 jobs a second.

(a) in process: the fleet's book (stoker.accel.fleet.book) with H hosts of 16 processes and J jobs whose asks
    drift every round, so processes move each round; one round (`rebalance`), median and p99 over ROUNDS,
    CPU time of this thread, for H in HOSTS and J in JOBS.
(b) over sockets: `stoker fleet` in its own process on core 0, the simulated peers in one process on core 1
    (DEALER sockets speaking the fleet's protocol): H hosts beat once a second, each saying it runs the plan
    it was last given, and J jobs once a second with asks that drift; over SECONDS after a warm-up: the
    fleet's CPU seconds per second (CPU time from /proc: the share of one core it needs), the reply latency
    p50/p99, beats left unanswered, its RSS.
Results go to benchmarks/results/fleet_scale.{json,md}.

    python -m benchmarks fleet_scale
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from benchmarks.common import free_port
from benchmarks.control_plane import _proc_cpu_rss
from benchmarks.report import header, write_results
from stoker.accel.fleet.book import FleetBook, Job
from stoker.protos import stoker_pb2 as pb

HOSTS, JOBS, ROUNDS = (100, 500, 1000, 2000), (1, 10, 30), 30
PROCS_PER_HOST = 16
SOCKET_SHAPES = ((250, 10), (1000, 10), (2000, 10), (1000, 30))
SECONDS, WARM_UP_S, PEER_SOCKETS = 20.0, 6.0, 16
FLEET_CORE, PEER_CORE = 0, 1


def _want(job: int, hosts: int, jobs: int, t: float) -> float:
    """A job's ask in cores: about its share of the fleet, drifting by up to 30% so the shares keep moving."""
    return hosts * PROCS_PER_HOST / jobs * (1.0 + 0.3 * math.sin(t / 5 + job))


# ---- (a) the round, in process -----------------------------------------------------------------
def round_cost(hosts: int, jobs: int) -> dict:
    book = FleetBook(round_s=1e9)  # the hosts join without a round each (measured apart: the rounds below)
    for h in range(hosts):
        book.host_beat(f"host{h}", PROCS_PER_HOST, {}, False, now=0.0)
    times = []
    for r in range(ROUNDS + 5):
        for j in range(jobs):
            want = _want(j, hosts, jobs, r)
            book.job_beat(Job(f"job{j}", 1.0 + j % 3, 0, None, want, f"tcp://198.18.0.1:{5000 + j}"), now=float(r))
        started = time.thread_time()
        book.rebalance(now=float(r) + 0.5, force=True)
        if r >= 5:  # the first rounds hand the idle fleet out
            times.append(time.thread_time() - started)
    times.sort()
    return {"hosts": hosts, "jobs": jobs, "round_ms_p50": 1e3 * statistics.median(times),
            "round_ms_p99": 1e3 * times[min(len(times) - 1, int(len(times) * 0.99))], "moves": book.moves_total}


# ---- (b) the service, over sockets -----------------------------------------------------------------
def _host_beat(index: int, plan: list[pb.FleetJobProcs]) -> pb.FleetRequest:
    return pb.FleetRequest(fleet_host=pb.FleetHost(host_id=f"host{index}", procs=PROCS_PER_HOST, pid=100000 + index,
                                                   serving=plan, cores=float(PROCS_PER_HOST)))


def _job_beat(job: int, hosts: int, jobs: int, t: float) -> pb.FleetRequest:
    return pb.FleetRequest(fleet_job=pb.FleetJob(job_id=f"job{job}", endpoint=f"tcp://198.18.0.1:{5000 + job}",
                                                 weight=1.0 + job % 3, want_cores=_want(job, hosts, jobs, t),
                                                 want_reason="simulated"))


def peers_main(endpoint: str, hosts: int, jobs: int, seconds: float, out: str) -> None:
    """The simulated hosts and jobs: every one beats once a second, spread evenly over the second; the
    latencies of the replies after the warm-up go to `out`."""
    os.sched_setaffinity(0, {PEER_CORE})
    ctx = zmq.Context()
    socks = []
    for _ in range(PEER_SOCKETS):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        socks.append(sock)
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    plans: dict[int, list[pb.FleetJobProcs]] = {h: [] for h in range(hosts)}
    beats = [("host", h) for h in range(hosts)] + [("job", j) for j in range(jobs)]
    pending: dict[int, tuple[float, str, int]] = {}
    latencies: list[float] = []
    start = next_at = time.perf_counter()
    sent = measured_sent = 0
    while time.perf_counter() < start + seconds:
        now = time.perf_counter()
        while next_at <= now:
            kind, index = beats[sent % len(beats)]
            sent += 1
            request = _host_beat(index, plans[index]) if kind == "host" else _job_beat(index, hosts, jobs, now - start)
            request.request_id = sent
            socks[sent % PEER_SOCKETS].send(request.SerializeToString())
            pending[sent] = (now, kind, index)
            measured_sent += now - start >= WARM_UP_S
            next_at += 1.0 / len(beats)
        for sock, _ in poller.poll(timeout=max(0.0, 1e3 * (next_at - time.perf_counter()))):
            while True:
                try:
                    reply = pb.FleetReply.FromString(sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                sent_at, kind, index = pending.pop(reply.request_id, (0.0, "", -1))
                if sent_at - start >= WARM_UP_S:
                    latencies.append(time.perf_counter() - sent_at)
                if kind == "host" and reply.WhichOneof("kind") == "fleet_plan":
                    plans[index] = list(reply.fleet_plan.jobs)
    Path(out).write_text(json.dumps({"latencies": latencies, "sent": measured_sent}))
    ctx.destroy(linger=0)


def over_sockets(hosts: int, jobs: int, folder: Path) -> dict:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    fleet = subprocess.Popen(["taskset", "-c", str(FLEET_CORE), sys.executable, "-m", "stoker", "fleet", "--bind",
                              endpoint, "--metrics-port", "-1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = folder / f"peers-{hosts}-{jobs}.json"
    try:
        time.sleep(3.0)  # the fleet imports and binds
        peers = subprocess.Popen([sys.executable, "-m", "benchmarks.fleet_scale", "--peers", endpoint, str(hosts),
                                  str(jobs), str(SECONDS), str(out)])
        time.sleep(WARM_UP_S)
        cpu_before, _ = _proc_cpu_rss(fleet.pid)
        measured_from = time.monotonic()
        if peers.wait(timeout=SECONDS + 60) != 0:
            raise RuntimeError(f"the simulated peers failed (exit {peers.returncode})")
        cpu_after, rss = _proc_cpu_rss(fleet.pid)
        wall = time.monotonic() - measured_from
    finally:
        fleet.terminate()
        fleet.wait(timeout=30)
    got = json.loads(out.read_text())
    latencies = sorted(got["latencies"])
    return {"hosts": hosts, "jobs": jobs, "beats_per_s": hosts + jobs,
            "fleet_cpu_s_per_s": (cpu_after - cpu_before) / wall,
            "latency_ms_p50": 1e3 * latencies[len(latencies) // 2] if latencies else None,
            "latency_ms_p99": 1e3 * latencies[int(len(latencies) * 0.99)] if latencies else None,
            "unanswered": got["sent"] - len(latencies), "rss_mb": rss}


def _table(result: dict) -> str:
    lines = [f"# The fleet at scale ({result['when']}; {result['cpu']}; {result['machine']})", "",
             "(a) One allocation round, in process (CPU time of the thread; hosts of 16 processes, asks that drift "
             "every round):", "", "| hosts | jobs | round p50 (ms) | round p99 (ms) |", "|---|---|---|---|"]
    lines += [f"| {r['hosts']} | {r['jobs']} | {r['round_ms_p50']:.2f} | {r['round_ms_p99']:.2f} |"
              for r in result["rounds"]]
    lines += ["", f"(b) `stoker fleet` on one core, every host and job beating once a second ({SECONDS:g} s measured "
              f"after {WARM_UP_S:g} s):", "",
              "| hosts | jobs | beats/s | fleet CPU (s per s) | reply p50 (ms) | reply p99 (ms) | unanswered "
              "| RSS (MB) |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['hosts']} | {r['jobs']} | {r['beats_per_s']} | {r['fleet_cpu_s_per_s']:.3f} | "
              f"{r['latency_ms_p50']:.2f} | {r['latency_ms_p99']:.2f} | {r['unanswered']} | {r['rss_mb']:.0f} |"
              for r in result["sockets"]]
    return "\n".join(lines) + "\n"


def main() -> dict:
    result = header("fleet_scale", "protobuf")
    os.sched_setaffinity(0, {PEER_CORE})
    result["rounds"] = [round_cost(h, j) for h in HOSTS for j in JOBS]
    with tempfile.TemporaryDirectory() as folder:
        result["sockets"] = [over_sockets(h, j, Path(folder)) for h, j in SOCKET_SHAPES]
    table = _table(result)
    print(table)
    write_results("fleet_scale", result, table)
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--peers"]:
        peers_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6])
    else:
        main()
