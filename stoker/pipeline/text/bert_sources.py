"""What `stoker prepare wikipedia` reads: BERT's own text format, or any document source.

BERT's `create_pretraining_data` format (one sentence or paragraph a line, a blank line between
documents) stays the reading of a `.txt` file, of any file no document reader takes, and of a folder
or pattern of `.txt` files: what `prepare wikipedia` always read. A JSONL, Parquet or WebDataset tar
source (a file, a folder or a pattern of them) and a `package.module:Name` source of your own are
read as documents by stoker.pipeline.text.sources, as `stoker prepare tokens` reads them, with the
same options (`--text-field`, `--source-name`: stoker.pipeline.text.token_prepare's fields, spelt
once); `--documents` reads `.txt` files that way too, one document each. A folder or pattern that
holds both kinds is refused: which reading was meant cannot be told. The files BERT's folder keeps
beside its text (`vocab.txt`, `titles.txt`, `ATTRIBUTION.txt`) are never read as text.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from stoker.pipeline.store.tar_records import TAR_SUFFIXES
from stoker.pipeline.text.sources import (
    DEFAULT_TEXT_FIELD,
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    CallableSource,
    TextSource,
    pin_source,
    text_source_files,
)
from stoker.pipeline.text.token_prepare import NamedSkips, TokenPrepareConfig, document_key, refuse_json_arrays
from stoker.pipeline.transforms import IMPORT_PATH
from stoker.protos.errors import ConfigError, NotFound

BERT_TEXT = "bert-text"  # read_as: one sentence a line, a blank line between documents
DOCUMENTS = "documents"  # read_as: stoker.pipeline.text.sources' documents, each one document
SIDE_FILES = ("vocab.txt", "titles.txt", "ATTRIBUTION.txt")
DOCUMENT_SUFFIXES = JSONL_SUFFIXES + PARQUET_SUFFIXES + TAR_SUFFIXES


def _token_option(name: str) -> Any:
    """`stoker prepare tokens`' option `name` (default, help and all), so both commands spell it once."""
    found = next(f for f in fields(TokenPrepareConfig) if f.name == name)
    return field(default=found.default, metadata=found.metadata)


@dataclass(frozen=True)
class DocumentOptions:
    """How SRC is read: `stoker prepare tokens`' source options, and whether .txt files are documents."""

    documents: bool = field(default=False, metadata={
        "help": "read .txt files as documents, one each, as `stoker prepare tokens` does (default: BERT's format, "
                "one sentence a line, a blank line between documents)"})
    text_field: str = _token_option("text_field")
    source_name: str = _token_option("source_name")


class BertSource:
    """SRC and how it is read (`read_as`): `files` in BERT's format, or documents from `reader`, made (and its
    settings checked) before any document is read."""

    def __init__(self, src: str, read_as: str, files: tuple[Path, ...] = (),
                 reader: TextSource | CallableSource | None = None,
                 options: DocumentOptions = DocumentOptions()) -> None:
        self.src, self.read_as, self.files, self.reader, self.options = src, read_as, files, reader, options

    def texts(self, skipped: NamedSkips) -> Iterator[tuple[str, str, str]]:
        """(key, where, text) of every document of a documents source, in the source's order (`where` names it
        in a skip, as the token path does); what cannot be a document is skipped, counted and named."""
        if isinstance(self.reader, CallableSource):
            documents = self.reader.documents(skipped)
        elif self.reader is not None:
            self.reader.skipped = skipped
            documents = self.reader.documents()
        else:
            raise ConfigError(f"{self.src} is read as BERT-format text, not as documents")
        for doc in documents:
            yield document_key(doc, self.src), f"{doc.source}:{doc.index}", doc.text

    def record(self) -> dict[str, Any]:
        """What the manifest says made the set: the source's name, how it was read, and its options."""
        code = self.reader if isinstance(self.reader, CallableSource) else None
        name = self.options.source_name or (self.src if code else Path(self.src.rstrip("/")).name or self.src)
        made: dict[str, Any] = {"source": name, "read_as": self.read_as}
        if self.read_as == DOCUMENTS:
            made["text_field"] = self.options.text_field
        if code is not None:
            made["version"] = code.version
        return made


def text_files(src: str | Path) -> list[Path]:
    """BERT-format files: the file, or a folder's .txt files (below it too) but its side files."""
    src = Path(src)
    if src.is_file():
        return [src]
    if src.is_dir():
        return sorted(p for p in src.rglob("*.txt") if p.name not in SIDE_FILES and p.is_file())
    raise NotFound(f"{src}: no such file or folder")


def _is_documents(path: Path) -> bool:
    return path.name.lower().endswith(DOCUMENT_SUFFIXES)


def _listed(src: str, documents: bool) -> list[Path]:
    """Every file SRC names that some reading takes, a folder's or a pattern's side files left out; a file
    named alone is BERT's unless `documents` (then it must be of a kind the documents reader takes)."""
    path = Path(src)
    if path.is_file():
        return text_source_files(src) if documents else [path]
    if path.is_dir():
        found = [p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")]
        return sorted(p for p in found if p.name not in SIDE_FILES and (_is_documents(p) or p.suffix == ".txt"))
    if not any(c in src for c in "*?[{"):
        raise NotFound(f"{src}: no such file or folder")
    return [p for p in text_source_files(src) if p.name not in SIDE_FILES]


def bert_source(src: str | Path, options: DocumentOptions = DocumentOptions()) -> BertSource:
    """How SRC is read (see the module's docstring); ConfigError where that cannot be told or an option cannot
    apply, and a documents source's own refusals (a missing column, not a tar), before anything is read."""
    text = str(src)
    if IMPORT_PATH.fullmatch(text) and not Path(text).exists():
        return BertSource(text, DOCUMENTS, reader=pin_source(text), options=options)
    listed = _listed(text, options.documents)
    documents = [p for p in listed if _is_documents(p)]
    bert = [p for p in listed if not _is_documents(p)]
    if documents and bert and not options.documents:
        raise ConfigError(f"{src}: holds both BERT-format text ({bert[0]}) and document files ({documents[0]}): "
                          f"give --documents to read them all as documents, or one kind of file")
    if documents or options.documents:
        reader = TextSource(text, text_field=options.text_field)
        reader.files = listed
        refuse_json_arrays(listed)
        return BertSource(text, DOCUMENTS, tuple(listed), reader, options)
    if options.text_field != DEFAULT_TEXT_FIELD:
        raise ConfigError(f"--text-field names a JSONL or Parquet field, and {src} is read as BERT-format text "
                          f"(one sentence a line): give --documents, or a JSONL or Parquet source")
    files = text_files(text) if Path(text).exists() else bert
    if not files:
        raise NotFound(f"{src}: no .txt files")
    return BertSource(text, BERT_TEXT, tuple(files), options=options)
