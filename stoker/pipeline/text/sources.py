"""A user's text documents, wherever they are kept: JSONL, Parquet, WebDataset tars, .txt files, or code.

Tokenizing, packing and mixing do not care where a document came from, so every source comes out
as one stream of `Document` values (file, position, key, text) in a fixed order: files sorted by
path, and each file's documents in its own order. SRC is a file, a folder (every supported file
under it, recursively; files of other kinds there are ignored and named once in the log) or a
glob or brace pattern (`corpus-{000..009}.jsonl.gz`, store.record_sources' listing).

- JSONL (`.jsonl`, `.json`, `.ndjson`, each optionally `.gz`, or `.zst` with the `zstandard`
  package): one JSON object a line, its text in `text_field` (default `text`), its key in
  `id_field` where given and present, else the line number. Blank lines hold no document: they are
  passed over, counted (`Skipped.blank_lines`) and said in the closing summary, not skipped as errors.
- Parquet (`.parquet`, a Hugging Face dataset's export): `text_field` is the column (strings or bytes,
  dictionary-encoded ones too, as pandas writes a categorical, read decoded), read one row
  group at a time in batches (store.table_records), so a large file never sits in memory whole;
  `id_field`, where given, must be a column too (its null rows are keyed by row number).
- WebDataset tars (`.tar`, `.tar.gz`, `.tgz`): each `.txt` member is a document, its sample key
  (`train/000123`) the document's key; other members are ignored.
- `.txt` files: one document each, keyed by the path below SRC.
- Your own code (`CallableSource`, `module:Name`): a callable that yields texts or `Document`s,
  pinned to the version of what provides it as a transform is (pipeline.transforms).

What cannot be a document (a line that is not JSON, no text field or one that is not a string,
bytes that are not UTF-8, an empty or whitespace-only text) is skipped, counted by reason in
`Skipped` and named once in the log (`corpus.jsonl:17: not JSON`); nothing else is lost. What
cannot be read at all (a file of another kind, a Parquet file without the column, a source with
no documents, a .gz or tar cut short) raises ConfigError or DataError naming the file; a file
cut short raises after the documents read before the damage.
"""

from __future__ import annotations

import gzip
import importlib
import io
import json
import logging
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pyarrow as pa

from stoker.pipeline.store.record_sources import source_files
from stoker.pipeline.store.table_records import table_batches, table_info
from stoker.pipeline.store.tar_records import TAR_SUFFIXES, check_is_tar, split_name
from stoker.pipeline.transforms import IMPORT_PATH, TransformError, import_named
from stoker.protos.errors import ConfigError, DataError

log = logging.getLogger("stoker.text")

DEFAULT_TEXT_FIELD = "text"
DEFAULT_BATCH_ROWS = 1024
MAX_EXAMPLES = 5
JSONL_SUFFIXES = tuple(f"{base}{comp}" for base in (".jsonl", ".json", ".ndjson") for comp in ("", ".gz", ".zst"))
PARQUET_SUFFIXES = (".parquet",)
TXT_SUFFIXES = (".txt",)
SUPPORTED = JSONL_SUFFIXES + PARQUET_SUFFIXES + TAR_SUFFIXES + TXT_SUFFIXES

# The reasons a document is skipped: the keys of Skipped.counts.
NOT_JSON = "not JSON"
NOT_OBJECT = "not a JSON object"
NO_TEXT = "no text field"
NOT_STRING = "text is not a string"
NOT_UTF8 = "not UTF-8"
EMPTY = "empty"

_CUT_SHORT = (EOFError, OSError, zlib.error, tarfile.TarError)


class SourceRefused(ConfigError):
    """A source callable that cannot be the one named: not importable here, or another version."""


@dataclass(frozen=True)
class Document:
    """One document: `source` the file (or the callable) it came from, `index` its position there
    (JSONL: line number from 1; Parquet row, tar member, callable item: from 0), `key` its id."""

    source: str
    index: int
    key: str
    text: str


