"""The data position of a job as a small JSON `state_dict`, checkpointed with the model.

Every rank's stream is in plan order and every rank takes the same number of steps, so the
position of the whole job after a step is (epoch, step), the same on every rank. To resume
without redoing the epoch, it also says, per rank, how many of the epoch's units its stream
had wholly consumed and how many steps came after them: a resumed rank re-leases from there,
and the batches of those steps arrive again, byte-identical, and are accounted for without
being stepped. It names the job (a resumed rank keeps the job id its workers know). Its size
grows with the world size, not with samples or units.

The position is the job's, not a rank's: an image job resumed at another world size continues
the epoch from it, the rows no rank had stepped cut into the new world size's streams
(pipeline.remainder.Resumed), and plans later epochs for the new world size. The cuts an epoch has
been through already travel in the state, so a job can change its world size again in the same
epoch. Text jobs resume at their own world size only: how many rows a text unit gives depends
on its documents' examples, so the part of a unit that a rank had not stepped yet cannot be
named without making the unit again.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, replace
from pathlib import Path

from stoker.accel.stepping import Stateful
from stoker.pipeline.job_wire import (
    IMAGE_MUST_MATCH,
    LM_MUST_MATCH,
    MUST_MATCH,
    TEXT_MUST_MATCH,
    TOKEN_UNITS,
    job_identity,
)
from stoker.pipeline.remainder import Cut, Resumed
from stoker.pipeline.store.files import replace_atomically, write_atomically
from stoker.protos.errors import ConfigError, DataError, ResourceError

STATE_VERSION = 3
READABLE_VERSIONS = (2, 3)  # 2: before resuming at another world size (it has no cuts)
UNSURE_SETTLE_S = 2.0  # a state_dict waits this long at most for a text unit's batch count still on its way
JOB_ID = re.compile(r"[\w.-]{1,64}", re.ASCII)


@dataclass(frozen=True)
class Position:
    epoch: int
    step: int  # steps of `epoch` taken, on every rank
    ranks: list[tuple[int, int]]  # per rank: (units of the epoch wholly consumed, steps taken after them)
    data_sha256: str = ""  # the checkpointed job's Manifest.data_sha256 ("": a checkpoint from before it was kept)

    def check(self, plan, planned_batches=None) -> None:
        """The checkpoint's data set is the plan's, and every rank's position lies inside its stream of the
        epoch (the checkpoint fits the plan). `planned_batches` (images: a unit's batches follow from its
        size): also the step, and the batches after each rank's units, lie inside the streams, and agree."""
        if self.data_sha256 and self.data_sha256 != plan.manifest.data_sha256:
            raise CheckpointError(f"{plan.manifest.uri} is not the data set the job was checkpointed with (its "
                                  "shards or its token sources and weights differ: prepared again at the same path?), "
                                  "so the checkpoint's position names other samples; resume with that data set, or "
                                  "start the job afresh")
        if self.epoch >= plan.epochs:
            return
        streams = [plan.rank_units(self.epoch, rank) for rank in range(len(self.ranks))]
        for rank, (units, _) in enumerate(self.ranks):
            if units > len(streams[rank]):
                raise CheckpointError(f"the checkpoint puts rank {rank} past unit {units} of epoch {self.epoch}, "
                                      f"whose stream has {len(streams[rank])}")
        if planned_batches is None or len(self.ranks) != plan.world_size:
            return  # text: a unit's batches are known only once it is made
        steps = self.step - plan.step_offset(self.epoch)
        longest = max(sum(planned_batches(u) for u in stream) for stream in streams)
        if not 0 <= steps <= longest:
            raise CheckpointError(f"the checkpoint's step {self.step} lies outside epoch {self.epoch}, whose streams "
                                  f"have {longest} steps")
        for rank, (units, batches) in enumerate(self.ranks):
            stream = streams[rank]
            room = planned_batches(stream[units]) - 1 if units < len(stream) else 0
            consumed = sum(planned_batches(u) for u in stream[:units]) + batches
            if batches > room or consumed > steps:
                raise CheckpointError(f"the checkpoint's position of rank {rank} ({units} units, then {batches} "
                                      f"batches) does not lie at step {self.step} of its stream")

    def done_units(self, plan) -> frozenset[int]:
        """Units every step of which was taken before this position."""
        done = {u.unit_id for e in range(min(self.epoch, plan.epochs)) for u in plan.units(e)}
        if self.epoch < plan.epochs:
            for rank, (units, _) in enumerate(self.ranks):
                done |= {u.unit_id for u in plan.rank_units(self.epoch, rank)[:units]}
        return frozenset(done)


