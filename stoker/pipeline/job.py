"""The job, in one shape for every role: what the dataset is, how it is cut into units and
batches, and the transform every worker must apply. The dispatcher sends it to workers and to
consumer ranks as a `pb.JobSpec` (pipeline.job_wire translates, by field name); a field the sender
left out takes the default written here (the CLI's defaults too)."""

from __future__ import annotations

import json
import uuid
from dataclasses import MISSING, dataclass, field, fields, replace

import numpy as np

from stoker.pipeline.deadline import MIN_CALL_LIMIT_S
from stoker.pipeline.images import fit as image_fit
from stoker.pipeline.images.augment import CORRUPT_JPEGS, DECODERS, REFERENCE_AREA
from stoker.pipeline.images.layout import DecodeOn
from stoker.pipeline.kinds import KINDS, TOKENS, DatasetKind, kind_of
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.remainder import Resumed
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.examples import TextConfig
from stoker.pipeline.text.lm_layout import LMConfig
from stoker.pipeline.text.vocab import Vocab
from stoker.pipeline.transforms import Resolved, TransformError, check_name, parse_params, resolve
from stoker.pipeline.units import Unit
from stoker.pipeline.wire_values import wire_problem
from stoker.protos import message_fit
from stoker.protos import stoker_pb2 as pb
from stoker.protos.errors import ConfigError
from stoker.protos.framing import ALLOWED_DTYPES

DATASETS = tuple(KINDS)
# The built-in image transforms take their parameters from the job's image fields; any other
# transform takes `transform_params` and leaves those fields at their defaults.
BUILTIN_TRANSFORMS = ("train", "eval")
MIN_TOKEN_UNITS = 8  # a tokens unit holds at most 1/8 of the documents, unless its batch floor is more (unit_size)


