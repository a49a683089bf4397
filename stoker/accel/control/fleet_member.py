"""A job's seat in a fleet (`--fleet ENDPOINT`): it registers, says what it needs once a second,
and hears what it holds. The job's dispatcher holds the seat (rank 0's, or `stoker dispatch`): its
ranks say what they measure with their acks (accel.control.serving.server), and the seat sums them.

What the job asks for (`DemandMeter`): before its device has stepped, the planner's estimate
(`--fleet-start-cores`: from the calibrated per-core rate and a simulated device's rate, where both
are known) or, without one, a small start that takes only what no other job wants (accel.fleet.book);
then its measured need, from its ranks' bottleneck monitors:
the CPU cores that keep each device from waiting (rows the device takes per step-second over rows
the workers make per CPU-second, so it holds on a shared host), summed over its ranks, plus HEADROOM.
The first WARMUP_BEATS measurements are not acted on (they hold the workers' start-up); a need
that rises must hold for UP_AFTER beats, one that falls by more than 10% for DOWN_AFTER, so a
noisy window neither grabs processes nor hands one back to ask for it again. The fleet turns cores into
processes (accel.fleet.book).

A fleet that does not answer when the job starts fails the job at once, naming the address; one
that stops answering later leaves the job running with the processes it has (the hosts keep them
until the fleet returns), and the job keeps beating so that a fleet that starts again knows it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from stoker.accel.control.fleet_seat import FleetSeat
from stoker.pipeline.job import JobConfig
from stoker.protos import stoker_pb2 as pb
from stoker.protos.control_client import ControlClient, DispatcherUnreachable
from stoker.protos.curve import JOB, ClientKeys
from stoker.protos.endpoints import why_unreachable
from stoker.protos.errors import ConfigError, PeerError

log = logging.getLogger("stoker.fleet")

HEADROOM = 1.15  # asked beyond the measured need: a fed device's stall stays under the 2% target through noise
WARMUP_BEATS = 5  # measured beats not acted on: the first windows hold the workers' start (imports, first reads)
UP_AFTER = 2  # beats a higher need must hold before it is asked: one noisy window moves nothing
DOWN_AFTER = 5  # beats a lower need must hold before it is asked
LOWER_BY = 0.9  # ... and lower by this much: a need within 10% below the ask keeps it
BEAT_S = 1.0
JOIN_TIMEOUT_S = 10.0  # a fleet that does not answer this long when the job starts fails it
BEAT_ANSWER_S = 2.0
LEAVE_ANSWER_S = 2.0


@dataclass(frozen=True)
class Need:
    """What a job's ranks measure, summed over them (accel.bottleneck's diagnosis, in the control plane's
    words): whether it is measured yet, the cores that keep every device fed, the worst stall."""

    measured: bool = False
    cores_needed: float = 0.0
    stall_fraction: float = 0.0
    cores_in_use: float = 0.0
    stage: str = "unknown"  # what bounds it (the largest rank's bottleneck)


NOT_MEASURED = Need()


def summed(needs: list[Need]) -> Need:
    """A job's need from its ranks': their cores add up; its stall is the worst rank's."""
    measured = [n for n in needs if n.measured]
    if not measured:
        return NOT_MEASURED
    worst = max(measured, key=lambda n: n.stall_fraction)
    return Need(True, sum(n.cores_needed for n in measured), worst.stall_fraction,
                sum(n.cores_in_use for n in measured), worst.stage)


def need_to_proto(need: Need) -> pb.RankNeed:
    return pb.RankNeed(measured=need.measured, cores_needed=need.cores_needed, stall_fraction=need.stall_fraction,
                       cores_in_use=need.cores_in_use, stage=need.stage)


def need_from_proto(need: pb.RankNeed) -> Need:
    """A rank's need as its ack says it; figures that are not finite and at least 0 count as not measured."""
    figures = (need.cores_needed, need.stall_fraction, need.cores_in_use)
    if not need.measured or not all(math.isfinite(f) and f >= 0 for f in figures):
        return NOT_MEASURED
    return Need(True, need.cores_needed, min(need.stall_fraction, 1.0), need.cores_in_use, need.stage[:32])


class DemandMeter:
    """How many CPU cores the job asks for, from what its ranks measure."""

    def __init__(self, start: float | None, start_reason: str) -> None:
        self.want = start
        self.reason = start_reason
        self._measured = 0
        self._higher: list[tuple[float, str]] = []  # consecutive beats above the ask: (need, why)
        self._lower: list[tuple[float, str]] = []  # ... and below it by more than LOWER_BY

    def update(self, d: Need) -> tuple[float | None, str]:
        if not d.measured or d.cores_needed <= 0:
            return self.want, self.reason
        self._measured += 1
        if self._measured <= WARMUP_BEATS:
            return self.want, self.reason
        cores = d.cores_needed
        need = cores * HEADROOM
        reason = (f"measured: {cores:.2f} cores keep the device fed (stall {100 * d.stall_fraction:.1f}%, bound by "
                  f"{d.stage}), +{100 * (HEADROOM - 1):.0f}%")
        if self.want is None:
            self.want, self.reason = need, reason
            return self.want, self.reason
        self._higher = [*self._higher, (need, reason)] if need > self.want else []
        self._lower = [*self._lower, (need, reason)] if need < self.want * LOWER_BY else []
        if len(self._higher) >= UP_AFTER:  # the least of the run: what every beat of it asked at least
            (self.want, self.reason), self._higher = min(self._higher), []
        elif len(self._lower) >= DOWN_AFTER:  # the most of the run, so the ask never falls below a beat of it
            (self.want, self.reason), self._lower = max(self._lower), []
        return self.want, self.reason


