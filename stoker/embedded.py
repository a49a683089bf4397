"""`stoker run`: dispatcher + consumer (rank 0) in this process, worker daemons as child processes.

Each worker daemon is a real `stoker worker` process (one per emulated host) talking to the
consumer over loopback TCP, exactly as daemons on separate hosts would. With `--world-size N`
the other ranks are `stoker train --rank r` processes (Graphcore's "instances"), attached to
rank 0's dispatcher with a job secret made for the run; the summary has each rank's figures
and the job's. The children die with this process (workers.lifeline), and a daemon or rank
that exits with an error before the job is done (a port in use, say) ends the run with its
message instead of leaving it waiting.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from stoker.accel.backends.accelerators import AccelSpec, torch_model
from stoker.accel.backends.profiles import GPT_PROFILE_SEQ_LEN, PROFILE_SEQ_LEN, profile_rate
from stoker.accel.consumer import Consumer
from stoker.accel.consumer_config import ConsumerConfig
from stoker.accel.cost import cores_text
from stoker.accel.summary import WHOLE_RUN, Summary, job_totals
from stoker.configured import command_line
from stoker.datasets import default_manifest
from stoker.local_workers import (
    ERROR_PREFIX,
    DaemonProcess,
    stop_daemons,
    watch_daemons,
    worker_command,
    worker_environment,
)
from stoker.options import FREE, emit_json
from stoker.pipeline.images.layout import DecodeOn
from stoker.pipeline.job import JobConfig
from stoker.pipeline.kinds import ModelFamily, kind_of
from stoker.protos import job_secret
from stoker.protos.errors import StateError


@dataclass(frozen=True)
class RunConfig:
    """How `run_embedded` runs a job on this machine (the job itself, its manifest included, is a JobConfig)."""

    hosts: int = 2
    procs: int = 1
    accel: AccelSpec = AccelSpec()
    consumer: ConsumerConfig = ConsumerConfig()
    worker_metrics_port: int | None = 9561  # host i serves on this + i
    progress: bool = True
    log_level: str = "WARNING"
    shard_cache_gb: float | None = None  # each worker daemon's --shard-cache-gb (they share this machine's cache)
    record_steps: str = ""  # every rank records its steps here (--record-steps), for `stoker audit`


class Progress:
    def __init__(self, total: int, enabled: bool, dataset: str = "imagenet") -> None:
        self.bar = tqdm(total=total, unit=kind_of(dataset).progress_unit, desc="stoker run", disable=not enabled,
                        smoothing=0.1)
        self.last = 0.0

    def __call__(self, consumer: Consumer, force: bool = False) -> None:
        now = time.monotonic()
        if now - self.last < 0.25 and not force:
            return
        self.last = now
        stats = consumer.dispatcher.stats()
        self.bar.set_postfix_str(f"queue={consumer.loop.queue.qsize()} units={stats.done}/"
                                 f"{consumer.dispatcher.total_units} hosts={stats.hosts_alive}", refresh=False)
        self.bar.update(consumer.ledger.samples - self.bar.n)

    def close(self, consumer: Consumer) -> None:
        self(consumer, force=True)
        self.bar.close()


def run_manifest(data: str | None, dataset: str, images: int, progress: bool = True) -> str:
    """The manifest a job on this machine reads: `data` (--data), else the default set of the dataset
    (`images` of them for imagenet), made on first use."""
    return data or str(default_manifest(dataset, images, progress=progress))


def run_embedded(job: JobConfig, cfg: RunConfig, on_start: Callable[[Consumer], None] | None = None) -> list[Summary]:
    """Run one job end to end (its manifest: `run_manifest`'s, for the default set); its transform is
    pinned here if the caller has not. Returns each rank's summary (rank 0's first). `on_start`: called
    with rank 0's consumer once it listens."""
    job = job.pin()
    if job.world_size > 1 and not cfg.consumer.keys:
        os.environ.setdefault(job_secret.ENV, secrets.token_hex(32))  # rank 0 and its children share it
    consumer = Consumer(cfg.consumer, job, cfg.accel.factory())
    consumer.start()
    if on_start is not None:
        on_start(consumer)
    daemons: list[DaemonProcess] = []  # the other ranks' `stoker train`, then the worker daemons
    progress = Progress(job.epochs * consumer.plan.rank_sizes[0], cfg.progress, job.dataset)
    done = threading.Event()
    folder = Path(tempfile.mkdtemp(prefix="stoker-run-"))
    try:
        for rank in range(1, job.world_size):
            daemons.append(DaemonProcess(str(rank), _rank_command(consumer, rank, cfg, folder), quiet=True,
                                         role="rank"))
        for i in range(cfg.hosts):
            port = None if cfg.worker_metrics_port is None else cfg.worker_metrics_port + i if cfg.worker_metrics_port \
                else 0  # 0: each its own free port
            cmd = worker_command(consumer.control_endpoint, f"host{i}", cfg.procs, port, cfg.log_level,
                                 cfg.shard_cache_gb)
            daemons.append(DaemonProcess(f"host{i}", cmd, worker_environment()))
        watch_daemons(daemons, consumer.abort, done)
        summary = consumer.run(on_step=progress, procs_per_host=cfg.procs, record_steps=cfg.record_steps or None)
        progress.close(consumer)
        try:
            if summary.interrupted:  # Ctrl-C: the worker daemons go first, while the dispatcher still answers
                done.set()  # their hand-backs (after it, each waited out a request's timeout, then a kill)
                stop_daemons([d.proc for d in daemons[job.world_size - 1:]], timeout_s=0.0)  # not the ranks
            consumer.stop()  # rank 0 waits here for the other ranks to finish
            done.set()
            stop_daemons([d.proc for d in daemons], timeout_s=15.0 if consumer.dispatcher.finished else 0.0)
        except KeyboardInterrupt:  # Ctrl-C while closing: the figures are made; close at once and show them
            summary = replace(summary, interrupted=True)
        others = [_rank_summary(folder, rank) for rank in range(1, job.world_size)
                  if not summary.interrupted or (folder / f"rank-{rank}.json").exists()]
        summaries = [summary, *others]
    finally:
        done.set()
        stop_daemons([d.proc for d in daemons], timeout_s=0.0)
        consumer.stop()
        shutil.rmtree(folder, ignore_errors=True)
        for daemon in daemons:
            error = daemon.unreported_error()
            if error:
                print(f"{ERROR_PREFIX}{error}", file=sys.stderr)
    return summaries


