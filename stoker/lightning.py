"""PyTorch Lightning: a LightningDataModule whose train_dataloader() is this rank's `stoker.Loader`.

    from stoker import JobConfig
    from stoker.lightning import StokerDataModule

    job = JobConfig(manifest_uri="shards/manifest.json", epochs=90, batch_size=256)
    trainer = Trainer(max_epochs=job.epochs, devices=8, strategy="ddp")
    trainer.fit(model, datamodule=StokerDataModule(job, workers=16), ckpt_path=last_or_none)

What it takes care of, and why here rather than in a script:

- The Loader is made in train_dataloader(): by then Lightning has started the process group, so
  the Loader meets rank 0 through its store, and the trainer says this process's rank, world size,
  local rank and device. One Loader per fit: Lightning may ask for the dataloader again
  (reload_dataloaders_every_n_epochs) and gets the same one, the rank's one stream of batches.
- `workers` are decode processes per machine, not per rank: local rank 0's Loader starts them (one
  `stoker worker` daemon) and they feed every rank of the job, so 8 ranks on a node with
  `workers=16` run 16 processes, not 128. The dispatcher hands any rank's units to any process.
- The data position is in Lightning's checkpoint: state_dict() is the loader's (the job's position,
  the same on every rank); on `fit(ckpt_path=...)` Lightning calls load_state_dict() before
  train_dataloader() (trainer/connectors/checkpoint_connector.py, restore_datamodule), so the state
  is handed to the Loader before its first use. Lightning also saves the Loader's own state_dict()
  with its loop and gives it back after len(): the same position, which the Loader accepts.
- Trainer(max_epochs) must be the job's epochs: the job's plan ends there. A longer trainer would
  run empty epochs (an epoch-wise LR schedule stepping on nothing, max_epochs=-1 for ever), a
  shorter one stops a job that still has work planned. It is refused with one line, not changed
  behind the user's back: the number is theirs, and Lightning's own is private loop state.
  (`fast_dev_run` is let through: a smoke test of a batch or a few, not the job.)
- teardown() (or on_exception(), for a fit that fails) closes the Loader: its sockets, and the worker
  processes it started.

Lightning is imported here only; the rest of stoker imports without it.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningDataModule, Trainer

from stoker.loader import Loader
from stoker.pipeline.job import JobConfig
from stoker.protos.errors import ConfigError, StateError

__all__ = ["StokerDataModule", "epochs_mismatch", "workers_here"]
TRAINER_DECIDES = ("rank", "world_size", "local_rank")  # Loader options the trainer knows better than a script


def epochs_mismatch(max_epochs: int | None, job_epochs: int) -> str | None:
    """The one line that refuses a Trainer whose max_epochs is not the job's epochs; None when they agree."""
    if max_epochs == job_epochs:
        return None
    other = f", or JobConfig(epochs={max_epochs}) for a job that long" if max_epochs and max_epochs > 0 else ""
    return (f"Trainer(max_epochs={max_epochs}) does not match the job's epochs={job_epochs}: the loader's batches end "
            f"with the job's last epoch; give Trainer(max_epochs={job_epochs}) (max_steps may still stop sooner)"
            f"{other}")


def workers_here(workers: int, local_rank: int) -> int:
    """The worker processes this rank's Loader starts: all of the machine's on local rank 0, none on the
    others (one daemon per machine feeds all its ranks, as one fleet)."""
    return workers if local_rank == 0 else 0


class StokerDataModule(LightningDataModule):
    """A Stoker job as Lightning's training data: train_dataloader() is this rank's Loader."""

    def __init__(self, job: JobConfig, *, workers: int = 0, **loader_options: Any) -> None:
        """`job`: the same on every rank (rank 0's counts). `workers`: decode processes on each machine,
        started beside its local rank 0 and dying with its loader (0: the job's `stoker worker` daemons
        are started apart). `loader_options`: the Loader's other keywords (format, device, config, keys,
        ...); the device defaults to the trainer's, and rank, world size and local rank are the trainer's."""
        super().__init__()
        given = sorted(set(TRAINER_DECIDES) & loader_options.keys())
        if given:
            raise ConfigError(f"StokerDataModule takes {', '.join(given)} from the trainer (each process's rank "
                              f"under Lightning's strategy); leave {' and '.join(given)} out")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ConfigError(f"workers must be a whole number of processes per machine (0: start none), "
                              f"not {workers!r}")
        self.job = job
        self.workers = workers
        self.loader_options = loader_options
        self.loader: Loader | None = None  # made by train_dataloader(), closed by teardown()
        self._resume: dict | None = None  # a checkpoint's position, for the loader to start from
        self._closed = False

    def setup(self, stage: str) -> None:
        """Before the model is set up and any worker started: refuse a max_epochs the job does not have."""
        if stage == "fit":
            self._check_epochs(self._attached_trainer())

    def train_dataloader(self) -> Loader:
        """This rank's Loader, made on the first call (with any state load_state_dict() was given) and the
        same one after: a rank has one stream of batches, and iterating it again continues it."""
        if self._closed:
            raise StateError("this StokerDataModule's loader was closed when its fit ended (teardown); make a new "
                             "StokerDataModule for another fit, with load_state_dict(old.state_dict()) to continue")
        if self.loader is None:
            self.loader = self._make_loader(self._attached_trainer())
        return self.loader

    def _make_loader(self, trainer: Trainer) -> Loader:
        self._check_epochs(trainer)
        options = {"device": str(trainer.strategy.root_device), **self.loader_options}
        loader = Loader(self.job, rank=trainer.global_rank, world_size=trainer.world_size,
                        local_rank=trainer.local_rank, workers=workers_here(self.workers, trainer.local_rank),
                        **options)
        if self._resume is not None:
            loader.load_state_dict(self._resume)
        return loader

    def _attached_trainer(self) -> Trainer:
        if self.trainer is None:
            raise StateError("StokerDataModule makes its loader for a trainer: pass it to "
                             "Trainer.fit(model, datamodule=...), which calls train_dataloader()")
        return self.trainer

    def _check_epochs(self, trainer: Trainer) -> None:
        """fast_dev_run is let through: Lightning takes a batch or a few and stops, a smoke test, not the job."""
        fast_dev_run = getattr(trainer, "fast_dev_run", False)  # set by the Trainer, not declared on it
        problem = None if fast_dev_run else epochs_mismatch(trainer.max_epochs, self.job.epochs)
        if problem:
            raise ConfigError(problem)

    def state_dict(self) -> dict[str, Any]:
        """The job's data position after the batches yielded so far (what Lightning saves in its checkpoint);
        before the loader is made, the position it will start from ({} for the job's start)."""
        if self.loader is not None:
            return self.loader.state_dict()
        return dict(self._resume or {})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a checkpoint's position. Lightning calls this before train_dataloader(), so it is kept
        for the loader to start from; once the loader is made, the loader says whether it still can."""
        if self.loader is not None:
            self.loader.load_state_dict(state_dict)
            return
        self._resume = dict(state_dict) if state_dict else None

    def teardown(self, stage: str) -> None:
        """Close the loader at the end of the fit: sockets, threads, and the worker processes it started.
        Its position stays readable (state_dict()), for a checkpoint saved after fit()."""
        self._close()

    def on_exception(self, exception: BaseException) -> None:
        """A fit that fails (or is interrupted) gets no teardown() from Lightning: close the loader here, so
        its worker processes stop now, not when the interpreter exits."""
        self._close()

    def _close(self) -> None:
        if self.loader is not None and not self._closed:
            self._closed = True
            self.loader.close()
