"""stoker/pipeline/store/record_sources.py: the files a SRC names, the label rule, and the folder source."""

from __future__ import annotations

import pytest

from stoker.pipeline.store.record_sources import (
    MAX_LABEL,
    FolderSource,
    expand_braces,
    label_problem,
    parse_label,
    source_files,
)
from stoker.pipeline.store.stats import image_files


def test_braces_expand_as_webdataset_names_its_shards():
    assert expand_braces("s-{000..002}.tar") == ["s-000.tar", "s-001.tar", "s-002.tar"]
    assert expand_braces("{train,val}-{1..2}.tar") == ["train-1.tar", "train-2.tar", "val-1.tar", "val-2.tar"]
    assert expand_braces("{9..11}") == ["9", "10", "11"]
    assert expand_braces("plain.tar") == ["plain.tar"]


def test_src_names_a_file_a_folder_or_a_pattern(tmp_path):
    for name in ("a.tar", "b.tar", "c.tar.gz", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.tar").write_bytes(b"")
    suffixes = (".tar", ".tar.gz")
    assert source_files(tmp_path / "notes.txt", suffixes, "tar") == [tmp_path / "notes.txt"]
    assert source_files(tmp_path, suffixes, "tar") == [tmp_path / n for n in ("a.tar", "b.tar", "c.tar.gz")]
    assert source_files(f"{tmp_path}/{{a,b}}.tar", suffixes, "tar") == [tmp_path / "a.tar", tmp_path / "b.tar"]
    assert source_files(f"{tmp_path}/**/*.tar", suffixes, "tar") == \
        [tmp_path / "a.tar", tmp_path / "b.tar", tmp_path / "sub" / "d.tar"]
    with pytest.raises(FileNotFoundError, match="no tar files .* subfolders are not searched"):
        source_files(tmp_path / "sub" / "..", (".parquet",), "tar")
    with pytest.raises(FileNotFoundError, match="no such file or folder, and no file matches it"):
        source_files(tmp_path / "missing-*.tar", suffixes, "tar")


def test_labels_are_integers_in_range():
    assert [parse_label(v) for v in (7, "7", " 12\n", b"3", -1)] == [7, 7, 12, 3, -1]
    assert [parse_label(v) for v in (7.0, "7.5", "cat", True, None, "1_0", [1])] == [None] * 7
    assert label_problem(0) is None and label_problem(MAX_LABEL) is None
    assert label_problem(None) == "no label"
    assert label_problem(-1) == f"label -1 is outside 0..{MAX_LABEL}"
    assert label_problem(10, classes=10) == "label 10 is outside 0..9 (the source names 10 classes)"


def test_a_folder_is_shuffled_before_any_file_is_read(raw_images):
    source = FolderSource(raw_images)
    files = image_files(raw_images)
    assert source.count == len(files) and source.classes == sorted({p.parent.name for p in files})
    records = list(source.records())
    assert [r.where for r in records] == [str(p) for p in files] and all(r.data is None for r in records)
    assert all(source.classes[r.label] == p.parent.name and r.key == p.stem
               for r, p in zip(records, files, strict=True))
    shuffled = [r.where for r in source.shuffled_records(seed=0)]
    assert shuffled != [r.where for r in records] and sorted(shuffled) == sorted(r.where for r in records)
    assert shuffled == [r.where for r in source.shuffled_records(seed=0)]


def test_a_folder_of_tars_or_tables_points_at_the_sub_command_that_reads_it(tmp_path):
    (tmp_path / "tars").mkdir()
    (tmp_path / "tars" / "shard-000000.tar").write_bytes(b"")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train-00000-of-00001.parquet").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="use `stoker prepare webdataset`"):
        FolderSource(tmp_path / "tars")
    with pytest.raises(FileNotFoundError, match="use `stoker prepare parquet`"):
        FolderSource(tmp_path / "data" / "train-00000-of-00001.parquet")
    with pytest.raises(FileNotFoundError, match=r"no images found in .*/<class>/$"):
        FolderSource(tmp_path / "nothing")
