"""Hugging Face Accelerate: `accelerate launch` runs examples/accelerate_train.py as written, two
processes on the CPU, each with a real Loader, the worker daemon it starts and real ZeroMQ.

Two CPU processes come from `accelerate launch --multi_gpu --num_processes 2`: that flag picks
accelerate's torchrun launcher; `--cpu` picks its simple launcher, which runs `python script` once (one
process, world size 1) unless an MPI hostfile is given. The example asks Accelerator for the CPU itself
(cpu=True where there is no GPU: MULTI_CPU, gloo, the model wrapped in DDP). Accelerate runs
`python SCRIPT ARGS` in each process, so the script launched is tests/record_loader.py with the
example as its argument: every batch each process's Loader yields is recorded, the example untouched.

The data set (160 images) at batch 8 on two processes is 10 steps per process per epoch. The
example saves with accelerator.save_state every K steps of an epoch (the loader registered for
checkpointing) and moves a `latest` link to the new folder; run again, it calls load_state on it
before the loader's first use (a Loader in use refuses any position but the one it started from, so
a resume from mid-epoch that runs also shows that prepare() and register_for_checkpointing() left the
loader untouched). The launches share the machine's ports with whatever else runs: rank 0, which starts
the workers and meets the other rank through the store, takes free ports (a fixed 5561 collided with
the torchrun tests beside it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from stoker.pipeline.store.shards import Manifest
from tests.helpers import descendants

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "accelerate_train.py"
RECORDER = ROOT / "tests" / "record_loader.py"
ACCELERATE = str(Path(sys.executable).with_name("accelerate"))
LAUNCH = ("launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
          "--dynamo_backend", "no", "--main_process_port", "0", "--num_cpu_threads_per_process", "1")
JOB = ("--epochs", "2", "--batch-size", "8", "--image-size", "32", "--workers", "2")
STEPS = 10  # per process per epoch: 160 images / 2 processes / batch 8


def _env(folder: Path) -> dict[str, str]:
    """This environment without another launcher's or job's settings; no Accelerate config of the user's."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("STOKER_", "PROMETHEUS_",
                                                                                      "ACCELERATE_"))}
    env["PYTHONPATH"] = str(ROOT)
    env["HF_HOME"] = str(folder / "hf")  # accelerate reads a default config from there: none
    return env


