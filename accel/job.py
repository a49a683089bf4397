"""What a job is: the dataset, the plan and the transform that every worker must apply."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from pipeline.augment import DECODERS, REFERENCE_AREA
from pipeline.plan import EpochPlan, Unit
from pipeline.shards import Manifest
from pipeline.text.examples import TextConfig
from pipeline.text.vocab import Vocab
from protos import stoker_pb2 as pb

DATASETS = ("imagenet", "wikipedia")
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
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, not {self.dataset!r}")
        if min(self.epochs, self.batch_size, self.unit_batches, self.image_size, self.world_size) < 1:
            raise ValueError("epochs, batch size, unit batches, image size and world size must be at least 1")
        if self.transform not in ("train", "eval"):
            raise ValueError(f"transform must be train or eval, not {self.transform!r}")
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, not {self.decoder!r}")
        if self.decode_on not in DECODE_PLACEMENTS:
            raise ValueError(f"decode_on must be one of {', '.join(DECODE_PLACEMENTS)}, not {self.decode_on!r}")
        if self.decode_on == "accelerator" and self.dataset != "imagenet":
            raise ValueError("--decode-on accelerator applies to imagenet (JPEG) jobs only")
        if self.drop_last and self.dataset != "imagenet":
            raise ValueError("--drop-last applies to imagenet jobs only: packed text rows are cut by the packing, "
                             "and a short last text batch keeps its place (see the README, len() for text)")
        if not 0 < self.min_area <= self.max_area <= 1:
            raise ValueError(f"crop area range {self.min_area}-{self.max_area} must lie in (0, 1]")

    @property
    def unit_size(self) -> int:
        return self.batch_size * self.unit_batches

    def plan(self, manifest) -> EpochPlan:
        return EpochPlan(manifest, self.unit_size, self.epochs, self.seed, self.world_size, self.batch_size,
                         self.drop_last)

    def planned_batches(self, unit: Unit) -> int | None:
        """Images: a unit gives ceil(size / batch size) batches whatever is skipped (a skipped image
        leaves its batch a row short). Text: it depends on the examples, so None."""
        return -(-unit.size // self.batch_size) if self.dataset == "imagenet" else None

    def spec(self, data_endpoint: str) -> pb.JobSpec:
        t = self.text
        return pb.JobSpec(job_id=self.job_id, manifest_uri=self.manifest_uri, data_endpoint=data_endpoint,
                          batch_size=self.batch_size, image_size=self.image_size, transform=self.transform,
                          seed=self.seed, min_area=self.min_area, max_area=self.max_area,
                          heartbeat_s=self.heartbeat_s, checksum=self.checksum, dataset=self.dataset,
                          decoder=self.decoder, decode_on=self.decode_on, epochs=self.epochs,
                          unit_batches=self.unit_batches, world_size=self.world_size, drop_last=self.drop_last,
                          text=pb.TextSpec(seq_len=t.seq_len, max_predictions=t.max_predictions,
                                           masked_lm_prob=t.masked_lm_prob, short_seq_prob=t.short_seq_prob,
                                           whole_word_mask=t.whole_word_mask, pack=t.pack,
                                           pack_max_sequences=t.pack_max_sequences))



def job_from_spec(spec: pb.JobSpec) -> JobConfig:
    """The job a dispatcher serves, as the consumer that attaches to it needs it."""
    text = TextConfig.from_spec(spec.text)
    return JobConfig(manifest_uri=spec.manifest_uri, dataset=spec.dataset or "imagenet", epochs=spec.epochs,
                     batch_size=spec.batch_size, unit_batches=spec.unit_batches, seed=spec.seed,
                     image_size=spec.image_size, transform=spec.transform, min_area=spec.min_area,
                     max_area=spec.max_area, decoder=spec.decoder or "auto",
                     decode_on=spec.decode_on or "host", text=text, checksum=spec.checksum,
                     heartbeat_s=spec.heartbeat_s, job_id=spec.job_id, world_size=spec.world_size or 1,
                     drop_last=spec.drop_last)


def check_dataset(job: JobConfig, manifest: Manifest) -> None:
    """Fail at start-up, with the fix, when the shards do not fit the job."""
    if job.dataset == "wikipedia":
        if not manifest.vocab:
            raise ValueError(f"{manifest.uri} holds {manifest.kind!r} shards, not text: "
                             f"make text shards with `stoker prepare wikipedia`")
        Vocab.load(manifest.relative_uri(manifest.vocab))  # raises VocabError (a ValueError) if unusable
    elif manifest.kind != "imagenet":
        raise ValueError(f"{manifest.uri} holds {manifest.kind!r} shards; run with --dataset {manifest.kind}")
