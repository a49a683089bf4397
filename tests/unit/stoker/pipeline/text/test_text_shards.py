"""Online token sets' text shards: read whole and checked, and each unit tokenized in one call into the
same documents a token set holds, a count the lengths file does not plan skipped and named."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.docs import ShardError
from stoker.pipeline.text.text_shards import (
    NO_TEXT,
    TextShard,
    encode_unit,
    is_online,
    read_text_shard,
    write_text_shard,
)
from stoker.pipeline.text.token_cost import manifest_tokenizer
from stoker.pipeline.text.token_prepare import TokenPrepareConfig, prepare_tokens
from stoker.pipeline.text.token_shards import lengths_of, read_token_shard
from stoker.pipeline.units import Segment, Unit
from tests.token_corpus import jsonl, texts, tokenizer_json


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """The same 50 documents prepared twice: as token shards and online (text shards), 20 per shard."""
    folder = tmp_path_factory.mktemp("online")
    corpus = texts(50)
    tok = tokenizer_json(folder / "tok.json", corpus)
    src = jsonl(folder / "corpus.jsonl", corpus)
    made = {}
    for name, online in (("tokens", False), ("online", True)):
        cfg = TokenPrepareConfig(docs_per_shard=20, progress=False, online=online)
        made[name] = Manifest.load(prepare_tokens(src, folder / name, str(tok), cfg).manifest.uri)
    return made


def test_a_text_shard_reads_back_as_written_and_a_changed_or_foreign_one_is_refused(tmp_path, sets):
    path = tmp_path / "t.parquet"
    write_text_shard(str(path), ["a", "b"], ["one text", "another"])
    shard = read_text_shard(str(path), None)
    assert len(shard) == 2 and shard.keys == ["a", "b"] and shard.texts == ["one text", "another"]
    online = sets["online"]
    info = online.shards[0]
    assert len(read_text_shard(online.shard_uri(0), info)) == info.num_samples
    with pytest.raises(ShardError, match="sha256 does not match"):
        read_text_shard(str(path), info)
    with pytest.raises(ShardError, match=r"columns \['key', 'tokens'\] are not a text shard's"):
        read_text_shard(sets["tokens"].shard_uri(0), None)
    with pytest.raises(ShardError, match="unreadable"):
        read_text_shard(str(tmp_path / "missing.parquet"), None)


def test_an_online_set_is_told_from_a_token_set_by_its_manifest(sets):
    assert is_online(sets["online"]) and not is_online(sets["tokens"])


@settings(max_examples=25, deadline=None)
@given(start=st.integers(0, 19), size=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
def test_a_units_documents_tokenized_online_are_the_token_sets_documents(sets, start, size, seed):
    """Any unit (one shard or two): one encode_batch call, and every document the token set's, row for row."""
    online, tokens = sets["online"], sets["tokens"]
    first = min(size, 20 - start)
    size = min(size, first + 20)  # the second shard's 20 rows at most
    segments = (Segment(0, start, start + first, 0),) + ((Segment(1, 0, size - first, 20),) if size > first else ())
    unit = Unit(0, 0, segments)
    tok = manifest_tokenizer(online)
    calls = []
    counting = replace(tok, encoder=lambda batch: calls.append(len(batch)) or tok.encoder(batch))
    shard_of = encode_unit(lambda i: read_text_shard(online.shard_uri(i), online.shards[i]), unit, seed, counting,
                           lengths_of(online))
    assert calls == [size]
    for shard_index, row, _ in unit.rows(seed):
        want = read_token_shard(tokens.shard_uri(shard_index), tokens.shards[shard_index], 300)
        got = shard_of(shard_index)
        assert not isinstance(got, str) and got.problem(row) is None and got.key(row) == want.key(row)
        np.testing.assert_array_equal(got.document(row), want.document(row))


def test_a_count_the_lengths_file_does_not_plan_and_an_empty_text_are_problems_of_their_rows(sets):
    online = sets["online"]
    lengths = lengths_of(online).copy()
    lengths[3] += 1  # as if the set was prepared with another tokenizers version
    shard = read_text_shard(online.shard_uri(0), online.shards[0])
    shard.texts[5] = ""
    unit = Unit(0, 0, (Segment(0, 0, 10, 0), Segment(1, 0, 2, 20)))
    shard_of = encode_unit(lambda i: shard if i == 0 else "unreadable shard: gone", unit, 0,
                           manifest_tokenizer(online), lengths)
    got = shard_of(0)
    assert not isinstance(got, str)
    assert got.problem(3) == (f"tokenized to {lengths[3] - 1} tokens here, {lengths[3]} when the set was prepared "
                              "(another tokenizers version?)")
    assert got.problem(5) == NO_TEXT
    assert all(got.problem(row) is None and got.document(row).size == lengths[row] for row in (0, 1, 2, 4, 6, 9))
    assert shard_of(1) == "unreadable shard: gone"


def test_a_unit_of_no_usable_text_makes_no_encode_call(sets):
    online = sets["online"]
    tok = manifest_tokenizer(online)
    calls = []
    counting = replace(tok, encoder=lambda batch: calls.append(batch) or tok.encoder(batch))
    blank = TextShard(["a", "b"], [None, ""])
    shard_of = encode_unit(lambda i: blank, Unit(0, 0, (Segment(0, 0, 2, 0),)), 0, counting, np.array([3, 4]))
    got = shard_of(0)
    assert calls == [] and not isinstance(got, str) and got.problem(0) == got.problem(1) == NO_TEXT


def test_writing_over_a_hard_linked_text_shard_replaces_the_name_and_leaves_the_link_as_it_was(tmp_path):
    shard, kept = tmp_path / "text-00000.parquet", tmp_path / "kept.parquet"
    write_text_shard(str(shard), ["a"], ["first text"])
    kept.hardlink_to(shard)
    before = kept.read_bytes()
    write_text_shard(str(shard), ["b"], ["another text"])
    assert kept.read_bytes() == before and shard.read_bytes() != before
    assert read_text_shard(str(shard), None).keys == ["b"]
