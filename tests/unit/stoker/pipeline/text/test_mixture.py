"""stoker/pipeline/text/mixture.py: each epoch's documents of each source, by weight, from (seed, epoch) alone;
and the plan (pipeline.plan) that cuts them into units, ranks and resumes."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.remainder import Cut, Resumed
from stoker.pipeline.store.shards import Manifest, ShardInfo
from stoker.pipeline.text.mixture import MIXTURE, MixRule, MixSource, MixtureError, Schedule
from stoker.pipeline.text.mixture_prepare import SourceSpec, prepare_mixture
from stoker.pipeline.units import batch_bounds
from stoker.protos.errors import DataError
from tests.token_corpus import two_sources


def _manifest(sizes: list[list[int]], rule: MixRule) -> Manifest:
    """An in-memory mixture manifest: sizes[s] = the documents of each shard of source s."""
    shards, sources, first = [], [], 0
    for source, shard_sizes in zip(rule.sources, sizes, strict=True):
        start = len(shards)
        for count in shard_sizes:
            shards.append(ShardInfo(f"{source.name}/{len(shards)}.parquet", count, 1, "", first))
            first += count
        sources.append(replace(source, first_shard=start, stop_shard=len(shards)))
    return Manifest(kind="tokens", classes=[], shards=shards,
                    tokens={MIXTURE: replace(rule, sources=tuple(sources)).to_json()}, uri="mem/manifest.json")


def _docs(schedule: Schedule, runs) -> list[int]:
    return [first % schedule.total + row for _, start, stop, first in runs for row in range(start, stop)]


def _owner(schedule: Schedule) -> dict[int, str]:
    return {shard: s.name for s in schedule.rule.sources for shard in range(s.first_shard, s.stop_shard)}


mixtures = st.tuples(
    st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=3), min_size=2, max_size=3),  # shard sizes per source
    st.lists(st.integers(1, 20), min_size=3, max_size=3),  # weights
    st.integers(1, 30),  # the longest document
    st.integers(1, 7),  # unit size
    st.sampled_from(["repeat", "end"]),
    st.integers(0, 2**31),  # seed
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixtures)
def test_each_epochs_tokens_are_split_by_weight_within_one_percent(case):
    sizes, weights, longest, unit, exhausted, seed = case
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, longest + 1, size=sum(map(sum, sizes)))
    sources = tuple(MixSource(f"s{i}", float(weights[i])) for i in range(len(sizes)))
    probe = Schedule(_manifest(sizes, MixRule(sources, budget=1)), lengths, unit)
    tokens, tops = [w.tokens for w in probe.walks], [int(lengths.max())] * len(sizes)
    rule = MixRule(sources, budget=1, exhausted=exhausted)
    try:  # the smallest budget prepare accepts, as its refusal says
        rule.check_precision(tokens, tops)
    except MixtureError as refused:
        rule = replace(rule, budget=int(str(refused).rsplit("--budget ", 1)[1].split()[0]))
    try:
        rule.check_precision(tokens, tops)
    except MixtureError:  # `end` with a tiny source: refused at prepare time, so never planned
        assert exhausted == "end"
        return
    schedule = Schedule(_manifest(sizes, rule), lengths, unit)
    owner, fractions = _owner(schedule), rule.fractions()
    seen = {s.name: Counter() for s in sources}
    for epoch in range(4):
        runs = schedule.runs(seed, epoch)
        assert runs == schedule.runs(seed, epoch)  # a pure function of (seed, epoch)
        ids = [first + row for _, start, stop, first in runs for row in range(start, stop)]
        assert len(ids) == len(set(ids)) == schedule.rows(seed, epoch) and max(ids) < schedule.id_space
        got = schedule.source_tokens(runs)
        for source, weight in zip(sources, fractions, strict=True):
            assert abs(got[source.name] / sum(got.values()) - weight) <= 0.01
        for shard, start, stop, first in runs:
            docs = [first % schedule.total + row for row in range(start, stop)]
            seen[owner[shard]].update(docs)
            assert 0 < stop - start <= unit
        if exhausted == "end":  # no document twice in an epoch
            assert len(set(_docs(schedule, runs))) == len(ids)
    if exhausted == "repeat":  # a walk, pass after pass: no document of a source a pass ahead of another
        for source, walk in zip(sources, schedule.walks, strict=True):
            ids = [d for f, a, z in zip(walk.first, walk.start, walk.stop, strict=True) for d in range(f + a, f + z)]
            times = [seen[source.name][d] for d in ids]
            assert max(times) - min(times) <= 1


def _toy(exhausted: str = "repeat", pass_over: str = "", budget: int = 2000) -> Schedule:
    rule = MixRule((MixSource("big", 3.0), MixSource("small", 1.0)), budget=budget, pass_over=pass_over,
                   exhausted=exhausted)
    lengths = np.random.default_rng(0).integers(1, 9, size=130)
    return Schedule(_manifest([[50, 50], [30]], rule), lengths, 8)


def test_the_same_seed_and_epoch_give_the_same_documents_and_others_differ():
    schedule = _toy()
    assert schedule.runs(1, 0) == _toy().runs(1, 0)
    assert schedule.runs(1, 0) != schedule.runs(2, 0) and schedule.runs(1, 0) != schedule.runs(1, 1)


def test_repeat_goes_on_into_a_small_sources_next_pass_with_distinct_ids():
    schedule = _toy()  # small: 500 tokens an epoch from ~135 in a pass: 3-4 passes in each epoch
    runs = schedule.runs(5, 0)
    small = [first + row for shard, start, stop, first in runs if shard == 2 for row in range(start, stop)]
    docs = Counter(i % schedule.total for i in small)
    assert max(docs.values()) >= 3 and len(set(small)) == len(small)
    assert schedule.id_space >= schedule.total * 4


def test_end_starts_every_source_each_epoch_and_ends_when_the_first_runs_out():
    schedule = _toy("end", budget=10**6)
    for epoch in range(3):
        runs = schedule.runs(5, epoch)
        small = sorted(d for d in _docs(schedule, [r for r in runs if r[0] == 2]))
        assert small == list(range(100, 130))  # the first to run out: its every document once
        assert len(set(_docs(schedule, runs))) == len(_docs(schedule, runs))
    assert schedule.id_space == schedule.total


def test_an_epoch_of_one_pass_over_a_named_source_holds_its_every_document_once():
    schedule = _toy(pass_over="big", budget=0)
    for epoch in range(3):
        big = sorted(_docs(schedule, [r for r in schedule.runs(9, epoch) if r[0] < 2]))
        assert big == list(range(100))


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"sources": (MixSource("a", -1.0),), "budget": 10}, "must be a positive number"),
    ({"sources": (MixSource("a", 0.0),), "budget": 10}, "must be a positive number"),
    ({"sources": (MixSource("a", 1.0), MixSource("a", 2.0)), "budget": 10}, "a given more than once"),
    ({"sources": (MixSource("a", 1.0),), "pass_over": "b"}, "--pass b: not one of the sources (a)"),
    ({"sources": (MixSource("a", 1.0),), "budget": 10, "pass_over": "a"}, "either --budget TOKENS or --pass"),
    ({"sources": (MixSource("a", 1.0),)}, "either --budget TOKENS or --pass"),
    ({"sources": (MixSource("a b", 1.0),), "budget": 10}, "must be letters"),
    ({"sources": (MixSource("a", 1.0),), "budget": 10, "exhausted": "wrap"}, "must be one of repeat, end"),
])
def test_rules_that_cannot_hold_are_refused_in_one_line(kwargs, says):
    with pytest.raises(MixtureError) as caught:
        MixRule(**kwargs)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_budget_too_small_for_one_percent_is_refused_with_the_budget_that_would_do():
    rule = MixRule((MixSource("a", 1.0), MixSource("b", 1.0)), budget=1000)
    with pytest.raises(MixtureError, match="too small for source a's share") as caught:
        rule.check_precision([10**6, 10**6], [50, 50])
    need = int(str(caught.value).rsplit("--budget ", 1)[1].split()[0])
    replace(rule, budget=need).check_precision([10**6, 10**6], [50, 50])


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_a_budget_too_small_names_the_source_whose_longest_document_makes_it_so(order):
    """Source a is 90% with short documents, b 10% with a 1000-token one: b's document is what needs the large
    budget, so b is named with its document's length, whichever order the sources are given in."""
    given = [(MixSource("a", 0.9), 10), (MixSource("b", 0.1), 1000)]
    sources, longest = zip(*[given[i] for i in order], strict=True)
    rule = MixRule(tuple(sources), budget=1000)
    tokens = [10**6, 10**6]
    with pytest.raises(MixtureError, match=r"too small for source b's share .*\(its longest document has 1000 "
                                           r"tokens\): give --budget \d+ or more$") as caught:
        rule.check_precision(tokens, list(longest))
    need = int(str(caught.value).rsplit("--budget ", 1)[1].split()[0])
    replace(rule, budget=need).check_precision(tokens, list(longest))
    with pytest.raises(MixtureError, match="source b's"):
        replace(rule, budget=need - 1).check_precision(tokens, list(longest))


