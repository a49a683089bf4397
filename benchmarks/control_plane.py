"""The control plane at ImageNet-1k size: a real `stoker dispatch` with its fsync'd journal, fed by
1,024 simulated worker processes on 64 simulated hosts.

The plan is ImageNet-1k's: 1,281,167 samples (manifest only: no shard is ever read), 256 a
unit (batch 64 x 4), 40 and 90 epochs. The workers are lightweight clients, 256 DEALER
identities to an OS process (4 processes), that register, heartbeat and lease without
decoding; one more socket attaches as the job's only rank and acks every leased unit, as a
consumer does once it has stepped a unit's batches.

(a) structures, in process: the time and memory to build the dispatcher for 40 and 90
    epochs, what it holds at the end of epochs 1 to 90, and the consumer's ledger memory
    after each of 6 epochs.
(b) over sockets, the server in its own process on core 0, clients on core 1: peak leases/s
    (every identity asks again as soon as it is answered), then lease latency p50/p99 at
    1,000 leases/s, for `stoker dispatch` and for a bare peer (a ROUTER that fsyncs a line
    per lease and keeps no books), against this disk's fsync p50/p99 measured in the same
    run; the server's CPU and RSS. Medians of REPEATS interleaved runs.
(c) restart: how long a fresh interpreter takes to replay the journal and build the
    dispatcher after 1, 89.5 and 90 epochs (journals written by the real Dispatcher and
    Journal, in process), and the journal bytes one epoch writes before it is compacted.
Results go to benchmarks/results/control_plane.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import zmq

from benchmarks.common import free_port
from benchmarks.report import header, write_results
from stoker.accel.control.dispatcher import Dispatcher
from stoker.accel.control.journal import Journal
from stoker.accel.ledger import Ledger
from stoker.pipeline.job import JobConfig
from stoker.pipeline.job_wire import job_identity
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.store.shards import Manifest, ShardInfo
from stoker.protos import stoker_pb2 as pb

IMAGENET_1K = 1_281_167
SHARD_ROWS = 1024
BATCH, UNIT_BATCHES = 64, 4
HOSTS, PROCS_PER_HOST, CLIENT_PROCESSES = 64, 16, 4
DISPATCHER_CORE, CLIENT_CORE = "0", "1"
HEARTBEAT_S = 1.0
ACK_BATCH = 4096  # unit ids in one ack message (a consumer acks what it has stepped since the last)
REPEATS = 3  # socket runs of each config; the figures are medians
WARM_UP_S = 10.0  # the client processes start, connect every identity and are answered once


def synthetic_manifest(folder: Path) -> Path:
    """ImageNet-1k's shape, as a manifest whose shards are never read."""
    shards, first = [], 0
    while first < IMAGENET_1K:
        rows = min(SHARD_ROWS, IMAGENET_1K - first)
        shards.append(ShardInfo(f"train-{len(shards):05d}.arrow", rows, rows * 110_000, "0" * 64, first))
        first += rows
    path = folder / "manifest.json"
    Manifest(kind="imagenet", classes=[f"n{i:08d}" for i in range(1000)], shards=shards).save(path)
    return path


def job(manifest: Path, epochs: int) -> JobConfig:
    return JobConfig(manifest_uri=str(manifest), epochs=epochs, batch_size=BATCH, unit_batches=UNIT_BATCHES)


# ---- (a) structures ---------------------------------------------------------------------------
def build_cost(manifest: Path, epochs: int) -> dict:
    cfg = job(manifest, epochs)
    plan = cfg.plan(Manifest.load(manifest))
    tracemalloc.start()
    started = time.perf_counter()
    dispatcher = Dispatcher(plan, planned_batches=cfg.planned_batches)
    seconds = time.perf_counter() - started
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"epochs": epochs, "units": dispatcher.total_units, "build_s": seconds, "memory_mb": size / 1e6}


