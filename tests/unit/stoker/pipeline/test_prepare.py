"""`stoker prepare` and the shards it writes, from a folder, tars and tables alike."""

import dataclasses
import io
import json
import random
import shutil
import subprocess
import sys
import tarfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from stoker.pipeline.images.augment import TrainTransform, decode_augment
from stoker.pipeline.images.batching import HostTransform, unit_batches
from stoker.pipeline.prepare import (
    CORRUPT_KIND,
    TRAINING_SKIPS,
    PrepareConfig,
    prepare_imagenet,
    prepare_records,
)
from stoker.pipeline.store.record_sources import RecordSource
from stoker.pipeline.store.shards import (
    MANIFEST_VERSION,
    PLAIN_IMAGE_SCHEMA,
    RESTART_INDEX_VERSION,
    Manifest,
    ShardInfo,
    ShardReader,
    file_sha256,
)
from stoker.pipeline.store.spill import SPILL_NAME
from stoker.pipeline.store.stats import folder_stats, image_files
from stoker.pipeline.store.table_records import TableSource
from stoker.pipeline.store.tar_records import TarSource
from stoker.pipeline.units import Segment, Unit
from tests.corrupt_jpegs import garbled, truncated
from tests.packing import add_member, folder_samples, write_arrow_binary, write_hf_parquet, write_tars
from tests.shard_edits import rows_of


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
           f"1 CMYK/YCCK JPEG, 1 {CORRUPT_KIND}" in result.stdout
    assert f"kept as it was (no restart markers) {src / 'junk.JPEG'}: corrupt JPEG data: libjpeg warned 'Corrupt " \
           f"JPEG data: 3 extraneous bytes before marker 0xdb'; {TRAINING_SKIPS}" in result.stderr
    manifest = Manifest.load(tmp_path / "dst")
    assert (manifest.transcoded, manifest.from_progressive) == (2, 1)
    assert manifest.kept_as_is == {"CMYK/YCCK JPEG": 1, CORRUPT_KIND: 1}
    reader = manifest.open_shard(0)
    for row in range(len(reader)):
        key = reader.key(row)
        assert (reader.restarts(row) is None) == (key in ("cmyk", "junk"))
        if key in ("cmyk", "junk"):
            assert bytes(reader.jpeg(row)) == (src / f"{key}.JPEG").read_bytes()


@pytest.mark.parametrize("interval", ["32", "0"])
def test_a_corrupt_scan_is_stored_and_listed_with_what_training_does_with_it(raw_images, tmp_path, interval):
    """pillow-simd decodes a garbled scan without a word; libjpeg warns. Prepare stores the file (the job
    may keep it), lists it with libjpeg's words and says training skips it, transcoding or not."""
    src = tmp_path / "src" / "train" / "n01440764"
    src.mkdir(parents=True)
    files = image_files(raw_images)[:4]
    for path in files:
        shutil.copy(path, src / path.name)
    (src / "garbled.JPEG").write_bytes(garbled(files[0].read_bytes()))
    (src / "cut.JPEG").write_bytes(truncated(files[1].read_bytes()))
    result = subprocess.run([sys.executable, "-m", "stoker", "prepare", "imagenet", str(tmp_path / "src"),
                             str(tmp_path / "dst"), "--restart-interval-px", interval],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stderr.splitlines() if "garbled.JPEG" in line)
    assert line.startswith(f"kept as it was (no restart markers) {src / 'garbled.JPEG'}: corrupt JPEG data: libjpeg "
                           "warned 'Corrupt JPEG data: ") and line.endswith(f"'; {TRAINING_SKIPS}"), line
    assert f"1 {CORRUPT_KIND}" in result.stdout and "skipped 1 file(s)" in result.stdout
    assert f"skipped {src / 'cut.JPEG'}: OSError: image file is truncated" in result.stderr  # pillow-simd fails it
    manifest = Manifest.load(tmp_path / "dst")
    assert manifest.kept_as_is.get(CORRUPT_KIND) == 1 and manifest.num_samples == len(files) + 1
    reader = manifest.open_shard(0)
    row = next(r for r in range(len(reader)) if reader.key(r) == "garbled")
    assert bytes(reader.jpeg(row)) == (src / "garbled.JPEG").read_bytes() and reader.restarts(row) is None
    again = prepare_imagenet(tmp_path / "src", tmp_path / "again", PrepareConfig(
        progress=False, processes=1, restart_interval_px=int(interval)))
    words = "corrupt JPEG data: libjpeg warned 'Corrupt JPEG data: "
    assert [(c["path"], c["reason"][:len(words)]) for c in again.corrupt] == [(str(src / "garbled.JPEG"), words)]


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
    batches = list(unit_batches(lambda shard: reader, unit, HostTransform(TrainTransform()), 8, seed=0))
    assert sum(len(b.sample_ids) for b in batches) == len(rows) and not any(b.skipped for b in batches)
    new = list(unit_batches(lambda shard: source, unit, HostTransform(TrainTransform()), 8, seed=0))
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


