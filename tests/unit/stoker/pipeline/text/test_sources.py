"""Text sources read real files written here: every document once, in order; the bad ones skipped,
counted and named; what cannot be read refused naming the file."""

from __future__ import annotations

import gzip
import io
import json
import logging
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.pipeline.text.shipped import read_chapters, write_bible_jsonl
from stoker.pipeline.text.sources import (
    EMPTY,
    NO_TEXT,
    NOT_JSON,
    NOT_OBJECT,
    NOT_STRING,
    NOT_UTF8,
    CallableSource,
    Document,
    SourceRefused,
    TextSource,
    first_line,
    pin_source,
)
from stoker.protos.errors import ConfigError, DataError


def _jsonl(path: Path, texts: list[str], compress: bool = False) -> Path:
    data = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz" if path.suffix == ".tgz" else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _parquet(path: Path, columns: dict[str, list], row_group_size: int = 2) -> Path:
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def _read(source: TextSource) -> list[tuple[str, int, str, str]]:
    return [(Path(d.source).name, d.index, d.key, d.text) for d in source.documents()]


def test_a_folder_of_every_kind_gives_each_document_once_in_path_order(tmp_path, caplog):
    _jsonl(tmp_path / "a.jsonl", ["a one", "a two"])
    _jsonl(tmp_path / "b.jsonl.gz", ["b one"], compress=True)
    _parquet(tmp_path / "c.parquet", {"text": ["c0", "c1", "c2", "c3", "c4"]})
    _tar(tmp_path / "d.tar", {"s/001.txt": b"d one", "s/001.json": b"{}", "s/002.jpg": b"x", "s/003.txt": b"d two"})
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "e.txt").write_text("e\nwith lines\n")
    (tmp_path / "notes.md").write_text("not a corpus")
    with caplog.at_level(logging.WARNING, "stoker.text"):
        source = TextSource(tmp_path, batch_rows=2)
    assert "notes.md" in caplog.text
    assert _read(source) == [
        ("a.jsonl", 1, "1", "a one"), ("a.jsonl", 2, "2", "a two"),
        ("b.jsonl.gz", 1, "1", "b one"),
        *[("c.parquet", i, str(i), f"c{i}") for i in range(5)],
        ("d.tar", 0, "s/001", "d one"), ("d.tar", 1, "s/003", "d two"),
        ("e.txt", 0, "sub/e.txt", "e\nwith lines\n"),
    ]
    assert source.skipped.total == 0
    assert _read(source) == _read(TextSource(tmp_path, batch_rows=2))  # the same again: deterministic


def test_a_glob_a_brace_pattern_and_an_id_field_or_column(tmp_path):
    for n in range(3):
        (tmp_path / f"part-{n}.jsonl").write_text(json.dumps({"body": f"doc {n}", "uid": f"u{n}"}) + "\n")
    source = TextSource(tmp_path / "part-{0..2}.jsonl", text_field="body", id_field="uid")
    assert [(d.key, d.text) for d in source.documents()] == [("u0", "doc 0"), ("u1", "doc 1"), ("u2", "doc 2")]
    assert [d.text for d in TextSource(str(tmp_path / "part-[12].jsonl"), text_field="body").documents()] == \
        ["doc 1", "doc 2"]
    _parquet(tmp_path / "hf.parquet", {"id": ["x", "y", None], "text": ["one", "two", "three"]})
    assert [(d.key, d.text) for d in TextSource(tmp_path / "hf.parquet", id_field="id").documents()] == \
        [("x", "one"), ("y", "two"), ("2", "three")]