def _daemons(cmdlines: list[list[str]]) -> set[tuple[str, str]]:
    """(host id, processes) of each `stoker worker` daemon among these command lines."""
    found = set()
    for cmd in cmdlines:
        if "worker" in cmd and "stoker" in cmd:
            flags = dict(arg.split("=", 1) for arg in cmd if arg.startswith("--") and "=" in arg)
            found.add((flags.get("--host-id", ""), flags.get("--procs", "")))
    return found


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _launch(manifest: Manifest, records: Path, checkpoint: Path, *extra: str, crash_after_save: bool = False,
            timeout: float = 150) -> tuple[int | None, str, set[tuple[str, str]]]:
    """One `accelerate launch` of the example: its exit code (None: still running when it was killed, at
    the timeout or, with `crash_after_save`, as soon as its first checkpoint is whole), its output, and
    the worker daemons seen among its processes while it ran."""
    records.mkdir(parents=True)
    cmd = [ACCELERATE, *LAUNCH, str(RECORDER), str(records), str(EXAMPLE), manifest.uri, *JOB,
           "--checkpoint", str(checkpoint), *extra]
    log = records / "launch.log"
    with open(log, "w") as out:
        job = subprocess.Popen(cmd, cwd=records, env=_env(records), stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    daemons: set[tuple[str, str]] = set()
    pids: dict[int, list[str]] = {}
    deadline, scanned = time.monotonic() + timeout, 0.0
    try:
        while job.poll() is None and time.monotonic() < deadline:
            if crash_after_save and os.path.lexists(checkpoint / "latest"):
                _kill(pids)  # the processes known already, at once: the ranks step on while /proc is read
                break
            if time.monotonic() - scanned > 0.25:
                pids = descendants(job.pid)
                daemons |= _daemons(list(pids.values()))
                scanned = time.monotonic()
            time.sleep(0.01)
    finally:
        code = job.poll()
        if code is None:  # the ranks are in sessions of their own: each is killed by its pid
            _kill([*pids, *descendants(job.pid)])
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(10)
    return code, log.read_text(), daemons


def _records(records: Path) -> dict[int, list[dict]]:
    return {r: [json.loads(line) for line in (records / f"rank-{r}.jsonl").read_text().splitlines()] for r in (0, 1)}


def _check_every_sample_once_and_equal_steps(manifest: Manifest, ranks: dict[int, list[dict]]) -> None:
    for epoch in (0, 1):
        streams = [[s for s in ranks[r] if s["epoch"] == epoch] for r in ranks]
        for stream in streams:
            assert [s["step"] for s in stream] == list(range(STEPS)), f"epoch {epoch}: steps {stream}"
        ids = sorted(i for stream in streams for s in stream for i in s["ids"])
        assert ids == list(range(manifest.num_samples)), f"epoch {epoch}: not every sample exactly once"
    assert {s["world"] for r in ranks for s in ranks[r]} == {2}


def _position(checkpoint: Path) -> tuple[int, int]:
    """The data position accelerator.save_state wrote for the registered loader (its first custom object)."""
    state = torch.load(checkpoint / "custom_checkpoint_0.pkl", map_location="cpu", weights_only=False)
    return state["epoch"], state["step"]


@contextlib.contextmanager
def _taken(*ports: int) -> Iterator[None]:
    """The ports held by a listener here (another job's on this machine), or by whoever holds them already."""
    held = []
    for port in ports:
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            held.append(sock)
        except OSError:
            sock.close()
    try:
        yield
    finally:
        for sock in held:
            sock.close()


def test_accelerate_launch_on_two_cpu_processes_gets_every_sample_once_and_equal_steps(manifest, tmp_path):
    """Both epochs are every sample exactly once across the two processes, 10 steps each; one worker daemon,
    started by local process 0's loader, fed both; the checkpoints taken on the way did not disturb it.
    Another job holds the default ports (the dispatcher's 5561, /metrics 9560 and 9571): the loaders take
    free ones."""
    started = time.monotonic()
    with _taken(5561, 9560, 9571):
        code, log, daemons = _launch(manifest, tmp_path / "run", tmp_path / "checkpoints", "--save-every", "7")
    assert code == 0, log[-4000:]
    _check_every_sample_once_and_equal_steps(manifest, _records(tmp_path / "run"))
    assert len(daemons) == 1, daemons  # beside local process 0 only
    (host_id, procs), = daemons
    assert "-loader0-" in host_id and procs == "2"
    latest = tmp_path / "checkpoints" / "latest"
    assert os.readlink(latest) == "epoch-1-step-7" and _position(latest) == (1, 7)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["epoch-1-step-7", "latest"]
    print(f"accelerate launch, 2 processes, 2 epochs: {time.monotonic() - started:.1f} s")


def test_accelerate_launch_run_again_after_a_crash_continues_from_load_state_every_sample_once(manifest, tmp_path):
    """The same command twice. The first run is killed (every process of it, SIGKILL) as soon as its first
    checkpoint is whole, mid-epoch (saved every 4 steps of an epoch); the second finds it, loads it
    (accelerator.load_state: model, optimizer, random states, data position) and finishes the job. The
    first run's steps before its checkpoint and the second run's are every sample once per epoch, equal
    steps; the steps the first run took after its checkpoint come again, the very same batches."""
    checkpoint = tmp_path / "checkpoints"
    code, log, _ = _launch(manifest, tmp_path / "first", checkpoint, "--save-every", "4", crash_after_save=True)
    assert code is None, "the first run ended before it was killed:\n" + log[-4000:]
    latest = checkpoint / "latest"
    saved = _position(latest)
    assert os.readlink(latest) == f"epoch-{saved[0]}-step-{saved[1]}" and saved[0] < 2 and saved[1] % 4 == 0 < saved[1]
    written = {p.name for p in latest.iterdir()}  # process 0 wrote the model, optimizer and data; each its RNG
    assert {"model.safetensors", "optimizer.bin", "custom_checkpoint_0.pkl", "random_states_0.pkl",
            "random_states_1.pkl"} <= written, written
    first = _records(tmp_path / "first")

    code, log, _ = _launch(manifest, tmp_path / "second", checkpoint, "--save-every", "4")
    assert code == 0, log[-4000:]
    second = _records(tmp_path / "second")
    left = 2 * STEPS - (saved[0] * STEPS + saved[1])
    assert all(len(second[r]) == left and (second[r][0]["epoch"], second[r][0]["step"]) == saved for r in second)
    kept = {r: [s for s in first[r] if (s["epoch"], s["step"]) < saved] + second[r] for r in first}
    _check_every_sample_once_and_equal_steps(manifest, kept)
    for r in first:  # what the first run stepped after its checkpoint is stepped again: the same samples
        again = {(s["epoch"], s["step"]): s["ids"] for s in second[r]}
        assert all(again[(s["epoch"], s["step"])] == s["ids"] for s in first[r] if (s["epoch"], s["step"]) >= saved)
    assert os.readlink(latest) == "epoch-1-step-8"
    print(f"first run killed {sum(1 for s in first[0] if (s['epoch'], s['step']) >= saved)} step(s) after its "
          f"checkpoint at epoch {saved[0]} step {saved[1]}")
