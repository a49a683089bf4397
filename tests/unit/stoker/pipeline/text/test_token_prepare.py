"""stoker/pipeline/text/token_prepare.py: `stoker prepare tokens`, from a corpus to checked token shards."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.token_prepare import TokenPrepareConfig, prepare_tokens
from stoker.pipeline.text.token_shards import lengths_of, read_token_shard
from stoker.pipeline.text.tokenizer import TokenizerConfig, TokenizerError
from stoker.protos.errors import DataError
from tests.token_corpus import jsonl, prepared, texts, tokenizer_json


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return prepared(tmp_path_factory.mktemp("tokens"))


def test_every_document_round_trips_to_its_tokens_in_source_order(made):
    result, corpus, tok_path = made
    manifest = Manifest.load(result.manifest.uri)
    tok = TokenizerConfig(path=str(tok_path)).load()
    assert manifest.kind == "tokens" and manifest.num_samples == len(corpus) == result.documents
    got = []
    for index, info in enumerate(manifest.shards):
        shard = read_token_shard(manifest.shard_uri(index), info, manifest.tokens["vocab_size"])
        assert not shard.problems
        got += [shard.document(row).tolist() for row in range(len(shard))]
        assert manifest.tokens["shard_tokens"][index] == shard.tokens.size
    assert got == [ids.tolist() for ids in tok.encode_batch(corpus)]
    assert sum(manifest.tokens["shard_tokens"]) == manifest.tokens["total"] == result.tokens


def test_the_tokenizer_is_copied_beside_the_manifest_with_its_fingerprint_and_special_ids(made):
    result, _, tok_path = made
    info = result.manifest.tokens
    copied = TokenizerConfig(path=result.manifest.relative_uri(info["tokenizer"]), fingerprint=info["fingerprint"])
    loaded = copied.load()  # the pinned fingerprint holds for the copy
    assert (loaded.eot_id, loaded.pad_id, loaded.vocab_size) == (info["eot"], info["pad"], info["vocab_size"]) == (
        0, 1, 300)
    assert info["source"] == "corpus.jsonl"


def test_skipped_documents_are_counted_and_named_in_the_manifest(made):
    result, corpus, _ = made
    reasons = {item["path"].rsplit(":", 1)[1]: item["reason"] for item in result.manifest.skipped}
    assert set(reasons) == {str(len(corpus) + 1), str(len(corpus) + 2)}
    assert reasons[str(len(corpus) + 1)].startswith("not JSON") and reasons[str(len(corpus) + 2)] == "empty"


def test_the_same_input_gives_the_same_bytes(tmp_path, made):
    _, corpus, tok_path = made
    src = jsonl(tmp_path / "c.jsonl", corpus[:50])
    outs = []
    for name in ("a", "b"):
        prepare_tokens(src, tmp_path / name, str(tok_path), TokenPrepareConfig(docs_per_shard=16, progress=False))
        outs.append({p.name: p.read_bytes() for p in sorted((tmp_path / name).iterdir())})
    assert outs[0] == outs[1] and len(outs[0]) == 4 + 3  # 4 shards, the manifest, the tokenizer and the lengths


def test_a_bad_tokenizer_is_refused_before_any_document_and_nothing_left_is_an_error(tmp_path, made):
    _, corpus, tok_path = made
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not JSON"):
        prepare_tokens(jsonl(tmp_path / "c.jsonl", corpus), tmp_path / "o", str(tmp_path / "bad.json"))
    empty = jsonl(tmp_path / "e.jsonl", [], bad=True)
    with pytest.raises(DataError, match="no documents"):
        prepare_tokens(empty, tmp_path / "o2", str(tok_path), TokenPrepareConfig(progress=False))


def test_the_command_prints_what_it_wrote_and_skipped(tmp_path):
    corpus = texts(30, seed=3)
    tok = tokenizer_json(tmp_path / "tokenizer.json", corpus)
    src = jsonl(tmp_path / "c.jsonl", corpus)
    run = subprocess.run([sys.executable, "-m", "stoker", "prepare", "tokens", str(src), "--tokenizer", str(tok),
                          "--out", str(tmp_path / "out"), "--docs-per-shard", "10", "--source-name", "mine",
                          "--text-field", "text"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "wrote 30 documents" in run.stdout and "in 3 shard(s)" in run.stdout and "skipped 2" in run.stdout
    assert Manifest.load(tmp_path / "out").tokens["source"] == "mine"


def test_the_lengths_file_holds_every_documents_tokens_and_an_old_set_without_it_is_refused(tmp_path, made):
    _, corpus, tok_path = made
    src = jsonl(tmp_path / "c.jsonl", corpus[:30])
    result = prepare_tokens(src, tmp_path / "t", str(tok_path), TokenPrepareConfig(docs_per_shard=16, progress=False))
    manifest = result.manifest
    sizes = [len(read_token_shard(manifest.shard_uri(i), s, manifest.vocab_size).document(r))
             for i, s in enumerate(manifest.shards) for r in range(s.num_samples)]
    assert lengths_of(manifest).tolist() == sizes and sum(sizes) == result.tokens
    manifest.tokens = {k: v for k, v in manifest.tokens.items() if not k.startswith("lengths")}
    with pytest.raises(DataError, match="prepare tokens` .*again"):
        lengths_of(manifest)


def test_an_online_set_holds_the_documents_text_with_the_same_lengths_skips_and_tokenizer(tmp_path, made):
    """`online`: text shards of what the tokenizer reads, the lengths file and skips of a token set, and a
    manifest that says it is online with the tokenizers version that counted the lengths."""
    import tokenizers

    from stoker.pipeline.text.text_shards import read_text_shard

    result, corpus, tok_path = made
    online = prepare_tokens(jsonl(tmp_path / "c.jsonl", corpus), tmp_path / "on", str(tok_path),
                            TokenPrepareConfig(docs_per_shard=40, progress=False, online=True))
    manifest, tokens = online.manifest, result.manifest
    assert manifest.tokens["online"] is True and manifest.tokens["tokenizers_version"] == tokenizers.__version__
    assert "online" not in tokens.tokens
    same = ("fingerprint", "eot", "pad", "vocab_size", "total", "shard_tokens", "lengths_sha256")
    assert {k: manifest.tokens[k] for k in same} == {k: tokens.tokens[k] for k in same}
    assert lengths_of(manifest).tolist() == lengths_of(tokens).tolist()
    assert [(s["path"].rsplit(":")[-1], s["reason"]) for s in manifest.skipped] == [
        (s["path"].rsplit(":")[-1], s["reason"]) for s in tokens.skipped] and online.documents == result.documents
    shards = [read_text_shard(manifest.shard_uri(i), info) for i, info in enumerate(manifest.shards)]
    assert [t for s in shards for t in s.texts] == corpus
    assert [s.path for s in manifest.shards][0].startswith("text-")
    assert (tmp_path / "on" / "tokenizer.json").read_bytes() == tok_path.read_bytes()


def test_the_command_takes_online_and_the_end_of_text_by_its_text_or_id_and_refuses_an_empty_one(tmp_path):
    corpus = texts(20, seed=4)
    tok = tokenizer_json(tmp_path / "tokenizer.json", corpus)
    src = jsonl(tmp_path / "c.jsonl", corpus, bad=False)

    def prepare(out: str, *flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "stoker", "prepare", "tokens", str(src), "--tokenizer", str(tok),
                               "--out", str(tmp_path / out), *flags], capture_output=True, text=True, timeout=120)

    run = prepare("on", "--online", "--eot", "<pad>")
    assert run.returncode == 0, run.stderr
    assert "in 1 shard(s)" in run.stdout and "their text, tokenized online by the workers" in run.stdout
    manifest = Manifest.load(tmp_path / "on")
    assert manifest.tokens["online"] is True and manifest.tokens["eot"] == 1  # <pad> is id 1 in this tokenizer
    assert prepare("by-id", "--eot", "1").returncode == 0 and Manifest.load(tmp_path / "by-id").tokens["eot"] == 1
    for given, says in (("", "argument --eot: must be the end-of-text token's text or its id, not empty"),
                        (" ", "argument --eot: must be the end-of-text token's text or its id, not empty")):
        refused = prepare("x", "--eot", given)
        assert refused.returncode == 2 and says in refused.stderr
        assert len([line for line in refused.stderr.splitlines() if "error" in line]) == 1
        assert not (tmp_path / "x").exists()
    unknown = prepare("y", "--eot", "<nope>")
    assert unknown.returncode != 0 and "eot '<nope>' is not in its vocabulary" in unknown.stderr


@pytest.mark.parametrize(("src", "out", "where"), [
    ("{corpus}", "{corpus}", "is SRC"), ("{corpus}/", "{corpus}/inner", "is inside SRC"),
    ("{corpus}", "{top}", "holds SRC"), ("{corpus}/c.jsonl", "{corpus}", "holds SRC"),
    ("{corpus}/*.jsonl", "{corpus}", "is SRC"),
])
def test_an_out_that_is_inside_or_holds_src_is_refused_before_anything_is_written(tmp_path, src, out, where):
    corpus = texts(20, seed=6)
    top = tmp_path / "top"
    (top / "corpus").mkdir(parents=True)
    tok = tokenizer_json(tmp_path / "tokenizer.json", corpus)
    jsonl(top / "corpus" / "c.jsonl", corpus, bad=False)
    before = {p: p.read_bytes() if p.is_file() else None for p in top.rglob("*")}
    names = {"corpus": top / "corpus", "top": top}
    run = subprocess.run([sys.executable, "-m", "stoker", "prepare", "tokens", src.format(**names), "--tokenizer",
                          str(tok), "--out", out.format(**names)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and f"{where} " in run.stderr and "apart from SRC" in run.stderr, run.stderr
    assert len([line for line in run.stderr.splitlines() if "error" in line]) == 1, run.stderr
    assert {p: p.read_bytes() if p.is_file() else None for p in top.rglob("*")} == before


def test_a_deleted_lengths_file_is_refused_in_one_line_naming_it(tmp_path, made):
    _, corpus, tok_path = made
    result = prepare_tokens(jsonl(tmp_path / "c.jsonl", corpus[:20]), tmp_path / "t", str(tok_path),
                            TokenPrepareConfig(progress=False))
    (tmp_path / "t" / "lengths.npy").unlink()
    with pytest.raises(DataError, match=r"t/lengths\.npy: the lengths file the manifest names is missing: run "
                                        r"`stoker prepare tokens` .*again") as caught:
        lengths_of(Manifest.load(result.manifest.uri))
    assert "\n" not in str(caught.value) and "Errno" not in str(caught.value)


def test_a_json_array_file_is_refused_once_as_not_json_lines_before_any_document_is_read(tmp_path, made):
    import json

    _, corpus, tok_path = made
    src = tmp_path / "docs.json"
    src.write_text(json.dumps([{"text": t} for t in corpus[:5]], indent=1))
    with pytest.raises(DataError, match=r"docs\.json: one JSON array \(its first line is `\[`\), not JSON") as err:
        prepare_tokens(src, tmp_path / "t", str(tok_path), TokenPrepareConfig(progress=False))
    assert "\n" not in str(err.value) and not (tmp_path / "t").exists()


def test_an_empty_text_field_is_refused_as_the_flags_are_parsed(tmp_path, made):
    _, corpus, tok_path = made
    src = jsonl(tmp_path / "c.jsonl", corpus[:5])
    for command in (["tokens", str(src), "--tokenizer", str(tok_path), "--out"], ["wikipedia", str(src), "--vocab",
                                                                                   str(tok_path)]):
        run = subprocess.run([sys.executable, "-m", "stoker", "prepare", *command, str(tmp_path / "t"),
                              "--text-field", ""], capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "argument --text-field: must name the field" in run.stderr, run.stderr
        assert len([line for line in run.stderr.splitlines() if "error" in line]) == 1, run.stderr
        assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("online", [False, True])
def test_your_own_source_is_recorded_with_the_version_of_what_provides_it(tmp_path, made, monkeypatch, online):
    """As `prepare wikipedia` records it: a token set (or an online one) says which version of your code made it."""
    _, corpus, tok_path = made
    (tmp_path / "own_corpus.py").write_text(f"__version__ = '2.5'\nTEXTS = {corpus[:10]!r}\n"
                                            "def texts():\n    yield from TEXTS\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "own_corpus", raising=False)
    result = prepare_tokens("own_corpus:texts", tmp_path / "t", str(tok_path),
                            TokenPrepareConfig(progress=False, online=online, source_name="mine"))
    saved = Manifest.load(result.manifest.uri).tokens
    assert (saved["source"], saved["version"], result.documents) == ("mine", "own_corpus 2.5", 10)
    assert "version" not in made[0].manifest.tokens  # a set made from files names no code


def test_a_plain_file_named_gz_among_others_is_refused_naming_it(tmp_path, made):
    _, corpus, tok_path = made
    (tmp_path / "src").mkdir()
    jsonl(tmp_path / "src" / "a.jsonl", corpus[:5], bad=False)
    jsonl(tmp_path / "src" / "b.jsonl.gz", corpus[5:10], bad=False)  # not gzip, whatever its name says
    with pytest.raises(DataError, match=r"src/b\.jsonl\.gz: unreadable as \.gz: BadGzipFile: Not a gzipped file"):
        prepare_tokens(tmp_path / "src", tmp_path / "t", str(tok_path), TokenPrepareConfig(progress=False))
    assert not (tmp_path / "t").exists()
