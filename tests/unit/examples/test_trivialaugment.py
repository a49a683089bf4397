"""examples/trivialaugment: TrivialAugment-Wide as a crop-first transform of the contract."""

from __future__ import annotations

import random
import tomllib
from collections import Counter

import numpy as np
import pytest
import stoker_trivialaugment
from stoker_trivialaugment import NUM_BINS, OPS, TrivialAugmentWide, draw

from stoker.pipeline.images.augment import TrainTransform, jpeg_size
from stoker.pipeline.images.batching import HostTransform, unit_batches
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.store.shards import ShardReader
from stoker.pipeline.transforms import Sample, TransformError, resolve
from tests.unit.examples.conftest import EXAMPLES

BY_NAME = {op.name: op for op in OPS}
IMPORT_PATH = "stoker_trivialaugment:TrivialAugmentWide"


def _low_contrast(size: int = 176) -> np.ndarray:
    """Ramps and squares in 100-150: every operation at full strength changes it (sharpness needs the edges)."""
    y, x = np.mgrid[0:size, 0:size]
    squares = 20 * ((x // 16 + y // 16) % 2)
    return np.stack([100 + 30 * x // size + squares, 100 + 30 * y // size + squares, 125 + squares],
                    axis=-1).astype(np.uint8)


def test_the_wide_space_has_fourteen_operations_with_the_papers_ranges():
    assert len(OPS) == 14 and NUM_BINS == 31
    tops = {name: (op.magnitude(0), op.magnitude(NUM_BINS - 1)) for name, op in BY_NAME.items() if op.top is not None}
    assert tops == {"shear_x": (0, 0.99), "shear_y": (0, 0.99), "translate_x": (0, 32), "translate_y": (0, 32),
                    "rotate": (0, 135), "brightness": (0, 0.99), "color": (0, 0.99), "contrast": (0, 0.99),
                    "sharpness": (0, 0.99), "posterize": (8, 2), "solarize": (255, 0)}
    assert [BY_NAME["posterize"].magnitude(i) for i in range(NUM_BINS)] == [8 - round(i / 5) for i in range(NUM_BINS)]
    assert {n for n, op in BY_NAME.items() if op.top is None} == {"identity", "autocontrast", "equalize"}


def test_one_draw_picks_the_operation_and_its_bin_uniformly_and_signs_only_signed_ones():
    rng = random.Random(3)
    draws = [draw(rng) for _ in range(14_000)]
    ops = Counter(op.name for op, _ in draws)
    assert set(ops) == set(BY_NAME) and max(ops.values()) < 1.2 * min(ops.values())
    rotations = [m for op, m in draws if op.name == "rotate"]
    assert len({abs(m) for m in rotations}) == NUM_BINS and min(rotations) < 0 < max(rotations)
    assert all(2 <= m <= 8 and m == int(m) for op, m in draws if op.name == "posterize")
    assert all(0 <= m <= 255 for op, m in draws if op.name == "solarize")
    assert all(m == 0 for op, m in draws if op.top is None)


@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_each_operation_at_full_strength_keeps_the_shape_and_changes_the_picture(op):
    from PIL import Image

    pixels = _low_contrast()
    magnitude = op.magnitude(NUM_BINS - 1) if op.top is not None else 0.0
    out = np.asarray(op.apply(Image.fromarray(pixels), magnitude))
    assert out.shape == pixels.shape and out.dtype == np.uint8
    assert np.array_equal(out, pixels) == (op.name == "identity")


def test_the_crop_is_stokers_train_crop_at_the_size_given():
    ta, plain = TrivialAugmentWide(size=128), TrainTransform(size=128)
    assert ta.takes == "crop" and ta.crop_size == 128 and ta.outputs["image"].shape == (128, 128, 3)
    for i in range(50):
        assert ta.crop(500, 375, sample_random(0, 0, i)) == plain.crop(500, 375, sample_random(0, 0, i))


def test_same_sample_seed_and_epoch_give_identical_pixels_and_another_epoch_others(manifest):
    reader = ShardReader(manifest.shard_uri(0))
    work = HostTransform(TrivialAugmentWide(), name=IMPORT_PATH)

    def image(row: int, epoch: int) -> np.ndarray:
        sample = Sample(row, reader.key(row), reader.label(row), reader.jpeg(row))
        return work.prepare(sample, sample_random(7, epoch, row), reader.restarts(row)).payload["image"]

    for row in range(8):
        first = image(row, 0)
        assert first.shape == (176, 176, 3) and first.dtype == np.uint8
        assert np.array_equal(first, image(row, 0))
        assert not np.array_equal(first, image(row, 1))


def test_batches_are_the_train_crop_augmented_and_an_identity_draw_leaves_it_as_it_was(manifest):
    """Through unit_batches, as a worker runs it: the crop takes the generator's first draws and the
    operation the next, so a sample whose operation is the identity equals the plain train crop to
    the pixel, and nearly every other one differs from it."""
    unit = EpochPlan(manifest, 96, 1, 0).units(0)[0]
    readers: dict[int, ShardReader] = {}

    def reader_of(shard: int) -> ShardReader:
        if shard not in readers:
            readers[shard] = manifest.open_shard(shard)
        return readers[shard]

    def images(transform) -> np.ndarray:
        return np.concatenate([b.images for b in unit_batches(reader_of, unit, HostTransform(transform), 32, 0)])

    augmented, plain = images(TrivialAugmentWide()), images(TrainTransform(size=176))
    assert augmented.shape == plain.shape == (96, 176, 176, 3)
    drawn = []
    for shard, row, sample_id in unit.rows(0):
        rng = sample_random(0, 0, sample_id)
        TrainTransform(size=176).crop(*jpeg_size(reader_of(shard).jpeg(row)), rng)
        drawn.append(draw(rng)[0].name)
    equal = [np.array_equal(a, p) for a, p in zip(augmented, plain, strict=True)]
    assert 0 < drawn.count("identity") and all(e for e, name in zip(equal, drawn, strict=True) if name == "identity")
    assert sum(not e for e, name in zip(equal, drawn, strict=True) if name != "identity") >= 0.8 * (96 - drawn.count(
        "identity"))
    assert np.array_equal(augmented, images(TrivialAugmentWide()))


def test_it_resolves_by_import_path_and_entry_point_with_its_parameters_and_version():
    resolved = resolve(IMPORT_PATH, '{"size":128}')
    assert resolved.outputs["image"].shape == (128, 128, 3)
    assert resolved.version.endswith(stoker_trivialaugment.__version__)
    project = tomllib.loads((EXAMPLES / "trivialaugment" / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["stoker.transforms"] == {"trivialaugment": IMPORT_PATH}
    with pytest.raises(TransformError, match="does not take the parameters"):
        resolve(IMPORT_PATH, '{"sides":128}')
    with pytest.raises(TransformError, match="size must be a whole number of pixels above 0, not 0"):
        resolve(IMPORT_PATH, '{"size":0}')
