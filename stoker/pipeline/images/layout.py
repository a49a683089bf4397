"""The tensors of an image batch, as they travel (the text counterpart is stoker/pipeline/text/layout.py).

Decoded on the host (the default): what the job's transform declares (pipeline.transforms), and
  label (B,) int32. The built-in train and eval transforms declare
  image (B, S, S, 3) uint8, RGB, NHWC, S = the job's image size
Decoded on the accelerator (`--decode-on accelerator`: the JPEG bytes and the drawn crop):
  jpeg: every row's JPEG bytes, one flat uint8 run; jpeg_end (B,) int64: where each row's bytes end
  crop (B, 4) float32: the crop window (x, y, w, h) in source pixels; flip (B,) uint8; label (B,) int32
"""

from __future__ import annotations

from enum import StrEnum

from stoker.pipeline.tensors import TensorSpec


class DecodeOn(StrEnum):
    """Where an image job's JPEGs are decoded. A `str`: the value is what the flag, the wire and a
    summary's JSON say."""

    HOST = "host"  # the worker decodes and transforms; a batch carries the transform's outputs
    ACCELERATOR = "accelerator"  # the worker ships JPEG bytes and the drawn crop; the consumer decodes (DALI)

RAGGED = {"jpeg": "jpeg_end"}  # flat tensor -> the tensor of its rows' end offsets


LABEL = TensorSpec("<i4", ())


def transformed_specs(outputs: dict[str, TensorSpec]) -> dict[str, TensorSpec]:
    """A host-decoded batch: the transform's outputs and the records' labels."""
    return {**outputs, "label": LABEL}


def tensor_specs(image_size: int, decode_on: DecodeOn = DecodeOn.HOST) -> dict[str, TensorSpec]:
    if decode_on == DecodeOn.ACCELERATOR:
        return {"jpeg": TensorSpec("|u1", ()), "jpeg_end": TensorSpec("<i8", ()), "crop": TensorSpec("<f4", (4,)),
                "flip": TensorSpec("|u1", ()), "label": TensorSpec("<i4", ())}
    return {"image": TensorSpec("|u1", (image_size, image_size, 3)), "label": TensorSpec("<i4", ())}