def _rank_command(consumer: Consumer, rank: int, cfg: RunConfig, folder: Path) -> list[str]:
    """Rank r's `stoker train`: rank 0's consumer settings (the one builder, `command_line`), its own
    free data socket, attached to rank 0's dispatcher, and the device rank 0 stepped with."""
    child = replace(cfg.consumer, data_bind=FREE, control_bind=ConsumerConfig.control_bind,
                    dispatcher=consumer.control_endpoint)
    port = 0 if cfg.consumer.metrics_port is not None else -1  # a free one: another job's ranks may run here too
    return [sys.executable, "-m", "stoker", "--log-level", cfg.log_level, "train", "--rank", str(rank),
            "--world-size", str(consumer.job.world_size), f"--metrics-port={port}", "--no-progress",
            "--json", str(folder / f"rank-{rank}.json"), *command_line(child), *command_line(cfg.accel),
            *([f"--record-steps={cfg.record_steps}"] if cfg.record_steps else [])]


def _rank_summary(folder: Path, rank: int) -> Summary:
    path = folder / f"rank-{rank}.json"
    if not path.exists():
        raise StateError(f"rank {rank} wrote no summary")
    return Summary.from_dict(json.loads(path.read_text()))





def cores_answer(s: Summary, accel: AccelSpec | None, transform: str = "") -> dict | None:
    """The run's one answer to "how many host cores does this accelerator need": the accelerator's
    rate (a profile's full-size system; the simulated device's rate; else what this run's device
    took per step second) over what one host core made per CPU-second in this run (every rank;
    CPU time, so a host shared with other work gives the same figure), with that rate's spread
    over the run. A profile counts BERT in sequences (at length PROFILE_SEQ_LEN), so text against a
    profile is sized in sequences: rows per CPU-second times the sequences packing put in a row.
    None for the null device (it never computes) or when no worker CPU was reported."""
    if accel is None or accel.kind == "null" or s.per_core_rate <= 0:
        return None
    first = s.ranks[0] if s.ranks else s
    step = first.stage_seconds.get("step", 0.0)
    if kind_of(s.dataset).model_family == ModelFamily.GPT:
        return _tokens_answer(s, accel, first, step)
    if accel.kind == "simulated" and accel.profile:
        name, rate = f"a full-size {accel.profile}", profile_rate(accel.profile, s.dataset)
    elif accel.kind == "simulated" and accel.rate:
        name, rate = "the simulated device", accel.rate
    elif step > 0:
        name, rate = f"this {torch_model(accel, s.dataset)} step on {accel.device}", first.rows / step
    else:
        return None
    kind = kind_of(s.dataset)
    answer = {"accelerator": name, "accelerator_rate": rate, "unit": "rows/s" if kind.text else f"{kind.row_noun}/s",
              "per_core_rate": s.per_core_rate, "per_core_spread": s.per_core_spread,
              "cores_needed": rate / s.per_core_rate, "cpu_wait_fraction": s.cpu_wait_fraction,
              "transform": None if kind.text else transform or None, "decode_on": s.decode_on}
    if kind.text and s.sequences is not None and s.rows:
        per_row = answer["sequences_per_row"] = s.sequences / s.rows  # packing: what a row of the rate holds
        if accel.kind == "simulated" and accel.profile:  # the profile's rate is in sequences: count the supply so
            answer.update(unit="sequences/s", per_core_rate=s.per_core_rate * per_row,
                          per_core_spread=[x * per_row for x in s.per_core_spread], seq_len=s.seq_len,
                          profile_seq_len=PROFILE_SEQ_LEN, cores_needed=rate / (s.per_core_rate * per_row))
    return answer


