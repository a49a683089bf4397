"""Does scaling the IDCT by M/8 pay, against today's powers of two? (issue 17, item 2)

libjpeg-turbo decodes at any scale M/8, but has SIMD code only for some scales, so a finer
scale decodes fewer pixels with slower code. This measures, on the default set with the MLPerf
training crops, the crop decoder (`pipeline.images._jpegcrop`) plus the bilinear resize to 224 for
the same crops two ways, interleaved image by image on one pinned core:

(a) today's rule: the coarsest of 1/8, 1/4, 1/2, 1/1 that still covers the output;
(b) the coarsest M/8 (M = 1..8) that still covers it.

It also reports how far (b)'s pixels are from a full-resolution decode of the same crop,
beside (a)'s. The figures go to benchmarks/results/dct_scale.{json,md}.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time

import numpy as np
from PIL import Image

from benchmarks.report import CoreWatch, header, write_results
from stoker.datasets import default_imagenet
from stoker.pipeline.images import _jpegcrop
from stoker.pipeline.images.augment import TrainTransform
from stoker.pipeline.store.shards import Manifest, ShardReader

CORE = 0
SIZE = 224
_MARGIN = 2  # scaled pixels around the box, as pipeline.images.augment decodes them


def scale_eighths(width: int, height: int, crop, rule: str) -> int:
    """The scale in eighths: M with M/8 the coarsest allowed scale that still covers SIZE."""
    need = max(SIZE / crop.width, SIZE / crop.height)
    if rule == "pow2":
        return next((m for m in (1, 2, 4) if m / 8 >= need), 8)
    return next((m for m in range(1, 9) if m / 8 >= need), 8)


def decode_resize(jpeg: bytes, width: int, height: int, crop, eighths: int) -> np.ndarray:
    num, denom = (1, 8 // eighths) if eighths in (1, 2, 4, 8) else (eighths, 8)
    scaled_w, scaled_h = -(-width * num // denom), -(-height * num // denom)
    sx, sy = scaled_w / width, scaled_h / height
    box = (crop.left * sx, crop.top * sy, (crop.left + crop.width) * sx, (crop.top + crop.height) * sy)
    left, top = max(0, math.floor(box[0]) - _MARGIN), max(0, math.floor(box[1]) - _MARGIN)
    right, bottom = min(scaled_w, math.ceil(box[2]) + _MARGIN), min(scaled_h, math.ceil(box[3]) + _MARGIN)
    pixels, region_w, region_h, x, y, _ = _jpegcrop.decode(jpeg, denom, left, top, right, bottom, num)
    region = Image.frombuffer("RGBX", (region_w, region_h), pixels, "raw", "RGBX", 0, 1)
    out = region.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=(box[0] - x, box[1] - y, box[2] - x, box[3] - y))
    return np.asarray(out.convert("RGB"))


def samples(limit: int) -> list[tuple[bytes, int, int, object]]:
    manifest = Manifest.load(str(default_imagenet()))
    transform, rng, out = TrainTransform(size=SIZE), random.Random(0), []
    for index in range(len(manifest.shards)):
        reader = ShardReader(manifest.shard_uri(index))
        for row in range(len(reader)):
            jpeg = bytes(reader.jpeg(row))
            width, height, _, colorspace, _ = _jpegcrop.header(jpeg)
            if colorspace in ("cmyk", "ycck"):
                continue  # the crop decoder hands these to Pillow
            out.append((jpeg, width, height, transform.crop(width, height, rng)))
            if len(out) == limit:
                return out
    return out


def main(images: int = 2000, repeats: int = 3) -> dict:
    os.sched_setaffinity(0, {CORE})
    found = [(sample, scale_eighths(*sample[1:], "pow2"), scale_eighths(*sample[1:], "eighths"))
             for sample in samples(images)]
    changed = [(sample, a, b) for sample, a, b in found if a != b]
    rounds = []
    with CoreWatch(CORE) as watch:
        for _ in range(repeats):
            spent = {"pow2": 0.0, "eighths": 0.0}
            for sample, a, b in found:
                for rule, eighths in (("pow2", a), ("eighths", b)):
                    started = time.perf_counter()
                    decode_resize(*sample, eighths)
                    spent[rule] += time.perf_counter() - started
            rounds.append({rule: len(found) / seconds for rule, seconds in spent.items()})
    errors: dict[str, list[float]] = {"pow2": [], "eighths": []}
    for sample, a, b in changed[:200]:
        full = decode_resize(*sample, 8).astype(np.int16)
        for rule, eighths in (("pow2", a), ("eighths", b)):
            errors[rule].append(float(np.abs(decode_resize(*sample, eighths).astype(np.int16) - full).mean()))
    pow2 = statistics.median(r["pow2"] for r in rounds)
    eighths = statistics.median(r["eighths"] for r in rounds)
    result = {**header("dct_scale", "pillow-simd"), "images": len(found), "changed": len(changed),
              "rounds": rounds, "pow2_images_per_s": pow2, "eighths_images_per_s": eighths,
              "ratio": eighths / pow2, "mean_abs_error_vs_full": {k: statistics.mean(v) if v else 0.0
                                                                  for k, v in errors.items()},
              "max_mean_abs_error_vs_full": {k: max(v, default=0.0) for k, v in errors.items()},
              **watch.as_dict()}
    table = (f"| crop decode + resize to {SIZE}, {len(found)} images, core {CORE}, median of {repeats} | images/s |\n"
             f"|---|---|\n| (a) powers of two (today) | {pow2:.0f} |\n| (b) M/8 | {eighths:.0f} |\n"
             f"| ratio (b)/(a) | {eighths / pow2:.3f} |\n"
             f"| images whose scale differs | {len(changed)} of {len(found)} |\n"
             f"| mean abs. difference from the full-resolution decode, on those (a) / (b) | "
             f"{result['mean_abs_error_vs_full']['pow2']:.2f} / {result['mean_abs_error_vs_full']['eighths']:.2f} "
             f"levels (worst image {result['max_mean_abs_error_vs_full']['pow2']:.2f} / "
             f"{result['max_mean_abs_error_vs_full']['eighths']:.2f}) |\n")
    write_results("dct_scale", result, table)
    print(table)
    return result


if __name__ == "__main__":
    main()
