"""Decoding on the accelerator (`--decode-on accelerator`): workers ship JPEG bytes, the consumer decodes.

This is how NVIDIA fed DGX A100 in MLPerf: the host only reads files and draws the random
crop; nvJPEG decodes on the GPU. Here the workers draw the crop box and flip exactly as they
would for host decoding (same per-sample generator), as whole pixels inside the image
(`pipeline.images.batching.pixel_window`), and send them beside the bytes; an NVIDIA DALI pipeline
decodes just that region (`decoders.image_slice`), resizes it with antialiasing and mirrors
it. On a CUDA device the decoder is DALI's "mixed" one (nvJPEG) and the images never touch
host memory; on `cpu` the same pipeline runs DALI's CPU operators. As on the host, the EXIF
orientation is ignored (the reference pipelines ignore it, and the crop was drawn in the
stored image's coordinates).

A JPEG whose header parsed on the worker may still fail to decode. DALI then fails the
whole batch and its pipeline is no longer usable, so the pipeline is rebuilt before any
further call, and the batch is decoded again one image at a time. An image DALI still
refuses is decoded on the consumer's CPU with the host's decoder (counted as a fallback);
only one that fails there too is dropped, counted, and reported with DALI's own error (a JPEG
libjpeg says is corrupt fails there unless the job says `--corrupt-jpegs keep`; the worker skips
such a file before it ships it unless it has a restart index, pipeline.images.corrupt).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from stoker.accel.batch import ReceivedBatch
from stoker.accel.ledger import Skipped
from stoker.accel.stepping import PreparedStep, Step, StepRunner
from stoker.pipeline.images.augment import DecodeError, GivenCrop, corrupt_jpegs, decode_augment
from stoker.pipeline.transforms import Crop

if TYPE_CHECKING:
    from nvidia.dali.pipeline import Pipeline

log = logging.getLogger("stoker.consumer")


@dataclass
class DecodedBatch:
    """What the wrapped accelerator steps on: pixels where the received batch had bytes."""

    images: object  # uint8 (n, size, size, 3): numpy on the CPU, a torch tensor on a CUDA device
    labels: np.ndarray
    sample_ids: np.ndarray
    has_images: bool = True

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])


class DaliJpegDecoder:
    """One DALI pipeline: (JPEG bytes, crop box, flip) per sample to size x size RGB.

    The pipeline is built on first use, on the thread that runs it (the consumer's prefetch
    thread), and rebuilt after any failure: DALI must not be called again on a pipeline
    that raised."""

    def __init__(self, size: int, max_batch: int, device: str = "cpu", threads: int = 1,
                 corrupt: str = "skip") -> None:
        """`corrupt`: the job's --corrupt-jpegs, for the host decoder that stands in for DALI."""
        self.size = size
        self.max_batch = max_batch
        self.device = device
        self.threads = threads
        self.corrupt = corrupt
        self.device_id = None if device == "cpu" else int(device.partition(":")[2] or 0)
        self.pipe: Pipeline | None = None
        self.fallbacks = 0  # images DALI refused that the host decoder made

    def _build(self) -> Pipeline:
        from nvidia.dali import fn, pipeline_def, types

        decoder_device = "cpu" if self.device_id is None else "mixed"

        # DALI's stubs lag pipeline_def: it takes exec_dynamic, and device_id None (no GPU)
        @pipeline_def(batch_size=self.max_batch, num_threads=self.threads,  # type: ignore[call-overload]
                      device_id=self.device_id, prefetch_queue_depth=1, exec_dynamic=True)
        def slice_resize_flip():
            jpegs = fn.external_source(name="jpeg", dtype=types.UINT8, ndim=1)
            anchor = fn.external_source(name="anchor", dtype=types.FLOAT, ndim=1)
            shape = fn.external_source(name="shape", dtype=types.FLOAT, ndim=1)
            flip = fn.external_source(name="flip", dtype=types.INT32, ndim=0)
            images = fn.decoders.image_slice(jpegs, anchor, shape, normalized_anchor=False, normalized_shape=False,
                                             device=decoder_device, output_type=types.RGB,
                                             adjust_orientation=False)
            images = fn.resize(images, resize_x=self.size, resize_y=self.size, antialias=True)
            return fn.flip(images, horizontal=flip)

        pipe = slice_resize_flip()
        pipe.build()
        return pipe

    def _run(self, jpegs: list[np.ndarray], crops: np.ndarray, flips: np.ndarray):
        if self.pipe is None:
            self.pipe = self._build()
        try:
            self.pipe.feed_input("jpeg", jpegs)
            self.pipe.feed_input("anchor", [np.ascontiguousarray(c[:2]) for c in crops])
            self.pipe.feed_input("shape", [np.ascontiguousarray(c[2:]) for c in crops])
            self.pipe.feed_input("flip", [np.array(f, dtype=np.int32) for f in flips])
            (images,) = self.pipe.run()
        except Exception:
            self.pipe = None  # unusable after an error: the next call builds a fresh one
            raise
        return images

    def decode(self, jpegs: list[np.ndarray], crops: np.ndarray, flips: np.ndarray) -> tuple[list, dict[int, str]]:
        """The decoded rows in order (DALI TensorLists, or uint8 arrays where the host decoder stood in),
        and {row: reason} of the rows that could not be decoded at all."""
        try:
            return [self._run(jpegs, crops, flips)], {}
        except Exception as exc:  # DALI raises RuntimeError, sometimes others; never trust the pipeline after
            log.debug("DALI failed a batch of %d; decoding it image by image: %s", len(jpegs), _reason(exc))
        outputs, failed = [], {}
        for row in range(len(jpegs)):
            try:
                outputs.append(self._run(jpegs[row:row + 1], crops[row:row + 1], flips[row:row + 1]))
                continue
            except Exception as exc:
                dali_error = _reason(exc)
            try:
                outputs.append(self._on_host(jpegs[row], crops[row], bool(flips[row])))
                self.fallbacks += 1
            except DecodeError as exc:
                failed[row] = f"{dali_error}; the host decoder too: {exc}"[:300]
        return outputs, failed

    def _on_host(self, jpeg: np.ndarray, crop: np.ndarray, flip: bool) -> np.ndarray:
        box = Crop(float(crop[0]), float(crop[1]), float(crop[2]), float(crop[3]), flip)
        with corrupt_jpegs(self.corrupt):
            return decode_augment(jpeg.data, GivenCrop(box, self.size), None, "full").pixels[None]