def ledger_growth(manifest: Path, epochs: int = 6) -> list[float]:
    """MB the consumer's ledger holds after each of `epochs` complete epochs."""
    cfg = job(manifest, epochs)
    plan = cfg.plan(Manifest.load(manifest))
    tracemalloc.start()
    ledger = Ledger(plan)
    held = []
    none = np.empty(0, dtype=np.int64)
    for epoch in range(epochs):
        for unit in plan.units(epoch):
            ids = np.asarray(unit.sample_ids(), dtype=np.int64)
            last = -(-ids.size // BATCH) - 1
            for index in range(last + 1):
                part = ids[index * BATCH:(index + 1) * BATCH]
                ledger.admit(epoch, unit.unit_id, index, part, none, index == last)
                ledger.stepped(epoch, unit.unit_id, index, index == last, part, none)
        held.append(tracemalloc.get_traced_memory()[0] / 1e6)
    tracemalloc.stop()
    return held


# ---- (c) restart ------------------------------------------------------------------------------
def write_journal(manifest: Path, epochs: int, path: Path, done_epochs: float,
                  watch: tuple[int, ...] = ()) -> dict:
    """The journal of a job that has leased and acked every unit of its first `done_epochs`
    epochs (a fraction: part of the next), written by the real Dispatcher and Journal. Returns
    the journal's bytes for one epoch (its size just before the epoch's last ack compacts it)
    and, for each epoch in `watch`, the MB the dispatcher holds at its end (tracemalloc, which
    slows the run, so only when asked)."""
    cfg = job(manifest, epochs)
    if watch:
        tracemalloc.start()
    journal = Journal(path, job_identity(cfg), b"k" * 32)
    dispatcher = Dispatcher(cfg.plan(Manifest.load(manifest)), journal=journal, planned_batches=cfg.planned_batches)
    dispatcher.attach_rank(0, "tcp://127.0.0.1:1", "rank0")
    per_epoch = dispatcher.plan.units_per_epoch
    held, epoch_bytes = {}, 0
    for epoch in range(int(np.ceil(done_epochs))):
        for index in range(min(per_epoch, round((done_epochs - epoch) * per_epoch))):
            unit = dispatcher.lease("h0", "h0/p0.1", request_id=epoch * per_epoch + index + 1)
            if epoch == 0 and index == per_epoch - 1:
                journal.sync()
                epoch_bytes = path.stat().st_size  # every line of epoch 0 but its last ack
            dispatcher.ack(unit.unit_id, UNIT_BATCHES)
        if epoch + 1 in watch:
            held[epoch + 1] = tracemalloc.get_traced_memory()[0] / 1e6
    journal.close()
    if watch:
        tracemalloc.stop()
    return {"epoch_bytes": epoch_bytes, "held_mb": held}


def restart_seconds(manifest: Path, epochs: int, path: Path) -> dict:
    """A fresh interpreter replays the journal and builds its dispatcher, as `stoker dispatch` does
    when it restarts: the seconds for that alone (after the imports) and for the whole process."""
    code = ("from benchmarks.control_plane import job; from stoker.accel.control.dispatcher import Dispatcher;"
            "from stoker.accel.control.journal import Journal; from stoker.pipeline.store.shards import Manifest;"
            "from stoker.pipeline.job_wire import job_identity; import time; t = time.perf_counter();"
            f"cfg = job({str(manifest)!r}, {epochs}); j = Journal({str(path)!r}, job_identity(cfg), b'k' * 32);"
            "d = Dispatcher(cfg.plan(Manifest.load(cfg.manifest_uri)), journal=j, planned_batches=cfg.planned_batches);"
            "d.attach_rank(0, 'tcp://127.0.0.1:1', 'rank0');"
            "assert d.finished or d.lease('h', 'w') is not None; print(time.perf_counter() - t)")
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {"replay_s": float(out.stdout), "process_s": time.perf_counter() - started}


# ---- (b) over sockets -------------------------------------------------------------------------
def fsync_latency(folder: Path, count: int = 400) -> tuple[float, float]:
    """This disk's fsync of one appended journal-sized line: p50 and p99 in ms."""
    times = []
    with open(folder / "fsync-probe", "a") as out:
        for _ in range(count):
            out.write("x" * 90 + "\n")
            out.flush()
            started = time.perf_counter()
            os.fsync(out.fileno())
            times.append(time.perf_counter() - started)
    times.sort()
    return 1e3 * times[len(times) // 2], 1e3 * times[int(len(times) * 0.99)]


def _proc_cpu_rss(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return cpu, rss / 1e6


class _Identity:
    """One simulated worker process (or a host's daemon): a DEALER and what it is waiting for."""

    def __init__(self, ctx: zmq.Context, endpoint: str, host: str, name: str) -> None:
        self.host, self.name = host, name
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt_string(zmq.IDENTITY, name)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.request_id, self.sent_at, self.next_at = 0, 0.0, 0.0

    def send(self, body: dict) -> None:
        self.request_id += 1
        self.sent_at = time.perf_counter()
        self.sock.send(pb.ControlRequest(request_id=self.request_id, **body).SerializeToString())

    def lease(self) -> None:
        self.send({"lease": pb.LeaseRequest(host_id=self.host, worker_id=self.name)})

    def heartbeat(self) -> None:
        self.send({"heartbeat": pb.Heartbeat(host_id=self.host)})


def _clients(endpoint: str, first_host: int, hosts: int, rate: float, seconds: float, start_at: float,
             acks: str) -> dict:
    """`hosts` simulated hosts of PROCS_PER_HOST lease identities and one heartbeat identity
    each, in one poll loop (cheaper per request than a coroutine each, so that one client core
    can outpace the dispatcher's core). Every identity connects and is answered once before the
    common start (`start_at`, wall clock), so connection set-up is not counted as lease latency.
    rate 0: each identity asks again as soon as it is answered; else this process's share of
    `rate`, spread evenly."""
    ctx = zmq.Context()
    pusher = ctx.socket(zmq.PUSH)
    pusher.connect(acks)
    names = [f"h{first_host + h}" for h in range(hosts)]
    workers = [_Identity(ctx, endpoint, h, f"{h}/p{p}.1") for h in names for p in range(PROCS_PER_HOST)]
    daemons = [_Identity(ctx, endpoint, h, f"{h}/daemon") for h in names]
    for daemon in daemons:
        daemon.send({"register": pb.Register(host_id=daemon.host, procs=PROCS_PER_HOST)})
    for worker in workers:
        worker.heartbeat()  # the warm-up: connected and answered once
    for ident in daemons + workers:
        if not ident.sock.poll(30_000):
            raise RuntimeError(f"{ident.name}: no answer from the dispatcher")
        ident.sock.recv()
    time.sleep(max(0.0, start_at - time.time()))
    by_sock = {ident.sock: ident for ident in workers + daemons}
    poller = zmq.Poller()
    for sock in by_sock:
        poller.register(sock, zmq.POLLIN)
    now = time.perf_counter()
    stop_at = now + seconds
    period = len(workers) * CLIENT_PROCESSES / rate if rate else 0.0
    for i, worker in enumerate(workers):
        worker.next_at = now + period * i / len(workers)
    for daemon in daemons:
        daemon.next_at = now + HEARTBEAT_S * np.random.random()
    idle = set(workers + daemons)  # not waiting for an answer
    latencies: list[float] = []
    finished = False
    while not finished and (now := time.perf_counter()) < stop_at:
        for ident in [i for i in idle if i.next_at <= now]:
            idle.discard(ident)
            ident.heartbeat() if ident.name.endswith("/daemon") else ident.lease()
        due = min((i.next_at for i in idle), default=now + 0.01)
        for sock, _ in poller.poll(max(0.0, min(due, stop_at) - time.perf_counter()) * 1e3):
            ident = by_sock[sock]
            reply = pb.ControlReply()
            reply.ParseFromString(sock.recv())
            answered = time.perf_counter()
            kind = reply.WhichOneof("kind")
            if kind == "unit":
                latencies.append(answered - ident.sent_at)
                pusher.send(str(reply.unit.unit_id).encode())
            finished = finished or kind == "finished"
            if ident.name.endswith("/daemon"):
                ident.next_at = ident.sent_at + HEARTBEAT_S  # a daemon's pace (stoker/workers/daemon.py)
            else:
                ident.next_at = max(answered, ident.next_at + period) if period else answered
            idle.add(ident)
    for ident in workers + daemons:
        ident.sock.close(0)
    pusher.close(0)
    ctx.term()
    return {"leases": len(latencies), "latencies_ms": [1e3 * t for t in latencies]}


def floor_main(endpoint: str, journal: str) -> None:
    """The peer: a bare ROUTER that answers every lease with the next unit id after one journal
    line and one fsync per batch of requests read together, and keeps no books: what this
    machine, its disk and these clients allow before any dispatcher logic."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    unit = 0
    with open(journal, "a") as out:
        while True:
            batch = [sock.recv_multipart()]
            while len(batch) < 256:
                try:
                    batch.append(sock.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
            replies = []
            for peer, body in batch:
                request = pb.ControlRequest()
                request.ParseFromString(body)
                reply = pb.ControlReply(request_id=request.request_id, ok=pb.Ok())
                if request.WhichOneof("kind") == "lease":
                    unit += 1
                    out.write(json.dumps({"lease": unit, "worker": request.lease.worker_id}) + "\n")
                    reply = pb.ControlReply(request_id=request.request_id, unit=pb.WorkUnit(unit_id=unit))
                replies.append((peer, reply.SerializeToString()))
            out.flush()
            os.fsync(out.fileno())
            for peer, payload in replies:
                sock.send_multipart([peer, payload])


def client_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    for flag in ("--endpoint", "--acks", "--out"):
        p.add_argument(flag)
    for flag in ("--first-host", "--hosts"):
        p.add_argument(flag, type=int)
    for flag in ("--rate", "--seconds", "--start-at"):
        p.add_argument(flag, type=float)
    a = p.parse_args(argv)
    found = _clients(a.endpoint, a.first_host, a.hosts, a.rate, a.seconds, a.start_at, a.acks)
    Path(a.out).write_text(json.dumps(found))


class Sink:
    """Where the clients send the unit ids they were leased; this one only counts them (for the
    peer, which keeps no books), `Acker` acks them."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.acks = f"tcp://127.0.0.1:{free_port()}"
        self.pull.bind(self.acks)
        self.acked = 0

    def run_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.pull.poll(20):
                self.pull.recv()
                self.acked += 1

    def close(self) -> None:
        self.pull.close(0)
        self.ctx.term()


class Acker(Sink):
    """The job's one rank: attaches, then acks whatever the clients leased, in batches of up to ACK_BATCH."""

    def __init__(self, endpoint: str, secret: bytes) -> None:
        super().__init__()
        self.control = self.ctx.socket(zmq.DEALER)
        self.control.setsockopt_string(zmq.IDENTITY, "rank0")
        self.control.connect(endpoint)
        self.secret, self.ids = secret, 0
        reply = self._call(pb.ControlRequest(attach=pb.Attach(consumer_id="rank0", rank=0, world_size=1,
                                                              data_endpoint="tcp://127.0.0.1:1")))
        assert reply.WhichOneof("kind") == "attached", reply

    def _call(self, request: pb.ControlRequest) -> pb.ControlReply:
        self.ids += 1
        request.request_id, request.job_credential = self.ids, self.secret
        self.control.send(request.SerializeToString())
        assert self.control.poll(30_000), "the dispatcher did not answer the consumer"
        reply = pb.ControlReply()
        reply.ParseFromString(self.control.recv())
        return reply

    def run_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            pending = []
            while len(pending) < ACK_BATCH and self.pull.poll(20 if not pending else 0):
                pending.append(int(self.pull.recv()))
            if pending:
                self._call(pb.ControlRequest(ack=pb.Ack(unit_ids=pending, batches=[UNIT_BATCHES] * len(pending))))
                self.acked += len(pending)

    def close(self) -> None:
        self.control.close(0)
        super().close()


def _start_dispatcher(manifest: Path, endpoint: str, journal: Path) -> tuple[subprocess.Popen, Acker]:
    secret = journal.with_suffix(".secret")
    dispatcher = subprocess.Popen(
        ["taskset", "-c", DISPATCHER_CORE, sys.executable, "-m", "stoker", "dispatch", "--data", str(manifest),
         "--epochs", "90", "--batch-size", str(BATCH), "--unit-batches", str(UNIT_BATCHES),
         "--journal", str(journal), "--job-secret", str(secret), "--control-bind", endpoint,
         "--metrics-port", "-1", "--host-timeout", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not secret.exists() and time.monotonic() < deadline and dispatcher.poll() is None:
        time.sleep(0.1)
    if not secret.exists():
        dispatcher.kill()
        raise RuntimeError(f"stoker dispatch did not start: {dispatcher.stderr.read().decode()[-2000:]}")
    return dispatcher, Acker(endpoint, secret.read_bytes().strip())


def over_sockets(manifest: Path, folder: Path, rate: float, seconds: float, floor: bool = False) -> dict:
    """One run of the clients against a fresh `stoker dispatch` with a journal (or, `floor`, the
    bare peer on the same core); rate 0: peak."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    journal = folder / f"{'floor' if floor else 'dispatch'}-{rate:g}.journal"
    if floor:
        dispatcher = subprocess.Popen(["taskset", "-c", DISPATCHER_CORE, sys.executable, "-m",
                                       "benchmarks.control_plane", "floor", endpoint, str(journal)])
        acker: Sink = Sink()
    else:
        dispatcher, acker = _start_dispatcher(manifest, endpoint, journal)
    try:
        outs = [folder / f"clients-{journal.stem}-{i}.json" for i in range(CLIENT_PROCESSES)]
        per = HOSTS // CLIENT_PROCESSES
        start_at = time.time() + WARM_UP_S
        clients = [subprocess.Popen(["taskset", "-c", CLIENT_CORE, sys.executable, "-m", "benchmarks.control_plane",
                                     "client", "--endpoint", endpoint, "--acks", acker.acks, "--out", str(out),
                                     "--first-host", str(i * per), "--hosts", str(per), "--rate", str(rate),
                                     "--seconds", str(seconds), "--start-at", str(start_at)])
                   for i, out in enumerate(outs)]
        acking = threading.Thread(target=acker.run_for, args=(WARM_UP_S + seconds + 2,))
        acking.start()  # the acker's sockets are used by that thread alone from here on
        time.sleep(max(0.0, start_at - time.time()))
        cpu0, rss0 = _proc_cpu_rss(dispatcher.pid)
        time.sleep(seconds)
        cpu1, rss = _proc_cpu_rss(dispatcher.pid)
        for client in clients:
            client.wait(timeout=120)
        acking.join()
        acker.close()
        found = [json.loads(out.read_text()) for out in outs]
        latencies = sorted(t for f in found for t in f["latencies_ms"])
        leases = sum(f["leases"] for f in found)
        cpu = cpu1 - cpu0
        return {"rate_asked": rate, "leases": leases, "acked": acker.acked, "leases_per_s": leases / seconds,
                "latency_p50_ms": latencies[len(latencies) // 2],
                "latency_p99_ms": latencies[int(len(latencies) * .99)], "dispatcher_cpu_s": cpu,
                "dispatcher_cpu_ms_per_1000_leases": 1e6 * cpu / max(leases, 1), "dispatcher_rss_mb": rss,
                "dispatcher_rss_start_mb": rss0, "dispatcher_busy": cpu / seconds,
                "journal_bytes": journal.stat().st_size, "seconds": seconds}
    finally:
        dispatcher.terminate()
        dispatcher.wait(timeout=30)


def main(seconds: float = 15.0) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="stoker-control-"))
    manifest = synthetic_manifest(folder)
    per_epoch = EpochPlan(Manifest.load(manifest), BATCH * UNIT_BATCHES, 1, 0, 1, BATCH).units_per_epoch
    builds = [build_cost(manifest, epochs) for epochs in (40, 90)]
    for b in builds:
        print(f"dispatcher for {b['epochs']} epochs ({b['units']:,} units): built in {b['build_s']:.2f} s, "
              f"{b['memory_mb']:.0f} MB", flush=True)
    ledger = ledger_growth(manifest)
    print(f"ledger after each of {len(ledger)} epochs: {', '.join(f'{m:.1f}' for m in ledger)} MB", flush=True)
    restarts, held = {}, {}
    for done in (1, 89.5, 90):  # epochs done when the dispatcher restarts
        path = folder / f"epoch-{done}.journal"
        written = write_journal(manifest, 90, path, done, watch=(1, 10, 30, 60, 90) if done == 90 else ())
        held.update(written["held_mb"])
        restarts[done] = r = {**restart_seconds(manifest, 90, path), "bytes": path.stat().st_size,
                              "epoch_bytes": written["epoch_bytes"]}
        print(f"restart after {done} epochs: replay and build {r['replay_s']:.2f} s, the whole "
              f"process {r['process_s']:.2f} s ({r['bytes'] / 1e3:.0f} kB of journal)", flush=True)
    print("dispatcher holds at the end of epochs " + ", ".join(f"{e}: {mb:.1f}" for e, mb in held.items()) + " MB",
          flush=True)
    fsync_p50, fsync_p99 = fsync_latency(folder)
    print(f"fsync here: p50 {fsync_p50:.2f} ms, p99 {fsync_p99:.2f} ms", flush=True)
    runs = {}
    configs = (("peak", 0.0, False), ("1000/s", 1000.0, False), ("1000/s, the bare peer", 1000.0, True))
    tries: dict[str, list[dict]] = {name: [] for name, _, _ in configs}
    for _ in range(REPEATS):  # interleaved, so that a slow minute of the machine hits every config
        for name, rate, floor in configs:
            tries[name].append(over_sockets(manifest, folder, rate, seconds, floor))
    for name, found in tries.items():
        runs[name] = r = {key: float(np.median([f[key] for f in found])) for key in found[0]}
        r["tries"] = found
        print(f"{name}: {r['leases_per_s']:,.0f} leases/s, p50 {r['latency_p50_ms']:.2f} ms, p99 "
              f"{r['latency_p99_ms']:.2f} ms, dispatcher {r['dispatcher_cpu_ms_per_1000_leases']:.0f} ms CPU per "
              f"1,000 leases, RSS {r['dispatcher_rss_mb']:.0f} MB", flush=True)
    journal_per_epoch = restarts[1]["epoch_bytes"]
    result = {**header("control_plane"), "samples": IMAGENET_1K, "unit_samples": BATCH * UNIT_BATCHES,
              "units_per_epoch": per_epoch, "hosts": HOSTS, "processes": HOSTS * PROCS_PER_HOST,
              "builds": builds, "ledger_mb_after_epoch": ledger, "restart": restarts,
              "dispatcher_mb_after_epoch": held,
              "fsync_ms": {"p50": fsync_p50, "p99": fsync_p99}, "runs": runs,
              "journal_bytes_per_epoch": journal_per_epoch}
    rows = [f"| dispatcher built for {b['epochs']} epochs ({b['units']:,} units) | {b['build_s']:.2f} s, "
            f"{b['memory_mb']:.0f} MB |" for b in builds]
    rows += [f"| consumer ledger after epochs 1..{len(ledger)} | {', '.join(f'{m:.1f}' for m in ledger)} MB |",
             "| dispatcher holds at the end of epochs " + ", ".join(map(str, held)) + " | "
             + ", ".join(f"{mb:.1f}" for mb in held.values()) + " MB |",
             f"| journal lines written in an epoch (compacted to a snapshot when it ends) | "
             f"{journal_per_epoch / 1e6:.2f} MB |"]
    rows += [f"| restart from the journal after {e} epochs ({r['bytes'] / 1e3:.0f} kB) | replay and build "
             f"{r['replay_s']:.2f} s; whole process, interpreter and imports included, {r['process_s']:.2f} s |"
             for e, r in restarts.items()]
    rows += [f"| fsync of one journal line, this disk | p50 {fsync_p50:.2f} ms, p99 {fsync_p99:.2f} ms |"]
    for name, r in runs.items():
        rows.append(f"| leases, {name} ({HOSTS * PROCS_PER_HOST} processes on {HOSTS} hosts) | "
                    f"{r['leases_per_s']:,.0f} leases/s; p50 {r['latency_p50_ms']:.2f} ms, "
                    f"p99 {r['latency_p99_ms']:.2f} ms; "
                    f"server {r['dispatcher_busy']:.2f} core busy, "
                    f"{r['dispatcher_cpu_ms_per_1000_leases']:.0f} ms CPU per 1,000 leases, "
                    f"RSS {r['dispatcher_rss_start_mb']:.0f} -> {r['dispatcher_rss_mb']:.0f} MB |")
    p99, floor_p99 = runs["1000/s"]["latency_p99_ms"], runs["1000/s, the bare peer"]["latency_p99_ms"]
    rows.append(f"| p99 at 1,000/s: `stoker dispatch` / the bare peer / this disk's fsync p99 | "
                f"{p99 / floor_p99:.2f}x / {p99 / fsync_p99:.0f}x |")
    table = (f"| ImageNet-1k plan ({IMAGENET_1K:,} samples, {per_epoch:,} units an epoch), dispatcher on core "
             f"{DISPATCHER_CORE}, clients on core {CLIENT_CORE}; socket figures: medians of {REPEATS} interleaved "
             "runs | |\n|---|---|\n" + "\n".join(rows) + "\n")
    write_results("control_plane", result, table)
    print(table)
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        client_main(sys.argv[2:])
    elif sys.argv[1:2] == ["floor"]:
        floor_main(*sys.argv[2:4])
    else:
        main()
