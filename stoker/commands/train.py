"""`stoker train`: a consumer rank (and, at rank 0, the dispatcher) on the accelerator host."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stoker import configured, options
from stoker.commands.common import (
    accel_spec,
    check_job,
    check_loopback,
    exit_code_of,
    is_ranked,
    transform_named,
    with_fleet_start,
)
from stoker.flags import NON_NEGATIVE, POSITIVE, SECONDS, output_file
from stoker.options import ACCELERATOR, CONSUMER_SOCKETS, CONTROL_SOCKET, FLEET_SEAT, JOB, OUTPUT, consumer_metrics

if TYPE_CHECKING:
    from stoker.accel.consumer import Consumer


def add_parser(sub) -> None:
    """`stoker train`: a consumer rank (+ dispatcher)."""
    from stoker.accel.consumer_config import ConsumerConfig

    train = sub.add_parser("train", help="the consumer (+ dispatcher) on the accelerator host", parents=[
        JOB, ACCELERATOR, CONSUMER_SOCKETS, CONTROL_SOCKET,
        consumer_metrics("/metrics port (default 9560; rank R > 0: 9570 + R; 0: a free one; -1: none)"), OUTPUT,
        FLEET_SEAT])
    configured.add_options(train.add_argument_group("security"), ConsumerConfig, ("keys", "insecure"))
    train.add_argument("--data", help="shards' manifest.json (or its folder); not with --dispatcher")
    train.add_argument("--checkpoint", metavar="PATH", type=output_file(),  # refused now, not at the first save
                       help="write the data position (a small JSON state_dict) here, and with --accel torch "
                            "the model + optimizer to PATH.model.pt")
    train.add_argument("--checkpoint-every", type=POSITIVE, default=50, help="steps between checkpoints (default 50)")
    train.add_argument("--resume", metavar="PATH", help="continue the job from this checkpoint (the same path as "
                                                        "--checkpoint: only if it exists, as a service wants)")
    train.add_argument("--max-seconds", type=SECONDS,
                       help="stop after this many seconds past the first batch (a time-boxed measurement)")
    train.add_argument("--rank", type=NON_NEGATIVE, default=None,
                       help="this consumer's data-parallel rank (default 0, or $RANK); ranks other than 0 attach "
                            "to rank 0's dispatcher (--dispatcher, default its control port on $MASTER_ADDR)")
    configured.add_options(train, ConsumerConfig, ("credit_budget_mb",))
    configured.add_options(train.add_argument_group("attaching to a dispatcher"), ConsumerConfig, (
        "dispatcher", "job_secret", "key_name", "attach_timeout_s"))


def run(args: argparse.Namespace) -> int:
    from stoker.accel import checkpoint
    from stoker.accel.consumer import Consumer
    from stoker.accel.ranks import place, rank_zero_dispatcher
    from stoker.embedded import Progress, print_summary

    where = place(args.rank, args.world_size, None)
    rank, world_size = where.rank, where.world_size
    cfg = rank_zero_dispatcher(options.consumer_config(args, args.rank), rank, where.master_addr)
    job = None if cfg.dispatcher else options.job_config(args, args.rank)
    resume = None
    if args.resume and args.resume == args.checkpoint and not Path(args.resume).exists():
        print(f"stoker train: no checkpoint at {args.resume} yet; starting the job from the beginning")
    elif args.resume:
        resume = checkpoint.load(args.resume)
    spec = accel_spec(args)
    cfg = with_fleet_start(cfg, args, spec, world_size)
    consumer = Consumer(cfg, job, spec.factory(), resume=resume, rank=rank,
                        world_size=world_size if cfg.dispatcher and args.world_size else None)
    if args.resume and checkpoint.load_model(consumer.accelerator, args.resume):
        print(f"stoker train: model and optimizer restored from {checkpoint.model_path(args.resume)}")
    consumer.start()
    job = consumer.job
    ranks = f" (rank {rank} of {job.world_size})" if job.world_size > 1 else ""
    print(f"stoker train: job {job.job_id}{ranks}; workers connect to {consumer.control_endpoint}"
          + (f"; metrics on :{consumer.metrics_port}" if consumer.metrics_port else ""), flush=True)
    progress = Progress(job.epochs * consumer.plan.samples_per_epoch, not args.no_progress, job.dataset)
    steps = 0

    def on_step(c: Consumer) -> None:
        nonlocal steps
        progress(c)
        steps += 1
        if args.checkpoint and steps % args.checkpoint_every == 0:
            checkpoint.save_all(c, args.checkpoint, elsewhere=CHECKPOINT_ELSEWHERE)

    try:
        summary = consumer.run(on_step=on_step, max_seconds=args.max_seconds, record_steps=args.record_steps)
        progress.close(consumer)
        if args.checkpoint:
            try:  # after a Ctrl-C, a dispatcher that does not answer at once is not waited on for long
                checkpoint.save_all(consumer, args.checkpoint, INTERRUPTED_ANSWER_S if summary.interrupted else None,
                                    CHECKPOINT_ELSEWHERE)
            except RuntimeError as exc:
                if not summary.interrupted:
                    raise
                print(f"stoker train: interrupted; the checkpoint was not saved: {exc}", file=sys.stderr)
    finally:
        consumer.stop()
    print_summary(summary, args.json, spec, transform_named(consumer.job.transform, consumer.job.transform_params))
    return exit_code_of(summary)


INTERRUPTED_ANSWER_S = 5.0  # Ctrl-C: the checkpoint waits this long for the dispatcher, then the summary comes
CHECKPOINT_ELSEWHERE = "pass --checkpoint elsewhere"  # what a checkpoint the disk refused says to do


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What cannot work together, refused before anything starts."""
    ranked = is_ranked(args)
    if not ranked and bool(args.data) == bool(args.dispatcher):
        parser.error("train: give --data (run the dispatcher here) or --dispatcher ENDPOINT (attach to one), "
                     "not both")
    if args.job_secret and not (args.dispatcher or ranked or (args.world_size or 1) > 1):
        parser.error("train: --job-secret is for ranks and for attaching to a `stoker dispatch` (--dispatcher)")
    check_job(parser, args, ranked)
    check_loopback(parser, args, {"--metrics-addr": args.metrics_addr, "--data-bind": args.data_bind,
                                  "--control-bind": args.control_bind})
