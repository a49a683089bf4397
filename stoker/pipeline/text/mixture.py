"""Mixtures of token sources: which documents of each source an epoch holds, from (seed, epoch) alone.

A mixture manifest (`stoker prepare mixture`, pipeline.text.mixture_prepare) lists several token sets'
shards, each source's shards together, with its weight, the epoch rule and every document's token
count (a lengths file, sha256 pinned). Each source walks its own stream: its documents, pass after
pass, each pass in a seeded order of blocks (`unit_size` rows of one shard; pass k of source s is
seeded by (seed, k, s)), so every pass holds each document exactly once. An epoch is T tokens (a
budget, or one pass over a named source: T = its tokens / its weight), and source s gives w_s * T
of them: its window of the stream is cut at the document boundaries nearest the cumulative targets
floor(e * w_s * T) and floor((e + 1) * w_s * T), so consecutive epochs tile the stream and each
source's tokens are within its longest document (+1) of its share. `repeat`: a source that reaches
the end of a pass goes on with the next one in the same epoch. `end`: every epoch starts a new pass
of every source, and T is cut to where the first source would run out, so no document is in an
epoch twice. A document in an epoch's window twice (`repeat`) has a distinct sample id each time:
its id plus j * (documents in the manifest), j its pass counted from the epoch's first.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from stoker.pipeline.seeds import derived_rng
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.token_shards import lengths_of
from stoker.protos.errors import ConfigError, DataError

MIXTURE = "mixture"  # the key of manifest.tokens that makes a token set a mixture
EXHAUSTED = ("repeat", "end")
TOLERANCE = Fraction(1, 100)  # each source's share of an epoch's tokens, at most this far from its weight
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class MixtureError(ConfigError):
    """Weights, an epoch rule or sources that cannot make the mixture the manifest promises."""


@dataclass(frozen=True)
class MixSource:
    """One source of a mixture: its weight, and the manifest's shards [first_shard, stop_shard) that hold it."""

    name: str
    weight: float
    first_shard: int = 0
    stop_shard: int = 0


