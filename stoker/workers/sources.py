"""Batch sources: what a worker process makes of a leased unit, for each kind of dataset.

A source turns a unit (rows of one or more shards) into outgoing batches: the tensors, the
header fields that describe them, and how they count in the worker's metrics. A shard that
cannot be opened or fails its checks (its sha256, row count or columns are not the manifest's)
does not crash the process: its rows in the unit are reported as skipped, with the reason, as
an undecodable JPEG is, so nothing is lost silently and the dispatcher does not hand the same
broken unit out forever. So is a JPEG libjpeg says is corrupt, unless the job keeps those
(`--corrupt-jpegs keep`, pipeline.images.corrupt).
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from stoker.pipeline.cpu_clock import stage_clock
from stoker.pipeline.images.augment import CROP_DECODER_AVAILABLE
from stoker.pipeline.images.batching import OnHang, unit_batches
from stoker.pipeline.images.corrupt import job_sample_work
from stoker.pipeline.job import JobConfig
from stoker.pipeline.kinds import IMAGENET, TOKENS, WIKIPEDIA
from stoker.pipeline.store.open_shards import OpenShards
from stoker.pipeline.store.shard_cache import CacheConfig, ShardCache
from stoker.pipeline.store.shards import Manifest, ShardInfo
from stoker.pipeline.text.batching import TextUnitSource, unit_text_batches
from stoker.pipeline.text.docs import ShardError, read_doc_shard
from stoker.pipeline.text.examples import Specials
from stoker.pipeline.text.lm_layout import unit_token_batches
from stoker.pipeline.text.text_shards import TextShard, encode_unit, is_online, read_text_shard
from stoker.pipeline.text.token_cost import manifest_tokenizer
from stoker.pipeline.text.token_shards import TokenShard, lengths_of, read_token_shard
from stoker.pipeline.text.vocab import Vocab
from stoker.pipeline.transforms import ImageTransform, pinned
from stoker.pipeline.units import Unit
from stoker.protos import stoker_pb2 as pb
from stoker.protos.errors import ConfigError
from stoker.workers.metrics import WorkerMetrics

log = logging.getLogger("stoker.worker")
SHARDS_KEPT = 4  # text shards a source holds read: a plan's unit spans at most two (pipeline.plan), a resumed one more
T = TypeVar("T")


@dataclass
class Outgoing:
    header: pb.BatchHeader  # sample ids, skips, rows, stages and text stats; identity fields are the sender's
    tensors: dict[str, np.ndarray]
    observe: Callable[[WorkerMetrics], None]  # count the batch once it is sent


def unsent_part(batches: Iterator[Outgoing], stepped: int, unit_id: int) -> Iterator[Outgoing]:
    """The batches of a text unit a job of another world size had stepped `stepped` of (pipeline.remainder):
    made whole as before, the first `stepped` kept back, the rest numbered from 0 and naming the documents
    the kept-back ones held (`stepped_before`), so that the rank's books count the unit whole."""
    if not stepped:
        yield from batches
        return
    before: list[int] = []
    kept: Outgoing | None = None  # the last batch kept back, while none has been sent
    for index, made in enumerate(batches):
        if index < stepped:
            before += made.header.sample_ids
            kept = made
            continue
        kept = None
        made.header.batch_index -= stepped
        made.header.unit_batches = max(0, made.header.unit_batches - stepped)
        made.header.stepped_before.extend(before)
        yield made
    if kept is not None:  # every batch kept back: only a position past the unit's end gets here
        log.error("unit %d has no batch past the %d its checkpoint says were stepped: it is sent as stepped whole "
                  "(such a position names documents of the units after it too)", unit_id, stepped)
        header = pb.BatchHeader(batch_index=0, last_in_unit=True, unit_batches=1, stepped_before=before,
                                skipped=kept.header.skipped)
        yield Outgoing(header, {}, lambda metrics: None)


class BatchSource(Protocol):
    def batches(self, unit: Unit, skip: Mapping[int, str] | None = None, on_hang: OnHang | None = None
                ) -> Iterator[Outgoing]:
        """`skip`: sample id -> why it is skipped unread (it killed or hung the processes that transformed
        it; read at each sample). `on_hang`: told of each transform call cut short at its time limit."""
        ...


def transform_of(job: JobConfig) -> ImageTransform:
    """The job's transform as this host imports it; TransformRefused (one line) when it cannot be the
    job's: not importable here, another version, or it does not take the job's parameters."""
    return pinned(job.transform, job.factory_params(), job.transform_version).transform


def _header(sample_ids: list[int], skipped: list[tuple[int, str, str]], rows: int, last: bool,
            index: int, unit_batches: int = 0) -> pb.BatchHeader:
    header = pb.BatchHeader(batch_index=index, last_in_unit=last, sample_ids=sample_ids, rows=rows,
                            unit_batches=unit_batches)
    for sample_id, key, reason in skipped:
        header.skipped.add(sample_id=sample_id, key=key, reason=reason[:200])
    return header


