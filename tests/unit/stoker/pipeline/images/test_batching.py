"""stoker/pipeline/images/batching.py: the job's transform run on every sample of a unit, and its batches."""

from __future__ import annotations

import random
from types import MappingProxyType

import numpy as np
import pytest

from stoker.pipeline.images.augment import TrainTransform, decode_augment
from stoker.pipeline.images.batching import HostTransform, unit_batches
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.store.shards import Manifest, ShardReader
from stoker.pipeline.transforms import Output, Sample, TransformOutputError


def _readers(manifest: Manifest):
    readers: dict[int, ShardReader] = {}

    def reader_of(shard: int) -> ShardReader:
        if shard not in readers:
            readers[shard] = manifest.open_shard(shard)
        return readers[shard]

    return reader_of


class _Returns:
    """A crop-first transform that returns what it is given to return (or raises it)."""

    takes, crop_size = "crop", 32

    def __init__(self, made) -> None:
        self.made, self.outputs, self._crop = made, {"image": Output("uint8", (32, 32, 3))}, TrainTransform(size=32)

    def crop(self, width: int, height: int, rng: random.Random):
        return self._crop.crop(width, height, rng)

    def __call__(self, sample: Sample, rng: random.Random, pixels: np.ndarray):
        if isinstance(self.made, Exception):
            raise self.made
        return self.made(pixels)


def test_every_row_of_a_batch_is_its_sample_and_a_short_batch_holds_only_those_made(corrupt_manifest):
    """Each sample is written into its batch as it is made: row i is sample_ids[i]'s image, and the
    batch with the truncated JPEG is a row short, its arrays cut to the rows made."""
    manifest, victim = corrupt_manifest
    reader_of, seen_victim = _readers(manifest), False
    for unit in EpochPlan(manifest, 48, 1, 0).units(0):
        keys = {sample_id: (shard, row) for shard, row, sample_id in unit.rows(0)}
        for batch in unit_batches(reader_of, unit, HostTransform(TrainTransform(size=64)), 16, 0):
            assert batch.images.shape == (len(batch.sample_ids), 64, 64, 3) == (len(batch.labels), 64, 64, 3)
            for row, sample_id in enumerate(batch.sample_ids[:3]):
                shard, at = keys[sample_id]
                reader = reader_of(shard)
                expected = decode_augment(reader.jpeg(at), TrainTransform(size=64), sample_random(0, 0, sample_id),
                                          restarts=reader.restarts(at)).pixels
                assert np.array_equal(batch.images[row], expected)
            if any(key == victim for _, key, _ in batch.skipped):
                seen_victim = True
                assert len(batch.sample_ids) == 15
    assert seen_victim


def test_what_a_transform_returns_is_checked_against_what_it_declared(manifest):
    reader = ShardReader(manifest.shard_uri(0))
    sample = Sample(0, reader.key(0), reader.label(0), reader.jpeg(0))

    def prepare(made):
        return HostTransform(_Returns(made), name="mine:T").prepare(sample, sample_random(0, 0, 0))

    assert prepare(lambda p: MappingProxyType({"image": p})).payload["image"].shape == (32, 32, 3)  # any mapping
    with pytest.raises(TransformOutputError, match=r"'mine:T': output 'image' is float64\[32, 32, 3\], declared "
                                                   r"uint8\[32, 32, 3\]"):
        prepare(lambda p: {"image": p.astype(float)})
    with pytest.raises(TransformOutputError, match=r"returned fields \['image', 'more'\], declared \['image'\]"):
        prepare(lambda p: {"image": p, "more": p})
    with pytest.raises(ValueError, match="transform raised KeyError: 'oops'"):  # skipped and counted by the worker
        prepare(KeyError("oops"))


def test_tensors_of_payloads_stack_them_one_array_per_output():
    work = HostTransform(_Returns(lambda p: {"image": p}))
    payloads = [{"image": np.full((32, 32, 3), i, np.uint8)} for i in range(3)]
    images = work.tensors(payloads)["image"]
    assert images.shape == (3, 32, 32, 3) and [int(image[0, 0, 0]) for image in images] == [0, 1, 2]