@dataclass(frozen=True)
class MixRule:
    """What an epoch is: `budget` tokens, or one pass over the source `pass_over`; and what a source that
    runs out does (`exhausted`: repeat, or end the epoch)."""

    sources: tuple[MixSource, ...]
    budget: int = 0
    pass_over: str = ""
    exhausted: str = "repeat"

    def __post_init__(self) -> None:
        names = [s.name for s in self.sources]
        if len(names) < 1:
            raise MixtureError("a mixture needs at least one --source")
        for source in self.sources:
            if not NAME.fullmatch(source.name):
                raise MixtureError(f"source name {source.name[:80]!r} must be letters, digits, _ . - (64 at most)")
            if not (math.isfinite(source.weight) and source.weight > 0):
                raise MixtureError(f"source {source.name}: weight {source.weight} must be a positive number "
                                   f"(leave a source out rather than give it 0)")
        if len(set(names)) != len(names):
            twice = sorted(n for n in set(names) if names.count(n) > 1)
            raise MixtureError(f"source names must differ: {', '.join(twice)} given more than once")
        if (self.budget > 0) == bool(self.pass_over):
            raise MixtureError("an epoch is either --budget TOKENS or --pass NAME, one of them")
        if self.budget < 0:
            raise MixtureError(f"budget {self.budget} must be a positive number of tokens")
        if self.pass_over and self.pass_over not in names:
            raise MixtureError(f"--pass {self.pass_over}: not one of the sources ({', '.join(names)})")
        if self.exhausted not in EXHAUSTED:
            raise MixtureError(f"exhausted {self.exhausted!r} must be one of {', '.join(EXHAUSTED)}")

    def fractions(self) -> list[Fraction]:
        """The weights, exact and summing to 1 (from the decimal text of each)."""
        raw = [Fraction(repr(s.weight)) for s in self.sources]
        return [w / sum(raw) for w in raw]

    def epoch_tokens(self, tokens: list[int]) -> Fraction:
        """T, the tokens of every epoch, given each source's tokens in one pass."""
        weights = self.fractions()
        if self.pass_over:
            named = [s.name for s in self.sources].index(self.pass_over)
            total = tokens[named] / weights[named]
        else:
            total = Fraction(self.budget)
        if self.exhausted == "end":
            total = min([total] + [Fraction(p) / w for p, w in zip(tokens, weights, strict=True)])
        return total

    def check_precision(self, tokens: list[int], longest: list[int]) -> None:
        """Refuse (MixtureError, one line) an epoch too small for every source's share to be within 1% of its
        weight whatever documents it ends on: a source's tokens are within its longest document (+1) of its share.
        The line names the source whose longest document makes it too small (the one that alone would need the
        largest budget; every source's longest document strays every share) and the --budget that would do."""
        total = self.epoch_tokens(tokens)
        errors = [Fraction(d + 1) for d in longest]
        strays = [self._stray(total, errors, i) for i in range(len(errors))]
        if max(strays) <= TOLERANCE:
            return
        high = self._needed(total, errors)
        alone = [self._needed(total, [e if k == j else Fraction(1) for k, e in enumerate(errors)])
                 for j in range(len(errors))]
        cause = alone.index(max(alone))
        names = [s.name for s in self.sources]
        if strays[cause] > TOLERANCE:
            why = f"source {names[cause]}'s share to stay within 1% of its weight (its longest document"
        else:
            worst = strays.index(max(strays))
            why = (f"source {names[worst]}'s share to stay within 1% of its weight (source {names[cause]}'s longest "
                   f"document")
        instead = " instead of --pass" if self.pass_over else ""
        instead += " (and --exhausted repeat if a source runs out first)" if self.exhausted == "end" else ""
        raise MixtureError(f"an epoch of {float(total):.0f} tokens is too small for {why} has {longest[cause]} "
                           f"tokens): give --budget {high} or more{instead}")

    def _needed(self, total: Fraction, errors: list[Fraction]) -> int:
        """The smallest budget at which no source's share can stray more than 1% (the worst case shrinks as the
        epoch grows, so a bisection finds it)."""
        worst = lambda budget: max(self._stray(Fraction(budget), errors, i) for i in range(len(errors)))  # noqa: E731
        high = max(1, math.ceil(total))
        while worst(high) > TOLERANCE:
            high *= 2
        low = high // 2
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if worst(middle) <= TOLERANCE else (middle, high)
        return high

    def _stray(self, total: Fraction, errors: list[Fraction], index: int) -> Fraction:
        """How far source `index`'s share of an epoch of `total` tokens can stray from its weight, each source's
        tokens off its share by up to its error (its longest document + 1)."""
        weight = self.fractions()[index]
        mine, others = weight * total, (1 - weight) * total
        error, rest = errors[index], sum(errors) - errors[index]
        high = (mine + error) / (mine + error + max(others - rest, Fraction(0)))
        least = max(mine - error, Fraction(0))
        low = least / (least + others + rest)
        return max(high - weight, weight - low)

    def to_json(self) -> dict:
        return {"sources": [{"name": s.name, "weight": s.weight, "shards": [s.first_shard, s.stop_shard]}
                            for s in self.sources],
                "budget": self.budget, "pass": self.pass_over, "exhausted": self.exhausted}

    @classmethod
    def from_json(cls, data: object, where: str) -> MixRule:
        """Read what `to_json` wrote (DataError naming the manifest when it is not that)."""
        try:
            assert isinstance(data, dict)
            sources = tuple(MixSource(str(s["name"]), float(s["weight"]), int(s["shards"][0]), int(s["shards"][1]))
                            for s in data["sources"])
            return cls(sources, int(data["budget"]), str(data["pass"]), str(data["exhausted"]))
        except (AssertionError, KeyError, TypeError, ValueError, IndexError, MixtureError) as exc:
            raise DataError(f"{where}: not a mixture this Stoker reads ({exc})") from exc


