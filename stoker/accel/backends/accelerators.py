"""The built-in training-step backends (their contracts are in stoker/accel/stepping.py) and the
factory that makes one from an `AccelSpec` once the job is known."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from stoker.accel.batch import ReceivedBatch
from stoker.accel.optional import require
from stoker.accel.stepping import NullAccelerator, PreparedStep, Step, StepFactory
from stoker.pipeline.kinds import ModelFamily, kind_of
from stoker.protos.errors import ConfigError

MAX_LATE_S = 0.05  # overrun a simulated device makes up for at most (not a pause of the whole process)


@dataclass
class SimulatedAccelerator(Step):
    """Takes len(batch) / rate seconds per step, like a device with that throughput: rows per second,
    or, for a named system's text rate (`per_sequence`), sequences per second, as the profiles count
    BERT (a packed row of three sequences is three of them), or, for a tokens job (`row_tokens`), token
    slots per second, as a profile's GPT-2 rate is stated (a row of 64 takes a 16th of a row of 1024)."""

    rate: float  # rows per second; with per_sequence, sequences per second; with row_tokens, token slots
    name: str = "simulated"
    per_sequence: bool = False
    row_tokens: int = 0  # a tokens job's row length (--lm-seq-len): the rate counts rows x this
    _late: float = field(default=0.0, init=False, repr=False)  # how far past its deadlines sleeping has run

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ConfigError(f"simulated accelerator rate must be positive, not {self.rate}")

    def amount(self, batch: ReceivedBatch) -> int:
        """What the rate counts in this batch."""
        if self.row_tokens:
            return batch.size * self.row_tokens
        return batch.sequences if self.per_sequence and batch.header.HasField("text") else batch.size

    def step(self, batch: ReceivedBatch) -> None:
        self.compute(self.amount(batch))

    def compute(self, rows: int) -> None:
        """Busy the 'device' for as long as `rows` take at `rate`: a sleep that overran its deadline (a
        tenth of a millisecond, more on a busy host) is taken off the next, so short steps keep the rate."""
        deadline = time.perf_counter() + rows / self.rate - self._late
        while (left := deadline - time.perf_counter()) > 0:
            time.sleep(left)
        self._late = min(time.perf_counter() - deadline, MAX_LATE_S)


@dataclass
class ConvertingSimulatedAccelerator(SimulatedAccelerator, PreparedStep[int]):
    """A simulated device fed the way a real one is: each batch is first converted on the host
    (uint8 NHWC images to normalised float32 NCHW, token ids to int64), which the consumer's
    prefetch thread overlaps with the previous step unless --no-overlap."""

    name: str = "simulated+convert"

    def prepare(self, batch: ReceivedBatch) -> int:
        if batch.has_images:
            images = batch.images.astype(np.float32)
            images -= np.array([123.675, 116.28, 103.53], dtype=np.float32)
            images *= np.array([1 / 58.395, 1 / 57.12, 1 / 57.375], dtype=np.float32)
            np.ascontiguousarray(images.transpose(0, 3, 1, 2))
        else:
            for name in batch.tensors.parts:
                batch.tensor(name).astype(np.int64)
        return self.amount(batch)

    def step_prepared(self, rows: int) -> None:
        self.compute(rows)

    def step(self, batch: ReceivedBatch) -> None:
        self.step_prepared(self.prepare(batch))


# resnet*: imagenet; bert-*: wikipedia; gpt-*: tokens
MODELS = ("resnet18", "resnet50", "bert-tiny", "bert-base", "bert-large", "gpt-tiny")


