"""PyTorch Lightning end to end: examples/lightning_train.py as written (StokerDataModule), and a plain
`Trainer.fit(model, train_dataloaders=Loader(job, workers=2))`, run as a user runs them, with the real
dispatcher, a real `stoker worker` daemon started by the loader, and real decode processes.

Lightning takes exactly len(loader) batches per epoch and calls iter() again without asking the first
iterator for its end; every epoch must still step every sample exactly once. What each rank stepped is
recorded by tests/record_loader.py, which wraps Loader.__iter__ and leaves the script as written: with a
known length Lightning fetches no batch ahead, so what the loader yields is what the model steps. DDP
runs under torchrun (Lightning then uses the torchelastic environment and starts no processes of its
own: its own launcher would run the script again without the recorder)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer

from stoker.lightning import StokerDataModule
from stoker.pipeline.job import JobConfig
from stoker.pipeline.store.shards import Manifest
from stoker.protos.errors import ConfigError
from tests.helpers import descendants, free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lightning_train.py"
RECORDER = ROOT / "tests" / "record_loader.py"
EPOCHS = 2
COMMON = ("--epochs", str(EPOCHS), "--image-size", "64")  # 160 images (tests/conftest.py)
DDP = (*COMMON, "--batch-size", "12", "--devices", "2", "--workers", "1", "--save-every", "10")  # 80 rows: 7 steps
RUN_S = 150  # a run's deadline; they take 15-30 s alone on two cores


def _env() -> dict[str, str]:
    """The test's environment, without settings meant for other jobs (its shard cache stays)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STOKER_", "PROMETHEUS_")) or k == "STOKER_SHARD_CACHE"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _start(out: Path, ranks: int, script: Path, *args: str) -> subprocess.Popen:
    """The script under the recorder: in this interpreter's python for one rank, under torchrun for more."""
    (out / "records").mkdir(parents=True, exist_ok=True)
    launcher = [sys.executable] if ranks == 1 else [
        str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", str(ranks),
        "--master-port", str(free_port())]
    return subprocess.Popen([*launcher, str(RECORDER), str(out / "records"), str(script), *args],
                            stdout=open(out / "run.log", "a"), stderr=subprocess.STDOUT, env=_env(), cwd=out,
                            start_new_session=True)


def _descendants(pid: int) -> dict[int, str]:
    """Every live descendant of `pid` -> its command line, as one string."""
    return {p: " ".join(args) for p, args in descendants(pid).items()}


