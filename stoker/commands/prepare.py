"""`stoker prepare`: a data set into shards, one sub-command per place a user holds it.

`imagenet` (an ImageNet-layout folder), `webdataset` (tar shards) and `parquet` (Parquet or Arrow
tables, the Hugging Face `datasets` layout) all write the same image shards; `wikipedia` writes
tokenized text for BERT, and `tokens` token documents for causal-LM jobs from any corpus and
tokenizer. A flag that belongs to another source is refused at parse time with the sub-command it
is for, rather than argparse's bare "unrecognized arguments".
"""

from __future__ import annotations

import argparse
import sys

from stoker.configured import add_options, config_of
from stoker.flags import POSITIVE, SECONDS
from stoker.options import refused

IMAGE_SOURCES = ("imagenet", "webdataset", "parquet")
SHOWN_SKIPS = 20  # skipped records printed; the manifest lists them all
# each source's own flags, and what to say when one is given to another source
SOURCE_FLAGS = {
    "webdataset": {"--data-ext": "the member of a tar sample that holds its bytes",
                   "--label-field": "the field of a tar sample's .json that holds its label"},
    "parquet": {"--image-column": "a table's column of image bytes", "--label-column": "a table's column of labels",
                "--key-column": "a table's column of keys", "--batch-rows": "the rows of a table read at a time"},
}


def _extensions(text: str) -> tuple[str, ...]:
    """`jpg,jpeg` -> ("jpg", "jpeg"): member extensions, without their dots."""
    exts = tuple(e.strip().lstrip(".").lower() for e in text.split(","))
    if not all(exts):
        raise argparse.ArgumentTypeError(f"must be comma-separated extensions such as jpg,jpeg, not {text!r}")
    return exts


def add_parser(sub) -> None:
    """`stoker prepare` and its sub-commands."""
    prepare = sub.add_parser("prepare", help="convert a data set into shards").add_subparsers(
        dest="prepare_command", required=True)
    imagenet = prepare.add_parser("imagenet", help="ImageNet-layout folder -> Arrow IPC shards + manifest")
    imagenet.add_argument("src", help="SRC/train/<class>/*.JPEG (or SRC/<class>/*)")
    webdataset = prepare.add_parser("webdataset", help="WebDataset tar shards -> Arrow IPC shards + manifest")
    webdataset.add_argument("src", help="a .tar (or .tar.gz), a folder of them, or a pattern such as "
                                        "'shards/train-{000000..000146}.tar' or 'shards/*.tar'")
    webdataset.add_argument("--data-ext", type=_extensions, default=("jpg", "jpeg"),
                            help="the member that holds a sample's image (or bytes), by extension; the first "
                                 "a sample has (default jpg,jpeg)")
    webdataset.add_argument("--label-field", metavar="FIELD",
                            help="take the label from this field of each sample's .json member (default: the "
                                 ".cls member's integer, else the .json's `label`)")
    parquet = prepare.add_parser("parquet", aliases=["arrow"], help="Parquet or Arrow (IPC, Feather) tables of "
                                                                    "image bytes and labels -> shards + manifest")
    parquet.add_argument("src", help="a .parquet/.arrow/.feather file, a folder of them (that folder only), or a "
                                     "pattern such as 'data/train-*.parquet'")
    parquet.add_argument("--image-column", default="image",
                         help="binary, or a struct with a `bytes` field as `datasets` stores an Image "
                              "(default %(default)s)")
    parquet.add_argument("--label-column", default="label", help="integer labels (default %(default)s)")
    parquet.add_argument("--key-column", help="each sample's key (default: __key__ where there is one, else the "
                                              "image's path without its extension, else FILE-ROW)")
    parquet.add_argument("--batch-rows", type=POSITIVE, default=64,
                         help="rows read at a time (default %(default)s; a Parquet file's row group is the most "
                              "it holds in memory)")
    for name, command in (("imagenet", imagenet), ("webdataset", webdataset), ("parquet", parquet)):
        command.set_defaults(prepare_command=name)
        _image_options(command)
        for source, flags in SOURCE_FLAGS.items():
            if source != name:
                for flag, what in flags.items():
                    refused(command, flag, f"is for `stoker prepare {source}` ({what}), not for {name}")
    _add_wikipedia(prepare)
    _add_tokens(prepare)
    _add_mixture(prepare)


def _image_options(command: argparse.ArgumentParser) -> None:
    """The options of every image source: where the shards go, and `PrepareConfig`'s."""
    from stoker.pipeline.prepare import PrepareConfig

    command.add_argument("dst", help="a folder or s3://bucket/path")
    command.add_argument("--shard-mb", type=SECONDS, default=256, help="shard size in MB (default %(default)s)")
    add_options(command, PrepareConfig)