@dataclass(frozen=True)
class AccelSpec:
    """Which backend the consumer steps with, and its settings (one place for CLI and API)."""

    # the first six are options whose command-line default depends on the command (stoker.cli._accel_spec)
    kind: str = field(default="null", metadata={
        "help": "train: null; run: simulated, --profile a100 at --scale 0.1; null: the data path's ceiling",
        "flag": "--accel", "dest": "accel", "choices": ("null", "simulated", "torch"),
        "metavar": "{null,simulated,torch}", "always": True})
    rate: float | None = field(default=None, metadata={  # simulated: samples (rows) per second
        "help": "rows (images) per second of --accel simulated", "check": "seconds"})
    profile: str | None = field(default=None, metadata={  # simulated: a named system from backends.profiles
        "help": "--accel simulated at a named system's rate: a100, h100, h200, b200, ipu-pod16, ipu-pod64 (sources: "
                "stoker/accel/backends/profiles.py, docs/ratio.md)"})
    scale: float = field(default=1.0, metadata={  # simulated profiles: shrink the rate for a small machine
        "help": "shrink a --profile rate (default 1; run: 0.1 for images, 1 for text)", "check": "scale",
        "always": True})
    convert: bool = field(default=False, metadata={
        "help": "--accel simulated: also convert each batch on the host as a real device feed would"})
    model: str = field(default="resnet18", metadata={
        "help": "--accel torch model (bert-*: with --dataset wikipedia; gpt-tiny: a tokens job's, picked for one; "
                "default %(default)s)", "choices": MODELS,
        "metavar": "{" + ",".join(MODELS) + "}"})
    device: str = field(default="cpu", metadata={"help": "--accel torch device: cpu, cuda, cuda:1 ..."})
    width: int = field(default=64, metadata={
        "help": "--accel torch: channels of the first stage (%(default)s: standard)", "check": "positive"})
    lr: float = field(default=0.1, metadata={  # the CLI picks 1e-4 (BERT) or 1e-3 (GPT) when --lr is not given
        "help": "learning rate (default 0.1 for ResNet SGD, 1e-4 for BERT AdamW, 1e-3 for GPT AdamW)",
        "check": "seconds", "always": True})
    label_smoothing: float = field(default=0.0, metadata={
        "help": "--accel torch: label smoothing of the classification loss (default %(default)s)",
        "check": "fraction"})
    optimizer: str = field(default="", metadata={  # empty: sgd / adamw
        "help": "--accel torch: sgd (default) or lars for ResNet; adamw (default) or lamb for BERT; adamw for GPT",
        "choices": ("sgd", "lars", "adamw", "lamb"), "metavar": "{sgd,lars,adamw,lamb}"})
    precision: str = field(default="fp32", metadata={
        "help": "--accel torch ResNet: bf16 autocasts the forward pass (as A100/H100 are benchmarked)",
        "choices": ("fp32", "bf16"), "metavar": "{fp32,bf16}"})

    def factory(self) -> StepFactory:
        """The backend, made for the job once it is known (a rank learns it from the dispatcher)."""
        return lambda job, manifest: make_accelerator(self, job.dataset, len(manifest.classes), manifest.vocab_size,
                                                      job.lm.seq_len if job.kind.model_family == ModelFamily.GPT
                                                      else job.text.seq_len)


def torch_model(spec: AccelSpec, dataset: str) -> str:
    """The model an --accel torch step of `dataset` runs: a tokens job's gpt-tiny and a BERT job's bert-tiny
    unless --model names one of their family (its default, resnet18, is the images' model)."""
    family = kind_of(dataset).model_family
    if family == ModelFamily.GPT and not spec.model.startswith("gpt"):
        return "gpt-tiny"
    if family == ModelFamily.BERT and not spec.model.startswith("bert"):
        return "bert-tiny"
    return spec.model


def make_accelerator(spec: AccelSpec, dataset: str, classes: int, vocab_size: int = 0,
                     seq_len: int = 128) -> Step:
    if spec.kind == "null":
        return NullAccelerator()
    if spec.kind == "simulated":
        kind = ConvertingSimulatedAccelerator if spec.convert else SimulatedAccelerator
        if spec.profile:
            from stoker.accel.backends.profiles import GPT_PROFILE_SEQ_LEN, profile_rate

            rate = profile_rate(spec.profile, dataset, spec.scale)
            if kind_of(dataset).model_family == ModelFamily.GPT:  # rows of 1024 tokens/s: token slots/s
                return kind(rate * GPT_PROFILE_SEQ_LEN, row_tokens=seq_len)
            return kind(rate, per_sequence=kind_of(dataset).text)
        if spec.rate is None:
            raise ConfigError("--accel simulated needs --rate SAMPLES_PER_S or --profile NAME")
        return kind(spec.rate)
    if spec.kind == "torch":
        require("torch", "--accel torch")
    if spec.kind == "torch" and kind_of(dataset).model_family == ModelFamily.GPT:
        from stoker.accel.backends.gpt_accel import GPTAccelerator

        if spec.model.startswith("bert"):
            raise ConfigError(f"--model {spec.model} needs --dataset wikipedia")
        if spec.optimizer not in ("", "adamw"):
            raise ConfigError(f"--optimizer {spec.optimizer}: a tokens job's GPT steps with adamw")
        return GPTAccelerator(torch_model(spec, dataset), vocab_size, seq_len, device=spec.device, lr=spec.lr)
    if spec.kind == "torch" and kind_of(dataset).model_family == ModelFamily.BERT:
        require("transformers", "--accel torch with --dataset wikipedia")
        from stoker.accel.backends.bert_accel import BertAccelerator

        return BertAccelerator(torch_model(spec, dataset), vocab_size, seq_len, device=spec.device, lr=spec.lr,
                               optimizer_name=spec.optimizer or "adamw")
    if spec.kind == "torch":
        if not spec.model.startswith("resnet"):
            needs = "--dataset wikipedia" if spec.model.startswith("bert") else "a tokens job (`stoker prepare tokens`)"
            raise ConfigError(f"--model {spec.model} needs {needs}")
        from stoker.accel.backends.torch_accel import TorchAccelerator, TorchConfig

        return TorchAccelerator(TorchConfig(model=spec.model, device=spec.device, width=spec.width, lr=spec.lr,
                                            label_smoothing=spec.label_smoothing,
                                            optimizer=spec.optimizer or "sgd", precision=spec.precision), classes)
    raise ConfigError(f"unknown accelerator {spec.kind!r} (choose null, simulated or torch)")