class ImageSource:
    def __init__(self, manifest: Manifest, job: JobConfig, cache: CacheConfig | None = None) -> None:
        """`cache`: this host's shard cache (default: the environment's)."""
        self.manifest = manifest
        self.job = job
        self.transform = transform_of(job)
        self.decoder = job.decoder
        if self.decoder == "crop" and not CROP_DECODER_AVAILABLE:
            log.warning("the crop-window decoder was not built on this host (no libjpeg-turbo headers at "
                        "install time); decoding with pillow-simd")
        self.work = job_sample_work(self.transform, job)  # under the job's --corrupt-jpegs
        self.shards = OpenShards(manifest, ShardCache(cache or CacheConfig.from_env()))

    def batches(self, unit: Unit, skip: Mapping[int, str] | None = None, on_hang: OnHang | None = None
                ) -> Iterator[Outgoing]:
        with self.shards.holding(s.shard_index for s in unit.segments):
            for batch in unit_batches(self.shards.reader, unit, self.work, self.job.batch_size, self.job.seed, skip,
                                      on_hang):
                header = _header(batch.sample_ids, batch.skipped, len(batch.sample_ids), batch.last,
                                 batch.batch_index)
                header.stages.decode = batch.decode_s
                header.stages.augment = batch.augment_s
                header.stages.read = batch.read_s
                header.stages.read_wait = batch.read_wait_s
                tensors = {**batch.tensors, "label": batch.labels} if batch.sample_ids else {}
                events = self.shards.take_events()  # shards fetched, evicted or refused for this batch

                def observe(metrics: WorkerMetrics, batch=batch, events=events) -> None:
                    metrics.samples.inc(len(batch.sample_ids))
                    metrics.decode_errors.inc(len(batch.skipped))
                    for seconds in batch.decode_times:
                        metrics.decode_seconds.observe(seconds)
                    for seconds in batch.augment_times:
                        metrics.augment_seconds.observe(seconds)
                    for path, count in Counter(batch.decode_paths).items():
                        metrics.decodes.labels(path=path).inc(count)
                    metrics.count_shard_events(events)

                yield Outgoing(header, tensors, observe)


def kept_shard(kept: OrderedDict[int, T], index: int, read: Callable[[int], T]) -> T:
    """The shard at `index` from `kept`, read on a miss; past SHARDS_KEPT the least recently used is dropped.
    A text shard is read whole into memory: kept for ever, every shard a worker ever read would stay there,
    and a worker fed a corpus larger than its memory would die of it."""
    if index in kept:
        kept.move_to_end(index)
    else:
        kept[index] = read(index)
        while len(kept) > SHARDS_KEPT:
            kept.popitem(last=False)
    return kept[index]


class TextSource:
    def __init__(self, manifest: Manifest, job: JobConfig, cache: CacheConfig | None = None) -> None:
        """`cache` is not used: a text shard is read whole into memory and checked there (pipeline.text.docs)."""
        self.manifest = manifest
        self.job = job
        self.cfg = job.text
        if not manifest.vocab:
            raise ConfigError(f"{manifest.uri}: a wikipedia job needs a text manifest with a vocab "
                             f"(this one is {manifest.kind!r}); make one with `stoker prepare wikipedia`")
        vocab = Vocab.load(manifest.relative_uri(manifest.vocab))
        if manifest.vocab_sha256 and vocab.sha256 != manifest.vocab_sha256:
            raise ConfigError(f"{manifest.vocab}: not the vocabulary the shards were tokenized with (sha256 differs)")
        self.specials = Specials.of(vocab)
        self.shards: OrderedDict[int, TextUnitSource | str] = OrderedDict()

    def _shard(self, index: int) -> TextUnitSource | str:
        return kept_shard(self.shards, index, self._read)

    def _read(self, index: int) -> TextUnitSource | str:
        uri = self.manifest.shard_uri(index)
        try:
            shard = read_doc_shard(uri, self.manifest.shards[index], self.specials.vocab_size)
            return TextUnitSource(shard, self.cfg, self.specials, self.job.seed)
        except ShardError as exc:
            log.error("shard %s is unusable: %s", uri, exc)
            return f"unreadable shard: {exc}"

    def batches(self, unit: Unit, skip: Mapping[int, str] | None = None, on_hang: OnHang | None = None
                ) -> Iterator[Outgoing]:
        """`skip` and `on_hang` are not used: text has no user transform that could kill or hang the process."""
        for batch in unit_text_batches(self._shard, unit, self.cfg, self.job.seed, self.job.batch_size):
            header = _header(batch.doc_ids, batch.skipped, batch.rows, batch.last, batch.batch_index, batch.batches)
            header.stages.examples = batch.examples_s
            header.stages.pack = batch.pack_s
            header.text.CopyFrom(pb.TextStats(
                sequences=batch.sequences, real_tokens=batch.real_tokens, token_slots=batch.token_slots,
                unpacked_token_slots=batch.unpacked_slots, masked_tokens=batch.masked,
                random_next=batch.random_next))
            tensors = batch.tensors if batch.rows else {}

            def observe(metrics: WorkerMetrics, batch=batch) -> None:
                metrics.samples.inc(len(batch.doc_ids))
                metrics.decode_errors.inc(len(batch.skipped))
                metrics.sequences.inc(batch.sequences)
                metrics.tokens.inc(batch.real_tokens)
                metrics.token_slots.labels(packing="before").inc(batch.unpacked_slots)
                metrics.token_slots.labels(packing="after").inc(batch.token_slots)
                metrics.example_seconds.inc(batch.examples_s)
                metrics.pack_seconds.inc(batch.pack_s)

            yield Outgoing(header, tensors, observe)


