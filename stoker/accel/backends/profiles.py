"""Calibrated rates for the simulated accelerator: what one accelerator system consumes.

Each rate is samples per second for the whole system named, from the source given; a
`scale` (e.g. 0.01) shrinks it so a 2-core machine can run the same CPU:accelerator ratio
experiment a hundred times smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

from stoker.pipeline.kinds import ModelFamily, kind_of
from stoker.protos.errors import ConfigError

RESNET50, BERT, GPT = ModelFamily.RESNET50, ModelFamily.BERT, ModelFamily.GPT
PROFILE_SEQ_LEN = 512  # the sequence length the profiles' BERT rates count (MLPerf's BERT-large phase 2)
GPT_PROFILE_SEQ_LEN = 1024  # the row length the profiles' GPT-2 124M rates count (nanoGPT's)


@dataclass(frozen=True)
class TokenRate:
    """What one accelerator consumes of a token stream when it never waits: a model's pretraining in tokens/s."""

    model: str
    tokens_per_s: float
    seq_len: int  # the row length the figure was measured at
    source: str


@dataclass(frozen=True)
class Profile:
    name: str
    rates: dict[ModelFamily, float]  # ResNet-50: images/s; BERT-large: sequences/s at length 512; GPT-2 124M:
    # rows/s at length 1,024 (a tokens job); absent: no figure
    source: str
    decode_on_accelerator: str  # what moving JPEG decode off the host (--decode-on accelerator) changes there
    lm: TokenRate | None = None  # a language model's pretraining, in tokens per second (`stoker plan --dataset tokens`)


# MLPerf Training v3.0, closed division, 8x H100-SXM5-80GB (NVIDIA's "Training to Convergence" table at
# developer.nvidia.com/deep-learning-performance-training-inference/training): ResNet-50 v1.5 in 13.466 min
# (MLPerf-ID 3.0-2053), BERT in 5.349 min (3.0-2055). Per GPU: samples to train / minutes / 8.
_H100_BERT = 2_750_000 / (5.349 * 60) / 8  # ~1,070 seq/s (the BERT workload of stoker/pipeline/kinds.py)
_HOPPER_DECODE = ("Hopper carries 7 hardware JPEG engines (NVJPG) beside its SMs; with --decode-on accelerator "
                  "(DALI's mixed decoder) the host keeps read and framing, and its largest stage, the decode, "
                  "leaves it: divide the cores by the share decode takes of `stoker run`'s worker CPU")

# Llama 3.1 8B pretraining in tokens per second per GPU. NVIDIA's Megatron-Bridge performance summary (NeMo 25.11
# container; docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary.html, LLAMA3_8B: the Llama 3 8B
# architecture Llama 3.1 8B keeps) on 8 GPUs, FP8 current scaling, sequences of 8,192, global batch 128. No H200 row
# there: estimated from model FLOPs, 6 x 8.03 B parameters = 48.2 GFLOP per token.
LLAMA31_8B = "Llama 3.1 8B"
LLAMA31_8B_FLOP_PER_TOKEN = 6 * 8.03e9
LM_SEQ_LEN = 8192
_H100_LLAMA = 14_451
_HOPPER_BF16_DENSE = 989e12  # FLOP/s, dense BF16, H100 SXM and H200 alike (NVIDIA's datasheets)
_H100_MFU = _H100_LLAMA * LLAMA31_8B_FLOP_PER_TOKEN / _HOPPER_BF16_DENSE  # ~0.70 of the BF16 peak (an FP8 run)
_SUMMARY = "NVIDIA's Megatron-Bridge performance summary, NeMo 25.11 container, LLAMA3_8B on 8 GPUs, FP8-CS, seq 8,192"
_LLAMA_H100 = TokenRate(LLAMA31_8B, _H100_LLAMA, LM_SEQ_LEN, f"{_SUMMARY}: DGX-H100 14,451 tokens/s per GPU")
_LLAMA_H200 = TokenRate(
    LLAMA31_8B, round(_H100_MFU * _HOPPER_BF16_DENSE / LLAMA31_8B_FLOP_PER_TOKEN, -1), LM_SEQ_LEN,
    f"estimate, no published figure found: 6 x 8.03 B params = 48.2 GFLOP per token at the H200's dense BF16 peak "
    f"(989 TFLOPS, the H100 SXM's) and the {100 * _H100_MFU:.0f}% MFU of that peak the H100 row of {_SUMMARY} "
    f"reaches (an FP8 run); the H200's larger, faster memory (141 GB, 4.8 TB/s) is not counted")
