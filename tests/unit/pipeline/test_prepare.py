"""`stoker prepare imagenet` and the shards it writes."""

import io
import json
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
from PIL import Image

from pipeline.augment import TrainTransform
from pipeline.batching import DecodeOnHost, unit_batches
from pipeline.plan import Segment, Unit
from pipeline.prepare import PrepareConfig, prepare_imagenet
from pipeline.shards import (
    MANIFEST_VERSION,
    PLAIN_IMAGE_SCHEMA,
    RESTART_INDEX_VERSION,
    Manifest,
    ShardInfo,
    ShardReader,
    file_sha256,
)
from pipeline.stats import folder_stats, image_files


def test_every_image_lands_in_a_shard_with_its_pixels_and_label(raw_images, manifest):
    """A transcoded file decodes to its source's pixels; a refused one is stored byte for byte."""
    files = {p.stem: p for p in image_files(raw_images)}
    assert manifest.num_samples == len(files)
    assert len(manifest.shards) > 1
    seen, kept = set(), 0
    for index, info in enumerate(manifest.shards):
        assert file_sha256(Path(manifest.uri).parent / info.path) == info.sha256
        reader = ShardReader(manifest.shard_uri(index))
        for row in range(len(reader)):
            key = reader.key(row)
            stored, source = bytes(reader.jpeg(row)), files[key].read_bytes()
            if reader.restarts(row) is None:
                assert stored == source
                kept += 1
            else:
                assert np.array_equal(np.asarray(Image.open(io.BytesIO(stored))),
                                      np.asarray(Image.open(io.BytesIO(source))))
            assert manifest.classes[reader.label(row)] == files[key].parent.name
            seen.add(key)
    assert seen == set(files)
    assert manifest.transcoded + kept == manifest.num_samples
    assert sum(manifest.kept_as_is.values()) == kept
    assert manifest.restart_index == RESTART_INDEX_VERSION and manifest.version == MANIFEST_VERSION


