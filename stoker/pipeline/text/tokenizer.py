"""Any tokenizer a causal-LM job names: a `tokenizers` tokenizer.json, or a callable of your own.

A job names its tokenizer (`TokenizerConfig`) and pins exactly which one made its tokens by a
`fingerprint`: the sha256 of the tokenizer.json's bytes, or the callable's name and the version of
what provides it (pinned the way a user's transform is, `stoker.pipeline.transforms`). Loading
checks the file at once and says in one line what is wrong with it, rather than yielding wrong
tokens later.

Special tokens, when the config does not give them (by text or by id):

- end-of-text: the first of `EOT_NAMES` (`<|endoftext|>`, `</s>`, `<eos>`, `<|end_of_text|>`,
  `<EOT>`, `[SEP]`) among the tokenizer's added tokens (tokenizer.json's `added_tokens`, where a
  trainer's special tokens go); none there and none given is refused.
- padding: the first of `PAD_NAMES` (`<pad>`, `[PAD]`, `<|padding|>`) among them, else the
  end-of-text id (causal-LM rows are packed, and a padded slot's label is masked out anyway).

Encoding adds no special tokens (packing places end-of-text itself), neither truncates nor pads
(a saved tokenizer.json may do both: they are turned off, a document is tokenized whole), and is
deterministic: the Rust batch encoder has no randomness once BPE dropout is off, and a file that
turns it on is refused.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from stoker.pipeline.store.storage import read_bytes
from stoker.pipeline.transforms import (
    TransformError,
    import_named,  # the transform's import and version pinning
)
from stoker.protos.errors import ConfigError

if TYPE_CHECKING:
    import tokenizers

EOT_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<EOT>", "[SEP]")
PAD_NAMES = ("<pad>", "[PAD]", "<|padding|>")
IDS = np.int32  # the dtype of `input_ids` in a batch
_FACTORY = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
COMPRESSED_SUFFIXES = (".gz", ".gzip", ".bz2", ".zst", ".zstd", ".lz4", ".br", ".xz", ".zip")
COMPRESSED_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"),
                    (b"\xfd7zXZ\x00", "xz"), (b"PK\x03\x04", "zip"), (b"\x04\x22\x4d\x18", "lz4"))
_SAVE_HINT = "give the path of a tokenizers tokenizer.json (what `Tokenizer.save(path)` writes)"


class TokenizerError(ConfigError):
    """The named tokenizer cannot make a job's tokens: one line naming it and what to do."""


Special = str | int | None  # a special token by its text, by its id, or None: read from the tokenizer


@dataclass(frozen=True)
class TokenizerConfig:
    """Which tokenizer a job's text is cut with: exactly one of `path` (a tokenizer.json, local or
    any pyarrow.fs URI) and `factory` (`package.module:Name` of your own, a tokenizer object or a
    factory called with no arguments), its special tokens, and the fingerprint it is pinned to
    ("" until `pin()`: whatever this process loads)."""

    path: str = ""
    factory: str = ""
    eot: Special = None
    pad: Special = None
    fingerprint: str = ""

    def __post_init__(self) -> None:
        if bool(self.path) == bool(self.factory):
            raise TokenizerError("tokenizer: give exactly one of path (a tokenizer.json) and factory "
                                 f"(package.module:Name), not path={self.path!r} factory={self.factory!r}")
        if self.factory and not _FACTORY.fullmatch(self.factory):
            raise TokenizerError(f"tokenizer {self.factory!r}: give package.module:Name, a tokenizer or a factory "
                                 "of your own package")
        for role, given in (("eot", self.eot), ("pad", self.pad)):
            if isinstance(given, bool) or not isinstance(given, str | int | None) or given == "" or (
                    isinstance(given, int) and given < 0):
                raise TokenizerError(f"tokenizer {self.name}: {role} {given!r} must be a token's text or its id (>= 0)")

    @property
    def name(self) -> str:
        """What messages call it: the file or the callable."""
        return self.path or self.factory

    def load(self) -> TextTokenizer:
        """The tokenizer as this process loads it; TokenizerError when it cannot be the job's."""
        loaded = _load_file(self) if self.path else _load_factory(self)
        if self.fingerprint and loaded.fingerprint != self.fingerprint:
            raise TokenizerError(f"tokenizer {self.name} is {loaded.fingerprint} here, the job was pinned to "
                                 f"{self.fingerprint}: give the same file (or install the same version)")
        return loaded

    def pin(self) -> TokenizerConfig:
        """This config pinned to the tokenizer this process loads (a pinned one is returned as it is)."""
        return self if self.fingerprint else replace(self, fingerprint=self.load().fingerprint)


