"""Shared fixtures: a small real ImageNet-like set, its shards, and process helpers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.prepare import PrepareConfig, prepare_imagenet
from pipeline.shards import Manifest, ShardReader, ShardWriter
from pipeline.synth import SynthConfig, generate

TEST_IMAGES = 160


@pytest.fixture(scope="session")
def raw_images(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("raw")
    generate(folder, SynthConfig(images=TEST_IMAGES, classes=4), processes=2, progress=False)
    return folder


@pytest.fixture(scope="session")
def manifest(raw_images, tmp_path_factory) -> Manifest:
    dst = tmp_path_factory.mktemp("shards")
    return prepare_imagenet(raw_images, dst, PrepareConfig(shard_bytes=4 << 20, progress=False, processes=2)).manifest


@pytest.fixture(scope="session")
def corrupt_manifest(manifest, tmp_path_factory) -> tuple[Manifest, str]:
    """The same samples with one JPEG truncated in the middle of its entropy-coded data."""
    dst = tmp_path_factory.mktemp("corrupt")
    writer = ShardWriter(dst, target_bytes=4 << 20)
    victim = ""
    for index in range(len(manifest.shards)):
        reader = ShardReader(manifest.shard_uri(index))
        for row in range(len(reader)):
            data = bytes(reader.jpeg(row))
            if not victim:
                victim = reader.key(row)
                data = data[: len(data) // 3]
            writer.add(reader.key(row), reader.label(row), data)
    corrupt = Manifest(kind="imagenet", classes=manifest.classes, shards=writer.close())
    corrupt.save(dst / "manifest.json")
    return Manifest.load(dst / "manifest.json"), victim


@pytest.fixture
def log_dir(tmp_path) -> Path:
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)
