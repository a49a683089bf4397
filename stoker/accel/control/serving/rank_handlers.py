"""The control server's answers to consumer ranks: attach, ack, epoch_steps, position, and what a rank
says through them (a unit it got short, what it measures, how long it has waited). One method per
request kind, each taking the request as a handler sees it (accel.control.serving.routing.Asked); the
control server (accel.control.serving.server) routes to them, only once the rank's connection attached
where the handler says so.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

from stoker.accel.control.dispatcher import Dispatcher, RankError
from stoker.accel.control.fleet_member import need_from_proto
from stoker.accel.control.serving.connections import Connections
from stoker.accel.control.serving.need_board import NeedBoard
from stoker.accel.control.serving.routing import MAX_NAME, Asked, one_line
from stoker.accel.control.serving.stall_report import StallReporter
from stoker.protos import stoker_pb2 as pb
from stoker.protos.leases import LeaseSigner

log = logging.getLogger("stoker.dispatcher")


class RankHandlers:
    def __init__(self, dispatcher: Dispatcher, job: pb.JobSpec, leases: LeaseSigner, connections: Connections,
                 needs: NeedBoard, reporter: StallReporter) -> None:
        self.dispatcher = dispatcher
        self.job = job
        self.leases = leases
        self.connections = connections
        self.needs = needs
        self.reporter = reporter
        self.watchdog = reporter.watchdog

    def on_attach(self, asked: Asked) -> pb.ControlReply:
        attach = asked.request.attach
        try:
            self.dispatcher.attach_rank(attach.rank, attach.data_endpoint, attach.consumer_id, attach.world_size)
        except RankError as exc:
            log.error("refused consumer %s as rank %d: %s", attach.consumer_id, attach.rank, exc)
            return pb.ControlReply(error=pb.Error(message=str(exc)))
        if attach.HasField("start"):
            error = self._start_rank(attach)
            if error:
                return pb.ControlReply(error=pb.Error(message=error))
        self.connections.attach(asked.peer, attach.rank, attach.consumer_id)
        self.reporter.attached(attach.rank)
        if attach.data_endpoint:
            log.info("rank %d (consumer %s) receives on %s", attach.rank, attach.consumer_id, attach.data_endpoint)
        return pb.ControlReply(attached=pb.Attached(job=self.job, lease_key=self.leases.key))

    def on_ack(self, asked: Asked) -> pb.ControlReply:
        d, ack, rank = self.dispatcher, asked.request.ack, asked.rank
        assert rank is not None, "HANDLERS: an ack comes from an attached consumer"
        self.watchdog.rank_waiting(rank[0], ack.waiting_s)
        if ack.HasField("need"):
            self.needs.heard(rank[0], need_from_proto(ack.need))
        for unit_id in ack.received:
            d.received(unit_id)
        d.progress.remember_batches(dict(zip(ack.counted_units, ack.counted_batches, strict=False)))
        for unit_id in ack.redo:
            self.redo_short(rank[0], unit_id)
        counts = list(ack.batches)
        for i, unit_id in enumerate(ack.unit_ids):
            d.ack(unit_id, counts[i] if i < len(counts) else None)
        reply = (pb.ControlReply(finished=pb.Finished(job_id=self.job.job_id)) if d.finished
                 else pb.ControlReply(ok=pb.Ok()))
        reply.stats.CopyFrom(pb.JobStats(**asdict(d.stats())))
        return reply

    def on_epoch_steps(self, asked: Asked) -> pb.ControlReply:
        e = asked.request.epoch_steps
        steps = self.dispatcher.progress.epoch_steps(e.epoch, e.rank, e.batches)
        return pb.ControlReply(wait=pb.Wait(retry_after_s=0.05)) if steps is None else \
            pb.ControlReply(steps=pb.Steps(steps=steps))

    def on_position(self, asked: Asked) -> pb.ControlReply:
        where = self.dispatcher.progress.where(asked.request.position.epoch, asked.request.position.step)
        ranks = [pb.RankPosition(units=u, batches=b, unsure=rank in where.unsure, split=rank in where.split)
                 for rank, (u, b) in enumerate(where.ranks)]
        return pb.ControlReply(position=pb.Position(ranks=ranks))

    def redo_short(self, rank: int, unit_id: int) -> bool:
        """The rank got a unit short (its sender went silent in the middle): lease it again; unless its
        holder is, by its daemon's last heartbeat, transforming a sample of it. Then the daemon ends
        that call at --transform-timeout (a report that makes the sample poison, and for a process stuck
        in C code a kill that releases the unit), so the unit is leased again only once the sample
        that held it up is known, never with that sample still in it."""
        lease = self.dispatcher.leases.get(unit_id)
        holder = self.watchdog.holder(lease) if lease is not None else None
        if holder is not None and holder.phase == "transforming" and holder.working_on == unit_id:
            log.warning("rank %d: unit %d's sender went silent while %s; not leasing it again until its daemon "
                        "ends that call (at --transform-timeout)", rank, unit_id, holder.describe())
            return False
        if self.dispatcher.redo(unit_id):
            log.warning("rank %d: unit %d ended short of its samples; leasing it again", rank, unit_id)
            return True
        return False

    def _start_rank(self, attach: pb.Attach) -> str:
        """A rank's consumer says where it starts: what this dispatcher counts done past that goes back to the
        queue (accel.control.dispatcher.Dispatcher.rewind_rank); the refusal's line, or ""."""
        start = attach.start
        try:
            count = self.dispatcher.rewind_rank(attach.rank, attach.consumer_id, start.epoch, start.step, start.units,
                                                start.batches)
        except RankError as exc:
            log.error("refused consumer %s as rank %d: %s", one_line(attach.consumer_id[:MAX_NAME]), attach.rank, exc)
            return str(exc)
        if count:
            log.warning("rank %d starts at step %d of epoch %d (its checkpoint): %d of its units done since then go "
                        "back to the queue (a consumer that stepped them crashed after its last checkpoint)",
                        attach.rank, start.step, start.epoch, count)
        return ""
