"""A work unit as it travels: the dispatcher's `pipeline.units.Unit` plus what a worker needs to
send it (its lease token, the data socket of the rank it belongs to). The one translation, kept
with the data model: the wire (stoker/protos/) knows the message, not the unit."""

from __future__ import annotations

from stoker.pipeline.units import Segment, Unit
from stoker.protos import stoker_pb2 as pb


def unit_to_proto(unit: Unit, lease_token: bytes, data_endpoint: str) -> pb.WorkUnit:
    return pb.WorkUnit(unit_id=unit.unit_id, epoch=unit.epoch, lease_token=lease_token, rank=unit.rank,
                       position=unit.position, data_endpoint=data_endpoint, skip_batches=unit.skip,
                       segments=[pb.Segment(shard_index=g.shard_index, start=g.start, stop=g.stop,
                                            first_sample_id=g.first_sample_id) for g in unit.segments])


def unit_from_proto(message: pb.WorkUnit) -> Unit:
    segments = tuple(Segment(g.shard_index, g.start, g.stop, g.first_sample_id) for g in message.segments)
    return Unit(message.unit_id, message.epoch, segments, message.rank, message.position, message.skip_batches)