class _Walk:
    """One source's stream: its blocks, the seeded order of each pass, and where a token target falls in it."""

    def __init__(self, rows: list[tuple[int, int, int]], lengths: np.ndarray, unit_size: int) -> None:
        blocks = [(shard, start, min(start + unit_size, count), first)
                  for shard, count, first in rows for start in range(0, count, unit_size)]
        self.shard, self.start, self.stop, self.first = (np.array(c, dtype=np.int64) for c in zip(*blocks, strict=True))
        self.sizes = self.stop - self.start
        ends = np.cumsum(lengths)
        at = lambda ids: np.where(ids > 0, ends[np.maximum(ids - 1, 0)], 0)  # noqa: E731  tokens before an id
        self.block_tokens = at(self.first + self.stop) - at(self.first + self.start)
        self.lengths = lengths
        self.docs, self.tokens = int(self.sizes.sum()), int(self.block_tokens.sum())
        self._orders: dict[tuple[int, int], np.ndarray] = {}

    def order(self, seed: int, name: str, k: int) -> np.ndarray:
        """Pass k's order of blocks (the last few kept: a plan walks passes in order)."""
        found = self._orders.get((seed, k))
        if found is None:
            if len(self._orders) > 8:
                self._orders.clear()
            found = self._orders[(seed, k)] = derived_rng(seed, k, f"mixture-pass-{name}").permutation(len(self.sizes))
        return found

    def position(self, order: np.ndarray, k: int, t: int) -> int:
        """The stream index of the document boundary of pass k nearest `t` tokens into it (ties: the earlier)."""
        if t == 0:
            return k * self.docs
        cum = np.cumsum(self.block_tokens[order])
        j = int(np.searchsorted(cum, t, side="left"))
        b = int(order[j])
        ids = np.arange(self.first[b] + self.start[b], self.first[b] + self.stop[b])
        bounds = (int(cum[j - 1]) if j else 0) + np.concatenate([[0], np.cumsum(self.lengths[ids])])
        return k * self.docs + int(self.sizes[order[:j]].sum()) + int(np.argmin(np.abs(bounds - t)))

    def runs(self, order_of, first: int, stop: int, total: int) -> list[tuple[int, int, int, int]]:
        """Stream indexes [first, stop) as (shard, start, stop, sample id of the shard's row 0) runs, a
        repeated pass's ids moved up by `total` per pass after the window's first."""
        out: list[tuple[int, int, int, int]] = []
        if stop <= first:
            return out
        base = first // self.docs
        for k in range(base, (stop - 1) // self.docs + 1):
            order = order_of(k)
            lo, hi = max(first - k * self.docs, 0), min(stop - k * self.docs, self.docs)
            offsets = np.concatenate([[0], np.cumsum(self.sizes[order])])
            for j in range(int(np.searchsorted(offsets, lo, side="right")) - 1, len(order)):
                if offsets[j] >= hi:
                    break
                b = int(order[j])
                a, z = self.start[b] + max(lo - offsets[j], 0), self.start[b] + min(hi - offsets[j], self.sizes[b])
                if z > a:
                    out.append((int(self.shard[b]), int(a), int(z), int(self.first[b]) + (k - base) * total))
        return out


class Schedule:
    """A mixture's epochs: each source's window of its stream, as runs of rows (see the module's docstring)."""

    def __init__(self, manifest: Manifest, lengths: np.ndarray, unit_size: int) -> None:
        self.rule = MixRule.from_json(manifest.tokens.get(MIXTURE), manifest.uri)
        self.total = manifest.num_samples
        self.walks = []
        for source in self.rule.sources:
            shards = manifest.shards[source.first_shard: source.stop_shard]
            rows = [(source.first_shard + i, s.num_samples, s.first_sample_id) for i, s in enumerate(shards) if
                    s.num_samples]
            if not rows:
                raise DataError(f"{manifest.uri}: source {source.name} has no documents")
            self.walks.append(_Walk(rows, lengths, unit_size))
        self.epoch_tokens = self.rule.epoch_tokens([w.tokens for w in self.walks])
        self.shares = [w * self.epoch_tokens for w in self.rule.fractions()]
        repeat = self.rule.exhausted == "repeat"
        passes = max((math.floor((share + 1) / w.tokens) + 2 if repeat else 1)
                     for share, w in zip(self.shares, self.walks, strict=True))
        self.id_space = self.total * passes  # sample ids an epoch may use: documents, times passes in a window

    @classmethod
    def of(cls, manifest: Manifest, unit_size: int) -> Schedule:
        return cls(manifest, lengths_of(manifest), unit_size)

    def _window(self, seed: int, epoch: int, index: int) -> tuple[int, int]:
        """Source `index`'s stream indexes [first, stop) in `epoch`."""
        walk, share, name = self.walks[index], self.shares[index], self.rule.sources[index].name
        if self.rule.exhausted == "end":
            targets = (epoch * walk.tokens, epoch * walk.tokens + math.floor(share))
        else:
            targets = (math.floor(epoch * share), math.floor((epoch + 1) * share))
        found = []
        for target in targets:
            k, t = divmod(target, walk.tokens)
            found.append(walk.position(walk.order(seed, name, k), k, t))
        return found[0], found[1]

    def rows(self, seed: int, epoch: int) -> int:
        """Documents (with their repeats) in the epoch."""
        return sum(b - a for a, b in (self._window(seed, epoch, i) for i in range(len(self.walks))))

    def runs(self, seed: int, epoch: int) -> list[tuple[int, int, int, int]]:
        """The epoch's documents, source by source, as runs of one shard's rows, each at most a block."""
        out = []
        for index, walk in enumerate(self.walks):
            name = self.rule.sources[index].name
            first, stop = self._window(seed, epoch, index)
            out += walk.runs(lambda k, w=walk, n=name: w.order(seed, n, k), first, stop, self.total)
        return out

    def source_tokens(self, runs: list[tuple[int, int, int, int]]) -> dict[str, int]:
        """Tokens of each source in these runs (what an epoch's plan delivers, unusable documents included)."""
        owner = {shard: s.name for s in self.rule.sources for shard in range(s.first_shard, s.stop_shard)}
        lengths = self.walks[0].lengths
        found = dict.fromkeys((s.name for s in self.rule.sources), 0)
        for shard, start, stop, first in runs:
            base = first % self.total
            found[owner[shard]] += int(lengths[base + start: base + stop].sum())
        return found
