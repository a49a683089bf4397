"""stoker/loader.py over a rank with fakes (tests/unit/stoker/accel/fakes.py): the real receiver and
books, a fake dispatcher and a fake worker; no sockets. Ranks that meet through torchrun's
store, and real workers: tests/integration/test_data_parallel.py."""

from __future__ import annotations

import numpy as np
import pytest

from stoker.accel.consumer import Consumer
from stoker.loader import Loader, LoaderClosed, UncommittedStep
from stoker.protos.errors import ConfigError
from tests.unit.stoker.accel.fakes import CONFIG, SAMPLES, rank, send_job
from tests.unit.stoker.accel.fakes import job as fake_job


def _loader(monkeypatch, tmp_path, epochs: int = 2) -> Loader:
    consumer = rank(monkeypatch, tmp_path, epochs=epochs)
    send_job(consumer)
    return Loader.over(consumer, format="numpy", overlap=False)


def test_one_pass_is_one_epoch_of_every_sample_once_then_nothing(monkeypatch, tmp_path):
    loader = _loader(monkeypatch, tmp_path)
    passes = []
    for epoch in range(loader.epochs):
        assert (loader.epoch, len(loader)) == (epoch, 5)  # batches of 4 from units of 8, 8 and 4
        batches = list(loader)
        assert [(b.epoch, b.step) for b in batches] == [(epoch, step) for step in range(5)]
        passes.append(np.concatenate([b.sample_ids for b in batches]))
    assert [sorted(p.tolist()) for p in passes] == [list(range(SAMPLES))] * 2
    assert loader.epoch == 2 and list(loader) == []
    loader.close()


def test_a_batch_holds_the_received_arrays_in_the_asked_format(monkeypatch, tmp_path):
    loader = _loader(monkeypatch, tmp_path, epochs=1)
    batch = next(iter(loader))
    assert set(batch) == {"image", "label"} and batch.rows == 4
    assert isinstance(batch["image"], np.ndarray) and batch["image"].shape == (4, 4, 4, 3)
    assert (batch["image"] == 7).all() and batch["label"].dtype == np.int32
    loader.close()


def test_the_batch_handed_back_on_the_next_request_returns_its_unit(monkeypatch, tmp_path):
    loader = _loader(monkeypatch, tmp_path, epochs=1)
    fake = loader.consumer.dispatcher
    batches = iter(loader)
    first_unit = loader.consumer.plan.rank_units(0, 0)[0]
    next(batches), next(batches)  # the unit's two batches: the second is still being stepped
    assert fake.acks == []
    next(batches)  # asking for the third means the second's step is over: the unit is done
    assert fake.acks == [(first_unit.unit_id, 2)]
    loader.close()
    assert len(fake.acks) == 1  # closing hands back the step in hand: its unit is not whole yet


def test_state_dict_is_the_data_position_after_the_batches_yielded(monkeypatch, tmp_path):
    loader = _loader(monkeypatch, tmp_path, epochs=1)
    batches = iter(loader)
    next(batches), next(batches), next(batches)
    assert (loader.state_dict()["epoch"], loader.state_dict()["step"]) == (0, 3)
    with pytest.raises(RuntimeError, match="before the loader is first used"):
        loader.load_state_dict(loader.state_dict())
    loader.close()


def test_state_loaded_inside_the_loaders_with_is_refused_naming_the_with(monkeypatch, tmp_path):
    """Entering `with` binds and attaches the rank: it is a first use, and the refusal says so."""
    loader = _loader(monkeypatch, tmp_path, epochs=1)
    with loader:
        next(iter(loader))
        state = loader.state_dict()
    again = _loader(monkeypatch, tmp_path, epochs=1)
    with again, pytest.raises(RuntimeError, match="first used \\(entering its `with`, len"):
        again.load_state_dict(state)


def test_an_unknown_format_is_refused_at_once():
    with pytest.raises(ValueError, match="format must be one of torch, numpy, jax"):
        Loader(rank=0, world_size=1, format="arrow")


@pytest.mark.parametrize("workers", [-1, True, 2.5, "2", 10**6])
def test_a_workers_count_that_cannot_work_is_refused_at_construction(workers):
    with pytest.raises(ConfigError, match=r"workers must be a whole number from 0 \(start none here\) to \d+"):
        Loader(rank=0, world_size=1, workers=workers)


def test_workers_with_keys_are_refused_they_would_start_keyless(tmp_path):
    with pytest.raises(ConfigError, match="with CURVE keys start the job's daemons yourself"):
        Loader(rank=0, world_size=1, workers=2, keys=str(tmp_path))


