"""`stoker prepare imagenet` and the shards it writes."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.shards import Manifest, ShardReader, file_sha256
from pipeline.stats import folder_stats, image_files


def test_every_image_lands_in_a_shard_with_its_bytes_and_label(raw_images, manifest):
    files = {p.stem: p for p in image_files(raw_images)}
    assert manifest.num_samples == len(files)
    assert len(manifest.shards) > 1
    seen = set()
    for index, info in enumerate(manifest.shards):
        assert file_sha256(Path(manifest.uri).parent / info.path) == info.sha256
        reader = ShardReader(manifest.shard_uri(index))
        for row in range(len(reader)):
            key = reader.key(row)
            assert bytes(reader.jpeg(row)) == files[key].read_bytes()
            assert manifest.classes[reader.label(row)] == files[key].parent.name
            seen.add(key)
    assert seen == set(files)


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
