"""What a token set costs its hosts per token, besides packing: the bytes its shards hold, and tokenizing.

`stoker plan --dataset tokens` needs two figures a token set's manifest and tokenizer give:

- the bytes a job reads per token (`bytes_per_token`): its shards' bytes over the tokens they hold,
  which is what storage must deliver per token, since a worker reads each shard whole
  (stoker.pipeline.text.token_shards). Token ids are int32, 4 bytes; Parquet with LZ4 holds them in fewer.
- the CPU one core spends tokenizing (`tokenize_rate`): the set's own documents, decoded back to text
  with its own tokenizer (the one `stoker prepare tokens` copied beside the manifest, or its
  `module:Name`), encoded again in batches as prepare does, timed in CPU seconds of every thread. A
  `tokens` job of token shards reads tokens already made; one of an online set pays this in its workers.
"""

from __future__ import annotations

from collections.abc import Sequence

from stoker.pipeline.cpu_clock import stage_clock
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.text_shards import is_online, read_text_shard
from stoker.pipeline.text.token_prepare import TOKENIZER_FILE
from stoker.pipeline.text.token_shards import read_token_shard
from stoker.pipeline.text.tokenizer import TextTokenizer, TokenizerConfig
from stoker.protos.errors import ConfigError, DataError

INT32_BYTES = 4  # a token id as a batch and a shard's column hold it
TOKENIZE_BATCH = 256  # documents per encode call, as benchmarks/tokenize_cost.py times it


def _token_info(manifest: Manifest) -> dict:
    info = manifest.tokens
    if manifest.kind != "tokens" or not isinstance(info.get("total"), int) or not info.get("tokenizer"):
        raise ConfigError(f"{manifest.uri or 'the manifest'} is not a token set (kind {manifest.kind!r}): make one "
                          "with `stoker prepare tokens SRC --tokenizer TOKENIZER --out DIR`")
    return info


def bytes_per_token(manifest: Manifest) -> float:
    """Bytes of shards a job reads per token of the set (every shard whole, each token once per epoch)."""
    total = _token_info(manifest)["total"]
    if total <= 0:
        raise DataError(f"{manifest.uri}: the manifest counts no tokens")
    return sum(shard.num_bytes for shard in manifest.shards) / total


def manifest_tokenizer(manifest: Manifest) -> TextTokenizer:
    """The tokenizer the set was made with, pinned to the fingerprint its manifest records."""
    info = _token_info(manifest)
    name = info["tokenizer"]
    where = {"path": manifest.relative_uri(TOKENIZER_FILE)} if name == TOKENIZER_FILE else {"factory": name}
    return TokenizerConfig(**where, eot=info.get("eot"), pad=info.get("pad"),
                           fingerprint=info.get("fingerprint", "")).load()


def manifest_texts(manifest: Manifest, tok: TextTokenizer, documents: int = 2000) -> list[str]:
    """Up to `documents` of the set's documents as text, in shard order (decoded with `tok`)."""
    vocab = int(_token_info(manifest).get("vocab_size") or tok.vocab_size)
    texts: list[str] = []
    for index, info in enumerate(manifest.shards):
        if is_online(manifest):  # the text the workers tokenize, as it is
            texts += [t for t in read_text_shard(manifest.shard_uri(index), info).texts if t]
            if len(texts) >= documents:
                break
            continue
        shard = read_token_shard(manifest.shard_uri(index), info, vocab)
        texts += [tok.decode(shard.document(row).tolist()) for row in range(len(shard)) if not shard.problem(row)]
        if len(texts) >= documents:
            break
    return texts[:documents]


def tokenize_rate(tok: TextTokenizer, texts: Sequence[str], seconds: float) -> tuple[float, int]:
    """Tokens per CPU-second of `tok` encoding `texts` in batches, over passes until `seconds` of CPU;
    and the tokens counted. The first batch warms up and is not counted."""
    if not texts:
        raise DataError("no documents to tokenize")
    batches = [list(texts[i:i + TOKENIZE_BATCH]) for i in range(0, len(texts), TOKENIZE_BATCH)]
    tok.encode_batch(batches[0])
    started, tokens = stage_clock(), 0
    while True:
        for batch in batches:
            tokens += sum(ids.size for ids in tok.encode_batch(batch))
            if stage_clock() - started >= seconds:
                if not tokens:
                    raise DataError("the documents tokenize to nothing: no rate to measure")
                return tokens / (stage_clock() - started), tokens
