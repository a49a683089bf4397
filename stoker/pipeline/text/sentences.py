"""Sentence splitting for lines of running text.

BERT's `create_pretraining_data` input has one sentence per line; text that arrives a
paragraph per line is split here. A full stop ends a sentence when the next word starts
with a capital, digit or quote, unless the stop belongs to a known abbreviation or an
initial ("Arthur C. Clarke"). A line that is already one sentence comes back unchanged.
"""

from __future__ import annotations

import re

_ABBREVIATIONS = frozenset("""
mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e cf al approx ca no nos vol vols fig figs
jan feb mar apr jun jul aug sep sept oct nov dec inc ltd co corp bros gen gov col lt sgt
rev hon u.s u.k u.n a.d b.c d.c p.m a.m ph.d
""".split())

# A candidate boundary: terminal punctuation (plus closing quotes/brackets), whitespace, then
# something that can start a sentence.
_BOUNDARY = re.compile(r"""([.!?]['")\]]*)\s+(?=["'(\[]?[A-Z0-9])""")


def _ends_with_abbreviation(text: str) -> bool:
    word = text.rsplit(None, 1)[-1] if text.strip() else ""
    word = word.lstrip("(\"'[").rstrip(".").lower()
    return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def split_sentences(line: str) -> list[str]:
    """The sentences of one line of text, stripped; empty lines give none."""
    line = line.strip()
    if not line:
        return []
    sentences = []
    start = 0
    for match in _BOUNDARY.finditer(line):
        end = match.end(1)
        candidate = line[start:end]
        if match.group(1).startswith(".") and _ends_with_abbreviation(candidate):
            continue
        sentences.append(candidate.strip())
        start = match.end()
    tail = line[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences
