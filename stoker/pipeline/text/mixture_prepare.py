"""`stoker prepare mixture`: several token sets (`stoker prepare tokens`) and their weights -> one mixture manifest.

Each source's shards are linked (or, across file systems and on object storage, copied) into NAME/ under
the new folder, so the manifest keeps its own paths and sha256 checks and can live on object storage as
any token set does; their sample ids run on from source to source. Each shard is read once, checked
against its source's sha256, and every document's tokens are written to `lengths.npy` (pinned by its
sha256), which the plan reads to cut each epoch (pipeline.text.mixture). Refused in one line: an --out that
is, is inside or holds a source's folder (before anything is written: the mixture would overwrite the
source), sources of different tokenizers (fingerprint) or special ids, a source with no tokens, weights the
mixture's epoch cannot hold within 1%.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from stoker.pipeline.kinds import TOKENS
from stoker.pipeline.store.shards import MANIFEST_NAME, Manifest, ShardInfo
from stoker.pipeline.store.storage import is_remote, join, staged
from stoker.pipeline.text.mixture import MIXTURE, MixRule, MixSource, MixtureError, Schedule
from stoker.pipeline.text.text_shards import is_online
from stoker.pipeline.text.token_prepare import copy_file, folder_key, refuse_overlap
from stoker.pipeline.text.token_shards import read_token_shard, write_lengths
from stoker.protos.errors import DataError

SAME = ("fingerprint", "eot", "pad", "vocab_size")  # what every source's tokenizer must agree on


@dataclass(frozen=True)
class SourceSpec:
    """`--source NAME=MANIFEST:WEIGHT`: a token set's manifest (or its folder) and its weight."""

    name: str
    manifest: str
    weight: float

    @classmethod
    def parse(cls, text: str) -> SourceSpec:
        """Read `NAME=PATH:WEIGHT` (MixtureError, one line, when it is not that)."""
        name, eq, rest = text.partition("=")
        path, colon, weight = rest.rpartition(":")
        if not (eq and colon and name and path):
            raise MixtureError(f"{text[:120]!r} is not NAME=DIR/manifest.json:WEIGHT")
        try:
            value = float(weight)
        except ValueError as exc:
            raise MixtureError(f"{text[:120]!r}: weight {weight[:40]!r} is not a number") from exc
        MixRule((MixSource(name, value),), budget=1)  # the name and the weight, checked now
        return cls(name, path, value)


@dataclass
class MixturePrepared:
    manifest: Manifest
    tokens: dict[str, int]  # each source's tokens in one pass
    epoch_tokens: int


def _components(specs: list[SourceSpec]) -> list[Manifest]:
    """Each source's manifest, refused unless all are token sets of one tokenizer with documents."""
    found = [Manifest.load(spec.manifest) for spec in specs]
    for spec, manifest in zip(specs, found, strict=True):
        if manifest.kind != TOKENS.name or not manifest.tokens or MIXTURE in manifest.tokens:
            raise MixtureError(f"source {spec.name}: {manifest.uri} is not a token set of `stoker prepare tokens`")
        if is_online(manifest):
            raise MixtureError(f"source {spec.name}: {manifest.uri} is an online set (text the workers tokenize); "
                               "a mixture reads token shards: prepare it without --online")
        if not manifest.num_samples or not manifest.tokens.get("total"):
            raise MixtureError(f"source {spec.name}: {manifest.uri} has no tokens (an empty source cannot be weighted)")
        for key in SAME:
            if manifest.tokens.get(key) != found[0].tokens.get(key):
                raise MixtureError(f"source {spec.name}: its tokenizer's {key} is {manifest.tokens.get(key)!r}, "
                                   f"source {specs[0].name}'s is {found[0].tokens.get(key)!r}: a mixture has one "
                                   f"tokenizer")
    return found


def _refuse_overlap(specs: list[SourceSpec], components: list[Manifest], out: str | Path) -> None:
    """Refuse (one line, before anything is written) an --out that is a source's folder, inside one or holds
    one: writing the mixture there would overwrite or entangle the source's own manifest and shards."""
    for spec, manifest in zip(specs, components, strict=True):
        refuse_overlap(out, f"--out {out}", folder_key(manifest.uri), f"source {spec.name}'s folder",
                       "give the mixture a folder apart from every source's (writing there would overwrite or tangle "
                       "with the source's own manifest and shards)", MixtureError)


