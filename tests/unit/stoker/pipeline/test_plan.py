"""The epoch plan (one stream per rank) and whole-batch building from a unit."""

import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.pipeline.images.augment import TrainTransform
from stoker.pipeline.images.batching import HostTransform, unit_batches
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.remainder import Cut, Resumed
from stoker.pipeline.store.shards import Manifest, ShardInfo, ShardReader
from stoker.pipeline.units import batch_bounds


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
        batches = list(unit_batches(_readers(manifest), unit, HostTransform(TrainTransform()), 8, seed=0))
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
    first = list(unit_batches(_readers(manifest), unit, HostTransform(TrainTransform()), 8, seed=3))
    again = list(unit_batches(_readers(manifest), unit, HostTransform(TrainTransform()), 8, seed=3))
    for a, b in zip(first, again, strict=True):
        assert a.sample_ids == b.sample_ids
        assert np.array_equal(a.images, b.images)


def _position(plan: EpochPlan, epoch: int, step: int) -> tuple[tuple[int, int], ...]:
    """Where every rank stands after `step` steps of `epoch` (as the dispatcher says it)."""
    out = []
    for rank in range(plan.world_size):
        index, consumed = 0, plan.step_offset(epoch)
        for unit in plan.rank_units(epoch, rank):
            count = len(batch_bounds(unit.size, plan.batch_size))
            if consumed + count > step:
                break
            consumed += count
            index += 1
        out.append((index, step - consumed))
    return tuple(out)


def _stepped(plan: EpochPlan, epoch: int, position: tuple[tuple[int, int], ...]) -> list[int]:
    """The sample ids every rank had stepped at `position`."""
    ids = []
    for rank, (index, batches) in enumerate(position):
        units = plan.rank_units(epoch, rank)
        ids += [i for unit in units[:index] for i in unit.sample_ids().tolist()]
        if index < len(units) and batches:
            rows = units[index].rows(plan.seed)
            ids += [sample for _, _, sample in rows[:batch_bounds(len(rows), plan.batch_size)[batches][0]]]
    return ids


@settings(max_examples=150, deadline=None)
@given(sizes=shard_sizes, worlds=st.lists(st.integers(1, 6), min_size=2, max_size=4), batch=st.integers(1, 8),
       unit_batches=st.integers(1, 3), drop_last=st.booleans(), data=st.data())
def test_a_job_resumed_at_other_world_sizes_steps_every_sample_of_the_epoch_once(sizes, worlds, batch, unit_batches,
                                                                                 drop_last, data):
    """An epoch checkpointed by N ranks at some step, continued by M (and again by K...): what was stepped
    before each cut and what the last world size's streams hold are every sample of the epoch once."""
    first = np.cumsum([0, *sizes[:-1]])
    shards = [ShardInfo(f"s{i}", n, 1, "", int(f)) for i, (n, f) in enumerate(zip(sizes, first, strict=True))]
    manifest = Manifest(kind="imagenet", classes=["a"], shards=shards)
    epoch = 1
    try:
        plan = EpochPlan(manifest, batch * unit_batches, 3, 7, worlds[0], batch, drop_last)
    except ValueError:
        return  # too few samples for the first world size: refused, as the plan tests above check
    expected = sorted(i for u in plan.units(epoch) for i in u.sample_ids().tolist())
    stepped: list[int] = []
    cuts: tuple[Cut, ...] = ()
    for world in worlds[1:]:
        steps = plan.step_offset(epoch) + max(sum(len(batch_bounds(u.size, batch)) for u in plan.rank_units(epoch, r))
                                              for r in range(plan.world_size))
        step = data.draw(st.integers(plan.step_offset(epoch), steps))
        position = _position(plan, epoch, step)
        stepped += _stepped(plan, epoch, position)
        cuts = (*cuts, Cut(plan.world_size, step, position))
        try:
            plan = EpochPlan(manifest, batch * unit_batches, 3, 7, world, batch, drop_last, Resumed(epoch, cuts))
        except ValueError as exc:
            assert "left, fewer than" in str(exc) or "cannot feed" in str(exc) or "do not make one batch" in str(exc)
            return
        assert Resumed.from_json(plan.resumed.to_json()) == plan.resumed
        units = plan.units(epoch)
        assert len(units) == plan.units_in(epoch) <= plan.units_per_epoch
        assert [u.unit_id for u in units] == list(range(epoch * plan.units_per_epoch,
                                                        epoch * plan.units_per_epoch + len(units)))
        assert all(plan.unit(u.unit_id) == u for u in units)
        assert plan.total_units == sum(plan.units_in(e) for e in range(3))  # counted, not summed: the same
        assert all(plan.rank_total_units(r) == sum(len(plan.rank_units(e, r)) for e in range(3)) for r in range(world))
        rows = [u.size for r in range(world) for u in plan.rank_units(epoch, r)]
        streams = [sum(u.size for u in plan.rank_units(epoch, r)) for r in range(world)]
        assert max(streams) - min(streams) <= (0 if drop_last else 1) and all(rows)
    left = [i for u in plan.units(epoch) for i in u.sample_ids().tolist()]
    if drop_last:  # rows past the last world size's whole batches sit the rest of the epoch out
        assert len(set(stepped + left)) == len(stepped) + len(left) and set(stepped + left) <= set(expected)
    else:
        assert sorted(stepped + left) == expected
    assert plan.units(epoch + 1) == EpochPlan(manifest, batch * unit_batches, 3, 7, worlds[-1], batch,
                                              drop_last).units(epoch + 1)  # later epochs: the new world size's