# ---- through the plan, on a prepared mixture -------------------------------------------------------------
@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mix")
    parts = two_sources(folder)
    result = prepare_mixture([SourceSpec("web", str(parts["web"]), 0.7), SourceSpec("books", str(parts["books"]), 0.3)],
                             folder / "mix", budget=8000)
    return Manifest.load(result.manifest.uri)


def test_the_plans_units_hold_the_epochs_documents_once_each_on_every_rank(mixed):
    plan = EpochPlan(mixed, 16, 3, 7, world_size=3)
    schedule = Schedule.of(mixed, 16)
    for epoch in range(3):
        want = sorted(first + row for _, a, b, first in schedule.runs(7, epoch) for row in range(a, b))
        got = sorted(np.concatenate([u.sample_ids() for u in plan.units(epoch)]).tolist())
        assert got == want and plan.units_in(epoch) == len(plan.units(epoch)) <= plan.units_per_epoch
        assert [plan.unit(u.unit_id) for u in plan.units(epoch)] == plan.units(epoch)
        sizes = [sum(u.size for u in plan.rank_units(epoch, r)) for r in range(3)]
        assert max(sizes) - min(sizes) <= 1 and tuple(sizes) == plan.epoch_rank_sizes(epoch)
    assert plan.total_units == sum(plan.units_in(e) for e in range(3)) == sum(map(plan.rank_total_units, range(3)))
    assert plan.sample_id_space >= mixed.num_samples


