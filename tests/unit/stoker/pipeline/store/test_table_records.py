"""stoker/pipeline/store/table_records.py: Parquet and Arrow tables of image bytes and labels, a few rows at a time."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stoker.pipeline.store.table_records import TableSource, table_batches
from tests.packing import hf_table, write_arrow_binary, write_hf_parquet

SAMPLES = [(f"img{i}", i % 3, bytes([i]) * (i + 1)) for i in range(10)]


def test_the_hugging_face_layout_reads_with_its_class_names_and_paths_as_keys(tmp_path):
    path = write_hf_parquet(SAMPLES, tmp_path / "train.parquet", ["tench", "goldfish", "shark"], row_group_size=4)
    source = TableSource(path, batch_rows=3)
    assert source.classes == ["tench", "goldfish", "shark"] and source.count == 10
    assert [(r.key, r.label, r.data, r.skipped) for r in source.records()] == [(*s, None) for s in SAMPLES]


def test_a_plain_binary_column_in_an_arrow_file_or_stream(tmp_path):
    for stream in (False, True):
        path = write_arrow_binary(SAMPLES, tmp_path / f"t{stream}.arrow", batch_rows=4, stream=stream)
        source = TableSource(path, image_column="jpg", label_column="cls", batch_rows=3)
        assert source.classes is None and source.count == (None if stream else 10)
        records = list(source.records())
        assert [(r.label, r.data) for r in records] == [(label, data) for _, label, data in SAMPLES]
        assert [r.key for r in records] == [f"t{stream}-{i}" for i in range(10)]  # no key column named
        keyed = TableSource(path, image_column="jpg", label_column="cls", key_column="key")
        assert [r.key for r in keyed.records()] == [key for key, _, _ in SAMPLES]


def test_a_webdataset_key_column_names_the_samples(tmp_path):
    table = hf_table(SAMPLES[:3], None).append_column("__key__", pa.array(["a", "b", "c"]))
    pq.write_table(table, tmp_path / "t.parquet")
    assert [r.key for r in TableSource(tmp_path / "t.parquet").records()] == ["a", "b", "c"]


def test_rows_without_bytes_or_label_are_skipped_with_the_reason(tmp_path):
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array([{"bytes": b"ok", "path": "a.jpg"}, {"bytes": None, "path": "/elsewhere/b.jpg"}, None,
                       {"bytes": b"ok", "path": "d.jpg"}, {"bytes": b"ok", "path": "e.jpg"}], image_type)
    labels = pa.array([0, 1, 1, None, 5], pa.int64())
    table = pa.table({"image": images, "label": labels}).replace_schema_metadata(hf_table([], ["a", "b"]).schema
                                                                                  .metadata)
    pq.write_table(table, tmp_path / "t.parquet")
    records = list(TableSource(tmp_path / "t.parquet").records())
    assert [r.skipped for r in records] == [
        None, "no image bytes in column 'image' (only a path: /elsewhere/b.jpg)", "no image bytes in column 'image'",
        "no label", "label 5 is outside 0..1 (the source names 2 classes)"]
    assert records[1].where == f"{tmp_path / 't.parquet'}:row 1 (b)"


def test_a_missing_column_is_an_error_that_names_the_columns_found(tmp_path):
    path = write_hf_parquet(SAMPLES, tmp_path / "t.parquet")
    with pytest.raises(ValueError, match=r"t.parquet: no column 'img' \(its columns: image: struct<bytes: binary, "
                                         r"path: string>, label: int64\); name the right one with --image-column"):
        TableSource(path, image_column="img")
    with pytest.raises(ValueError, match="no column 'class'.*--label-column"):
        TableSource(path, label_column="class")
    with pytest.raises(ValueError, match="column 'label' is int64, not image bytes"):
        TableSource(path, image_column="label")
    pq.write_table(pa.table({"image": [b"x"], "label": ["tench"]}), tmp_path / "s.parquet")
    with pytest.raises(ValueError, match="column 'label' is string, not an integer label"):
        TableSource(tmp_path / "s.parquet")


def test_a_file_that_is_no_table_is_an_error_naming_it(tmp_path):
    (tmp_path / "fake.parquet").write_bytes(b"PAR1 but nothing else")
    (tmp_path / "text.arrow").write_text("hello")
    for name in ("fake.parquet", "text.arrow"):
        with pytest.raises(ValueError, match=f"{name}: neither a Parquet nor an Arrow IPC file"):
            TableSource(tmp_path / name)


def test_a_big_file_is_read_a_few_rows_at_a_time(tmp_path):
    """Bounded memory: batches of at most batch_rows, and never more than a row group in memory."""
    rng = np.random.default_rng(0)
    samples = [(f"k{i}", 0, rng.bytes(50_000)) for i in range(400)]  # 20 MB that does not compress
    path = write_hf_parquet(samples, tmp_path / "big.parquet", row_group_size=16)
    assert [b.num_rows for b in table_batches(path, ["image", "label"], 8)] == [8] * 50
    before, peak, count = pa.total_allocated_bytes(), 0, 0
    for record in TableSource(path, batch_rows=8).records():
        peak = max(peak, pa.total_allocated_bytes() - before)
        count += record.data is not None
    assert count == 400 and peak < 4 * 16 * 50_000  # a few row groups' worth, not the 20 MB file
    arrow = write_arrow_binary(samples, tmp_path / "big.arrow", batch_rows=100)
    assert [b.num_rows for b in table_batches(arrow, ["jpg"], 32)] == [32, 32, 32, 4] * 4
    before = pa.total_allocated_bytes()
    assert sum(1 for _ in TableSource(arrow, image_column="jpg", label_column="cls").records()) == 400
    assert pa.total_allocated_bytes() - before < 1 << 20  # memory-mapped: views of the file
