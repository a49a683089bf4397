"""The epoch plan (one stream per rank) and whole-batch building from a unit."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.augment import TrainTransform
from pipeline.batching import DecodeOnHost, unit_batches
from pipeline.plan import EpochPlan, batch_bounds
from pipeline.shards import Manifest, ShardInfo, ShardReader


def _readers(manifest):
    readers = {}

    def reader_of(shard):
        if shard not in readers:
            readers[shard] = ShardReader(manifest.shard_uri(shard))
        return readers[shard]

    return reader_of


def test_each_epoch_covers_every_sample_once_in_a_new_order(manifest):
    plan = EpochPlan(manifest, unit_size=24, epochs=2, seed=5)
    orders = []
    for epoch in range(2):
        ids = [sample for u in plan.units(epoch) for _, _, sample in u.rows(5)]
        assert sorted(ids) == list(range(manifest.num_samples))
        orders.append(ids)
    assert orders[0] != orders[1]
    assert plan.units(1) == EpochPlan(manifest, 24, 2, 5).units(1)


shard_sizes = st.lists(st.integers(1, 90), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(sizes=shard_sizes, world=st.integers(1, 8), batch=st.integers(1, 16), unit_batches=st.integers(1, 4),
       epoch=st.integers(0, 2))
def test_every_sample_is_in_exactly_one_rank_stream_and_streams_are_even(sizes, world, batch, unit_batches, epoch):
    first = np.cumsum([0, *sizes[:-1]])
    shards = [ShardInfo(f"s{i}", n, 1, "", int(f)) for i, (n, f) in enumerate(zip(sizes, first, strict=True))]
    manifest = Manifest(kind="imagenet", classes=["a"], shards=shards)
    if manifest.num_samples < world:
        with pytest.raises(ValueError, match="cannot feed"):
            EpochPlan(manifest, batch * unit_batches, 3, 0, world)
        return
    plan = EpochPlan(manifest, batch * unit_batches, 3, 0, world, batch)
    streams = [np.concatenate([u.sample_ids() for u in plan.rank_units(epoch, r)]) for r in range(world)]
    everything = np.concatenate(streams)
    assert sorted(everything.tolist()) == list(range(manifest.num_samples))  # once each, in one rank
    assert max(map(len, streams)) - min(map(len, streams)) <= 1
    batches = [sum(-(-u.size // batch) for u in plan.rank_units(epoch, r)) for r in range(world)]
    assert max(batches) - min(batches) <= 1  # the schedule evens out the one-batch difference
    short = [u for u in plan.units(epoch) if u.size % batch]
    assert len(short) <= world  # only a rank's last unit can end in a short batch
    for unit in plan.units(epoch):  # and no batch is a sliver of a batch, where a unit has two or more
        sizes = [b - a for a, b in batch_bounds(unit.size, batch)]
        assert len(sizes) == 1 or min(sizes) >= batch / 2
    assert all(u == plan.unit(u.unit_id) for u in plan.units(epoch))
    last = plan.rank_units(epoch, world - 1)
    assert [u.position for u in last] == list(range(len(last)))


@settings(max_examples=100, deadline=None)
@given(sizes=shard_sizes, world=st.integers(1, 8), batch=st.integers(1, 16), unit_batches=st.integers(1, 4),
       epoch=st.integers(0, 2))
def test_drop_last_gives_every_rank_the_same_whole_batches_and_drops_less_than_one_round(
        sizes, world, batch, unit_batches, epoch):
    first = np.cumsum([0, *sizes[:-1]])
    shards = [ShardInfo(f"s{i}", n, 1, "", int(f)) for i, (n, f) in enumerate(zip(sizes, first, strict=True))]
    manifest = Manifest(kind="imagenet", classes=["a"], shards=shards)
    if manifest.num_samples < world * batch:
        with pytest.raises(ValueError, match="do not make one batch|cannot feed"):
            EpochPlan(manifest, batch * unit_batches, 3, 0, world, batch, drop_last=True)
        return
    plan = EpochPlan(manifest, batch * unit_batches, 3, 0, world, batch, drop_last=True)
    streams = [np.concatenate([u.sample_ids() for u in plan.rank_units(epoch, r)]) for r in range(world)]
    everything = np.concatenate(streams)
    assert len(set(everything.tolist())) == everything.size == plan.samples_per_epoch  # nothing twice
    assert manifest.num_samples - everything.size < world * batch  # less than one batch per rank left out
    assert {len(s) for s in streams} == {len(streams[0])} and len(streams[0]) % batch == 0
    for unit in plan.units(epoch):
        assert unit.size % batch == 0  # every batch full


def test_an_unusable_image_leaves_its_batch_a_row_short(corrupt_manifest):
    """The batch count of a unit follows from its size, so every rank's steps follow from the plan."""
    manifest, victim = corrupt_manifest
    plan = EpochPlan(manifest, unit_size=40, epochs=1, seed=0)
    found = False
    for unit in plan.units(0):
        batches = list(unit_batches(_readers(manifest), unit, DecodeOnHost(TrainTransform()), 8, seed=0))
        assert len(batches) == -(-unit.size // 8)
        assert batches[-1].last and not any(b.last for b in batches[:-1])
        skipped = [s for b in batches for s in b.skipped]
        delivered = sum(len(b.sample_ids) for b in batches)
        assert delivered + len(skipped) == unit.size
        if skipped:
            found = True
            assert skipped[0][1] == victim
            assert sorted(len(b.sample_ids) for b in batches)[0] == 7  # one batch is a row short
    assert found


def test_a_redone_unit_yields_identical_batches(manifest):
    unit = EpochPlan(manifest, unit_size=16, epochs=1, seed=3).units(0)[0]
    first = list(unit_batches(_readers(manifest), unit, DecodeOnHost(TrainTransform()), 8, seed=3))
    again = list(unit_batches(_readers(manifest), unit, DecodeOnHost(TrainTransform()), 8, seed=3))
    for a, b in zip(first, again, strict=True):
        assert a.sample_ids == b.sample_ids
        assert np.array_equal(a.images, b.images)
