"""NVIDIA DALI CPU pipeline (device_id=None): file reader, decode, random resized crop, flip."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from nvidia.dali import fn, pipeline_def, types


def build(files: list[str], threads: int, batch: int, fused: bool, min_area: float):
    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, prefetch_queue_depth=2)
    def rrc_pipeline():
        jpegs, _ = fn.readers.file(files=files, random_shuffle=False, name="reader")
        crop = dict(random_area=[min_area, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        if fused:
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB, **crop)
            images = fn.resize(images, resize_x=224, resize_y=224)
        else:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.random_resized_crop(images, size=[224, 224], **crop)
        return fn.flip(images, horizontal=fn.random.coin_flip())

    pipe = rrc_pipeline()
    pipe.build()
    return pipe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--fused", action="store_true", help="decoders.image_random_crop")
    parser.add_argument("--min-area", type=float, default=0.05)
    args = parser.parse_args()
    files = open(args.files).read().split()
    pipe = build(files, args.threads, args.batch_size, args.fused, args.min_area)
    batches = len(files) // args.batch_size
    images, started = 0, None
    for _ in range(batches):
        (out,) = pipe.run()
        array = np.asarray(out.as_tensor())
        assert array.shape[1:] == (224, 224, 3) and array.dtype == np.uint8
        if started is None:
            started = time.perf_counter()
            continue
        images += array.shape[0]
    seconds = time.perf_counter() - started
    import nvidia.dali

    print(json.dumps({"images": images, "seconds": seconds, "images_per_s": images / seconds,
                      "versions": {"dali": nvidia.dali.__version__}}))


if __name__ == "__main__":
    main()
