"""One consumer rank: its job, its books and its ordered stream of steps.

The parts have modules of their own: how the rank comes to its job and its dispatcher
(accel.joining), the event-loop thread that owns its sockets and books (accel.receive_loop),
the dispatcher it talks to, in-process or elsewhere (accel.control.link), and the closing
summary (accel.summary). What a training loop pulls is `schedule()`: exactly the epoch's
steps, in plan order (accel.steps); the public loader (stoker.loader) and `Consumer.run` (the
built-in training steps, accel.training_loop) are the two ways to pull them, through a
`Feed` (accel.feed). Finished steps go back to the loop, which returns credit and acks
completed units.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from stoker.accel import checkpoint
from stoker.accel.assembly import identify, join_fleet_of, join_job, load_data, planned_steps, wire
from stoker.accel.batch import ReceivedBatch
from stoker.accel.bottleneck import BottleneckMonitor, Totals
from stoker.accel.consumer_config import ConsumerConfig
from stoker.accel.control.fleet_member import FleetMembership
from stoker.accel.control.remote import NotAConsumer, RankRefused
from stoker.accel.metrics import ConsumerMetrics
from stoker.accel.rank_report import rank_books, rank_totals
from stoker.accel.receive_loop import ANSWER_TIMEOUT_S, END
from stoker.accel.receiver import Receiver
from stoker.accel.stepping import StepFactory
from stoker.accel.steps import EpochDone, Scheduled, StepSchedule
from stoker.accel.summary import Books, Summary
from stoker.accel.training_loop import train
from stoker.pipeline.cpu_clock import machine_id
from stoker.pipeline.job import JobConfig
from stoker.protos.endpoints import serves
from stoker.protos.errors import StateError

__all__ = ["Consumer", "ConsumerConfig", "JobFailed", "NotAConsumer", "RankRefused", "Summary"]
MACHINE = machine_id()  # this consumer's machine: workers that share it are its neighbours
log = logging.getLogger("stoker.consumer")


class JobFailed(StateError):
    """The job cannot go on: a worker refused it (its transform is missing there, another version, or
    returns what it did not declare). The message is the dispatcher's one line: host and reason."""


