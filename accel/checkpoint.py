"""The data position of a job as a small JSON `state_dict`, checkpointed with the model.

It names the job (so a resumed consumer keeps the job id its workers know), the work units
every step of which is done, and for units in progress which batches a step has used. A
consumer resumed from it re-leases everything else; batches it has already stepped arrive
again as byte-identical duplicates and are dropped, so after the checkpoint no sample is
repeated and none is skipped. Its size grows with the number of units, not of samples.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.files import write_atomically

STATE_VERSION = 1
_MUST_MATCH = ("manifest_uri", "dataset", "epochs", "seed", "batch_size", "unit_batches")


def job_fields(job) -> dict:
    return {"job_id": job.job_id, **{name: getattr(job, name) for name in _MUST_MATCH}}


def check_matches(job, state: dict) -> None:
    """A resumed job must be the checkpointed one, or units would not mean the same samples."""
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"checkpoint version {state.get('version')} is not {STATE_VERSION}")
    differ = [f"{name}: checkpoint {state['job'][name]!r}, now {getattr(job, name)!r}"
              for name in _MUST_MATCH if state["job"][name] != getattr(job, name)]
    if differ:
        raise ValueError("the checkpoint belongs to another job (" + "; ".join(differ) + ")")


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
    if hasattr(accelerator, "state_dict"):
        import torch

        tmp = model_path(path).with_suffix(".tmp")
        torch.save(accelerator.state_dict(), tmp)
        os.replace(tmp, model_path(path))
    save(state, path)


def load_model(accelerator, path: str | Path) -> bool:
    """Restore the accelerator's model and optimizer saved beside a data checkpoint, if any."""
    if not hasattr(accelerator, "load_state_dict") or not model_path(path).exists():
        return False
    import torch

    accelerator.load_state_dict(torch.load(model_path(path), weights_only=False))
    return True
