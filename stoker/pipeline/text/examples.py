"""BERT pretraining examples made online from tokenized documents (MLPerf/BERT reference rules).

Per document, as in BERT's `create_pretraining_data`: a target length (the maximum, or with
`short_seq_prob` a random shorter one), sentence chunks split into segments A and B, B
replaced by a span of a random other document half the time (the next-sentence label),
truncation of the longer segment from a random end, `[CLS] A [SEP] B [SEP]`, and masked-LM
with 15% of tokens (80% `[MASK]`, 10% a random token, 10% unchanged), optionally whole words.
All randomness comes from the generator the caller derives from (seed, epoch, document key).
Work is done on array slices; the only per-token Python loop is whole-word selection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from stoker.pipeline.text.docs import DocShard
from stoker.pipeline.text.vocab import Vocab
from stoker.protos.errors import ConfigError

MAX_PREDICTIONS = {128: 20, 512: 76}  # the reference's max_predictions_per_seq


@dataclass(frozen=True)
class TextConfig:
    """How BERT pretraining examples are made from the text: sequence length, masking and packing
    (the reference's create_pretraining_data settings, and Graphcore's packing)."""

    # a field with a help line is also a command-line option (stoker.configured)
    seq_len: int = field(default=128, metadata={"help": "tokens per row (default %(default)s)", "check": "seq-len"})
    max_predictions: int = field(default=0, metadata={  # 0: 20 at 128, 76 at 512, else round(seq_len * masked_lm_prob)
        "help": "masked-LM targets per sequence (default: 20 at 128, 76 at 512)", "check": "non-negative"})
    masked_lm_prob: float = field(default=0.15, metadata={
        "help": "share of the tokens masked for the masked-LM loss (default %(default)s)", "check": "fraction"})
    short_seq_prob: float = field(default=0.1, metadata={
        "help": "share of the documents given a random shorter target length, as BERT does (default %(default)s)",
        "check": "fraction"})
    whole_word_mask: bool = field(default=False, metadata={"help": "mask whole words, not single pieces"})
    pack: bool = field(default=False, metadata={"help": "pack several sequences into each row"})
    pack_max_sequences: int = field(default=3, metadata={  # Graphcore packed up to 3 sequences per row
        "help": "sequences per packed row (default %(default)s)", "check": "positive"})

    def __post_init__(self) -> None:
        if not 8 <= self.seq_len <= 8192:
            raise ConfigError(f"sequence length {self.seq_len} outside 8..8192")
        if not 0 < self.masked_lm_prob < 1 or not 0 <= self.short_seq_prob <= 1:
            raise ConfigError("masked_lm_prob must lie in (0, 1) and short_seq_prob in [0, 1]")
        if self.max_predictions < 0 or self.pack_max_sequences < 1:
            raise ConfigError("max_predictions must be >= 0 and pack_max_sequences >= 1")

    @property
    def predictions_per_sequence(self) -> int:
        """Masked-LM slots of one sequence: the given number, else the reference's for the length."""
        if self.max_predictions:
            return self.max_predictions
        return MAX_PREDICTIONS.get(self.seq_len, max(1, round(self.seq_len * self.masked_lm_prob)))

    @property
    def sequences_per_row(self) -> int:
        """The most sequences one row holds: several when packing, else one."""
        return self.pack_max_sequences if self.pack else 1

    @property
    def predictions_per_row(self) -> int:
        """Masked-LM slots of one row; a packed row may hold one rounding extra per sequence."""
        if not self.pack:
            return self.predictions_per_sequence
        return self.predictions_per_sequence + self.pack_max_sequences


@dataclass(frozen=True)
class Specials:
    cls_id: int
    sep_id: int
    mask_id: int
    vocab_size: int
    continuation: np.ndarray  # bool per token id: a `##` piece

    @cached_property
    def cls_sep(self) -> tuple[np.ndarray, np.ndarray]:
        """[CLS] and [SEP] as one-element int32 arrays, to concatenate an example in one call."""
        return np.array([self.cls_id], np.int32), np.array([self.sep_id], np.int32)

    @classmethod
    def of(cls, vocab: Vocab) -> Specials:
        return cls(vocab.cls_id, vocab.sep_id, vocab.mask_id, vocab.size, vocab.continuation_flags())


@dataclass
class Sequence:
    """One example: `[CLS] A [SEP] B [SEP]` with its masked-LM targets."""

    doc_id: int
    tokens: np.ndarray  # int32, masked
    len_a: int  # tokens of segment A; token_type 0 covers [CLS] A [SEP]
    masked_positions: np.ndarray  # int32, ascending
    masked_ids: np.ndarray  # int32, the original ids at those positions
    is_random_next: bool
    forced_random: bool = False  # a one-sentence chunk has no next sentence: random by rule, no coin

    def __len__(self) -> int:
        return int(self.tokens.size)


def valid_rows(shard: DocShard) -> np.ndarray:
    """Rows usable as documents (and so as random-next sources)."""
    ok = np.ones(len(shard), dtype=bool)
    ok[list(shard.problems)] = False
    return np.flatnonzero(ok)


