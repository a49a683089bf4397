"""Issue 49, item 4: the step records a job's ranks keep, and the audit of them. The records here are made from
the real plan of a real data set (the image set of the suite, a two-source token mixture), then altered the ways
a broken loader or a crash would: a step taken twice, a step lost, a record torn, a sample skipped."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from stoker import StepRecorder
from stoker.accel.step_record import JOB_FILE, audit
from stoker.cli import main
from stoker.pipeline.job import JobConfig
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.lm_layout import LMConfig
from stoker.pipeline.text.mixture_prepare import SourceSpec, prepare_mixture
from stoker.protos import stoker_pb2 as pb
from stoker.protos.errors import ConfigError, DataError
from tests.token_corpus import two_sources


def _batch(epoch: int, step: int, ids, skipped=()) -> SimpleNamespace:
    header = pb.BatchHeader(skipped=[pb.SkippedSample(sample_id=i, reason="corrupt") for i in skipped])
    return SimpleNamespace(epoch=epoch, step=step, sample_ids=np.asarray(ids, np.int64),
                           received=SimpleNamespace(header=header))


def _record_plan(folder, job: JobConfig, epochs: int, batch: int = 16) -> None:
    """Each rank records its units' samples of each epoch, `batch` at a time, as a loader's steps give them."""
    plan = job.plan(Manifest.load(job.manifest_uri))
    for rank in range(job.world_size):
        with StepRecorder(folder, job, rank) as recorder:
            for epoch in range(epochs):
                ids = np.concatenate([u.sample_ids() for u in plan.rank_units(epoch, rank)])
                for step, at in enumerate(range(0, ids.size, batch)):
                    recorder.stepped(_batch(epoch, step, ids[at: at + batch]))


@pytest.fixture
def image_job(manifest) -> JobConfig:
    return JobConfig(manifest_uri=manifest.uri, epochs=2, batch_size=16, world_size=2).pin()


def test_every_sample_once_is_said_epoch_by_epoch(image_job, tmp_path, manifest):
    _record_plan(tmp_path, image_job, epochs=2)
    result = audit(tmp_path)
    assert result.exactly_once and [e.epoch for e in result.epochs] == [0, 1]
    assert all((e.planned, e.delivered, e.duplicated, e.missing) == (manifest.num_samples, manifest.num_samples, 0, 0)
               for e in result.epochs)


def test_a_step_taken_twice_and_a_step_lost_are_counted_in_their_epochs(image_job, tmp_path):
    _record_plan(tmp_path, image_job, epochs=2)
    path = tmp_path / "steps-rank-1.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    epoch1 = [i for i, line in enumerate(lines) if json.loads(line)["epoch"] == 1]
    lost, twice = lines[epoch1[0]], lines[epoch1[-1]]
    path.write_text("".join(line for line in lines if line is not lost) + twice)
    first, second = audit(tmp_path).epochs
    assert first.exactly_once
    assert (second.missing, second.duplicated) == (len(json.loads(lost)["ids"]), len(json.loads(twice)["ids"]))
    assert not second.exactly_once and "NOT exactly once" in second.line()


def test_a_skipped_sample_is_not_missing_and_a_torn_line_is_not_counted(image_job, tmp_path):
    plan = image_job.plan(Manifest.load(image_job.manifest_uri))
    ids = np.concatenate([u.sample_ids() for u in plan.units(0)])
    with StepRecorder(tmp_path, image_job, 0) as recorder:
        recorder.stepped(_batch(0, 0, ids[1:], skipped=[ids[0]]))
    with open(tmp_path / "steps-rank-1.jsonl", "w") as torn:
        torn.write('{"epoch": 0, "step": 0, "ids": [1, 2')  # a rank killed while writing its record
    result = audit(tmp_path)
    (epoch,) = result.epochs
    assert (epoch.skipped, epoch.missing, epoch.delivered, result.torn) == (1, 0, ids.size - 1, 1)
    assert result.exactly_once


def test_an_id_outside_the_epochs_plan_is_counted(tmp_path, image_job):
    with StepRecorder(tmp_path, image_job, 0) as recorder:
        recorder.stepped(_batch(0, 0, [0, 10**9]))
    (epoch,) = audit(tmp_path).epochs
    assert epoch.unplanned == 1 and not epoch.exactly_once


def test_a_token_mixtures_documents_are_audited_in_the_mixtures_epochs(tmp_path):
    parts = two_sources(tmp_path, sizes=(60, 20))
    specs = [SourceSpec("web", str(parts["web"]), 0.75), SourceSpec("books", str(parts["books"]), 0.25)]
    mixed = prepare_mixture(specs, tmp_path / "mix", budget=4000).manifest
    job = JobConfig(manifest_uri=mixed.uri, dataset="tokens", epochs=2, batch_size=4, lm=LMConfig(seq_len=16)).pin()
    _record_plan(tmp_path / "records", job, epochs=2, batch=3)
    result = audit(tmp_path / "records")
    plan = job.plan(Manifest.load(mixed.uri))
    assert result.exactly_once
    assert [e.planned for e in result.epochs] == [sum(u.size for u in plan.units(e)) for e in (0, 1)]


def test_a_folder_of_another_job_is_refused_and_a_new_world_size_is_the_same_job(image_job, tmp_path):
    StepRecorder(tmp_path, image_job, 0).close()
    from dataclasses import replace

    StepRecorder(tmp_path, replace(image_job, world_size=3), 2).close()  # elastic: the same job
    with pytest.raises(ConfigError, match="another job"):
        StepRecorder(tmp_path, replace(image_job, seed=image_job.seed + 1), 0)


def test_the_command_exits_0_when_exactly_once_1_when_not_and_2_with_nothing_to_read(image_job, tmp_path, capsys):
    with pytest.raises(DataError, match="no job.json"):
        audit(tmp_path)
    assert main(["audit", str(tmp_path)]) == 2
    _record_plan(tmp_path, image_job, epochs=1)
    assert main(["audit", str(tmp_path)]) == 0
    assert "epoch 0: exactly once" in capsys.readouterr().out
    with open(tmp_path / "steps-rank-0.jsonl") as records:
        again = records.readline()
    with open(tmp_path / "steps-rank-0.jsonl", "a") as records:
        records.write(again)
    assert main(["audit", str(tmp_path), "--json", str(tmp_path / "audit.json")]) == 1
    written = json.loads((tmp_path / "audit.json").read_text())
    assert written["exactly_once"] is False and written["epochs"][0]["duplicated"] == len(json.loads(again)["ids"])
    assert (tmp_path / JOB_FILE).exists()
