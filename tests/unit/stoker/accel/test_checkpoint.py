"""stoker/accel/checkpoint.py: the job's data position, what a resume may change, and what it refuses."""

from __future__ import annotations

import os

import pytest

from stoker.accel import checkpoint
from stoker.accel.checkpoint import CheckpointError, Position
from stoker.accel.stepping import Stateful
from stoker.pipeline.job import JobConfig
from stoker.pipeline.remainder import Resumed
from stoker.protos.errors import ResourceError


def _job(**fields) -> JobConfig:
    return JobConfig(manifest_uri="/data/manifest.json", epochs=3, batch_size=8, **fields)


def _state(job: JobConfig, epoch: int = 1, step: int = 4, ranks=((1, 0), (0, 4), (1, 1))) -> dict:
    return checkpoint.state(job, epoch, step, [list(r) for r in ranks], 100)


def test_the_same_world_size_resumes_at_the_saved_rank_positions():
    job = _job(world_size=3)
    resumed, position = checkpoint.resume(job, _state(job))
    assert position == Position(1, 4, [(1, 0), (0, 4), (1, 1)]) and resumed.resumed_from == ""
    assert resumed.job_id == job.job_id


def test_another_world_size_continues_the_epoch_from_the_jobs_position():
    saved = _job(world_size=3)
    resumed, position = checkpoint.resume(_job(world_size=2), _state(saved))
    assert position == Position(1, 4, [(0, 0), (0, 0)])  # each new stream starts at step 4 of epoch 1
    cut = Resumed.from_json(resumed.resumed_from)
    assert cut.epoch == 1 and [(c.world_size, c.step) for c in cut.cuts] == [(3, 4)]
    assert resumed.job_id == saved.job_id
    # a rank that took the job (with the cut) from the dispatcher resumes it as it is
    again, _ = checkpoint.resume(resumed, _state(saved))
    assert again.resumed_from == resumed.resumed_from


def test_a_checkpoint_taken_in_a_resumed_epoch_carries_its_cuts_and_a_later_one_does_not():
    first, _ = checkpoint.resume(_job(world_size=2), _state(_job(world_size=3)))
    in_epoch = checkpoint.state(first, 1, 6, [[0, 2], [0, 2]], 10)
    assert len(in_epoch["cuts"]) == 1
    third, _ = checkpoint.resume(_job(world_size=4), in_epoch)  # 3 -> 2 -> 4 in one epoch
    assert [c.world_size for c in Resumed.from_json(third.resumed_from).cuts] == [3, 2]
    assert checkpoint.state(first, 2, 1, [[0, 1], [0, 1]], 10)["cuts"] == []


def test_a_text_job_continues_at_another_world_size_unless_a_ranks_place_in_its_unit_was_unsure():
    """A text checkpoint resumes at another world size (pipeline.remainder names the part-stepped units);
    one whose dispatcher could not say where a rank stood in its unit (its batch count had not come) resumes
    at its own world size only, and says so."""
    text = _job(dataset="wikipedia", world_size=3)
    job, position = checkpoint.resume(_job(dataset="wikipedia", world_size=2), _state(text))
    assert job.resumed_from and position.ranks == [(0, 0), (0, 0)]
    unsure = _state(text) | {"unsure": [2]}
    with pytest.raises(CheckpointError, match=r"rank\(s\) 2 stood was not known exactly.*resume with 3"):
        checkpoint.resume(_job(dataset="wikipedia", world_size=2), unsure)
    assert checkpoint.resume(text, unsure)[1] == Position(1, 4, [(1, 0), (0, 4), (1, 1)])
    with pytest.raises(CheckpointError, match="unsure ranks are rank indexes"):
        checkpoint.resume(text, _state(text) | {"unsure": [3]})


def test_another_job_is_refused_naming_the_fields_that_differ():
    with pytest.raises(CheckpointError, match="seed: checkpoint 0, now 5"):
        checkpoint.resume(_job(world_size=3, seed=5), _state(_job(world_size=3)))