# The same images from the places users hold them: every source stores each sample as the folder does.

SOURCES = ("tar-cls", "tar-json", "parquet-hf", "arrow-binary")
CONFIG = PrepareConfig(shard_bytes=4 << 20, progress=False, processes=2)


def _source(name: str, root: Path) -> RecordSource:
    return {"tar-cls": lambda: TarSource(root / "tar-cls"),
            "tar-json": lambda: TarSource(f"{root}/tar-json/shard-{{000000..000003}}.tar", label_field="class_id"),
            "parquet-hf": lambda: TableSource(root / "hf" / "data", batch_rows=8),
            "arrow-binary": lambda: TableSource(root / "table.arrow", image_column="jpg", label_column="cls",
                                                key_column="key")}[name]()


@pytest.fixture(scope="module")
def packed(raw_images, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("packed")
    samples, classes = folder_samples(raw_images)
    write_tars(samples, root / "tar-cls", per_tar=48)
    write_tars(samples, root / "tar-json", per_tar=48, label="json", field="class_id")
    write_hf_parquet(samples[:100], root / "hf" / "data" / "train-00000-of-00002.parquet", classes)
    write_hf_parquet(samples[100:], root / "hf" / "data" / "train-00001-of-00002.parquet", classes)
    write_arrow_binary(samples, root / "table.arrow")
    return root


@pytest.fixture(scope="module")
def prepared(packed, tmp_path_factory) -> dict[str, Manifest]:
    return {name: prepare_records(_source(name, packed), tmp_path_factory.mktemp(name), CONFIG).manifest
            for name in SOURCES}


def _by_key(manifest: Manifest) -> dict[str, tuple[int, bytes, bytes | None]]:
    return {key: (label, jpeg, restarts) for key, label, jpeg, restarts in rows_of(manifest)}


def test_every_source_stores_each_sample_as_the_folder_does(manifest, prepared):
    """Same key -> same label, same transcoded bytes, same restart index; the same counts."""
    folder = _by_key(manifest)
    for name, other in prepared.items():
        assert _by_key(other) == folder, name
        assert (other.num_samples, other.transcoded, other.from_progressive, other.kept_as_is, other.records) == \
            (manifest.num_samples, manifest.transcoded, manifest.from_progressive, manifest.kept_as_is, "jpeg"), name
        assert other.restart_index == manifest.restart_index and other.skipped == []
        assert other.classes == (manifest.classes if name == "parquet-hf" else ["0", "1", "2", "3"]), name
        assert not (Path(other.uri).parent / SPILL_NAME).exists()


def test_every_source_decodes_to_the_folders_pixels_through_the_worker_path(manifest, prepared):
    folder = _by_key(manifest)
    keys = sorted(folder)[::10]
    for name, other in prepared.items():
        rows = _by_key(other)
        for key in keys:
            mine, theirs = (decode_augment(jpeg, TrainTransform(size=64), random.Random(key), restarts=restarts)
                            for _, jpeg, restarts in (rows[key], folder[key]))
            assert np.array_equal(mine.pixels, theirs.pixels), (name, key)


def test_a_stream_is_shuffled_by_the_seed_alone(manifest, prepared, packed, tmp_path):
    """Tars and tables in class order come out mixed, in an order only the records and the seed
    decide: the three sources of the same records in the same order write the same shards."""
    shards = {name: [s.sha256 for s in prepared[name].shards] for name in ("tar-cls", "tar-json", "arrow-binary")}
    assert shards["tar-cls"] == shards["tar-json"] == shards["arrow-binary"]
    labels = [label for _, label, _, _ in rows_of(prepared["tar-cls"])]
    assert labels != sorted(labels) and len(set(labels[:16])) > 1
    reseeded = prepare_records(_source("tar-cls", packed), tmp_path, dataclasses.replace(CONFIG, seed=1)).manifest
    assert [r[0] for r in rows_of(reseeded)] != [r[0] for r in rows_of(prepared["tar-cls"])]
    assert sorted(rows_of(reseeded)) == sorted(rows_of(prepared["tar-cls"]))


def test_unusable_records_of_a_stream_are_skipped_and_counted(raw_images, tmp_path):
    samples, _ = folder_samples(raw_images)
    good = samples[:6]
    with tarfile.open(tmp_path / "bad.tar", "w") as tar:
        for key, label, data in good:
            add_member(tar, f"{key}.jpg", data)
            add_member(tar, f"{key}.cls", str(label).encode())
        add_member(tar, "truncated.jpg", good[0][2][:2000])
        add_member(tar, "truncated.cls", b"1")
        add_member(tar, "text.jpg", b"not an image")
        add_member(tar, "text.cls", b"1")
        add_member(tar, "nolabel.jpg", good[1][2])
        add_member(tar, "badlabel.jpg", good[1][2])
        add_member(tar, "badlabel.cls", b"cat")
    result = prepare_records(TarSource(tmp_path / "bad.tar"), tmp_path / "dst", CONFIG)
    reasons = {item["path"].rsplit(":", 1)[1]: item["reason"] for item in result.skipped}
    assert set(reasons) == {"truncated", "text", "nolabel", "badlabel"}
    assert reasons["text"] == "not a JPEG (no SOI marker)"
    assert reasons["nolabel"] == "no label: no .cls or .json member"
    assert reasons["badlabel"] == ".cls holds 'cat', not an integer"
    manifest = Manifest.load(tmp_path / "dst")
    assert manifest.num_samples == len(good) and len(manifest.skipped) == 4
    assert sorted(r[0] for r in rows_of(manifest)) == sorted(key for key, _, _ in good)


def test_records_bytes_stores_any_bytes_as_given_and_the_manifest_says_so(tmp_path):
    rng = np.random.default_rng(0)
    samples = [(f"blob{i}", i % 3, rng.bytes(int(rng.integers(1, 5000)))) for i in range(40)]
    write_tars(samples, tmp_path / "tars", per_tar=16, ext="bin")
    write_arrow_binary(samples, tmp_path / "blobs.arrow")
    raw = dataclasses.replace(CONFIG, records="bytes")
    sources = {"tars": TarSource(tmp_path / "tars", data_ext=("bin",)),
               "arrow": TableSource(tmp_path / "blobs.arrow", image_column="jpg", label_column="cls")}
    for name, source in sources.items():
        result = prepare_records(source, tmp_path / name, raw)
        manifest = Manifest.load(tmp_path / name)
        assert manifest.records == "bytes" and result.manifest.records == "bytes"
        assert (manifest.restart_index, manifest.transcoded, manifest.kept_as_is, manifest.skipped) == (0, 0, {}, [])
        stored = {key: (label, jpeg, restarts) for key, label, jpeg, restarts in rows_of(manifest)}
        keys = [key for key, _, _ in samples] if name == "tars" else [f"blobs-{i}" for i in range(40)]
        assert stored == {k: (label, data, None) for k, (_, label, data) in zip(keys, samples, strict=True)}, name


def test_a_source_with_nothing_usable_is_an_error_that_names_it(tmp_path):
    write_tars([("a", 1, b"not a jpeg")], tmp_path / "tars", per_tar=4)
    with pytest.raises(ValueError, match="tars: none of the 1 records is a decodable JPEG"):
        prepare_records(TarSource(tmp_path / "tars"), tmp_path / "dst", CONFIG)
    assert not (tmp_path / "dst" / SPILL_NAME).exists()
