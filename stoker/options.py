"""The command line's grammar: option groups as parent parsers, each taken by exactly the commands
that honour it, and the functions that turn parsed options into the packages' configs.

| group | options | taken by |
|---|---|---|
| `JOB` | what to train on, how it is cut and transformed | run, train, dispatch |
| `ACCELERATOR` | what the consumer steps with | run, train |
| `CONSUMER_SOCKETS` | the consumer's data socket and its senders | run, train |
| `CONTROL_SOCKET` | the dispatcher's socket and its hosts | run, train, dispatch |
| `security(...)` | CURVE keys, or running open on a trusted network | train, dispatch, worker |
| `metrics(...)` | the /metrics endpoint | run, train, dispatch, worker |
| `SHARD_CACHE` | the size limit of a host's cache of remote shards | run, worker |
| `OUTPUT` | the closing summary as JSON, the progress bar | run, train |

Defaults are the configs' own (`JobConfig`, `TextConfig`, `ConsumerConfig`), so a default is
written once. One spelling per option across commands; an old spelling stays accepted for a
while with a one-line deprecation message (`deprecated`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields
from pathlib import Path

from accel.consumer_config import ConsumerConfig
from pipeline.augment import REFERENCE_AREA, TORCHVISION_AREA
from pipeline.kinds import IMAGENET, kind_of
from pipeline.shard_cache import LIMIT_ENV, parse_gb
from pipeline.text.examples import TextConfig
from protos import message_fit
from protos.job import DATASETS, DECODE_PLACEMENTS, JOB_DEFAULTS, JobConfig
from stoker.flags import FRACTION, METRICS_PORT, NON_NEGATIVE, POSITIVE, SECONDS, float_in, int_at_least

TEXT_DEFAULTS = TextConfig()
CONSUMER = ConsumerConfig()


def _group(description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False, description=description)


def _job() -> argparse.ArgumentParser:
    parent = _group("job")
    p = parent.add_argument_group("job: what to train on, and how it is cut and transformed")
    d = JOB_DEFAULTS
    p.add_argument("--dataset", choices=DATASETS,
                   help="imagenet (ResNet-50 images) or wikipedia (BERT pretraining text); "
                        "default: what the manifest holds, else imagenet")
    p.add_argument("--epochs", type=POSITIVE, default=d["epochs"])
    p.add_argument("--batch-size", type=POSITIVE, default=d["batch_size"],
                   help="images, or rows of tokens (default %(default)s)")
    p.add_argument("--unit-batches", type=POSITIVE, default=d["unit_batches"],
                   help="a work unit holds batch-size x unit-batches images or documents (default %(default)s)")
    p.add_argument("--seed", type=NON_NEGATIVE, default=d["seed"])
    p.add_argument("--image-size", type=POSITIVE, default=d["image_size"],
                   help="output side in pixels (default %(default)s)")
    p.add_argument("--transform", choices=("train", "eval"), default=d["transform"])
    p.add_argument("--crop-area", choices=("reference", "torchvision"), default="reference",
                   help="random-resized-crop area range: MLPerf reference 0.05-1.0 or torchvision 0.08-1.0")
    p.add_argument("--decoder", choices=("auto", "crop", "pillow", "full"), default=d["decoder"],
                   help="JPEG decoding: crop (libjpeg-turbo, crop window only), pillow (pillow-simd draft), "
                        "full (every pixel); auto: crop where built (default)")
    p.add_argument("--decode-on", choices=DECODE_PLACEMENTS, default=d["decode_on"],
                   help="where JPEGs are decoded: host (the workers, default) or accelerator (workers ship the bytes "
                        "and crop; the consumer decodes with NVIDIA DALI, nvJPEG on a CUDA --device)")
    p.add_argument("--checksum", action="store_true", help="CRC-32C of every batch's frames, checked by the consumer")
    p.add_argument("--world-size", type=POSITIVE, default=None,
                   help="data-parallel ranks (default 1, or $WORLD_SIZE): one stream each, equal steps")
    p.add_argument("--drop-last", action="store_true",
                   help="imagenet: every rank streams only whole batches; the few rows past them sit the epoch out "
                        "(default: no sample is dropped, and a rank's last batches may be short)")
    text = parent.add_argument_group("job, wikipedia (BERT pretraining)")
    t = TEXT_DEFAULTS
    text.add_argument("--seq-len", type=int_at_least(8), default=t.seq_len, help="tokens per row (default %(default)s)")
    text.add_argument("--max-predictions", type=NON_NEGATIVE, default=t.max_predictions,
                      help="masked-LM targets per sequence (default: 20 at 128, 76 at 512)")
    text.add_argument("--masked-lm-prob", type=FRACTION, default=t.masked_lm_prob)
    text.add_argument("--short-seq-prob", type=FRACTION, default=t.short_seq_prob)
    text.add_argument("--whole-word-mask", action="store_true", help="mask whole words, not single pieces")
    text.add_argument("--pack", action="store_true", help="pack several sequences into each row")
    text.add_argument("--pack-max-sequences", type=POSITIVE, default=t.pack_max_sequences,
                      help="sequences per packed row (default %(default)s)")
    return parent


def _accelerator() -> argparse.ArgumentParser:
    parent = _group("accelerator")
    p = parent.add_argument_group("accelerator: what the consumer steps with")
    p.add_argument("--accel", choices=("null", "simulated", "torch"),
                   help="train: null; run: simulated, --profile a100 at --scale 0.1; null: the data path's ceiling")
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
    p.add_argument("--decode-threads", type=POSITIVE, default=CONSUMER.decode_threads,
                   help="--decode-on accelerator: DALI CPU threads on the consumer (default %(default)s)")
    return parent


def _consumer_sockets() -> argparse.ArgumentParser:
    parent = _group("consumer sockets")
    p = parent.add_argument_group("consumer: its data socket and the worker processes sending to it")
    p.add_argument("--data-bind", default=CONSUMER.data_bind, help="data socket (default %(default)s)")
    p.add_argument("--credit-window", type=POSITIVE, default=CONSUMER.credit_window,
                   help="batches in flight per worker process (default %(default)s)")
    p.add_argument("--sender-timeout", type=SECONDS, default=CONSUMER.sender_timeout_s,
                   help="seconds a worker process may stay silent (answering no ping) before its credit window "
                        "is freed (default %(default)s)")
    return parent


def _control_socket() -> argparse.ArgumentParser:
    parent = _group("control socket")
    p = parent.add_argument_group("control: the dispatcher's socket and the hosts that lease from it")
    p.add_argument("--control-bind", default=CONSUMER.control_bind, help="dispatcher socket (default %(default)s)")
    p.add_argument("--advertise-host", help="host name workers use to reach this machine")
    p.add_argument("--host-timeout", type=SECONDS, default=CONSUMER.host_timeout_s,
                   help="seconds without a heartbeat before a host's units are re-leased (default %(default)s)")
    return parent


def security(keys_help: str) -> argparse.ArgumentParser:
    parent = _group("security")
    p = parent.add_argument_group("security")
    p.add_argument("--keys", metavar="DIR", help=keys_help)
    p.add_argument("--insecure", action="store_true",
                   help="allow binding beyond loopback without --keys (trusted networks only)")
    return parent


def metrics(default_port: int | None, port_help: str) -> argparse.ArgumentParser:
    parent = _group("metrics")
    p = parent.add_argument_group("metrics: the Prometheus endpoint")
    p.add_argument("--metrics-port", type=METRICS_PORT, default=default_port, help=port_help)
    p.add_argument("--metrics-addr", default=CONSUMER.metrics_addr,
                   help="/metrics address (default %(default)s; beyond loopback: with --keys or --insecure)")
    return parent


def _shard_cache() -> argparse.ArgumentParser:
    parent = _group("shard cache")
    p = parent.add_argument_group("shard cache: this host's copies of shards on object storage")
    p.add_argument("--shard-cache-gb", type=SECONDS, metavar="GB",
                   help="keep the cache under GB, least recently used shards removed first, never one a process has "
                        f"open (default: ${LIMIT_ENV}, else no limit)")
    return parent


def shard_cache_gb(parser: argparse.ArgumentParser, args: argparse.Namespace) -> float | None:
    """--shard-cache-gb, else $STOKER_SHARD_CACHE_GB checked as the flag is (an error names it), else None."""
    if args.shard_cache_gb is not None or not os.environ.get(LIMIT_ENV):
        return args.shard_cache_gb
    try:
        return parse_gb(os.environ[LIMIT_ENV], f"${LIMIT_ENV}")
    except ValueError as exc:
        parser.error(f"{args.command}: {exc}")


def _output() -> argparse.ArgumentParser:
    parent = _group("output")
    p = parent.add_argument_group("output")
    json_option(p, "the closing summary")
    p.add_argument("--no-progress", action="store_true")
    return parent


def json_option(p, what: str) -> None:
    """`--json PATH` writes `what` there; `--json` alone (or `--json -`) prints it instead."""
    p.add_argument("--json", metavar="PATH", nargs="?", const="-",
                   help=f"write {what} as JSON to PATH (alone: to standard output)")


JOB, ACCELERATOR, CONSUMER_SOCKETS, CONTROL_SOCKET, SHARD_CACHE, OUTPUT = (
    _job(), _accelerator(), _consumer_sockets(), _control_socket(), _shard_cache(), _output())


class Deprecated(argparse.Action):
    """An old spelling, accepted for a while: it says once which spelling replaces it and stores
    its value (or `const`, for an old flag) where the new option does."""

    def __init__(self, option_strings, dest, instead: str, nargs=None, const=None, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=nargs, const=const, **kwargs)
        self.instead = instead

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"{parser.prog}: {option_string} is deprecated and will go; use {self.instead}", file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def refused(p, option: str, reason: str) -> None:
    """An option a command cannot honour: refused at parse time with the reason, not ignored."""
    class Refuse(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None) -> None:
            parser.error(f"argument {option_string}: {reason}")

    p.add_argument(option, action=Refuse, help=argparse.SUPPRESS)


def job_fields(args: argparse.Namespace) -> dict:
    """The job options as `JobConfig` keyword arguments (all but the manifest and the dataset)."""
    lo, hi = REFERENCE_AREA if args.crop_area == "reference" else TORCHVISION_AREA
    text = TextConfig(**{f.name: getattr(args, f.name) for f in fields(TextConfig)})
    given = {f.name: getattr(args, f.name) for f in fields(JobConfig) if f.name in JOB_DEFAULTS
             and f.name not in ("dataset", "text", "world_size") and hasattr(args, f.name)}
    return given | dict(min_area=lo, max_area=hi, text=text, world_size=world_size(args))


def image_fit_error(args: argparse.Namespace) -> str | None:
    """Why --image-size and --batch-size together make batches too big for a data message (None: they
    fit), at parse time. Checked for a job of decoded images: --dataset imagenet, or no --dataset and
    --image-size given (a text manifest ignores it); `JobConfig` checks every job again when it is made.
    Also with --decode-on accelerator: the consumer then makes batches of the same size itself."""
    if not hasattr(args, "image_size"):
        return None
    if args.dataset is None and args.image_size == JOB_DEFAULTS["image_size"]:
        return None
    if args.dataset is not None and not kind_of(args.dataset).encoded_images:
        return None
    try:
        message_fit.check_images(args.batch_size, args.image_size)
    except ValueError as exc:
        return str(exc)
    return None


def job_config(args: argparse.Namespace) -> JobConfig:
    return JobConfig(manifest_uri=args.data, dataset=dataset(args, args.data), **job_fields(args))


def world_size(args: argparse.Namespace) -> int:
    from accel.ranks import place

    return place(getattr(args, "rank", None), args.world_size, None).world_size


def dataset(args: argparse.Namespace, manifest_uri: str | None) -> str:
    """--dataset, else what the manifest holds, else imagenet."""
    if args.dataset:
        return args.dataset
    if manifest_uri:
        from pipeline.shards import Manifest

        return Manifest.load(manifest_uri).kind
    return IMAGENET.name


def consumer_metrics_port(args: argparse.Namespace) -> int | None:
    from accel.consumer_config import rank_metrics_port

    if args.metrics_port is None:
        return rank_metrics_port(getattr(args, "rank", None) or int(os.environ.get("LOCAL_RANK") or 0))
    return None if args.metrics_port < 0 else args.metrics_port


def consumer_config(args: argparse.Namespace) -> ConsumerConfig:
    return ConsumerConfig(data_bind=args.data_bind, control_bind=args.control_bind,
                          advertise_host=args.advertise_host,
                          metrics_port=consumer_metrics_port(args), metrics_addr=args.metrics_addr,
                          credit_window=args.credit_window,
                          host_timeout_s=args.host_timeout, keys=getattr(args, "keys", None),
                          insecure=getattr(args, "insecure", False),
                          dispatcher=getattr(args, "dispatcher", None), overlap=not args.no_overlap,
                          decode_threads=args.decode_threads, sender_timeout_s=args.sender_timeout,
                          key_name=getattr(args, "key_name", CONSUMER.key_name),
                          job_secret=getattr(args, "job_secret", None),
                          attach_timeout_s=getattr(args, "attach_timeout", CONSUMER.attach_timeout_s),
                          credit_budget_mb=getattr(args, "credit_budget_mb", CONSUMER.credit_budget_mb))


def emit_json(target: str | None, data: object, what: str = "summary") -> None:
    """--json: to standard output for "-", else to the file (and say where)."""
    if not target:
        return
    text = json.dumps(data, indent=1)
    if target == "-":
        print(text, flush=True)
        return
    Path(target).write_text(text)
    print(f"{what} written to {target}")
