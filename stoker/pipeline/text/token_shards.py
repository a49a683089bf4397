"""Shards of tokenized documents for causal-LM jobs (`key` string, `tokens` list<uint16 or int32>), in Arrow IPC.

`stoker prepare tokens` writes them (pipeline.text.token_prepare), uncompressed: a worker reads one's bytes
and takes every token id and each document's offsets as numpy views of them (no decode, no copy), so a
unit's documents are array slices. Shards written as Parquet by an older Stoker are still read (the same
columns; docs.read_shard_table tells them by their first bytes). The shard's sha256 is checked against the
manifest and every document once: a null or empty one, or one with an id outside the tokenizer's
vocabulary, is reported by `problem(row)` and skipped by the caller (counted and named), never turned
into a row. A shard that cannot be
used at all raises `ShardError` (pipeline.text.docs), whose rows the worker reports as skipped.

Every token set (`stoker prepare tokens`, `stoker prepare mixture`) also writes each document's token
count by sample id (`lengths.npy`, its sha256 in the manifest's `tokens`; 0 for a document never
delivered): the plan reads it to know every unit's batches, and so every rank's steps, ahead.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from stoker.pipeline.store.files import replace_atomically
from stoker.pipeline.store.shards import Manifest, ShardInfo
from stoker.pipeline.store.storage import read_bytes
from stoker.pipeline.text.docs import ShardError, check_rows, read_shard_table
from stoker.protos.errors import DataError

TOKEN_SCHEMA = pa.schema([("key", pa.string()), ("tokens", pa.list_(pa.int32()))])
# ids under 65,536 (GPT-2's, BERT's vocabularies) are kept in 2 bytes: half the bytes to read and hash
NARROW_SCHEMA = pa.schema([("key", pa.string()), ("tokens", pa.list_(pa.uint16()))])
NARROW_IDS = 1 << 16
ROW_GROUP = 1024
LENGTHS_FILE = "lengths.npy"


def write_token_shard(path: str, keys: list[str], documents: list[np.ndarray]) -> None:
    """One shard, its bytes a function of its rows only. Arrow IPC, uncompressed, for a read that costs what its
    sha256 does: 2 bytes a token where every id is under 65,536 (LZ4 Parquet took 2.3 on Wikipedia's WordPiece
    ids), else 4."""
    sizes = np.fromiter((d.size for d in documents), dtype=np.int64, count=len(documents))
    offsets = np.zeros(len(documents) + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    flat = np.concatenate(documents).astype(np.int64) if documents else np.zeros(0, np.int64)
    narrow = not flat.size or 0 <= flat.min() <= flat.max() < NARROW_IDS
    schema = NARROW_SCHEMA if narrow else TOKEN_SCHEMA
    ids = pa.array(flat.astype(np.uint16 if narrow else np.int32), schema.field("tokens").type.value_type)
    table = pa.table([pa.array(keys, pa.string()), pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), ids)],
                     schema=schema)

    def write(f: BinaryIO) -> None:
        with pa.ipc.new_file(f, schema) as writer:
            writer.write_table(table, max_chunksize=max(1, table.num_rows))  # one record batch: one view

    # to a temporary name, then renamed: a rerun replaces a mixture's hard link, never writes through it
    replace_atomically(path, write, "token shard")


@dataclass
class TokenShard:
    """One shard's documents as flat arrays: document i is tokens[offsets[i]:offsets[i + 1]]."""

    keys: Sequence[str] | pa.Array  # a shard's strings stay Arrow's, made Python ones only for a document named
    tokens: np.ndarray  # int32
    offsets: np.ndarray  # int64 (num_docs + 1,)
    problems: dict[int, str]  # row -> why that document cannot be used

    def __len__(self) -> int:
        return len(self.keys)

    def key(self, row: int) -> str:
        key = self.keys[row]
        return key if isinstance(key, str) else str(key.as_py())

    def problem(self, row: int) -> str | None:
        return self.problems.get(row)

    def document(self, row: int) -> np.ndarray:
        """The token ids of one document (a view)."""
        return self.tokens[self.offsets[row]: self.offsets[row + 1]]


