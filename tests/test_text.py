"""BERT pretraining data on real Wikipedia text and BERT's real vocabulary, in one process."""

from __future__ import annotations

import hashlib
import multiprocessing as mp

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.plan import Segment, Unit
from pipeline.shards import Manifest
from pipeline.text.batching import TextUnitSource
from pipeline.text.docs import DOC_SCHEMA, ShardError, flatten, read_doc_shard, write_doc_shard
from pipeline.text.examples import Specials, TextConfig
from pipeline.text.layout import attention_blocks, tensor_specs
from pipeline.text.packing import pack
from pipeline.text.prepare import TextPrepareConfig, prepare_wikipedia, raw_documents
from pipeline.text.sentences import split_sentences
from pipeline.text.vocab import Vocab, VocabError


@pytest.fixture(scope="module")
def vocab(wiki_manifest) -> Vocab:
    return Vocab.load(wiki_manifest.relative_uri(wiki_manifest.vocab))


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


# ---- vocabulary and tokens ---------------------------------------------------------------

def test_the_real_bert_vocabulary_loads_with_its_special_ids(vocab):
    assert vocab.size == 30522
    assert (vocab.cls_id, vocab.sep_id, vocab.mask_id, vocab.pad_id) == (101, 102, 103, 0)


@pytest.mark.parametrize("text, problem", [
    ("hello\nworld\n", "missing"),
    ("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nof\n", "continuation"),
    ("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n\u2581the\t-3.1\n##s\n", "single WordPiece token"),
    ("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n##s\nthe\n", "twice"),
])
def test_a_vocab_that_is_not_wordpiece_is_refused_with_the_reason(tmp_path, text, problem):
    path = tmp_path / "vocab.txt"
    path.write_text(text)
    with pytest.raises(VocabError, match=problem):
        Vocab.load(path)


def test_sentence_splitting_keeps_initials_abbreviations_and_decimals_together():
    line = ("2001: A Space Odyssey was co-written by Arthur C. Clarke. It cost $10.5 million. "
            "Dr. Smith of the U.S. Army said so! Did he?")
    assert split_sentences(line) == ["2001: A Space Odyssey was co-written by Arthur C. Clarke.",
                                     "It cost $10.5 million.", "Dr. Smith of the U.S. Army said so!", "Did he?"]


def test_token_ids_round_trip_to_the_original_words(wiki_corpus, wiki_manifest, vocab):
    tokenizer = vocab.tokenizer()
    originals = {key: raw.decode() for key, raw in raw_documents([wiki_corpus.text])}
    table = pq.read_table(wiki_manifest.shard_uri(0))
    checked = 0
    for key, sentences in zip(table.column("doc_key").to_pylist()[:200], table.column("sentences").to_pylist()[:200],
                              strict=True):
        words = []
        for line in originals[key].splitlines():
            normalized = tokenizer.normalizer.normalize_str(line)
            words += [w for w, _ in tokenizer.pre_tokenizer.pre_tokenize_str(normalized)]
        decoded = []
        for ids in sentences:
            pieces = [vocab.tokens[i] for i in ids]
            for piece in pieces:
                if piece.startswith("##"):
                    decoded[-1] += piece[2:]
                else:
                    decoded.append(piece)
        if "[UNK]" in decoded:  # a character outside the vocabulary cannot round-trip
            continue
        assert decoded == words, key
        checked += 1
    assert checked >= 190


# ---- examples ------------------------------------------------------------------------------

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


# ---- packing --------------------------------------------------------------------------------

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


# ---- determinism and bad input ---------------------------------------------------------------

def _digest(manifest_uri: str, shard: int, seed: int) -> str:
    manifest = Manifest.load(manifest_uri)
    digest = hashlib.sha256()
    unit = whole_shard_unit(manifest, shard, epoch=1)
    for batch in source(manifest, shard, TextConfig(pack=True, whole_word_mask=True), seed).batches(unit, 16):
        for name in sorted(batch.tensors):
            digest.update(batch.tensors[name].tobytes())
        digest.update(str(batch.doc_ids).encode())
    return digest.hexdigest()


def test_the_same_seed_gives_identical_batches_in_another_process(wiki_manifest):
    here = _digest(wiki_manifest.uri, 1, seed=7)
    with mp.get_context("spawn").Pool(1) as pool:
        there = pool.apply(_digest, (wiki_manifest.uri, 1, 7))
    assert here == there
    assert _digest(wiki_manifest.uri, 1, seed=8) != here


def test_unusable_documents_are_reported_not_batched(vocab, tmp_path):
    keys = ["good", "empty", "nulls", "out-of-vocab", "negative", "also-good"]
    sentences = [[[2023, 2003], [1037, 3231]], [], None, [[2023, 40000]], [[-5]], [[2023, 2003, 1037]]]
    table = pa.table([pa.array(keys), pa.array(sentences, DOC_SCHEMA.field("sentences").type)], schema=DOC_SCHEMA)
    docs = flatten(table, vocab.size)
    assert set(docs.problems) == {1, 2, 3, 4}
    assert "outside the vocabulary" in docs.problems[3]
    src = TextUnitSource(docs, TextConfig(), Specials.of(vocab), seed=0)
    batches = list(src.batches(one_range(0, 0, 0, 0, len(keys), 100), batch_size=64))
    assert sorted(d for b in batches for d in b.doc_ids) == [100, 105]
    assert sorted(key for b in batches for _, key, _ in b.skipped) == sorted(keys[1:5])


def test_a_malformed_or_replaced_shard_is_refused(wiki_manifest, vocab, tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ShardError, match="Parquet"):
        read_doc_shard(str(bad), None, vocab.size)
    with pytest.raises(ShardError, match="sha256"):  # shard 1's file where the manifest expects shard 0
        read_doc_shard(wiki_manifest.shard_uri(1), wiki_manifest.shards[0], vocab.size)


def test_prepare_skips_undecodable_and_empty_documents(vocab, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"First sentence here. Second one.\nA third line.\n\n"
                       b"\xff\xfe broken bytes\n\n"
                       b"\x00\x01\n\n"
                       b"Last document.\n")
    result = prepare_wikipedia(corpus, tmp_path / "out", vocab_file(tmp_path, vocab), TextPrepareConfig(progress=False))
    assert result.manifest.num_samples == 2 and result.sentences == 4
    reasons = sorted(item["reason"].split(":")[0] for item in result.skipped)
    assert reasons == ["document has no tokens", "not UTF-8 text"]


def vocab_file(folder, vocab: Vocab):
    path = folder / "vocab.txt"
    path.write_text("".join(f"{t}\n" for t in vocab.tokens))
    return path