def test_a_tokens_checkpoint_from_when_units_held_documents_is_refused_not_misread():
    """Units of a tokens job became token-sized (JobConfig.unit_size): a checkpoint written before names its
    position in units of batch x unit-batches documents, which now hold other documents. It is refused; one
    written now resumes."""
    tokens = _job(dataset="tokens", world_size=3)
    state = _state(tokens)
    assert checkpoint.resume(tokens, state)[1] == Position(1, 4, [(1, 0), (0, 4), (1, 1)])
    older = state | {"job": {k: v for k, v in state["job"].items() if k != "units"}}
    with pytest.raises(CheckpointError, match="units: the checkpoint's tokens job had units of batch x unit-batches"):
        checkpoint.resume(tokens, older)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: [s], "is a JSON object"),
    (lambda s: {k: v for k, v in s.items() if k != "job"}, "names no job"),
    (lambda s: s | {"ranks": 5}, "must be a list of"),
    (lambda s: s | {"ranks": [[-1, 0], [0, 0], [0, 0]]}, "whole numbers >= 0"),
    (lambda s: s | {"ranks": [[0, 0]]}, "1 rank positions for its world size 3"),
    (lambda s: s | {"epoch": 99}, "epoch 99 is past the job's 3 epochs"),
    (lambda s: s | {"step": "4"}, "'step' must be a whole number"),
    (lambda s: s | {"version": 1}, "version 1 is not one of"),
    (lambda s: s | {"cuts": [[3, 4]]}, "a cut is"),
])
def test_an_edited_checkpoint_is_refused_with_what_is_wrong(edit, message):
    job = _job(world_size=3)
    with pytest.raises(CheckpointError, match=message):
        checkpoint.resume(job, edit(_state(job)))


def test_a_position_past_a_ranks_stream_is_refused_once_the_plan_is_known(manifest):
    job = JobConfig(manifest_uri=manifest.uri, epochs=2, batch_size=16, world_size=2)
    plan = job.plan(manifest)
    with pytest.raises(CheckpointError, match="puts rank 1 past unit 999"):
        Position(0, 3, [(0, 3), (999, 0)]).check(plan)
    Position(0, 3, [(0, 3), (0, 3)]).check(plan)


def test_a_mixture_prepared_again_at_the_same_path_is_refused_not_resumed_into_repeats(tmp_path):
    """The same manifest path, other weights (or other shards): a checkpoint's units would name other documents,
    and a resume used to go on silently and deliver documents twice in the epoch."""
    from stoker.pipeline.store.shards import Manifest
    from stoker.pipeline.text.mixture_prepare import SourceSpec, prepare_mixture
    from tests.token_corpus import two_sources

    parts = two_sources(tmp_path, sizes=(60, 20))

    def mixed(web: float) -> Manifest:
        specs = [SourceSpec("web", str(parts["web"]), web), SourceSpec("books", str(parts["books"]), 1 - web)]
        return Manifest.load(prepare_mixture(specs, tmp_path / "mix", budget=4000).manifest.uri)

    first = mixed(0.75)
    job = JobConfig(manifest_uri=first.uri, dataset="tokens", epochs=2, batch_size=4)
    saved = checkpoint.state(job, 0, 1, [[0, 1]], 4, first.data_sha256)
    _, position = checkpoint.resume(job, saved)
    position.check(job.plan(first))  # the same set: resumed
    again = mixed(0.5)
    assert again.uri == first.uri and again.data_sha256 != first.data_sha256
    with pytest.raises(CheckpointError, match="is not the data set the job was checkpointed with"):
        position.check(job.plan(again))


def test_a_checkpoint_path_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        checkpoint.load(fifo)


class _Model(Stateful):
    def __init__(self, weights: bytes) -> None:
        self.weights = weights

    def state_dict(self) -> dict:
        return {"weights": self.weights}

    def load_state_dict(self, state: dict) -> None:
        self.weights = state["weights"]


class _Consumer:
    """What save_all asks of a consumer: its data position and its accelerator."""

    def __init__(self, state: dict, accelerator: object) -> None:
        self.state, self.accelerator = state, accelerator

    def state_dict(self, answer_timeout_s: float | None = None) -> dict:
        return self.state


def test_a_checkpoint_on_a_full_disk_names_its_file_and_keeps_the_previous_one(full_disk):
    """`stoker train --checkpoint` on a full disk said "[Errno 28] No space left on device" alone; each of its
    two files is now refused in one line naming it, and the previous checkpoint is left whole."""
    folder, fill = full_disk
    path = folder / "ck.json"
    old_state = _state(_job(), step=1)
    checkpoint.save_all(_Consumer(old_state, _Model(b"old")), path)
    fill()
    new = _Consumer(_state(_job(), step=4), _Model(b"new" * 5000))
    with pytest.raises(ResourceError) as refused:
        checkpoint.save_all(new, path, elsewhere="pass --checkpoint elsewhere")
    assert str(refused.value) == (f"cannot write model checkpoint {checkpoint.model_path(path)}: no space left on "
                                  f"device (free space there or pass --checkpoint elsewhere)")
    new.accelerator = None  # no model: the data position alone
    with pytest.raises(ResourceError, match=rf"^cannot write checkpoint {path}: no space left on device \(free space "
                                            rf"there or give another path\)$"):
        checkpoint.save_all(new, path)
    assert checkpoint.load(path) == old_state and sorted(p.name for p in folder.iterdir()) == [
        "ck.json", "ck.json.model.pt", "filler"]
    model = _Model(b"")
    assert checkpoint.load_model(model, path) and model.weights == b"old"
