"""stoker/pipeline/job.py: the job in one shape, refused when made if it cannot work or cannot travel."""

from __future__ import annotations

import json

import pytest

from stoker.pipeline.images.layout import DecodeOn
from stoker.pipeline.job import JobConfig
from stoker.pipeline.text.examples import TextConfig
from stoker.protos.errors import ConfigError


def test_a_job_that_cannot_work_is_refused_when_made():
    with pytest.raises(ValueError, match="dataset must be one of imagenet, wikipedia"):
        JobConfig(manifest_uri="m", dataset="audio")
    with pytest.raises(ValueError, match="--drop-last applies to imagenet"):
        JobConfig(manifest_uri="m", dataset="wikipedia", drop_last=True)
    with pytest.raises(ValueError, match="--decode-on accelerator applies to imagenet"):
        JobConfig(manifest_uri="m", dataset="wikipedia", decode_on="accelerator")
    with pytest.raises(ValueError, match="--corrupt-jpegs applies to imagenet"):
        JobConfig(manifest_uri="m", dataset="wikipedia", corrupt_jpegs="keep")
    with pytest.raises(ValueError, match="corrupt_jpegs must be one of skip, keep, not 'ignore'"):
        JobConfig(manifest_uri="m", corrupt_jpegs="ignore")  # as a wire from a stranger could say


def test_shards_of_another_kind_are_refused_with_the_fix(manifest):
    with pytest.raises(ValueError, match="holds 'imagenet' shards, not wikipedia: run with --dataset imagenet"):
        JobConfig(manifest_uri=manifest.uri, dataset="wikipedia").check_fits(manifest)
    JobConfig(manifest_uri=manifest.uri).check_fits(manifest)


def test_a_job_that_cannot_travel_is_refused_naming_both_flags_and_the_fix():
    with pytest.raises(ValueError, match="--image-size 3400 with --batch-size 64 does not fit a data message .*"
                                         "the largest --image-size that fits --batch-size 64 is 2362"):
        JobConfig("m", image_size=3400)
    with pytest.raises(ValueError, match="--batch-size 1000000 does not fit"):
        JobConfig("m", dataset="wikipedia", batch_size=1_000_000, text=TextConfig())
    with pytest.raises(ValueError, match="the largest --image-size that fits --batch-size 64 is 2362"):
        JobConfig("m", image_size=4000, decode_on="accelerator")  # the consumer would make the same batch itself
    JobConfig("m", image_size=2362)


def test_where_jpegs_are_decoded_is_a_closed_choice_that_keeps_its_string():
    job = JobConfig("m", decode_on="accelerator")  # as the CLI and the wire give it
    assert job.decode_on is DecodeOn.ACCELERATOR and json.dumps({"decode_on": job.decode_on}) == \
        '{"decode_on": "accelerator"}'
    assert JobConfig("m").decode_on is DecodeOn.HOST
    with pytest.raises(ValueError, match="decode_on must be one of host, accelerator, not 'gpu'"):
        JobConfig("m", decode_on="gpu")


def test_making_or_receiving_a_job_imports_no_transform_and_pinning_is_the_step_that_does(tmp_path, monkeypatch):
    """A config is a value: a job naming your transform is made, copied and sent without running a
    line of your module; `pin()` imports it once, where the job is made to be served."""
    from stoker.pipeline.job_wire import job_from_proto, job_to_proto
    from stoker.protos.errors import StokerError

    imported = tmp_path / "imported"
    (tmp_path / "noisy_transform_mod.py").write_text(
        f"open({str(imported)!r}, 'a').write('x')\n"
        "from stoker.transforms import TrainTransform\n"
        "def make(size=8):\n"
        "    return TrainTransform(size)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    job = JobConfig("m", transform="noisy_transform_mod:make", transform_params='{"size": 8}')
    again = job_from_proto(job_to_proto(job))
    assert not imported.exists() and not job.pinned and again == job
    pinned = job.pin()
    assert imported.read_text() == "x" and pinned.pinned and pinned.pin() is pinned
    assert pinned.transform_version and pinned.job_id == job.job_id
    missing = JobConfig("m", transform="no_such_module_here:make")  # made: nothing imported
    with pytest.raises(ConfigError, match="no_such_module_here") as refused:
        missing.pin()
    assert isinstance(refused.value, StokerError)


def _token_set(docs: int, tokens: int):
    from stoker.pipeline.store.shards import Manifest, ShardInfo

    return Manifest("tokens", [], [ShardInfo("tokens-00000.arrow", docs, 1, "", 0)], tokens={"total": tokens})


def test_a_tokens_jobs_unit_holds_its_batches_worth_of_tokens_not_of_documents():
    """A row of 2,048 tokens holds ~20 documents of 100: a unit of 64 x 4 documents would not fill one batch of
    64 rows. The unit is the documents that fill unit-batches batches at the mean length, at least batch x
    unit-batches documents, at most an eighth of the set, and the same at every world size."""
    from stoker.pipeline.text.lm_layout import LMConfig

    def size(docs: int, tokens: int, seq: int, world: int = 1) -> int:
        job = JobConfig(manifest_uri="m", dataset="tokens", batch_size=64, world_size=world, lm=LMConfig(seq))
        return job.unit_size(_token_set(docs, tokens))

    assert size(1_000_000, 100_000_000, 2048) == round(64 * 4 * 2048 / 100)  # 5,243 documents: 4 batches
    assert size(1_000_000, 100_000_000, 2048, world=8) == size(1_000_000, 100_000_000, 2048)
    assert size(1_000_000, 1_000_000_000, 64) == 64 * 4  # long documents: batch x unit-batches, as before
    assert size(10_000, 1_000_000, 2048) == 10_000 // 8  # a small set keeps 8 units for its processes
    assert size(100, 1_000, 2048) == 64 * 4  # never under batch x unit-batches documents
    images = JobConfig(manifest_uri="m", batch_size=64)
    assert images.unit_size(_token_set(1_000_000, 100_000_000)) == 64 * 4
