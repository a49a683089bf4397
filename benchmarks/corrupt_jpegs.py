"""What refusing corrupt JPEGs costs each decode path, and what libjpeg notices (issue 45, item 3).

On the default set, CPU time (time.process_time) per image on one pinned core, each path under
`--corrupt-jpegs keep` (libjpeg's warnings ignored, the decoders' old rule) and `skip` (the
default: refused), interleaved path by path, medians of `repeats` rounds:

- auto (the crop decoder) on the indexed shards `stoker prepare` writes: the default path;
- auto on the original files (no restart index: the crop decoder reads the scan to its end);
- pillow (`--decoder pillow`) on the original files (an entropy-only libjpeg pass first);
- the whole image, as a transform that takes pixels gets it (the first 500 originals);
- the pass alone (`pipeline.images._jpegcrop.scan`).

And on every original file: the share of garbles (16 random bytes, no 0xFF, written over the
middle of the scan; seeded by the file's number) and of cuts (60% of the way through the scan)
that libjpeg notices. The figures go to benchmarks/results/corrupt_jpegs.{json,md}.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.report import CoreWatch, header, write_results
from stoker.datasets import default_imagenet
from stoker.pipeline.images import _jpegcrop
from stoker.pipeline.images.augment import TrainTransform, corrupt_jpegs, decode_augment, decode_whole
from stoker.pipeline.images.corrupt import scan_bounds
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.store.shards import Manifest

CORE = 0
WHOLE_IMAGES = 500
GARBLE_BYTES = 16


def _indexed_rows(manifest: Manifest) -> list[tuple[bytes, bytes | None]]:
    rows = []
    for shard in range(len(manifest.shards)):
        reader = manifest.open_shard(shard)
        for row in range(len(reader)):
            restarts = reader.restarts(row)
            rows.append((bytes(reader.jpeg(row)), bytes(restarts) if restarts is not None else None))
    return rows


def _paths(manifest: Manifest) -> dict[str, tuple[list, Callable[[int, object], object]]]:
    originals = [p.read_bytes() for p in sorted((Path(manifest.uri).parent.parent / "raw" / "train").glob("*/*.JPEG"))]
    t = TrainTransform()
    return {
        "auto, indexed shards (default)": (_indexed_rows(manifest), lambda i, x: decode_augment(
            x[0], t, sample_random(0, 0, i), "auto", x[1])),
        "auto, original files": (originals, lambda i, x: decode_augment(x, t, sample_random(0, 0, i), "auto")),
        "pillow, original files": (originals, lambda i, x: decode_augment(x, t, sample_random(0, 0, i), "pillow")),
        "whole image, original files": (originals[:WHOLE_IMAGES], lambda i, x: decode_whole(x)),
        "the libjpeg pass alone, original files": (originals, lambda i, x: _jpegcrop.scan(x)),
    }


def _cpu_us(items: list, call: Callable[[int, object], object], policy: str) -> float:
    with corrupt_jpegs(policy):
        started = time.process_time()
        for i, item in enumerate(items):
            call(i, item)
        return (time.process_time() - started) / len(items) * 1e6


def _noticed(jpeg: bytes) -> bool:
    try:
        return _jpegcrop.scan(jpeg) is not None
    except ValueError:
        return True  # not decodable at all: refused too


def detection(originals: list[bytes]) -> dict[str, float]:
    """The share of garbles and of cuts libjpeg notices, over every original file."""
    garbles = cuts = 0
    for number, jpeg in enumerate(originals):
        start, end = scan_bounds(jpeg)
        middle, rng = (start + end) // 2, random.Random(number)
        noise = bytes(rng.randrange(0xFF) for _ in range(GARBLE_BYTES))
        garbles += _noticed(jpeg[:middle] + noise + jpeg[middle + GARBLE_BYTES:])
        cuts += _noticed(jpeg[: start + (end - start) * 6 // 10])
    return {"files": len(originals), "garbles_noticed": garbles / len(originals), "cuts_noticed": cuts / len(originals)}


def main(repeats: int = 3) -> dict:
    os.sched_setaffinity(0, {CORE})
    manifest = Manifest.load(default_imagenet())
    paths = _paths(manifest)
    rounds: list[dict[str, float]] = []
    with CoreWatch(CORE) as watch:
        for _ in range(repeats):
            rounds.append({f"{name} | {policy}": _cpu_us(items, call, policy)
                           for name, (items, call) in paths.items() for policy in ("keep", "skip")})
    cpu = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    result = {**header("corrupt_jpegs", "pillow-simd"), "cpu_us_per_image": cpu, "rounds": rounds,
              "images": {name: len(items) for name, (items, _) in paths.items()},
              "libjpeg_turbo": _jpegcrop.LIBJPEG_TURBO_VERSION_NUMBER,
              "detection": detection(paths["auto, original files"][0]), **watch.as_dict()}
    write_results("corrupt_jpegs", result, markdown(result))
    print(markdown(result))
    return result


def markdown(result: dict) -> str:
    cpu, found = result["cpu_us_per_image"], result["detection"]
    lines = [f"CPU time per image (time.process_time), core {CORE}, medians of {len(result['rounds'])} interleaved "
             f"rounds, libjpeg-turbo {result['libjpeg_turbo']}, {result['cpu']}.", "",
             "| path | images | keep: us CPU/image | skip (default): us CPU/image | skip / keep |",
             "|---|---|---|---|---|"]
    for name, count in result["images"].items():
        keep, skip = cpu[f"{name} | keep"], cpu[f"{name} | skip"]
        lines.append(f"| {name} | {count} | {keep:,.0f} | {skip:,.0f} | {skip / keep:.3f} |")
    lines += ["", f"Of {found['files']} original files, libjpeg noticed {100 * found['garbles_noticed']:.1f}% of "
              f"{GARBLE_BYTES}-byte garbles in the middle of the scan and {100 * found['cuts_noticed']:.1f}% of "
              "cuts 60% of the way through it."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
