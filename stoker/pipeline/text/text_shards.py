"""Online token sets: Parquet shards of documents' text (`key`, `text`), tokenized in the workers per unit.

`stoker prepare tokens --online` (stoker.pipeline.text.token_prepare) writes these instead of token
shards, with the tokenizer.json and every document's token count (`lengths.npy`) as it counted them then,
so the plan still knows each unit's batches ahead. A worker reads a shard whole (`read_text_shard`:
sha256, schema and row count checked; a null or empty text is a problem of its row) and, for each unit,
tokenizes the unit's documents in one `encode_batch` call (`encode_unit`), not the whole shard. What it
gets is a `TokenShard` per shard holding the unit's documents (the shard's other rows empty), so the
causal-LM rows are made exactly as from token shards (stoker.pipeline.text.lm_layout). A document whose
token count differs from the lengths file (another tokenizers version, say) is a problem of its row:
skipped, counted and named, its planned place kept as padding, so the unit still gives its planned batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from stoker.pipeline.store.files import replace_atomically
from stoker.pipeline.store.shards import Manifest, ShardInfo
from stoker.pipeline.text.docs import ShardError, check_rows, read_shard_table
from stoker.pipeline.text.token_shards import TokenShard
from stoker.pipeline.text.tokenizer import IDS, TextTokenizer
from stoker.pipeline.units import Unit

TEXT_SCHEMA = pa.schema([("key", pa.string()), ("text", pa.string())])
ROW_GROUP = 1024
ONLINE = "online"  # the manifest's `tokens` entry that says the set is tokenized in the workers
NO_TEXT = "document has no text"


def is_online(manifest: Manifest) -> bool:
    """Whether a token set holds text that the workers tokenize (`stoker prepare tokens --online`)."""
    return bool(manifest.tokens.get(ONLINE))


def write_text_shard(path: str, keys: list[str], texts: list[str]) -> None:
    """One shard, its bytes a function of its rows only (no timestamps in Parquet's footer)."""
    table = pa.table([pa.array(keys, pa.string()), pa.array(texts, pa.string())], schema=TEXT_SCHEMA)
    # to a temporary name, then renamed: a rerun never writes through a hard link to an older set's shard
    replace_atomically(path, lambda f: pq.write_table(table, f, row_group_size=ROW_GROUP, compression="zstd"),
                       "text shard")


@dataclass
class TextShard:
    """One shard's documents as text."""

    keys: list[str]
    texts: list[str | None]

    def __len__(self) -> int:
        return len(self.keys)


def read_text_shard(uri: str, info: ShardInfo | None) -> TextShard:
    """Read and verify one shard whole; ShardError if it cannot be used at all."""
    table = read_shard_table(uri, info)
    if not table.schema.equals(TEXT_SCHEMA):
        raise ShardError(f"{uri}: columns {table.schema.names} are not a text shard's (key, text)")
    check_rows(uri, table, info)
    return TextShard(table.column("key").to_pylist(), table.column("text").to_pylist())


@dataclass
class _Encoded:
    """A text shard's rows of one unit as they are tokenized."""

    shard: TextShard
    ids: dict[int, np.ndarray] = field(default_factory=dict)  # row -> its tokens
    problems: dict[int, str] = field(default_factory=dict)  # row -> why it cannot be used

    def token_shard(self) -> TokenShard:
        """The shard as lm_layout reads one: the unit's documents, every other row empty."""
        sizes = np.zeros(len(self.shard), dtype=np.int64)
        for row, ids in self.ids.items():
            sizes[row] = ids.size
        offsets = np.zeros(len(self.shard) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        parts = [self.ids[row] for row in sorted(self.ids)]
        tokens = np.concatenate(parts).astype(IDS) if parts else np.zeros(0, IDS)
        return TokenShard(self.shard.keys, tokens, offsets, self.problems)


def encode_unit(source_of: Callable[[int], TextShard | str], unit: Unit, seed: int, tok: TextTokenizer,
                lengths: np.ndarray) -> Callable[[int], TokenShard | str]:
    """The unit's shards with its documents tokenized in one `encode_batch` call, each checked against
    its planned token count (`lengths`, by sample id); a shard that cannot be read stays its reason."""
    views: dict[int, _Encoded | str] = {}
    wanted: list[tuple[_Encoded, int, int, str]] = []  # (view, row, doc id, text)
    for shard_index, row, doc_id in unit.rows(seed):
        if shard_index not in views:
            shard = source_of(shard_index)
            views[shard_index] = shard if isinstance(shard, str) else _Encoded(shard)
        view = views[shard_index]
        if isinstance(view, str):
            continue
        text = view.shard.texts[row]
        if not text:
            view.problems[row] = NO_TEXT
        else:
            wanted.append((view, row, doc_id, text))
    encoded = tok.encode_batch([text for *_, text in wanted]) if wanted else []
    for (view, row, doc_id, _), ids in zip(wanted, encoded, strict=True):
        planned = int(lengths[doc_id % max(1, lengths.size)])
        if ids.size != planned:
            view.problems[row] = (f"tokenized to {ids.size} tokens here, {planned} when the set was prepared "
                                  "(another tokenizers version?)")
        else:
            view.ids[row] = ids
    shards = {index: view if isinstance(view, str) else view.token_shard() for index, view in views.items()}
    return shards.__getitem__