def test_each_bad_line_is_skipped_counted_and_named_once_with_its_file_and_line(tmp_path, caplog):
    path = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"text": "good one"}).encode(), b"{not json", json.dumps([1, 2]).encode(),
             json.dumps({"body": "x"}).encode(), json.dumps({"text": 7}).encode(), b'{"text": "caf\xe9"}',
             json.dumps({"text": ""}).encode(), json.dumps({"text": " \n\t"}).encode(), b"",
             json.dumps({"text": "\ud800"}).encode(), json.dumps({"text": "good two"}).encode()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    source = TextSource(path)
    with caplog.at_level(logging.WARNING, "stoker.text"):
        assert [(d.index, d.text) for d in source.documents()] == [(1, "good one"), (11, "good two")]
    assert source.skipped.counts == {NOT_JSON: 1, NOT_OBJECT: 1, NO_TEXT: 1, NOT_STRING: 1, NOT_UTF8: 2, EMPTY: 2}
    for number, reason in [(2, NOT_JSON), (3, NOT_OBJECT), (4, NO_TEXT), (5, NOT_STRING), (6, NOT_UTF8),
                           (7, EMPTY), (8, EMPTY), (10, NOT_UTF8)]:
        assert caplog.text.count(f"{path}:{number}: {reason}") == 1
    assert f"{path}:9:" not in caplog.text  # a blank line holds no document
    assert source.skipped.examples[0].startswith(f"{path}:2: {NOT_JSON}")
    assert len(source.skipped.examples) == 5


def test_blank_lines_are_counted_and_said_in_the_closing_summary_not_skipped_as_errors(tmp_path, caplog):
    """Three blank lines (one of spaces, one a CRLF) among two documents and one bad line: no document is lost,
    the bad line is named once, and the closing line says 3 blank lines were passed over."""
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b'{"text": "one"}\n\n   \n{"text": ""}\r\n\r\n{"text": "two"}\n')
    source = TextSource(path)
    with caplog.at_level(logging.INFO, "stoker.text"):
        assert [d.text for d in source.documents()] == ["one", "two"]
    assert source.skipped.counts == {EMPTY: 1} and source.skipped.blank_lines == 3
    closing = [r for r in caplog.records if "document(s) skipped" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in closing] == [
        (logging.WARNING, f"{path}: 1 document(s) skipped: 1 empty; 3 blank line(s) passed over (no document in "
                          f"them, not an error)")]
    assert caplog.text.count(f"{path}:4: {EMPTY}") == 1  # the skipped document, named once
    clean = tmp_path / "clean.jsonl"
    clean.write_text('{"text": "one"}\n\n')
    caplog.clear()
    with caplog.at_level(logging.INFO, "stoker.text"):
        assert [d.text for d in TextSource(clean).documents()] == ["one"]
    [line] = [r for r in caplog.records if "blank line" in r.getMessage()]
    assert line.levelno == logging.INFO  # not a warning: nothing was wrong
    assert "0 document(s) skipped: none; 1 blank line(s) passed over" in line.getMessage()


def test_bad_text_in_tars_txt_files_and_parquet_is_skipped_and_counted(tmp_path):
    _tar(tmp_path / "a.tgz", {"k1.txt": b"\xff\xfe bad", "k2.txt": b"  ", "k3.txt": b"fine"})
    (tmp_path / "b.txt").write_bytes(b"caf\xe9")
    _parquet(tmp_path / "c.parquet", {"text": ["", None, "kept"]})
    source = TextSource(tmp_path)
    assert [(d.key, d.text) for d in source.documents()] == [("k3", "fine"), ("2", "kept")]
    assert source.skipped.counts == {NOT_UTF8: 2, EMPTY: 2, NO_TEXT: 1}
    assert any(e.startswith(f"{tmp_path / 'a.tgz'}:k1.txt: {NOT_UTF8}") for e in source.skipped.examples)


def test_a_wrong_column_an_unsupported_file_an_empty_source_and_a_non_tar_are_refused(tmp_path):
    wrong = _parquet(tmp_path / "wrong.parquet", {"content": ["a"]})
    with pytest.raises(DataError, match=r"wrong\.parquet: no column 'text' \(its columns: content: string\)"):
        TextSource(wrong)
    with pytest.raises(DataError, match=r"wrong\.parquet: no id column 'uid'"):
        TextSource(wrong, text_field="content", id_field="uid")
    numbers = _parquet(tmp_path / "numbers.parquet", {"text": [1, 2]})
    with pytest.raises(DataError, match=r"numbers\.parquet: column 'text' is int64, not text"):
        TextSource(numbers)
    other = tmp_path / "data.csv"
    other.write_text("text\nhello\n")
    with pytest.raises(ConfigError, match=r"data\.csv: not a kind of text file"):
        TextSource(other)
    empty = _jsonl(tmp_path / "empty.jsonl", ["", "   "])
    source = TextSource(empty)
    with pytest.raises(DataError, match=r"empty\.jsonl: no documents \(2 skipped: 2 empty\)"):
        list(source.documents())
    (tmp_path / "nothing").mkdir()
    (tmp_path / "nothing" / "README.md").write_text("x")
    with pytest.raises(DataError, match="nothing: no documents"):
        TextSource(tmp_path / "nothing")
    (tmp_path / "fake.tar").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(DataError, match=r"fake\.tar: not a tar file"):
        TextSource(tmp_path / "fake.tar")


