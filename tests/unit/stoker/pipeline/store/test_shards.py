"""stoker/pipeline/store/shards.py: a shard opened with its manifest entry is checked (bytes, rows, columns)
before use."""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pytest

import stoker.pipeline.store.integrity as integrity
from stoker.pipeline.store.integrity import ShardRefused
from stoker.pipeline.store.shards import PLAIN_IMAGE_SCHEMA, Manifest, ShardReader
from stoker.protos.errors import DataError
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


def _entry(path="s0.arrow", num_samples=10, num_bytes=1000, sha256="", first_sample_id=0) -> dict:
    return {"path": path, "num_samples": num_samples, "num_bytes": num_bytes, "sha256": sha256,
            "first_sample_id": first_sample_id}


@pytest.mark.parametrize("shards, says", [
    ([_entry(path="../../etc/passwd")], "is not a file name inside the manifest's folder"),
    ([_entry(path="/dev/zero")], "is not a file name inside the manifest's folder"),
    ([_entry(path="s3://bucket/s0.arrow")], "is not a file name inside the manifest's folder"),
    ([_entry(path="a/./b")], "is not a file name inside the manifest's folder"),
    ([_entry(num_samples=-3)], 'field "num_samples" is -3, not a count'),
    ([_entry(num_samples=10**12)], "more than 4294967296 samples"),
    ([_entry(), _entry(path="s1.arrow", first_sample_id=12)], "where the shards before it end at 10"),
    ([_entry(), _entry(path="s1.arrow", first_sample_id=5)], "no gap and no overlap"),
    ([_entry(first_sample_id=1)], "first_sample_id 1, where the shards before it end at 0"),
    ([{"path": "s0.arrow"}], "not a shard entry"),
    ("s0.arrow", "no list of shards"),
])
def test_a_manifest_that_leaves_its_folder_or_miscounts_is_refused_when_loaded(tmp_path, shards, says):
    """Before anything plans from it or opens a file: one line naming the entry (the path used to be
    followed out of the data folder, 10^12 samples took gigabytes and hung, and overlapping ids
    exited 0 with fewer unique samples than delivered)."""
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 2, "kind": "imagenet", "classes": ["a"],
                                                        "shards": shards}))
    with pytest.raises(ValueError, match=says):
        Manifest.load(tmp_path)


@pytest.mark.parametrize("entry, says", [
    (_entry(num_samples="88"), 'field "num_samples" is the string "88", not a count (a whole number)'),
    (_entry(num_samples=88.0), 'field "num_samples" is the number 88.0, not a count (a whole number)'),
    (_entry(num_samples=True), 'field "num_samples" is true, not a count (a whole number)'),
    (_entry(num_samples=None), 'field "num_samples" is null, not a count (a whole number)'),
    (_entry(num_bytes="1000"), 'field "num_bytes" is the string "1000", not a count (a whole number)'),
    (_entry(first_sample_id=[0]), 'field "first_sample_id" is a list [0], not a count (a whole number)'),
    (_entry(num_bytes=-1), 'field "num_bytes" is -1, not a count (0 to 281474976710656)'),
    (_entry(path=7), 'field "path" is the number 7, not a string'),
    (_entry(sha256=None), 'field "sha256" is null, not a string'),
    ("s0.arrow", 'is the string "s0.arrow", not an object with the fields path, num_samples, num_bytes, sha256, '
                 'first_sample_id'),
    ({"path": "s0.arrow", "num_samples": 1}, "not a shard entry (no field num_bytes, sha256, first_sample_id; it has "
                                             "the fields path, num_samples, num_bytes, sha256, first_sample_id)"),
    (_entry() | {"size": 3}, 'not a shard entry (fields it does not know: "size"; it has the fields'),
])
def test_a_shard_entry_field_of_the_wrong_type_is_refused_naming_its_type(tmp_path, entry, says):
    """`"num_samples": "88"` used to be refused as "num_samples 88 is not a count", as if 88 were wrong, and
    `"path": 7` as "path and sha256 must be strings", naming neither the field nor what it held."""
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 2, "kind": "imagenet", "classes": ["a"],
                                                        "shards": [entry]}))
    with pytest.raises(DataError) as refused:
        Manifest.load(tmp_path)
    assert str(refused.value).startswith(f"{tmp_path}/manifest.json: shard entry 0")
    assert says in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("fields, says", [
    ({"classes": None}, 'field "classes" is null, not a list of strings'),
    ({"classes": ["a", 3]}, 'field "classes" is a list ["a", 3], not a list of strings'),
    ({"classes": "abc"}, 'field "classes" is the string "abc", not a list of strings'),
    ({"version": "2"}, 'field "version" is the string "2", not an integer'),
    ({"version": 2.0}, 'field "version" is the number 2.0, not an integer'),
    ({"version": True}, 'field "version" is true, not an integer'),
    ({"version": 3}, "manifest version 3 is not one of 1, 2 (this Stoker reads those)"),
    ({"kind": 7}, 'field "kind" is the number 7, not a string'),
    ({"vocab_size": "30522"}, 'field "vocab_size" is the string "30522", not an integer'),
    ({"kept_as_is": {"progressive": "2"}}, 'field "kept_as_is" is an object {"progressive": "2"}, not an object '
                                           'of integers'),
    ({"skipped": [None]}, 'field "skipped" is a list [null], not a list of objects of strings'),
    ({"uri": "elsewhere"}, 'not a Stoker manifest this Stoker reads (fields it does not know: "uri")'),
    ({"colour": "red"}, 'not a Stoker manifest this Stoker reads (fields it does not know: "colour")'),
])
def test_a_manifest_field_of_the_wrong_type_is_refused_naming_the_field_its_type_and_the_file(tmp_path, fields, says):
    """`"classes": null` used to end in `TypeError: object of type 'NoneType' has no len()` far from the file,
    and `"version": "2"` in "manifest version 2 is not one of 1, 2"."""
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 2, "kind": "imagenet", "classes": ["a"],
                                                        "shards": []} | fields))
    with pytest.raises(DataError) as refused:
        Manifest.load(tmp_path)
    assert str(refused.value) == f"{tmp_path}/manifest.json: {says}"


def test_a_manifest_without_a_field_it_needs_is_refused_naming_it(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"kind": "imagenet", "shards": []}))
    with pytest.raises(DataError, match=r"manifest.json: not a Stoker manifest \(no field version, classes\)"):
        Manifest.load(tmp_path)


def test_a_shard_that_is_not_a_regular_file_is_refused_before_any_worker_reads_it(rows, tmp_path):
    import os

    info = write_shard(tmp_path / "s0.arrow", rows)
    os.mkfifo(tmp_path / "s1.arrow")
    fifo = dataclasses.replace(info, path="s1.arrow", first_sample_id=info.num_samples)
    manifest = Manifest(kind="imagenet", classes=["a"], shards=[dataclasses.replace(info, path="s0.arrow"), fifo])
    manifest.save(tmp_path / "manifest.json")
    loaded = Manifest.load(tmp_path)
    with pytest.raises(ValueError, match="shard s1.arrow is not a regular file"):
        loaded.check_shard_files()
    with pytest.raises(ShardRefused, match="not a regular file") as refused:  # and at a worker that meets it anyway
        loaded.open_shard(1)
    assert refused.value.kind == "unreadable"
    (tmp_path / "s1.arrow").unlink()
    loaded.check_shard_files()  # a missing shard is the worker's to refuse and count