class Consumer:
    def __init__(self, cfg: ConsumerConfig, job: JobConfig | None, make_step: StepFactory | None = None,
                 metrics: ConsumerMetrics | None = None, resume: dict | None = None, rank: int = 0,
                 world_size: int | None = None, credential: bytes | None = None) -> None:
        """`job`: the job, for the rank whose process runs the dispatcher; None to take it from the
        dispatcher at `cfg.dispatcher`. `make_step`: the training step, made for the job once it is
        known (default: a null one; a loader's user steps on their own). `resume`: a `state_dict()`
        saved earlier (the same job: its id is taken from it). `world_size` defaults to the job's.
        `credential`: the job secret, when the ranks shared it themselves (accel.ranks); otherwise
        rank 0 takes $STOKER_JOB_SECRET or writes one, and the others read it (protos.job_secret)."""
        cfg.check_exposure()
        self.cfg = cfg
        self.rank = rank
        me = identify(cfg, rank, credential)
        self.consumer_id = me.consumer_id
        joined, position = join_job(cfg, job, me, world_size, resume)
        self.job = job = joined.job
        self.metrics = metrics or ConsumerMetrics()
        self.metrics.job.labels(job_id=job.job_id, dataset=job.dataset, rank=str(rank), pid=str(os.getpid())).set(1)
        data = load_data(job, make_step, position)
        self.manifest, self.accelerator, self.plan = data.manifest, data.step, data.plan
        self.planned = planned_steps(job, data.manifest, data.plan)  # None: BERT text, whose steps the ranks exchange
        self.start_position = data.start
        parts = wire(cfg, joined, data, me, self.metrics, self._job_failed)
        self.leases, self.dispatcher, self.ledger = parts.leases, parts.dispatcher, parts.ledger
        self.order, self.systemd, self.loop = parts.order, parts.systemd, parts.loop
        self.metrics_port: int | None = None
        self.position = (data.start.epoch, data.start.step)  # (epoch, steps taken in it): what state_dict() saves
        self._waited_out: dict[int, int] = {}  # rank -> its units counted when a state_dict waited in vain
        self.progress = Totals()  # the training loop's running counters (stall, step, copy, rows, batches)
        self.bottleneck = BottleneckMonitor(self.totals, self.metrics.registry)
        self.fleet: FleetMembership | None = None  # with --fleet, rank 0's seat in it (once started)
        self.dispatcher.need = lambda: self.bottleneck.latest.need()  # the dispatcher sums its ranks' for a fleet

    # ---- what the rank's parts expose ---------------------------------------------------
    @property
    def receiver(self) -> Receiver | None:
        """The data socket's books (None before `start`)."""
        return self.loop.receiver

    @property
    def metrics_url(self) -> str:
        """This rank's /metrics, as a scraper reaches it ("" when it serves none, or before `start`)."""
        return f"http://{self.cfg.metrics_addr}:{self.metrics_port}/metrics" if self.metrics_port else ""

    @property
    def data_endpoint(self) -> str:
        """Where workers send this rank's batches ("" before `start`)."""
        return self.loop.data_endpoint

    @property
    def control_endpoint(self) -> str:
        """Where workers reach the job's dispatcher ("" before `start`)."""
        return self.dispatcher.control_endpoint

    def totals(self) -> Totals:
        """A snapshot for the bottleneck monitor: the loop's counters plus what the workers reported."""
        return rank_totals(self.progress, self.receiver, self.loop.queue.qsize(), self.job, MACHINE,
                           self.dispatcher.hung_s())

    def books(self) -> Books:
        """What the books hold once every step handed back so far is settled (for the summary)."""
        if self.loop.alive:
            self.loop.call(lambda: None)  # the event loop has done the book-keeping of every step handed back
        if self.receiver is None:
            raise StateError("the consumer has not started: it has no books yet")
        # epochs up to the one the rank is in (all of them once it is done): a summary lists these, not
        # every epoch of a job of 2**31 - 1 that Ctrl-C ended in its third
        epochs = max(min(self.job.epochs, self.position[0] + 1), self.ledger.epochs_with_books)
        return rank_books(self.ledger, self.receiver, epochs, self.dispatcher.stats())

    # ---- start-up -----------------------------------------------------------------------
    def start(self) -> None:
        """Bind sockets and the metrics endpoint; raise here if a port is taken. Idempotent."""
        if self.loop.started:
            return
        if serves(self.cfg.metrics_port):
            try:
                self.metrics_port = self.metrics.serve(self.cfg.metrics_port, self.cfg.metrics_addr)
            except OSError:
                if not self.cfg.metrics_port_or_free:
                    raise
                log.warning("%s:%d is in use (another job's /metrics?); this job's take a free port",
                            self.cfg.metrics_addr, self.cfg.metrics_port)
                self.metrics_port = self.metrics.serve(0, self.cfg.metrics_addr)
        self.loop.start()
        self.bottleneck.start()
        try:
            self.fleet = join_fleet_of(self.cfg, self.job, self.dispatcher)
        except BaseException:  # no fleet answered: nothing of this rank keeps running
            self.loop.stop()
            self.bottleneck.stop()
            self.loop.join(timeout_s=5)
            raise
        self.systemd.ready(f"serving {self.data_endpoint}")
        if self.order.done:  # resumed from a checkpoint of a finished job
            self.loop.queue.put(END)

    def _job_failed(self, reason: str) -> None:
        """The dispatcher failed the job (a worker refused it): whoever pulls batches gets JobFailed."""
        log.error("rank %d: the job failed: %s", self.rank, reason)
        self.metrics.job_failed(reason)
        self.abort(JobFailed(reason))

    def abort(self, error: BaseException) -> None:
        """End the stream from another thread: whoever pulls it gets `error` after the current step."""
        self.loop.end(error)

    # ---- the stream of steps -------------------------------------------------------------
    def schedule(self) -> StepSchedule:
        """Exactly the steps of every epoch from the start position, in plan order."""
        start = self.start_position
        units, replay = start.ranks[self.rank]
        loop = self.loop

        def replayed(batch: ReceivedBatch) -> None:  # a batch a resume skips: its books close as stepped
            assert loop.receiver is not None
            loop.call_soon(loop.receiver.step_done, batch, True)

        return StepSchedule(loop.next, END, self.steps_of, replayed, start.epoch, start.step - replay, replay)

    def steps_of(self, epoch: int, batches: int) -> int:
        """The epoch's steps on every rank: the longest rank stream (images and tokens: from the plan alone;
        BERT text: once every rank has reported its stream's batches)."""
        if self.planned is not None:
            return self.planned.of(epoch)
        waited_from = time.monotonic()
        while True:
            steps = self.loop.wait_for(self.dispatcher.epoch_steps(epoch, self.rank, batches, self.loop.stopping),
                                       f"how many steps epoch {epoch} has on every rank")
            if steps is not None:
                return steps
            if self.loop.stopping.is_set() or (self.loop.started and not self.loop.alive):
                raise StateError("stopped while waiting for the other ranks")
            if time.monotonic() - waited_from > 10:
                log.warning("rank %d: waiting for the other ranks to finish epoch %d", self.rank, epoch)
                waited_from = time.monotonic()
            time.sleep(0.05)

    def taken(self, step: Scheduled) -> None:
        """A step's batch went to the training loop: the data position is past it (past the epoch's last
        step: the next epoch's start, so a checkpoint taken there resumes with the next epoch)."""
        self.position = (step.epoch + 1, 0) if step.last else (step.epoch, step.step + 1)

    def step_done(self, step: Scheduled) -> None:
        """A step is over: its batch's books close when it was the batch's last piece."""
        receiver = self.receiver
        assert receiver is not None
        if step.closes is not None:
            self.loop.call_soon(receiver.step_done, step.closes)

    def epoch_done(self, end: EpochDone) -> None:
        self.position = (end.epoch + 1, 0)

    # ---- the built-in training loop -------------------------------------------------------
    def run(self, on_step: Callable[[Consumer], None] | None = None, procs_per_host: int = 0,
            max_seconds: float | None = None, record_steps: str | None = None) -> Summary:
        """Step the accelerator through every batch of the job; returns the closing summary.

        `max_seconds`: stop after that long past the first batch (a time-boxed measurement, as
        `stoker sweep` makes; the job is then not complete and `time_boxed` says so). `record_steps`: a
        folder this rank records each step in (accel.step_record)."""
        return train(self, on_step=on_step, procs_per_host=procs_per_host, max_seconds=max_seconds,
                     record_steps=record_steps)

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self, answer_timeout_s: float = ANSWER_TIMEOUT_S) -> dict:
        """The job's data position after the steps taken so far, for every rank (see accel.checkpoint);
        the dispatcher, which knows where the other ranks stand, must answer within `answer_timeout_s`."""
        epoch, step = self.position
        if epoch >= self.job.epochs:
            return checkpoint.state(self.job, epoch, step, [(0, 0)] * self.job.world_size, self.ledger.samples,
                                    self.manifest.data_sha256)
        settle_by = time.monotonic() + checkpoint.UNSURE_SETTLE_S
        while True:
            found = self.loop.wait_for(self.dispatcher.position(epoch, step, self.loop.stopping),
                                       f"where every rank stands after step {step} of epoch {epoch} (for a state_dict)",
                                       answer_timeout_s)
            if found is None:
                raise StateError("stopped before the dispatcher said where the ranks stand")
            # a rank whose count was waited for in vain already (dead, or stopped) is not waited for at each step:
            # the same unit still uncounted is the same number of units counted before it
            awaited = [r for r in found.unsure if self._waited_out.get(r) != found.ranks[r][0]]
            if not awaited:
                break
            if time.monotonic() >= settle_by:
                self._waited_out.update({r: found.ranks[r][0] for r in awaited})
                break
            time.sleep(0.02)  # a text unit's batch count, sent with its first batch, is on its way
        return checkpoint.state(self.job, epoch, step, found.ranks, self.ledger.samples, self.manifest.data_sha256,
                                found.here_only)

    def stop(self) -> None:
        """Close everything. Rank 0 with the job's dispatcher first waits (a while) for the other
        ranks to finish, and gives live hosts a moment to hear that the job is finished; a rank
        linked to a dispatcher elsewhere waits for its last acks to arrive there."""
        if self.loop.alive:  # done: every step taken (not only received: a script may stop at its max_steps)
            for wait in self.dispatcher.close_waits(self.position[0] >= self.job.epochs):
                deadline = time.monotonic() + wait.seconds
                while self.loop.call(wait.waiting) and time.monotonic() < deadline:
                    time.sleep(wait.poll_s)
        if self.fleet is not None:
            self.fleet.leave()  # its processes go to other jobs now, not after a silence
            self.fleet = None
        self.loop.stop()
        self.bottleneck.stop()
        self.loop.join(timeout_s=5)

    def __enter__(self) -> Consumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
