"""WebDataset tar shards as records, read as a stream (nothing is extracted to disk).

The WebDataset convention: a sample is the run of consecutive members that share a key, the
member's path up to the first dot of its file name (`train/000123.jpg` and `train/000123.cls`
are sample `train/000123`); the rest of the name says what the member holds. The record's bytes
are its image member (`.jpg` or `.jpeg`, or what `data_ext` names), its label the integer text
of its `.cls` member, else a field (default `label`) of its `.json` member; with `label_field`
given, always that field. Gzipped tars (`.tar.gz`, `.tgz`) read the same way.
"""

from __future__ import annotations

import json
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path

from stoker.pipeline.store.record_sources import Record, RecordSource, label_problem, parse_label, source_files
from stoker.protos.errors import DataError

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
IMAGE_EXTS = ("jpg", "jpeg")
DEFAULT_LABEL_FIELD = "label"
_UNREADABLE = (tarfile.TarError, EOFError, OSError, zlib.error)


def split_name(name: str) -> tuple[str, str] | None:
    """(key, extension) of a member name, WebDataset's way; None for a name with no extension."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or not stem:
        return None
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def check_is_tar(path: Path) -> None:
    """DataError naming the file when it is not a tar at all (read before any work starts)."""
    try:
        with tarfile.open(path, "r|*") as tar:
            tar.next()
    except _UNREADABLE as exc:
        raise DataError(f"{path}: not a tar file ({exc})") from exc


class TarSource(RecordSource):
    """The samples of one or more WebDataset tars (a file, a folder of them, or a pattern)."""

    def __init__(self, src: str | Path, data_ext: tuple[str, ...] = IMAGE_EXTS, label_field: str | None = None) -> None:
        self.description = str(src)
        self.files = source_files(src, TAR_SUFFIXES, "tar")
        self.data_ext = tuple(e.lower().lstrip(".") for e in data_ext)
        self.label_field = label_field
        for path in self.files:  # a file that is not a tar at all stops here, before any work
            check_is_tar(path)

    def records(self) -> Iterator[Record]:
        for path in self.files:
            yield from self._file_records(path)

    def _file_records(self, path: Path) -> Iterator[Record]:
        """One tar's samples; a tar damaged part way is reported once, as one skipped record, after
        the samples read before the damage."""
        samples = 0
        try:
            with tarfile.open(path, "r|*") as tar:
                key: str | None = None
                members: dict[str, bytes] = {}
                for member in tar:
                    named = split_name(member.name) if member.isfile() else None
                    if named is None:
                        continue
                    if named[0] != key:
                        if key is not None:
                            samples += 1
                            yield self._record(path, key, members)
                        key, members = named[0], {}
                    stream = tar.extractfile(member)
                    members[named[1]] = stream.read() if stream is not None else b""
                if key is not None:
                    samples += 1
                    yield self._record(path, key, members)
        except _UNREADABLE as exc:
            yield Record("", 0, str(path), skipped=f"tar unreadable after {samples} sample(s), the rest of it "
                                                   f"is not stored: {type(exc).__name__}: {exc}")

    def _record(self, path: Path, key: str, members: dict[str, bytes]) -> Record:
        where = f"{path}:{key}"
        ext = next((e for e in self.data_ext if e in members), None)
        if ext is None:
            return Record(key, 0, where, skipped=f"no .{' or .'.join(self.data_ext)} member (it has "
                                                 f"{', '.join('.' + e for e in members) or 'none'})")
        label, problem = self._label(members)
        problem = problem or label_problem(label)
        if problem or label is None:  # no label is a problem: said to narrow the type
            return Record(key, 0, where, skipped=problem)
        return Record(key, label, where, data=members[ext])

    def _label(self, members: dict[str, bytes]) -> tuple[int | None, str | None]:
        if "cls" in members and self.label_field is None:
            text = members["cls"].decode("utf-8", "replace").strip()
            label = parse_label(text)
            return label, None if label is not None else f".cls holds {text[:40]!r}, not an integer"
        field = self.label_field or DEFAULT_LABEL_FIELD
        if "json" not in members:
            wanted = ".json member" if self.label_field else ".cls or .json member"
            return None, f"no label: no {wanted}"
        try:
            meta = json.loads(members["json"])
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return None, f".json is not JSON ({exc})"
        if not isinstance(meta, dict) or field not in meta:
            fields = ", ".join(map(str, meta)) if isinstance(meta, dict) else f"a JSON {type(meta).__name__}"
            return None, f"no label: .json has no {field!r} field ({fields or 'no fields'})"
        label = parse_label(meta[field])
        return label, None if label is not None else f".json's {field!r} is {meta[field]!r:.40}, not an integer"
