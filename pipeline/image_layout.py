"""The tensors of an image batch, as they travel (the text counterpart is pipeline/text/layout.py).

Decoded on the host (the default):
  image (B, S, S, 3) uint8, RGB, NHWC, S = the job's image size; label (B,) int32
Decoded on the accelerator (`--decode-on accelerator`: the JPEG bytes and the drawn crop):
  jpeg: every row's JPEG bytes, one flat uint8 run; jpeg_end (B,) int64: where each row's bytes end
  crop (B, 4) float32: the crop window (x, y, w, h) in source pixels; flip (B,) uint8; label (B,) int32
"""

from __future__ import annotations

from pipeline.tensors import TensorSpec

RAGGED = {"jpeg": "jpeg_end"}  # flat tensor -> the tensor of its rows' end offsets


def tensor_specs(image_size: int, decode_on: str = "host") -> dict[str, TensorSpec]:
    if decode_on == "accelerator":
        return {"jpeg": TensorSpec("|u1", ()), "jpeg_end": TensorSpec("<i8", ()), "crop": TensorSpec("<f4", (4,)),
                "flip": TensorSpec("|u1", ()), "label": TensorSpec("<i4", ())}
    return {"image": TensorSpec("|u1", (image_size, image_size, 3)), "label": TensorSpec("<i4", ())}
