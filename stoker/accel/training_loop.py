"""The built-in training loop (`stoker train`, `stoker run`, `Consumer.run`): a loader user like any other.

It pulls steps from a Feed over the rank (accel.feed, what a Loader iterates), with the
accelerator's `prepare` (conversion and host-to-device copy, and with decoding on the
accelerator the DALI decode) as the feed's per-batch hook, so that batch N+1 is prepared on
the prefetch thread while step N runs (`--no-overlap`: between steps). It times what the
device waits for (stall), what it computes (step) and what the preparation took (copy), and
returns the closing summary.

It sees the rank (accel.consumer.Consumer) as a `TrainingRank`: the feed's step source, the
step to run, the counters it keeps, and the rank's books at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any, Protocol, TypeVar

from stoker.accel.bottleneck import Diagnosis, Totals, diagnose
from stoker.accel.feed import Batch, Feed, StepSource
from stoker.accel.metrics import ConsumerMetrics
from stoker.accel.receiver import TextTotals
from stoker.accel.step_record import StepRecorder
from stoker.accel.stepping import Step, StepRunner
from stoker.accel.summary import STEADY, WHOLE_RUN, Books, Summary, rate_window
from stoker.pipeline.images.layout import DecodeOn
from stoker.pipeline.kinds import ModelFamily


class TrainingRank(StepSource, Protocol):
    """What the built-in loop needs of a rank."""

    rank: int
    accelerator: Step
    metrics: ConsumerMetrics
    progress: Totals  # the loop's running counters: the rank's bottleneck monitor reads them

    @property
    def metrics_url(self) -> str:
        """Where its /metrics is served ("" for none): in the summary."""
        ...

    def start(self) -> None:
        """Bind and attach, if not done yet."""
        ...

    def totals(self) -> Totals:
        """The loop's counters with what the workers reported, now."""
        ...

    def books(self) -> Books:
        """The rank's books, once the steps handed back are settled."""
        ...


R = TypeVar("R", bound=TrainingRank)


def train(rank: R, on_step: Callable[[R], None] | None = None, procs_per_host: int = 0,
          max_seconds: float | None = None, record_steps: str | None = None) -> Summary:
    """Step the rank's accelerator through the job (or for `max_seconds` past the first
    batch); returns the closing `Summary`. `record_steps`: the folder each step is recorded in."""
    rank.start()
    loop = _Loop(rank, on_step, max_seconds, StepRecorder(record_steps, rank.job, rank.rank) if record_steps else None)
    try:
        loop.run()
    finally:
        if loop.recorder is not None:
            loop.recorder.close()
    return loop.summary(procs_per_host)