@dataclass
class Skipped:
    """What a read skipped: how many by reason, and the first few, each as `file:line: reason`; and the blank
    JSONL lines it passed over (they hold no document, so they are neither skipped nor an error, only counted)."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    blank_lines: int = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, where: str, reason: str, detail: str = "") -> None:
        """Count one skipped document and name it in the log (once: it is read once)."""
        self.counts[reason] = self.counts.get(reason, 0) + 1
        line = f"{where}: {reason}{detail}"
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(line)
        log.warning("skipped %s", line)

    def summary(self) -> str:
        return ", ".join(f"{n} {reason}" for reason, n in sorted(self.counts.items())) or "none"

    def report(self, where: str) -> None:
        """One closing line for a read: what was skipped (each one was named as it was met) and the blank
        lines passed over; a warning when documents were skipped, else information."""
        if self.total or self.blank_lines:
            level = logging.WARNING if self.total else logging.INFO
            blank = f"; {self.blank_lines} blank line(s) passed over (no document in them, not an error)"
            log.log(level, "%s: %d document(s) skipped: %s%s", where, self.total, self.summary(),
                    blank if self.blank_lines else "")


def _kind(path: Path) -> str | None:
    name = path.name.lower()
    for kind, suffixes in (("jsonl", JSONL_SUFFIXES), ("parquet", PARQUET_SUFFIXES), ("tar", TAR_SUFFIXES),
                           ("txt", TXT_SUFFIXES)):
        if name.endswith(suffixes):
            return kind
    return None


def text_source_files(src: str | Path) -> list[Path]:
    """The files SRC names, sorted; ConfigError for a named file of a kind no reader takes."""
    path = Path(src)
    if path.is_dir():
        everything = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        found = [p for p in everything if _kind(p)]
        ignored = [p for p in everything if not _kind(p)]
        if ignored:
            log.warning("%s: %d file(s) of other kinds ignored, such as %s", src, len(ignored), ignored[0])
        if not found:
            raise DataError(f"{src}: no documents: no {', '.join(SUPPORTED)} files under this folder")
        return found
    found = source_files(src, SUPPORTED, "text")
    for file in found:
        if _kind(file) is None:
            raise ConfigError(f"{file}: not a kind of text file Stoker reads ({', '.join(SUPPORTED)})")
    return found


class TextSource:
    """Every document of SRC. Settings that cannot work are refused here, before any document is
    read; `skipped` fills as `documents()` runs."""

    def __init__(self, src: str | Path, text_field: str = DEFAULT_TEXT_FIELD, id_field: str | None = None,
                 batch_rows: int = DEFAULT_BATCH_ROWS) -> None:
        self.description = str(src)
        self.text_field, self.id_field, self.batch_rows = text_field, id_field, batch_rows
        self.files = text_source_files(src)
        self.skipped = Skipped()
        for path in self.files:
            self._check(path)

    def _check(self, path: Path) -> None:
        kind = _kind(path)
        if kind == "jsonl" and path.name.lower().endswith(".zst"):
            _zstandard(path)
        elif kind == "parquet":
            schema, _ = table_info(path)
            _check_text_column(path, schema, self.text_field)
            if self.id_field is not None and schema.get_field_index(self.id_field) < 0:
                raise DataError(f"{path}: no id column {self.id_field!r} (its columns: {', '.join(schema.names)})")
        elif kind == "tar":
            check_is_tar(path)

    def documents(self) -> Iterator[Document]:
        """Every document once, in order; DataError at the end when there were none at all."""
        count = 0
        for path in self.files:
            for doc in self._file_documents(path):
                count += 1
                yield doc
        self.skipped.report(self.description)
        if not count:
            raise DataError(f"{self.description}: no documents ({self.skipped.total} skipped: "
                            f"{self.skipped.summary()})")

    def _file_documents(self, path: Path) -> Iterator[Document]:
        kind = _kind(path)
        if kind == "jsonl":
            return self._jsonl(path)
        if kind == "parquet":
            return self._parquet(path)
        if kind == "tar":
            return self._tar(path)
        return self._txt(path)

    def _jsonl(self, path: Path) -> Iterator[Document]:
        read = 0
        try:
            with _open_lines(path) as lines:
                for number, raw in enumerate(lines, 1):
                    if not raw.strip():
                        self.skipped.blank_lines += 1
                        continue
                    doc = self._json_line(path, number, raw)
                    if doc is not None:
                        read += 1
                        yield doc
        except _read_errors(path) as exc:
            raise DataError(f"{path}: unreadable after {read} document(s), it may be truncated: "
                            f"{type(exc).__name__}: {exc}") from exc

    def _json_line(self, path: Path, number: int, raw: bytes) -> Document | None:
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.skipped.add(where, NOT_UTF8, f" ({exc.reason} at byte {exc.start})")
            return None
        try:
            value = json.loads(line.removeprefix("\ufeff") if number == 1 else line)
        except json.JSONDecodeError as exc:
            self.skipped.add(where, NOT_JSON, f" ({exc.msg}, column {exc.colno})")
            return None
        if not isinstance(value, dict):
            self.skipped.add(where, NOT_OBJECT, f" (a JSON {type(value).__name__})")
            return None
        if self.text_field not in value:
            self.skipped.add(where, NO_TEXT, f" {self.text_field!r} (its fields: {', '.join(map(str, value))})")
            return None
        ident = value.get(self.id_field) if self.id_field else None
        key = str(ident) if ident is not None else str(number)
        return self._document(where, str(path), number, key, value[self.text_field])

    def _parquet(self, path: Path) -> Iterator[Document]:
        row = 0
        try:
            columns = [c for c in dict.fromkeys((self.text_field, self.id_field)) if c]
            for batch in table_batches(path, columns, self.batch_rows):
                texts = batch.column(self.text_field).to_pylist()
                ids = batch.column(self.id_field).to_pylist() if self.id_field in columns else [None] * len(texts)
                for text, ident in zip(texts, ids, strict=True):
                    key = str(ident) if ident is not None else str(row)
                    doc = self._document(f"{path}:row {row}", str(path), row, key, text)
                    row += 1
                    if doc is not None:
                        yield doc
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{path}: unreadable after {row} row(s): {type(exc).__name__}: {exc}") from exc

    def _tar(self, path: Path) -> Iterator[Document]:
        index = 0
        try:
            with tarfile.open(path, "r|*") as tar:
                for member in tar:
                    named = split_name(member.name) if member.isfile() else None
                    if named is None or named[1] != "txt":
                        continue
                    stream = tar.extractfile(member)
                    data = stream.read() if stream is not None else b""
                    doc = self._document(f"{path}:{member.name}", str(path), index, named[0], data)
                    index += 1
                    if doc is not None:
                        yield doc
                _check_tar_end(tar)
        except _CUT_SHORT as exc:
            raise DataError(f"{path}: unreadable after {index} document(s), it may be truncated: "
                            f"{type(exc).__name__}: {exc}") from exc

    def _txt(self, path: Path) -> Iterator[Document]:
        top = Path(self.description)
        key = path.relative_to(top).as_posix() if top.is_dir() else path.name
        doc = self._document(str(path), str(path), 0, key, path.read_bytes())
        if doc is not None:
            yield doc

    def _document(self, where: str, source: str, index: int, key: str, text: object) -> Document | None:
        checked = check_text(self.skipped, where, text)
        return Document(source, index, key, checked) if checked is not None else None


def _check_tar_end(tar: tarfile.TarFile) -> None:
    """tarfile ends a stream quietly where a header is cut short or missing; a whole archive ends
    with a block of zeros, so the last header read is a full block."""
    stream = tar.fileobj
    if stream is not None and stream.tell() - tar.offset != tarfile.BLOCKSIZE:
        raise tarfile.ReadError("the archive stops without its end-of-archive block")


def check_text(skipped: Skipped, where: str, text: object) -> str | None:
    """The text when it can be a document (bytes are decoded as UTF-8), else None, skipped and counted."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            skipped.add(where, NOT_UTF8, f" ({exc.reason} at byte {exc.start})")
            return None
    if text is None:
        skipped.add(where, NO_TEXT, " (null)")
        return None
    if not isinstance(text, str):
        skipped.add(where, NOT_STRING, f" (a {type(text).__name__})")
        return None
    try:
        text.encode("utf-8")  # a JSON escape can make a lone surrogate, which no tokenizer takes
    except UnicodeEncodeError as exc:
        skipped.add(where, NOT_UTF8, f" ({exc.reason} at character {exc.start})")
        return None
    if not text.strip():
        skipped.add(where, EMPTY)
        return None
    return text