def test_a_zst_file_needs_zstandard_and_says_so(tmp_path):
    path = tmp_path / "c.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd")
    try:
        import zstandard
    except ImportError:
        with pytest.raises(ConfigError, match=r"c\.jsonl\.zst: reading \.zst files needs the `zstandard` package"):
            TextSource(path)
        return
    path.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "z"}\n'))
    assert [d.text for d in TextSource(path).documents()] == ["z"]


def test_a_plain_file_named_gz_is_refused_naming_it_with_the_librarys_words(tmp_path):
    """A folder of many files: the one that is not gzip is named, before any document and while reading."""
    path = _jsonl(tmp_path / "plain.jsonl.gz", ["not compressed"])
    with pytest.raises(DataError, match=r"plain\.jsonl\.gz: unreadable as \.gz: BadGzipFile: Not a gzipped file"):
        first_line(path)
    with pytest.raises(DataError, match=r"plain\.jsonl\.gz: unreadable after 0 document\(s\).*Not a gzipped file"):
        list(TextSource(path).documents())
    assert first_line(_jsonl(tmp_path / "real.jsonl.gz", ["x"], compress=True)) == b'{"text": "x"}\n'


class _ZstdError(Exception):
    """zstandard's error is no OSError: a stand-in for it, where the package is not installed."""


class _BrokenFrames(io.RawIOBase):
    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        raise _ZstdError("zstd decompress error: Unknown frame descriptor")


def test_a_zst_file_that_is_not_zstd_is_refused_naming_it(tmp_path, monkeypatch):
    import types

    fake = types.ModuleType("zstandard")
    fake.ZstdError = _ZstdError  # type: ignore[attr-defined]
    fake.ZstdDecompressor = lambda: types.SimpleNamespace(  # type: ignore[attr-defined]
        stream_reader=lambda raw, read_across_frames, closefd: (raw.close(), _BrokenFrames())[1])
    monkeypatch.setitem(sys.modules, "zstandard", fake)
    path = _jsonl(tmp_path / "gz-inside.jsonl.zst", ["z"], compress=True)
    with pytest.raises(DataError, match=r"gz-inside\.jsonl\.zst: unreadable as \.zst: _ZstdError: zstd decompress"):
        first_line(path)
    with pytest.raises(DataError, match=r"gz-inside\.jsonl\.zst: unreadable after 0 document\(s\)"):
        list(TextSource(path).documents())


def test_a_dictionary_encoded_text_column_is_read_decoded(tmp_path):
    """pandas writes a categorical column (and some exports a string column) dictionary-encoded."""
    texts = pa.array(["alpha", "beta", "alpha", None]).dictionary_encode()
    ids = pa.array(["a", "b", "c", "d"]).dictionary_encode()
    path = _parquet(tmp_path / "dict.parquet", {"text": texts, "id": ids})
    assert str(pq.read_schema(path).field("text").type).startswith("dictionary<values=string")
    source = TextSource(path, id_field="id")
    assert [(d.key, d.text) for d in source.documents()] == [("a", "alpha"), ("b", "beta"), ("c", "alpha")]
    assert source.skipped.counts == {NO_TEXT: 1}


@pytest.mark.parametrize("kind, keep", [("gz", 0.5), ("tar", 0.5), ("tar", 0.5 + 100 / 128_000),
                                        ("tar", 0.5 + 1500 / 128_000)])
def test_a_file_cut_short_gives_what_came_before_then_a_data_error_naming_it(tmp_path, kind, keep):
    """A tar cut at a header, inside one, or inside a member's data: each is found, not taken as the end."""
    texts = [f"document {i} " + "x" * 2000 for i in range(50)]
    if kind == "gz":
        path = _jsonl(tmp_path / "cut.jsonl.gz", texts, compress=True)
    else:
        path = _tar(tmp_path / "cut.tar", {f"{i:03d}.txt": t.encode() for i, t in enumerate(texts)})
    whole = path.read_bytes()
    path.write_bytes(whole[: int(len(whole) * keep)])
    got: list[str] = []
    with pytest.raises(DataError, match=rf"{path.name}: unreadable after (\d+) document"):
        for doc in TextSource(path).documents():
            got.append(doc.text)
    assert 0 < len(got) < len(texts)
    assert got == texts[: len(got)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.text(), st.sampled_from(["", " ", "\n", "a\nb", "\r\n", "é\u2028x"])), max_size=20))
