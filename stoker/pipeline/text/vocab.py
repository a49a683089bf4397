"""A BERT WordPiece vocabulary: special ids, word-continuation flags, and a tokenizer for it.

Loading checks that the file really is a WordPiece vocabulary (one token per line, the five
special tokens, `##` continuation pieces, no duplicates), so a wrong file fails at once with
a message that names the problem instead of yielding silently wrong batches later.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stoker.pipeline.store.storage import read_bytes
from stoker.protos.errors import DataError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class VocabError(DataError):
    """The file is not a usable WordPiece vocabulary."""


@dataclass(frozen=True)
class Vocab:
    """A WordPiece vocabulary (vocab.txt: one token per line, its id the line number) and the
    digest a job pins it by."""

    tokens: tuple[str, ...]
    sha256: str

    @property
    def size(self) -> int:
        """Tokens in the vocabulary: the model's embedding rows."""
        return len(self.tokens)

    def id_of(self, token: str) -> int:
        """The token's id (KeyError for one the vocabulary lacks)."""
        return self._ids[token]

    @property
    def pad_id(self) -> int:
        """[PAD]: what fills a row past its tokens."""
        return self.id_of("[PAD]")

    @property
    def cls_id(self) -> int:
        """[CLS]: the first token of a sequence, read by the next-sentence head."""
        return self.id_of("[CLS]")

    @property
    def sep_id(self) -> int:
        """[SEP]: ends each segment of a sequence."""
        return self.id_of("[SEP]")

    @property
    def mask_id(self) -> int:
        """[MASK]: what replaces most masked-LM targets."""
        return self.id_of("[MASK]")

    @property
    def _ids(self) -> dict[str, int]:
        cached = self.__dict__.get("_id_map")
        if cached is None:
            cached = {t: i for i, t in enumerate(self.tokens)}
            object.__setattr__(self, "_id_map", cached)
        return cached

    def continuation_flags(self) -> np.ndarray:
        """bool per id: True for `##` pieces, which belong to the word before them."""
        return np.array([t.startswith("##") for t in self.tokens], dtype=bool)

    @classmethod
    def parse(cls, data: bytes, source: str = "vocab") -> Vocab:
        """The vocabulary in vocab.txt's bytes; VocabError, naming `source`, when it is not one."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise VocabError(f"{source}: not UTF-8 text ({exc})") from exc
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        tokens = tuple(line.rstrip("\r") for line in lines)
        if not tokens:
            raise VocabError(f"{source}: empty")
        bad = next((i for i, t in enumerate(tokens) if not t or any(c.isspace() for c in t)), None)
        if bad is not None:
            raise VocabError(f"{source}: line {bad + 1} ({tokens[bad]!r}) is not a single WordPiece token "
                             f"(one token per line, no spaces)")
        missing = [t for t in SPECIAL_TOKENS if t not in tokens]
        if missing:
            raise VocabError(f"{source}: not a BERT WordPiece vocabulary, missing {', '.join(missing)}")
        dup = _first_repeat(tokens)
        if dup is not None:
            raise VocabError(f"{source}: token {dup!r} appears twice")
        if not any(t.startswith("##") for t in tokens):
            raise VocabError(f"{source}: no '##' continuation pieces, so it is not a WordPiece vocabulary")
        return cls(tokens, hashlib.sha256(data).hexdigest())

    @classmethod
    def load(cls, uri: str | Path) -> Vocab:
        """From a local path or any pyarrow.fs URI."""
        uri = str(uri)
        try:
            data = read_bytes(uri)
        except OSError as exc:
            raise VocabError(f"{uri}: cannot read the vocabulary ({exc})") from exc
        return cls.parse(data, uri)

    def tokenizer(self, lowercase: bool = True):
        """A Rust `tokenizers` BERT WordPiece tokenizer over this vocabulary (no special tokens added)."""
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

        model = models.WordPiece(vocab={t: i for i, t in enumerate(self.tokens)}, unk_token="[UNK]",
                                 max_input_chars_per_word=100)
        tok = Tokenizer(model)
        tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=None if lowercase else False)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        return tok


def _first_repeat(tokens: Iterable[str]) -> str | None:
    """The first token that appears a second time, reading in order; None when all are distinct."""
    seen: set[str] = set()
    for token in tokens:
        if token in seen:
            return token
        seen.add(token)
    return None