def _check_text_column(path: Path, schema: pa.Schema, column: str) -> None:
    if schema.get_field_index(column) < 0:
        names = ", ".join(f"{f.name}: {f.type}" for f in schema)
        raise DataError(f"{path}: no column {column!r} (its columns: {names}); name the text column")
    kind = schema.field(column).type
    values = kind.value_type if pa.types.is_dictionary(kind) else kind  # pandas categoricals: read decoded
    if not (pa.types.is_string(values) or pa.types.is_large_string(values) or pa.types.is_binary(values)
            or pa.types.is_large_binary(values)):
        raise DataError(f"{path}: column {column!r} is {kind}, not text")


def _zstandard(path: Path) -> Any:
    """The zstandard module, which Stoker does not depend on: ConfigError naming it when it is missing."""
    try:
        return importlib.import_module("zstandard")
    except ImportError:
        raise ConfigError(f"{path}: reading .zst files needs the `zstandard` package "
                          f"(pip install zstandard), or decompress it first") from None


def _read_errors(path: Path) -> tuple[type[BaseException], ...]:
    """What reading the file can raise for damaged or mislabelled bytes: zstandard's own error is no OSError."""
    if path.name.lower().endswith(".zst"):
        return (*_CUT_SHORT, _zstandard(path).ZstdError)
    return _CUT_SHORT