def join_fleet(seat: FleetSeat, job: JobConfig, dispatcher: str, need: Callable[[], Need],
               keys: str | None) -> FleetMembership | None:
    """The membership of the job whose dispatcher is at `dispatcher` (None without a fleet); `join()` it."""
    if not seat.fleet:
        return None
    reason = ("--fleet-start-cores (or the planner's estimate)" if seat.start_cores is not None
              else "not measured yet: a small start until its device has stepped")
    client_keys = ClientKeys.load(keys, seat.key_name, JOB) if keys else None
    return FleetMembership(seat, job.job_id, dispatcher, job.transform, DemandMeter(seat.start_cores, reason), need,
                           client_keys)


class FleetMembership:
    def __init__(self, seat: FleetSeat, job_id: str, dispatcher: str, transform: str, meter: DemandMeter,
                 need: Callable[[], Need], keys: ClientKeys | None = None) -> None:
        """The job `job_id` (its dispatcher at `dispatcher`, its workers running `transform`) in `seat`;
        `need()`: what the job's ranks measure now, summed (accel.control.serving.server.ControlServer.job_need)."""
        self.seat, self.job_id, self.dispatcher, self.transform = seat, job_id, dispatcher, transform
        self.fleet = seat.fleet or ""
        self.meter = meter
        self.need = need
        self.ctx = zmq.Context()
        self.client = ControlClient(self.ctx, self.fleet, f"job/{job_id}", curve=keys, fleet=True)
        self.share: pb.FleetShare | None = None  # the fleet's latest answer
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unanswered_since: float | None = None
        self._said_missing = 0

    def join(self, timeout_s: float = JOIN_TIMEOUT_S) -> pb.FleetShare:
        """Register; PeerError naming the fleet's address when it does not answer, ConfigError with
        the fleet's one line when it refuses the job (a key not allow-listed, an invalid weight)."""
        try:
            share = self._beat(give_up_after_s=timeout_s)
        except DispatcherUnreachable:
            self.close()
            raise PeerError(f"no fleet answers at {self.fleet} after {timeout_s:.0f} s "
                            f"({why_unreachable(self.fleet, fleet=True)})") from None
        except ConfigError:
            self.close()
            raise
        log.info("job %s joined the fleet at %s: %s", self.job_id, self.fleet, _share_text(share))
        return share

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="stoker-fleet-seat", daemon=True)
        self._thread.start()

    def leave(self) -> None:
        """Say the job is over (its processes go to other jobs at once), then close."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(BEAT_ANSWER_S + 1.0)
        try:
            self.client.request(pb.FleetRequest(fleet_job=self.seat.registration(
                self.job_id, self.dispatcher, leaving=True)), give_up_after_s=LEAVE_ANSWER_S)
        except DispatcherUnreachable:
            log.warning("job %s: the fleet at %s did not hear that the job is over; it frees its processes when the "
                        "job's beats stop", self.job_id, self.fleet)
        self.close()

    def close(self) -> None:
        self.client.close()
        self.ctx.destroy(linger=0)

    def _loop(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                self._beat(give_up_after_s=BEAT_ANSWER_S)
            except DispatcherUnreachable:
                if self._unanswered_since is None:
                    self._unanswered_since = time.monotonic()
                    log.warning("job %s: the fleet at %s does not answer; the job keeps the processes it has",
                                self.job_id, self.fleet)
            except ConfigError as exc:
                log.error("job %s: the fleet refused a beat: %s", self.job_id, exc)

    def _beat(self, give_up_after_s: float) -> pb.FleetShare:
        d = self.need()
        want, reason = self.meter.update(d)
        beat = self.seat.registration(self.job_id, self.dispatcher, self.transform)
        beat.want_reason, beat.stall_fraction, beat.cores_needed = reason, d.stall_fraction, d.cores_needed
        beat.cores_in_use, beat.stage = d.cores_in_use, d.stage if d.measured else ""
        if want is not None:
            beat.want_cores = want
        reply = self.client.request(pb.FleetRequest(fleet_job=beat), give_up_after_s=give_up_after_s,
                                    should_stop=lambda: False)
        if reply.WhichOneof("kind") == "error":
            raise ConfigError(f"the fleet at {self.fleet} refused job {self.job_id}: {reply.error.message}")
        if reply.WhichOneof("kind") != "fleet_share":
            raise PeerError(f"{self.fleet} answered a fleet beat with {reply.WhichOneof('kind')}: is it a fleet "
                            "(stoker fleet), not a dispatcher?")
        if self._unanswered_since is not None:
            log.info("job %s: the fleet at %s answers again", self.job_id, self.fleet)
            self._unanswered_since = None
        self._tell(reply.fleet_share)
        self.share = reply.fleet_share
        return reply.fleet_share

    def _tell(self, share: pb.FleetShare) -> None:
        """A job asking more than the fleet has runs with what there is, and says so (once per change)."""
        if share.missing and share.missing != self._said_missing:
            log.warning("job %s: the fleet gives it %d worker processes, %d short of what it wants (%s); it runs "
                        "with what there is", self.job_id, share.target, share.missing, share.reason)
        self._said_missing = share.missing


def _share_text(share: pb.FleetShare) -> str:
    return (f"{share.holding} processes now, target {share.target} of the fleet's {share.fleet_procs} on "
            f"{share.hosts} hosts" + (f", {share.missing} short" if share.missing else "") +
            (f" ({share.reason})" if share.reason else ""))
