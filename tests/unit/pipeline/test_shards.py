"""pipeline/shards.py: a shard opened with its manifest entry is checked (bytes, rows, columns) before use."""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pytest

import pipeline.integrity as integrity
from pipeline.integrity import ShardRefused
from pipeline.shards import PLAIN_IMAGE_SCHEMA, Manifest, ShardReader
from tests.shard_edits import flip_inside_a_jpeg, rows_of, write_shard


@pytest.fixture(scope="module")
def rows(manifest):
    return rows_of(manifest)[:12]


def test_a_shard_as_its_manifest_says_opens(rows, tmp_path):
    info = write_shard(tmp_path / "s.arrow", rows)
    reader = ShardReader(str(tmp_path / "s.arrow"), info)
    assert len(reader) == 12 and reader.key(3) == rows[3][0] and bytes(reader.jpeg(3)) == rows[3][2]
    reader.close()


def test_a_shard_with_fewer_rows_than_its_manifest_says_is_refused_at_open(rows, tmp_path):
    info = write_shard(tmp_path / "s.arrow", rows[:9])  # bytes and sha256 as written: only the count differs
    with pytest.raises(ShardRefused, match="shard s.arrow: 9 rows, the manifest says 12") as refused:
        ShardReader(str(tmp_path / "s.arrow"), dataclasses.replace(info, num_samples=12))
    assert refused.value.kind == "rows"


def test_a_shard_with_other_columns_is_refused_at_open(rows, tmp_path):
    other = PLAIN_IMAGE_SCHEMA.set(1, pa.field("label", pa.int64())).append(pa.field("restarts", pa.binary()))
    info = write_shard(tmp_path / "s.arrow", rows, schema=other)
    with pytest.raises(ShardRefused, match="label: int64") as refused:
        ShardReader(str(tmp_path / "s.arrow"), info)
    assert refused.value.kind == "schema"


def test_flipped_bytes_are_refused_and_an_intact_shard_is_hashed_once_per_host(rows, tmp_path, monkeypatch):
    path = tmp_path / "s.arrow"
    info = write_shard(path, rows)
    ShardReader(str(path), info).close()
    monkeypatch.setattr(integrity, "sha256_of", lambda _: pytest.fail("hashed again"))
    ShardReader(str(path), info).close()  # another open, in any process of the host: the marker answers
    monkeypatch.undo()
    flip_inside_a_jpeg(path, rows[5][2])
    with pytest.raises(ShardRefused, match="shard s.arrow: its bytes have sha256") as refused:
        ShardReader(str(path), info)
    assert refused.value.kind == "sha256"


def test_a_manifest_says_what_its_records_are_and_old_ones_hold_jpegs(tmp_path):
    manifest = Manifest(kind="imagenet", classes=["a"], shards=[], records="bytes")
    manifest.save(tmp_path / "manifest.json")
    assert json.loads((tmp_path / "manifest.json").read_text())["records"] == "bytes"
    assert Manifest.load(tmp_path).records == "bytes"
    data = json.loads((tmp_path / "manifest.json").read_text())
    del data["records"]  # a manifest from before the field
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    assert Manifest.load(tmp_path).records == "jpeg"
    (tmp_path / "manifest.json").write_text(json.dumps(data | {"records": "png"}))
    with pytest.raises(ValueError, match="records 'png' is not one of jpeg, bytes"):
        Manifest.load(tmp_path)
