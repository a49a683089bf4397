"""The job's `--corrupt-jpegs` around a worker's sample work (pipeline.images.batching), which knows no job.

A JPEG whose header is valid and whose scan is garbled or cut short decodes without an error:
libjpeg only warns, and fills what it could not decode with grey or smears. The decoders
(pipeline.images.augment) refuse such a file by default, with libjpeg's words, so the worker skips it and
counts it as it does an undecodable one. `keep` trains on what libjpeg makes of it (Stoker's
behaviour before, and Pillow's): the decoders are told so around each sample. With decoding on the
accelerator nothing on the worker decodes, so under `skip` the worker refuses a corrupt file itself
before it ships the bytes. In both places a file with a restart index is not checked again:
`stoker prepare` writes one only for a file libjpeg decoded whole without a warning.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

from stoker.pipeline.cpu_clock import stage_clock
from stoker.pipeline.images.augment import CROP_DECODER_AVAILABLE, corrupt_jpegs, refuse_corrupt
from stoker.pipeline.images.batching import BatchRows, Prepared, SampleWork, sample_work
from stoker.pipeline.images.layout import DecodeOn
from stoker.pipeline.job import JobConfig
from stoker.pipeline.transforms import ImageTransform, Sample
from stoker.protos.errors import DataError

log = logging.getLogger("stoker.worker")


@dataclass(frozen=True)
class CorruptJpegs:
    """`work` under a --corrupt-jpegs `policy`. `refuse`: check each file without a restart index
    here, before the work sees it (its CPU counts as decoding). Everything else the batching code
    asks of a work (`tensors`, `batch_rows`, `limit`) is the wrapped work's."""

    work: SampleWork
    policy: str = "skip"
    refuse: bool = False

    def prepare(self, sample: Sample, rng: random.Random, restarts: memoryview | None = None,
                rows: BatchRows | None = None) -> Prepared:
        checked_s = 0.0
        if self.refuse and restarts is None:
            started = stage_clock()
            refuse_corrupt(sample.data)
            checked_s = stage_clock() - started
        with corrupt_jpegs(self.policy):
            prepared = self.work.prepare(sample, rng, restarts, rows)
        prepared.decode_s += checked_s
        return prepared

    def __getattr__(self, name: str) -> Any:
        """The wrapped work's attribute (read only when this class has none of that name)."""
        return getattr(self.__dict__.get("work"), name)  # no `work` yet (a copy being made): None has none


def job_sample_work(transform: ImageTransform, job: JobConfig) -> SampleWork:
    """The job's sample work (pipeline.images.batching.sample_work) under its --corrupt-jpegs, wrapped only
    where the decoders' default (skip, decoding here) does not already do it: the default costs nothing."""
    work = sample_work(transform, job.decoder, job.decode_on, job.transform, job.transform_timeout_s)
    on_accelerator = job.decode_on == DecodeOn.ACCELERATOR
    if job.corrupt_jpegs == "skip" and not CROP_DECODER_AVAILABLE:
        log.warning("the C extension was not built on this host (no libjpeg-turbo headers at install time): a "
                    "corrupt JPEG is skipped only where pillow-simd fails on it, as on a truncated one")
    if job.corrupt_jpegs == "keep" and not on_accelerator:
        return CorruptJpegs(work, "keep")
    if job.corrupt_jpegs == "skip" and on_accelerator:
        return CorruptJpegs(work, "skip", refuse=True)
    return work


def scan_bounds(jpeg: bytes) -> tuple[int, int]:
    """[start, end) of a JPEG's first scan's entropy-coded bytes (after SOS, before EOI): where a disk or
    transfer error garbles a file whose header still reads (the tests and benchmarks make such files)."""
    at = 2
    while jpeg[at] == 0xFF:
        length = int.from_bytes(jpeg[at + 2: at + 4], "big")
        if jpeg[at + 1] == 0xDA:
            return at + 2 + length, jpeg.rindex(b"\xff\xd9")
        at += 2 + length
    raise DataError("no SOS marker: not a baseline or progressive JPEG's header")