class TokenSource:
    def __init__(self, manifest: Manifest, job: JobConfig, cache: CacheConfig | None = None) -> None:
        """`cache` is not used: a token shard is read whole into memory and checked there
        (pipeline.text.token_shards)."""
        self.manifest = manifest
        self.job = job
        info = manifest.tokens
        if not all(type(info.get(name)) is int for name in ("eot", "pad", "vocab_size")):
            raise ConfigError(f"{manifest.uri}: a tokens job needs a token manifest with its tokenizer's eot, pad and "
                             "vocab_size (make one with `stoker prepare tokens`)")
        self.eot, self.pad, self.vocab_size = info["eot"], info["pad"], info["vocab_size"]
        self.lengths = lengths_of(manifest)  # a unit's planned batches: exactly these go, whatever is unusable
        # an online set's text is tokenized here, per unit, by the set's own tokenizer (its fingerprint checked)
        self.tokenizer = manifest_tokenizer(manifest) if is_online(manifest) else None
        self.shards: OrderedDict[int, TokenShard | str] = OrderedDict()
        self.texts: OrderedDict[int, TextShard | str] = OrderedDict()  # an online set's shards

    def _shard(self, index: int) -> TokenShard | str:
        return kept_shard(self.shards, index, self._read)

    def _text(self, index: int) -> TextShard | str:
        return kept_shard(self.texts, index, self._read_text)

    def _read(self, index: int) -> TokenShard | str:
        return self._checked(index, lambda uri, info: read_token_shard(uri, info, self.vocab_size))

    def _read_text(self, index: int) -> TextShard | str:
        return self._checked(index, read_text_shard)

    def _checked(self, index: int, read: Callable[[str, ShardInfo], T]) -> T | str:
        """Shard `index` read with `read`, or why it cannot be used (logged; its rows are skipped)."""
        uri = self.manifest.shard_uri(index)
        try:
            return read(uri, self.manifest.shards[index])
        except ShardError as exc:
            log.error("shard %s is unusable: %s", uri, exc)
            return f"unreadable shard: {exc}"

    def batches(self, unit: Unit, skip: Mapping[int, str] | None = None, on_hang: OnHang | None = None
                ) -> Iterator[Outgoing]:
        """`skip` and `on_hang` are not used: token rows run no user transform that could kill or hang."""
        source_of, tokenize_s = self._unit_shards(unit)
        for batch in unit_token_batches(source_of, unit, self.job.lm, self.job.seed, self.job.batch_size,
                                        self.eot, self.pad, self.lengths):
            header = _header(batch.doc_ids, batch.skipped, batch.rows, batch.last, batch.batch_index, batch.batches)
            header.stages.pack = batch.pack_s
            header.stages.examples = tokenize_s if batch.batch_index == 0 else 0.0  # online: the unit's tokenizing
            header.text.CopyFrom(pb.TextStats(sequences=batch.segments, real_tokens=batch.tokens,
                                              token_slots=batch.token_slots, unpacked_token_slots=batch.unpacked_slots))
            tensors = batch.tensors if batch.rows else {}

            def observe(metrics: WorkerMetrics, batch=batch) -> None:
                metrics.samples.inc(len(batch.doc_ids))
                metrics.decode_errors.inc(len(batch.skipped))
                metrics.sequences.inc(batch.segments)
                metrics.tokens.inc(batch.tokens)
                metrics.token_slots.labels(packing="before").inc(batch.unpacked_slots)
                metrics.token_slots.labels(packing="after").inc(batch.token_slots)
                metrics.lm_rows.inc(batch.rows)
                metrics.pack_seconds.inc(batch.pack_s)

            yield Outgoing(header, tensors, observe)

    def _unit_shards(self, unit: Unit) -> tuple[Callable[[int], TokenShard | str], float]:
        """What the unit's rows are made from, and the CPU seconds tokenizing it took: token shards as read,
        or (online) the unit's documents tokenized in one call; a document whose count is not the planned
        one is skipped and named (its place kept as padding)."""
        if self.tokenizer is None:
            return self._shard, 0.0
        started = stage_clock()
        encoded = encode_unit(self._text, unit, self.job.seed, self.tokenizer, self.lengths)
        return encoded, stage_clock() - started


SOURCES: dict[str, Callable[[Manifest, JobConfig, CacheConfig | None], BatchSource]] = {
    IMAGENET.name: ImageSource, WIKIPEDIA.name: TextSource, TOKENS.name: TokenSource}  # one per pipeline.kinds entry


def make_source(manifest: Manifest, job: JobConfig, cache: CacheConfig | None = None) -> BatchSource:
    job.check_fits(manifest)
    return SOURCES[job.dataset](manifest, job, cache)
