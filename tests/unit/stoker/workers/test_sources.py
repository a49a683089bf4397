"""stoker/workers/sources.py: what a worker process makes of a leased unit, checked against the consumer's schema."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from stoker.accel.schema import schema_of
from stoker.pipeline.images.augment import DECODE_PATHS
from stoker.pipeline.job import JobConfig
from stoker.pipeline.store.shard_cache import CacheConfig
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.examples import TextConfig
from stoker.pipeline.units import Segment, Unit
from stoker.protos import stoker_pb2 as pb
from stoker.workers.metrics import WorkerMetrics
from stoker.workers.sources import ImageSource, Outgoing, make_source, unsent_part


def _whole_first_shard(manifest: Manifest) -> Unit:
    info = manifest.shards[0]
    return Unit(0, 0, (Segment(0, 0, min(40, info.num_samples), info.first_sample_id),))


def _parts(tensors: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
    return {name: [array] for name, array in tensors.items()}


@pytest.fixture
def metrics() -> WorkerMetrics:
    return WorkerMetrics(CollectorRegistry())


@pytest.mark.parametrize("decode_on", ["host", "accelerator"])
def test_image_batches_fit_the_schema_and_count_every_sample(manifest, decode_on, metrics):
    job = JobConfig(manifest_uri=manifest.uri, batch_size=16, image_size=64, decode_on=decode_on)
    unit = _whole_first_shard(manifest)
    batches = list(make_source(manifest, job).batches(unit))
    assert [b.header.batch_index for b in batches] == list(range(len(batches)))
    assert batches[-1].header.last_in_unit and not any(b.header.last_in_unit for b in batches[:-1])
    ids = [i for b in batches for i in b.header.sample_ids]
    first = unit.segments[0].first_sample_id
    assert sorted(ids) == list(range(first, first + unit.size))  # every sample once (shuffled within the unit)
    for batch in batches:
        schema_of(job).check(batch.header, _parts(batch.tensors))  # raises FrameError if it would be dropped
    before = metrics.samples._value.get()
    for batch in batches:
        batch.observe(metrics)
    assert metrics.samples._value.get() - before == unit.size
    decodes = {path: metrics.decodes.labels(path=path)._value.get() for path in DECODE_PATHS}
    if decode_on == "host":  # the test set's shards carry the restart index: most crops splice
        assert sum(decodes.values()) == unit.size and decodes["spliced"] > unit.size / 2
        assert decodes["rejected"] == 0
    else:
        assert sum(decodes.values()) == 0


def test_text_batches_fit_the_schema(wiki_manifest):
    job = JobConfig(manifest_uri=wiki_manifest.uri, dataset="wikipedia", batch_size=16,
                    text=TextConfig(seq_len=128, pack=True))
    batches = list(make_source(wiki_manifest, job).batches(_whole_first_shard(wiki_manifest)))
    assert sum(b.header.text.sequences for b in batches) > 0
    for batch in batches:
        schema_of(job).check(batch.header, _parts(batch.tensors))


def test_a_shard_that_cannot_be_read_is_reported_skipped_not_fatal(manifest, tmp_path):
    info = manifest.shards[0]
    broken = Manifest(kind=manifest.kind, classes=manifest.classes, shards=[info])
    broken.save(tmp_path / "manifest.json")  # the shard file is not beside this manifest
    broken = Manifest.load(tmp_path / "manifest.json")
    job = JobConfig(manifest_uri=broken.uri, batch_size=16, image_size=64)
    batches = list(ImageSource(broken, job).batches(_whole_first_shard(broken)))
    skipped = [s for b in batches for s in b.header.skipped]
    assert len(skipped) == min(40, info.num_samples) and "unreadable shard" in skipped[0].reason
    assert all(not b.tensors for b in batches)


def test_a_worker_refuses_shards_of_another_kind(wiki_manifest):
    with pytest.raises(ValueError, match="holds 'wikipedia' shards, not imagenet"):
        make_source(wiki_manifest, JobConfig(manifest_uri=wiki_manifest.uri))


def test_a_shard_unlike_its_manifest_is_skipped_unit_after_unit_and_counted_once(sixteen, tmp_path, metrics):
    import shutil

    from tests.shard_edits import JOB

    folder = tmp_path / "shards"
    shutil.copytree(Path(sixteen.uri).parent, folder)
    manifest = Manifest.load(folder / "manifest.json")
    manifest.shards[2].num_samples -= 1  # a manifest that says the shard is one row short of what it holds
    job = JobConfig(manifest_uri=manifest.uri, **JOB)
    source = ImageSource(manifest, job, CacheConfig(tmp_path / "cache"))
    info = manifest.shards[2]
    halves = [Unit(i, 0, (Segment(2, start, start + 5, info.first_sample_id),)) for i, start in enumerate((0, 5))]
    for unit in halves:
        batches = list(source.batches(unit))
        reasons = {s.reason for b in batches for s in b.header.skipped}
        assert reasons == {f"shard {info.path}: 16 rows, the manifest says 15"} and not any(b.tensors for b in batches)
        for batch in batches:
            batch.observe(metrics)
    assert metrics.decode_errors._value.get() == 10
    assert metrics.shards_refused.labels(reason="rows")._value.get() == 1


@pytest.mark.parametrize("corrupt_jpegs", ["skip", "keep"])
def test_a_broken_scan_is_skipped_counted_and_named_in_the_batch_header_unless_the_job_keeps_it(
        broken_scans, metrics, corrupt_jpegs):
    """JPEGs with a valid header and a garbled or cut scan: libjpeg's words in the header, counted as
    decode errors; with --corrupt-jpegs keep the garbled ones are delivered, as before."""
    manifest, broken = broken_scans
    job = JobConfig(manifest_uri=manifest.uri, batch_size=16, image_size=64, corrupt_jpegs=corrupt_jpegs)
    batches = list(make_source(manifest, job).batches(Unit(0, 0, (Segment(0, 0, manifest.num_samples, 0),))))
    skipped = {s.key: s.reason for b in batches for s in b.header.skipped}
    before = metrics.decode_errors._value.get()
    for batch in batches:
        batch.observe(metrics)
    assert metrics.decode_errors._value.get() - before == len(skipped)
    if corrupt_jpegs == "skip":
        assert set(skipped) == set(broken)
        assert all("libjpeg warned 'Corrupt JPEG data: " in skipped[key] for key, how in broken.items()
                   if how == "garbled")
        assert all(reason.endswith("'Premature end of JPEG file'") for key, reason in skipped.items()
                   if broken[key] != "garbled")
    else:
        assert set(skipped) <= {key for key, how in broken.items() if how != "garbled"}  # cut short: as before


def test_token_batches_fit_the_schema_and_a_changed_shard_is_skipped_document_by_document(tmp_path, metrics):
    from stoker.pipeline.text.lm_layout import LMConfig
    from tests.token_corpus import prepared

    result, _, _ = prepared(tmp_path / "t", count=30, docs_per_shard=10)
    manifest = result.manifest
    job = JobConfig(manifest_uri=manifest.uri, dataset="tokens", batch_size=4, lm=LMConfig(32))
    victim = Path(manifest.shard_uri(1))
    victim.write_bytes(victim.read_bytes()[:-8] + b"\0" * 8)
    source = make_source(manifest, job)
    unit = Unit(0, 0, (Segment(0, 0, 10, 0), Segment(1, 0, 10, 10)))
    batches = list(source.batches(unit))
    for out in batches:
        if out.tensors:
            schema_of(job).check(out.header, _parts(out.tensors))  # raises FrameError if it would be dropped
        out.observe(metrics)
    listed = [d for out in batches for d in out.header.sample_ids]
    skipped = [s for out in batches for s in out.header.skipped]
    assert sorted(listed) == list(range(10)) and sorted(s.sample_id for s in skipped) == list(range(10, 20))
    assert all("sha256" in s.reason for s in skipped)
    assert metrics.lm_rows._value.get() == sum(out.header.rows for out in batches) > 0


def test_a_token_source_holds_at_most_shards_kept_however_many_it_reads(tmp_path):
    """Memory stays bounded over a corpus of many shards: the source keeps the last SHARDS_KEPT read, and a
    shard it dropped is read again, and gives the same batches, when a later unit needs it."""
    from stoker.pipeline.text.lm_layout import LMConfig
    from stoker.workers.sources import SHARDS_KEPT
    from tests.token_corpus import prepared

    result, _, _ = prepared(tmp_path / "t", count=80, docs_per_shard=10)
    manifest = result.manifest
    assert len(manifest.shards) > SHARDS_KEPT + 1
    job = JobConfig(manifest_uri=manifest.uri, dataset="tokens", batch_size=4, lm=LMConfig(32))
    source = make_source(manifest, job)

    def ids(shard: int) -> list[int]:
        unit = Unit(shard, 0, (Segment(shard, 0, 10, 10 * shard),))
        return [d for out in source.batches(unit) for d in out.header.sample_ids]

    first = ids(0)
    for shard in range(len(manifest.shards)):
        assert sorted(ids(shard)) == list(range(10 * shard, 10 * shard + 10))
        assert len(source.shards) <= SHARDS_KEPT
    assert 0 not in source.shards and ids(0) == first  # dropped, read again, the same


def _online_pair(folder: Path, count: int = 60) -> tuple[Manifest, Manifest]:
    """The same corpus as a token set and as an online set (text the workers tokenize), 20 per shard."""
    from stoker.pipeline.text.token_prepare import TokenPrepareConfig, prepare_tokens
    from tests.token_corpus import jsonl, texts, tokenizer_json

    folder.mkdir(parents=True, exist_ok=True)
    corpus = texts(count)
    tok, src = tokenizer_json(folder / "tok.json", corpus), jsonl(folder / "c.jsonl", corpus)
    return tuple(prepare_tokens(src, folder / name, str(tok), TokenPrepareConfig(docs_per_shard=20, progress=False,
                                                                                  online=online)).manifest
                 for name, online in (("tokens", False), ("online", True)))  # type: ignore[return-value]


@pytest.mark.parametrize("mode", ["packed", "concat"])
def test_an_online_sets_batches_are_the_token_sets_tensor_for_tensor(tmp_path, mode, metrics):
    """Every unit of a 2-epoch plan: the same sample ids, skips and tensors' bytes; the tokenizing's CPU time is
    the first batch's `examples` stage."""
    from stoker.pipeline.text.lm_layout import LMConfig

    tokens, online = _online_pair(tmp_path)
    jobs = [JobConfig(manifest_uri=m.uri, dataset="tokens", batch_size=4, epochs=2, unit_batches=2, seed=7,
                      lm=LMConfig(32, mode)) for m in (tokens, online)]
    sources = [make_source(m, job) for m, job in zip((tokens, online), jobs, strict=True)]
    plan = jobs[0].plan(tokens)
    for unit in (u for epoch in range(2) for u in plan.units(epoch)):
        made = [list(source.batches(unit)) for source in sources]
        assert len(made[0]) == len(made[1]) > 0
        for a, b in zip(*made, strict=True):
            assert list(a.header.sample_ids) == list(b.header.sample_ids) and a.header.rows == b.header.rows
            assert a.tensors.keys() == b.tensors.keys()
            assert all(np.array_equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
            if b.tensors:
                schema_of(jobs[1]).check(b.header, _parts(b.tensors))
            b.observe(metrics)
        assert made[0][0].header.stages.examples == 0 and made[1][0].header.stages.examples > 0


def test_an_online_document_of_another_count_is_skipped_named_and_its_place_kept(tmp_path):
    """As if the workers' tokenizers version cut a document otherwise than prepare did: that document is
    skipped and named in the unit's last batch, every other document comes, and the unit gives exactly its
    planned batches (packed: its place kept as padding)."""
    import hashlib

    from stoker.pipeline.text.lm_layout import LMConfig, planned_batches, unit_lengths
    from stoker.pipeline.text.token_shards import LENGTHS_FILE, lengths_of

    _, online = _online_pair(tmp_path)
    lengths = lengths_of(online)
    victim = int(np.argmax(lengths))
    lengths[victim] -= 1
    data = (tmp_path / "online" / LENGTHS_FILE)
    np.save(data, lengths.astype(np.int32), allow_pickle=False)
    online.tokens["lengths_sha256"] = hashlib.sha256(data.read_bytes()).hexdigest()
    job = JobConfig(manifest_uri=online.uri, dataset="tokens", batch_size=4, lm=LMConfig(32))
    unit = Unit(0, 0, (Segment(0, 0, 20, 0),))
    batches = list(make_source(online, job).batches(unit))
    assert len(batches) == planned_batches(unit_lengths(unit, job.seed, lengths), job.lm, job.batch_size)
    listed = sorted(d for out in batches for d in out.header.sample_ids)
    assert listed == [d for d in range(20) if d != victim]
    [skip] = [s for out in batches for s in out.header.skipped]
    assert skip.sample_id == victim and "tokenized to" in skip.reason and "another tokenizers version" in skip.reason


def test_an_online_set_whose_tokenizer_was_replaced_is_refused_in_one_line(tmp_path):
    from stoker.pipeline.text.lm_layout import LMConfig
    from stoker.pipeline.text.tokenizer import TokenizerError
    from tests.token_corpus import texts, tokenizer_json

    _, online = _online_pair(tmp_path)
    tokenizer_json(tmp_path / "online" / "tokenizer.json", texts(30, seed=9))  # another tokenizer, same place
    job = JobConfig(manifest_uri=online.uri, dataset="tokens", batch_size=4, lm=LMConfig(32))
    with pytest.raises(TokenizerError, match="the job was pinned to sha256:") as err:
        make_source(online, job)
    assert "\n" not in str(err.value)


def _made(docs: list[list[int]]) -> list[Outgoing]:
    return [Outgoing(pb.BatchHeader(batch_index=i, last_in_unit=i == len(docs) - 1, sample_ids=ids, rows=len(ids),
                                    unit_batches=len(docs)), {}, lambda metrics: None) for i, ids in enumerate(docs)]


def test_a_unit_part_stepped_sends_its_later_batches_numbered_from_0_naming_what_was_stepped():
    sent = [o.header for o in unsent_part(iter(_made([[1, 2], [3], [4, 5], [6]])), 2, unit_id=7)]
    assert [(h.batch_index, h.last_in_unit, h.unit_batches, list(h.sample_ids)) for h in sent] == \
        [(0, False, 2, [4, 5]), (1, True, 2, [6])]
    assert all(list(h.stepped_before) == [1, 2, 3] for h in sent)
    assert [o.header for o in unsent_part(iter(_made([[1], [2]])), 0, unit_id=7)][0].stepped_before == []


def test_a_unit_whose_every_batch_was_stepped_sends_one_empty_last_batch_and_says_so(caplog):
    sent = [o.header for o in unsent_part(iter(_made([[1, 2], [3]])), 2, unit_id=7)]
    assert len(sent) == 1 and sent[0].last_in_unit and sent[0].rows == 0 and list(sent[0].stepped_before) == [1, 2, 3]
    assert "unit 7 has no batch past the 2" in caplog.text
