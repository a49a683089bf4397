"""Calibrated rates for the simulated accelerator: what one accelerator system consumes.

Each rate is samples per second for the whole system named, from the source given; a
`scale` (e.g. 0.01) shrinks it so a 2-core machine can run the same CPU:accelerator ratio
experiment a hundred times smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.kinds import kind_of


@dataclass(frozen=True)
class Profile:
    name: str
    resnet50: float  # images/s
    bert: float  # sequences/s at length 512 (BERT-large)
    source: str


PROFILES = {p.name: p for p in (
    Profile("a100", 2_500, 210,
            "one A100 GPU, PyTorch mixed precision: ~2,500 img/s ResNet-50 and ~210 seq/s BERT-large at 512 "
            "(figures quoted in this project's training-steps issue, from NVIDIA's published training performance)"),
    Profile("h100", 7_000, 0,
            "one H100 GPU in MLPerf Training v3.0 ResNet-50 (~7,000 img/s per GPU, quoted in the same issue); "
            "no BERT figure is given there"),
    Profile("ipu-pod16", 26_000, 1_300,
            "Graphcore IPU-POD16: ~26,000 img/s ResNet-50, ~1,300 seq/s BERT (quoted in the same issue)"),
    Profile("ipu-pod64", 68_000, 3_850,
            "Graphcore IPU-POD64: ~68,000 img/s ResNet-50, ~3,850 seq/s BERT (quoted in the same issue)"),
)}


def profile_rate(name: str, dataset: str, scale: float = 1.0) -> float:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r} (choose {', '.join(PROFILES)})")
    profile = PROFILES[name]
    family = kind_of(dataset).model_family
    rate = {"bert": profile.bert, "resnet50": profile.resnet50}[family]
    if not rate:
        raise ValueError(f"profile {name} has no {family} rate")
    if not 0 < scale <= 1:
        raise ValueError(f"scale {scale} must lie in (0, 1]")
    return rate * scale
