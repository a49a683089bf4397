"""`stoker prepare wikipedia`: BERT-format text -> Parquet shards of tokenized documents.

The input is the format of BERT's `create_pretraining_data`: one sentence per line and a
blank line between documents (a file, or a folder of *.txt files). Lines holding several
sentences are split (pipeline.text.sentences). Tokenizing runs in the Rust `tokenizers`
library, which spreads each chunk of sentences over every core. A document that is not
UTF-8, or that has no tokens left, is counted and skipped. Documents are shuffled (seeded)
before they are written, so a contiguous work unit mixes sources.
"""

from __future__ import annotations

import random
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from stoker.pipeline.kinds import WIKIPEDIA
from stoker.pipeline.store.shards import MANIFEST_NAME, Manifest, ShardInfo, file_sha256
from stoker.pipeline.store.storage import join, staged
from stoker.pipeline.text.docs import write_doc_shard
from stoker.pipeline.text.sentences import split_sentences
from stoker.pipeline.text.vocab import Vocab
from stoker.protos.errors import DataError, NotFound

_BLANK_LINES = re.compile(rb"\r?\n(?:[ \t]*\r?\n)+")
TEXT_KIND = WIKIPEDIA.name


@dataclass(frozen=True)
class TextPrepareConfig:
    docs_per_shard: int = field(default=4096, metadata={
        "help": "documents per shard (default %(default)s)", "check": "positive"})
    seed: int = field(default=0, metadata={
        "help": "the seed of the documents' order (default %(default)s)", "check": "seed"})
    chunk_docs: int = 512  # documents tokenized per call into the Rust tokenizer
    lowercase: bool = field(default=True, metadata={
        "help": "do not lowercase (for a cased vocab)", "flag": "--cased"})
    progress: bool = True


@dataclass
class TextPrepareResult:
    manifest: Manifest
    skipped: list[dict[str, str]]
    sentences: int
    tokens: int


def text_files(src: str | Path) -> list[Path]:
    src = Path(src)
    if src.is_file():
        return [src]
    if src.is_dir():
        return sorted(p for p in src.rglob("*.txt") if p.name != "vocab.txt" and p.is_file()
                      and p.name not in ("titles.txt", "ATTRIBUTION.txt"))
    raise NotFound(f"{src}: no such file or folder")


def raw_documents(files: list[Path]) -> Iterator[tuple[str, bytes]]:
    """(key, raw bytes) of every document; the key is `<file name>#<ordinal>`."""
    for path in files:
        data = path.read_bytes()
        for ordinal, chunk in enumerate(c for c in _BLANK_LINES.split(data) if c.strip()):
            yield f"{path.name}#{ordinal}", chunk


def _sentences(raw: bytes) -> list[str]:
    text = raw.decode("utf-8")  # strict: an undecodable document is skipped by the caller
    return [s for line in text.splitlines() for s in split_sentences(line)]


def prepare_wikipedia(src: str | Path, dst: str | Path, vocab_path: str | Path,
                      cfg: TextPrepareConfig = TextPrepareConfig()) -> TextPrepareResult:
    vocab = Vocab.load(vocab_path)
    tokenizer = vocab.tokenizer(lowercase=cfg.lowercase)
    files = text_files(src)
    if not files:
        raise NotFound(f"{src}: no .txt files")
    keys: list[str] = []
    docs: list[list[list[int]]] = []
    skipped: list[dict[str, str]] = []
    sentences_total = tokens_total = 0
    documents = list(raw_documents(files))
    bar = tqdm(total=len(documents), desc="tokenize", unit="doc", disable=not cfg.progress)
    for start in range(0, len(documents), cfg.chunk_docs):
        chunk = documents[start: start + cfg.chunk_docs]
        split: list[tuple[str, list[str]]] = []
        for key, raw in chunk:
            try:
                split.append((key, _sentences(raw)))
            except UnicodeDecodeError as exc:
                skipped.append({"path": key, "reason": f"not UTF-8 text: {exc.reason} at byte {exc.start}"})
        flat = [s for _, sentences in split for s in sentences]
        encoded = tokenizer.encode_batch(flat, add_special_tokens=False) if flat else []
        at = 0
        for key, sentences in split:
            ids = [e.ids for e in encoded[at: at + len(sentences)] if e.ids]
            at += len(sentences)
            if not ids:
                skipped.append({"path": key, "reason": "document has no tokens"})
                continue
            keys.append(key)
            docs.append(ids)
            sentences_total += len(ids)
            tokens_total += sum(len(s) for s in ids)
        bar.update(len(chunk))
    bar.close()
    if not docs:
        raise DataError(f"{src}: none of the {len(documents)} documents has any text")
    order = list(range(len(docs)))
    random.Random(cfg.seed).shuffle(order)
    with staged(dst) as out:
        manifest = _write_shards(out, keys, docs, order, vocab_path, vocab, skipped, cfg)
    manifest.uri = join(dst, MANIFEST_NAME)
    return TextPrepareResult(manifest, skipped, sentences_total, tokens_total)


def _write_shards(out: Path, keys: list[str], docs: list, order: list[int], vocab_path: str | Path, vocab,
                  skipped: list[dict[str, str]], cfg: TextPrepareConfig) -> Manifest:
    shards: list[ShardInfo] = []
    for first in range(0, len(order), cfg.docs_per_shard):
        rows = order[first: first + cfg.docs_per_shard]
        path = out / f"docs-{len(shards):05d}.parquet"
        write_doc_shard(str(path), [keys[i] for i in rows], [docs[i] for i in rows])
        shards.append(ShardInfo(path.name, len(rows), path.stat().st_size, file_sha256(path), first))
    shutil.copyfile(vocab_path, out / "vocab.txt")
    manifest = Manifest(kind=TEXT_KIND, classes=[], shards=shards, skipped=skipped, vocab="vocab.txt",
                        vocab_size=vocab.size, vocab_sha256=vocab.sha256)
    manifest.save(out / MANIFEST_NAME)
    return manifest