def state(job, epoch: int, step: int, ranks: list[tuple[int, int]], samples: int, data_sha256: str = "",
          unsure: list[int] | None = None) -> dict:
    """`job`'s position; the cuts its current epoch went through before this world size, when any;
    `data_sha256`: its manifest's `data_sha256`; `unsure`: ranks whose position cannot be cut for another
    world size (accel.control.progress.RankPositions.here_only): it resumes at this world size only."""
    resumed = Resumed.from_json(job.resumed_from)
    cuts = resumed.cuts if resumed is not None and resumed.epoch == epoch else ()
    return {"version": STATE_VERSION, "job": job_identity(job), "epoch": epoch, "step": step,
            "ranks": [list(r) for r in ranks], "samples_stepped": samples,
            "cuts": [[c.world_size, c.step, [list(r) for r in c.ranks]] for c in cuts], "data_sha256": data_sha256,
            "unsure": sorted(unsure or [])}


class CheckpointError(ConfigError):
    """A data position that cannot be resumed from, with the reason."""


@dataclass(frozen=True)
class _Saved:
    job: dict
    epoch: int
    step: int
    ranks: list[tuple[int, int]]
    cuts: tuple[Cut, ...]
    data_sha256: str
    unsure: tuple[int, ...] = ()  # ranks whose position cannot be cut for another world size

    @property
    def world_size(self) -> int:
        return len(self.ranks)


def _read(state: object, epochs: int) -> _Saved:
    """The checkpoint's fields, each checked for what it must be; a clear error otherwise."""
    if not isinstance(state, dict):
        raise CheckpointError(f"a data position is a JSON object (loader.state_dict()), not {type(state).__name__}")
    if state.get("version") not in READABLE_VERSIONS:
        raise CheckpointError(f"checkpoint version {state.get('version')!r} is not one of {READABLE_VERSIONS} (a "
                              f"checkpoint of another Stoker: start the job again)")
    job = state.get("job")
    if not isinstance(job, dict) or not isinstance(job.get("job_id"), str):
        raise CheckpointError("the checkpoint names no job (its 'job' object with a 'job_id')")
    if not JOB_ID.fullmatch(job["job_id"]):
        raise CheckpointError(f"the checkpoint's job id {job['job_id'][:80]!r} is not one (1 to 64 letters, digits, "
                              f"'-', '_' or '.')")
    epoch, step = _count(state, "epoch"), _count(state, "step")
    if epoch > epochs:
        raise CheckpointError(f"the checkpoint's epoch {epoch} is past the job's {epochs} epochs")
    ranks = _positions(state.get("ranks"), "ranks")
    saved_world = job.get("world_size", 1)
    if saved_world != len(ranks):
        raise CheckpointError(f"the checkpoint has {len(ranks)} rank positions for its world size {saved_world}")
    cuts = []
    for item in state.get("cuts") or []:
        if not (isinstance(item, list) and len(item) == 3):
            raise CheckpointError(f"a cut is [world size, step, rank positions], not {item!r}")
        cut_ranks = _positions(item[2], "a cut's ranks")
        cuts.append(Cut(len(cut_ranks), _count({"step": item[1]}, "step"), tuple(cut_ranks)))
    data = state.get("data_sha256", "")
    if not isinstance(data, str):
        raise CheckpointError(f"the checkpoint's data_sha256 is a digest (a string), not {data!r}")
    unsure = state.get("unsure") or []
    if not (isinstance(unsure, list) and all(type(r) is int and 0 <= r < len(ranks) for r in unsure)):
        raise CheckpointError(f"the checkpoint's unsure ranks are rank indexes, not {unsure!r}")
    return _Saved(job, epoch, step, ranks, tuple(cuts), data, tuple(unsure))


def _count(state: dict, name: str) -> int:
    value = state.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointError(f"the checkpoint's {name!r} must be a whole number >= 0, not {value!r}")
    return value


def _positions(value: object, name: str) -> list[tuple[int, int]]:
    if not isinstance(value, list) or not value:
        raise CheckpointError(f"the checkpoint's {name} must be a list of [units, batches] per rank")
    out = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                 and v >= 0 for v in item)):
            raise CheckpointError(f"a rank position is [units, batches] of whole numbers >= 0, not {item!r}")
        out.append((item[0], item[1]))
    return out


def check_matches(job, saved: dict) -> None:
    """A resumed job must be the checkpointed one, or units would not mean the same samples (or the
    same bytes: another crop size, another sequence length)."""
    saved = {"drop_last": False} | saved
    differ = [f"{name}: checkpoint {saved.get(name)!r}, now {getattr(job, name)!r}" for name in MUST_MATCH
              if saved.get(name) != getattr(job, name)]
    ours = job_identity(job)
    if TOKEN_UNITS in ours and saved.get(TOKEN_UNITS) != ours[TOKEN_UNITS]:
        differ.append("units: the checkpoint's tokens job had units of batch x unit-batches documents (an older "
                      "Stoker), this one's hold their batches' worth of tokens, so its positions name other documents")
    for name in (*IMAGE_MUST_MATCH, TEXT_MUST_MATCH, LM_MUST_MATCH):
        if name not in saved or name not in ours:
            continue  # a checkpoint from before the field was saved, or a field of the other kind
        if name in (TEXT_MUST_MATCH, LM_MUST_MATCH) and isinstance(saved[name], dict):
            differ += [f"{name}.{key}: checkpoint {saved[name].get(key)!r}, now {value!r}"
                       for key, value in ours[name].items() if saved[name].get(key) != value]
        elif saved[name] != ours[name]:
            differ.append(f"{name}: checkpoint {saved[name]!r}, now {ours[name]!r}")
    if differ:
        raise CheckpointError("the checkpoint belongs to another job (" + "; ".join(differ) + ")")


