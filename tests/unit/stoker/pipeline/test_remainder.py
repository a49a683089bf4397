"""stoker/pipeline/remainder.py: what a text epoch owes after changes of world size, by chains of them.

A text unit's batches are made from its documents together, so the test makes them as a worker
would in spirit: the unit's documents in its seeded order, cut into batches of 1 to 3 documents by
a generator seeded with the unit's documents alone (as packed rows depend on them), the first
`skip` left out. Positions are exact, as the dispatcher gives them for text."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.remainder import Cut, Resumed
from stoker.pipeline.store.shards import Manifest, ShardInfo
from stoker.pipeline.text.mixture_prepare import SourceSpec, prepare_mixture
from stoker.pipeline.units import Unit
from stoker.protos.errors import DataError
from tests.token_corpus import two_sources

EPOCH = 1


def made(unit: Unit, seed: int) -> list[list[int]]:
    """The documents of each batch a worker sends for `unit`: all of them made, the first `skip` not sent."""
    docs = [doc for _, _, doc in unit.rows(seed)]
    rng = random.Random(repr((unit.epoch, [(s.shard_index, s.start, s.stop, s.first_sample_id)
                                           for s in unit.segments])))
    batches, at = [], 0
    while at < len(docs):
        take = rng.randint(1, 3)
        batches.append(docs[at:at + take])
        at += take
    return batches[unit.skip:]


def stream(plan: EpochPlan, rank: int) -> list[list[int]]:
    return [batch for unit in plan.rank_units(EPOCH, rank) for batch in made(unit, plan.seed)]


def position(plan: EpochPlan, steps: int) -> tuple[tuple[int, int], ...]:
    """Where each rank stands after `steps` steps of its stream: units wholly stepped, batches of the next."""
    out = []
    for rank in range(plan.world_size):
        index, left = 0, steps
        for unit in plan.rank_units(EPOCH, rank):
            count = len(made(unit, plan.seed))
            if left < count:
                break
            left, index = left - count, index + 1
        out.append((index, left if index < len(plan.rank_units(EPOCH, rank)) else 0))
    return tuple(out)


def plain(sizes: list[int]) -> Manifest:
    first = np.cumsum([0, *sizes[:-1]])
    return Manifest(kind="tokens", classes=[], shards=[ShardInfo(f"s{i}", n, 1, "", int(f))
                                                      for i, (n, f) in enumerate(zip(sizes, first, strict=True))])


@pytest.fixture(scope="module")
def mixture(tmp_path_factory) -> Manifest:
    """A mixture of two token sources, 70/30 by tokens (prepared as `stoker prepare mixture` does)."""
    folder = tmp_path_factory.mktemp("mix")
    parts = two_sources(folder)
    result = prepare_mixture([SourceSpec("web", str(parts["web"]), 0.7), SourceSpec("books", str(parts["books"]), 0.3)],
                             folder / "mix", budget=8000)
    return Manifest.load(result.manifest.uri)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 60), min_size=1, max_size=5), mixed=st.booleans(),
       worlds=st.lists(st.integers(1, 6), min_size=2, max_size=4), unit_batches=st.integers(1, 4),
       unit_size=st.integers(1, 12), seed=st.integers(0, 2**16), data=st.data())
def test_a_text_epoch_resumed_through_a_chain_of_world_sizes_steps_every_document_once(
        mixture, sizes, mixed, worlds, unit_batches, unit_size, seed, data):
    """Checkpointed by N ranks at some step, continued by M, then by K...: the documents of the batches
    stepped before each cut and of every batch the last world size's streams send are the epoch's once,
    and no rank's stream is empty (a resume that would leave one empty is refused)."""
    manifest = mixture if mixed else plain(sizes)
    try:
        plan = EpochPlan(manifest, unit_size, 3, seed, worlds[0], 2, unit_batches=unit_batches)
    except ValueError:
        return  # too few documents for the first world size
    epoch_docs = sorted(doc for unit in plan.units(EPOCH) for doc in unit.sample_ids().tolist())
    stepped: list[int] = []
    cuts: tuple[Cut, ...] = ()
    for world in worlds[1:]:
        longest = max(len(stream(plan, r)) for r in range(plan.world_size))
        steps = data.draw(st.integers(0, longest))
        stepped += [doc for r in range(plan.world_size) for batch in stream(plan, r)[:steps] for doc in batch]
        cuts = (*cuts, Cut(plan.world_size, plan.step_offset(EPOCH) + steps, position(plan, steps)))
        try:
            plan = replace(plan, world_size=world, resumed=Resumed(EPOCH, cuts))
        except ValueError as exc:  # DataError: too little left; ConfigError: too few documents at all
            assert "left, fewer than" in str(exc) or "cannot feed" in str(exc)
            return
        units = plan.units(EPOCH)
        assert all(plan.rank_units(EPOCH, r) for r in range(world))
        assert [u.unit_id for u in units] == list(range(EPOCH * plan.units_per_epoch,
                                                        EPOCH * plan.units_per_epoch + len(units)))
        assert all(plan.unit(u.unit_id) == u for u in units) and len(units) <= plan.units_per_epoch
        assert plan.total_units == sum(plan.units_in(e) for e in range(3))
        assert all(made(u, seed) for u in units)  # a part-stepped unit still has batches to send
        event("a part-stepped unit" if any(u.skip for u in units) else "no part-stepped unit")
    rest = [doc for r in range(plan.world_size) for batch in stream(plan, r) for doc in batch]
    assert sorted(stepped + rest) == epoch_docs


