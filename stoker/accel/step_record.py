"""A rank's record of what its steps took, and the audit that reads a job's records back.

The promise is every sample (image, or document of a text job) once per epoch. A user who wants to
check it on their own job, rather than trust Stoker's own counters, has each rank call
`StepRecorder.stepped(batch)` after each step it keeps (after the optimizer step, or after a
fault-tolerant trainer commits it). `audit(folder)` then rebuilds the job's plan from the job the
records name and says, for each epoch, how many samples the plan holds and how many were delivered,
delivered more than once, skipped as unusable (with the batch that said so), and never delivered.

A record is one JSON line a step, appended and flushed at once, to `steps-rank-R.jsonl`: a rank that
restarts (in place, or at another world size) appends to its file, and every file of the folder is
read, so a job's whole life is audited, whatever its shapes. The job itself is written once, as
`job.json` (its wire form): an audit needs nothing but the folder and the data set it names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from google.protobuf import json_format

from stoker.protos import stoker_pb2 as pb
from stoker.protos.errors import ConfigError, DataError

JOB_FILE = "job.json"
RECORD_PREFIX = "steps-rank-"
RECORD_SUFFIX = ".jsonl"


class StepRecorder:
    """Appends one line per step kept to FOLDER/steps-rank-R.jsonl (see the module's docstring)."""

    def __init__(self, folder: str | os.PathLike, job, rank: int = 0) -> None:
        """`job`: the loader's JobConfig (`loader.job`); `rank`: this process's rank (`loader.rank`, or
        torch.distributed's). A folder that already holds another job's records is refused: an audit of
        two jobs' steps together would say nothing true about either."""
        from stoker.pipeline.job_wire import job_identity, job_to_proto

        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        spec = json_format.MessageToDict(job_to_proto(job))
        written = self.folder / JOB_FILE
        if written.exists():  # the same job after a restart, at any world size
            held = job_identity(_job_of(json.loads(written.read_text()))) | {"world_size": job.world_size}
            if held != job_identity(job):
                raise ConfigError(f"{self.folder}: holds the step records of another job; record each job in a "
                                  "folder of its own")
        else:
            tmp = written.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(spec, indent=1) + "\n")
            os.replace(tmp, written)  # every rank may write it: the same bytes, whole or not at all
        self._file = open(self.folder / f"{RECORD_PREFIX}{rank}{RECORD_SUFFIX}", "a", encoding="utf-8")

    def stepped(self, batch) -> None:
        """Record `batch` (a Loader's Batch) as stepped: its epoch, step, sample ids and the ids of the
        samples the workers skipped as unusable in it."""
        skipped = [s.sample_id for s in batch.received.header.skipped]
        line = {"epoch": batch.epoch, "step": batch.step, "ids": np.asarray(batch.sample_ids).tolist(),
                "skipped": skipped}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._file.flush()  # a killed rank loses at most the step it was writing

    def close(self) -> None:
        """Close this rank's record file (every line is on disk already)."""
        self._file.close()

    def __enter__(self) -> StepRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class EpochAudit:
    epoch: int
    planned: int  # samples (documents) the plan holds for the epoch
    delivered: int  # distinct planned samples some step took
    duplicated: int  # deliveries beyond the first (a sample stepped 3 times counts 2)
    skipped: int  # planned samples never delivered because a worker found them unusable, and said so
    missing: int  # planned samples neither delivered nor skipped
    unplanned: int  # deliveries of ids the epoch's plan does not hold

    @property
    def exactly_once(self) -> bool:
        """Every planned sample delivered once or skipped as unusable, and nothing else delivered."""
        return not (self.duplicated or self.missing or self.unplanned)

    def line(self) -> str:
        verdict = "exactly once" if self.exactly_once else "NOT exactly once"
        return (f"epoch {self.epoch}: {verdict}: {self.planned} planned, {self.delivered} delivered, "
                f"{self.duplicated} duplicated, {self.skipped} skipped as unusable, {self.missing} missing"
                + (f", {self.unplanned} not in the epoch's plan" if self.unplanned else ""))


@dataclass(frozen=True)
class Audit:
    epochs: tuple[EpochAudit, ...]
    steps: int  # step records read
    torn: int  # lines that were not a whole record (a rank killed while writing one): not counted

    @property
    def exactly_once(self) -> bool:
        return all(e.exactly_once for e in self.epochs)


def audit(folder: str | os.PathLike) -> Audit:
    """Each recorded epoch's counts (see EpochAudit) from the records in `folder`; DataError when there
    is no job or no record to read."""
    folder = Path(folder)
    job = _job_of(_read_job(folder))
    from stoker.pipeline.store.shards import Manifest

    plan = job.plan(Manifest.load(job.manifest_uri))
    space = plan.sample_id_space
    counts: dict[int, np.ndarray] = {}
    skipped: dict[int, set[int]] = {}
    steps = torn = 0
    for record in _records(folder):
        if record is None:
            torn += 1
            continue
        steps += 1
        epoch = int(record["epoch"])
        seen = counts.setdefault(epoch, np.zeros(space + 1, np.int64))  # the last slot: ids outside the space
        ids = np.asarray(record["ids"], dtype=np.int64)
        np.add.at(seen, np.where((ids >= 0) & (ids < space), ids, space), 1)
        skipped.setdefault(epoch, set()).update(int(i) for i in record.get("skipped", ()))
    if not steps:
        raise DataError(f"{folder}: no step records ({RECORD_PREFIX}R{RECORD_SUFFIX}) to audit")
    return Audit(tuple(_epoch(plan, e, counts[e], skipped.get(e, set())) for e in sorted(counts)), steps, torn)


def _epoch(plan, epoch: int, seen: np.ndarray, skipped: set[int]) -> EpochAudit:
    planned = np.zeros(seen.size, dtype=bool)
    for unit in plan.units(epoch):
        planned[unit.sample_ids()] = True
    got = seen > 0
    was_skipped = np.zeros(seen.size, dtype=bool)
    was_skipped[[i for i in skipped if 0 <= i < seen.size - 1]] = True
    return EpochAudit(epoch=epoch, planned=int(planned.sum()), delivered=int((got & planned).sum()),
                      duplicated=int(np.maximum(seen[planned] - 1, 0).sum()),
                      skipped=int((planned & ~got & was_skipped).sum()),
                      missing=int((planned & ~got & ~was_skipped).sum()), unplanned=int(seen[~planned].sum()))


def _read_job(folder: Path) -> dict:
    try:
        return json.loads((folder / JOB_FILE).read_text())
    except FileNotFoundError:
        raise DataError(f"{folder}: no {JOB_FILE}: not a folder a StepRecorder wrote") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{folder / JOB_FILE}: not the job a StepRecorder wrote ({exc})") from None


def _job_of(spec: dict):
    from stoker.pipeline.job_wire import job_from_proto

    try:
        return job_from_proto(json_format.ParseDict(spec, pb.JobSpec()))
    except json_format.ParseError as exc:
        raise DataError(f"not a job a StepRecorder wrote ({exc})") from None


def _records(folder: Path) -> Iterator[dict | None]:
    """Every record of every rank's file; None for a line that is not a whole record."""
    for path in sorted(folder.glob(f"{RECORD_PREFIX}*{RECORD_SUFFIX}")):
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    yield None
                    continue
                yield record if isinstance(record, dict) and "epoch" in record and "ids" in record else None
