"""The data position of a job as a small JSON `state_dict`, checkpointed with the model.

Every rank's stream is in plan order and every rank takes the same number of steps, so the
position of the whole job after a step is (epoch, step), the same on every rank. To resume
without redoing the epoch, it also says, per rank, how many of the epoch's units its stream
had wholly consumed and how many steps came after them: a resumed rank re-leases from there,
and the batches of those steps arrive again, byte-identical, and are accounted for without
being stepped. It names the job (a resumed rank keeps the job id its workers know); it has a
world size, and resuming with another is refused (the streams would cut the epoch
differently). Its size grows with the world size, not with samples or units.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from accel.stepping import Stateful
from pipeline.files import write_atomically

STATE_VERSION = 2
_MUST_MATCH = ("manifest_uri", "dataset", "epochs", "seed", "batch_size", "unit_batches", "world_size",
               "drop_last")


@dataclass(frozen=True)
class Position:
    epoch: int
    step: int  # steps of `epoch` taken, on every rank
    ranks: list[tuple[int, int]]  # per rank: (units of the epoch wholly consumed, steps taken after them)

    def done_units(self, plan) -> frozenset[int]:
        """Units every step of which was taken before this position."""
        done = {u.unit_id for e in range(min(self.epoch, plan.epochs)) for u in plan.units(e)}
        if self.epoch < plan.epochs:
            for rank, (units, _) in enumerate(self.ranks):
                done |= {u.unit_id for u in plan.rank_units(self.epoch, rank)[:units]}
        return frozenset(done)


def job_fields(job) -> dict:
    return {"job_id": job.job_id, **{name: getattr(job, name) for name in _MUST_MATCH}}


def state(job, epoch: int, step: int, ranks: list[tuple[int, int]], samples: int) -> dict:
    return {"version": STATE_VERSION, "job": job_fields(job), "epoch": epoch, "step": step,
            "ranks": [list(r) for r in ranks], "samples_stepped": samples}


def check_matches(job, state: dict) -> None:
    """A resumed job must be the checkpointed one, or units would not mean the same samples."""
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"checkpoint version {state.get('version')} is not {STATE_VERSION} (a checkpoint of an "
                         f"older Stoker: start the job again)")
    saved = {"world_size": 1, "drop_last": False} | state["job"]
    differ = [f"{name}: checkpoint {saved.get(name)!r}, now {getattr(job, name)!r}" for name in _MUST_MATCH
              if saved.get(name) != getattr(job, name)]
    if differ:
        raise ValueError("the checkpoint belongs to another job (" + "; ".join(differ) + ")")


def resume_position(job, state: dict) -> Position:
    """Where a job resumed from `state` starts (checked to be the same job and world size)."""
    check_matches(job, state)
    ranks = [(int(u), int(b)) for u, b in state["ranks"]]
    if len(ranks) != job.world_size:
        raise ValueError(f"the checkpoint has {len(ranks)} rank positions for world size {job.world_size}")
    return Position(int(state["epoch"]), int(state["step"]), ranks)


def save(state: dict, path: str | Path) -> None:
    """Write atomically (temp file, fsync, rename): a crash leaves the previous checkpoint."""
    write_atomically(path, json.dumps(state))


def load(path: str | Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable checkpoint ({exc})") from exc


def model_path(path: str | Path) -> Path:
    return Path(f"{path}.model.pt")


def save_all(consumer, path: str | Path) -> None:
    """The model (when the accelerator has one) first, then the data position, at one step boundary:
    a crash between the two leaves a data position that is not ahead of the model."""
    state = consumer.state_dict()
    accelerator = consumer.accelerator
    if isinstance(accelerator, Stateful):
        import torch

        tmp = model_path(path).with_suffix(".tmp")
        torch.save(accelerator.state_dict(), tmp)
        os.replace(tmp, model_path(path))
    save(state, path)


def load_model(accelerator, path: str | Path) -> bool:
    """Restore the accelerator's model and optimizer saved beside a data checkpoint, if any."""
    if not isinstance(accelerator, Stateful) or not model_path(path).exists():
        return False
    import torch

    accelerator.load_state_dict(torch.load(model_path(path), weights_only=False))
    return True
