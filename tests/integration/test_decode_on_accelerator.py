"""--decode-on accelerator: workers ship JPEG bytes and crops, the consumer decodes with NVIDIA DALI (CPU here)."""

from __future__ import annotations

import numpy as np

from stoker.accel.backends.accelerators import AccelSpec, make_accelerator
from stoker.accel.jpeg_decode import DaliJpegDecoder
from stoker.pipeline.images.augment import TrainTransform, decode_augment
from stoker.pipeline.images.batching import ShipEncoded
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.store.shards import ShardReader
from tests.helpers import consumer_for, sample_of, scrape


def test_accelerator_decode_gives_the_host_pixels_for_the_same_crops(manifest):
    """Same per-sample generator, same crop: DALI's pixels match the host's full-resolution decode."""
    transform = TrainTransform(size=96)
    reader = ShardReader(manifest.shard_uri(0))
    rows = range(min(24, len(reader)))
    work = ShipEncoded(transform)
    tensors = work.tensors([work.prepare(sample_of(reader, r), sample_random(5, 0, r)).payload for r in rows])
    ends = tensors["jpeg_end"]
    jpegs = [tensors["jpeg"][s:e] for s, e in zip(np.concatenate([[0], ends[:-1]]), ends, strict=True)]
    outputs, failed = DaliJpegDecoder(96, 32).decode(jpegs, tensors["crop"], tensors["flip"])
    assert not failed
    images = np.asarray(outputs[0].as_tensor())
    assert images.shape == (len(rows), 96, 96, 3)
    for i, r in enumerate(rows):
        host = decode_augment(bytes(reader.jpeg(r)), transform, sample_random(5, 0, r), "full").pixels
        assert np.abs(images[i].astype(int) - host).mean() < 1.0, f"row {r} differs from the host decode"
    assert tensors["flip"].any() and not tensors["flip"].all()  # both mirror paths were exercised


def test_a_jpeg_broken_past_its_header_is_dropped_counted_and_the_rest_trains(corrupt_manifest, run_job):
    """The header parses on the worker, so the bytes travel; DALI fails on them, the batch is retried
    image by image, the broken one is reported and ResNet-18 steps on the others."""
    manifest, victim = corrupt_manifest
    accel = make_accelerator(AccelSpec(kind="torch", model="resnet18", width=16), "imagenet", len(manifest.classes))
    consumer = consumer_for(manifest.uri, epochs=1, batch_size=8, image_size=64, decode_on="accelerator", accel=accel)
    summary = run_job(consumer, hosts=1).finish(timeout=240)
    assert summary.decode_on == "accelerator"
    # every sample travelled once; the broken one counts as skipped, not delivered, in every headline figure
    assert summary.samples == summary.unique_samples == summary.rows == manifest.num_samples - 1
    assert summary.skipped_samples == 1 and summary.per_epoch_unique == [manifest.num_samples - 1]
    assert [(s["key"], s["epoch"]) for s in summary.skipped] == [(victim, 0)]
    assert summary.skipped[0]["reason"].startswith("decode on the accelerator failed")
    assert len(accel.losses) == summary.batches and all(np.isfinite(accel.losses))
    assert summary.stage_seconds["decode"] == 0 and summary.stage_seconds["decode_on_accelerator"] > 0
    metrics = scrape(consumer.metrics_port)
    assert metrics["stoker_consumer_decode_errors_total"] == 1
    assert metrics["stoker_consumer_decode_seconds_count"] == summary.batches