def _place(uri: str, target: Path) -> None:
    """The shard at `uri` as `target`: a hard link where it can be, else a copy of its bytes. What was at
    `target` (an earlier mixture's link) is removed first, never written through."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    if not is_remote(uri):
        try:
            os.link(uri, target)
            return
        except OSError:
            pass
    copy_file(uri, target, "shard")


def prepare_mixture(specs: list[SourceSpec], out: str | Path, budget: int = 0, pass_over: str = "",
                    exhausted: str = "repeat") -> MixturePrepared:
    """Write the mixture manifest of `specs` under `out` (see the module's docstring)."""
    rule = MixRule(tuple(MixSource(s.name, s.weight) for s in specs), budget, pass_over, exhausted)
    components = _components(specs)
    _refuse_overlap(specs, components, out)
    shards: list[ShardInfo] = []
    sources: list[MixSource] = []
    lengths: list[np.ndarray] = []
    shard_tokens: list[int] = []
    skipped: list[dict[str, str]] = []
    vocab = int(components[0].tokens["vocab_size"])
    with staged(out) as folder:
        for spec, manifest in zip(specs, components, strict=True):
            first = len(shards)
            for index, info in enumerate(manifest.shards):
                path = f"{spec.name}/{info.path}"
                _place(manifest.shard_uri(index), folder / path)
                shard = read_token_shard(str(folder / path), info, vocab)  # checked against its sha256 here
                sizes = np.diff(shard.offsets)
                sizes[list(shard.problems)] = 0  # unusable documents are skipped, never delivered
                lengths.append(sizes)
                shard_tokens.append(int(sizes.sum()))
                shards.append(replace(info, path=path, first_sample_id=sum(s.num_samples for s in shards)))
            sources.append(MixSource(spec.name, spec.weight, first, len(shards)))
            skipped += [{**item, "path": f"{spec.name}:{item.get('path', '')}"} for item in manifest.skipped]
        manifest = _write(folder, components[0], replace(rule, sources=tuple(sources)), shards, lengths,
                          shard_tokens, skipped)
    manifest.uri = join(out, MANIFEST_NAME)
    schedule = Schedule(manifest, np.concatenate(lengths), 1)
    return MixturePrepared(manifest, {s.name: w.tokens for s, w in zip(sources, schedule.walks, strict=True)},
                           int(schedule.epoch_tokens))


def _write(folder: Path, first: Manifest, rule: MixRule, shards: list[ShardInfo], lengths: list[np.ndarray],
           shard_tokens: list[int], skipped: list[dict[str, str]]) -> Manifest:
    """The lengths file, the tokenizer and the manifest, once the mixture's precision is checked."""
    per_source = [np.concatenate(lengths[s.first_shard: s.stop_shard]) for s in rule.sources]
    if any(not part.sum() for part in per_source):
        empty = next(s.name for s, part in zip(rule.sources, per_source, strict=True) if not part.sum())
        raise MixtureError(f"source {empty}: none of its documents has a usable token")
    rule.check_precision([int(p.sum()) for p in per_source], [int(p.max()) for p in per_source])
    tokens = {key: first.tokens[key] for key in ("tokenizer", *SAME)}
    if first.tokens["tokenizer"].endswith(".json"):
        copy_file(first.relative_uri(first.tokens["tokenizer"]), folder / tokens["tokenizer"], "tokenizer")
    tokens |= {"source": "mixture", "shard_tokens": shard_tokens, "total": sum(shard_tokens),
               MIXTURE: rule.to_json()} | write_lengths(folder, np.concatenate(lengths))
    manifest = Manifest(kind=TOKENS.name, classes=[], shards=shards, skipped=skipped,
                        vocab_size=first.vocab_size, tokens=tokens)
    manifest.save(folder / MANIFEST_NAME)
    if not any(shard.num_samples for shard in shards):
        raise DataError(f"{folder}: the sources hold no documents")
    return manifest
