"""Helpers shared by the text unit tests."""

from __future__ import annotations

from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.batching import TextUnitSource
from stoker.pipeline.text.docs import read_doc_shard
from stoker.pipeline.text.examples import Specials, TextConfig
from stoker.pipeline.text.vocab import Vocab
from stoker.pipeline.units import Segment, Unit


def source(manifest: Manifest, shard: int, cfg: TextConfig, seed: int = 0) -> TextUnitSource:
    vocab = Vocab.load(manifest.relative_uri(manifest.vocab))
    docs = read_doc_shard(manifest.shard_uri(shard), manifest.shards[shard], vocab.size)
    return TextUnitSource(docs, cfg, Specials.of(vocab), seed)


def one_range(unit_id: int, epoch: int, shard: int, start: int, stop: int, first_sample_id: int) -> Unit:
    return Unit(unit_id, epoch, (Segment(shard, start, stop, first_sample_id),))


def whole_shard_unit(manifest: Manifest, shard: int, epoch: int = 0) -> Unit:
    info = manifest.shards[shard]
    return one_range(epoch, epoch, shard, 0, info.num_samples, info.first_sample_id)


def sequences_of(manifest: Manifest, cfg: TextConfig, shards=(0, 1, 2)):
    out = []
    for shard in shards:
        out += source(manifest, shard, cfg).sequences(whole_shard_unit(manifest, shard))[0]
    return out


def vocab_file(folder, vocab: Vocab):
    path = folder / "vocab.txt"
    path.write_text("".join(f"{t}\n" for t in vocab.tokens))
    return path