def _finish(job: subprocess.Popen, out: Path) -> None:
    """Wait for the run; on the deadline kill it and every process under it (torchrun puts each rank in
    a session of its own), then require a clean exit."""
    try:
        code = job.wait(timeout=RUN_S)
    except subprocess.TimeoutExpired:
        code = None
        for pid in [job.pid, *_descendants(job.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        job.wait()
    assert code == 0, f"exit {code}\n" + (out / "run.log").read_text()[-4000:]


def _run(out: Path, ranks: int, script: Path, *args: str) -> dict[int, list[dict]]:
    _finish(_start(out, ranks, script, *args), out)
    return _records(out, ranks)


def _records(out: Path, ranks: int) -> dict[int, list[dict]]:
    """Each rank's batches, in the order the loader yielded them."""
    return {r: [json.loads(line) for line in (out / "records" / f"rank-{r}.jsonl").read_text().splitlines()]
            for r in range(ranks)}


def _check_once_and_even(manifest: Manifest, ranks: dict[int, list[dict]], epochs: int = EPOCHS) -> None:
    """Every epoch: each sample exactly once across the ranks, the same steps on every rank, 0, 1, ..."""
    for epoch in range(epochs):
        streams = {r: [s for s in steps if s["epoch"] == epoch] for r, steps in ranks.items()}
        assert len({len(s) for s in streams.values()}) == 1, f"epoch {epoch}: unequal steps"
        for r, stream in streams.items():
            assert [s["step"] for s in stream] == list(range(len(stream))), f"epoch {epoch}, rank {r}"
        ids = sorted(i for stream in streams.values() for s in stream for i in s["ids"])
        assert ids == list(range(manifest.num_samples)), f"epoch {epoch}: not every sample exactly once"


PLAIN = """
    import sys
    import torch
    from lightning.pytorch import LightningModule, Trainer
    from stoker import JobConfig, Loader

    class Tiny(LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def training_step(self, batch, batch_idx):
            return (self.w * batch["image"].float().mean()).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    job = JobConfig(manifest_uri=sys.argv[1], epochs=2, batch_size=16, image_size=64)
    with Loader(job, workers=2) as loader:
        trainer = Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
        trainer.fit(Tiny(), train_dataloaders=loader)
"""


@pytest.mark.parametrize("shape", ["datamodule", "plain-loader"])
def test_a_two_epoch_trainer_steps_every_sample_once_in_each_epoch(manifest, tmp_path, shape):
    """One process, two local worker processes, batches of 16: 10 steps an epoch, both epochs whole.
    (Before iter() continued the rank's stream, epoch 1 took 0 steps: Lightning never asked epoch 0's
    iterator for its end, and the next iter() met it and stopped.)"""
    if shape == "datamodule":
        ranks = _run(tmp_path, 1, EXAMPLE, manifest.uri, *COMMON, "--batch-size", "16", "--workers", "2",
                     "--checkpoint-dir", str(tmp_path / "checkpoints"))
    else:
        script = tmp_path / "plain.py"
        script.write_text(textwrap.dedent(PLAIN))
        ranks = _run(tmp_path, 1, script, manifest.uri)
    _check_once_and_even(manifest, ranks)
    assert [len([s for s in ranks[0] if s["epoch"] == e]) for e in range(EPOCHS)] == [10, 10]


def _daemons_by_rank(pid: int, seen: set[str], done: threading.Event) -> None:
    """Until `done`: the host ids of the `stoker worker` daemons under `pid` (a loader's is HOST-loaderRANK-PID)."""
    while not done.wait(0.2):
        for command in _descendants(pid).values():
            if " worker " in command and "--host-id" in command:
                seen.add(command.split("--host-id", 1)[1].split()[0])


@pytest.fixture(scope="module")
def ddp_run(manifest, tmp_path_factory) -> tuple[Path, dict[int, list[dict]], set[str]]:
    """examples/lightning_train.py as written, 2 CPU ranks (DDP, gloo) under torchrun, 1 worker process
    beside local rank 0, checkpoints every 10 steps: its records and the worker daemons seen while it ran."""
    out = tmp_path_factory.mktemp("ddp")
    job = _start(out, 2, EXAMPLE, manifest.uri, *DDP, "--checkpoint-dir", str(out / "ckpt"))
    daemons: set[str] = set()
    done = threading.Event()
    watcher = threading.Thread(target=_daemons_by_rank, args=(job.pid, daemons, done), daemon=True)
    watcher.start()
    try:
        _finish(job, out)
    finally:
        done.set()
        watcher.join(5)
    return out, _records(out, 2), daemons


def test_ddp_ranks_fed_by_one_set_of_local_workers_step_every_sample_once(manifest, ddp_run):
    """Two ranks that all-reduce every step, fed by one daemon started beside local rank 0 (none beside
    rank 1): every sample once per epoch across the ranks, 7 steps on each."""
    _, ranks, daemons = ddp_run
    _check_once_and_even(manifest, ranks)
    assert [len(ranks[r]) for r in ranks] == [EPOCHS * 7] * 2
    assert len(daemons) == 1 and "-loader0-" in next(iter(daemons)), daemons


def test_a_run_resumed_from_a_mid_epoch_checkpoint_steps_only_what_the_checkpoint_had_not(manifest, ddp_run,
                                                                                         tmp_path):
    """The DDP run saved a Lightning checkpoint at step 10 (epoch 1, step 3 of 7): the data position is in it
    (the datamodule's state and the fit loop's, the same). The same command with --ckpt-path continues from
    there: the first run's steps before that position and the resumed run's steps are every sample
    exactly once per epoch, equal steps on each rank."""
    first_out, first, _ = ddp_run
    checkpoint = first_out / "ckpt" / "epoch=1-step=10.ckpt"
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    state = saved["StokerDataModule"]
    assert (state["epoch"], state["step"]) == (1, 3)
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [state]
    rest = _run(tmp_path, 2, EXAMPLE, manifest.uri, *DDP, "--checkpoint-dir", str(tmp_path / "ckpt"),
                "--ckpt-path", str(checkpoint))
    assert all([(s["epoch"], s["step"]) for s in rest[r]][0] == (1, 3) for r in rest)
    before = {r: [s for s in first[r] if (s["epoch"], s["step"]) < (1, 3)] for r in first}
    _check_once_and_even(manifest, {r: before[r] + rest[r] for r in rest})


class Tiny(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def training_step(self, batch, batch_idx):
        return (self.w * batch["image"].float().mean()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("max_epochs", [3, 1, None], ids=["more", "fewer", "unset"])
def test_a_max_epochs_other_than_the_jobs_is_refused_in_one_line_before_any_worker_starts(manifest, max_epochs):
    """The job has 2 epochs; a trainer of 3, of 1, or of Lightning's default 1000 is refused in setup() with
    one line naming both numbers and the fix, before the loader (and its worker processes) exists."""
    data = StokerDataModule(JobConfig(manifest_uri=manifest.uri, epochs=2, batch_size=16), workers=2)
    trainer = Trainer(max_epochs=max_epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(ConfigError) as refused:
        trainer.fit(Tiny(), datamodule=data)
    line = str(refused.value)
    given = 1000 if max_epochs is None else max_epochs
    assert "\n" not in line and f"Trainer(max_epochs={given})" in line and "epochs=2" in line, line
    assert "give Trainer(max_epochs=2)" in line, line
    assert data.loader is None


@pytest.mark.parametrize("entered", [False, True], ids=["made", "entered"])
def test_a_loader_made_before_lightnings_own_launcher_starts_the_ranks_is_refused_not_run_twice(manifest, tmp_path,
                                                                                               entered):
    """`python script.py` with Trainer(devices=2, strategy="ddp") and a Loader made at the top of the script:
    Lightning runs the script again for rank 1 with LOCAL_RANK and WORLD_SIZE but no RANK. Each process took
    itself for a rank 0 (of 1 and of 2): two jobs, samples stepped twice, then a hang SIGTERM did not end.
    Now the run fails with one line that says to make the loader once the group exists, and ends."""
    script = tmp_path / "too_early.py"
    body = textwrap.dedent(PLAIN).replace("devices=1", 'devices=2, strategy="ddp", enable_progress_bar=False')
    if not entered:  # made, and given to fit without a `with`
        body = body.replace("with Loader(job, workers=2) as loader:", "loader = Loader(job, workers=2)\nif True:")
    script.write_text(body)
    env = {**_env(), "PYTHONPATH": str(ROOT)}
    job = subprocess.run([sys.executable, str(script), manifest.uri], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=RUN_S)
    assert job.returncode != 0
    said = job.stdout + job.stderr
    assert "StokerDataModule does" in said and ("$WORLD_SIZE=2 is set but $RANK is not" in said
                                                or "this Loader took itself for rank 0 of 1" in said), said[-3000:]
