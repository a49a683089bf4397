"""Parquet or Arrow (IPC file or stream, Feather v2) tables as records, read a few rows at a time.

The Hugging Face `datasets` image layout: an image column that is either a struct
`{bytes: binary, path: string}` or plain binary, and an integer label column (a ClassLabel is
stored as int64, its names in the schema's `huggingface` metadata, which become the manifest's
classes). Every file's columns are checked before any row is read, so a missing column or a file
that is no table stops prepare at once, naming the file and the columns it has. Rows are read in
batches of `batch_rows` (Parquet: one row group decoded at a time at most; Arrow: memory-mapped),
so a multi-GB file never sits in memory whole.

A record's key is its `key_column`; without one, the `__key__` column where there is one (what a
WebDataset converted by `datasets` holds), else the image's `path` without its extension, else
`<file stem>-<row>`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from stoker.pipeline.store.record_sources import Record, RecordSource, label_problem, source_files
from stoker.protos.errors import DataError

TABLE_SUFFIXES = (".parquet", ".arrow", ".feather", ".ipc")
DEFAULT_BATCH_ROWS = 64
WEBDATASET_KEY = "__key__"


def _is_bytes(kind: pa.DataType) -> bool:
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind)


def _columns(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


class TableSource(RecordSource):
    """The rows of one or more Parquet or Arrow files (a file, a folder of them, or a pattern)."""

    def __init__(self, src: str | Path, image_column: str = "image", label_column: str = "label",
                 key_column: str | None = None, batch_rows: int = DEFAULT_BATCH_ROWS) -> None:
        self.description = str(src)
        self.files = source_files(src, TABLE_SUFFIXES, "Parquet or Arrow")
        self.image_column, self.label_column, self.key_column = image_column, label_column, key_column
        self.batch_rows = batch_rows
        self.count = 0
        for path in self.files:  # every file's columns, before any row is read
            schema, rows = table_info(path)
            self._check_schema(path, schema)
            names = class_names(schema, label_column)
            if names is not None and self.classes is not None and names != self.classes:
                raise DataError(f"{path}: its class names differ from those of {self.files[0]}")
            self.classes = self.classes or names
            self.count = None if rows is None or self.count is None else self.count + rows

    def _check_schema(self, path: Path, schema: pa.Schema) -> None:
        for column, flag in ((self.image_column, "--image-column"), (self.label_column, "--label-column"),
                             (self.key_column, "--key-column")):
            if column is not None and schema.get_field_index(column) < 0:
                raise DataError(f"{path}: no column {column!r} (its columns: {_columns(schema)}); "
                                 f"name the right one with {flag}")
        image = schema.field(self.image_column).type
        if not (_is_bytes(image) or (pa.types.is_struct(image) and image.get_field_index("bytes") >= 0
                                     and _is_bytes(image.field("bytes").type))):
            raise DataError(f"{path}: column {self.image_column!r} is {image}, not image bytes (binary, or a "
                             f"struct with a binary `bytes` field as `datasets` writes an Image)")
        label = schema.field(self.label_column).type
        if not pa.types.is_integer(label):
            raise DataError(f"{path}: column {self.label_column!r} is {label}, not an integer label")

    def records(self) -> Iterator[Record]:
        for path in self.files:
            yield from self._file_records(path)

    def _file_records(self, path: Path) -> Iterator[Record]:
        schema, _ = table_info(path)
        key_column = self.key_column or (WEBDATASET_KEY if schema.get_field_index(WEBDATASET_KEY) >= 0 else None)
        wanted = [c for c in dict.fromkeys((self.image_column, self.label_column, key_column)) if c]
        row = 0
        try:
            for batch in table_batches(path, wanted, self.batch_rows):
                images, paths = _image_values(batch.column(self.image_column))
                labels = batch.column(self.label_column).to_pylist()
                keys = batch.column(key_column).to_pylist() if key_column else [None] * batch.num_rows
                for data, name, label, key in zip(images, paths, labels, keys, strict=True):
                    yield self._record(path, row, data, name, label, key)
                    row += 1
        except (pa.ArrowException, OSError) as exc:  # damaged part way: reported once, as one skipped record
            yield Record("", 0, str(path), skipped=f"table unreadable after {row} row(s), the rest of it is not "
                                                   f"stored: {type(exc).__name__}: {exc}")

    def _record(self, path: Path, row: int, data: bytes | None, name: str | None, label: int | None,
                key: object) -> Record:
        if isinstance(key, bytes):
            key = key.decode("utf-8", "replace")
        key = str(key) if key is not None else Path(name).stem if name else f"{path.stem}-{row}"
        where = f"{path}:row {row} ({key})"
        problem = label_problem(label, len(self.classes) if self.classes is not None else None)
        if data is None or problem or label is None:  # no label is a problem: said to narrow the type
            return Record(key, 0, where, skipped=problem or f"no image bytes in column {self.image_column!r}"
                                                            + (f" (only a path: {name})" if name else ""))
        return Record(key, label, where, data=data)


def table_info(path: Path) -> tuple[pa.Schema, int | None]:
    """A file's schema and row count (None where only reading it all would tell: an IPC stream);
    ValueError when it is neither Parquet nor Arrow IPC."""
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic[:4] == b"PAR1":
            with pq.ParquetFile(path) as parquet:
                return parquet.schema_arrow, parquet.metadata.num_rows
        with pa.memory_map(str(path), "r") as source:
            if magic == b"ARROW1":
                reader = pa.ipc.open_file(source)
                return reader.schema, sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
            return pa.ipc.open_stream(source).schema, None
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: neither a Parquet nor an Arrow IPC file ({exc})") from exc


def table_batches(path: Path, columns: list[str], rows: int) -> Iterator[pa.RecordBatch]:
    """The file's `columns` in record batches of at most `rows` rows, read as they are needed."""
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic[:4] == b"PAR1":
        with pq.ParquetFile(path) as parquet:  # a row group at a time: over all of them at once, pyarrow
            for group in range(parquet.num_row_groups):  # pre-buffers the whole file
                yield from parquet.iter_batches(batch_size=rows, row_groups=[group], columns=columns,
                                                use_threads=False)
        return
    with pa.memory_map(str(path), "r") as source:  # batches are views of the mapped file, not copies
        reader = pa.ipc.open_file(source) if magic == b"ARROW1" else pa.ipc.open_stream(source)
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches)) if magic == b"ARROW1" else reader
        for batch in batches:
            batch = batch.select(columns)
            for start in range(0, batch.num_rows, rows):
                yield batch.slice(start, rows)


def _image_values(column: pa.Array) -> tuple[list[bytes | None], list[str | None]]:
    """The image bytes of each row (None where there are none) and, for a struct, its path."""
    if not pa.types.is_struct(column.type):
        return column.to_pylist(), [None] * len(column)
    data = column.field("bytes").to_pylist()
    has_path = column.type.get_field_index("path") >= 0
    paths = column.field("path").to_pylist() if has_path else [None] * len(column)
    if column.null_count:  # a null struct hides whatever its fields hold
        valid = column.is_valid().to_pylist()
        data = [d if ok else None for d, ok in zip(data, valid, strict=True)]
        paths = [p if ok else None for p, ok in zip(paths, valid, strict=True)]
    return data, paths


def class_names(schema: pa.Schema, label_column: str) -> list[str] | None:
    """The ClassLabel names `datasets` keeps in the schema's metadata, if it does."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        features = json.loads(raw)["info"]["features"] if raw else {}
        names = features.get(label_column, {}).get("names")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return [str(n) for n in names] if isinstance(names, list) and names else None