def _tokens_answer(s: Summary, accel: AccelSpec, first: Summary, step: float) -> dict | None:
    """A tokens job's cores answer in tokens, as `stoker plan --dataset tokens` (stoker.token_planning) counts
    them: the accelerator's tokens/s over the real tokens (padding not counted) one host core made per
    CPU-second. A profile's rate is GPT-2 124M's rows of GPT_PROFILE_SEQ_LEN tokens, what its simulated device
    steps; a simulated --rate or this run's device took rows, each with this run's tokens per row."""
    if not s.tokens or not s.rows:
        return None
    per_row = s.tokens / s.rows  # real tokens in a row this run made
    if accel.kind == "simulated" and accel.profile:
        name = f"a full-size {accel.profile} (GPT-2 124M, rows of {GPT_PROFILE_SEQ_LEN} tokens)"
        rate = profile_rate(accel.profile, s.dataset) * GPT_PROFILE_SEQ_LEN
    elif accel.kind == "simulated" and accel.rate:
        name, rate = "the simulated device", accel.rate * per_row
    elif step > 0 and first.tokens:
        name, rate = f"this {torch_model(accel, s.dataset)} step on {accel.device}", first.tokens / step
    else:
        return None
    per_core = s.per_core_rate * per_row
    return {"accelerator": name, "accelerator_rate": rate, "unit": "tokens/s", "per_core_rate": per_core,
            "per_core_spread": [x * per_row for x in s.per_core_spread], "cores_needed": rate / per_core,
            "cpu_wait_fraction": s.cpu_wait_fraction, "transform": None, "decode_on": s.decode_on,
            "tokens_per_row": per_row, "seq_len": s.seq_len, "padding_fraction": s.padding_fraction}