class _Loop:
    """One pass of the built-in loop: the step adapter, the feed over the rank, and the clocks."""

    def __init__(self, rank: R, on_step: Callable[[R], None] | None, max_seconds: float | None,
                 recorder: StepRecorder | None = None) -> None:
        self.consumer: TrainingRank = rank
        self.on_step: Callable[[Any], None] | None = on_step
        self.max_seconds = max_seconds
        stepper = rank.accelerator
        self.decoding: Any = None
        if rank.job.decode_on == DecodeOn.ACCELERATOR:
            self.decoding = stepper = _decoding(rank, stepper)
        self.runner = StepRunner(stepper)
        self.p = rank.progress = Totals()  # stall, step, copy, rows, batches: the bottleneck monitor reads it
        self.started = time.perf_counter()
        self.startup = 0.0
        self.steady_from: Totals | None = None  # the counters after the first batch: the whole-run diagnosis
        self.sequences = self.tokens = 0
        self.time_boxed = False
        self.interrupted = False  # SIGINT: the steps so far are summed up, not thrown away
        self.recorder = recorder  # --record-steps: each step taken, for `stoker audit`

    def run(self) -> None:
        """Step until the job is done or time-boxed; a Ctrl-C (KeyboardInterrupt) ends it early, and the
        summary covers what was stepped."""
        try:
            self._run()
        except KeyboardInterrupt:
            self.interrupted = True

    def _run(self) -> None:
        rank = self.consumer
        job = rank.job
        feed = Feed(rank, format="numpy", overlap=rank.cfg.overlap, prepare=self.runner.prepare)
        # A stop before the last epoch ends the stream short of it: then no pass gives a batch again.
        while rank.position[0] < job.epochs and not self.time_boxed and not feed.ended:
            batches = iter(feed)
            while not self.time_boxed:
                waited_from = time.perf_counter()
                batch = next(batches, None)
                if batch is None:
                    break
                self._take(batch, time.perf_counter() - waited_from)

    def _take(self, batch: Batch, waited: float) -> None:
        """Account the wait for `batch`, step it, and count what it held."""
        consumer, metrics, p = self.consumer, self.consumer.metrics, self.p
        p.copy_s += batch.copy_s
        metrics.device_copy.observe(batch.copy_s)
        if not consumer.cfg.overlap:  # the preparation ran inside next(): it is copy time, not stall
            waited = max(0.0, waited - batch.copy_s)
        if self.steady_from is None:
            self.startup = waited
            self.steady_from = consumer.totals()
        else:
            p.stall_s += waited
            metrics.input_wait.observe(waited)
        received = batch.received
        step_from = time.perf_counter()
        if received.size:
            self.runner.run(received, batch.prepared)
        step_s = time.perf_counter() - step_from
        if self.recorder is not None:
            self.recorder.stepped(batch)
        metrics.step_seconds.observe(step_s)
        mine = set(received.sample_ids.tolist())  # a piece's failures are in the list its whole batch shares
        rows = received.size - sum(s.sample_id in mine for s in received.undecodable)
        metrics.samples.inc(rows)
        metrics.batches.inc()
        p.step_s += step_s
        p.rows += rows
        p.batches += 1
        if received.sequences:
            self.sequences += received.sequences
            self.tokens += received.real_tokens
            metrics.sequences.inc(received.sequences)
            metrics.tokens.inc(received.real_tokens)
        if self.on_step:
            self.on_step(consumer)
        if self.max_seconds is not None and time.perf_counter() - self.started - self.startup >= self.max_seconds:
            self.time_boxed = True

    def summary(self, procs_per_host: int) -> Summary:
        consumer, job, p = self.consumer, self.consumer.job, self.p
        elapsed = time.perf_counter() - self.started
        window, stall, short = rate_window(elapsed, self.startup, p.batches, p.stall_s)
        judged = self._bottleneck(short)  # the counters now, before the books settle the steps handed back
        books = consumer.books()
        stages = books.stages
        work = {name: getattr(stages, name) for name in job.kind.stages}
        if self.decoding is not None:  # part of "copy": the consumer's prepare decodes before it converts
            work["decode_on_accelerator"] = self.decoding.decode_s
        return Summary(
            samples=books.samples, unique_samples=books.unique_samples, duplicates_dropped=books.duplicates,
            epochs=job.epochs, elapsed_s=elapsed, startup_s=self.startup,
            delivered_samples_per_s=books.samples / window, stall_fraction=stall, batches=p.batches,
            hosts=books.hosts, procs_per_host=procs_per_host, skipped_samples=len(books.skipped),
            skipped=[asdict(s) for s in books.skipped], frames_dropped=books.frames_dropped,
            units_released=books.dispatch.releases, units_handed_back=books.dispatch.handed_back,
            stage_seconds={**work, "send": stages.send, "cpu": stages.cpu, "wait_for_credit": stages.wait_for_credit,
                           "read_wait": stages.read_wait, "cpu_wait": stages.cpu_wait,
                           "throttled_wait": stages.throttled_wait, "receive": stages.receive,
                           "copy": p.copy_s, "step": p.step_s, "stall": p.stall_s},
            per_core_rate=stages.per_core.rate, per_core_spread=list(stages.per_core.spread() or ()),
            cpu_wait_fraction=(stages.cpu_wait / (stages.cpu + stages.cpu_wait)
                               if stages.cpu_wait_batches and stages.cpu + stages.cpu_wait > 0 else None),
            per_epoch_unique=books.per_epoch_unique, dataset=job.dataset,
            rank=consumer.rank, world_size=job.world_size, steps=p.batches,
            rows=p.rows, rows_per_s=p.rows / window, bytes_received=books.bytes_received,
            time_boxed=self.time_boxed, interrupted=self.interrupted, decode_on=job.decode_on,
            metrics=consumer.metrics_url, rates_over=WHOLE_RUN if short else STEADY,
            **self._text_fields(books.text, window),
            **judged)

    def _bottleneck(self, short: str | None) -> dict[str, Any]:
        """The bottleneck's fields: judged over the steady run (none judged where `short` says why), with every
        transform call past its limit named, start-up's too: one that hung in the first batch made start-up long."""
        totals = self.consumer.totals()
        hung = (f" (and worker processes spent {totals.hung_s:.0f} s in transform calls past --transform-timeout: "
                f"the logs name each sample)" if totals.hung_s > 0 else "")
        if short is not None:
            return dict(bottleneck_detail=short + hung)
        if self.steady_from is None:
            return {}
        verdict = diagnose(replace(self.steady_from, hung_s=0.0), totals)
        if verdict.stage != "transform":
            verdict.detail += hung
        return _verdict_fields(verdict)

    def _text_fields(self, text: TextTotals, window: float) -> dict[str, Any]:
        if not self.consumer.job.kind.text:
            return {}
        job = self.consumer.job
        lm = job.kind.model_family == ModelFamily.GPT  # a tokens job's rows are --lm-seq-len, not BERT's
        return dict(sequences=self.sequences, seq_len=job.lm.seq_len if lm else job.text.seq_len,
                    lm_mode=job.lm.mode if lm else None,
                    sequences_per_s=self.sequences / window, tokens=self.tokens,
                    tokens_per_s=self.tokens / window, padding_fraction=text.padding_fraction,
                    padding_fraction_before_packing=text.padding_fraction_before_packing,
                    masked_fraction=text.masked_tokens / text.real_tokens if text.real_tokens else 0.0,
                    random_next_fraction=text.random_next / text.sequences if text.sequences else 0.0)


def _verdict_fields(verdict: Diagnosis) -> dict[str, Any]:
    return dict(bottleneck=verdict.stage, bottleneck_detail=verdict.detail, cores_needed=verdict.cores_needed,
                cores_in_use=verdict.cores_in_use)


def _decoding(consumer: TrainingRank, accelerator: Any) -> Any:
    """Wrap the accelerator so each batch's JPEGs are decoded where it runs (DALI)."""
    from stoker.accel.jpeg_decode import DaliJpegDecoder, DecodingAccelerator

    metrics = consumer.metrics

    def count(seconds: float, failed: int, fallbacks: int) -> None:
        metrics.accel_decode.observe(seconds)
        metrics.accel_decode_errors.inc(failed)
        metrics.accel_decode_fallbacks.inc(fallbacks)

    device = str(accelerator.device)
    decoder = DaliJpegDecoder(consumer.job.image_size, consumer.job.batch_size, device, consumer.cfg.decode_threads,
                              consumer.job.corrupt_jpegs)
    return DecodingAccelerator(accelerator, decoder, on_decode=count, key_of=consumer.manifest.key_of)
