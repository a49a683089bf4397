"""stoker/lightning.py: the refusals and the worker split on their own, and real Lightning Trainers over a
StokerDataModule whose loader's rank runs on the fakes (tests/unit/stoker/accel/fakes.py: the real receiver and
books, a fake dispatcher and worker; no sockets, no processes). Real workers, DDP and the example script:
tests/integration/test_lightning.py."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from stoker.accel import assembly
from stoker.accel.consumer import Consumer
from stoker.lightning import StokerDataModule, epochs_mismatch, workers_here
from stoker.loader import Loader
from stoker.protos.errors import ConfigError, StateError
from tests.unit.stoker.accel import fakes
from tests.unit.stoker.accel.fakes import CONFIG, SAMPLES, send_job

STEPS = 5  # fakes.job: 20 samples in batches of 4


def test_max_epochs_must_be_the_jobs_and_the_refusal_is_one_line_with_both_numbers_and_the_fix():
    assert epochs_mismatch(2, 2) is None
    for given in (3, 1, 1000, -1, None):
        line = epochs_mismatch(given, 2)
        assert line is not None and "\n" not in line
        assert f"Trainer(max_epochs={given})" in line and "the job's epochs=2" in line
        assert "give Trainer(max_epochs=2)" in line
        assert ("JobConfig(epochs=" in line) == (given is not None and given > 0)  # never "epochs=-1"


def test_the_machines_workers_start_beside_its_local_rank_zero_only():
    assert [workers_here(6, local) for local in range(4)] == [6, 0, 0, 0]
    assert workers_here(0, 0) == 0


@pytest.mark.parametrize("options", [{"rank": 1}, {"world_size": 2, "local_rank": 0}])
def test_the_ranks_are_the_trainers_not_the_scripts(tmp_path, options):
    with pytest.raises(ConfigError, match="from the trainer"):
        StokerDataModule(fakes.job(tmp_path), **options)


@pytest.mark.parametrize("workers", [-1, True, 1.5, "2"])
def test_workers_is_a_whole_number_of_processes(tmp_path, workers):
    with pytest.raises(ConfigError, match="workers must be a whole number"):
        StokerDataModule(fakes.job(tmp_path), workers=workers)


def test_before_its_loader_the_module_holds_the_position_it_was_given_and_needs_a_trainer(tmp_path):
    data = StokerDataModule(fakes.job(tmp_path))
    assert data.state_dict() == {}  # Lightning saves nothing for it then
    data.load_state_dict({"epoch": 1, "step": 2})
    assert data.state_dict() == {"epoch": 1, "step": 2}  # a checkpoint saved now keeps the position
    data.teardown("fit")  # nothing to close
    with pytest.raises(StateError, match="Trainer.fit"):
        data.train_dataloader()


class Recording(LightningModule):
    """Steps nothing real; records (epoch, step, sample ids) of each batch; `fail_at` raises there."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
        self.steps: list[tuple[int, int, list[int]]] = []
        self.fail_at = fail_at

    def training_step(self, batch, batch_idx):
        if len(self.steps) == self.fail_at:
            raise KeyError("the model's own error")
        self.steps.append((batch.epoch, batch.step, batch.sample_ids.tolist()))
        return (self.w * batch["image"].float().mean()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.fixture
def fake_ranks(monkeypatch) -> list[Loader]:
    """Every Loader made from now on runs its rank on the fakes, resuming from what it was given (a fresh
    consumer each, as a new process would); the loaders made, in order."""
    monkeypatch.setattr(assembly, "ReceiveLoop", fakes.InlineLoop)
    monkeypatch.setattr(assembly, "dispatcher_for",
                        lambda cfg, joined, plan, start, me, services: fakes.FakeDispatcher(plan.total_units))
    made: list[Loader] = []

    def consumer(loader: Loader) -> Consumer:
        made.append(loader)
        rank = Consumer(CONFIG, loader.job_config, resume=loader._resume)
        rank.start()
        send_job(rank)
        return rank

    monkeypatch.setattr(Loader, "_make_consumer", consumer)
    return made


def _trainer(max_epochs: int = 2, **options: object) -> Trainer:
    return Trainer(max_epochs=max_epochs, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, **{"enable_checkpointing": False, **options})


def _whole_epochs(steps: list[tuple[int, int, list[int]]]) -> None:
    for epoch in range(2):
        mine = [s for s in steps if s[0] == epoch]
        assert [s[1] for s in mine] == list(range(STEPS)), f"epoch {epoch}"
        assert sorted(i for s in mine for i in s[2]) == list(range(SAMPLES)), f"epoch {epoch}"


@pytest.mark.parametrize("reload", [0, 1], ids=["one-dataloader", "reloaded-every-epoch"])
def test_a_fit_of_two_epochs_steps_both_whole_from_one_loader_closed_at_teardown(fake_ranks, tmp_path, reload):
    """Lightning takes len(loader) batches an epoch and never the next() that sees the end; asked for the
    dataloader again each epoch (reload_dataloaders_every_n_epochs=1) it gets the same loader."""
    data = StokerDataModule(fakes.job(tmp_path, epochs=2), overlap=False)
    model = Recording()
    _trainer(reload_dataloaders_every_n_epochs=reload).fit(model, datamodule=data)
    _whole_epochs(model.steps)
    assert len(fake_ranks) == 1 and data.loader is fake_ranks[0]
    assert (data.loader.device, data.loader.rank, data.loader.world_size, data.loader.overlap) == ("cpu", 0, 1, False)
    assert data.state_dict()["epoch"] == 2  # after teardown: the position it was closed at
    with pytest.raises(StateError, match="make a new StokerDataModule"):
        data.train_dataloader()


@pytest.mark.parametrize(("saving", "resumed_at"), [
    ({"every_n_train_steps": 3}, (0, 3)),  # mid-epoch, in on_train_batch_end
    ({"every_n_train_steps": 5}, (1, 0)),  # after the epoch's last step, in on_train_batch_end
    ({"every_n_epochs": 1}, (1, 0)),  # in on_train_epoch_end
], ids=["mid-epoch", "last-step", "epoch-end"])
def test_a_fit_resumed_from_a_checkpoint_steps_the_rest_once(fake_ranks, tmp_path, saving, resumed_at):
    """Lightning restores the module's state before train_dataloader() and the loop's after len(): the
    loader starts from the checkpoint's position and takes the same state again."""
    first = Recording()
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, **saving)
    _trainer(callbacks=[every], enable_checkpointing=True).fit(first, datamodule=StokerDataModule(
        fakes.job(tmp_path, epochs=2), overlap=False))
    rest = Recording()
    _trainer().fit(rest, datamodule=StokerDataModule(fakes.job(tmp_path, epochs=2), overlap=False),
                   ckpt_path=tmp_path / "ckpt" / f"epoch=0-step={3 if resumed_at[0] == 0 else 5}.ckpt")
    assert rest.steps[0][:2] == resumed_at
    _whole_epochs([s for s in first.steps if s[:2] < resumed_at] + rest.steps)


