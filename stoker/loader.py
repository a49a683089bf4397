"""The loader a training script pulls from: `for batch in loader:`, one epoch per pass.

Each rank of a data-parallel job makes one Loader (who it is and where it listens: accel.ranks,
from its arguments, torchrun's environment, or an initialised torch.distributed or
jax.distributed). Rank 0 runs the job's dispatcher in its process unless `config.dispatcher`
names one elsewhere, and tells the other ranks where it is, with the job secret, through the
process group's store; they attach to it. Every
rank gets its own stream of batches, in plan order, and the same number of steps per epoch
(accel.steps), so `len(loader)` is this rank's steps per epoch and a DDP step never waits
for a rank that has run out. Each batch is a mapping of tensor name to array:

- `format="torch"` (default): torch tensors on `device`; on CUDA through pinned memory on a
  side stream, ordered by an event, so the copy of batch N+1 overlaps step N;
- `format="numpy"`: NumPy views of the received frames (no copy), for any framework;
- `format="jax"`: `jax.device_put` arrays, where jax is installed.

Images are uint8 NHWC (`image`) and int32 labels (`label`), normalised on the device by the
step that uses them; with decoding on the accelerator the loader decodes (NVIDIA DALI) before
converting. `batch.rows` says how many rows a batch holds (a rank's last batch of an epoch
may be short, never padded); `batch.sample_ids` which samples they are.

`iter(loader)` restarts nothing: each iterator gives one epoch's batches from where the rank's
one stream stands, so a trainer's iteration habit (taking exactly `len(loader)` batches, leaving
a loop mid-epoch, two `iter()` calls before a `next`) never loses or repeats one (accel.feed).
`loader.epoch` is the epoch of the batch in hand; `batch.epoch` says it for each batch.

`state_dict()` is the job's data position after the batches yielded so far, the same on
every rank (accel.checkpoint); `load_state_dict()` before the first pass continues from it.

`commit_steps=True` is for a trainer that may roll a step back (torchft): a step counts once
`loader.commit()` says so, a batch asked past without a commit comes again, and `state_dict()` is
the position after the last commit; a replica group restarted from that state steps the rest of its
stream once, while the other groups go on (docs/trainers.md, examples/train_torchft.py).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from stoker.accel import checkpoint
from stoker.accel.batch import ReceivedBatch
from stoker.accel.consumer import Consumer
from stoker.accel.consumer_config import ConsumerConfig
from stoker.accel.feed import FORMATS, NOT_COMMITTING, NOTHING_TO_COMMIT, Batch, Feed, UncommittedStep
from stoker.accel.metrics import ConsumerMetrics
from stoker.accel.optional import require
from stoker.accel.ranks import (
    HOST_ENV,
    Meeting,
    Place,
    Rendezvous,
    RendezvousTimeout,
    default_config,
    made_too_early,
    meeting_key,
    place,
    rank_zero_dispatcher,
    rendezvous,
)
from stoker.local_workers import (
    ERROR_PREFIX,
    DaemonProcess,
    stop_daemons,
    watch_daemons,
    worker_command,
    worker_environment,
)
from stoker.pipeline.job import JobConfig
from stoker.protos.errors import ConfigError, PeerError, StateError, StokerError

__all__ = ["Batch", "Loader", "LoaderClosed", "UncommittedStep"]
REACH_S = 10.0  # a rank that knows rank 0's dispatcher is up gives up reaching it after this long
log = logging.getLogger("stoker.loader")
FINAL_STATE_S = 5.0  # at close: how long the dispatcher may take to say where the ranks stand (state_dict after)
FINISHED_LEAVE_S = 15.0  # at close, after the job finished: how long local workers get to leave by themselves


class LoaderClosed(StateError):
    """The loader was used in an order it cannot be: after close(), or state loaded after the first pass."""


def _checked_workers(workers: object) -> int:
    from stoker.workers.worker_config import most_procs

    if isinstance(workers, bool) or not isinstance(workers, int) or not 0 <= workers <= most_procs():
        raise ConfigError(f"workers must be a whole number from 0 (start none here) to {most_procs()} (4 per core "
                          f"this process may run on), not {workers!r}")
    return workers


def _check_device(device: str) -> None:
    """A device torch cannot name, or CUDA where there is none, is refused now, not at the first batch after
    the workers started."""
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device={device!r} is not a torch device ({exc})") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r}, but torch sees no CUDA device here: give device=\"cpu\", or run where "
                          f"one is")


def _rank_config(config: ConsumerConfig | None, where: Place, keys: str | None, insecure: bool | None,
                 workers: int) -> ConsumerConfig:
    """The rank's sockets: `config`, else the defaults for where it runs (accel.ranks), on free ports where
    its own `workers` are all that must find it; checked now, so a rank that cannot listen says so at once."""
    if config is not None and (keys is not None or insecure is not None):
        raise ConfigError("give keys and insecure in the ConsumerConfig when you give one")
    cfg = config or replace(default_config(where, keys, insecure), metrics_port_or_free=True)  # a default port
    if workers and config is None:  # one machine's own workers: free ports, which nobody else must know
        cfg = replace(cfg, metrics_port=0, control_bind=(cfg.control_bind.rsplit(":", 1)[0] + ":0"
                                                         if where.world_size == 1 else cfg.control_bind))
    if workers and cfg.keys:
        raise ConfigError(f"workers={workers} starts keyless worker processes beside this rank; with CURVE keys start "
                          f"the job's daemons yourself (stoker worker --keys DIR --key-name NAME), each with a key "
                          f"the job allows")
    try:
        cfg.check_exposure()
    except ValueError as exc:
        if config is not None:
            raise
        raise ConfigError(f"rank {where.rank}: this job's ranks are on several machines ($MASTER_ADDR="
                          f"{where.master_addr} is not this machine's loopback), so this rank listens where the "
                          f"others and the workers reach it; {exc}") from None
    return cfg


class LocalWorkers:
    """`workers` worker processes on this machine for one rank's loader: a `stoker worker --once` daemon
    (stoker.local_workers) registered with the job's dispatcher, under a host id of its own per rank.
    A daemon that fails ends the job with its reason (the rank's next batch raises JobFailed)."""

    def __init__(self, consumer: Consumer, procs: int) -> None:
        endpoint = consumer.control_endpoint or consumer.cfg.dispatcher or ""
        host_id = f"{socket.gethostname()[:40]}-loader{consumer.rank}-{os.getpid()}"
        level = logging.getLevelName(logging.getLogger("stoker").getEffectiveLevel())
        cmd = worker_command(endpoint, host_id, procs, None, level if isinstance(level, str) else "WARNING")
        self.daemon = DaemonProcess(host_id, cmd, worker_environment())
        self._done = threading.Event()
        watch_daemons([self.daemon], consumer.abort, self._done)

    def close(self, finished: bool) -> None:
        """Stop the daemon: once the job has finished it leaves by itself (a little while is given), else now.
        Once: a loader closed and then collected does not stop it twice."""
        if self._done.is_set():
            return
        self._done.set()
        stop_daemons([self.daemon.proc], timeout_s=FINISHED_LEAVE_S if finished else 0.0)
        error = self.daemon.unreported_error()
        if error:
            print(f"{ERROR_PREFIX}{error}", file=sys.stderr)


class Loader:
    """One rank's batches of a Stoker job, as a training script iterates them: the same number on
    every rank each epoch, in the plan's order, on the device and in the format asked for."""

    def __init__(self, job: JobConfig | None = None, *, config: ConsumerConfig | None = None,
                 rank: int | None = None, world_size: int | None = None, local_rank: int | None = None,
                 device: str = "cpu", format: str = "torch", overlap: bool = True,
                 prepare: Callable[[ReceivedBatch], object] | None = None,
                 metrics: ConsumerMetrics | None = None, keys: str | None = None,
                 insecure: bool | None = None, workers: int = 0, commit_steps: bool = False) -> None:
        """`job`: rank 0's (it runs the dispatcher); other ranks may pass it too and get the job from
        the dispatcher. Rank, world size and local rank: the arguments, else torchrun's environment,
        else an initialised torch.distributed or jax.distributed (accel.ranks).
        `config`: sockets, keys, credit. Default: this node's address (loopback on one machine;
        on several, the address that routes to $MASTER_ADDR, or $STOKER_HOST), the data socket on a
        free port, the dispatcher on port 5561, /metrics on 9560 for local rank 0 and 9570 + local
        rank for the others; `keys` (or $STOKER_KEYS) a CURVE key folder, `insecure` (or
        $STOKER_INSECURE=1) to listen beyond loopback without keys. With an initialised process group
        the other ranks learn rank 0's dispatcher and the job secret through its store.
        `prepare`: run on the prefetch thread on each received batch instead of the format
        conversion (the built-in training steps use it); its result is `batch.prepared`.
        `workers`: start that many worker processes on this machine, as a local daemon that serves
        this job and dies with the loader (0, the default: the job's worker daemons are started
        apart, `stoker worker`). Every rank that asks starts its own, as DataLoader's num_workers;
        all of them serve the job's one plan. With workers and no `config`, /metrics and the dispatcher
        (of a single process, or of ranks that meet through the process group's store) take free ports:
        `metrics_port` and `control_endpoint` say which. Without `config`, a default /metrics port another
        job holds gives way to a free one. `commit_steps`: each step counts only when `commit()` is called
        after it; a batch not committed is given again by the next `next()` (the module's docstring)."""
        if format not in FORMATS:
            raise ConfigError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
        if format != "numpy" and prepare is None:  # said now, not at the first batch after workers started
            require(format, f"Loader(format={format!r})")
        if format == "torch" and prepare is None:
            _check_device(device)
        self.workers = _checked_workers(workers)
        where = place(rank, world_size, local_rank)
        self._rank_given = rank is not None or world_size is not None
        self.rank, self.world_size, self.local_rank = where.rank, where.world_size, where.local_rank
        cfg = _rank_config(config, where, keys, insecure, self.workers)
        self._meeting_key = meeting_key() if self.world_size > 1 and not cfg.dispatcher else None
        self._master_addr = where.master_addr
        if self.rank and job is not None and not config:
            job = None  # every rank may be handed the job; only rank 0's (or the dispatcher's) counts
        if job is not None and job.world_size != self.world_size:
            job = replace(job, world_size=self.world_size)
        self.cfg = cfg
        self._config_given = config is not None
        self.job_config = job
        self.device = device
        self.format = format
        self.overlap = overlap
        self.prepare = prepare
        self.metrics = metrics
        self.commit_steps = commit_steps
        self._resume: dict | None = None
        self._local: LocalWorkers | None = None  # the daemon `workers` asked for, once the consumer is up
        self._consumer: Consumer | None = None
        self._feed: Feed | None = None  # made on the first pass
        self._closed = False
        self._final_state: dict | None = None  # state_dict() at close, for after it

    # ---- the consumer behind it ------------------------------------------------------------
    @property
    def consumer(self) -> Consumer:
        """The rank's consumer (made, bound and attached on first use)."""
        if self._consumer is None:
            if self._closed:
                raise LoaderClosed("the loader is closed")
            self._check_place()
            self._consumer = self._make_consumer()
            if self.workers:
                self._local = LocalWorkers(self._consumer, self.workers)
                # a loader dropped without close() (a notebook cell run again) takes its processes with it
                weakref.finalize(self, self._local.close, False)
        return self._consumer

    def _check_place(self) -> None:
        """A loader made before its launcher's process group existed took itself for another rank than the
        group says: refused, before it serves (or joins) a job of the wrong shape."""
        problem = None if self._rank_given else made_too_early(self.rank, self.world_size)
        if problem:
            raise ConfigError(problem)

    def _make_consumer(self) -> Consumer:
        """Rank 0 (with the job's dispatcher) binds, then tells the other ranks where it is and the job
        secret through the launcher's store; the others wait for that and attach. Without a store
        they find rank 0 at $MASTER_ADDR and the secret in $STOKER_JOB_SECRET or rank 0's file."""
        key = self._meeting_key or ""  # "": the ranks do not meet through a store (then there is none)
        store = rendezvous() if key else None
        keyed = bool(self.cfg.keys)
        if self.rank == 0 and not self.cfg.dispatcher:
            secret = None if store is None or keyed else secrets.token_hex(32).encode()
            cfg = self.cfg
            if store is not None and self.workers and not self._config_given:  # its own workers and the ranks
                cfg = replace(cfg, control_bind=cfg.control_bind.rsplit(":", 1)[0] + ":0")  # learn the port
            consumer = Consumer(cfg, self.job_config, metrics=self.metrics, resume=self._resume, rank=0,
                                credential=secret)
            consumer.start()
            if store is not None:
                store.publish(key, Meeting(consumer.control_endpoint, (secret or b"").decode(),
                                                         keyed).encode())
            return consumer
        cfg, credential = self.cfg, None
        if store is not None:
            meeting = self._meet(store, key)
            meeting.check(self.rank, keyed)
            cfg = replace(cfg, dispatcher=meeting.control, attach_timeout_s=min(cfg.attach_timeout_s, REACH_S))
            credential = meeting.secret.encode() or None
        else:
            cfg = rank_zero_dispatcher(cfg, self.rank, self._master_addr)
        try:
            consumer = Consumer(cfg, None, metrics=self.metrics, resume=self._resume, rank=self.rank,
                                world_size=self.world_size, credential=credential)
        except ConnectionError as exc:
            if store is None:
                raise
            raise PeerError(f"rank {self.rank}: rank 0's dispatcher is up at {cfg.dispatcher} (it said so "
                                  f"through the job's store) but this node gets no answer from it in {REACH_S:.0f} "
                                  f"s: that address must be one this node reaches (rank 0's node sets it with "
                                  f"${HOST_ENV}), and the port must be open between the nodes ({exc})") from None
        consumer.start()
        return consumer

    def _meet(self, store: Rendezvous, key: str) -> Meeting:
        """What rank 0 published under `key`; ConnectionError, with what to check, when it never does."""
        try:
            return Meeting.decode(store.fetch(key, self.cfg.attach_timeout_s))
        except RendezvousTimeout:
            raise PeerError(f"rank {self.rank}: rank 0 did not say where its dispatcher is within "
                                  f"{self.cfg.attach_timeout_s:.0f} s (through the job's store, key "
                                  f"{key}): every rank must make the same loaders in the same order, "
                                  f"and rank 0 must start its loader too") from None

    @property
    def metrics_port(self) -> int | None:
        """Where this rank serves /metrics (the port picked when the config asked for 0), or None."""
        return self.consumer.metrics_port

    @property
    def control_endpoint(self) -> str:
        """Where worker daemons reach this job's dispatcher (`stoker worker --dispatcher`)."""
        return self.consumer.control_endpoint

    @property
    def job(self) -> JobConfig:
        """The job this rank runs (from the dispatcher, for a rank that did not give one)."""
        return self.consumer.job

    @property
    def epoch(self) -> int:
        """The epoch of the batch in hand (the last one yielded, until its epoch's end is seen); before a
        batch and after an epoch's end, the epoch the next batch comes from. `batch.epoch` is the one to log."""
        return self._feed.epoch if self._feed is not None else self.consumer.position[0]

    @property
    def epochs(self) -> int:
        """The job's epochs: how many times to iterate the loader."""
        return self.consumer.job.epochs

    def __len__(self) -> int:
        """This rank's steps in the current epoch, the same on every rank. Images and tokens: exact, from
        the plan (tokens: from the documents' token counts). BERT text (rows depend on the examples): an
        estimate until the epoch has ended, the previous epoch's count, or at first the most documents a
        rank has over the batch size; the steps are equal on every rank all the same."""
        consumer = self.consumer
        epoch = min(self.epoch, consumer.job.epochs - 1)
        if consumer.planned is not None:
            return consumer.steps_of(epoch, 0)
        known = self._feed.epoch_steps if self._feed is not None else {}
        if epoch in known:
            return known[epoch]
        if epoch - 1 in known:
            return known[epoch - 1]
        return -(-max(consumer.plan.epoch_rank_sizes(epoch)) // consumer.job.batch_size)  # every rank's

    # ---- iteration ----------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        """One epoch's batches, from where this rank's stream stands: the rest of the epoch in hand, else the
        next epoch's; nothing once every epoch is done. Nothing restarts: an iterator left mid-epoch is
        continued by the next one, and one that took an epoch's last batch without asking again (a trainer
        that takes len(loader) batches) leaves the next one to begin the next epoch (accel.feed)."""
        if self._closed:
            raise LoaderClosed("the loader is closed: iterate it inside its `with` (or before close())")
        consumer = self.consumer
        if self._feed is None:
            self._check_place()  # used (`with`) before the group existed: refused before its first batch
            self._feed = Feed(consumer, self.device, self.format, self.overlap, self.prepare, self.commit_steps)
        return iter(self._feed)

    def commit(self, batch: Batch | None = None) -> None:
        """With commit_steps: the step of the batch in hand is committed (torchft: after `should_commit()`
        said so). From now its samples count as stepped, its unit may be acked, and `state_dict()` is past
        it. Without a commit the next `next()` gives the same batch again. `batch`, when given, must be the
        batch in hand; committing twice, or before a batch, is refused (UncommittedStep)."""
        if not self.commit_steps:
            raise ConfigError(NOT_COMMITTING)
        if self._closed:
            raise LoaderClosed("commit(): the loader is closed; a batch not committed before close() counts as not "
                               "stepped (it comes again from the loader's last state_dict())")
        if self._feed is None:
            raise UncommittedStep(NOTHING_TO_COMMIT)
        self._feed.commit(batch)

    @classmethod
    def over(cls, consumer: Consumer, **options: Any) -> Loader:
        """A loader over a consumer made already (started or not)."""
        loader = cls(config=consumer.cfg, rank=consumer.rank, world_size=consumer.job.world_size, **options)
        loader._consumer = consumer
        return loader

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The job's data position after every batch yielded so far (torch's convention); after close(),
        the position it was closed at, so a script may save its last checkpoint after its `with`."""
        if self._closed:
            if self._final_state is None:
                raise LoaderClosed("the loader was closed before its position could be taken")
            return self._final_state
        return self.consumer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state` (another job's is refused with the reason); before the loader is first used.
        Once used (len(), a property) and before its first batch, the position it already starts from is
        accepted again: a trainer that restores its loaders after asking their length (Lightning) gives
        the state the loader was made with."""
        if self._consumer is None:
            self._resume = state
            return
        if self._closed or not self._starts_from(state):
            start, (epoch, step) = self.consumer.start_position, self.consumer.position
            since = f" and has given batches since (it stands at epoch {epoch} step {step})" \
                if (epoch, step) != (start.epoch, start.step) else ""
            raise LoaderClosed(f"load_state_dict() goes before the loader is first used (entering its `with`, len(), a "
                               f"property, iter()): "
                               f"this one started from epoch {start.epoch} step {start.step}{since}, and `state` "
                               f"names another position; give the state to a new Loader before using it (Accelerate: "
                               f"load_state before the first batch; Lightning: stoker.lightning.StokerDataModule)")

    def _starts_from(self, state: dict) -> bool:
        """`state` names the position this loader started from, and it has not stepped since."""
        consumer = self.consumer
        start = consumer.start_position
        stepped = self._feed is not None and self._feed.in_hand is not None
        if stepped or consumer.position != (start.epoch, start.step):
            return False
        try:
            job, position = checkpoint.resume(consumer.job, state)
        except StokerError:
            return False
        return job.job_id == consumer.job.job_id and (position.epoch, position.step) == (start.epoch, start.step) \
            and [tuple(r) for r in position.ranks] == [tuple(r) for r in start.ranks]

    # ---- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Close sockets and threads (rank 0 first waits a while for the other ranks to finish)."""
        if self._closed:
            return
        if self._feed is not None:
            self._feed.hand_back()
            self._feed.close(LoaderClosed("the loader is closed: iterate it inside its `with` (or before close())"))
            self._final_state = self._last_position()
        local, self._local = self._local, None
        finished = self._consumer is not None and self._consumer.dispatcher.finished
        if local is not None and not finished:  # stopped early: its processes hand their units back while the
            local.close(finished=False)        # dispatcher still listens
        if self._consumer is not None:
            self._consumer.stop()  # a finished job's dispatcher lingers until every host heard it finish
        if local is not None and finished:
            local.close(finished=True)
        self._closed = True

    def _last_position(self) -> dict | None:
        """The position at close (state_dict() after it); None when the dispatcher cannot say in time."""
        try:
            return self.consumer.state_dict(answer_timeout_s=FINAL_STATE_S)
        except StokerError as exc:
            log.info("the loader's last position was not taken at close: %s", exc)
            return None

    def __enter__(self) -> Loader:
        self.consumer  # noqa: B018 - bind and attach now, so that errors come from the `with`
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