def cores_line(answer: dict) -> str:
    """The closing line for `cores_answer`: the figure, the two rates it divides, the spread, what made it."""
    unit = answer["unit"]
    noun = unit.removesuffix("/s")
    spread = answer["per_core_spread"]
    on_host = answer["decode_on"] == DecodeOn.HOST
    made = ("" if not answer["transform"] else f"transform {answer['transform']}" if on_host
            else "encoded images shipped (decoding on the accelerator)")
    details = [f"{answer['accelerator_rate']:,.0f} {unit} over {answer['per_core_rate']:,.0f} {noun} per CPU-second"
               + (f" (10-90% of the run: {spread[0]:,.0f}-{spread[1]:,.0f})" if spread else "")]
    if answer.get("sequences_per_row", 1.0) > 1.0:  # packed; one sequence per row says nothing
        details.append(f"packing puts {answer['sequences_per_row']:.2f} sequences in a row" if unit == "sequences/s"
                       else f"packing puts {answer['sequences_per_row']:.2f} sequences in a row of the rate")
    if unit == "tokens/s":
        details.append(f"real tokens, padding not counted, as `stoker plan --dataset tokens` counts them: "
                       f"{answer['tokens_per_row']:,.1f} in a row of {answer['seq_len']}")
    elif answer.get("seq_len") and answer["seq_len"] != answer.get("profile_seq_len"):
        details.append(f"the profile's rate is at length {answer['profile_seq_len']} and this run's rows hold "
                       f"{answer['seq_len']} tokens: run --seq-len {answer['profile_seq_len']} for its sequences")
    if made:
        details.append(made)
    return f"host cores needed for {answer['accelerator']}: {cores_text(answer['cores_needed'])} ({'; '.join(details)})"


def _print_delivery(s: Summary, ranks: int) -> None:
    """The closing lines' first part: what was delivered, dropped and skipped, the text figures, the stages."""
    noun = kind_of(s.dataset).sample_noun
    procs = f" x {s.procs_per_host} process(es)" if s.procs_per_host else ""
    who = f" to {ranks} ranks" if ranks > 1 else ""
    if s.interrupted:
        print("interrupted (Ctrl-C): the figures below cover what was stepped until then")
    whole = s.rates_over == WHOLE_RUN
    over = " over the whole run, start-up included (too short after start-up for a steady rate)" if whole else ""
    print(f"delivered {s.samples} {noun} ({s.unique_samples} unique) in {s.epochs} epoch(s) from "
          f"{s.hosts} host(s){procs}{who}: {s.delivered_samples_per_s:.0f} {noun}/s"
          f"{' and' if whole else ','} stall {100 * s.stall_fraction:.1f}%{over}, start-up {s.startup_s:.1f} s, "
          f"total {s.elapsed_s:.1f} s")
    print(f"duplicates dropped: {s.duplicates_dropped}; {noun} skipped as unusable: {s.skipped_samples}; "
          f"messages dropped: {sum(s.frames_dropped.values())}; units re-leased after a loss: {s.units_released}"
          + (f" (handed back while waiting for credit, nothing lost: {s.units_handed_back})"
             if s.units_handed_back else ""))
    if s.tokens is not None:
        packing = f" ({s.sequences / s.rows:.2f} per row: packed)" if s.rows and s.sequences else ""
        print(f"text: {s.sequences} sequences in {s.rows} rows{packing}, {s.sequences_per_s:.0f} sequences/s, "
              f"{s.tokens_per_s:.0f} tokens/s{' (over the whole run)' if whole else ''}; "
              f"padding {100 * (s.padding_fraction or 0.0):.1f}% as sent, "
              f"{100 * (s.padding_fraction_before_packing or 0.0):.1f}% with one sequence per row")
    stages = ", ".join(f"{k} {v:.2f}" for k, v in s.stage_seconds.items())
    print(f"stage seconds (the workers' in CPU time, waits in wall time): {stages}")