def resume(job, state: object):
    """`_resume`, its refusals saying what they refuse (a rank's own words would not name the file)."""
    try:
        return _resume(job, state)
    except CheckpointError as exc:
        raise CheckpointError(f"cannot resume from this checkpoint: {exc}") from None


def _resume(job, state: object):
    """The job to run and where it starts, from a `state_dict()` of it (checked to be the same job). At
    another world size, the job continues the checkpoint's epoch from its position: its
    plan gets the cut (pipeline.remainder.Resumed) and every rank starts that epoch's new stream at the
    checkpoint's step. A job that already carries the cut (a rank that took the job from the
    dispatcher) is taken as it is."""
    saved = _read(state, job.epochs)
    check_matches(job, saved.job)
    world = job.world_size
    resumed = Resumed(saved.epoch, saved.cuts) if saved.cuts else None
    ranks = saved.ranks
    if saved.world_size != world and saved.epoch < job.epochs and saved.step == 0:
        ranks = [(0, 0)] * world  # at an epoch's start: the epoch is planned for the new world size whole
    elif saved.world_size != world and saved.epoch < job.epochs:
        if saved.unsure:
            raise CheckpointError(f"this job was checkpointed at world size {saved.world_size} and resumes at "
                                  f"{world}, but where rank(s) {', '.join(map(str, saved.unsure))} stood was not "
                                  f"known exactly when it was taken (a text unit's batch count had not reached the "
                                  f"dispatcher in {UNSURE_SETTLE_S:g} s, or the rank was inside the pieces of its "
                                  f"epoch's last batch, which a rank short of steps splits): resume with "
                                  f"{saved.world_size} ranks, or from another checkpoint")
        resumed = Resumed(saved.epoch, (*saved.cuts, Cut(saved.world_size, saved.step, tuple(saved.ranks))))
        ranks = [(0, 0)] * world
    elif saved.world_size != world:
        ranks = [(0, 0)] * world  # a finished job: nothing left to cut
    planned = resumed.to_json() if resumed is not None else ""
    if job.resumed_from and job.resumed_from != planned:
        raise CheckpointError("the dispatcher's job continues another cut of this epoch than the checkpoint's")
    job = replace(job, job_id=saved.job["job_id"], resumed_from=planned)
    return job, Position(saved.epoch, saved.step, ranks, saved.data_sha256)


ELSEWHERE = "give another path"  # what a refused write says to do; the CLI names its flag


def save(state: dict, path: str | Path, elsewhere: str = ELSEWHERE) -> None:
    """Write atomically (temp file, fsync, rename): a crash, or a disk that fills up, leaves the previous
    checkpoint; the system's refusal is one ResourceError naming the path and `elsewhere`."""
    write_atomically(path, json.dumps(state), "checkpoint", elsewhere)


def load(path: str | Path) -> dict:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or a device would block the read for ever
            raise ResourceError(f"{path} is not a regular file")
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable checkpoint ({exc})") from exc


def model_path(path: str | Path) -> Path:
    return Path(f"{path}.model.pt")


def save_all(consumer, path: str | Path, answer_timeout_s: float | None = None, elsewhere: str = ELSEWHERE) -> None:
    """The model (when the accelerator has one) first, then the data position, at one step boundary:
    a crash between the two leaves a data position that is not ahead of the model. `answer_timeout_s`:
    the longest to wait for the dispatcher's answer (None: the consumer's default). Each file is
    written whole or not at all, as `save` writes."""
    state = consumer.state_dict() if answer_timeout_s is None else consumer.state_dict(answer_timeout_s)
    accelerator = consumer.accelerator
    if isinstance(accelerator, Stateful):
        import torch

        model = accelerator.state_dict()
        replace_atomically(model_path(path), lambda f: torch.save(model, f), "model checkpoint", elsewhere)
    save(state, path, elsewhere)


def load_model(accelerator, path: str | Path) -> bool:
    """Restore the accelerator's model and optimizer saved beside a data checkpoint, if any."""
    if not isinstance(accelerator, Stateful) or not model_path(path).exists():
        return False
    import torch

    accelerator.load_state_dict(torch.load(model_path(path), weights_only=False))
    return True
