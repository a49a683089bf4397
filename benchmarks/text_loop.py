"""Stoker's BERT example making on one core, for the suite: prints one JSON line."""

from __future__ import annotations

import argparse
import json

from benchmarks.text import in_process
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.examples import TextConfig


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--pack", action="store_true")
    args = parser.parse_args()
    result = in_process(Manifest.load(args.manifest), TextConfig(seq_len=args.seq_len, pack=args.pack))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
