"""stoker/loader.py over a rank with fakes (tests/unit/accel/fakes.py): the real receiver and
books, a fake dispatcher and a fake worker; no sockets. Ranks that meet through torchrun's
store, and real workers: tests/integration/test_data_parallel.py."""

from __future__ import annotations

import numpy as np
import pytest

from stoker.loader import Loader
from stoker.protos.errors import ConfigError
from tests.unit.accel.fakes import SAMPLES, rank, send_job


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
