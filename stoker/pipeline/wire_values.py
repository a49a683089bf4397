"""A config's values against the wire field each travels in: the right kind, and within its range.

A job travels field by field (pipeline.job_wire). A value its wire field cannot hold (a seed of
2**64, epochs of 2**40, a batch size of True, a NaN heartbeat) would be accepted where the job is
made and fail later, deep in a dispatcher's start or a daemon's loop, far from the line that made
it. Checked here, by the message's own field types, it is refused where it is made, naming it.
"""

from __future__ import annotations

import math
from dataclasses import fields, is_dataclass
from enum import Enum
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

_RANGES = {FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
           FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1)}
_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


def wire_problem(config: Any, message: Any) -> str | None:
    """Why a field of `config` (a dataclass) cannot travel in the field of its name of `message` (a
    protobuf Descriptor, pb.JobSpec.DESCRIPTOR); None when every field can. Said as "seed
    18446744073709551616 is out of range (0 to 18446744073709551615)"."""
    for f in fields(config):
        value, wire = getattr(config, f.name), message.fields_by_name.get(f.name)
        if wire is None:
            continue
        if wire.type == FieldDescriptor.TYPE_MESSAGE:
            if not is_dataclass(value):
                named = type(f.default).__name__ if is_dataclass(f.default) else "message"
                return f"{f.name} {value!r} is not a {named}"
            nested = wire_problem(value, wire.message_type)
            if nested:
                return f"{f.name}.{nested}"
            continue
        why = _value_problem(value, wire)
        if why:
            return f"{f.name} {value!r} {why}"
    return None


def _value_problem(value: Any, wire: FieldDescriptor) -> str | None:
    kind = wire.type
    if kind == FieldDescriptor.TYPE_BOOL:
        return None if isinstance(value, bool) else "is not True or False"
    if kind == FieldDescriptor.TYPE_STRING:
        return None if isinstance(value, str) else "is not a string"
    if kind in _RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            return "is not an integer"
        low, high = _RANGES[kind]
        return None if low <= value <= high else f"is out of range ({low} to {high})"
    if kind in _FLOATS:
        if isinstance(value, bool) or not isinstance(value, int | float) or isinstance(value, Enum):
            return "is not a number"
        return None if math.isfinite(value) else "is not a finite number"
    return None
