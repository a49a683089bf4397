"""stoker/pipeline/text/packing.py and layout.py: several sequences per row, kept apart."""

from __future__ import annotations

import numpy as np
import pytest

from stoker.pipeline.text.examples import TextConfig
from stoker.pipeline.text.layout import attention_blocks, tensor_specs
from stoker.pipeline.text.packing import pack
from tests.unit.stoker.pipeline.text.support import one_range, source


def test_pack_places_every_sequence_once_within_every_capacity():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 512, size=2000)
    preds = np.minimum(76, np.maximum(1, np.round(lengths * 0.15))).astype(int)
    rows = pack(lengths, preds, 512, 3, 79)
    assert sorted(i for row in rows for i in row) == list(range(2000))
    assert all(lengths[r].sum() <= 512 and preds[r].sum() <= 79 and 1 <= len(r) <= 3 for r in rows)
    assert len(rows) < 0.85 * 2000  # it did pack
    with pytest.raises(ValueError, match="longer than a row"):
        pack(np.array([513]), np.array([1]), 512, 3, 79)


@pytest.mark.parametrize("seq_len", [128, 512])
def test_packed_rows_keep_sequences_apart_and_lose_nothing(wiki_manifest, vocab, seq_len):
    cfg = TextConfig(seq_len=seq_len, pack=True)
    unit = one_range(0, 0, 0, 0, 256, wiki_manifest.shards[0].first_sample_id)
    packed = list(source(wiki_manifest, 0, cfg).batches(unit, batch_size=32))
    plain = list(source(wiki_manifest, 0, TextConfig(seq_len=seq_len)).batches(unit, batch_size=32))
    assert set(tensor_specs(cfg)) == set(packed[0].tensors)
    seen_from_packed = []
    padding_before = padding_after = 0.0
    for batch in packed:
        t = batch.tensors
        for r in range(batch.rows):
            mask, ids, pos, types = (t[k][r] for k in ("attention_mask", "input_ids", "position_ids",
                                                       "token_type_ids"))
            starts = t["next_sentence_positions"][r][t["next_sentence_weights"][r] > 0]
            ends = list(starts[1:]) + [int(np.count_nonzero(mask))]
            allowed = attention_blocks(mask[None])[0]
            for k, (a, b) in enumerate(zip(starts, ends, strict=True)):
                assert np.all(mask[a:b] == k + 1) and ids[a] == vocab.cls_id and ids[b - 1] == vocab.sep_id
                assert np.array_equal(pos[a:b], np.arange(b - a))
                assert types[a] == 0 and types[b - 1] == 1
                outside = np.ones(seq_len, bool)
                outside[a:b] = False
                assert allowed[a:b][:, a:b].all() and not allowed[a:b][:, outside].any()
                seen_from_packed.append(ids[a:b].tobytes())
            assert np.all(mask[ends[-1]:] == 0) and np.all(ids[ends[-1]:] == 0)
            weights = t["masked_lm_weights"][r] > 0
            assert np.all(mask[t["masked_lm_positions"][r][weights]] > 0)
        padding_before += batch.unpacked_slots - batch.real_tokens
        padding_after += batch.token_slots - batch.real_tokens
    seen_from_plain = [b.tensors["input_ids"][r][b.tensors["attention_mask"][r] > 0].tobytes()
                       for b in plain for r in range(b.rows)]
    assert sorted(seen_from_packed) == sorted(seen_from_plain)  # the same sequences, only rearranged
    assert sorted(d for b in packed for d in b.doc_ids) == sorted(d for b in plain for d in b.doc_ids)
    assert padding_after < 0.5 * padding_before