def test_a_resume_at_another_world_size_delivers_the_rest_of_the_epoch_once(mixed):
    before = EpochPlan(mixed, 16, 2, 7, world_size=2, batch_size=8)
    cut = Cut(2, 3, ((1, 1), (2, 0)))
    after = EpochPlan(mixed, 16, 2, 7, world_size=3, batch_size=8, resumed=Resumed(0, (cut,)))
    stepped = []
    for rank, (units, batches) in enumerate(cut.ranks):
        stream = before.rank_units(0, rank)
        stepped += [i for u in stream[:units] for i in u.sample_ids().tolist()]
        if batches:
            part = stream[units]
            stop = batch_bounds(part.size, 8)[batches - 1][1]
            stepped += [sid for _, _, sid in part.rows(7)[:stop]]
    rest = [i for u in after.units(0) for i in u.sample_ids().tolist()]
    whole = [i for u in before.units(0) for i in u.sample_ids().tolist()]
    assert sorted(stepped + rest) == sorted(whole)


def test_a_lengths_file_that_differs_from_the_manifest_is_refused(mixed, tmp_path):
    manifest = Manifest.load(mixed.uri)
    manifest.tokens = {**manifest.tokens, "lengths_sha256": "0" * 64}
    with pytest.raises(DataError, match="sha256 does not match"):
        Schedule.of(manifest, 16)
