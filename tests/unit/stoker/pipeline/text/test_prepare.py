"""stoker/pipeline/text/prepare.py: raw text to tokenized Parquet shards."""

from __future__ import annotations

import pyarrow.parquet as pq

from stoker.pipeline.text.prepare import TextPrepareConfig, prepare_wikipedia, raw_documents
from tests.unit.stoker.pipeline.text.support import vocab_file


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
