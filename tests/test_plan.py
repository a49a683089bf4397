"""Epoch plan and whole-batch building from a unit."""

import numpy as np

from pipeline.augment import TrainTransform
from pipeline.batching import DecodeOnHost, unit_batches
from pipeline.plan import EpochPlan
from pipeline.shards import ShardReader


def test_each_epoch_covers_every_sample_once_in_a_new_order(manifest):
    plan = EpochPlan(manifest, unit_size=24, epochs=2, seed=5)
    orders = []
    for epoch in range(2):
        ids = [int(u.first_sample_id + r) for u in plan.units(epoch) for r in u.sample_order(5)]
        assert sorted(ids) == list(range(manifest.num_samples))
        orders.append(ids)
    assert orders[0] != orders[1]
    assert [u.unit_id for u in plan.units(1)] == [u.unit_id for u in EpochPlan(manifest, 24, 2, 5).units(1)]


def test_batches_stay_full_when_a_sample_is_corrupt(corrupt_manifest):
    manifest, victim = corrupt_manifest
    plan = EpochPlan(manifest, unit_size=40, epochs=1, seed=0)
    reader_of = {}
    found = False
    for unit in plan.units(0):
        reader = reader_of.setdefault(unit.shard_index, ShardReader(manifest.shard_uri(unit.shard_index)))
        batches = list(unit_batches(reader, unit, DecodeOnHost(TrainTransform()), 8, seed=0))
        assert batches[-1].last and not any(b.last for b in batches[:-1])
        assert all(len(b.sample_ids) == 8 for b in batches[:-1])
        skipped = [s for b in batches for s in b.skipped]
        delivered = sum(len(b.sample_ids) for b in batches)
        assert delivered + len(skipped) == unit.size
        if skipped:
            found = True
            assert skipped[0][1] == victim
    assert found


def test_a_redone_unit_yields_identical_batches(manifest):
    unit = EpochPlan(manifest, unit_size=16, epochs=1, seed=3).units(0)[0]
    reader = ShardReader(manifest.shard_uri(unit.shard_index))
    first = list(unit_batches(reader, unit, DecodeOnHost(TrainTransform()), 8, seed=3))
    again = list(unit_batches(reader, unit, DecodeOnHost(TrainTransform()), 8, seed=3))
    for a, b in zip(first, again, strict=True):
        assert a.sample_ids == b.sample_ids
        assert np.array_equal(a.images, b.images)
