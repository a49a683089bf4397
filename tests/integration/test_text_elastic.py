"""Issue 49, item 1: a text job resumed at another world size, and again at a third in the same epoch, with
torchrun DDP ranks in lockstep (gloo, an all-reduce each step; tests/ddp_script.py) fed by worker daemons, at
the default timeouts. A token set of one source and a two-source mixture, and a BERT (wikipedia) set: the
documents of the steps taken before each checkpoint and after the last resume are the epoch's planned
documents once; every rank of a run takes the same steps; the next epoch is whole at the last world size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stoker.pipeline.job import JobConfig
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.examples import TextConfig
from stoker.pipeline.text.lm_layout import LMConfig
from stoker.pipeline.text.mixture_prepare import SourceSpec, prepare_mixture
from tests.integration.test_data_parallel import _before, _job
from tests.integration.test_text_lockstep import wiki_set  # noqa: F401 (a fixture)
from tests.token_corpus import prepared, two_sources

LM = ("--lm-seq-len", "64", "--batch-size", "4", "--epochs", "2")
BERT = ("--bert-seq-len", "64", "--batch-size", "4", "--epochs", "2")


@pytest.fixture(scope="module", params=["packed", "mixture"])
def token_set(request, tmp_path_factory) -> Manifest:
    """300 documents of one source, or 3:1 of two sources by a budget: some 20 steps an epoch at 3 ranks."""
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "packed":
        return prepared(folder, count=300, docs_per_shard=100)[0].manifest
    parts = two_sources(folder, sizes=(240, 60))
    specs = [SourceSpec("web", str(parts["web"]), 0.75), SourceSpec("books", str(parts["books"]), 0.25)]
    return Manifest.load(prepare_mixture(specs, folder / "mix", budget=20000).manifest.uri)


def _planned(manifest: Manifest, job: JobConfig) -> list[list[int]]:
    plan = job.plan(manifest)
    return [sorted(int(i) for unit in plan.units(epoch) for i in unit.sample_ids()) for epoch in range(job.epochs)]


def _chain(manifest: Manifest, tmp_path: Path, log_dir: Path, flags: tuple[str, ...], worlds: tuple[int, ...],
           stops: tuple[int, ...]) -> tuple[list[dict], dict[int, dict]]:
    """Run at worlds[0] until stops[0] steps, resume at worlds[1] for stops[1] steps, ..., then to the end at
    the last world size. Returns the steps every run took before its checkpoint, and the last run's records."""
    stepped: list[dict] = []
    state: dict | None = None
    for number, world in enumerate(worlds):
        out = tmp_path / f"run-{number}-at-{world}"
        out.mkdir()
        extra = ["--resume"] if state is not None else []
        if state is not None:
            (out / "state.json").write_text(json.dumps(state))
        if number < len(stops):
            extra += ["--stop-after", str(stops[number])]
        records = _job(manifest, out, log_dir, *flags, *extra, ranks=world, hosts=2, procs=1)
        assert len({len(records[r]["steps"]) for r in records}) == 1, f"run {number}: unequal steps"
        if number == len(stops):
            return stepped, records
        state = json.loads((out / "state.json").read_text())
        assert len(state["ranks"]) == world and not state.get("unsure"), state
        stepped += [s for r in records for s in _before(records[r]["steps"], state)]
    raise AssertionError("unreachable: the last world size runs to the end")


def _check(planned: list[list[int]], stepped: list[dict], last: dict[int, dict]) -> None:
    whole = stepped + [s for r in last for s in last[r]["steps"]]
    for epoch, want in enumerate(planned):
        got = sorted(i for s in whole if s["epoch"] == epoch for i in s["ids"])
        assert got == want, f"epoch {epoch}: {len(got)} stepped, {len(set(got))} distinct, {len(want)} planned"


def test_a_token_job_checkpointed_at_3_ranks_goes_on_at_2_then_at_4_with_every_document_once(
        token_set, tmp_path, log_dir):
    """3 ranks stop mid-epoch (mid-unit: some rank stands inside a unit), 2 ranks go on from there and stop
    again mid-unit, 4 ranks finish: epoch 1 (cut twice) and epoch 2 (at 4) hold every planned document once."""
    job = JobConfig(manifest_uri=token_set.uri, dataset="tokens", epochs=2, batch_size=4, lm=LMConfig(64))
    stepped, last = _chain(token_set, tmp_path, log_dir, LM, (3, 2, 4), (5, 4))
    assert any(s["epoch"] == 0 for s in stepped)
    _check(_planned(token_set, job), stepped, last)


def test_a_bert_job_checkpointed_at_2_ranks_goes_on_at_3_with_every_document_once(wiki_set, tmp_path,  # noqa: F811
                                                                                     log_dir):
    job = JobConfig(manifest_uri=wiki_set.uri, dataset="wikipedia", epochs=2, batch_size=4, text=TextConfig(64))
    stepped, last = _chain(wiki_set, tmp_path, log_dir, BERT, (2, 3), (7,))
    _check(_planned(wiki_set, job), stepped, last)