def _add_wikipedia(prepare) -> None:
    wikipedia = prepare.add_parser("wikipedia", help="BERT-format text, or any document source -> tokenized "
                                                     "Parquet shards + manifest (BERT pretraining)")
    wikipedia.add_argument("src", help="a text file or folder of .txt files (one sentence or paragraph a line, a "
                                       "blank line between documents); or documents as `stoker prepare tokens` "
                                       "reads them: JSONL (.gz, .zst), Parquet, WebDataset tars (a file, a folder "
                                       "or a pattern), or package.module:name")
    from stoker.pipeline.text.prepare import TextPrepareConfig

    wikipedia.add_argument("dst", help="a folder or s3://bucket/path")
    wikipedia.add_argument("--vocab", required=True, help="WordPiece vocab.txt")
    add_options(wikipedia, TextPrepareConfig)


def _add_tokens(prepare) -> None:
    from stoker.pipeline.text.token_prepare import TokenPrepareConfig

    tokens = prepare.add_parser("tokens", help="any corpus + any tokenizer -> token Parquet shards + manifest "
                                               "(causal-LM jobs: --dataset tokens)")
    tokens.add_argument("src", help="JSONL (.gz, .zst), Parquet, WebDataset tars or .txt files: a file, a folder or "
                                    "a pattern; or package.module:name, a callable of your own that yields texts")
    tokens.add_argument("--tokenizer", required=True, metavar="PATH_OR_MODULE:NAME",
                        help="a tokenizers tokenizer.json, or package.module:Name of your own (pinned by version)")
    tokens.add_argument("--out", required=True, metavar="DIR", help="a folder or s3://bucket/path")
    tokens.add_argument("--eot", type=_special_token, metavar="TEXT_OR_ID",
                        help="the end-of-text token, by its text (<|endoftext|>) or its id (digits); default: read "
                             "from the tokenizer's special tokens")
    add_options(tokens, TokenPrepareConfig)


def _special_token(text: str) -> str | int:
    """`--eot`: a token's text, or its id when all ASCII digits (`٣` or `³` is a token's text, as Python's
    int() would read it as 3); empty is refused as it is parsed."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must be the end-of-text token's text or its id, not empty")
    return int(text) if text.isascii() and text.isdigit() else text


def _mixture_source(text: str):
    """`--source NAME=DIR/manifest.json:WEIGHT`, its name and weight checked as it is parsed."""
    from stoker.pipeline.text.mixture import MixtureError
    from stoker.pipeline.text.mixture_prepare import SourceSpec

    try:
        return SourceSpec.parse(text)
    except MixtureError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _add_mixture(prepare) -> None:
    from stoker.pipeline.text.mixture import EXHAUSTED

    mixture = prepare.add_parser("mixture", help="token sets + weights -> one mixture manifest (each epoch's "
                                                 "tokens split by weight, within 1%%)")
    mixture.add_argument("--source", dest="mix_sources", action="append", required=True, type=_mixture_source,
                         metavar="NAME=DIR/manifest.json:WEIGHT",
                         help="a token set of `stoker prepare tokens` and its weight (positive; the weights are "
                              "normalized); twice or more")
    epoch = mixture.add_mutually_exclusive_group(required=True)
    epoch.add_argument("--budget", type=POSITIVE, metavar="TOKENS", help="an epoch is this many tokens")
    epoch.add_argument("--pass", dest="pass_over", metavar="NAME",
                       help="an epoch is one pass over this source (its tokens over its weight)")
    mixture.add_argument("--exhausted", choices=EXHAUSTED, default="repeat",
                         help="a source that runs out within an epoch: repeat (its next pass; default) or end "
                              "(every epoch starts every source's next pass and ends where the first runs out)")
    mixture.add_argument("--out", required=True, metavar="DIR", help="a folder or s3://bucket/path")


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Flags that cannot work together, refused before anything starts."""
    if args.prepare_command == "mixture":
        from stoker.pipeline.text.mixture import MixRule, MixSource, MixtureError

        try:
            MixRule(tuple(MixSource(s.name, s.weight) for s in args.mix_sources), args.budget or 0,
                    args.pass_over or "", args.exhausted)
        except MixtureError as exc:
            parser.error(f"prepare mixture: {exc}")
        return
    if args.prepare_command in ("tokens", "wikipedia") and not args.text_field.strip():
        # refused here: an empty field would read the whole corpus, then find no document at all
        parser.error(f"prepare {args.prepare_command}: argument --text-field: must name the field (column) that "
                     f"holds a document's text, not be empty")
    if args.prepare_command in IMAGE_SOURCES and args.records == "bytes" and args.restart_interval_px:
        parser.error(f"prepare {args.prepare_command}: argument --restart-interval-px: --records bytes stores "
                     f"records as given, with no JPEG to transcode (drop the flag, or use --records jpeg)")


