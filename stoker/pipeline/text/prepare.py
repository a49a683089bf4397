"""`stoker prepare wikipedia`: BERT's text -> Parquet shards of tokenized documents.

The input is the format of BERT's `create_pretraining_data` (one sentence per line and a blank
line between documents: a file, or a folder of *.txt files), or any document source
stoker.pipeline.text.sources reads (JSONL, Parquet, WebDataset tars, your own code), which
stoker.pipeline.text.bert_sources tells apart. A document's lines are split into sentences
(stoker.pipeline.text.sentences) either way. Tokenizing runs in the Rust `tokenizers` library,
which spreads each chunk of sentences over every core. A document that is not UTF-8, or that
has no tokens left, is counted, named and skipped. Documents are shuffled (seeded) before they
are written, so a contiguous work unit mixes sources.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from tokenizers import Tokenizer
from tqdm import tqdm

from stoker.pipeline.kinds import WIKIPEDIA
from stoker.pipeline.store.shards import MANIFEST_NAME, Manifest, ShardInfo, file_sha256
from stoker.pipeline.store.storage import join, staged
from stoker.pipeline.text.bert_sources import BERT_TEXT, BertSource, DocumentOptions, bert_source
from stoker.pipeline.text.docs import write_doc_shard
from stoker.pipeline.text.sentences import split_sentences
from stoker.pipeline.text.token_prepare import NamedSkips, copy_file, refuse_overlap, source_key
from stoker.pipeline.text.vocab import Vocab
from stoker.protos.errors import DataError

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
    reading: DocumentOptions = field(default=DocumentOptions(), metadata={"options": True})  # what SRC is


@dataclass
class TextPrepareResult:
    manifest: Manifest
    skipped: list[dict[str, str]]
    sentences: int
    tokens: int


def raw_documents(files: Iterable[Path]) -> Iterator[tuple[str, bytes]]:
    """(key, raw bytes) of every document; the key is `<file name>#<ordinal>`."""
    for path in files:
        data = path.read_bytes()
        for ordinal, chunk in enumerate(c for c in _BLANK_LINES.split(data) if c.strip()):
            yield f"{path.name}#{ordinal}", chunk


def sentences_of(text: str) -> list[str]:
    """A document's sentences as BERT's input makes them: its lines, each split (stoker.pipeline.text.sentences)."""
    return [s for line in text.splitlines() for s in split_sentences(line)]


def _bert_texts(files: Iterable[Path], skipped: NamedSkips) -> Iterator[tuple[str, str, str]]:
    """(key, where, text) of every BERT-format document, named by its key; one that is not UTF-8 is skipped
    and named."""
    for key, raw in raw_documents(files):
        try:
            yield key, key, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            skipped.add(key, "not UTF-8 text", f": {exc.reason} at byte {exc.start}")


@dataclass
class _Tokenized:
    """The documents that kept tokens, each a list of sentences of token ids, and what was read."""

    keys: list[str] = field(default_factory=list)
    docs: list[list[list[int]]] = field(default_factory=list)
    read: int = 0  # documents read, skipped ones too
    sentences: int = 0
    tokens: int = 0


def _tokenize(texts: Iterator[tuple[str, str, str]], tokenizer: Tokenizer, skipped: NamedSkips,
              cfg: TextPrepareConfig) -> _Tokenized:
    """Every document's sentences into token ids, a chunk of documents per call into the Rust tokenizer."""
    out = _Tokenized()
    bar = tqdm(desc="tokenize", unit="doc", disable=not cfg.progress)
    while chunk := list(islice(texts, cfg.chunk_docs)):
        split = [(key, where, sentences_of(text)) for key, where, text in chunk]
        flat = [s for _, _, sentences in split for s in sentences]
        encoded = tokenizer.encode_batch(flat, add_special_tokens=False) if flat else []
        at = 0
        for key, where, sentences in split:
            ids = [e.ids for e in encoded[at: at + len(sentences)] if e.ids]
            at += len(sentences)
            if not ids:
                skipped.add(where, "document has no tokens")
                continue
            out.keys.append(key)
            out.docs.append(ids)
            out.sentences += len(ids)
            out.tokens += sum(len(s) for s in ids)
        bar.update(len(chunk))
    bar.close()
    out.read = len(out.keys) + skipped.total
    return out


def prepare_wikipedia(src: str | Path, dst: str | Path, vocab_path: str | Path,
                      cfg: TextPrepareConfig = TextPrepareConfig()) -> TextPrepareResult:
    """Tokenize every document of `src` (BERT's format, or a documents source: cfg.reading) into shuffled
    shards under `dst`."""
    refuse_overlap(dst, f"DST {dst}", source_key(str(src)), "SRC",
                   "give the shards a folder apart from SRC (writing there would put them among SRC's)")
    vocab = Vocab.load(vocab_path)
    tokenizer = vocab.tokenizer(lowercase=cfg.lowercase)
    source = bert_source(src, cfg.reading)  # refused here, in one line, before any document is read
    skipped = NamedSkips()
    texts = _bert_texts(source.files, skipped) if source.read_as == BERT_TEXT else source.texts(skipped)
    made = _tokenize(texts, tokenizer, skipped, cfg)
    if not made.docs:
        raise DataError(f"{src}: none of the {made.read} documents has any text")
    order = list(range(len(made.docs)))
    random.Random(cfg.seed).shuffle(order)
    with staged(dst) as out:
        manifest = _write_shards(out, made, order, vocab_path, vocab, skipped.named, source, cfg)
    manifest.uri = join(dst, MANIFEST_NAME)
    return TextPrepareResult(manifest, skipped.named, made.sentences, made.tokens)


def _write_shards(out: Path, made: _Tokenized, order: list[int], vocab_path: str | Path, vocab,
                  skipped: list[dict[str, str]], source: BertSource, cfg: TextPrepareConfig) -> Manifest:
    shards: list[ShardInfo] = []
    for first in range(0, len(order), cfg.docs_per_shard):
        rows = order[first: first + cfg.docs_per_shard]
        path = out / f"docs-{len(shards):05d}.parquet"
        write_doc_shard(str(path), [made.keys[i] for i in rows], [made.docs[i] for i in rows])
        shards.append(ShardInfo(path.name, len(rows), path.stat().st_size, file_sha256(path), first))
    copy_file(str(vocab_path), out / "vocab.txt", "vocab")  # renamed into place: never through a hard link
    manifest = Manifest(kind=TEXT_KIND, classes=[], shards=shards, skipped=skipped, vocab="vocab.txt",
                        vocab_size=vocab.size, vocab_sha256=vocab.sha256, tokens=source.record())
    manifest.save(out / MANIFEST_NAME)
    return manifest
