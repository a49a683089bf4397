"""stoker/pipeline/text/sentences.py: sentence splitting."""

from __future__ import annotations

from stoker.pipeline.text.sentences import split_sentences


def test_sentence_splitting_keeps_initials_abbreviations_and_decimals_together():
    line = ("2001: A Space Odyssey was co-written by Arthur C. Clarke. It cost $10.5 million. "
            "Dr. Smith of the U.S. Army said so! Did he?")
    assert split_sentences(line) == ["2001: A Space Odyssey was co-written by Arthur C. Clarke.",
                                     "It cost $10.5 million.", "Dr. Smith of the U.S. Army said so!", "Did he?"]
