"""Parquet shards of tokenized documents (`doc_key`, `sentences`: list of token-id lists).

A reader flattens a whole shard into three numpy arrays (all token ids, sentence offsets,
document offsets), so example creation slices arrays instead of walking Python lists. The
shard's sha256 is checked against the manifest, and every document is validated once: a
document with no sentences, an empty sentence or a token id outside the vocabulary is
reported by `problem(row)` and skipped by the caller, never turned into a batch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from stoker.pipeline.store.files import replace_atomically
from stoker.pipeline.store.shards import ShardInfo
from stoker.pipeline.store.storage import filesystem
from stoker.protos.errors import DataError

DOC_SCHEMA = pa.schema([("doc_key", pa.string()), ("sentences", pa.list_(pa.list_(pa.int32())))])


class ShardError(DataError):
    """A shard that cannot be used at all (unreadable, wrong schema, checksum mismatch)."""


def write_doc_shard(path: str, keys: list[str], sentences: list[list[list[int]]]) -> None:
    table = pa.table([pa.array(keys, pa.string()), pa.array(sentences, DOC_SCHEMA.field("sentences").type)],
                     schema=DOC_SCHEMA)
    # to a temporary name, then renamed: a rerun never writes through a hard link to an older set's shard
    replace_atomically(path, lambda f: pq.write_table(table, f, row_group_size=1024, compression="zstd"), "doc shard")


@dataclass
class DocShard:
    """One shard's documents as flat arrays; document i's sentences are
    tokens[sent_offsets[j]:sent_offsets[j + 1]] for j in doc_offsets[i]:doc_offsets[i + 1]."""

    keys: list[str]
    tokens: np.ndarray  # int32, every token id of the shard
    sent_offsets: np.ndarray  # int64 (num_sentences + 1,)
    doc_offsets: np.ndarray  # int64 (num_docs + 1,)
    problems: dict[int, str]  # row -> why that document cannot be used

    def __len__(self) -> int:
        return len(self.keys)

    def key(self, row: int) -> str:
        return self.keys[row]

    def problem(self, row: int) -> str | None:
        return self.problems.get(row)

    def sentence_lengths(self, row: int) -> np.ndarray:
        a, b = self.doc_offsets[row], self.doc_offsets[row + 1]
        return np.diff(self.sent_offsets[a: b + 1])

    def sentence_span(self, row: int) -> tuple[int, int]:
        """[first, last + 1) global sentence numbers of a document."""
        return int(self.doc_offsets[row]), int(self.doc_offsets[row + 1])

    def token_span(self, first_sentence: int, stop_sentence: int) -> np.ndarray:
        """Token ids of sentences [first, stop) of the shard, concatenated (a view)."""
        return self.tokens[self.sent_offsets[first_sentence]: self.sent_offsets[stop_sentence]]


IPC_SUFFIX = ".arrow"  # token shards; every other text shard (and an older Stoker's token shards) is Parquet
IPC_MAGIC = b"ARROW1"  # how an Arrow IPC file begins (a Parquet one: PAR1): a shard is read as what it holds


def read_shard_table(uri: str, info: ShardInfo | None) -> pa.Table:
    """A text shard's table, its bytes checked against the manifest's sha256 first; ShardError if it cannot
    be read at all. Every text shard kind (BERT documents, token ids, online text) is read through here."""
    fs, path = filesystem(uri)
    try:
        with fs.open_input_stream(path) as stream:
            data = stream.read()
    except OSError as exc:
        raise ShardError(f"{uri}: unreadable ({exc})") from exc
    if info is not None and info.sha256 and hashlib.sha256(data).hexdigest() != info.sha256:
        raise ShardError(f"{uri}: sha256 does not match the manifest (corrupt or replaced shard)")
    ipc = data.startswith(IPC_MAGIC)
    try:
        if ipc:  # uncompressed Arrow IPC (token shards): its columns are views of `data`, nothing decoded
            return pa.ipc.open_file(pa.BufferReader(data)).read_all()
        # not read_table: its dataset layer costs as much again; a BufferReader reads the bytes in place
        return pq.ParquetFile(pa.BufferReader(data)).read()
    except (pa.ArrowException, OSError) as exc:
        raise ShardError(f"{uri}: not a readable {'Arrow IPC' if ipc else 'Parquet'} file ({exc})") from exc


def check_rows(uri: str, table: pa.Table, info: ShardInfo | None) -> None:
    """ShardError unless the shard holds as many documents as the manifest says."""
    if info is not None and table.num_rows != info.num_samples:
        raise ShardError(f"{uri}: {table.num_rows} documents, the manifest says {info.num_samples}")


def read_doc_shard(uri: str, info: ShardInfo | None, vocab_size: int) -> DocShard:
    """Read, verify and flatten one shard; ShardError if it cannot be used at all."""
    table = read_shard_table(uri, info)
    if not table.schema.equals(DOC_SCHEMA):
        raise ShardError(f"{uri}: schema {table.schema} is not {DOC_SCHEMA}")
    return flatten(table, vocab_size)


def flatten(table: pa.Table, vocab_size: int) -> DocShard:
    keys = table.column("doc_key").to_pylist()
    docs = table.column("sentences").combine_chunks()
    sentences = docs.flatten()  # one entry per sentence, nulls dropped with their parents' offsets
    doc_offsets = np.asarray(docs.offsets, dtype=np.int64)
    doc_offsets -= doc_offsets[0]  # offsets of a sliced array are not rebased; flatten() is
    sent_offsets = np.asarray(sentences.offsets, dtype=np.int64)
    sent_offsets -= sent_offsets[0]
    tokens = np.asarray(sentences.flatten().fill_null(-1), dtype=np.int32)
    problems = _problems(keys, docs, doc_offsets, sent_offsets, tokens, vocab_size)
    return DocShard(keys, tokens, sent_offsets, doc_offsets, problems)


def _problems(keys: list[str], docs: pa.ListArray, doc_offsets: np.ndarray, sent_offsets: np.ndarray,
              tokens: np.ndarray, vocab_size: int) -> dict[int, str]:
    problems: dict[int, str] = {}
    sentence_lengths = np.diff(sent_offsets)
    bad_token = (tokens < 0) | (tokens >= vocab_size)
    bad_per_sentence = np.add.reduceat(bad_token, sent_offsets[:-1]) if tokens.size else np.zeros(0, int)
    bad_per_sentence = np.where(sentence_lengths > 0, bad_per_sentence, 0)
    nulls = docs.is_null().to_numpy(zero_copy_only=False)
    for row in range(len(keys)):
        a, b = doc_offsets[row], doc_offsets[row + 1]
        if nulls[row] or b == a:
            problems[row] = "document has no sentences"
        elif np.any(sentence_lengths[a:b] == 0):
            problems[row] = "document has an empty sentence"
        elif np.any(bad_per_sentence[a:b]):
            first = int(tokens[sent_offsets[a]: sent_offsets[b]][bad_token[sent_offsets[a]: sent_offsets[b]]][0])
            problems[row] = f"token id {first} outside the vocabulary (size {vocab_size})"
    return problems