def test_the_time_limit_is_per_call_though_its_timer_is_set_per_batch(manifest):
    """Calls that together run past --transform-timeout in one batch are all kept; the one call that
    runs past it alone is stopped and its sample skipped with the reason."""
    import time

    unit = EpochPlan(manifest, 16, 1, 0).units(0)[0]
    slow = unit.rows(0)[5][2]

    def made(pixels):
        return {"image": pixels}

    class Slowish(_Returns):
        def __call__(self, sample, rng, pixels):
            time.sleep(1.0 if sample.sample_id == slow else 0.04)  # 15 x 0.04 s: 0.6 s in all
            return super().__call__(sample, rng, pixels)

    [batch] = unit_batches(_readers(manifest), unit, HostTransform(Slowish(made), timeout_s=0.2), 16, 0)
    assert [reason for _, _, reason in batch.skipped] == ["transform ran past --transform-timeout 0.2 s"]
    assert len(batch.sample_ids) == 15 and slow not in batch.sample_ids


def test_a_call_that_catches_its_interruption_and_returns_late_is_skipped_and_reported(manifest):
    """A retry loop's bare `except:` swallows the time limit's interruption, then the call returns: the
    sample is skipped all the same, and `on_hang` hears of it with the seconds (it used to be kept)."""
    import time

    unit = EpochPlan(manifest, 16, 1, 0).units(0)[0]
    swallower = unit.rows(0)[3][2]

    class Swallows(_Returns):
        def __call__(self, sample, rng, pixels):
            if sample.sample_id == swallower:
                for _ in range(3):
                    try:
                        time.sleep(0.3)
                    except BaseException:  # noqa: BLE001 - what the user's code does
                        continue
            return super().__call__(sample, rng, pixels)

    heard: list[tuple[int, int, float]] = []
    [batch] = unit_batches(_readers(manifest), unit, HostTransform(Swallows(lambda p: {"image": p}), timeout_s=0.2),
                           16, 0, on_hang=lambda *hang: heard.append(hang))
    [(sample_id, _, reason)] = batch.skipped
    assert sample_id == swallower and reason.startswith("transform ran past --transform-timeout 0.2 s (it returned")
    assert [(u, s) for u, s, _ in heard] == [(unit.unit_id, swallower)] and heard[0][2] >= 0.2


def test_a_crop_decoded_into_its_batch_row_is_its_own_and_a_skipped_sample_leaves_its_row_to_the_next(
        corrupt_manifest):
    """The crop decoder writes a built-in's crop straight into the batch row it lends: in the batch with the
    truncated JPEG (decoded into a lent row, then skipped) every row is still its own sample's image."""
    manifest, victim = corrupt_manifest
    reader_of = _readers(manifest)
    for unit in EpochPlan(manifest, 48, 1, 0).units(0):
        keys = {sample_id: (shard, row) for shard, row, sample_id in unit.rows(0)}
        for batch in unit_batches(reader_of, unit, HostTransform(TrainTransform(size=64)), 16, 0):
            if not any(key == victim for _, key, _ in batch.skipped):
                continue
            for row, sample_id in enumerate(batch.sample_ids):
                reader = reader_of(keys[sample_id][0])
                at = keys[sample_id][1]
                expected = decode_augment(reader.jpeg(at), TrainTransform(size=64), sample_random(0, 0, sample_id),
                                          restarts=reader.restarts(at)).pixels
                assert np.array_equal(batch.images[row], expected)
            return
    raise AssertionError("no batch skipped the truncated JPEG")


def test_batch_rows_copy_what_they_did_not_lend_and_only_that():
    from stoker.pipeline.images.batching import BatchRows

    rows = BatchRows({"image": np.zeros((2, 2, 2, 3), np.uint8)})
    lent = rows.lend("image")
    lent[:] = 7  # the decoder writes the row itself
    rows.put({"image": lent})
    rows.put({"image": np.full((2, 2, 3), 9, np.uint8)})
    assert rows.lent is None
    assert (rows.take()["image"][0] == 7).all() and (rows.take()["image"][1] == 9).all()