def _source(args: argparse.Namespace):
    """The record source the sub-command names (pipeline.store.record_sources)."""
    if args.prepare_command == "webdataset":
        from stoker.pipeline.store.tar_records import TarSource

        return TarSource(args.src, data_ext=args.data_ext, label_field=args.label_field)
    if args.prepare_command == "parquet":
        from stoker.pipeline.store.table_records import TableSource

        return TableSource(args.src, image_column=args.image_column, label_column=args.label_column,
                           key_column=args.key_column, batch_rows=args.batch_rows)
    from stoker.pipeline.store.record_sources import FolderSource

    return FolderSource(args.src)


def run(args: argparse.Namespace) -> int:
    if args.prepare_command == "wikipedia":
        return _prepare_wikipedia(args)
    if args.prepare_command == "tokens":
        return _prepare_tokens(args)
    if args.prepare_command == "mixture":
        return _prepare_mixture(args)
    from stoker.pipeline.prepare import PrepareConfig, default_restart_interval, prepare_records

    interval = default_restart_interval() if args.restart_interval_px is None else args.restart_interval_px
    source = _source(args)
    result = prepare_records(source, args.dst, config_of(
        PrepareConfig, args, shard_bytes=int(args.shard_mb * (1 << 20)),
        restart_interval_px=0 if args.records == "bytes" else interval))
    _print_some("skipped", result.skipped)
    for item in result.kept_as_is:
        print(f"kept as it was (no restart markers) {item['path']}: {item['reason']}", file=sys.stderr)
    m = result.manifest
    done = f"wrote {m.num_samples} samples in {len(m.shards)} shard(s), {len(m.classes)} classes, to {args.dst}; " \
           f"skipped {len(result.skipped)} {source.noun}(s); "
    if m.records == "bytes":
        print(done + "stored as given (records: bytes, no JPEG checks)")
        return 0
    kept = ", ".join(f"{n} {why}" for why, n in m.kept_as_is.items())
    print(done + f"{m.transcoded} with restart markers ({m.from_progressive} of them were progressive)"
          + (f", kept as they were: {kept}" if kept else ""))
    return 0


def _print_some(what: str, items: list[dict[str, str]]) -> None:
    for item in items[:SHOWN_SKIPS]:
        print(f"{what} {item['path']}: {item['reason']}", file=sys.stderr)
    if len(items) > SHOWN_SKIPS:
        print(f"... and {len(items) - SHOWN_SKIPS} more (listed in the manifest)", file=sys.stderr)


def _prepare_wikipedia(args: argparse.Namespace) -> int:
    from stoker.pipeline.text.prepare import TextPrepareConfig, prepare_wikipedia

    result = prepare_wikipedia(args.src, args.dst, args.vocab, config_of(TextPrepareConfig, args))
    # each skipped document was named once in the log as it was read (stoker.pipeline.text.sources)
    m = result.manifest
    print(f"wrote {m.num_samples} documents ({result.sentences} sentences, {result.tokens} tokens) in "
          f"{len(m.shards)} shard(s) to {args.dst}; skipped {len(result.skipped)} document(s); SRC read as "
          f"{m.tokens['read_as']}")
    return 0



def _prepare_tokens(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from stoker.pipeline.text.token_prepare import TokenPrepareConfig, prepare_tokens, tokenizer_config

    tokenizer = tokenizer_config(args.tokenizer)
    if args.eot is not None:
        tokenizer = replace(tokenizer, eot=args.eot)
    result = prepare_tokens(args.src, args.out, tokenizer, config_of(TokenPrepareConfig, args))
    # each skipped document was named once in the log as it was read (stoker.pipeline.text.sources)
    m = result.manifest
    online = "; their text, tokenized online by the workers" if m.tokens.get("online") else ""
    print(f"wrote {result.documents} documents ({result.tokens} tokens, tokenizer {m.tokens['fingerprint']}) in "
          f"{len(m.shards)} shard(s) to {args.out}; skipped {len(result.skipped)} document(s){online}")
    return 0


def _prepare_mixture(args: argparse.Namespace) -> int:
    from stoker.pipeline.text.mixture_prepare import prepare_mixture

    result = prepare_mixture(args.mix_sources, args.out, args.budget or 0, args.pass_over or "", args.exhausted)
    sources = ", ".join(f"{s.name} {s.weight:g} ({result.tokens[s.name]} tokens)" for s in args.mix_sources)
    print(f"wrote a mixture of {sources}: {result.manifest.num_samples} documents in {len(result.manifest.shards)} "
          f"shard(s), epochs of {result.epoch_tokens} tokens ({args.exhausted} when a source runs out), to {args.out}")
    return 0
