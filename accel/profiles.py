"""Calibrated rates for the simulated accelerator: what one accelerator system consumes.

Each rate is samples per second for the whole system named, from the source given; a
`scale` (e.g. 0.01) shrinks it so a 2-core machine can run the same CPU:accelerator ratio
experiment a hundred times smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.kinds import ModelFamily, kind_of

RESNET50, BERT = ModelFamily.RESNET50, ModelFamily.BERT


@dataclass(frozen=True)
class Profile:
    name: str
    rates: dict[ModelFamily, float]  # ResNet-50: images/s; BERT-large: sequences/s at length 512; absent: no figure
    source: str


PROFILES = {p.name: p for p in (
    Profile("a100", {RESNET50: 2_500, BERT: 210},
            "one A100 GPU, PyTorch mixed precision: ~2,500 img/s ResNet-50 and ~210 seq/s BERT-large at 512 "
            "(figures quoted in this project's training-steps issue, from NVIDIA's published training performance)"),
    Profile("h100", {RESNET50: 7_000},
            "one H100 GPU in MLPerf Training v3.0 ResNet-50 (~7,000 img/s per GPU, quoted in the same issue); "
            "no BERT figure is given there"),
    Profile("ipu-pod16", {RESNET50: 26_000, BERT: 1_300},
            "Graphcore IPU-POD16: ~26,000 img/s ResNet-50, ~1,300 seq/s BERT (quoted in the same issue)"),
    Profile("ipu-pod64", {RESNET50: 68_000, BERT: 3_850},
            "Graphcore IPU-POD64: ~68,000 img/s ResNet-50, ~3,850 seq/s BERT (quoted in the same issue)"),
)}


def profile_rate(name: str, dataset: str, scale: float = 1.0) -> float:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r} (choose {', '.join(PROFILES)})")
    profile = PROFILES[name]
    family = kind_of(dataset).model_family
    rate = profile.rates.get(family, 0)
    if not rate:
        raise ValueError(f"profile {name} has no {family} rate")
    if not 0 < scale <= 1:
        raise ValueError(f"scale {scale} must lie in (0, 1]")
    return rate * scale
