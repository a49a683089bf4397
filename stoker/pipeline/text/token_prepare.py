"""`stoker prepare tokens`: any corpus, any tokenizer -> Parquet shards of token documents.

Documents come from stoker.pipeline.text.sources (JSONL, Parquet, WebDataset tars, .txt files, or your own
`module:Name` source), in its fixed order, and are tokenized in chunks by stoker.pipeline.text.tokenizer
(a tokenizer.json, or your own `module:Name`, pinned by fingerprint). Shards are written as the
documents stream past (`docs-per-shard` each), so a corpus never sits in memory whole; the order
within an epoch is the plan's to shuffle. The same input and tokenizer give the same bytes.

The manifest (kind `tokens`) lists the shards with their sha256, every skipped document with its
reason (what the source skips, and a document that tokenizes to nothing), and in `tokens`: the
tokenizer (`tokenizer.json` copied beside the manifest, or the `module:Name`), its fingerprint,
end-of-text and padding ids and vocabulary size, the source's name (and, for your own `module:Name`, the
`version` of what provides it), the tokens of each shard, and every document's tokens (`lengths.npy`,
sha256 pinned: stoker.pipeline.text.token_shards), from which the plan knows each unit's batches ahead.

`online` writes the documents' text instead of their tokens (stoker.pipeline.text.text_shards: the same
documents, skips and lengths, counted with the tokenizer now), and the manifest's `tokens` says `online`
and the tokenizers version: the workers tokenize each unit as they make its rows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from stoker.pipeline.kinds import TOKENS
from stoker.pipeline.store.files import replace_atomically
from stoker.pipeline.store.shards import MANIFEST_NAME, Manifest, ShardInfo, file_sha256
from stoker.pipeline.store.storage import is_remote, join, read_bytes, staged
from stoker.pipeline.text.docs import IPC_SUFFIX
from stoker.pipeline.text.sources import (
    DEFAULT_TEXT_FIELD,
    JSONL_SUFFIXES,
    CallableSource,
    Document,
    Skipped,
    TextSource,
    first_line,
    pin_source,
)
from stoker.pipeline.text.text_shards import ONLINE, write_text_shard
from stoker.pipeline.text.token_shards import write_lengths, write_token_shard
from stoker.pipeline.text.tokenizer import TextTokenizer, TokenizerConfig
from stoker.pipeline.transforms import IMPORT_PATH
from stoker.protos.errors import ConfigError, DataError

TOKENIZER_FILE = "tokenizer.json"
NO_TOKENS = "document has no tokens"


@dataclass(frozen=True)
class TokenPrepareConfig:
    docs_per_shard: int = field(default=4096, metadata={
        "help": "documents per shard (default %(default)s)", "check": "positive"})
    text_field: str = field(default=DEFAULT_TEXT_FIELD, metadata={
        "help": "JSONL and Parquet: the field (column) that holds a document's text (default %(default)s)",
        "metavar": "FIELD"})
    source_name: str = field(default="", metadata={
        "help": "the name the manifest gives this source (default: SRC's file or folder name, or the callable)",
        "metavar": "NAME"})
    online: bool = field(default=False, metadata={
        "help": "write the documents' text, not their tokens: the workers tokenize each unit as they make its "
                "rows (every document's token count is still counted now, for the plan)"})
    chunk_docs: int = 512  # documents tokenized per call into the tokenizer
    progress: bool = True


@dataclass
class TokenPrepareResult:
    manifest: Manifest
    skipped: list[dict[str, str]]
    documents: int
    tokens: int


@dataclass
class NamedSkips(Skipped):
    """`Skipped`, each document also named (a manifest lists every one)."""

    named: list[dict[str, str]] = field(default_factory=list)

    def add(self, where: str, reason: str, detail: str = "") -> None:
        super().add(where, reason, detail)
        self.named.append({"path": where, "reason": f"{reason}{detail}"})


def tokenizer_config(name: str) -> TokenizerConfig:
    """`--tokenizer`: a tokenizer.json (a path or URI), or `package.module:Name` where no such file is."""
    if IMPORT_PATH.fullmatch(name) and not Path(name).exists() and not name.endswith(".json"):
        return TokenizerConfig(factory=name)
    return TokenizerConfig(path=name)


def _documents(src: str, cfg: TokenPrepareConfig, skipped: NamedSkips) -> tuple[Iterator[Document], dict[str, str]]:
    """The source's documents, and what the manifest records of it: its default name, and for your own code
    the version of what provides it (as `prepare wikipedia` records it), pinned as a transform is."""
    if IMPORT_PATH.fullmatch(src) and not Path(src).exists():
        source: CallableSource = pin_source(src)
        return source.documents(skipped), {"source": src, "version": source.version}
    files = TextSource(src, text_field=cfg.text_field)
    refuse_json_arrays(files.files)
    files.skipped = skipped
    return files.documents(), {"source": Path(src.rstrip("/")).name or src}


def document_key(doc: Document, src: str) -> str:
    """A document's key in the shards, unique within the source: its key, after its file's path below SRC
    (or its file's name) where the key alone is not (a JSONL line number, a Parquet row)."""
    path, top = Path(doc.source), Path(src)
    if not path.exists():  # a callable's document
        return doc.key
    rel = path.relative_to(top).as_posix() if top.is_dir() and path.is_relative_to(top) else path.name
    return doc.key if rel == doc.key else f"{rel}:{doc.key}"


def _chunks(items: Iterable[Document], size: int) -> Iterator[list[Document]]:
    chunk: list[Document] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def prepare_tokens(src: str | Path, dst: str | Path, tokenizer: str | TokenizerConfig,
                   cfg: TokenPrepareConfig = TokenPrepareConfig()) -> TokenPrepareResult:
    """Tokenize every document of `src` into token shards under `dst` (see the module's docstring)."""
    refuse_overlap(dst, f"--out {dst}", source_key(str(src)), "SRC",
                   "give the token set a folder apart from SRC (writing there would put its shards among SRC's)")
    config = tokenizer if isinstance(tokenizer, TokenizerConfig) else tokenizer_config(tokenizer)
    tok = config.load()  # refused here, in one line, before any document is read
    skipped = NamedSkips()
    documents, made = _documents(str(src), cfg, skipped)
    with staged(dst) as out:
        writer = _ShardWriter(out, cfg.online)
        bar = tqdm(desc="tokenize", unit="doc", disable=not cfg.progress)
        for chunk in _chunks(documents, cfg.chunk_docs):
            for doc, ids in zip(chunk, tok.encode_batch([d.text for d in chunk]), strict=True):
                if ids.size:
                    writer.add(document_key(doc, str(src)), ids, cfg.docs_per_shard, doc.text)
                else:
                    skipped.add(f"{doc.source}:{doc.index}", NO_TOKENS)
            bar.update(len(chunk))
        bar.close()
        writer.flush()
        if not writer.shards:
            raise DataError(f"{src}: none of its documents has any tokens ({skipped.total} skipped: "
                            f"{skipped.summary()})")
        made["source"] = _safe(cfg.source_name or made["source"])
        manifest = _manifest(out, writer, config, tok, made, skipped.named)
    manifest.uri = join(dst, MANIFEST_NAME)
    return TokenPrepareResult(manifest, skipped.named, writer.documents, sum(writer.tokens))


class _ShardWriter:
    """Documents into numbered shards of `docs_per_shard` each, as they come."""

    def __init__(self, out: Path, online: bool = False) -> None:
        self.out = out
        self.online = online  # text shards (the workers tokenize), not token shards
        self.shards: list[ShardInfo] = []
        self.tokens: list[int] = []
        self.lengths: list[int] = []  # every document's tokens, by sample id
        self.documents = 0
        self._keys: list[str] = []
        self._docs: list[np.ndarray] = []
        self._texts: list[str] = []
        self._sizes: list[int] = []

    def add(self, key: str, ids: np.ndarray, per_shard: int, text: str = "") -> None:
        self._keys.append(key)
        self._sizes.append(int(ids.size))
        if self.online:
            self._texts.append(text)
        else:
            self._docs.append(ids)
        if len(self._keys) >= per_shard:
            self.flush()

    def flush(self) -> None:
        if not self._keys:
            return
        path = self.out / (f"text-{len(self.shards):05d}.parquet" if self.online
                           else f"tokens-{len(self.shards):05d}{IPC_SUFFIX}")
        if self.online:
            write_text_shard(str(path), self._keys, self._texts)
        else:
            write_token_shard(str(path), self._keys, self._docs)
        self.shards.append(ShardInfo(path.name, len(self._keys), path.stat().st_size, file_sha256(path),
                                     self.documents))
        self.tokens.append(sum(self._sizes))
        self.lengths += self._sizes
        self.documents += len(self._keys)
        self._keys, self._docs, self._texts, self._sizes = [], [], [], []


def _manifest(out: Path, writer: _ShardWriter, config: TokenizerConfig, tok: TextTokenizer, made: dict[str, str],
              skipped: list[dict[str, str]]) -> Manifest:
    if config.path:
        copy_file(config.path, out / TOKENIZER_FILE, "tokenizer")  # the bytes its fingerprint hashes
    tokens = {"tokenizer": TOKENIZER_FILE if config.path else config.factory, "fingerprint": tok.fingerprint,
              "eot": tok.eot_id, "pad": tok.pad_id, "vocab_size": tok.vocab_size, **made,
              "shard_tokens": writer.tokens, "total": sum(writer.tokens)} | write_lengths(out, np.array(writer.lengths))
    if writer.online:
        import tokenizers

        tokens |= {ONLINE: True, "tokenizers_version": tokenizers.__version__}
    manifest = Manifest(kind=TOKENS.name, classes=[], shards=writer.shards, skipped=skipped,
                        vocab_size=tok.vocab_size, tokens=tokens)
    manifest.save(out / MANIFEST_NAME)
    return manifest


def refuse_json_arrays(files: Iterable[Path]) -> None:
    """Refuse, once and before any document is read, a JSON Lines file whose first line is `[`: one JSON array
    (a `.json` file as most tools write it), each of whose lines would otherwise be skipped as not JSON."""
    for path in files:
        if not path.name.lower().endswith(JSONL_SUFFIXES):
            continue
        if first_line(path).strip() == b"[":
            raise DataError(f"{path}: one JSON array (its first line is `[`), not JSON Lines: write one JSON "
                            f"object a line (for example `jq -c '.[]' {path.name}`)")


def copy_file(uri: str, target: Path, what: str) -> None:
    """`uri`'s bytes as `target`, under a temporary name renamed over it: never written through a hard link."""
    data = read_bytes(uri)
    replace_atomically(target, lambda f: f.write(data), what)


def folder_key(uri: str) -> str:
    """A manifest's folder as a comparable key: resolved for a local one, the URI without a trailing / else."""
    folder = uri.rsplit("/", 1)[0] if uri.endswith(".json") else uri
    return folder.rstrip("/") if is_remote(folder) else str(Path(folder.removeprefix("file://")).resolve())


def source_key(src: str) -> str:
    """What a prepare reads, as a comparable key: the file or folder itself, a pattern's folder, "" for a
    callable (it names no place)."""
    if IMPORT_PATH.fullmatch(src) and not Path(src).exists():
        return ""
    fixed = re.split(r"[*?\[{]", src, maxsplit=1)
    if len(fixed) > 1:  # a pattern: the folder its files are in
        src = fixed[0].rsplit("/", 1)[0] if "/" in fixed[0] else "."
    return src.rstrip("/") if is_remote(src) else str(Path(src.removeprefix("file://")).resolve())


def refuse_overlap(out: str | Path, shown: str, held: str, whose: str, fix: str,
                   error: type[ConfigError] = ConfigError) -> None:
    """Refuse (one line, before anything is written) an output folder that is, is inside or holds `held`
    (a key of folder_key or source_key): a prepare writing there would overwrite or tangle with what it reads.
    `shown` names the output as the user gave it ("--out DIR"), `whose` what it overlaps, `fix` what to do."""
    target = folder_key(str(out))
    if not held or not (target == held or target.startswith(held + "/") or held.startswith(target + "/")):
        return
    where = "is" if target == held else "is inside" if target.startswith(held + "/") else "holds"
    raise error(f"{shown} {where} {whose} {held}: {fix}")


def _safe(name: str) -> str:
    """A name as a manifest keeps it: printable, one line, at most 200 characters."""
    return re.sub(r"[^\x20-\x7e]", "?", name)[:200]