def test_workers_take_free_ports_so_two_jobs_of_one_machine_do_not_collide():
    loader = Loader(rank=0, world_size=1, workers=1)
    assert loader.cfg.metrics_port == 0 and loader.cfg.control_bind.endswith(":0")
    assert Loader(rank=0, world_size=1).cfg.control_bind.endswith(":5561")  # daemons started apart must know it


def test_taking_exactly_len_batches_then_iter_again_gives_every_epoch_and_the_epoch_in_hand(monkeypatch, tmp_path):
    """PyTorch Lightning's habit: len(loader) batches per iterator, never the next() that sees the end.
    Before: epoch 1 had 0 steps, and loader.epoch said 1 during epoch 0's last step."""
    loader = _loader(monkeypatch, tmp_path)
    seen = []
    for epoch in range(loader.epochs):
        batches = iter(loader)
        for _ in range(len(loader)):
            batch = next(batches)
            assert loader.epoch == batch.epoch == epoch
            seen.append(batch.sample_ids.tolist())
    assert sorted(sum(seen[:5], [])) == sorted(sum(seen[5:], [])) == list(range(SAMPLES))
    assert list(loader) == [] and loader.epoch == 2
    loader.close()


def test_load_state_dict_after_len_takes_only_the_position_it_starts_from(monkeypatch, tmp_path):
    """Lightning asks len() and then restores its loaders: the state the loader was made with is taken
    again; any other, or any state once a batch was given, is refused with the fix."""
    first = _loader(monkeypatch, tmp_path)
    batches = iter(first)
    next(batches), next(batches), next(batches)
    saved = first.state_dict()
    first.close()
    consumer = Consumer(CONFIG, fake_job(tmp_path, epochs=2), resume=saved)
    consumer.start()
    resumed = Loader.over(consumer, format="numpy", overlap=False)
    assert len(resumed) == 5
    resumed.load_state_dict(saved)  # the same position: taken
    with pytest.raises(LoaderClosed, match="this one started from epoch 0 step 3, and `state` names another position"):
        resumed.load_state_dict({**saved, "step": 2, "ranks": [[1, 0]]})
    send_job(consumer)
    assert [b.step for b in resumed] == [3, 4]
    with pytest.raises(LoaderClosed, match=r"started from epoch 0 step 3 and has given batches since \(it stands at "
                                           r"epoch 1 step 0\)"):
        resumed.load_state_dict(saved)
    resumed.close()


@pytest.mark.parametrize("device, said", [("banana", "is not a torch device"), ("cuda", "torch sees no CUDA device")])
def test_a_device_that_cannot_work_is_refused_at_construction(device, said):
    """It used to fail at the first batch, after the workers started, in torch's words."""
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match=said):
        Loader(rank=0, world_size=1, device=device)


def test_with_commit_steps_a_unit_is_acked_and_the_position_moves_only_at_commits(monkeypatch, tmp_path):
    """A rolled-back step's batch comes again; nothing uncommitted is acked, not even at close."""
    consumer = rank(monkeypatch, tmp_path, epochs=1)
    send_job(consumer)
    loader = Loader.over(consumer, format="numpy", overlap=False, commit_steps=True)
    fake = loader.consumer.dispatcher
    first_unit = loader.consumer.plan.rank_units(0, 0)[0]
    batches = iter(loader)
    first = next(batches)
    assert next(batches) is first and loader.state_dict()["step"] == 0  # not committed: the same batch again
    loader.commit(first)
    second = next(batches)
    assert second.step == 1 and fake.acks == [] and loader.state_dict()["step"] == 1
    loader.commit()
    assert fake.acks == [(first_unit.unit_id, 2)] and loader.state_dict()["step"] == 2
    third = next(batches)
    loader.close()
    assert len(fake.acks) == 1 and loader.state_dict()["step"] == 2, third.step  # the uncommitted third is not
    with pytest.raises(LoaderClosed, match=r"commit\(\): the loader is closed"):
        loader.commit(third)
    with pytest.raises(LoaderClosed, match="the loader is closed"):
        next(batches)  # an iterator made before close() gives nothing after it


def test_commit_without_commit_steps_or_before_a_batch_is_refused(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="commit_steps=True"):
        _loader(monkeypatch, tmp_path).commit()
    with pytest.raises(UncommittedStep, match="no batch is in hand"):
        Loader(commit_steps=True).commit()