@dataclass(frozen=True)
class JobConfig:
    """The job, whole and frozen: the data, how it is cut into units and batches, the transform
    and its parameters, the seed and world size. Every process that holds it (dispatcher, ranks,
    workers) derives the same plan from it; the wire carries it field by field."""

    manifest_uri: str
    dataset: str = "imagenet"  # or "wikipedia" (BERT pretraining text), "tokens" (causal-LM token streams)
    # a field with a help line is also a command-line option (stoker.configured)
    epochs: int = field(default=1, metadata={"help": "passes over the data (default %(default)s)", "check": "positive"})
    batch_size: int = field(default=64, metadata={  # images, or rows of tokens
        "help": "images, or rows of tokens (default %(default)s)", "check": "positive"})
    unit_batches: int = field(default=4, metadata={  # a unit holds unit_batches batches' worth of samples
        "help": "a work unit holds unit-batches batches' worth: batch-size x unit-batches images or BERT "
                "documents, or the token documents that fill about that many batches of rows (default "
                "%(default)s)", "check": "positive"})
    seed: int = field(default=0, metadata={
        "help": "the seed of the order, the crops and the masks: the same seed, the same batches "
                "(default %(default)s)", "check": "seed"})
    image_size: int = field(default=224, metadata={
        "help": "output side in pixels (default %(default)s)", "check": "positive"})
    transform: str = field(default="train", metadata={  # "eval", a `stoker.transforms` entry point, or module:name
        "help": "per-sample transform: train (MLPerf random-resized crop + flip, default), eval (resize + centre "
                "crop), a `stoker.transforms` entry point, or package.module:name of your own "
                "(docs/transforms.md); every worker host imports it", "metavar": "NAME"})
    transform_params: str = field(default="", metadata={  # a JSON object: the keyword arguments of your transform
        "help": "keyword arguments of a transform of your own, as a JSON object", "metavar": "JSON"})
    transform_version: str = ""  # what provides the transform, and its version: "" is this process's (filled in)
    transform_timeout_s: float = field(default=30.0, metadata={  # a sample whose transform runs longer is skipped
        "help": "a sample whose transform runs longer is stopped, skipped and counted (default %(default)s)",
        "flag": "--transform-timeout", "check": "transform-timeout", "metavar": "SECONDS"})
    min_area: float = REFERENCE_AREA[0]
    max_area: float = REFERENCE_AREA[1]
    decoder: str = field(default="auto", metadata={  # crop-window C decoder where built, else pillow-simd
        "help": "JPEG decoding: crop (libjpeg-turbo, crop window only), pillow (pillow-simd draft), full (every "
                "pixel); auto: crop where built (default)", "choices": DECODERS})
    decode_on: DecodeOn = field(default=DecodeOn.HOST, metadata={  # ACCELERATOR: workers ship JPEG bytes + crops
        "help": "where JPEGs are decoded: host (the workers, default) or accelerator (workers ship the bytes and "
                "crop; the consumer decodes with NVIDIA DALI, nvJPEG on a CUDA --device)",
        "choices": tuple(place.value for place in DecodeOn)})
    corrupt_jpegs: str = field(default="skip", metadata={  # what workers do with a JPEG libjpeg says is corrupt
        "help": "a JPEG libjpeg says is corrupt or truncated (valid header, garbled or missing scan data): skip "
                "(default: skipped and counted with libjpeg's words, as an undecodable one is) or keep (train on the "
                "pixels libjpeg makes of it, as Stoker did before)", "choices": CORRUPT_JPEGS,
        "metavar": "{skip,keep}"})
    text: TextConfig = TextConfig()
    lm: LMConfig = LMConfig()  # tokens: the causal-LM rows
    checksum: bool = field(default=False, metadata={
        "help": "CRC-32C of every batch's frames, checked by the consumer"})
    heartbeat_s: float = 1.0
    world_size: int = 1  # data-parallel ranks: one stream of batches each, the same number of steps each
    drop_last: bool = field(default=False, metadata={  # images: leave out the rows past every rank's last batch
        "help": "imagenet: every rank streams only whole batches; the few rows past them sit the epoch out "
                "(default: no sample is dropped, and a rank's last batches may be short)"})
    resumed_from: str = ""  # the epoch a job of another world size left part-way (pipeline.remainder.Resumed, JSON)
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        untravelled = wire_problem(self, pb.JobSpec.DESCRIPTOR)  # first: the checks below assume the kinds
        if untravelled:
            raise ConfigError(f"JobConfig: {untravelled}")
        kind = kind_of(self.dataset)
        if min(self.epochs, self.batch_size, self.unit_batches, self.image_size, self.world_size) < 1:
            raise ConfigError("epochs, batch size, unit batches, image size and world size must be at least 1")
        self._check_transform()
        if self.decoder not in DECODERS:
            raise ConfigError(f"decoder must be one of {', '.join(DECODERS)}, not {self.decoder!r}")
        try:
            object.__setattr__(self, "decode_on", DecodeOn(self.decode_on))  # the wire and the CLI give a str
        except ValueError:
            raise ConfigError(f"decode_on must be one of {', '.join(DecodeOn)}, not {self.decode_on!r}") from None
        if self.decode_on == DecodeOn.ACCELERATOR and not kind.encoded_images:
            raise ConfigError("--decode-on accelerator applies to imagenet (JPEG) jobs only")
        if self.corrupt_jpegs not in CORRUPT_JPEGS:
            raise ConfigError(f"corrupt_jpegs must be one of {', '.join(CORRUPT_JPEGS)}, not {self.corrupt_jpegs!r}")
        if self.corrupt_jpegs != "skip" and not kind.encoded_images:
            raise ConfigError("--corrupt-jpegs applies to imagenet (JPEG) jobs only")
        if self.drop_last and not kind.one_row_per_sample:
            raise ConfigError("--drop-last applies to imagenet jobs only: packed text rows are cut by the packing, "
                             "and a short last text batch keeps its place (see docs/data-parallel.md, len() for text)")
        try:
            Resumed.from_json(self.resumed_from)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"resumed_from is not a resumed epoch: {exc}") from None
        if not 0 < self.heartbeat_s <= 3600:
            raise ConfigError(f"heartbeat_s {self.heartbeat_s} must lie in (0, 3600]")
        if not MIN_CALL_LIMIT_S <= self.transform_timeout_s <= 86400:
            raise ConfigError(f"transform timeout {self.transform_timeout_s} s must lie in [{MIN_CALL_LIMIT_S:g}, "
                             f"86400] (a shorter time limit would fire again inside its own handler)")
        if not 0 < self.min_area <= self.max_area <= 1:
            raise ConfigError(f"crop area range {self.min_area}-{self.max_area} must lie in (0, 1]")
        if self.builtin_transform or self.kind.text:  # a transform of your own is checked when it is pinned
            self._check_batches_travel()

    def _check_transform(self) -> None:
        """The transform is named well and its parameters are a JSON object; nothing is imported
        (that is `pin`'s)."""
        check_name(self.transform)
        object.__setattr__(self, "transform_params", parse_params(self.transform_params))
        builtin = self.transform in BUILTIN_TRANSFORMS
        if self.kind.text:
            if self.transform != "train" or self.transform_params:
                made = "rows are set by its lm" if self.kind is TOKENS else "examples are set by its text"
                raise ConfigError(f"--transform and --transform-params apply to image jobs: a {self.dataset} job's "
                                 f"{made} options")
            self._check_rows_config()
            return
        if builtin and self.transform_params:
            raise ConfigError(f"the built-in {self.transform} transform takes --image-size (and train: --crop-area, "
                             "or JobConfig's min_area and max_area), not --transform-params")
        if not builtin:
            if (self.image_size, self.min_area, self.max_area) != (224, *REFERENCE_AREA):
                raise ConfigError(f"--image-size and --crop-area (min_area, max_area) set the built-in train and eval "
                                 f"transforms; give {self.transform} its own with --transform-params")
            if self.decode_on == DecodeOn.ACCELERATOR:
                raise ConfigError("--decode-on accelerator ships the crop the built-in train and eval transforms "
                                 f"draw; {self.transform} runs on the worker hosts (--decode-on host)")

    def _check_rows_config(self) -> None:
        """The other text kind's row settings would be ignored without a word: refused."""
        if self.kind is TOKENS and self.text != TextConfig():
            raise ConfigError("text= (TextConfig: --seq-len, --pack, masking) makes a wikipedia job's rows; a tokens "
                             "job's rows are lm=LMConfig(seq_len=..., mode=...)")
        if self.kind is not TOKENS and self.lm != LMConfig():
            raise ConfigError(f"lm= (LMConfig: --lm-seq-len, --lm-mode) makes a tokens job's rows; a {self.dataset} "
                             "job's are text=TextConfig(...)")

    @property
    def pinned(self) -> bool:
        """The job names the version of its transform that every worker must run (text has none)."""
        return bool(self.transform_version) or self.kind.text

    def pin(self) -> JobConfig:
        """This job with its transform pinned to the version this process imports: the one explicit
        step that imports a transform (your code, for one of your own), done where the job is made
        (the CLI, rank 0, a dispatcher, the Loader), so that a worker with another version refuses
        it. A job already pinned (from the wire, a checkpoint) is returned as it is. ConfigError
        when the transform does not import here, does not take its parameters, or makes outputs
        that cannot travel in a batch."""
        if self.pinned:
            return self
        try:
            resolved = self.image_transform()
        except TransformError as exc:
            raise ConfigError(str(exc)) from None
        untravelled = outputs_problem(resolved.outputs)
        if untravelled:
            raise ConfigError(f"transform {self.transform!r}: {untravelled}")
        job = replace(self, transform_version=resolved.version)
        if not job.builtin_transform:
            job._check_batches_travel()
        return job

    @property
    def builtin_transform(self) -> bool:
        """The transform is one of Stoker's own (train, eval), not one named by import path."""
        return self.transform in BUILTIN_TRANSFORMS

    def factory_params(self) -> str:
        """The JSON keyword arguments the transform is built with (the built-ins': the image fields)."""
        if self.transform == "train":
            return parse_params(json.dumps({"size": self.image_size, "min_area": self.min_area,
                                            "max_area": self.max_area}))
        if self.transform == "eval":
            return parse_params(json.dumps({"size": self.image_size}))
        return self.transform_params

    def image_transform(self) -> Resolved:
        """The job's transform as this process imports it (cached per name and parameters)."""
        return resolve(self.transform, self.factory_params())

    def _check_batches_travel(self) -> None:
        """A batch that cannot fit one data message would be lost on the wire unit after unit: refused."""
        if self.kind.encoded_images and self.builtin_transform:  # the consumer may decode to the same size
            image_fit.check_images(self.batch_size, self.image_size)
            if self.decode_on == DecodeOn.HOST:
                return
        layout = self.kind.layout(self)
        why = message_fit.problem(self.batch_size, layout.tensors, layout.ragged)
        if why is not None:
            raise ConfigError(f"--batch-size {self.batch_size} does not fit a data message ({why})")

    @property
    def kind(self) -> DatasetKind:
        """What the dataset's samples are and how its batches are made."""
        return kind_of(self.dataset)

    def unit_size(self, manifest: Manifest) -> int:
        """Samples in a unit, the lease a worker process makes batches of: unit_batches batches' worth. A row of a
        tokens job holds many documents (a few hundred tokens each, beside rows of thousands), so its unit is the
        documents that fill about that many batches at the set's mean document length: a unit of batch-size
        documents would not fill one batch (its batches would be a fraction of --batch-size), and each unit
        costs its worker a fixed overhead. Never so large that an epoch has under MIN_TOKEN_UNITS units (worker
        processes and ranks share it unit by unit; it does not depend on the world size, so a unit is the same
        whatever the ranks), nor fewer documents than batch-size x unit-batches."""
        rows = self.batch_size * self.unit_batches
        total = float(manifest.tokens.get("total", 0)) if self.dataset == TOKENS.name else 0.0
        if total <= 0 or not manifest.num_samples:
            return rows
        by_tokens = round(rows * self.lm.seq_len * manifest.num_samples / total)
        return max(rows, min(by_tokens, manifest.num_samples // MIN_TOKEN_UNITS))

    def plan(self, manifest: Manifest) -> EpochPlan:
        """The epoch plan of this job over the manifest's shards (a resumed job's cuts included)."""
        return EpochPlan(manifest, self.unit_size(manifest), self.epochs, self.seed, self.world_size,
                         self.batch_size, self.drop_last, Resumed.from_json(self.resumed_from),
                         0 if self.kind.one_row_per_sample else self.unit_batches)

    def planned_batches(self, unit: Unit) -> int | None:
        """Images: a unit gives ceil(size / batch size) batches whatever is skipped (a skipped image
        leaves its batch a row short). Text: it depends on the examples, so None."""
        return self.sample_batches(unit) if self.kind.one_row_per_sample else None

    def sample_batches(self, unit: Unit) -> int:
        """The batches of a unit of a one-row-per-sample job (images): ceil(size / batch size)."""
        return -(-unit.size // self.batch_size)

    def check_fits(self, manifest: Manifest) -> None:
        """Fail at start-up, with the fix, when the shards do not fit the job."""
        if manifest.kind != self.dataset:
            raise ConfigError(f"{manifest.uri} holds {manifest.kind!r} shards, not {self.dataset}: run with --dataset "
                             f"{manifest.kind}, or make {self.dataset} shards with `stoker prepare {self.dataset}`")
        if manifest.vocab:
            Vocab.load(manifest.relative_uri(manifest.vocab))  # raises VocabError (a ValueError) if unusable
        if manifest.records == "bytes" and not self.kind.text and (
                self.decode_on == DecodeOn.ACCELERATOR or self.image_transform().transform.takes != "bytes"):
            raise ConfigError(f"{manifest.uri} holds records that are not JPEGs (prepared with --records bytes): "
                             f"they need a transform that takes bytes and decodes them itself, not {self.transform} "
                             "(docs/transforms.md)")


def outputs_problem(outputs: dict) -> str | None:
    """Why a transform's declared outputs cannot travel in a batch (a dtype the wire does not carry),
    or None: refused where the job is made, not found by every worker process at its first batch."""
    for name, spec in outputs.items():
        if spec.dtype not in ALLOWED_DTYPES:
            kinds = ", ".join(str(np.dtype(d)) for d in sorted(ALLOWED_DTYPES))
            return f"output {name!r} is {np.dtype(spec.dtype)} ({spec.dtype}), which no batch carries: use one of " \
                   f"{kinds}"
    return None


JOB_DEFAULTS = {f.name: f.default for f in fields(JobConfig) if f.default is not MISSING}
