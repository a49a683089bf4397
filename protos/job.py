"""The job, in one shape for every role: what the dataset is, how it is cut into units and
batches, and the transform every worker must apply. The dispatcher sends it to workers and to
consumer ranks as a `pb.JobSpec`; `to_proto` and `from_proto` are the only translation, by field
name, and a field the sender left out takes the default written here (the CLI's defaults too)."""

from __future__ import annotations

import uuid
from dataclasses import MISSING, dataclass, field, fields, is_dataclass

from google.protobuf.message import Message

from pipeline.augment import DECODERS, REFERENCE_AREA
from pipeline.kinds import KINDS, DatasetKind, kind_of
from pipeline.plan import EpochPlan, Resumed, Unit
from pipeline.shards import Manifest
from pipeline.text.examples import TextConfig
from pipeline.text.vocab import Vocab
from protos import message_fit
from protos import stoker_pb2 as pb

DATASETS = tuple(KINDS)
DECODE_PLACEMENTS = ("host", "accelerator")


@dataclass(frozen=True)
class JobConfig:
    manifest_uri: str
    dataset: str = "imagenet"  # or "wikipedia" (BERT pretraining text)
    epochs: int = 1
    batch_size: int = 64  # images, or rows of tokens
    unit_batches: int = 4  # a unit holds batch_size * unit_batches images or documents
    seed: int = 0
    image_size: int = 224
    transform: str = "train"  # or "eval"
    min_area: float = REFERENCE_AREA[0]
    max_area: float = REFERENCE_AREA[1]
    decoder: str = "auto"  # crop-window C decoder where built, else pillow-simd
    decode_on: str = "host"  # or "accelerator": workers ship JPEG bytes + crops, the consumer decodes (DALI)
    text: TextConfig = TextConfig()
    checksum: bool = False
    heartbeat_s: float = 1.0
    world_size: int = 1  # data-parallel ranks: one stream of batches each, the same number of steps each
    drop_last: bool = False  # images: leave out the rows past the last whole batch of every rank
    resumed_from: str = ""  # the epoch a job of another world size left part-way (pipeline.plan.Resumed, JSON)
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        kind = kind_of(self.dataset)
        if min(self.epochs, self.batch_size, self.unit_batches, self.image_size, self.world_size) < 1:
            raise ValueError("epochs, batch size, unit batches, image size and world size must be at least 1")
        if self.transform not in ("train", "eval"):
            raise ValueError(f"transform must be train or eval, not {self.transform!r}")
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, not {self.decoder!r}")
        if self.decode_on not in DECODE_PLACEMENTS:
            raise ValueError(f"decode_on must be one of {', '.join(DECODE_PLACEMENTS)}, not {self.decode_on!r}")
        if self.decode_on == "accelerator" and not kind.encoded_images:
            raise ValueError("--decode-on accelerator applies to imagenet (JPEG) jobs only")
        if self.drop_last and not kind.one_row_per_sample:
            raise ValueError("--drop-last applies to imagenet jobs only: packed text rows are cut by the packing, "
                             "and a short last text batch keeps its place (see the README, len() for text)")
        try:
            Resumed.from_json(self.resumed_from)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"resumed_from is not a resumed epoch: {exc}") from None
        if not 0 < self.min_area <= self.max_area <= 1:
            raise ValueError(f"crop area range {self.min_area}-{self.max_area} must lie in (0, 1]")
        self._check_batches_travel()

    def _check_batches_travel(self) -> None:
        """A batch that cannot fit one data message would be lost on the wire unit after unit: refused."""
        if self.kind.encoded_images:  # decoded on the accelerator, the consumer makes tensors of the same size
            message_fit.check_images(self.batch_size, self.image_size)
        if self.decode_on == "host" and self.kind.encoded_images:
            return
        layout = self.kind.layout(self)
        why = message_fit.problem(self.batch_size, layout.tensors, layout.ragged)
        if why is not None:
            raise ValueError(f"--batch-size {self.batch_size} does not fit a data message ({why})")

    @property
    def kind(self) -> DatasetKind:
        return kind_of(self.dataset)

    @property
    def unit_size(self) -> int:
        return self.batch_size * self.unit_batches

    def plan(self, manifest) -> EpochPlan:
        return EpochPlan(manifest, self.unit_size, self.epochs, self.seed, self.world_size, self.batch_size,
                         self.drop_last, Resumed.from_json(self.resumed_from))

    def planned_batches(self, unit: Unit) -> int | None:
        """Images: a unit gives ceil(size / batch size) batches whatever is skipped (a skipped image
        leaves its batch a row short). Text: it depends on the examples, so None."""
        return -(-unit.size // self.batch_size) if self.kind.one_row_per_sample else None

    def to_proto(self, data_endpoint: str = "") -> pb.JobSpec:
        """The job as it travels; `data_endpoint`: the data socket of the rank a worker registers with."""
        spec = pb.JobSpec(data_endpoint=data_endpoint)
        _fill(spec, self)
        return spec

    @classmethod
    def from_proto(cls, spec: pb.JobSpec) -> JobConfig:
        """The job a dispatcher serves, as a worker or a consumer rank receives it."""
        return _read(cls, spec)

    def check_fits(self, manifest: Manifest) -> None:
        """Fail at start-up, with the fix, when the shards do not fit the job."""
        if manifest.kind != self.dataset:
            raise ValueError(f"{manifest.uri} holds {manifest.kind!r} shards, not {self.dataset}: run with --dataset "
                             f"{manifest.kind}, or make {self.dataset} shards with `stoker prepare {self.dataset}`")
        if manifest.vocab:
            Vocab.load(manifest.relative_uri(manifest.vocab))  # raises VocabError (a ValueError) if unusable


JOB_DEFAULTS = {f.name: f.default for f in fields(JobConfig) if f.default is not MISSING}


def _fill(message: Message, config: object) -> None:
    """Copy a config dataclass into the message fields of the same names (nested configs too)."""
    for f in fields(config):
        value = getattr(config, f.name)
        if is_dataclass(value):
            _fill(getattr(message, f.name), value)
        else:
            setattr(message, f.name, value)


def _read(cls: type, message: Message):
    """The config a message describes: every field the sender set, the defaults for the rest."""
    given = {}
    for f in fields(cls):
        if is_dataclass(f.default):
            given[f.name] = _read(type(f.default), getattr(message, f.name))
        elif message.HasField(f.name) if _has_presence(message, f.name) else getattr(message, f.name):
            given[f.name] = getattr(message, f.name)
    return cls(**given)


def _has_presence(message: Message, name: str) -> bool:
    return message.DESCRIPTOR.fields_by_name[name].has_presence


def _check_wire_names() -> None:
    """Every field of the configs has a wire field of its name: nothing is dropped on the way."""
    for config, message in ((JobConfig, pb.JobSpec), (TextConfig, pb.TextSpec)):
        missing = {f.name for f in fields(config)} - set(message.DESCRIPTOR.fields_by_name)
        if missing:
            raise TypeError(f"{message.__name__} lacks {sorted(missing)}: add them to protos/stoker.proto")


_check_wire_names()
