"""The `stoker` command: a thin layer that parses arguments and calls the packages."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from stoker import __version__, cli_experiments
from stoker.flags import FRACTION, METRICS_PORT, NON_NEGATIVE, POSITIVE, SECONDS, Parser, float_in, int_at_least

DEFAULT_DATA_BIND = "tcp://127.0.0.1:5560"
DEFAULT_CONTROL_BIND = "tcp://127.0.0.1:5561"


def _add_job_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", choices=("imagenet", "wikipedia"),
                   help="imagenet (ResNet-50 images) or wikipedia (BERT pretraining text); "
                        "default: what the manifest holds, else imagenet")
    p.add_argument("--epochs", type=POSITIVE, default=1)
    p.add_argument("--batch-size", type=POSITIVE, default=64, help="images, or rows of tokens (default 64)")
    p.add_argument("--unit-batches", type=POSITIVE, default=4,
                   help="a work unit holds batch-size x unit-batches images or documents (default 4)")
    p.add_argument("--seed", type=NON_NEGATIVE, default=0)
    p.add_argument("--image-size", type=POSITIVE, default=224, help="output side in pixels (default 224)")
    p.add_argument("--transform", choices=("train", "eval"), default="train")
    p.add_argument("--crop-area", choices=("reference", "torchvision"), default="reference",
                   help="random-resized-crop area range: MLPerf reference 0.05-1.0 or torchvision 0.08-1.0")
    p.add_argument("--decoder", choices=("auto", "crop", "pillow", "full"), default="auto",
                   help="JPEG decoding: crop (libjpeg-turbo, crop window only), pillow (pillow-simd draft), "
                        "full (every pixel); auto: crop where built (default)")
    p.add_argument("--decode-on", choices=("host", "accelerator"), default="host",
                   help="where JPEGs are decoded: host (the workers, default) or accelerator (workers ship the bytes "
                        "and crop; the consumer decodes with NVIDIA DALI, nvJPEG on a CUDA --device)")
    p.add_argument("--checksum", action="store_true", help="CRC-32C of every batch's frames, checked by the consumer")
    p.add_argument("--world-size", type=POSITIVE, default=None,
                   help="data-parallel ranks (default 1, or $WORLD_SIZE): one stream each, equal steps")
    p.add_argument("--drop-last", action="store_true",
                   help="imagenet: every rank streams only whole batches; the few rows past them sit the epoch out "
                        "(default: no sample is dropped, and a rank's last batches may be short)")
    text = p.add_argument_group("wikipedia (BERT pretraining) options")
    text.add_argument("--seq-len", type=int_at_least(8), default=128, help="tokens per row (default 128)")
    text.add_argument("--max-predictions", type=NON_NEGATIVE, default=0,
                      help="masked-LM targets per sequence (default: 20 at 128, 76 at 512)")
    text.add_argument("--masked-lm-prob", type=FRACTION, default=0.15)
    text.add_argument("--short-seq-prob", type=FRACTION, default=0.1)
    text.add_argument("--whole-word-mask", action="store_true", help="mask whole words, not single pieces")
    text.add_argument("--pack", action="store_true", help="pack several sequences into each row")
    text.add_argument("--pack-max-sequences", type=POSITIVE, default=3, help="sequences per packed row (default 3)")


def _add_consumer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--accel", choices=("null", "simulated", "torch"),
                   help="what the consumer steps with (train: null; run: simulated, --profile a100 at --scale 0.1; "
                        "null: the data path's ceiling)")
    p.add_argument("--rate", type=SECONDS, help="rows (images) per second of --accel simulated")
    p.add_argument("--profile", help="--accel simulated at a named system's rate: a100, h100, ipu-pod16, ipu-pod64")
    p.add_argument("--scale", type=float_in(0.0, 1.0),
                   help="shrink a --profile rate (default 1; run: 0.1 for images, 1 for text)")
    p.add_argument("--convert", action="store_true",
                   help="--accel simulated: also convert each batch on the host as a real device feed would")
    p.add_argument("--model", choices=("resnet18", "resnet50", "bert-tiny", "bert-base", "bert-large"),
                   default="resnet18", help="--accel torch model (bert-*: with --dataset wikipedia)")
    p.add_argument("--device", default="cpu", help="--accel torch device: cpu, cuda, cuda:1 ...")
    p.add_argument("--width", type=POSITIVE, default=64,
                   help="--accel torch: channels of the first stage (64: standard)")
    p.add_argument("--lr", type=SECONDS, help="learning rate (default 0.1 for ResNet SGD, 1e-4 for BERT AdamW)")
    p.add_argument("--label-smoothing", type=float_in(0.0, 1.0, low_open=False), default=0.0)
    p.add_argument("--optimizer", choices=("sgd", "lars", "adamw", "lamb"),
                   help="--accel torch: sgd (default) or lars for ResNet; adamw (default) or lamb for BERT")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="--accel torch ResNet: bf16 autocasts the forward pass (as A100/H100 are benchmarked)")
    p.add_argument("--no-overlap", action="store_true",
                   help="convert and copy each batch between steps instead of during the previous one")
    p.add_argument("--decode-threads", type=POSITIVE, default=1,
                   help="--decode-on accelerator: DALI CPU threads on the consumer (default 1)")
    p.add_argument("--data-bind", default=DEFAULT_DATA_BIND, help=f"data socket (default {DEFAULT_DATA_BIND})")
    p.add_argument("--control-bind", default=DEFAULT_CONTROL_BIND,
                   help=f"dispatcher socket (default {DEFAULT_CONTROL_BIND})")
    p.add_argument("--advertise-host", help="host name workers use to reach this machine")
    p.add_argument("--metrics-port", type=METRICS_PORT, default=None,
                   help="/metrics port (default 9560; rank R > 0: 9570 + R; 0: a free one; -1: none)")
    p.add_argument("--metrics-addr", default="127.0.0.1", help="/metrics address (beyond loopback: with --keys or "
                                                                "--insecure)")
    p.add_argument("--credit-window", type=POSITIVE, default=3, help="batches in flight per worker process")
    p.add_argument("--keys", metavar="DIR", help="CURVE keys (stoker keys init): encrypt every link and admit only "
                                                 "allow-listed workers")
    p.add_argument("--insecure", action="store_true",
                   help="allow binding beyond loopback without --keys (trusted networks only)")
    p.add_argument("--host-timeout", type=SECONDS, default=10.0,
                   help="seconds without a heartbeat before a host's units are re-leased (default 10)")
    p.add_argument("--sender-timeout", type=SECONDS, default=30.0,
                   help="seconds a worker process may stay silent (answering no ping) before its credit window "
                        "is freed (default 30)")
    p.add_argument("--json", metavar="PATH", help="write the closing summary here")
    p.add_argument("--no-progress", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="stoker", description="Keep accelerators fed.")
    parser.add_argument("--version", action="version", version=f"stoker {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default) or ERROR")
    sub = parser.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="make or inspect datasets").add_subparsers(dest="data_command", required=True)
    synth = data.add_parser("imagenet-synth", help="write an ImageNet-like set made from real photos")
    synth.add_argument("dir")
    synth.add_argument("--images", type=POSITIVE, default=2000)
    synth.add_argument("--classes", type=POSITIVE, default=10)
    synth.add_argument("--seed", type=NON_NEGATIVE, default=0)
    synth.add_argument("--procs", type=POSITIVE)
    stats = data.add_parser("stats", help="size/format statistics of an ImageNet-layout folder")
    stats.add_argument("dir")
    wiki = data.add_parser("wikipedia", help="write real English Wikipedia text and BERT's vocab.txt")
    wiki.add_argument("dir")
    wiki.add_argument("--docs", type=POSITIVE, help="keep only the first N articles (default: all ~10,000)")

    prepare = sub.add_parser("prepare", help="convert a dataset into shards").add_subparsers(
        dest="prepare_command", required=True)
    imagenet = prepare.add_parser("imagenet", help="ImageNet-layout folder -> Arrow IPC shards + manifest")
    imagenet.add_argument("src")
    imagenet.add_argument("dst")
    imagenet.add_argument("--shard-mb", type=SECONDS, default=256)
    imagenet.add_argument("--procs", type=POSITIVE)
    imagenet.add_argument("--seed", type=NON_NEGATIVE, default=0)
    wikipedia = prepare.add_parser("wikipedia", help="BERT-format text -> tokenized Parquet shards + manifest")
    wikipedia.add_argument("src", help="a text file or folder of .txt files: one sentence (or paragraph) per "
                                       "line, a blank line between documents")
    wikipedia.add_argument("dst")
    wikipedia.add_argument("--vocab", required=True, help="WordPiece vocab.txt")
    wikipedia.add_argument("--docs-per-shard", type=POSITIVE, default=4096)
    wikipedia.add_argument("--cased", action="store_true", help="do not lowercase (for a cased vocab)")
    wikipedia.add_argument("--seed", type=NON_NEGATIVE, default=0)

    worker = sub.add_parser("worker", help="the per-host decode/augment daemon")
    worker.add_argument("--connect", required=True, help="dispatcher endpoint, e.g. tcp://10.0.0.5:5561")
    worker.add_argument("--procs", type=POSITIVE, default=1)
    worker.add_argument("--host-id", default="")
    worker.add_argument("--metrics-port", type=METRICS_PORT, default=9561,
                        help="/metrics port (default 9561; -1: none)")
    worker.add_argument("--metrics-addr", default="127.0.0.1",
                        help="/metrics address (beyond loopback: with --keys or --insecure)")
    worker.add_argument("--no-metrics", action="store_true")
    worker.add_argument("--once", action="store_true", help="exit after one job (once it has heard it finish)")
    worker.add_argument("--leave-after", type=SECONDS, default=30.0,
                        help="leave a job whose dispatcher has been silent this many seconds (default 30); the "
                             "daemon keeps registering and rejoins it when it answers")
    worker.add_argument("--keys", metavar="DIR", help="CURVE key folder holding server.key and workers/NAME.key_secret")
    worker.add_argument("--key-name", default="", help="this host's key NAME (default: the host id)")
    worker.add_argument("--insecure", action="store_true", help="allow --metrics-addr beyond loopback without --keys")
    worker.add_argument("--parent-pid", type=POSITIVE, help="exit when the process with this pid is gone (stoker run "
                                                            "starts its daemons so)")

    keys = sub.add_parser("keys", help="CURVE keys and the allow-list of worker hosts").add_subparsers(
        dest="keys_command", required=True)
    keys_init = keys.add_parser("init", help="make the service's key pair and an empty allow-list")
    keys_init.add_argument("dir")
    keys_add = keys.add_parser("add", help="make a key pair and allow-list it in its role")
    keys_add.add_argument("dir")
    keys_add.add_argument("name")
    keys_add.add_argument("--role", choices=("worker", "consumer"), default="worker",
                          help="worker (a CPU host, default) or consumer (a `stoker train --dispatcher`)")
    keys_list = keys.add_parser("list", help="list the keys and the allow-list")
    keys_list.add_argument("dir")

    train = sub.add_parser("train", help="the consumer (+ dispatcher) on the accelerator host")
    train.add_argument("--data", help="shards' manifest.json (or its folder); not with --dispatcher")
    train.add_argument("--dispatcher", metavar="ENDPOINT",
                       help="attach to a `stoker dispatch` at this endpoint instead of running one here")
    train.add_argument("--checkpoint", metavar="PATH",
                       help="write the data position (a small JSON state_dict) here, and with --accel torch "
                            "the model + optimizer to PATH.model.pt")
    train.add_argument("--checkpoint-every", type=POSITIVE, default=50, help="steps between checkpoints (default 50)")
    train.add_argument("--resume", metavar="PATH", help="continue the job from this checkpoint (the same path as "
                                                        "--checkpoint: only if it exists, as a service wants)")
    train.add_argument("--max-seconds", type=SECONDS,
                       help="stop after this many seconds past the first batch (a time-boxed measurement)")
    train.add_argument("--job-secret", metavar="FILE",
                       help="with --dispatcher and no --keys: the job secret `stoker dispatch` wrote (or set "
                            "$STOKER_JOB_SECRET); it proves this process is the job's consumer")
    train.add_argument("--rank", type=NON_NEGATIVE, default=None,
                       help="this consumer's data-parallel rank (default 0, or $RANK); ranks other than 0 attach "
                            "to rank 0's dispatcher (--dispatcher, default its control port on $MASTER_ADDR)")
    train.add_argument("--attach-timeout", type=SECONDS, default=60.0,
                       help="with --dispatcher (or as a rank other than 0): give up on a dispatcher that does not "
                            "answer for this long (default 60)")
    train.add_argument("--credit-budget-mb", type=SECONDS, default=1024.0,
                       help="what this rank may have in flight or waiting, in all (default 1024 MB)")
    train.add_argument("--key-name", default="consumer",
                       help="with --dispatcher and --keys: this consumer's key (stoker keys add DIR NAME --role "
                            "consumer; default: consumer)")
    _add_job_args(train)
    _add_consumer_args(train)

    dispatch = sub.add_parser("dispatch", help="the dispatcher as its own process, with a journal")
    dispatch.add_argument("--data", required=True, help="shards' manifest.json (or its folder)")
    dispatch.add_argument("--journal", metavar="PATH", help="append-only journal; restart with it to continue")
    dispatch.add_argument("--control-bind", default=DEFAULT_CONTROL_BIND)
    dispatch.add_argument("--advertise-host")
    dispatch.add_argument("--metrics-port", type=METRICS_PORT, default=9559, help="/metrics port (default 9559; "
                                                                                  "-1: none)")
    dispatch.add_argument("--metrics-addr", default="127.0.0.1")
    dispatch.add_argument("--host-timeout", type=SECONDS, default=10.0)
    dispatch.add_argument("--keys", metavar="DIR", help="CURVE keys: workers and consumers by their keys' roles")
    dispatch.add_argument("--insecure", action="store_true")
    dispatch.add_argument("--job-secret", metavar="FILE",
                          help="without --keys: where the consumer's job secret is kept (made on first start, mode "
                               "0600; default JOURNAL.secret, else stoker-job.secret; $STOKER_JOB_SECRET overrides)")
    _add_job_args(dispatch)

    run = sub.add_parser("run", help="dispatcher + consumer + worker daemons on this machine")
    run.add_argument("--data", help="shards' manifest (default: the generated ImageNet-like set, or the "
                                    "prepared Wikipedia text with --dataset wikipedia)")
    run.add_argument("--images", type=int_at_least(10), default=2000, help="size of the generated default image set")
    run.add_argument("--hosts", type=POSITIVE, default=2)
    run.add_argument("--procs", type=POSITIVE, default=1, help="decode processes per host")
    run.add_argument("--worker-metrics-port", type=METRICS_PORT, default=9561,
                     help="host i serves on this + i (default 9561; -1: none)")
    _add_job_args(run)
    _add_consumer_args(run)

    lab = sub.add_parser("lab", help="an emulated cluster on this machine (network namespaces, CPU quotas)")
    lab_sub = lab.add_subparsers(dest="lab_command", required=True)
    up = lab_sub.add_parser("up", help="make the hosts and start a consumer and one worker daemon per host")
    up.add_argument("--hosts", type=POSITIVE, default=3)
    up.add_argument("--cores-per-host", type=SECONDS, default=1.0, help="CPU quota of each host (default 1)")
    up.add_argument("--procs", type=POSITIVE, default=1, help="worker processes per host")
    up.add_argument("--link-gbit", type=SECONDS, help="shape each host's link to this rate")
    up.add_argument("--link-latency-ms", type=SECONDS, help="add this one-way latency to each host's link")
    up.add_argument("--loopback", action="store_true", help="no namespaces: everything on 127.0.0.1")
    up.add_argument("--ranks", type=POSITIVE, default=1,
                    help="consumer ranks (data-parallel), all on the accelerator (default 1)")
    up.add_argument("train_args", nargs=argparse.REMAINDER,
                    help="after --: options for the consumer's `stoker train` (default data: the generated set)")
    lab_sub.add_parser("status", help="what the lab is made of and whether its processes live")
    lab_sub.add_parser("wait", help="wait for the job to finish and print its summary")
    lab_sub.add_parser("down", help="stop everything and remove what the lab made (safe to repeat)")
    for name, text in (("kill", "kill -9 a host's whole daemon"), ("cut", "drop every packet on a host's link"),
                       ("heal", "undo cut")):
        op = lab_sub.add_parser(name, help=text)
        op.add_argument("host", help="h0, h1, ...")
    cli_experiments.add_parsers(sub)
    return parser


def _job_args(args: argparse.Namespace) -> dict:
    from pipeline.augment import REFERENCE_AREA, TORCHVISION_AREA
    from pipeline.text.examples import TextConfig

    lo, hi = REFERENCE_AREA if args.crop_area == "reference" else TORCHVISION_AREA
    text = TextConfig(seq_len=args.seq_len, max_predictions=args.max_predictions, masked_lm_prob=args.masked_lm_prob,
                      short_seq_prob=args.short_seq_prob, whole_word_mask=args.whole_word_mask, pack=args.pack,
                      pack_max_sequences=args.pack_max_sequences)
    return dict(epochs=args.epochs, batch_size=args.batch_size, unit_batches=args.unit_batches, seed=args.seed,
                image_size=args.image_size, transform=args.transform, min_area=lo, max_area=hi,
                checksum=args.checksum, decoder=args.decoder, decode_on=args.decode_on, text=text,
                world_size=_world_size(args), drop_last=args.drop_last)


def _world_size(args: argparse.Namespace) -> int:
    from accel.loader import ranks_from_env

    return ranks_from_env(getattr(args, "rank", None), args.world_size, None)[1]


# `stoker run`'s device: an A100, at a tenth for images (250 img/s) and whole for text (210 seq/s)
RUN_PROFILE, RUN_SCALE = "a100", {"imagenet": 0.1, "wikipedia": 1.0}


def _accel_spec(args: argparse.Namespace):
    from accel.accelerators import AccelSpec

    if args.accel == "torch":  # the loss every few steps is what a person training wants to see
        logging.getLogger("stoker.loss").setLevel(logging.INFO)
    lr = args.lr if args.lr is not None else (1e-4 if args.model.startswith("bert") else 0.1)
    kind, profile, scale = args.accel, args.profile, args.scale
    if kind is None and args.command == "run" and args.rate is None:  # a device that computes: the default job
        kind, profile = "simulated", profile or RUN_PROFILE
        scale = scale if scale is not None else RUN_SCALE[_dataset(args, args.data)]
    kind = kind or ("simulated" if args.rate or profile else "null")
    return AccelSpec(kind=kind, rate=args.rate, profile=profile, scale=scale or 1.0, convert=args.convert,
                     model=args.model, optimizer=args.optimizer or "", precision=args.precision,
                     device=args.device, width=args.width, lr=lr, label_smoothing=args.label_smoothing)


def _dataset(args: argparse.Namespace, manifest_uri: str | None) -> str:
    """--dataset, else what the manifest holds, else imagenet."""
    if args.dataset:
        return args.dataset
    if manifest_uri:
        from pipeline.shards import Manifest

        return "wikipedia" if Manifest.load(manifest_uri).vocab else "imagenet"
    return "imagenet"


def _metrics_port(args: argparse.Namespace) -> int | None:
    from accel.consumer import rank_metrics_port

    if args.metrics_port is None:
        return rank_metrics_port(getattr(args, "rank", None) or int(os.environ.get("LOCAL_RANK") or 0))
    return None if args.metrics_port < 0 else args.metrics_port


def _consumer_config(args: argparse.Namespace):
    from accel.consumer import ConsumerConfig

    return ConsumerConfig(data_bind=args.data_bind, control_bind=args.control_bind,
                          advertise_host=args.advertise_host,
                          metrics_port=_metrics_port(args), metrics_addr=args.metrics_addr,
                          credit_window=args.credit_window,
                          host_timeout_s=args.host_timeout, keys=args.keys, insecure=args.insecure,
                          dispatcher=getattr(args, "dispatcher", None), overlap=not args.no_overlap,
                          decode_threads=args.decode_threads, sender_timeout_s=args.sender_timeout,
                          key_name=getattr(args, "key_name", "consumer"), job_secret=getattr(args, "job_secret", None),
                          attach_timeout_s=getattr(args, "attach_timeout", 60.0),
                          credit_budget_mb=getattr(args, "credit_budget_mb", 1024.0))


def _cmd_data(args: argparse.Namespace) -> int:
    if args.data_command == "wikipedia":
        from pipeline.text.corpus import write_wikipedia

        corpus = write_wikipedia(args.dir, documents=args.docs)
        print(f"wrote {corpus.documents} Wikipedia articles to {corpus.text} and BERT's vocabulary to {corpus.vocab}\n"
              f"next: stoker prepare wikipedia {corpus.text} SHARDS_DIR --vocab {corpus.vocab}")
        return 0
    if args.data_command == "imagenet-synth":
        from pipeline.synth import SynthConfig, generate

        total = generate(args.dir, SynthConfig(images=args.images, classes=args.classes, seed=args.seed),
                         processes=args.procs)
        print(f"wrote {args.images} images ({total / 1e6:.1f} MB) to {args.dir}/train")
        return 0
    from pipeline.stats import folder_stats

    print(json.dumps(folder_stats(args.dir).as_dict(), indent=1))
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    if args.prepare_command == "wikipedia":
        return _prepare_wikipedia(args)
    from pipeline.prepare import PrepareConfig, prepare_imagenet

    result = prepare_imagenet(args.src, args.dst, PrepareConfig(
        shard_bytes=int(args.shard_mb * (1 << 20)), seed=args.seed, processes=args.procs))
    for item in result.skipped:
        print(f"skipped {item['path']}: {item['reason']}", file=sys.stderr)
    m = result.manifest
    print(f"wrote {m.num_samples} samples in {len(m.shards)} shard(s), {len(m.classes)} classes, to {args.dst}; "
          f"skipped {len(result.skipped)} file(s)")
    return 0


def _prepare_wikipedia(args: argparse.Namespace) -> int:
    from pipeline.text.prepare import TextPrepareConfig, prepare_wikipedia

    result = prepare_wikipedia(args.src, args.dst, args.vocab, TextPrepareConfig(
        docs_per_shard=args.docs_per_shard, seed=args.seed, lowercase=not args.cased))
    for item in result.skipped[:20]:
        print(f"skipped {item['path']}: {item['reason']}", file=sys.stderr)
    if len(result.skipped) > 20:
        print(f"... and {len(result.skipped) - 20} more (listed in the manifest)", file=sys.stderr)
    m = result.manifest
    print(f"wrote {m.num_samples} documents ({result.sentences} sentences, {result.tokens} tokens) in "
          f"{len(m.shards)} shard(s) to {args.dst}; skipped {len(result.skipped)} document(s)")
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from workers.multiproc import ENV, prepare_multiproc_dir, remove_multiproc_dir

    ours = ENV not in os.environ
    folder = prepare_multiproc_dir()  # before prometheus_client is imported
    try:
        from workers.daemon import WorkerConfig, WorkerDaemon

        cfg = WorkerConfig(connect=args.connect, procs=args.procs, host_id=args.host_id,
                           metrics_port=None if args.no_metrics or args.metrics_port < 0 else args.metrics_port,
                           metrics_addr=args.metrics_addr, once=args.once, keys=args.keys, key_name=args.key_name,
                           leave_after_s=args.leave_after, insecure=args.insecure, parent_pid=args.parent_pid)
        return WorkerDaemon(cfg).run()
    finally:
        if ours:
            remove_multiproc_dir(folder)


def _cmd_train(args: argparse.Namespace) -> int:
    from accel import checkpoint
    from accel.accelerators import NullAccelerator, make_accelerator
    from accel.consumer import Consumer
    from accel.job import JobConfig
    from accel.loader import ranks_from_env, with_rank_zero_dispatcher
    from stoker.embedded import Progress, print_summary

    rank, world_size, _ = ranks_from_env(args.rank, args.world_size, None)
    cfg = with_rank_zero_dispatcher(_consumer_config(args), rank)
    job = None if cfg.dispatcher else JobConfig(manifest_uri=args.data, dataset=_dataset(args, args.data),
                                                **_job_args(args))
    resume = None
    if args.resume and args.resume == args.checkpoint and not Path(args.resume).exists():
        print(f"stoker train: no checkpoint at {args.resume} yet; starting the job from the beginning")
    elif args.resume:
        resume = checkpoint.load(args.resume)
    consumer = Consumer(cfg, job, NullAccelerator(), resume=resume, rank=rank,
                        world_size=world_size if cfg.dispatcher and args.world_size else None)
    spec = _accel_spec(args)
    consumer.accelerator = make_accelerator(spec, consumer.job.dataset, len(consumer.manifest.classes),
                                            consumer.manifest.vocab_size, consumer.job.text.seq_len)
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
            checkpoint.save_all(c, args.checkpoint)

    try:
        summary = consumer.run(on_step=on_step, max_seconds=args.max_seconds)
        progress.close(consumer)
        if args.checkpoint:
            checkpoint.save_all(consumer, args.checkpoint)
    finally:
        consumer.stop()
    print_summary(summary, args.json, spec)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from stoker.embedded import RunConfig, print_summary, run_embedded

    spec = _accel_spec(args)
    cfg = RunConfig(data=args.data, dataset=_dataset(args, args.data), images=args.images, hosts=args.hosts,
                    procs=args.procs, accel=spec, consumer=_consumer_config(args),
                    worker_metrics_port=None if args.worker_metrics_port < 0 else args.worker_metrics_port,
                    progress=not args.no_progress, log_level=args.log_level, rank_args=tuple(_rank_argv(args, spec)))
    summaries = run_embedded(_job_args(args), cfg)
    print_summary(summaries, args.json, cfg.accel)
    return 0


def _rank_argv(args: argparse.Namespace, spec) -> list[str]:
    """The options of `stoker run` that the other ranks' `stoker train` need: how they step (`spec`, the
    device rank 0 resolved, defaults included)."""
    argv = ["--accel", spec.kind, "--model", spec.model, "--device", spec.device, "--width", str(spec.width),
            "--label-smoothing", str(spec.label_smoothing), "--precision", spec.precision, "--scale", str(spec.scale),
            "--lr", str(spec.lr), "--decode-threads", str(args.decode_threads),
            "--sender-timeout", str(args.sender_timeout), "--host-timeout", str(args.host_timeout)]
    for flag, value in (("--rate", spec.rate), ("--profile", spec.profile), ("--optimizer", spec.optimizer)):
        if value:
            argv += [flag, str(value)]
    argv += ["--convert"] if spec.convert else []
    argv += ["--no-overlap"] if args.no_overlap else []
    return argv


def _cmd_dispatch(args: argparse.Namespace) -> int:
    from accel.control.service import DispatchConfig, DispatchService
    from accel.job import JobConfig

    job = JobConfig(manifest_uri=args.data, dataset=_dataset(args, args.data), **_job_args(args))
    service = DispatchService(DispatchConfig(
        control_bind=args.control_bind, advertise_host=args.advertise_host,
        journal=args.journal, host_timeout_s=args.host_timeout,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port, metrics_addr=args.metrics_addr,
        keys=args.keys, insecure=args.insecure, job_secret=args.job_secret), job)
    attach = f"; consumers attach with --job-secret {service.secret_file}" if service.secret_file else ""
    print(f"stoker dispatch: job {service.job.job_id}; workers and the consumer connect to {args.control_bind}"
          f"{attach}", flush=True)
    service.run()
    stats = service.dispatcher.stats()
    print(f"dispatcher done: {stats.done}/{service.dispatcher.total_units} units, {stats.releases} re-leased")
    return 0


def _cmd_keys(args: argparse.Namespace) -> int:
    from protos import curve

    if args.keys_command == "init":
        folder = curve.init_keys(args.dir)
        print(f"made {folder}/server.key (give it to every worker host) and {folder}/server.key_secret "
              f"(keep it on the accelerator host); add workers with `stoker keys add {folder} NAME`")
    elif args.keys_command == "add":
        secret = curve.add_key(args.dir, args.name, args.role)
        command = "stoker worker" if args.role == "worker" else "stoker train --dispatcher ..."
        print(f"allow-listed {args.name} as a {args.role}; give {secret} and {args.dir}/server.key to that host and "
              f"run `{command} --keys DIR --key-name {args.name} ...` there")
    else:
        print(json.dumps(curve.list_keys(args.dir), indent=1))
    return 0


def _cmd_lab(args: argparse.Namespace) -> int:
    from stoker.lab import cluster

    command = args.lab_command
    if command == "up":
        train_args = [a for a in args.train_args if a != "--"]
        if "--data" not in train_args:
            from stoker.datasets import default_imagenet

            train_args += ["--data", str(default_imagenet())]
        state = cluster.Lab(cluster.LabConfig(hosts=args.hosts, cores_per_host=args.cores_per_host, procs=args.procs,
                                              ranks=args.ranks,
                                              link_gbit=args.link_gbit, link_latency_ms=args.link_latency_ms,
                                              loopback=args.loopback)).up(train_args)
        _print_lab(state)
    elif command == "status":
        _print_lab(cluster.current())
    elif command == "wait":
        print(json.dumps(cluster.wait(), indent=1))
    elif command == "down":
        removed = cluster.down()
        print("removed: " + (", ".join(removed) if removed else "nothing (no lab was up)"))
    else:
        {"kill": cluster.kill_host, "cut": cluster.cut, "heal": cluster.heal}[command](args.host)
        print(f"{command}: {args.host}")
    return 0


def _print_lab(state) -> None:
    from stoker.lab.cluster import alive

    print(f"lab ({state.mode}){': ' + state.note.lstrip('; ') if state.note else ''}")
    for member in state.members.values():
        where = f"netns {member.netns}" if member.netns else "root namespace"
        print(f"  {member.name:6} {member.address:15} {where:18} pid {member.pid} "
              f"{'up' if alive(member.pid) else 'exited'}  metrics {member.metrics}  log {member.log}")
    print(f"workers connect to {state.control_endpoint}; summary will be written to {state.summary}")


COMMANDS = {"data": _cmd_data, "prepare": _cmd_prepare, "worker": _cmd_worker, "train": _cmd_train,
            "run": _cmd_run, "lab": _cmd_lab, "keys": _cmd_keys, "dispatch": _cmd_dispatch,
            **cli_experiments.COMMANDS}


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Flags that cannot work together: refused before anything starts."""
    from protos.curve import is_loopback

    command = args.command
    ranked = command == "train" and bool(args.rank or os.environ.get("RANK", "0") not in ("", "0"))
    if command == "train" and not ranked and bool(args.data) == bool(args.dispatcher):
        parser.error("train: give --data (run the dispatcher here) or --dispatcher ENDPOINT (attach to one), "
                     "not both")
    if command == "train" and args.job_secret and not (args.dispatcher or ranked or (args.world_size or 1) > 1):
        parser.error("train: --job-secret is for ranks and for attaching to a `stoker dispatch` (--dispatcher)")
    if getattr(args, "drop_last", False) and getattr(args, "dataset", None) == "wikipedia":
        parser.error(f"{command}: argument --drop-last: applies to imagenet jobs only (packed text batches are cut "
                     f"by the packing)")
    if command == "run" and args.keys and (args.world_size or 1) > 1:
        parser.error("run: argument --world-size: with --keys, start the ranks with `stoker train --rank R` and "
                     "consumer keys (stoker keys add DIR NAME --role consumer)")
    if command == "run" and args.worker_metrics_port > 0 and args.worker_metrics_port + args.hosts - 1 > 65535:
        parser.error(f"run: argument --worker-metrics-port: {args.hosts} hosts need ports "
                     f"{args.worker_metrics_port}-{args.worker_metrics_port + args.hosts - 1}, beyond 65535")
    if command in ("train", "run", "dispatch", "worker") and not (args.keys or args.insecure):
        names = {"--metrics-addr": args.metrics_addr}
        if command in ("train", "run"):
            names |= {"--data-bind": args.data_bind, "--control-bind": args.control_bind}
        elif command == "dispatch":
            names["--control-bind"] = args.control_bind
        for flag, value in names.items():
            endpoint = value if "://" in value else f"tcp://{value}:0"
            if not is_loopback(endpoint):
                parser.error(f"{command}: argument {flag}: {value} is beyond loopback; without CURVE keys "
                             f"anyone who reaches it could act on the job: pass --keys DIR, or --insecure on a "
                             f"trusted network")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("stoker: interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"stoker: error: {exc}", file=sys.stderr)
        return 2
