"""The built-in training loop (`stoker train`, `stoker run`, `Consumer.run`): a loader user like any other.

It pulls steps from a Loader over the consumer, with the accelerator's `prepare` (conversion
and host-to-device copy, and with decoding on the accelerator the DALI decode) as the
loader's per-batch hook, so that batch N+1 is prepared on the prefetch thread while step N
runs (`--no-overlap`: between steps). It times what the device waits for (stall), what it
computes (step) and what the preparation took (copy), and returns the closing summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict

from accel.bottleneck import Totals, diagnose
from accel.loader import Loader


def train(consumer, on_step: Callable | None = None, procs_per_host: int = 0,
          max_seconds: float | None = None):
    from accel.consumer import Summary

    if consumer._loop is None:
        consumer.start()
    job = consumer.job
    stepper = consumer.accelerator
    decoding = None
    if job.decode_on == "accelerator":
        decoding = stepper = _decoding(consumer, stepper)
    prepare = getattr(stepper, "prepare", None)
    loader = Loader.over(consumer, prepare=prepare, overlap=consumer.cfg.overlap, format="numpy")
    metrics = consumer.metrics
    p = consumer.progress = Totals()  # stall, step, copy, rows and batches: read by the bottleneck monitor too
    started = time.perf_counter()
    startup = 0.0
    first = True
    time_boxed = False
    steady_from = None  # the counters after the first batch: the whole-run diagnosis starts there
    sequences = tokens = 0
    while consumer.position[0] < job.epochs and not time_boxed:
        batches = iter(loader)
        while True:
            waited_from = time.perf_counter()
            batch = next(batches, None)
            waited = time.perf_counter() - waited_from
            if batch is None:
                break
            p.copy_s += batch.copy_s
            metrics.device_copy.observe(batch.copy_s)
            if not consumer.cfg.overlap:  # the preparation ran inside next(): it is copy time, not stall
                waited = max(0.0, waited - batch.copy_s)
            if first:
                startup, first = waited, False
                steady_from = consumer._totals()
            else:
                p.stall_s += waited
                metrics.input_wait.observe(waited)
            received = batch.received
            step_from = time.perf_counter()
            if received.size and stepper is not None:
                if prepare is not None:
                    stepper.step_prepared(batch.prepared)
                else:
                    stepper.step(received)
            step_s = time.perf_counter() - step_from
            metrics.step_seconds.observe(step_s)
            mine = set(received.sample_ids.tolist())  # a piece's failures are in the list its whole batch shares
            rows = received.size - sum(s.sample_id in mine for s in received.undecodable)
            metrics.samples.inc(rows)
            metrics.batches.inc()
            p.step_s += step_s
            p.rows += rows
            p.batches += 1
            if received.sequences:
                sequences += received.sequences
                tokens += received.real_tokens
                metrics.sequences.inc(received.sequences)
                metrics.tokens.inc(received.real_tokens)
            if on_step:
                on_step(consumer)
            if max_seconds is not None and time.perf_counter() - started - startup >= max_seconds:
                time_boxed = True
                break
    elapsed = time.perf_counter() - started
    steady = max(elapsed - startup, 1e-9)
    verdict = diagnose(steady_from, consumer._totals()) if steady_from is not None else None
    consumer.settle()
    receiver = consumer._receiver
    stages = receiver.stages
    ledger = consumer.ledger
    skipped = sorted(ledger.skipped.values(), key=lambda s: (s.epoch, s.sample_id))
    text = receiver.text
    work = ({"examples": stages.examples, "pack": stages.pack} if job.dataset == "wikipedia"
            else {"decode": stages.decode, "augment": stages.augment})
    if decoding is not None:  # part of "copy": the consumer's prepare decodes before it converts
        work["decode_on_accelerator"] = decoding.decode_s
    text_fields = {} if job.dataset != "wikipedia" else dict(
        sequences=sequences, sequences_per_s=sequences / steady, tokens=tokens, tokens_per_s=tokens / steady,
        padding_fraction=text.padding_fraction, padding_fraction_before_packing=text.padding_fraction_before_packing,
        masked_fraction=text.masked_tokens / text.real_tokens if text.real_tokens else 0.0,
        random_next_fraction=text.random_next / text.sequences if text.sequences else 0.0)
    return Summary(
        samples=ledger.samples, unique_samples=ledger.unique_samples, duplicates_dropped=ledger.duplicate_samples,
        epochs=job.epochs, elapsed_s=elapsed, startup_s=startup,
        delivered_samples_per_s=ledger.samples / steady, stall_fraction=p.stall_s / steady, batches=p.batches,
        hosts=len(receiver.hosts_delivered), procs_per_host=procs_per_host, skipped_samples=len(skipped),
        skipped=[asdict(s) for s in skipped], frames_dropped=dict(receiver.dropped),
        units_released=consumer.dispatcher.stats().releases, units_handed_back=consumer.dispatcher.stats().handed_back,
        stage_seconds={**work, "send": stages.send, "wait_for_credit": stages.wait_for_credit,
                       "receive": stages.receive, "copy": p.copy_s, "step": p.step_s, "stall": p.stall_s},
        per_epoch_unique=[ledger.unique_in_epoch(e) for e in range(job.epochs)], dataset=job.dataset,
        rank=consumer.rank, world_size=job.world_size, steps=p.batches,
        rows=p.rows, rows_per_s=p.rows / steady, bytes_received=receiver.bytes_received, time_boxed=time_boxed,
        decode_on=job.decode_on, **text_fields,
        **({} if verdict is None else dict(bottleneck=verdict.stage, bottleneck_detail=verdict.detail,
                                           cores_needed=verdict.cores_needed, cores_in_use=verdict.cores_in_use)))


def _decoding(consumer, accelerator):
    """Wrap the accelerator so each batch's JPEGs are decoded where it runs (DALI)."""
    from accel.jpeg_decode import DaliJpegDecoder, DecodingAccelerator

    metrics = consumer.metrics

    def count(seconds: float, failed: int, fallbacks: int) -> None:
        metrics.accel_decode.observe(seconds)
        metrics.accel_decode_errors.inc(failed)
        metrics.accel_decode_fallbacks.inc(fallbacks)

    device = str(getattr(accelerator, "device", "cpu"))
    decoder = DaliJpegDecoder(consumer.job.image_size, consumer.job.batch_size, device, consumer.cfg.decode_threads)
    return DecodingAccelerator(accelerator, decoder, on_decode=count, key_of=consumer.manifest.key_of)
