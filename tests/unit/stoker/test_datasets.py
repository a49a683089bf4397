"""stoker/datasets.py's public writers of real text and the real BPE tokenizer.json: what examples and docs
use (they may import only the public API), each the same documents as the readers under it, in order."""

from __future__ import annotations

import json

from stoker.datasets import bible_jsonl, bpe_tokenizer, wikipedia_jsonl
from stoker.pipeline.text.corpus import read_articles
from stoker.pipeline.text.shipped import BPE_FINGERPRINT, bpe_tokenizer_config, read_chapters
from stoker.pipeline.text.sources import TextSource
from stoker.pipeline.text.tokenizer import TokenizerConfig


def _lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_n_wikipedia_sections_as_jsonl_with_their_attribution(tmp_path):
    path = wikipedia_jsonl(tmp_path / "deep" / "wiki.jsonl", 7)
    assert path == tmp_path / "deep" / "wiki.jsonl"
    assert [(d["id"], d["text"]) for d in _lines(path)] == read_articles()[:7]
    assert "CC BY-SA 4.0" in (path.parent / "ATTRIBUTION.txt").read_text()
    assert [d.text for d in TextSource(str(path)).documents()] == [t for _, t in read_articles()[:7]]


def test_n_bible_chapters_as_jsonl(tmp_path):
    lines = _lines(bible_jsonl(tmp_path / "bible.jsonl", 3))
    assert [(d["id"], d["text"]) for d in lines] == list(read_chapters()[:3])
    assert lines[0]["id"] == "Genesis 1" and lines[0]["text"].startswith("In the beginning God created")


def test_the_bpe_tokenizer_path_loads_without_naming_its_end_of_text(tmp_path):
    path = bpe_tokenizer(tmp_path)
    assert path == tmp_path / "tokenizer.json"
    tok = TokenizerConfig(path=str(path)).load()  # <EOT> is among the names looked for
    named = bpe_tokenizer_config(tmp_path).load()
    assert (tok.eot_id, tok.vocab_size, tok.fingerprint) == (named.eot_id, 65000, BPE_FINGERPRINT) == (0, 65000,
                                                                                                        tok.fingerprint)
    assert bpe_tokenizer().read_bytes() == path.read_bytes()  # the cache's copy is the same file
