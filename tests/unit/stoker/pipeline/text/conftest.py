"""The real BERT vocabulary of the test corpus."""

import pytest

from stoker.pipeline.text.vocab import Vocab


@pytest.fixture(scope="module")
def vocab(wiki_manifest) -> Vocab:
    return Vocab.load(wiki_manifest.relative_uri(wiki_manifest.vocab))
