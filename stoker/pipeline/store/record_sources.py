"""Where `stoker prepare` reads records from: (key, label, bytes), whatever held them.

pipeline.prepare checks, transcodes, shuffles and writes records and does not care where they
came from; a source only finds its records and their labels. This module holds what every source
shares (the record, the files a SRC argument names, the label rule) and the ImageNet-layout
folder; WebDataset tars are pipeline.store.tar_records, Parquet and Arrow tables pipeline.store.table_records.

A record a source cannot use (no label, a label that is not an integer, no image) comes with the
reason instead of bytes, so prepare skips and counts it as it does an undecodable JPEG. A source
that cannot be read at all (nothing at SRC, not a tar, a missing column) raises ValueError naming
the file before any work starts.
"""

from __future__ import annotations

import glob
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stoker.pipeline.store.stats import image_files
from stoker.protos.errors import NotFound

# Labels are stored as int32 and the manifest lists one class name per label up to the largest:
# a bound keeps a stray huge label from making a manifest of billions of names.
MAX_LABEL = (1 << 24) - 1
_RANGE = re.compile(r"\{(-?\d+)\.\.(-?\d+)\}")
_LIST = re.compile(r"\{([^{}]*,[^{}]*)\}")
_INTEGER = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class Record:
    """One sample as a source found it. `where` names it in reports (a file, or a file and the
    sample in it); `data` None means "read the file at `where`", which the pool does in parallel."""

    key: str
    label: int
    where: str
    data: bytes | None = None
    skipped: str | None = None  # why the record cannot be stored; then nothing else is used


class RecordSource:
    """A data set's records. `classes` is None when the labels are bare integers: prepare then
    names the classes "0".."N" from the largest label it stored."""

    description: str = ""  # for messages: what SRC was
    noun: str = "record"  # what one skipped item is called in prepare's summary
    classes: list[str] | None = None
    count: int | None = None  # records expected, where known without reading them (a progress total)

    def records(self) -> Iterator[Record]:
        """Every record, in the source's own order."""
        raise NotImplementedError

    def shuffled_records(self, seed: int) -> Iterator[Record] | None:
        """Every record in a seeded random order, where the source can give one without reading
        the data first; None where it cannot (prepare then shuffles what it stored itself)."""
        return None


class FolderSource(RecordSource):
    """`SRC/train/<class>/*` (or `SRC/<class>/*`): the class is the folder, the key the file's stem.
    The file list is shuffled before any file is read, so prepare writes in that order directly."""

    noun = "file"

    def __init__(self, src: str | Path) -> None:
        self.description = str(src)
        self.files = image_files(src)
        if not self.files:
            raise NotFound(f"{src}: no images found in {src}/train/<class>/ or {src}/<class>/"
                                    + _other_format_hint(src))
        self.classes = sorted({p.parent.name for p in self.files})
        self.count = len(self.files)
        self._label_of = {name: i for i, name in enumerate(self.classes)}

    def records(self) -> Iterator[Record]:
        return (Record(p.stem, self._label_of[p.parent.name], str(p)) for p in self.files)

    def shuffled_records(self, seed: int) -> Iterator[Record]:
        files = list(self.files)
        random.Random(seed).shuffle(files)
        return (Record(p.stem, self._label_of[p.parent.name], str(p)) for p in files)


def _other_format_hint(src: str | Path) -> str:
    """A pointer to the sub-command that reads SRC, when SRC looks like tars or tables."""
    path = Path(src)
    suffixes = {path.suffix.lower()} if path.is_file() else \
        {p.suffix.lower() for p in path.iterdir() if p.is_file()} if path.is_dir() else set()
    if suffixes & {".tar", ".tgz", ".gz"}:
        return "; for WebDataset tar shards use `stoker prepare webdataset`"
    if suffixes & {".parquet", ".arrow", ".feather", ".ipc"}:
        return "; for Parquet or Arrow tables use `stoker prepare parquet`"
    return ""


def expand_braces(pattern: str) -> list[str]:
    """`a-{000..002}.tar` -> a-000.tar a-001.tar a-002.tar, and `{train,val}` -> both: the
    WebDataset way of naming a set of shards (numbers keep the width of the first bound)."""
    found = [m for m in (_RANGE.search(pattern), _LIST.search(pattern)) if m]
    if not found:
        return [pattern]
    match = min(found, key=lambda m: m.start())  # the leftmost first, as a shell expands them
    head, tail = pattern[:match.start()], pattern[match.end():]
    if match.re is _LIST:
        return [name for part in match[1].split(",") for name in expand_braces(head + part + tail)]
    low, high = int(match[1]), int(match[2])
    width = len(match[1]) if match[1].startswith("0") else 0
    step = 1 if high >= low else -1
    return [name for n in range(low, high + step, step) for name in expand_braces(f"{head}{n:0{width}d}{tail}")]


def source_files(src: str | Path, suffixes: tuple[str, ...], what: str) -> list[Path]:
    """The files SRC names: a file; a folder's files with one of `suffixes` (that folder only,
    so a data set's other splits beside it are not swept in); or a glob and brace pattern."""
    path = Path(src)
    if path.is_file():
        return [path]
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(suffixes))
        if not found:
            raise NotFound(f"{src}: no {what} files ({', '.join(suffixes)}) in this folder (its "
                                    f"subfolders are not searched: give a pattern such as '{src}/**/*{suffixes[0]}')")
        return found
    names = sorted({name for part in expand_braces(str(src)) for name in glob.glob(part, recursive=True)})
    found = [Path(name) for name in names if Path(name).is_file()]
    if not found:
        raise NotFound(f"{src}: no such file or folder, and no file matches it as a pattern")
    return found


def label_problem(label: int | None, classes: int | None = None) -> str | None:
    """Why `label` cannot be stored, or None: labels are 0..MAX_LABEL, and below the number of
    named classes where the source names them."""
    if label is None:
        return "no label"
    high = MAX_LABEL if classes is None else classes - 1
    if not 0 <= label <= high:
        named = f" (the source names {classes} classes)" if classes is not None else ""
        return f"label {label} is outside 0..{high}{named}"
    return None


def parse_label(value: object) -> int | None:
    """An integer label from a JSON value or text ("7", 7); None for anything else (7.5, "cat", true)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        return int(value.strip())
    return None