def test_random_documents_written_to_jsonl_come_back_exactly_the_non_empty_ones_in_order(tmp_path_factory, texts):
    path = tmp_path_factory.mktemp("hyp") / "docs.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        for text in texts:
            out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    kept = [t for t in texts if t.strip()]
    source = TextSource(path)
    if not kept:
        with pytest.raises(DataError, match="no documents"):
            list(source.documents())
    else:
        assert [d.text for d in source.documents()] == kept
    assert source.skipped.counts.get(EMPTY, 0) == len(texts) - len(kept)


def _user_module(folder: Path, name: str, body: str, monkeypatch) -> None:
    (folder / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop(name, None)


def test_your_own_source_yields_texts_or_documents_and_is_pinned_like_a_transform(tmp_path, monkeypatch):
    _user_module(tmp_path, "own_docs", "from stoker.pipeline.text.sources import Document\n"
                 "def texts():\n    yield 'one'\n    yield b'two'\n    yield ''\n    yield 3\n"
                 "    yield Document('db', 9, 'k9', 'nine')\n", monkeypatch)
    pinned = pin_source("own_docs:texts")
    assert pinned.version.startswith("own_docs sha256:")
    got = list(pinned.documents())
    assert got == [Document("own_docs:texts", 0, "0", "one"), Document("own_docs:texts", 1, "1", "two"),
                   Document("db", 9, "k9", "nine")]
    with pytest.raises(SourceRefused, match="here, the job runs other 1.0"):
        list(CallableSource("own_docs:texts", "other 1.0").documents())
    with pytest.raises(SourceRefused, match="has no missing"):
        pin_source("own_docs:missing")
    with pytest.raises(SourceRefused, match="give package.module:name"):
        pin_source("not a name")
    with pytest.raises(SourceRefused, match="does not import here"):
        pin_source("no_such_module_here:texts")


def test_your_own_source_with_nothing_usable_is_a_data_error(tmp_path, monkeypatch):
    _user_module(tmp_path, "own_empty", "def texts():\n    return ['', '  ']\nVALUE = 3\n", monkeypatch)
    with pytest.raises(DataError, match=r"source 'own_empty:texts': no documents \(2 skipped: 2 empty\)"):
        list(pin_source("own_empty:texts").documents())
    with pytest.raises(SourceRefused, match="not a callable"):
        pin_source("own_empty:VALUE")


def test_your_own_source_that_raises_part_way_is_a_data_error_naming_it_after_what_it_gave(tmp_path, monkeypatch):
    _user_module(tmp_path, "own_boom", "def texts():\n    yield 'alpha'\n    yield 'beta'\n"
                 "    raise RuntimeError('disk on fire')\n", monkeypatch)
    got: list[str] = []
    with pytest.raises(DataError, match=r"^source 'own_boom:texts' failed after 2 item\(s\): RuntimeError: "
                                        r"disk on fire$"):
        for doc in pin_source("own_boom:texts").documents():
            got.append(doc.text)
    assert got == ["alpha", "beta"]


@pytest.mark.parametrize("returned", ["'In the beginning'", "b'In the beginning'"])
def test_your_own_source_that_returns_one_text_is_refused_not_cut_into_one_document_a_character(
        tmp_path, monkeypatch, returned):
    """A callable returning a str (or bytes) where an iterable of texts is wanted would make each character a
    document; it is refused in one line, and `stoker prepare tokens` with it writes nothing."""
    import os
    import subprocess

    from stoker.datasets import bpe_tokenizer

    _user_module(tmp_path, "own_one_text", f"def texts():\n    return {returned}\n", monkeypatch)
    with pytest.raises(SourceRefused, match=r"^source 'own_one_text:texts' returned one (str|bytes), not an "
                                            r"iterable of documents: .*\[text\]") as caught:
        list(pin_source("own_one_text:texts").documents())
    assert "\n" not in str(caught.value)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "stoker", "prepare", "tokens", "own_one_text:texts", "--tokenizer",
                          str(bpe_tokenizer(tmp_path / "tok")), "--out", str(tmp_path / "tokens")],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert run.returncode == 2 and "not an iterable of documents" in run.stderr, run.stderr
    assert len([line for line in run.stderr.splitlines() if "error" in line]) == 1
    assert not (tmp_path / "tokens" / "manifest.json").exists()