def read_token_shard(uri: str, info: ShardInfo | None, vocab_size: int) -> TokenShard:
    """Read, verify and flatten one shard; ShardError if it cannot be used at all."""
    table = read_shard_table(uri, info)
    if not (table.schema.equals(TOKEN_SCHEMA) or table.schema.equals(NARROW_SCHEMA)):
        raise ShardError(f"{uri}: schema {table.schema} is not {TOKEN_SCHEMA} (or its ids as uint16)")
    check_rows(uri, table, info)
    return flatten_tokens(table, vocab_size)


def flatten_tokens(table: pa.Table, vocab_size: int) -> TokenShard:
    keys = table.column("key").combine_chunks()
    docs = table.column("tokens").combine_chunks()
    offsets = np.asarray(docs.offsets, dtype=np.int64)
    offsets -= offsets[0]  # a sliced array's offsets are not rebased; flatten() is
    flat = docs.flatten()
    tokens = np.asarray(flat.cast(pa.int32()).fill_null(-1) if flat.null_count else flat, dtype=np.int32)
    nulls = docs.is_null().to_numpy(zero_copy_only=False)
    problems: dict[int, str] = {}
    # whole-array steps: a loop per document costs more than reading the shard. As unsigned, a negative id is
    # out of range too, so one max says whether any id is (the usual answer: none)
    wide = tokens.view(np.uint32)
    at = np.flatnonzero(wide >= vocab_size) if tokens.size and wide.max() >= vocab_size else np.zeros(0, np.int64)
    rows, first = np.unique(np.searchsorted(offsets, at, side="right") - 1, return_index=True)
    for row, token in zip(rows.tolist(), tokens[at[first]].tolist(), strict=True):
        problems[row] = f"token id {token} outside the tokenizer's vocabulary (size {vocab_size})"
    for row in np.flatnonzero(nulls | (np.diff(offsets) == 0)).tolist():
        problems[row] = "document has no tokens"
    return TokenShard(keys, tokens, offsets, dict(sorted(problems.items())))


def write_lengths(folder: Path, lengths: np.ndarray) -> dict[str, str]:
    """Write every document's token count beside the manifest; the entries its `tokens` keeps."""
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(lengths).astype(np.int32), allow_pickle=False)
    replace_atomically(folder / LENGTHS_FILE, lambda f: f.write(buffer.getvalue()), "lengths file")
    return {"lengths": LENGTHS_FILE, "lengths_sha256": hashlib.sha256(buffer.getvalue()).hexdigest()}


def lengths_of(manifest: Manifest) -> np.ndarray:
    """Every document's tokens (int64, by sample id), read once and checked against the manifest's sha256."""
    if "lengths_sha256" not in manifest.tokens:
        raise DataError(f"{manifest.uri}: a token set without its documents' lengths (made by an older Stoker): "
                        "run `stoker prepare tokens` (and `stoker prepare mixture`) again")
    uri = manifest.relative_uri(str(manifest.tokens.get("lengths", LENGTHS_FILE)))
    try:
        data = read_bytes(uri)
    except FileNotFoundError:
        raise DataError(f"{uri}: the lengths file the manifest names is missing: run `stoker prepare tokens` (and "
                        "`stoker prepare mixture`) again") from None
    if hashlib.sha256(data).hexdigest() != manifest.tokens["lengths_sha256"]:
        raise DataError(f"{uri}: sha256 does not match the manifest (corrupt or replaced lengths file)")
    lengths = np.load(io.BytesIO(data), allow_pickle=False).astype(np.int64)
    if lengths.shape != (manifest.num_samples,) or (lengths < 0).any():
        raise DataError(f"{uri}: {lengths.shape} lengths, the manifest has {manifest.num_samples} documents")
    return lengths