_LLAMA_B200 = TokenRate(LLAMA31_8B, 30_624, LM_SEQ_LEN, f"{_SUMMARY}: DGX-B200 30,624 tokens/s per GPU")

PROFILES = {p.name: p for p in (
    Profile("a100", {RESNET50: 2_500, BERT: 210, GPT: 104},
            "one A100 GPU, PyTorch mixed precision: ~2,500 img/s ResNet-50 and ~210 seq/s BERT-large at 512 "
            "(figures quoted in this project's training-steps issue, from NVIDIA's published training performance); "
            "GPT-2 124M ~104 rows/s at 1,024 (nanoGPT's README: ~295 B tokens in about 4 days on 8 A100 40GB)",
            "the A100 has a 5-core hardware JPEG decoder (NVJPG); --decode-on accelerator moves decode there and "
            "leaves the host read and framing"),
    Profile("h100", {RESNET50: 7_000, BERT: round(_H100_BERT, -1)},
            "one H100 SXM5 80GB: ResNet-50 ~7,000 img/s per GPU in MLPerf Training v3.0 (quoted in the "
            "training-steps issue; NVIDIA's table gives 13.466 min on 8 GPUs, 3.0-2053: ~6,900 img/s per GPU if "
            "that run took 35 epochs); BERT ~1,070 seq/s per GPU: 2.75 M samples over MLPerf v3.0's 5.349 min on 8 "
            "GPUs (3.0-2055). MLPerf's BERT skips padding, so that rate is at its mixed lengths, not padded 512",
            _HOPPER_DECODE, lm=_LLAMA_H100),
    Profile("h200", {RESNET50: 7_700, BERT: round(1.1 * _H100_BERT, -1)},
            "one H200 (estimate): the H100 SXM's figures x1.1. It has the H100's tensor throughput (989 dense "
            "BF16 TFLOPS on both NVIDIA datasheets) and 4.8 vs 3.35 TB/s of memory bandwidth; NVIDIA's up-to-47% "
            "H200 gains in MLPerf Training v4.0 were on memory-bound LLM work, and we found no ResNet-50 or BERT "
            "result for it to cite; these two compute-bound models get +10%",
            _HOPPER_DECODE, lm=_LLAMA_H200),
    Profile("b200", {RESNET50: 14_000, BERT: round(2 * _H100_BERT, -1)},
            "one B200 (estimate): the H100 SXM's figures x2. MLPerf Training v4.1 (MLCommons, November 2024) "
            "showed B200 at about 2x H100 per GPU on GPT-3 pretraining; ResNet-50 had left the suite and we found "
            "no per-GPU BERT figure to cite",
            "Blackwell keeps NVJPG hardware decoders: as for Hopper, --decode-on accelerator leaves the host read "
            "and framing, which matters most here: at twice the H100's rate the host's decode cost doubles too",
            lm=_LLAMA_B200),
    Profile("ipu-pod16", {RESNET50: 26_000, BERT: 1_300},
            "Graphcore IPU-POD16: ~26,000 img/s ResNet-50, ~1,300 seq/s BERT (quoted in the same issue)",
            "an IPU has no JPEG decoder: decoding stays on the host (--decode-on accelerator would decode on the "
            "host that steps the IPUs, with the same CPU)"),
    Profile("ipu-pod64", {RESNET50: 68_000, BERT: 3_850},
            "Graphcore IPU-POD64: ~68,000 img/s ResNet-50, ~3,850 seq/s BERT (quoted in the same issue)",
            "as the IPU-POD16: no JPEG decoder on the IPUs; decoding stays on the host"),
)}


def profile_rate(name: str, dataset: str, scale: float = 1.0) -> float:
    if name not in PROFILES:
        raise ConfigError(f"unknown profile {name!r} (choose {', '.join(PROFILES)})")
    profile = PROFILES[name]
    family = kind_of(dataset).model_family
    rate = profile.rates.get(family, 0)
    if not rate:
        raise ConfigError(f"profile {name} has no {family} rate")
    if not 0 < scale <= 1:
        raise ConfigError(f"scale {scale} must lie in (0, 1]")
    return rate * scale


def token_rate(name: str) -> TokenRate:
    """A profile's language-model rate in tokens per second (`stoker plan --dataset tokens`)."""
    if name not in PROFILES:
        raise ConfigError(f"unknown profile {name!r} (choose {', '.join(PROFILES)})")
    rate = PROFILES[name].lm
    if rate is None:
        having = ", ".join(p.name for p in PROFILES.values() if p.lm is not None)
        raise ConfigError(f"profile {name} has no language-model rate in tokens per second (these have: {having})")
    return rate
