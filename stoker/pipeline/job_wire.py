"""The job as it travels: a `JobConfig` <-> `pb.JobSpec`, field by field of the same name; and the job's
identity, as its checkpoints and its dispatcher's journal write it.

This is the one translation, and it lives with the data model so that the wire (stoker/protos/) knows
no job: a field the sender left out takes the default JobConfig writes, and a config field with
no wire field of its name is caught at import, not lost on the way.
"""

from __future__ import annotations

from dataclasses import asdict, fields, is_dataclass
from typing import Any

from google.protobuf.message import Message

from stoker.pipeline.job import JobConfig
from stoker.pipeline.kinds import TOKENS
from stoker.pipeline.text.examples import TextConfig
from stoker.pipeline.text.lm_layout import LMConfig
from stoker.protos import stoker_pb2 as pb
from stoker.protos.errors import ConfigError, PeerError

MUST_MATCH = ("manifest_uri", "dataset", "epochs", "seed", "batch_size", "unit_batches", "drop_last")
# What else decides a sample's bytes, by kind; a checkpoint or journal written before these were
# saved (version 2 or 3) cannot be checked on them and is taken as it is.
IMAGE_MUST_MATCH = ("image_size", "transform", "transform_params", "min_area", "max_area")
TEXT_MUST_MATCH = "text"  # wikipedia
LM_MUST_MATCH = "lm"  # tokens
# how a tokens job's units are sized (JobConfig.unit_size): "tokens". A checkpoint or journal without it was written
# when a unit held batch x unit-batches documents: its positions name other documents, so it is refused
TOKEN_UNITS = "units"


def job_to_proto(job: JobConfig, data_endpoint: str = "") -> pb.JobSpec:
    """The job as it travels; `data_endpoint`: the data socket of the rank a worker registers with."""
    spec = pb.JobSpec(data_endpoint=data_endpoint)
    _fill(spec, job)
    return spec


def job_from_proto(spec: pb.JobSpec) -> JobConfig:
    """The job a dispatcher serves, as a worker or a consumer rank receives it. A job that cannot hold is
    the peer's doing, not this host's configuration: a PeerError, in the job's own words."""
    try:
        return _read(JobConfig, spec)
    except ConfigError as exc:
        raise PeerError(str(exc)) from exc


def _fill(message: Message, config: Any) -> None:
    """Copy a config dataclass into the message fields of the same names (nested configs too)."""
    for f in fields(config):
        value = getattr(config, f.name)
        if is_dataclass(value):
            _fill(getattr(message, f.name), value)
        else:
            setattr(message, f.name, value)


def job_identity(job: JobConfig) -> dict:
    """The job as its checkpoints and its dispatcher's journal name it: what a resumed job and a restarted
    dispatcher must agree on."""
    named = {"job_id": job.job_id, "world_size": job.world_size, **{name: getattr(job, name) for name in MUST_MATCH}}
    if job.kind is TOKENS:
        named[LM_MUST_MATCH] = asdict(job.lm)
        named[TOKEN_UNITS] = "tokens"
    elif job.kind.text:
        named[TEXT_MUST_MATCH] = asdict(job.text)
    else:
        named |= {name: getattr(job, name) for name in IMAGE_MUST_MATCH}
    return named


def _read(cls: Any, message: Message) -> Any:
    """The config a message describes: every field the sender set, the defaults for the rest."""
    given = {}
    for f in fields(cls):  # a config dataclass
        if is_dataclass(f.default):
            given[f.name] = _read(type(f.default), getattr(message, f.name))
        elif message.HasField(f.name) if _has_presence(message, f.name) else getattr(message, f.name):
            given[f.name] = getattr(message, f.name)
    return cls(**given)


def _has_presence(message: Message, name: str) -> bool:
    return message.DESCRIPTOR.fields_by_name[name].has_presence


def _check_wire_names() -> None:
    """Every field of the configs has a wire field of its name: nothing is dropped on the way."""
    for config, message in ((JobConfig, pb.JobSpec), (TextConfig, pb.TextSpec), (LMConfig, pb.LMSpec)):
        missing = {f.name for f in fields(config)} - set(message.DESCRIPTOR.fields_by_name)
        if missing:
            raise TypeError(f"{message.__name__} lacks {sorted(missing)}: add them to stoker/protos/stoker.proto")


_check_wire_names()