def test_fast_dev_run_is_let_through_and_takes_its_batches(fake_ranks, tmp_path):
    """A smoke test of two batches is not the job: its max_epochs (1) is not held against the job's 2."""
    data = StokerDataModule(fakes.job(tmp_path, epochs=2), overlap=False)
    model = Recording()
    Trainer(fast_dev_run=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
            enable_model_summary=False, default_root_dir=tmp_path).fit(model, datamodule=data)
    assert [s[:2] for s in model.steps] == [(0, 0), (0, 1)] and data.loader is not None and data.loader._closed


def test_a_fit_that_fails_closes_the_loader_too(fake_ranks, tmp_path):
    """Lightning calls no teardown() after an error in the fit, only on_exception()."""
    data = StokerDataModule(fakes.job(tmp_path, epochs=2), overlap=False)
    with pytest.raises(KeyError, match="the model's own error"):
        _trainer().fit(Recording(fail_at=3), datamodule=data)
    assert data.loader is not None and data.loader._closed


def test_a_trainer_of_other_epochs_is_refused_before_the_loader_is_made(fake_ranks, tmp_path):
    data = StokerDataModule(fakes.job(tmp_path, epochs=2), overlap=False)
    with pytest.raises(ConfigError, match=r"Trainer\(max_epochs=3\) does not match the job's epochs=2"):
        _trainer(max_epochs=3).fit(Recording(), datamodule=data)
    assert data.loader is None and fake_ranks == []