def test_the_most_epochs_a_job_takes_are_counted_at_once(manifest):
    """`stoker run --epochs 2147483647` was silent for 20 s and more before its first line: the dispatcher's
    count of the job's units (and an attached rank's of its own) summed them epoch by epoch."""
    plan = EpochPlan(manifest, 16, 2**31 - 1, 0, 3, 8)
    started = time.monotonic()
    assert plan.total_units == plan.units_per_epoch * (2**31 - 1)
    assert [plan.rank_total_units(r) for r in range(3)] == [n * (2**31 - 1) for n in plan.units_per_rank]
    assert time.monotonic() - started < 1.0


def test_a_plan_asked_for_units_from_two_threads_keeps_its_cache_whole(manifest):
    """A consumer's receive loop and its training thread share one plan. Two threads keeping epochs in its
    cache at once (each keep trims it to four: the oldest found, then deleted) raise nothing, and the plan
    still answers every epoch with its own units."""
    plan = EpochPlan(manifest, 16, 50_000, 7)
    failures: list[BaseException] = []

    def keep(epochs: range) -> None:
        try:
            for epoch in epochs:
                plan._cache.keep(epoch, ())
        except BaseException as exc:  # noqa: BLE001 - the thread's failure is the test's
            failures.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter will: a race shows
    try:
        threads = [threading.Thread(target=keep, args=(range(start, 50_000, 2),)) for start in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads), "a thread did not finish in 120 s"
    assert not failures, failures
    assert len(plan._cache) <= 4
    assert list(plan.units(3)) == list(EpochPlan(manifest, 16, 50_000, 7).units(3))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 40), st.integers(0, 30), st.integers(0, 1000)),
                min_size=0, max_size=4), st.integers(0, 3), st.integers(0, 2**31))
def test_a_units_visits_by_whole_arrays_are_its_rows_sample_by_sample(parts, epoch, seed):
    """Unit.visits (numpy, for token units of thousands of documents) is the seeded order the loop per sample
    made: the same (shard, row, sample id) in the same order."""
    from stoker.pipeline.seeds import derived_rng
    from stoker.pipeline.units import Segment, Unit

    unit = Unit(7, epoch, tuple(Segment(shard, start, start + size, first) for shard, start, size, first in parts))
    flat = [(s.shard_index, row, s.first_sample_id + row) for s in unit.segments for row in range(s.start, s.stop)]
    first = unit.segments[0] if unit.segments else Segment(0, 0, 0, 0)
    order = derived_rng(seed, epoch, f"unit-{first.shard_index}-{first.start}-{unit.size}").permutation(len(flat))
    assert unit.rows(seed) == [flat[int(i)] for i in order]
    assert unit.visits(seed).shape == (unit.size, 3)
