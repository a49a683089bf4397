"""stoker/pipeline/text/examples.py: BERT examples, masking and next-sentence pairs."""

from __future__ import annotations

import numpy as np
import pytest

from stoker.pipeline.text.batching import TextUnitSource
from stoker.pipeline.text.docs import read_doc_shard, write_doc_shard
from stoker.pipeline.text.examples import Specials, TextConfig
from tests.unit.stoker.pipeline.text.support import one_range, sequences_of


@pytest.mark.parametrize("seq_len", [128, 512])
def test_masking_is_15_percent_with_the_80_10_10_split(wiki_manifest, vocab, seq_len):
    cfg = TextConfig(seq_len=seq_len)
    seqs = sequences_of(wiki_manifest, cfg)
    assert len(seqs) > 1500
    tokens = sum(len(s) for s in seqs)
    masked = np.concatenate([s.tokens[s.masked_positions] for s in seqs])
    original = np.concatenate([s.masked_ids for s in seqs])
    assert abs(masked.size / tokens - 0.15) < 0.01
    as_mask = np.mean(masked == vocab.mask_id)
    unchanged = np.mean(masked == original)
    assert abs(as_mask - 0.8) < 0.015 and abs(unchanged - 0.1) < 0.015
    assert abs((1 - as_mask - unchanged) - 0.1) < 0.015  # replaced by a random token
    for s in seqs:
        assert len(s) <= seq_len and s.tokens[0] == vocab.cls_id and s.tokens[-1] == vocab.sep_id
        assert s.tokens[s.len_a + 1] == vocab.sep_id
        assert s.masked_positions.size <= cfg.predictions_per_sequence
        assert not np.isin(s.masked_positions, [0, s.len_a + 1, len(s) - 1]).any()  # never a special token
        assert np.all(np.diff(s.masked_positions) > 0)


def test_whole_word_masking_masks_every_piece_of_a_chosen_word(wiki_manifest, vocab):
    seqs = sequences_of(wiki_manifest, TextConfig(whole_word_mask=True), shards=(0,))
    continuation = vocab.continuation_flags()
    tokens = 0
    masked = 0
    for s in seqs:
        original = s.tokens.copy()
        original[s.masked_positions] = s.masked_ids
        chosen = np.zeros(len(s), bool)
        chosen[s.masked_positions] = True
        for p in range(2, len(s) - 1):  # a ## piece is chosen exactly when the piece before it is
            if continuation[original[p]] and original[p - 1] not in (vocab.sep_id, vocab.cls_id):
                assert chosen[p] == chosen[p - 1]
        tokens += len(s)
        masked += s.masked_positions.size
    assert abs(masked / tokens - 0.15) < 0.01


def test_next_sentence_labels_are_half_random_on_long_documents(wiki_manifest, vocab, tmp_path):
    """Real sentences grouped into article-length documents, as in full Wikipedia.

    A chunk of one sentence has no next sentence, so the reference pairs it at random by rule.
    Lead sections are short and have many such chunks (about 65% of their labels are random);
    article-length documents have few, and there the labels come out close to 50/50.
    """
    short = read_doc_shard(wiki_manifest.shard_uri(0), wiki_manifest.shards[0], vocab.size)
    keys, docs = [], []
    for first in range(0, len(short) - 20, 20):  # 20 lead sections make one long document
        sentences = []
        for row in range(first, first + 20):
            a, b = short.sentence_span(row)
            sentences += [short.token_span(i, i + 1).tolist() for i in range(a, b)]
        keys.append(f"long-{first}")
        docs.append(sentences)
    write_doc_shard(str(tmp_path / "long.parquet"), keys, docs)
    long_docs = read_doc_shard(str(tmp_path / "long.parquet"), None, vocab.size)
    src = TextUnitSource(long_docs, TextConfig(), Specials.of(vocab), seed=0)
    seqs = []
    for epoch in range(8):
        seqs += src.sequences(one_range(epoch, epoch, 0, 0, len(long_docs), 0))[0]
    assert len(seqs) > 3000
    coin = [s.is_random_next for s in seqs if not s.forced_random]
    assert abs(np.mean(coin) - 0.5) < 0.025  # the coin is fair
    assert abs(np.mean([s.is_random_next for s in seqs]) - 0.5) < 0.05  # and forced pairs are few


def test_a_sentence_longer_than_the_row_is_truncated_not_fatal(vocab, tmp_path):
    rng = np.random.default_rng(1)
    huge = rng.integers(1000, 30000, size=5000).tolist()
    write_doc_shard(str(tmp_path / "s.parquet"), ["huge", "small"], [[huge, huge[:7]], [huge[:9]]])
    docs = read_doc_shard(str(tmp_path / "s.parquet"), None, vocab.size)
    src = TextUnitSource(docs, TextConfig(seq_len=128), Specials.of(vocab), seed=0)
    batches = list(src.batches(one_range(0, 0, 0, 0, 2, 0), batch_size=8))
    assert batches[-1].last and batches[0].tensors["input_ids"].shape[1] == 128
    assert sum(b.sequences for b in batches) >= 2 and all(len(set(b.doc_ids)) == len(b.doc_ids) for b in batches)