@pytest.mark.parametrize("compress", [False, True])
def test_damage_among_real_chapters_is_skipped_counted_and_named_and_every_good_chapter_kept(tmp_path, caplog,
                                                                                            compress):
    """Real World English Bible chapters as JSONL, with a bad line after every tenth: a line cut short, a
    null, a list and an object for the text, a chapter in Latin-1 bytes, a chapter under another field."""
    chapters = read_chapters()[:60]
    good = write_bible_jsonl(tmp_path / "good.jsonl", documents=60).read_bytes().splitlines()
    bad = [good[3][:40], b'{"id": "x", "text": null}', b'{"text": ["a", "list"]}', b'{"text": {"a": 1}}',
           json.dumps({"text": "Caf\u00e9 " + chapters[4][1]}, ensure_ascii=False).encode("latin-1"),
           json.dumps({"body": chapters[5][1]}).encode()]
    lines = []
    for number, line in enumerate(good):
        lines.append(line)
        if number % 10 == 9:
            lines.append(bad[number // 10])
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / ("damaged.jsonl.gz" if compress else "damaged.jsonl")
    path.write_bytes(gzip.compress(data) if compress else data)
    source = TextSource(path, id_field="id")
    with caplog.at_level(logging.WARNING, "stoker.text"):
        assert [(d.key, d.text) for d in source.documents()] == list(chapters)
    assert source.skipped.counts == {NOT_JSON: 1, NO_TEXT: 2, NOT_STRING: 2, NOT_UTF8: 1}
    for number, reason in [(11, NOT_JSON), (22, f"{NO_TEXT} (null)"), (33, f"{NOT_STRING} (a list)"),
                           (44, f"{NOT_STRING} (a dict)"), (55, NOT_UTF8),
                           (66, f"{NO_TEXT} 'text' (its fields: body)")]:
        assert caplog.text.count(f"{path}:{number}: {reason}") == 1


def test_bad_bytes_in_a_parquet_binary_column_and_empty_txt_files_are_skipped_and_counted(tmp_path):
    _parquet(tmp_path / "a.parquet", {"text": pa.array([b"caf\xc3\xa9", b"caf\xe9", b"", b"ok"], pa.binary())})
    (tmp_path / "b.txt").write_bytes(b"")
    (tmp_path / "c.txt").write_text(" \n\t\n")
    (tmp_path / "d.txt").write_text("kept\n")
    source = TextSource(tmp_path)
    assert [(Path(d.source).name, d.key, d.text) for d in source.documents()] == [
        ("a.parquet", "0", "caf\u00e9"), ("a.parquet", "3", "ok"), ("d.txt", "d.txt", "kept\n")]
    assert source.skipped.counts == {NOT_UTF8: 1, EMPTY: 3}
    where = tmp_path / "a.parquet"
    assert source.skipped.examples[0] == f"{where}:row 1: {NOT_UTF8} (unexpected end of data at byte 3)"


@pytest.mark.parametrize("name", ["zero.jsonl", "zero.jsonl.gz", "rows.parquet", "no-text.tar", "blank.ndjson"])
def test_a_source_that_holds_no_document_at_all_is_a_data_error_naming_it(tmp_path, name):
    path = tmp_path / name
    if name == "zero.jsonl":
        path.write_bytes(b"")
    elif name == "zero.jsonl.gz":
        path.write_bytes(gzip.compress(b""))
    elif name == "rows.parquet":
        _parquet(path, {"text": pa.array([], pa.string())})
    elif name == "no-text.tar":
        _tar(path, {"k1.json": b"{}", "k1.jpg": b"\xff\xd8"})
    else:
        path.write_bytes(b"\n  \n\r\n")
    source = TextSource(path)
    with pytest.raises(DataError, match=rf"^{path}: no documents \(0 skipped: none\)$"):
        list(source.documents())
