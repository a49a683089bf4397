"""The peer suite: Stoker against what a user would pick instead, on the same files and cores.

Images (uint8 224x224x3, random resized crop area 0.05-1 + flip, batches of 64, the default
2,000-image set): Stoker end to end (worker daemon -> ZeroMQ -> null consumer) with its
crop-window decoder on the default shards (restart-indexed) and on shards of the same files
prepared without the index, and with pillow-simd; PyTorch DataLoader + torchvision on PIL images
(num_workers 0/1/2); NVIDIA DALI's CPU pipeline (1/2 threads, decode + random_resized_crop
and the fused decoders.image_random_crop); libjpeg-turbo itself in C (every pixel, and only
the crop windows Stoker would decode). Text: Stoker's online BERT examples (pairs, masking,
packing) vs transformers' DataCollatorForLanguageModeling (padding + masking of ready
sequences), sequences/s on one core.

Peers run in their own environment, benchmarks/work/peer-venv (made on first use: torch
2.14.1 + torchvision 0.29.1, nvidia-dali-cuda130, transformers), never Stoker's or CI's.
Every contender is pinned with taskset to the same core set; the page cache is warmed; the
contenders run interleaved (A B C ... A B C ...) `repeats` times; medians and ratios go to
benchmarks/results/suite.{json,md}, and the table between the suite markers in
docs/measurements.md is rewritten.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.common import run_with_worker
from benchmarks.report import header, write_results
from stoker.accel.consumer import Consumer, ConsumerConfig
from stoker.datasets import default_imagenet, default_wikipedia
from stoker.pipeline.images import augment
from stoker.pipeline.images.augment import TrainTransform, crop_window
from stoker.pipeline.job import JobConfig
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.prepare import PrepareConfig, prepare_imagenet
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.store.shards import MANIFEST_VERSION, Manifest
from stoker.pipeline.text.batching import TextUnitSource, unit_sequences
from stoker.pipeline.text.docs import read_doc_shard
from stoker.pipeline.text.examples import Specials, TextConfig
from stoker.pipeline.text.vocab import Vocab

ROOT = Path(__file__).parent
WORK = ROOT / "work"
PAGE = ROOT.parent / "docs" / "measurements.md"  # the page that shows the table
PEER_VENV = WORK / "peer-venv"
PEER_PACKAGES = ["torch==2.14.1", "torchvision==0.29.1", "nvidia-dali-cuda130", "transformers"]
ONE, TWO = "0", "0,1"
BEGIN, END = "<!-- suite:begin -->", "<!-- suite:end -->"
PLAIN_SHARDS = "Stoker, crop-window decoder, shards without the restart index, 1 process (consumer on core 1)"


@dataclass
class Contender:
    name: str
    cores: str
    unit: str  # "img/s" or "seq/s"
    run: Callable[[], float]
    decode_cores: int = 0  # shown in the table; 0: as many as `cores` names

    @property
    def shown_cores(self) -> int:
        return self.decode_cores or len(self.cores.split(","))


def peer_python() -> str:
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        print(f"making the peers' environment in {PEER_VENV} (torch + torchvision, DALI, transformers)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES, "numpy"], check=True)
    return str(python)


def build_tj_loop() -> str:
    binary = WORK / "tj_loop"
    subprocess.run(["cc", "-O2", "-o", str(binary), str(ROOT / "tj_loop.c"), "-ljpeg"], check=True)
    return str(binary)


def json_of(cmd: list[str], key: str, env: dict | None = None) -> float:
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])[key])


def stoker_images(manifest: str, worker_cores: str, consumer_cores: set[int], procs: int, decoder: str) -> float:
    """One worker daemon -> ZeroMQ -> null consumer; delivered images/s after the first batch."""
    os.sched_setaffinity(0, consumer_cores)
    cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=None)
    consumer = Consumer(cfg, JobConfig(manifest_uri=manifest, decoder=decoder))
    summary = run_with_worker(consumer, worker_cores, procs)
    assert summary.unique_samples == summary.samples == consumer.manifest.num_samples
    return summary.delivered_samples_per_s


def image_files(manifest: Manifest) -> list[str]:
    raw = Path(manifest.uri).parent.parent / "raw" / "train"
    return sorted(str(p) for p in raw.glob("*/*.JPEG"))


def write_inputs(files: list[str]) -> tuple[Path, Path]:
    """The file list, and each file's crop window as Stoker's crop decoder would decode it."""
    WORK.mkdir(exist_ok=True)
    listing = WORK / "files.txt"
    listing.write_text("\n".join(files) + "\n")
    windows = WORK / "windows.txt"
    lines = []
    transform = TrainTransform()
    for index, path in enumerate(files):
        data = Path(path).read_bytes()
        width, height, _, colorspace, _ = augment._jpegcrop.header(data)
        if colorspace in ("cmyk", "ycck"):
            continue
        w = crop_window(width, height, transform.crop(width, height, sample_random(0, 0, index)), transform.size)
        lines.append(f"{path} {w.denom} {w.left} {w.top} {w.right} {w.bottom}")
    windows.write_text("\n".join(lines) + "\n")
    return listing, windows


def write_sequences(manifest: Manifest, seq_len: int) -> Path:
    """Unmasked `[CLS] A [SEP] B [SEP]` sequences of one epoch, for the collator."""
    vocab = Vocab.load(manifest.relative_uri(manifest.vocab))
    cfg = TextConfig(seq_len=seq_len)
    tokens, types, offsets = [], [], [0]
    sources = [TextUnitSource(read_doc_shard(manifest.shard_uri(i), manifest.shards[i], vocab.size), cfg,
                              Specials.of(vocab), 0) for i in range(len(manifest.shards))]
    for unit in EpochPlan(manifest, 256, 1, 0).units(0):
        for seq in unit_sequences(sources.__getitem__, unit, 0)[0]:
            ids = seq.tokens.copy()
            ids[seq.masked_positions] = seq.masked_ids
            tokens.append(ids)
            kinds = np.zeros(ids.size, np.int32)
            kinds[seq.len_a + 2:] = 1
            types.append(kinds)
            offsets.append(offsets[-1] + ids.size)
    path = WORK / f"sequences-{seq_len}.npz"
    np.savez(path, tokens=np.concatenate(tokens), token_types=np.concatenate(types), offsets=np.array(offsets))
    return path


def plain_shards(manifest: Manifest) -> str:
    """The same originals prepared without the restart index (`--restart-interval-px 0`), once."""
    folder = WORK / "plain-shards"
    path = folder / "manifest.json"
    if not (path.exists() and Manifest.load(str(path)).version == MANIFEST_VERSION):
        print(f"preparing the default set without the restart index in {folder}", flush=True)
        prepare_imagenet(Path(manifest.uri).parent.parent / "raw", folder,
                         PrepareConfig(progress=False, restart_interval_px=0))
    return str(path)


def contenders(peer: str, tj: str, manifest: str, plain: str, files: Path, windows: Path, wiki: str,
               sequences: Path, vocab: str) -> list[Contender]:
    here = sys.executable
    peers = ROOT / "peers"

    def pinned(cores: str, *cmd: str) -> list[str]:
        return ["taskset", "-c", cores, *cmd]

    def dataloader(workers: int, cores: str, worker_core: int | None = None) -> Callable[[], float]:
        extra = [] if worker_core is None else ["--worker-core", str(worker_core)]
        return lambda: json_of(pinned(cores, peer, str(peers / "dataloader_loop.py"), "--files", str(files),
                                      "--workers", str(workers), *extra), "images_per_s")

    def dali(threads: int, cores: str, fused: bool) -> Callable[[], float]:
        extra = ["--fused"] if fused else []
        return lambda: json_of(pinned(cores, peer, str(peers / "dali_loop.py"), "--files", str(files),
                                      "--threads", str(threads), *extra), "images_per_s")

    return [
        Contender("Stoker, crop-window decoder, 1 process (consumer on core 1)", ONE, "img/s",
                  lambda: stoker_images(manifest, ONE, {1}, 1, "auto")),
        Contender(PLAIN_SHARDS, ONE, "img/s", lambda: stoker_images(plain, ONE, {1}, 1, "auto")),
        Contender("Stoker, pillow-simd decoder, 1 process (consumer on core 1)", ONE, "img/s",
                  lambda: stoker_images(manifest, ONE, {1}, 1, "pillow")),
        Contender("PyTorch DataLoader + torchvision, num_workers=0", ONE, "img/s", dataloader(0, ONE)),
        Contender("PyTorch DataLoader + torchvision, num_workers=1 (worker on core 0, main on core 1)", ONE,
                  "img/s", dataloader(1, TWO, worker_core=0), decode_cores=1),
        Contender("DALI CPU, decoders.image + random_resized_crop, 1 thread", ONE, "img/s", dali(1, ONE, False)),
        Contender("DALI CPU, fused decoders.image_random_crop, 1 thread", ONE, "img/s", dali(1, ONE, True)),
        Contender("libjpeg-turbo in C, full decode (no crop, no resize)", ONE, "img/s",
                  lambda: json_of(pinned(ONE, tj, "full", str(files)), "images_per_s")),
        Contender("libjpeg-turbo in C, crop window only (no resize)", ONE, "img/s",
                  lambda: json_of(pinned(ONE, tj, "crop", str(windows)), "images_per_s")),
        Contender("Stoker, crop-window decoder, 2 processes (+ consumer)", TWO, "img/s",
                  lambda: stoker_images(manifest, TWO, {0, 1}, 2, "auto")),
        Contender("PyTorch DataLoader + torchvision, num_workers=2", TWO, "img/s", dataloader(2, TWO)),
        Contender("DALI CPU, decoders.image + random_resized_crop, 2 threads", TWO, "img/s", dali(2, TWO, False)),
        Contender("DALI CPU, fused decoders.image_random_crop, 2 threads", TWO, "img/s", dali(2, TWO, True)),
        Contender("Stoker BERT examples: pairs + masking + packing, length 512", ONE, "seq/s",
                  lambda: json_of(pinned(ONE, here, "-m", "benchmarks.text_loop", "--manifest", wiki, "--seq-len",
                                         "512", "--pack"), "sequences_per_s")),
        Contender("transformers DataCollatorForLanguageModeling (pad + mask), length 512", ONE, "seq/s",
                  lambda: json_of(pinned(ONE, peer, str(peers / "collator_loop.py"), "--sequences", str(sequences),
                                         "--vocab", vocab), "sequences_per_s")),
    ]


def _ratios(medians: dict[str, float]) -> dict[str, float]:
    def best(*names: str) -> float:
        return max(medians[n] for n in names)

    crop1 = medians["Stoker, crop-window decoder, 1 process (consumer on core 1)"]
    crop2 = medians["Stoker, crop-window decoder, 2 processes (+ consumer)"]
    return {
        "stoker / DataLoader, 1 core": crop1 / best("PyTorch DataLoader + torchvision, num_workers=0",
                                                   "PyTorch DataLoader + torchvision, num_workers=1 (worker on core 0, "
                                                   "main on core 1)"),
        "stoker / DALI CPU (best variant), 1 core": crop1 / best(
            "DALI CPU, decoders.image + random_resized_crop, 1 thread",
            "DALI CPU, fused decoders.image_random_crop, 1 thread"),
        "stoker / DataLoader, 2 cores": crop2 / medians["PyTorch DataLoader + torchvision, num_workers=2"],
        "stoker / DALI CPU (best variant), 2 cores": crop2 / best(
            "DALI CPU, decoders.image + random_resized_crop, 2 threads",
            "DALI CPU, fused decoders.image_random_crop, 2 threads"),
        "stoker / libjpeg-turbo full decode, 1 core": crop1 / medians[
            "libjpeg-turbo in C, full decode (no crop, no resize)"],
        "restart-indexed shards / plain shards, crop-window decoder, 1 core": crop1 / medians[PLAIN_SHARDS],
        "crop-window decoder / pillow-simd decoder, 1 core": crop1 / medians[
            "Stoker, pillow-simd decoder, 1 process (consumer on core 1)"],
        "stoker BERT / transformers collator, 1 core": medians[
            "Stoker BERT examples: pairs + masking + packing, length 512"] / medians[
            "transformers DataCollatorForLanguageModeling (pad + mask), length 512"],
    }


def main(repeats: int = 3) -> dict:
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("the suite needs two cores")
    if not augment.CROP_DECODER_AVAILABLE:
        raise SystemExit("the crop-window decoder is not built (libjpeg-turbo headers missing at install time)")
    manifest_uri = str(default_imagenet())
    manifest = Manifest.load(manifest_uri)
    wiki_uri = str(default_wikipedia())
    wiki = Manifest.load(wiki_uri)
    peer, tj = peer_python(), build_tj_loop()
    files = image_files(manifest)
    listing, windows = write_inputs(files)
    sequences = write_sequences(wiki, 512)
    for path in files:  # warm the page cache
        Path(path).read_bytes()
    for path in Path(manifest_uri).parent.glob("*.arrow"):
        path.read_bytes()
    plain = plain_shards(manifest)
    for path in Path(plain).parent.glob("*.arrow"):
        path.read_bytes()
    field = contenders(peer, tj, manifest_uri, plain, listing, windows, wiki_uri, sequences,
                       wiki.relative_uri(wiki.vocab))
    runs: dict[str, list[float]] = {c.name: [] for c in field}
    for round_ in range(repeats):
        for c in field:
            runs[c.name].append(c.run())
            print(f"round {round_ + 1}: {c.name}: {runs[c.name][-1]:,.0f} {c.unit}", flush=True)
    os.sched_setaffinity(0, {0, 1})
    medians = {name: statistics.median(values) for name, values in runs.items()}
    result = {
        **header("suite", "pillow-simd", "crc32c", "tokenizers"),
        "images": len(files), "repeats": repeats, "runs": runs, "medians": medians, "ratios": _ratios(medians),
        "peer_versions": subprocess.run([peer, "-c", "import torch, torchvision, nvidia.dali, transformers, PIL;"
                                         "print(torch.__version__, torchvision.__version__, nvidia.dali.__version__,"
                                         " transformers.__version__, PIL.__version__)"],
                                        capture_output=True, text=True).stdout.strip(),
    }
    table = markdown(result, field)
    write_results("suite", result, table)
    rewrite_page(table)
    print(table)
    return result


def markdown(result: dict, field: list[Contender]) -> str:
    lines = [f"Measured {result['when']} on {result['machine']} with `make bench` (`python -m benchmarks suite`); "
             f"{result['images']} images; medians of {result['repeats']} interleaved runs; peers: torch, "
             f"torchvision, DALI, transformers, Pillow = {result['peer_versions']}.", "",
             "| contender | decode cores | rate |", "|---|---|---|"]
    for c in field:
        lines.append(f"| {c.name} | {c.shown_cores} | {result['medians'][c.name]:,.0f} {c.unit} |")
    lines += ["", "| ratio | value |", "|---|---|"]
    lines += [f"| {name} | {value:.2f}x |" for name, value in result["ratios"].items()]
    return "\n".join(lines) + "\n"


def rewrite_page(table: str) -> None:
    text = PAGE.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        PAGE.write_text(f"{head}{BEGIN}\n{table}{END}{tail}")