@dataclass(frozen=True, eq=False)
class TextTokenizer:
    """A loaded tokenizer: texts to ids, its special ids, and the fingerprint a job pins."""

    name: str
    fingerprint: str
    vocab_size: int  # embedding rows: one more than the largest id it can emit
    eot_id: int
    pad_id: int
    encoder: Callable[[list[str]], list[np.ndarray]]
    decoder: Callable[[Sequence[int]], str] | None = None

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """One int32 array of ids per text, no special tokens added."""
        return self.encoder(list(texts))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids` (special tokens kept), where the tokenizer can decode."""
        if self.decoder is None:
            raise TokenizerError(f"tokenizer {self.name} has no decode")
        return self.decoder([int(i) for i in ids])


def _load_file(config: TokenizerConfig) -> TextTokenizer:
    data = _read(config.path)
    tok = _parse(config.path, data)
    return _from_rust(config, tok, "sha256:" + hashlib.sha256(data).hexdigest())


def _read(uri: str) -> bytes:
    """The file's own bytes; a compressed one is refused (the storage layer would quietly decompress a name
    ending .gz, so the fingerprint would not be the given file's sha256)."""
    suffix = next((s for s in COMPRESSED_SUFFIXES if uri.lower().endswith(s)), "")
    if suffix:
        raise TokenizerError(f"tokenizer {uri}: not JSON (a compressed {suffix} file: decompress it); {_SAVE_HINT}")
    try:
        data = read_bytes(uri)
    except FileNotFoundError:
        raise TokenizerError(f"tokenizer {uri}: no such file; {_SAVE_HINT}") from None
    except OSError as exc:
        raise TokenizerError(f"tokenizer {uri}: cannot read it ({_line(exc)}); {_SAVE_HINT}") from None
    kind = next((name for magic, name in COMPRESSED_MAGIC if data.startswith(magic)), "")
    if kind:
        raise TokenizerError(f"tokenizer {uri}: not JSON (compressed, {kind} data: decompress it); {_SAVE_HINT}")
    return data


def _parse(uri: str, data: bytes) -> tokenizers.Tokenizer:
    """The bytes hashed are the bytes parsed (`from_str`, not `from_file`), so the fingerprint is
    always the tokenizer's that made the tokens."""
    from tokenizers import Tokenizer

    try:
        text = data.decode("utf-8")
        json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"tokenizer {uri}: not JSON ({_line(exc)}); {_SAVE_HINT}") from None
    try:
        tok = Tokenizer.from_str(text)
    except Exception as exc:  # the Rust side's parse errors are plain Exceptions
        raise TokenizerError(f"tokenizer {uri}: JSON that the tokenizers library refuses ({_line(exc)}); "
                             f"{_SAVE_HINT}") from None
    dropout = getattr(tok.model, "dropout", None)
    if dropout:
        raise TokenizerError(f"tokenizer {uri}: BPE dropout {dropout:g} makes tokens random; set the model's "
                             "dropout to null in the file")
    tok.no_truncation()  # a saved tokenizer may cut at a model's length and pad to it: a document is
    tok.no_padding()  # tokenized whole, and packing, not the tokenizer, makes rows
    return tok


def _from_rust(config: TokenizerConfig, tok: tokenizers.Tokenizer, fingerprint: str) -> TextTokenizer:
    added = {t.content: i for i, t in sorted(tok.get_added_tokens_decoder().items())}
    vocab_size = max(tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    eot, pad = _specials(config, added, tok.token_to_id, vocab_size)

    def encode(texts: list[str]) -> list[np.ndarray]:
        return [np.array(e.ids, dtype=IDS) for e in tok.encode_batch_fast(texts, add_special_tokens=False)]

    def decode(ids: Sequence[int]) -> str:
        return tok.decode(list(ids), skip_special_tokens=False)

    return TextTokenizer(config.name, fingerprint, vocab_size, eot, pad, encode, decode)


def _specials(config: TokenizerConfig, known: Mapping[str, int], lookup: Callable[[str], int | None],
              vocab_size: int, eot_default: int | None = None, pad_default: int | None = None) -> tuple[int, int]:
    """(end-of-text, padding): given ones checked against the vocabulary, else read from `known`."""
    eot = _given(config, "eot", config.eot, lookup, vocab_size)
    if eot is None:
        eot = next((known[n] for n in EOT_NAMES if n in known), eot_default)
    if eot is None:
        raise TokenizerError(f"tokenizer {config.name}: no end-of-text token among its special tokens (looked for "
                             f"{', '.join(EOT_NAMES)}); pass --eot (its text or id)")
    pad = _given(config, "pad", config.pad, lookup, vocab_size)
    if pad is None:
        pad = next((known[n] for n in PAD_NAMES if n in known), pad_default)
    return eot, eot if pad is None else pad


def _given(config: TokenizerConfig, role: str, given: Special, lookup: Callable[[str], int | None],
           vocab_size: int) -> int | None:
    if given is None:
        return None
    if isinstance(given, int):
        if given >= vocab_size:
            raise TokenizerError(f"tokenizer {config.name}: {role} id {given} is past its vocabulary "
                                 f"({vocab_size} ids); give an id below {vocab_size}, or the token's text")
        return given
    found = lookup(given)
    if found is None:
        raise TokenizerError(f"tokenizer {config.name}: {role} {given!r} is not in its vocabulary; give a token "
                             "it has, or its id")
    return int(found)


def _load_factory(config: TokenizerConfig) -> TextTokenizer:
    """Your own tokenizer, imported and versioned as a transform is: a `tokenizers.Tokenizer`, or an
    object with `encode_batch(texts) -> id sequences` and `vocab_size` (and, optionally,
    `token_to_id(text)`, `eot_id`, `pad_id`, `decode(ids)`)."""
    from tokenizers import Tokenizer

    try:
        obj, version = import_named(config.factory, what="tokenizer")
    except TransformError as exc:
        raise TokenizerError(_line(exc)) from None
    made = _make(config.factory, obj)
    fingerprint = f"{config.factory} ({version})"
    if isinstance(made, Tokenizer):  # parsed again from its JSON: a copy, its settings not the caller's to change
        text = made.to_str()
        tok = _parse(config.factory, text.encode())
        return _from_rust(config, tok, f"{fingerprint} sha256:{hashlib.sha256(text.encode()).hexdigest()}")
    return _from_own(config, made, fingerprint)


def _make(name: str, obj: object) -> Any:
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return obj
    try:
        return obj()
    except (Exception, SystemExit) as exc:
        raise TokenizerError(f"tokenizer {name} cannot be made with no arguments: {_line(exc)}") from None


def _from_own(config: TokenizerConfig, own: Any, fingerprint: str) -> TextTokenizer:
    name = config.name
    vocab_size = getattr(own, "vocab_size", None)
    if callable(vocab_size):
        vocab_size = vocab_size()
    if not callable(getattr(own, "encode_batch", None)) or type(vocab_size) is not int or vocab_size < 1:
        raise TokenizerError(f"tokenizer {name}: needs encode_batch(texts) and an int vocab_size >= 1 "
                             f"(got vocab_size {vocab_size!r}), or return a tokenizers.Tokenizer")
    to_id = getattr(own, "token_to_id", None)

    def lookup(text: str) -> int | None:
        return to_id(text) if callable(to_id) else None

    known = {n: i for n in (*EOT_NAMES, *PAD_NAMES) if (i := lookup(n)) is not None}
    eot, pad = _specials(config, known, lookup, vocab_size, _int_attr(own, "eot_id"), _int_attr(own, "pad_id"))

    def encode(texts: list[str]) -> list[np.ndarray]:
        out = [np.asarray(ids, dtype=np.int64) for ids in own.encode_batch(texts)]
        bad = next((a for a in out if a.ndim != 1 or (a.size and (a.min() < 0 or a.max() >= vocab_size))), None)
        if len(out) != len(texts) or bad is not None:
            raise TokenizerError(f"tokenizer {name} returned {len(out)} id sequences for {len(texts)} texts"
                                 + ("" if bad is None else f", one with ids outside [0, {vocab_size})"))
        return [a.astype(IDS) for a in out]

    decode = getattr(own, "decode", None)
    return TextTokenizer(name, fingerprint, vocab_size, eot, pad, encode, decode if callable(decode) else None)


def _int_attr(obj: object, attribute: str) -> int | None:
    value = getattr(obj, attribute, None)
    return value if type(value) is int and value >= 0 else None


def _line(exc: BaseException) -> str:
    """An exception's text on one line (the Rust side's can run to several)."""
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__
