"""stoker/pipeline/text/bert_sources.py: which reading `stoker prepare wikipedia` gives SRC."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.pipeline.text.bert_sources import (
    BERT_TEXT,
    DOCUMENTS,
    DocumentOptions,
    bert_source,
    text_files,
)
from stoker.pipeline.text.token_prepare import NamedSkips, TokenPrepareConfig
from stoker.protos.errors import ConfigError, DataError, NotFound

BERT = "First sentence. Second sentence.\nA third line.\n\nAnother document.\n"


def _jsonl(path: Path, texts: list[object]) -> Path:
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return path


def test_the_options_are_the_token_commands_own():
    token = {f: TokenPrepareConfig.__dataclass_fields__[f] for f in ("text_field", "source_name")}
    for name, found in token.items():
        mine = DocumentOptions.__dataclass_fields__[name]
        assert mine.default == found.default and dict(mine.metadata) == dict(found.metadata)


def test_txt_files_and_folders_of_them_stay_bert_text(tmp_path):
    (tmp_path / "a.txt").write_text(BERT)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text(BERT)
    for side in ("vocab.txt", "titles.txt", "ATTRIBUTION.txt"):
        (tmp_path / side).write_text("x\n")
    (tmp_path / "notes.md").write_text("ignored")
    folder = bert_source(tmp_path)
    assert folder.read_as == BERT_TEXT
    assert list(folder.files) == text_files(tmp_path) == [tmp_path / "a.txt", tmp_path / "sub" / "b.txt"]
    assert bert_source(tmp_path / "a.txt").read_as == BERT_TEXT
    odd = tmp_path / "corpus.text"  # a file no document reader takes was always BERT's
    odd.write_text(BERT)
    assert bert_source(odd).files == (odd,)
    assert bert_source(f"{tmp_path}/*.txt").read_as == BERT_TEXT
    assert bert_source(tmp_path).record() == {"source": tmp_path.name, "read_as": BERT_TEXT}


def test_document_files_are_read_as_documents_in_order(tmp_path):
    _jsonl(tmp_path / "a.jsonl", ["One. Two.", "Three."])
    pq.write_table(pa.table({"body": ["Four.", "Five."]}), tmp_path / "b.parquet")
    with tarfile.open(tmp_path / "c.tar", "w") as tar:
        data = b"Six."
        info = tarfile.TarInfo("s/000.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (tmp_path / "vocab.txt").write_text("[PAD]\n")  # never a document
    jsonl = bert_source(tmp_path / "a.jsonl")
    assert jsonl.read_as == DOCUMENTS
    a = tmp_path / "a.jsonl"
    assert list(jsonl.texts(NamedSkips())) == [("a.jsonl:1", f"{a}:1", "One. Two."), ("a.jsonl:2", f"{a}:2", "Three.")]
    with pytest.raises(DataError, match="no column 'text'"):  # refused before anything is read
        bert_source(tmp_path / "b.parquet")
    table = bert_source(tmp_path / "b.parquet", DocumentOptions(text_field="body", source_name="mine"))
    assert [t for _, _, t in table.texts(NamedSkips())] == ["Four.", "Five."]
    assert table.record() == {"source": "mine", "read_as": DOCUMENTS, "text_field": "body"}
    (tmp_path / "b.parquet").unlink()
    folder = bert_source(tmp_path)
    assert [k for k, _, _ in folder.texts(NamedSkips())] == ["a.jsonl:1", "a.jsonl:2", "c.tar:s/000"]


def test_bad_documents_are_skipped_counted_and_named(tmp_path):
    path = _jsonl(tmp_path / "bad.jsonl", ["Good one.", "", "   "])
    with open(path, "a") as out:
        out.write("not json\n" + json.dumps({"id": "x"}) + "\n")
    skipped = NamedSkips()
    assert [t for _, _, t in bert_source(path).texts(skipped)] == ["Good one."]
    assert skipped.counts == {"empty": 2, "not JSON": 1, "no text field": 1}
    assert [item["path"] for item in skipped.named] == [f"{path}:{n}" for n in (2, 3, 4, 5)]


def test_a_folder_of_both_kinds_is_refused_unless_documents_is_given(tmp_path):
    (tmp_path / "a.txt").write_text(BERT)
    _jsonl(tmp_path / "b.jsonl", ["Two."])
    with pytest.raises(ConfigError, match="both BERT-format text .*a.txt.* and document files .*b.jsonl.*--documents"):
        bert_source(tmp_path)
    both = bert_source(tmp_path, DocumentOptions(documents=True))
    assert both.read_as == DOCUMENTS
    assert [(k, t) for k, _, t in both.texts(NamedSkips())] == [("a.txt", BERT), ("b.jsonl:1", "Two.")]
    one = bert_source(tmp_path / "a.txt", DocumentOptions(documents=True))
    assert [(k, t) for k, _, t in one.texts(NamedSkips())] == [("a.txt", BERT)]


def test_settings_that_cannot_apply_are_refused_in_one_line(tmp_path):
    (tmp_path / "a.txt").write_text(BERT)
    with pytest.raises(ConfigError, match="--text-field .* BERT-format text"):
        bert_source(tmp_path / "a.txt", DocumentOptions(text_field="body"))
    with pytest.raises(NotFound, match="no such file or folder"):
        bert_source(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotFound, match="no .txt files"):
        bert_source(tmp_path / "empty")
    with pytest.raises(ConfigError, match="not a kind of text file"):
        bert_source(_odd(tmp_path), DocumentOptions(documents=True))
    with pytest.raises(ConfigError, match="source 'no_such_module_here:make'"):
        bert_source("no_such_module_here:make")


def _odd(folder: Path) -> Path:
    odd = folder / "corpus.text"
    odd.write_text(BERT)
    return odd


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(alphabet="ab. \n", max_size=12), min_size=1, max_size=8))
def test_every_document_is_one_text_or_one_named_skip(tmp_path, texts):
    path = _jsonl(tmp_path / "p.jsonl", texts)
    skipped = NamedSkips()
    try:
        got = list(bert_source(path).texts(skipped))
    except DataError:  # none at all: said, not silent
        got = []
        assert all(not t.strip() for t in texts)
    assert [t for _, _, t in got] == [t for t in texts if t.strip()]
    assert len(got) + skipped.total == len(texts) == len(got) + len(skipped.named)
