"""`stoker data`: make or inspect datasets."""

from __future__ import annotations

import argparse
import json

from stoker.flags import POSITIVE, SEED


def add_parser(sub) -> None:
    """`stoker data`: make or inspect datasets."""
    data = sub.add_parser("data", help="make or inspect datasets").add_subparsers(dest="data_command", required=True)
    synth = data.add_parser("imagenet-synth", help="write an ImageNet-like set made from real photos")
    synth.add_argument("dir", help="the folder to write DIR/train/<class>/*.JPEG into")
    synth.add_argument("--images", type=POSITIVE, default=2000, help="images in all (default %(default)s)")
    synth.add_argument("--classes", type=POSITIVE, default=10, help="classes, one folder each (default %(default)s)")
    synth.add_argument("--seed", type=SEED, default=0, help="the same seed writes the same set (default 0)")
    synth.add_argument("--procs", type=POSITIVE, help="processes writing images (default: one per core)")
    stats = data.add_parser("stats", help="size/format statistics of an ImageNet-layout folder")
    stats.add_argument("dir", help="an ImageNet-layout folder (DIR/train/<class>/*.JPEG or DIR/<class>/*)")
    wiki = data.add_parser("wikipedia", help="write real English Wikipedia text and BERT's vocab.txt")
    wiki.add_argument("dir", help="the folder to write the articles and vocab.txt into")
    wiki.add_argument("--docs", type=POSITIVE, help="keep only the first N articles (default: all ~10,000)")


def run(args: argparse.Namespace) -> int:
    if args.data_command == "wikipedia":
        from stoker.pipeline.text.corpus import write_wikipedia

        corpus = write_wikipedia(args.dir, documents=args.docs)
        print(f"wrote {corpus.documents} Wikipedia articles to {corpus.text} and BERT's vocabulary to {corpus.vocab}\n"
              f"next: stoker prepare wikipedia {corpus.text} SHARDS_DIR --vocab {corpus.vocab}")
        return 0
    if args.data_command == "imagenet-synth":
        from stoker.pipeline.images.synth import SynthConfig, generate

        total = generate(args.dir, SynthConfig(images=args.images, classes=args.classes, seed=args.seed),
                         processes=args.procs)
        print(f"wrote {args.images} images ({total / 1e6:.1f} MB) to {args.dir}/train")
        return 0
    from stoker.pipeline.store.stats import folder_stats

    print(json.dumps(folder_stats(args.dir).as_dict(), indent=1))
    return 0