def test_files_the_transcoder_refuses_are_kept_as_they_were_and_counted(raw_images, tmp_path):
    src = tmp_path / "src" / "train" / "n01440764"
    src.mkdir(parents=True)
    image = Image.open(image_files(raw_images)[0]).convert("RGB")
    image.save(src / "baseline.JPEG", "JPEG")
    image.save(src / "progressive.JPEG", "JPEG", progressive=True)
    image.convert("CMYK").save(src / "cmyk.JPEG", "JPEG")
    data = (src / "baseline.JPEG").read_bytes()
    junk = data.index(b"\xff\xdb")  # Pillow decodes it; libjpeg warns of extraneous bytes
    (src / "junk.JPEG").write_bytes(data[:junk] + b"\x00\x01\x02" + data[junk:])
    result = subprocess.run([sys.executable, "-m", "stoker", "prepare", "imagenet", str(tmp_path / "src"),
                             str(tmp_path / "dst")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "skipped 0 file(s); 2 with restart markers (1 of them were progressive), kept as they were: " \
           "1 CMYK/YCCK JPEG, 1 corrupt or truncated JPEG" in result.stdout
    assert f"kept as it was (no restart markers) {src / 'junk.JPEG'}: corrupt or truncated JPEG: Corrupt JPEG " \
           "data: 3 extraneous bytes before marker 0xdb" in result.stderr
    manifest = Manifest.load(tmp_path / "dst")
    assert (manifest.transcoded, manifest.from_progressive) == (2, 1)
    assert manifest.kept_as_is == {"CMYK/YCCK JPEG": 1, "corrupt or truncated JPEG": 1}
    reader = manifest.open_shard(0)
    for row in range(len(reader)):
        key = reader.key(row)
        assert (reader.restarts(row) is None) == (key in ("cmyk", "junk"))
        if key in ("cmyk", "junk"):
            assert bytes(reader.jpeg(row)) == (src / f"{key}.JPEG").read_bytes()


def test_a_restart_interval_that_cannot_work_is_refused_at_parse_time(tmp_path):
    for bad in ("4", "-1", "70000", "wide"):
        result = subprocess.run([sys.executable, "-m", "stoker", "prepare", "imagenet", str(tmp_path), str(tmp_path),
                                 "--restart-interval-px", bad], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "--restart-interval-px: must be 0" in result.stderr, bad


def test_with_interval_zero_every_file_is_stored_as_it_is(raw_images, tmp_path):
    result = prepare_imagenet(raw_images, tmp_path, PrepareConfig(progress=False, processes=2,
                                                                   restart_interval_px=0))
    assert (result.manifest.transcoded, result.manifest.restart_index, result.manifest.kept_as_is) == (0, 0, {})
    reader = result.manifest.open_shard(0)
    files = {p.stem: p for p in image_files(raw_images)}
    assert all(reader.restarts(r) is None and bytes(reader.jpeg(r)) == files[reader.key(r)].read_bytes()
               for r in range(len(reader)))


def test_a_shard_written_without_the_index_still_trains(manifest, tmp_path):
    """Shards and manifests from before the restart index (three columns, version 1) decode
    through the worker's batch path the plain way."""
    source = manifest.open_shard(0)
    rows = range(min(24, len(source)))
    table = pa.table({"key": [source.key(r) for r in rows], "label": pa.array([source.label(r) for r in rows],
                                                                                 pa.int32()),
                      "jpeg": [bytes(source.jpeg(r)) for r in rows]}, schema=PLAIN_IMAGE_SCHEMA)
    with pa.ipc.new_file(str(tmp_path / "old-00000.arrow"), PLAIN_IMAGE_SCHEMA) as writer:
        writer.write_table(table)
    info = ShardInfo("old-00000.arrow", len(rows), (tmp_path / "old-00000.arrow").stat().st_size,
                     file_sha256(tmp_path / "old-00000.arrow"), 0)
    data = {"kind": "imagenet", "classes": manifest.classes, "shards": [asdict(info)], "skipped": [], "version": 1,
            "num_samples": len(rows)}
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    old = Manifest.load(tmp_path)
    assert old.version == 1 and old.restart_index == 0
    reader = old.open_shard(0)
    assert all(reader.restarts(r) is None for r in rows)
    unit = Unit(unit_id=0, epoch=0, segments=(Segment(0, 0, len(rows), 0),))
    batches = list(unit_batches(lambda shard: reader, unit, DecodeOnHost(TrainTransform()), 8, seed=0))
    assert sum(len(b.sample_ids) for b in batches) == len(rows) and not any(b.skipped for b in batches)
    new = list(unit_batches(lambda shard: source, unit, DecodeOnHost(TrainTransform()), 8, seed=0))
    for plain, indexed in zip(batches, new, strict=True):  # the same crops, the same pixels
        assert np.array_equal(plain.images, indexed.images)


def test_shards_are_memory_mapped_and_rows_are_zero_copy_views(manifest):
    reader = ShardReader(manifest.shard_uri(0))
    view = reader.jpeg(3)
    assert isinstance(view, memoryview)
    before = pa.total_allocated_bytes()
    for row in range(len(reader)):
        reader.jpeg(row)
    assert pa.total_allocated_bytes() == before


def test_samples_are_shuffled_across_classes(manifest):
    reader = ShardReader(manifest.shard_uri(0))
    labels = np.array([reader.label(r) for r in range(min(32, len(reader)))])
    assert len(set(labels.tolist())) > 1


def test_corrupt_and_foreign_files_are_skipped_and_counted(raw_images, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(raw_images, src)
    victims = sorted((src / "train").glob("*/*.JPEG"))[:3]
    victims[0].write_bytes(victims[0].read_bytes()[:3000])  # truncated
    victims[1].write_bytes(b"this is not an image at all")
    victims[2].write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 500)  # a JPEG marker, then junk
    result = subprocess.run([sys.executable, "-m", "stoker", "prepare", "imagenet", str(src), str(tmp_path / "dst")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "skipped 3 file(s)" in result.stdout
    for victim in victims:
        assert str(victim) in result.stderr
    manifest = Manifest.load(tmp_path / "dst")
    assert manifest.num_samples == len(image_files(raw_images)) - 3
    assert len(manifest.skipped) == 3


def test_synthetic_set_has_imagenet_like_statistics(raw_images):
    stats = folder_stats(raw_images)
    assert 60_000 < stats.mean_bytes < 170_000
    assert 380 < stats.mean_width < 560 and 300 < stats.mean_height < 480
    assert stats.long_side_500_fraction > 0.5