def _reason(exc: BaseException) -> str:
    """DALI's own words: what it "encountered" (the crop window, the codec's error), and the operator."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    operator = next((line for line in lines if line.startswith("Error in")), "").rstrip(",")
    after = lines[lines.index("encountered:") + 1:] if "encountered:" in lines else []
    detail = next((line for line in after if not line.startswith(("C++ context", "Current pipeline"))), "")
    if not detail:
        detail = next((line for line in lines if line.startswith("Failed")), "")
    if not detail:
        detail = next((line for line in lines if not line.startswith(("Critical error", "Current pipeline"))),
                      f"{type(exc).__name__}")
    where = f" ({operator})" if operator else ""
    return f"decode on the accelerator failed: {detail.rstrip(' :')}{where}"[:200]


def _as_array(out) -> np.ndarray:
    return out if isinstance(out, np.ndarray) else np.asarray(out.as_tensor())


def _to_host(outputs: list) -> np.ndarray:
    arrays = [_as_array(out) for out in outputs]
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _to_torch(outputs: list, device: str):
    import torch
    from nvidia.dali.plugin.pytorch import feed_ndarray

    parts = []
    for out in outputs:
        if isinstance(out, np.ndarray):  # decoded on the host after DALI refused it
            parts.append(torch.from_numpy(out).to(device))
            continue
        tensor = out.as_tensor()
        target = torch.empty(tensor.shape(), dtype=torch.uint8, device=device)
        feed_ndarray(tensor, target, cuda_stream=torch.cuda.current_stream(target.device))
        parts.append(target)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


@dataclass
class DecodingAccelerator(PreparedStep[tuple[DecodedBatch, object]]):
    """Any step, fed decoded pixels: `prepare` decodes (and then runs the inner prepare, if it
    has one), so the consumer's prefetch thread overlaps decoding with the previous step."""

    inner: Step
    decoder: DaliJpegDecoder
    decode_s: float = 0.0
    on_decode: Callable[[float, int, int], None] | None = None  # seconds, failed rows, host fallbacks (metrics)
    key_of: Callable[[int], str] = lambda sample_id: f"sample {sample_id}"  # noqa: E731 - names the broken file

    def decode(self, batch: ReceivedBatch) -> DecodedBatch:
        """The batch's pixels; rows that could not be decoded go to `batch.undecodable` (the
        consumer's books count them as skipped, not delivered)."""
        started = time.perf_counter()
        fallbacks = self.decoder.fallbacks
        data, ends = batch.tensor("jpeg"), batch.tensor("jpeg_end")
        starts = np.concatenate([[0], ends[:-1]])
        jpegs = [data[s:e] for s, e in zip(starts, ends, strict=True)]
        crops, flips = batch.tensor("crop"), batch.tensor("flip")
        labels = np.asarray(batch.labels)
        outputs, failed = self.decoder.decode(jpegs, crops, flips)
        keep = np.array([row not in failed for row in range(len(jpegs))], dtype=bool)
        for row, reason in failed.items():
            sample_id = int(batch.sample_ids[row])
            batch.undecodable.append(Skipped(batch.header.epoch, sample_id, self.key_of(sample_id), reason))
        if not outputs:
            images = np.empty((0, self.decoder.size, self.decoder.size, 3), dtype=np.uint8)
        elif self.decoder.device_id is None:
            images = _to_host(outputs)
        else:
            images = _to_torch(outputs, self.decoder.device)
        seconds = time.perf_counter() - started
        self.decode_s += seconds
        if self.on_decode is not None:
            self.on_decode(seconds, len(failed), self.decoder.fallbacks - fallbacks)
        return DecodedBatch(images, labels[keep], np.asarray(batch.sample_ids)[keep])

    # read-only, unlike Step.name: it follows the wrapped step's (read only when there is one)
    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.inner.name}+decode"

    def __post_init__(self) -> None:
        self.runner = StepRunner(self.inner)

    # The inner step is handed the DecodedBatch where its contract says ReceivedBatch: an image step
    # reads only labels, images, size and has_images, which a DecodedBatch has (hence the casts).
    def prepare(self, batch: ReceivedBatch) -> tuple[DecodedBatch, object]:
        decoded = self.decode(batch)
        prepare = self.runner.prepare
        return decoded, prepare(cast(ReceivedBatch, decoded)) if prepare is not None and decoded.size else None

    def step_prepared(self, prepared: tuple[DecodedBatch, object]) -> None:
        decoded, inner_prepared = prepared
        if decoded.size:
            self.runner.run(cast(ReceivedBatch, decoded), inner_prepared)
