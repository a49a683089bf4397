"""stoker/pipeline/text/vocab.py: BERT's WordPiece vocabulary, loaded and checked."""

from __future__ import annotations

import pytest

from stoker.pipeline.text.vocab import Vocab, VocabError


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
