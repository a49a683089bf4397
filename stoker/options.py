"""The command line's grammar: option groups as parent parsers, each taken by exactly the commands
that honour it, and the functions that turn parsed options into the packages' configs.

| group | options | from | taken by |
|---|---|---|---|
| `JOB` | what to train on, how it is cut | `JobConfig`, `TextConfig`, `LMConfig` | run, train, dispatch |
| `ACCELERATOR` | what the consumer steps with | (`ConsumerConfig`) | run, train |
| `CONSUMER_SOCKETS` | the consumer's data socket and its senders | `ConsumerConfig` | run, train |
| `CONTROL_SOCKET` | the dispatcher's socket and its hosts | `ConsumerConfig` | run, train |
| `FLEET_SEAT` | a job's registration with a fleet: its weight and limits | `ConsumerConfig` | run, train |
| `consumer_metrics(...)` | the consumer's /metrics endpoint | (`ConsumerConfig`) | run, train |
| `SHARD_CACHE` | the size limit of a host's cache of remote shards | `WorkerConfig` | run |
| `OUTPUT` | the closing summary as JSON, the progress bar | | run, train |

`stoker dispatch` and `stoker worker` take the whole of `DispatchConfig` and `WorkerConfig`. An
option made from a config field (stoker.configured) has its name, default, help and check in
the field, written once. One spelling per option across commands; an old spelling stays
accepted for a while with a one-line deprecation message (`Deprecated`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from stoker.accel.backends.accelerators import AccelSpec
from stoker.accel.consumer_config import ConsumerConfig
from stoker.configured import add_options, config_of, fields_of, options_of, was_given
from stoker.flags import METRICS_PORT, POSITIVE, output_file, output_folder
from stoker.pipeline.images import fit as image_fit
from stoker.pipeline.images.augment import REFERENCE_AREA, TORCHVISION_AREA
from stoker.pipeline.images.layout import DecodeOn
from stoker.pipeline.job import DATASETS, JOB_DEFAULTS, JobConfig
from stoker.pipeline.kinds import IMAGENET, TOKENS, WIKIPEDIA, kind_of
from stoker.pipeline.store.files import write_atomically
from stoker.pipeline.store.shard_cache import LIMIT_ENV, parse_gb
from stoker.pipeline.text.examples import TextConfig
from stoker.pipeline.text.lm_layout import LMConfig
from stoker.protos.errors import ConfigError
from stoker.workers.worker_config import WorkerConfig


def _group(description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False, description=description)


def _job() -> argparse.ArgumentParser:
    """`JobConfig`'s and `TextConfig`'s options, and the three that the job resolves when it is made."""
    parent = _group("job")
    p = parent.add_argument_group("job: what to train on, and how it is cut and transformed")
    p.add_argument("--dataset", choices=DATASETS,
                   help="imagenet (ResNet-50 images), wikipedia (BERT pretraining text) or tokens (causal-LM "
                        "token streams); "
                        "default: what the manifest holds, else imagenet")
    add_options(p, JobConfig)
    p.add_argument("--crop-area", choices=("reference", "torchvision"), default="reference",
                   help="random-resized-crop area range: MLPerf reference 0.05-1.0 or torchvision 0.08-1.0")
    p.add_argument("--world-size", type=POSITIVE, default=None,
                   help="data-parallel ranks (default 1, or $WORLD_SIZE): one stream each, equal steps")
    add_options(parent.add_argument_group("job, wikipedia (BERT pretraining)"), TextConfig, noted=True)
    add_options(parent.add_argument_group("job, tokens (causal-LM token streams)"), LMConfig, noted=True)
    return parent


def _accelerator() -> argparse.ArgumentParser:
    parent = _group("accelerator")
    p = parent.add_argument_group("accelerator: what the consumer steps with")
    decided_later = ("kind", "rate", "profile", "scale", "lr", "optimizer")  # by the command (cli._accel_spec)
    add_options(p, AccelSpec, decided_later, defaults=dict.fromkeys(decided_later))
    add_options(p, AccelSpec, ("convert", "model", "device", "width", "label_smoothing", "precision"))
    add_options(p, ConsumerConfig, ("overlap", "decode_threads"))
    return parent


FREE = "tcp://127.0.0.1:0"  # `stoker run`'s sockets: its daemons are its own children, nobody else must find them


def consumer_sockets(free_ports: bool = False) -> argparse.ArgumentParser:
    """`free_ports`: the data socket defaults to a free port (a parent of its own: argparse shares a parent's
    options between the commands that take it, defaults and all)."""
    parent = _group("consumer sockets")
    p = parent.add_argument_group("consumer: its data socket and the worker processes sending to it")
    add_options(p, ConsumerConfig, ("data_bind", "credit_window", "sender_timeout_s"),
                defaults={"data_bind": FREE} if free_ports else None)
    return parent


def control_socket(free_ports: bool = False) -> argparse.ArgumentParser:
    parent = _group("control socket")
    p = parent.add_argument_group("control: the dispatcher's socket and the hosts that lease from it")
    add_options(p, ConsumerConfig, ("control_bind", "advertise_host", "host_timeout_s", "lease_timeout_s",
                                    "stall_report_s", "stall_timeout_s"),
                defaults={"control_bind": FREE} if free_ports else None)
    return parent


def _fleet_seat() -> argparse.ArgumentParser:
    parent = _group("fleet")
    p = parent.add_argument_group("fleet: a pool of worker hosts shared with other jobs (stoker fleet)")
    add_options(p, ConsumerConfig, ("seat",))  # --fleet, --weight, ...: the fleet seat's own options
    return parent


def consumer_metrics(port_help: str) -> argparse.ArgumentParser:
    """A consumer's /metrics: its port's default depends on its rank (`consumer_metrics_port`)."""
    parent = _group("metrics")
    p = parent.add_argument_group("metrics: the Prometheus endpoint")
    p.add_argument("--metrics-port", type=METRICS_PORT, default=None, help=port_help)
    add_options(p, ConsumerConfig, ("metrics_addr",))
    return parent


def _shard_cache() -> argparse.ArgumentParser:
    parent = _group("shard cache")
    p = parent.add_argument_group("shard cache: this host's copies of shards on object storage")
    add_options(p, WorkerConfig, ("shard_cache_gb",))  # what stoker run tells its worker daemons
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
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--record-steps", metavar="DIR", type=output_folder,
                   help="every rank records each step it takes in DIR (StepRecorder: a JSON line a step); "
                        "`stoker audit DIR` then says each epoch's samples delivered, duplicated and missing")
    return parent


def json_option(p, what: str) -> None:
    """`--json PATH` writes `what` there; `--json` alone (or `--json -`) prints it instead. A PATH whose folder
    is missing is refused now, not once the job that makes `what` has run."""
    p.add_argument("--json", metavar="PATH", nargs="?", const="-", type=output_file(dash_is_stdout=True),
                   help=f"write {what} as JSON to PATH (alone: to standard output)")


JOB, ACCELERATOR, CONSUMER_SOCKETS, CONTROL_SOCKET, SHARD_CACHE, OUTPUT, FLEET_SEAT = (
    _job(), _accelerator(), consumer_sockets(), control_socket(), _shard_cache(), _output(), _fleet_seat())


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


def job_fields(args: argparse.Namespace, rank: int | None = None) -> dict:
    """The job options as `JobConfig` keyword arguments (all but the manifest and the dataset);
    `rank`: --rank, None where the command has none."""
    lo, hi = REFERENCE_AREA if args.crop_area == "reference" else TORCHVISION_AREA
    return fields_of(JobConfig, args) | dict(min_area=lo, max_area=hi, text=config_of(TextConfig, args),
                                             lm=config_of(LMConfig, args), world_size=world_size(args, rank))


def image_fit_error(args: argparse.Namespace) -> str | None:
    """Why --image-size and --batch-size together make batches too big for a data message (None: they
    fit), at parse time. Checked for a job of decoded images: --dataset imagenet, or no --dataset and
    --image-size given (a text manifest ignores it); `JobConfig` checks every job again when it is made.
    Also with --decode-on accelerator: the consumer then makes batches of the same size itself."""
    if args.dataset is None and args.image_size == JOB_DEFAULTS["image_size"]:
        return None
    if args.dataset is not None and not kind_of(args.dataset).encoded_images:
        return None
    try:
        image_fit.check_images(args.batch_size, args.image_size)
    except ValueError as exc:
        return str(exc)
    return None


def transform_error(transform: str | None, transform_params: str, image_size: int = JOB_DEFAULTS["image_size"],
                    crop_area: str = "reference", decode_on: str = JOB_DEFAULTS["decode_on"]) -> str | None:
    """Why --transform / --transform-params cannot make a job (None: they can), at parse time: the
    name's form, the JSON, the built-ins' own flags, and the import of the transform here. Commands
    without the image flags (calibrate, sweep) leave them at their defaults; a `--transform` left out
    (None) is none."""
    if transform is None:
        return None
    from stoker.pipeline.job import BUILTIN_TRANSFORMS, outputs_problem
    from stoker.pipeline.transforms import TransformError, check_name, parse_params, resolve

    builtin = transform in BUILTIN_TRANSFORMS
    try:
        check_name(transform)
        params = parse_params(transform_params)
        if builtin and params:
            return f"argument --transform-params: the built-in {transform} transform takes --image-size " \
                   "(and train: --crop-area) instead"
        if builtin:
            return None
        given = [flag for flag, changed in (("--image-size", image_size != JOB_DEFAULTS["image_size"]),
                                            ("--crop-area", crop_area != "reference")) if changed]
        if given:
            return f"argument {given[0]}: sets the built-in train and eval transforms; give {transform} " \
                   "its own with --transform-params"
        if decode_on == DecodeOn.ACCELERATOR:
            return "argument --decode-on accelerator: ships the crop of the built-in train and eval transforms; " \
                   f"{transform} runs on the worker hosts"
        untravelled = outputs_problem(resolve(transform, params).outputs)
        if untravelled:
            return f"argument --transform: {transform}: {untravelled}"
    except TransformError as exc:
        return f"argument --transform: {exc}"
    return None


def job_config(args: argparse.Namespace, rank: int | None = None, manifest_uri: str | None = None) -> JobConfig:
    """The job the options describe, its transform pinned (imported) here, where it is made; `manifest_uri`:
    the manifest the command resolved itself (`stoker run`'s default set), else --data."""
    kind = dataset(args, args.data)
    unused = row_flags_unused(args, kind)
    if unused:
        raise ConfigError(unused)
    return JobConfig(manifest_uri=manifest_uri or args.data, dataset=kind, **job_fields(args, rank)).pin()


def row_flags_unused(args: argparse.Namespace, kind: str) -> str | None:
    """A text job's row flag for the other text kind would be ignored without a word: --lm-seq-len and --lm-mode
    make a tokens job's rows, --seq-len, --pack and BERT's masking flags a wikipedia job's. Any of them given on
    the command line (its default value included) is refused, naming it. An image job ignores the text flags,
    as a text job does the image ones."""
    other = {TOKENS.name: TextConfig, WIKIPEDIA.name: LMConfig}.get(kind)
    if other is None:
        return None
    given = [o.flag for o in options_of(other) if was_given(args, o.dest)]
    if not given:
        return None
    return (f"{', '.join(given)}: the rows of another kind of job; this is a {kind} job (--lm-seq-len and --lm-mode "
            "are a tokens job's; --seq-len, --pack and the masking flags a wikipedia job's)")


def world_size(args: argparse.Namespace, rank: int | None) -> int:
    from stoker.accel.ranks import place

    return place(rank, args.world_size, None).world_size


def dataset(args: argparse.Namespace, manifest_uri: str | None) -> str:
    """--dataset, else what the manifest holds, else imagenet."""
    if args.dataset:
        return args.dataset
    if manifest_uri:
        from stoker.pipeline.store.shards import Manifest

        return Manifest.load(manifest_uri).kind
    return IMAGENET.name


def consumer_metrics_port(args: argparse.Namespace, rank: int | None) -> int | None:
    """--metrics-port, else the port of this rank (`rank`: --rank, None for `stoker run`'s rank 0)."""
    from stoker.accel.consumer_config import rank_metrics_port

    if args.metrics_port is None:
        return rank_metrics_port(rank or int(os.environ.get("LOCAL_RANK") or 0))
    return None if args.metrics_port < 0 else args.metrics_port


def consumer_config(args: argparse.Namespace, rank: int | None = None) -> ConsumerConfig:
    """The consumer's options this command takes; the rest are `ConsumerConfig`'s defaults."""
    return config_of(ConsumerConfig, args, metrics_port=consumer_metrics_port(args, rank))


def emit_json(target: str | None, data: object, what: str = "summary") -> None:
    """--json: to standard output for "-", else to the file (and say where)."""
    if not target:
        return
    text = json.dumps(data, indent=1)
    if target == "-":
        print(text, flush=True)
        return
    write_atomically(target, text, what, "pass --json elsewhere")  # a full disk: one line, the old file kept
    print(f"{what} written to {target}")