def first_line(path: Path) -> bytes:
    """The file's first line, decompressed as its name says; DataError naming the file, with the library's
    words, when it cannot be read at all (a plain file named .gz, say)."""
    try:
        with _open_lines(path) as lines:
            return lines.readline()
    except _read_errors(path) as exc:
        raise DataError(f"{path}: unreadable as {path.suffix or 'text'}: {type(exc).__name__}: {exc}") from exc


def _open_lines(path: Path) -> io.BufferedIOBase:
    """The file's bytes, decompressed as its name says, to be read line by line."""
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".zst"):
        raw = open(path, "rb")
        reader = _zstandard(path).ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
        return io.BufferedReader(reader)
    return open(path, "rb")


@dataclass(frozen=True)
class CallableSource:
    """Your own documents: `module:Name`, a callable that takes no arguments and yields texts (str or
    UTF-8 bytes) or `Document`s. `version` pins what provides it, as a job pins its transform:
    `pin_source` fills it in where the job is made, and a process that imports another version
    refuses it (`SourceRefused`)."""

    name: str
    version: str = ""

    def documents(self, skipped: Skipped | None = None) -> Iterator[Document]:
        """Every document the callable yields, checked as a file's are; DataError when there is none."""
        skipped = skipped if skipped is not None else Skipped()
        made, version = _import_source(self.name)
        if self.version and version != self.version:
            raise SourceRefused(f"source {self.name!r} is {version} here, the job runs {self.version}")
        try:
            result = made()
            if isinstance(result, str | bytes | bytearray | memoryview):  # iterating it would make each
                raise SourceRefused(  # character (or byte) a document
                    f"source {self.name!r} returned one {type(result).__name__}, not an iterable of documents: "
                    f"return or yield a list or generator of texts (wrap one text as [text])")
            items = iter(result)
        except SourceRefused:
            raise
        except Exception as exc:  # your code's own failure, or a callable that yields nothing
            raise DataError(f"source {self.name!r} gave no documents: {type(exc).__name__}: {exc}") from None
        count = 0
        for index, item in enumerate(_guarded(self.name, items)):
            where = f"{self.name}: item {index}"
            if isinstance(item, Document):
                text = check_text(skipped, where, item.text)
                doc = item if text is not None else None
            else:
                text = check_text(skipped, where, item)
                doc = Document(self.name, index, str(index), text) if text is not None else None
            if doc is not None:
                count += 1
                yield doc
        skipped.report(self.name)
        if not count:
            raise DataError(f"source {self.name!r}: no documents ({skipped.total} skipped: {skipped.summary()})")


def _guarded(name: str, items: Iterator[object]) -> Iterator[object]:
    """The callable's items; what its code raises on the way becomes one DataError naming the source (a
    folder's error names its file; this one names the callable, so a user can tell which of theirs broke)."""
    index = 0
    while True:
        try:
            item = next(items)
        except StopIteration:
            return
        except Exception as exc:  # your code's own failure, part way
            raise DataError(f"source {name!r} failed after {index} item(s): {type(exc).__name__}: {exc}") from exc
        yield item
        index += 1


def pin_source(name: str) -> CallableSource:
    """The source named, pinned to the version of what provides it here (SourceRefused when it
    does not import)."""
    _, version = _import_source(name)
    return CallableSource(name, version)


def _import_source(name: str) -> tuple[Callable[[], Iterable[object]], str]:
    if not IMPORT_PATH.fullmatch(name):
        raise SourceRefused(f"source {name!r}: give package.module:name, a callable that yields texts")
    try:
        obj, version = import_named(name, what="source")
    except TransformError as exc:
        raise SourceRefused(str(exc)) from None
    if not callable(obj):
        raise SourceRefused(f"source {name!r} is a {type(obj).__name__}, not a callable that yields texts")
    return cast(Callable[[], Iterable[object]], obj), version