def document_sequences(shard: DocShard, row: int, doc_id: int, pool: np.ndarray, cfg: TextConfig,
                       specials: Specials, rng: np.random.Generator) -> list[Sequence]:
    """Every example of one (valid) document, in the reference's order."""
    max_tokens = cfg.seq_len - 3
    target = max_tokens
    if rng.random() < cfg.short_seq_prob:
        target = int(rng.integers(2, max_tokens + 1))
    first, stop = shard.sentence_span(row)
    lengths = np.diff(shard.sent_offsets[first: stop + 1])
    out: list[Sequence] = []
    chunk_start = i = first
    length = 0
    while i < stop:
        length += int(lengths[i - first])
        if i == stop - 1 or length >= target:
            n = i + 1 - chunk_start
            a_end = chunk_start + (1 if n < 2 else int(rng.integers(1, n)))
            a = shard.token_span(chunk_start, a_end)
            forced = n == 1
            if forced or rng.random() < 0.5:
                is_random = True
                b = _random_span(shard, row, pool, target - a.size, rng)
                i = a_end - 1  # the chunk's unused sentences start the next chunk
            else:
                is_random = False
                b = shard.token_span(a_end, i + 1)
            a, b = _truncate_pair(a, b, max_tokens, rng)
            out.append(_masked(doc_id, a, b, is_random, cfg, specials, rng))
            out[-1].forced_random = forced
            chunk_start, length = i + 1, 0
        i += 1
    return out


def _random_span(shard: DocShard, row: int, pool: np.ndarray, target: int, rng: np.random.Generator) -> np.ndarray:
    """Segment B of a random-next example: sentences of another document from a random start."""
    other = row
    for _ in range(10):
        other = int(pool[rng.integers(0, pool.size)])
        if other != row:
            break
    first, stop = shard.sentence_span(other)
    start = first + int(rng.integers(0, stop - first))
    ends = shard.sent_offsets[start + 1: stop + 1] - shard.sent_offsets[start]
    # take sentences until B reaches the target (at least one sentence)
    count = int(np.searchsorted(ends, max(target, 1), side="left")) + 1
    return shard.token_span(start, min(start + count, stop))


def _truncate_pair(a: np.ndarray, b: np.ndarray, max_tokens: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Trim the longer segment one token at a time, from a random end, until both fit.

    Runs of removals from the same segment are drawn at once: each removal is a fair coin
    between front and back, so a run of k takes Binomial(k, 1/2) from the front.
    """
    spans = [[0, a.size], [0, b.size]]
    excess = a.size + b.size - max_tokens
    while excess > 0:
        la, lb = spans[0][1] - spans[0][0], spans[1][1] - spans[1][0]
        if la == lb:  # the reference trims B, then A, alternately
            runs = [(1, excess - excess // 2), (0, excess // 2)]
        elif la > lb:
            runs = [(0, min(excess, la - lb))]
        else:
            runs = [(1, min(excess, lb - la))]
        for which, k in runs:
            front = int(rng.binomial(k, 0.5)) if k else 0
            spans[which][0] += front
            spans[which][1] -= k - front
            excess -= k
    return a[spans[0][0]: spans[0][1]], b[spans[1][0]: spans[1][1]]


def _masked(doc_id: int, a: np.ndarray, b: np.ndarray, is_random: bool, cfg: TextConfig,
            specials: Specials, rng: np.random.Generator) -> Sequence:
    """A few numpy calls per example: this runs for every sequence (a third of the text path)."""
    n = a.size + b.size + 3
    cls, sep = specials.cls_sep
    tokens = np.concatenate((cls, a, sep, b, sep))
    wanted = min(cfg.predictions_per_sequence, max(1, round(n * cfg.masked_lm_prob)))
    if cfg.whole_word_mask:
        candidates = np.concatenate([np.arange(1, a.size + 1), np.arange(a.size + 2, n - 1)])
        positions = _whole_words(candidates, tokens, wanted, specials.continuation, rng).astype(np.int32)
    else:  # the k-th maskable token sits after [CLS], and after A's [SEP] once k reaches len(A)
        chosen = np.sort(rng.choice(n - 3, size=min(wanted, n - 3), replace=False))
        positions = (chosen + 1 + (chosen >= a.size)).astype(np.int32)
    originals = tokens[positions]
    roll = rng.random(positions.size)  # 80% [MASK], 10% unchanged, 10% a random token
    randoms = rng.integers(0, specials.vocab_size, size=positions.size, dtype=np.int32)
    tokens[positions] = np.where(roll < 0.8, specials.mask_id, np.where(roll < 0.9, originals, randoms))
    return Sequence(doc_id, tokens, int(a.size), positions, originals, is_random)


def _whole_words(candidates: np.ndarray, tokens: np.ndarray, wanted: int, continuation: np.ndarray,
                 rng: np.random.Generator) -> np.ndarray:
    """Positions of randomly chosen whole words (a word and its `##` pieces) covering <= wanted."""
    starts = ~continuation[tokens[candidates]]
    starts[0] = True
    word_of = np.cumsum(starts) - 1
    word_start = np.flatnonzero(starts)
    word_len = np.diff(np.append(word_start, candidates.size))
    chosen: list[int] = []
    covered = 0
    for word in rng.permutation(word_start.size):
        if covered >= wanted:
            break
        size = int(word_len[word])
        if covered + size > wanted:
            continue
        chosen.append(int(word))
        covered += size
    mask = np.isin(word_of, chosen)
    return candidates[mask]
