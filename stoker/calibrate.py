"""`stoker calibrate`: what one host core supplies, measured here in under a minute.

One process pinned to one core runs the worker's own batch making, without sockets: images
decoded and augmented for ResNet-50 at 224 px, and BERT examples at length 512 (one
sequence per row, as the profiles' BERT rates count them). `stoker plan` turns these
per-core rates into cores, hosts, time-to-train and cost.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from pipeline.augment import TrainTransform
from pipeline.batching import DecodeOnHost, unit_batches
from pipeline.plan import EpochPlan
from pipeline.shards import Manifest, ShardReader
from pipeline.text.batching import TextUnitSource, unit_text_batches
from pipeline.text.docs import read_doc_shard
from pipeline.text.examples import Specials, TextConfig
from pipeline.text.vocab import Vocab

BATCH = 64


def _timed(batches, seconds: float, count) -> float:
    """Rate of `count(batch)` over `seconds` of batches (the first batch is warm-up)."""
    started, made = None, 0
    for batch in batches:
        if started is None:
            started = time.perf_counter()
            continue
        made += count(batch)
        if time.perf_counter() - started >= seconds:
            break
    if not made:
        raise ValueError("the data set is too small to calibrate on (fewer than two batches)")
    return made / (time.perf_counter() - started)


def _epochs(manifest: Manifest, unit_size: int):
    """Units of as many epochs as the time box needs."""
    epoch = 0
    while True:
        yield from EpochPlan(manifest, unit_size, epoch + 1, 0).units(epoch)
        epoch += 1


def imagenet_rate(manifest: Manifest, seconds: float) -> float:
    readers: dict[int, ShardReader] = {}
    work = DecodeOnHost(TrainTransform(size=224))

    def reader_of(shard: int) -> ShardReader:
        if shard not in readers:
            readers[shard] = manifest.open_shard(shard)
        return readers[shard]

    def batches():
        for unit in _epochs(manifest, BATCH * 4):
            yield from unit_batches(reader_of, unit, work, BATCH, 0)

    return _timed(batches(), seconds, lambda b: len(b.sample_ids))


def wikipedia_rate(manifest: Manifest, seconds: float, seq_len: int = 512) -> float:
    vocab = Vocab.load(manifest.relative_uri(manifest.vocab))
    specials = Specials.of(vocab)
    cfg = TextConfig(seq_len=seq_len)
    sources = [TextUnitSource(read_doc_shard(manifest.shard_uri(i), manifest.shards[i], vocab.size), cfg,
                              specials, 0) for i in range(len(manifest.shards))]

    def batches():
        for unit in _epochs(manifest, 256):
            yield from unit_text_batches(sources.__getitem__, unit, cfg, 0, BATCH)

    return _timed(batches(), seconds, lambda b: b.sequences)


def calibrate(imagenet: str, wikipedia: str, seconds: float = 15.0, out: Path | None = None) -> dict:
    """Per-core rates for both datasets on one pinned core; written to `out` as JSON."""
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        result = {
            "imagenet": {"per_core_rate": imagenet_rate(Manifest.load(imagenet), seconds), "unit": "images/s",
                         "what": "decode + random resized crop + flip to 224 px, one core"},
            "wikipedia": {"per_core_rate": wikipedia_rate(Manifest.load(wikipedia), seconds), "unit": "sequences/s",
                          "what": "BERT examples at length 512, one sequence per row, one core"},
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "when": time.strftime("%Y-%m-%d %H:%M"),
            "seconds_each": seconds,
        }
    finally:
        os.sched_setaffinity(0, before)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
    return result