def test_a_part_stepped_unit_goes_on_where_its_rank_stopped_and_the_new_streams_are_even():
    """4 ranks at 3 each one batch into its second unit, resumed by 3: every new stream starts with
    what was left of an old unit (the fourth goes to the least loaded), and the untouched documents
    even the streams out."""
    plan = EpochPlan(plain([400]), 10, 2, 3, 4, 2, unit_batches=4)
    cut = Cut(4, 5, tuple((1, 1) for _ in range(4)))
    after = replace(plan, world_size=3, resumed=Resumed(EPOCH, (cut,)))
    tails = [u for u in after.units(EPOCH) if u.skip]
    assert [u.skip for u in tails] == [1] * 4
    assert {u.segments for u in tails} == {plan.rank_units(EPOCH, r)[1].segments for r in range(4)}
    assert {u.rank for u in tails} == {0, 1, 2} and all(u.position < 2 for u in tails)
    sizes = [sum(u.size for u in after.rank_units(EPOCH, r)) for r in range(3)]
    assert max(sizes) - min(sizes) <= 10  # within one unit of documents


def test_a_unit_part_stepped_twice_adds_up_its_skips():
    plan = EpochPlan(plain([200]), 10, 2, 3, 2, 2, unit_batches=4)
    first = Cut(2, 1, ((0, 1), (0, 1)))
    middle = replace(plan, world_size=2, resumed=Resumed(EPOCH, (first,)))
    second = Cut(2, 2, ((0, 1), (0, 1)))
    after = replace(plan, world_size=1, resumed=Resumed(EPOCH, (first, second)))
    assert [u.skip for u in middle.units(EPOCH) if u.skip] == [1, 1]
    assert [u.skip for u in after.units(EPOCH) if u.skip] == [2, 2]


def test_too_little_left_for_the_new_world_size_is_refused_with_what_to_do():
    plan = EpochPlan(plain([8]), 4, 1, 0, 2, 2, unit_batches=2)
    cut = Cut(2, 2, ((1, 0), (1, 0)))  # both ranks past their only unit
    with pytest.raises(DataError, match="fewer than the 3 ranks.*resume with fewer ranks"):
        replace(plan, world_size=3, resumed=Resumed(0, (cut,)))
