"""A small real corpus and a byte-level BPE tokenizer trained on it, for the tokens (causal-LM) tests."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("the quick brown fox jumps over a lazy dog while stoker feeds every token of every document to "
         "models exactly once per epoch").split()


def texts(count: int = 120, seed: int = 0, longest: int = 150) -> list[str]:
    """Documents of 1..`longest` words: some short, some longer than a row of 64 tokens."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, longest))) for _ in range(count)]


def tokenizer_json(path: Path, corpus: list[str]) -> Path:
    """A byte-level BPE with <|endoftext|> and <pad>, saved as tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<pad>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(path))
    return path


def jsonl(path: Path, corpus: list[str], bad: bool = True) -> Path:
    """One JSON object a line; with `bad`, a line that is not JSON and an empty text after them."""
    lines = [json.dumps({"text": t}) for t in corpus] + (["not json", json.dumps({"text": ""})] if bad else [])
    path.write_text("\n".join(lines) + "\n")
    return path


def prepared(folder: Path, count: int = 120, docs_per_shard: int = 40):
    """A prepared token set of `count` documents: (the prepare's result, the texts, the tokenizer path)."""
    from stoker.pipeline.text.token_prepare import TokenPrepareConfig, prepare_tokens

    corpus = texts(count)
    folder.mkdir(parents=True, exist_ok=True)
    tok = tokenizer_json(folder / "source-tokenizer.json", corpus)
    src = jsonl(folder / "corpus.jsonl", corpus)
    result = prepare_tokens(src, folder / "shards", str(tok),
                            TokenPrepareConfig(docs_per_shard=docs_per_shard, progress=False))
    return result, corpus, tok


def two_sources(folder: Path, sizes: tuple[int, int] = (200, 60), longest: int = 12, docs_per_shard: int = 50):
    """Two token sets of short documents ("web", "books") with one tokenizer: their manifests' folders."""
    from stoker.pipeline.text.token_prepare import TokenPrepareConfig, prepare_tokens

    corpora = {"web": texts(sizes[0], seed=1, longest=longest), "books": texts(sizes[1], seed=2, longest=longest)}
    folder.mkdir(parents=True, exist_ok=True)
    tok = tokenizer_json(folder / "tokenizer-src.json", [t for c in corpora.values() for t in c])
    for name, corpus in corpora.items():
        prepare_tokens(jsonl(folder / f"{name}.jsonl", corpus, bad=False), folder / name, str(tok),
                       TokenPrepareConfig(docs_per_shard=docs_per_shard, progress=False))
    return {name: folder / name for name in corpora}
