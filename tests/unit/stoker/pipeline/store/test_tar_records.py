"""stoker/pipeline/store/tar_records.py: WebDataset samples and their labels, streamed out of tars."""

from __future__ import annotations

import json
import tarfile

import pytest

from stoker.pipeline.store.tar_records import TarSource, split_name
from tests.packing import add_member, write_tars


def _tar(path, members: list[tuple[str, bytes]], mode: str = "w"):
    with tarfile.open(path, mode) as tar:
        for name, data in members:
            add_member(tar, name, data)
    return path


def test_a_member_name_splits_into_key_and_extension_at_the_first_dot_of_its_file_name():
    assert split_name("000123.jpg") == ("000123", "jpg")
    assert split_name("train/v1.2/000123.seg.PNG") == ("train/v1.2/000123", "seg.png")
    assert split_name("README") is None and split_name("dir/.hidden") is None


def test_consecutive_members_with_a_key_are_one_sample(tmp_path):
    path = _tar(tmp_path / "a.tar", [("x/1.jpg", b"one"), ("x/1.cls", b"4"), ("x/1.txt", b"caption"),
                                     ("x/2.jpeg", b"two"), ("x/2.json", json.dumps({"label": 2}).encode()),
                                     ("notes", b"no extension: not a member of any sample")])
    records = list(TarSource(path).records())
    assert [(r.key, r.label, r.data, r.skipped) for r in records] == \
        [("x/1", 4, b"one", None), ("x/2", 2, b"two", None)]
    assert records[0].where == f"{path}:x/1"


def test_a_label_field_reads_the_json_even_beside_a_cls(tmp_path):
    path = _tar(tmp_path / "a.tar", [("1.jpg", b"a"), ("1.cls", b"4"), ("1.json", b'{"class_id": "7"}'),
                                     ("2.jpg", b"b"), ("2.json", b'{"label": 1}')])
    records = list(TarSource(path, label_field="class_id").records())
    assert (records[0].label, records[0].skipped) == (7, None)
    assert records[1].skipped == "no label: .json has no 'class_id' field (label)"


def test_every_unusable_sample_says_why(tmp_path):
    path = _tar(tmp_path / "a.tar", [
        ("nolabel.jpg", b"a"),
        ("words.jpg", b"a"), ("words.cls", b"tench"),
        ("float.jpg", b"a"), ("float.json", b'{"label": 2.5}'),
        ("notjson.jpg", b"a"), ("notjson.json", b"{label: 1"),
        ("list.jpg", b"a"), ("list.json", b"[1, 2]"),
        ("negative.jpg", b"a"), ("negative.cls", b"-1"),
        ("noimage.png", b"a"), ("noimage.cls", b"1")])
    reasons = {r.key: r.skipped for r in TarSource(path).records()}
    assert reasons["nolabel"] == "no label: no .cls or .json member"
    assert reasons["words"] == ".cls holds 'tench', not an integer"
    assert reasons["float"] == ".json's 'label' is 2.5, not an integer"
    assert reasons["notjson"].startswith(".json is not JSON (")
    assert reasons["list"] == "no label: .json has no 'label' field (a JSON list)"
    assert reasons["negative"].startswith("label -1 is outside 0..")
    assert reasons["noimage"] == "no .jpg or .jpeg member (it has .png, .cls)"


def test_gzipped_tars_and_other_members_read_the_same(tmp_path):
    samples = [(f"k{i}", i, bytes([i]) * 10) for i in range(5)]
    write_tars(samples, tmp_path / "gz", per_tar=2, ext="bin", mode="w:gz")
    records = list(TarSource(tmp_path / "gz", data_ext=("png", "bin")).records())
    assert [(r.key, r.label, r.data) for r in records] == samples


def test_a_file_that_is_not_a_tar_stops_before_any_work_and_a_damaged_one_is_counted(tmp_path):
    (tmp_path / "junk.tar").write_bytes(b"definitely not a tar archive" * 40)
    with pytest.raises(ValueError, match=r"junk.tar: not a tar file \("):
        TarSource(tmp_path / "junk.tar")
    whole = _tar(tmp_path / "whole.tar", [(f"{i}.jpg", bytes(3000)) for i in range(4)])
    data = whole.read_bytes()
    (tmp_path / "cut.tar").write_bytes(data[:512 + 3072 + 512 + 3072 + 512 + 1000])  # inside the third member
    records = list(TarSource(tmp_path / "cut.tar").records())
    assert [r.key for r in records[:-1]] == ["0", "1"]  # read whole before the cut (no label: skipped, but seen)
    assert records[-1].where == str(tmp_path / "cut.tar")
    assert records[-1].skipped.startswith("tar unreadable after 2 sample(s), the rest of it is not stored: ")