def nothing_delivered(summaries: Summary | list[Summary]) -> str | None:
    """The job's error when every sample it met was skipped: it trained on nothing, which no exit
    code 0 may hide. Names the commonest reasons (the summary lists every skipped sample)."""
    ranks = [summaries] if isinstance(summaries, Summary) else summaries
    s = job_totals(ranks) if len(ranks) > 1 else ranks[0]
    if s.samples or not s.skipped_samples:
        return None
    reasons = collections.Counter(str(x.get("reason", "")) for x in s.skipped)
    top = "; ".join(f"{count} x {reason[:200]}" for reason, count in reasons.most_common(3))
    return (f"nothing was delivered: all {s.skipped_samples} {kind_of(s.dataset).sample_noun} met were skipped "
            f"as unusable ({top})")


def print_summary(summaries: Summary | list[Summary], json_path: str | None, accel: AccelSpec | None = None,
                  transform: str = "", endpoints: dict[str, str | None] | None = None) -> None:
    """The closing lines (one per rank, then the job's, when there are several) and the JSON (the
    summary, with the cores answer printed here under `cores`); the last line says how many host
    cores the accelerator needs with `transform` (the job's, as named), in CPU time."""
    ranks = [summaries] if isinstance(summaries, Summary) else summaries
    if len(ranks) > 1:
        for r in ranks:
            print(f"rank {r.rank}: {r.samples} samples ({r.unique_samples} unique) in {r.steps} steps, "
                  f"{r.delivered_samples_per_s:.0f}/s, stall {100 * r.stall_fraction:.1f}%"
                  + (" (over the whole run: too short for a steady rate)" if r.rates_over == WHOLE_RUN else ""))
    s = job_totals(ranks) if len(ranks) > 1 else ranks[0]
    data = s.as_dict()
    kind = kind_of(s.dataset)
    _print_delivery(s, len(ranks))
    unit = kind.row_noun
    if accel is not None and accel.kind == "null":
        print("device: null (it never computes, so the stall is the data path's ceiling, not what a device "
              "needs; `stoker run`'s default feeds a simulated A100 at 1/10 scale)")
    elif s.samples == 0:
        print("bottleneck: none measured (nothing was delivered)")
    elif s.bottleneck != "unknown":
        print(f"bottleneck: {s.bottleneck} ({s.bottleneck_detail})")
    elif s.rates_over == WHOLE_RUN:
        print(f"bottleneck: not judged ({s.bottleneck_detail})")
    if accel is not None and accel.kind == "null" or s.bottleneck == "unknown":
        # the null device never computes, and too short a run gives no steady window: no need to size
        data["cores_needed"] = data["cores_in_use"] = None
    if s.per_core_rate > 0:
        waited = ("not measured here (no schedstat)" if s.cpu_wait_fraction is None
                  else f"{100 * s.cpu_wait_fraction:.1f}% of their runnable time")
        cpu = sum(r.stage_seconds.get("cpu", 0.0) for r in ranks)
        busy = cpu / s.rate_seconds()  # every rank's workers, over the run after start-up (too short: the whole run)
        over = " over the whole run" if s.rates_over == WHOLE_RUN else ""
        print(f"worker CPU: {cores_text(busy)} cores busy on average{over}, {s.per_core_rate:,.0f} "
              f"{'rows' if kind.text else unit} per CPU-second; they waited for a core {waited}")
    answer = data["cores"] = cores_answer(s, accel, transform)
    if answer is not None:
        print(cores_line(answer))
        if data.get("cores_needed") is not None:  # one figure per question: the answer's, at this run's scale
            scale = accel.scale if accel is not None and accel.profile else 1.0
            data["cores_needed"] = answer["cores_needed"] * scale * len(ranks)
    failure = nothing_delivered(ranks)
    if failure:
        data["failed"] = failure
    if endpoints:
        data["endpoints"] = endpoints  # where the job listened: metrics, control, data (free ports included)
    emit_json(json_path, data)
