"""`stoker calibrate`: what one host core supplies, measured here in under a minute, in CPU time.

One process pinned to one core makes batches with a worker's own source (workers.sources: the
same reads, decode, transform, headers and metrics): images through the built-in MLPerf train
crop at 224 px by default, or the transform `--transform` names, and BERT examples at length 512
(one sequence per row, as the profiles' BERT rates count them, and packed). Each batch is framed
and sent over a CURVE connection to a sink process on another core, as a worker sends it
(stoker.wire_cost): the framing, the encryption and the kernel's TCP work are a worker's CPU
too. What it leaves out is the worker's lease loop (leases, credit, waits), a few percent of a
text worker (docs/ratio.md). A token set's tokens job is measured in tokens (its shards read again
each epoch; an online set's text tokenized in the workers), and its tokenizer alone beside it (`tokenize`).
`stoker plan` turns these per-core rates into cores, hosts, time-to-train and cost.

The file keeps one image rate per transform, with its name, parameters and version, because a
team's own augmentation can cost several times the built-in crop: `stoker plan --transform X`
plans with X's rate. A measurement replaces only its own entries, so one file collects them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from stoker.machine import machine_kind
from stoker.pipeline.cpu_clock import CpuAccount, stage_clock
from stoker.pipeline.job import JOB_DEFAULTS, JobConfig
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text import text_shards, token_cost
from stoker.pipeline.text.examples import TextConfig
from stoker.pipeline.text.lm_layout import LMConfig
from stoker.pipeline.transforms import parse_params, resolve
from stoker.planning import transform_key
from stoker.protos.errors import ConfigError, ResourceError
from stoker.wire_cost import WireSink
from stoker.workers.metrics import WorkerMetrics
from stoker.workers.sources import Outgoing, make_source

BATCH = 64
EPOCHS = 1_000_000  # of a job whose batches are timed for some seconds: more than any time box reaches
SENT = "framed and sent over CURVE, "  # what a rate measured with the wire says it counts
PACKED = "wikipedia_packed"  # the calibration's entry for BERT with --pack (`stoker plan --pack`)
TOKENS = "tokens"  # the entry of a token-stream job: shards read and packed (`stoker plan --dataset tokens`)
TOKENIZE = "tokenize"  # the tokenizer alone, on the same documents: what online tokenizing costs
TOKENS_LM = LMConfig()  # the rows a token-stream calibration packs: `stoker run`'s defaults
DEFAULT_TRANSFORM = "train"  # what `stoker run` runs by default: MLPerf's random-resized crop + flip at 224 px


def _timed(batches, seconds: float, count) -> float:
    """Rate of `count(batch)` per CPU-second of this process over `seconds` of CPU time (the first
    batch is warm-up). CPU time, as the workers count their cost: other work on the host slows the
    clock, not the CPU a batch takes, so the rate is the transform's and not the neighbours'."""
    started, made = None, 0
    for batch in batches:
        if started is None:
            started = stage_clock()
            continue
        made += count(batch)
        if stage_clock() - started >= seconds:
            break
    if not made or started is None:  # (made counts only after started is set)
        raise ConfigError("the data set is too small to calibrate on (fewer than two batches)")
    return made / (stage_clock() - started)


def _worker_batches(manifest: Manifest, job: JobConfig, sink: WireSink | None) -> Iterator[Outgoing]:
    """The batches a worker process makes of `job` (its own source, workers.sources), each framed and
    sent to `sink` as the worker sends it, its CPU taken and its metrics counted as there: one way
    to make a batch, so that the calibration costs what a worker costs. As many epochs as asked for."""
    source = make_source(manifest, job)
    plan = job.plan(manifest)
    metrics = WorkerMetrics(CollectorRegistry())
    account = CpuAccount()
    try:
        for epoch in range(job.epochs):
            for unit in plan.units(epoch):
                for batch in source.batches(unit):
                    if sink is not None:
                        sink.send(batch.header, batch.tensors)
                    account.take()
                    batch.observe(metrics)
                    yield batch
    finally:
        account.close()


def _job(manifest: Manifest, **fields) -> JobConfig:
    """A job as `stoker run` would make it, with batches of BATCH and epochs enough for any time box."""
    return JobConfig(manifest_uri=manifest.uri, batch_size=BATCH, epochs=EPOCHS, **fields).pin()


def imagenet_job(manifest: Manifest, transform: str = DEFAULT_TRANSFORM, params: str = "") -> JobConfig:
    """The job an image calibration times: `transform` (a name as `--transform` takes it) at `stoker run`'s defaults."""
    return _job(manifest, transform=transform, transform_params=params,
                transform_timeout_s=JOB_DEFAULTS["transform_timeout_s"])


def wikipedia_job(manifest: Manifest, seq_len: int = 512, pack: bool = False) -> JobConfig:
    """The job a BERT calibration times: sequences of `seq_len`, packed or one per row."""
    return _job(manifest, dataset="wikipedia", text=TextConfig(seq_len=seq_len, pack=pack))


def images_in(batch: Outgoing) -> int:
    """What an image calibration counts of a batch."""
    return len(batch.header.sample_ids)


def sequences_in(batch: Outgoing) -> int:
    """What a BERT calibration counts of a batch: sequences, however many a row packs."""
    return batch.header.text.sequences


@contextlib.contextmanager
def sent_batches(manifest: Manifest, job: JobConfig, wire: bool = True) -> Iterator[Iterator[Outgoing]]:
    """The stream of batches a calibration times, each made, framed and sent (`wire`) as a worker does:
    for a measurement of its own over the same work (tests/integration/test_cpu_time.py)."""
    with _wire(wire) as sink:
        yield _worker_batches(manifest, job, sink)


def imagenet_rate(manifest: Manifest, seconds: float, transform: str = DEFAULT_TRANSFORM, params: str = "",
                  wire: bool = True) -> float:
    """Images per CPU-second of `transform` (a name as `--transform` takes it) on the calling core;
    `wire`: each batch also framed and sent over CURVE as a worker sends it (stoker.wire_cost)."""
    with sent_batches(manifest, imagenet_job(manifest, transform, params), wire) as batches:
        return _timed(batches, seconds, images_in)


@contextlib.contextmanager
def _wire(wire: bool) -> Iterator[WireSink | None]:
    """A sink for the batches to be sent to, on another core than the calling one; None without `wire`."""
    if not wire:
        yield None
        return
    with WireSink(core=min(os.sched_getaffinity(0))) as sink:
        yield sink


def wikipedia_rate(manifest: Manifest, seconds: float, seq_len: int = 512, pack: bool = False,
                   wire: bool = True) -> float:
    """BERT sequences per CPU-second at `seq_len` (one per row, as the profiles count them; `pack`: packed)."""
    return wikipedia_entry(manifest, seconds, seq_len, pack, wire)["per_core_rate"]


def wikipedia_entry(manifest: Manifest, seconds: float, seq_len: int = 512, pack: bool = False,
                    wire: bool = True) -> dict:
    """wikipedia_rate's figure with what it measured and the sequences a row carried (1 unpacked): the
    plan counts sequences, a device steps rows."""
    made = {"rows": 0, "sequences": 0}

    def count(batch: Outgoing) -> int:
        made["rows"] += batch.header.rows
        made["sequences"] += sequences_in(batch)
        return sequences_in(batch)

    with sent_batches(manifest, wikipedia_job(manifest, seq_len, pack), wire) as batches:
        rate = _timed(batches, seconds, count)
    packing = "packed" if pack else "one sequence per row"
    return {"per_core_rate": rate, "unit": "sequences per CPU-second", "clock": "cpu",
            "sequences_per_row": made["sequences"] / max(made["rows"], 1),
            "what": f"BERT examples at length {seq_len}, {packing}, {SENT if wire else ''}one core"}


def tokens_job(manifest: Manifest, lm: LMConfig = TOKENS_LM) -> JobConfig:
    """The job a token-stream calibration times: causal-LM rows of `lm` from the set's token shards."""
    return _job(manifest, dataset=TOKENS, lm=lm)


def _read_every_epoch(manifest: Manifest, job: JobConfig, sink: WireSink | None) -> Iterator[Outgoing]:
    """A tokens job's batches, each epoch from a new source that reads its shards again: a worker keeps the
    token shards it read, so without this only the first epoch would pay for reading them, while a corpus
    larger than a worker's memory is read once an epoch."""
    one = replace(job, epochs=1)
    while True:
        yield from _worker_batches(manifest, one, sink)


def tokens_entry(manifest: Manifest, seconds: float, lm: LMConfig = TOKENS_LM, wire: bool = True) -> dict:
    """Tokens per CPU-second of a worker's own tokens job (its shards read whole and checked, causal-LM rows
    packed, each batch framed and sent), with the bytes a job reads per token of these shards."""
    made = {"tokens": 0, "slots": 0}

    def count(batch: Outgoing) -> int:
        made["tokens"] += batch.header.text.real_tokens
        made["slots"] += batch.header.text.token_slots
        return batch.header.text.real_tokens

    with _wire(wire) as sink:
        rate = _timed(_read_every_epoch(manifest, tokens_job(manifest, lm), sink), seconds, count)
    per_token = token_cost.bytes_per_token(manifest)
    return {"per_core_rate": rate, "unit": "tokens per CPU-second", "clock": "cpu", "seq_len": lm.seq_len,
            "mode": lm.mode, "bytes_per_token": per_token, "parquet_over_int32": per_token / token_cost.INT32_BYTES,
            "fill": made["tokens"] / max(made["slots"], 1), "data": manifest.uri,
            "online": text_shards.is_online(manifest),  # the workers tokenize: stoker plan adds no tokenizer
            "what": f"{_read_how(manifest)} and packed into causal-LM rows of {lm.seq_len} ({lm.mode}), "
                    f"{SENT if wire else ''}one core"}


def _read_how(manifest: Manifest) -> str:
    """What a worker does to a shard of this set before packing: reads tokens, or tokenizes text per unit."""
    if text_shards.is_online(manifest):
        return "text shards read whole and tokenized online, a unit at a time"
    return "token shards read whole"


def tokenize_entry(manifest: Manifest, seconds: float) -> dict:
    """The set's tokenizer alone, encoding the set's documents: tokens per CPU-second of a tokenize step."""
    tok = token_cost.manifest_tokenizer(manifest)
    rate, _ = token_cost.tokenize_rate(tok, token_cost.manifest_texts(manifest, tok), seconds)
    return {"per_core_rate": rate, "unit": "tokens per CPU-second", "clock": "cpu", "tokenizer": tok.name,
            "fingerprint": tok.fingerprint, "data": manifest.uri,
            "what": f"tokenize only (not a job's rate): {tok.name} encoding the set's documents in batches of "
                    f"{token_cost.TOKENIZE_BATCH}, one core; a tokens job of token shards skips this step, one of "
                    "an online set (`stoker prepare tokens --online`) takes it in its workers"}


def transform_entry(manifest: str, seconds: float, transform: str = DEFAULT_TRANSFORM, params: str = "") -> dict:
    """One transform's rate on one core, with what names it: name, parameters, version, data, when."""
    params = parse_params(params)
    resolved = resolve(transform, params)
    rate = imagenet_rate(Manifest.load(manifest), seconds, transform, params)
    first = next(iter(resolved.transform.outputs.values()))
    decoded = "decode + " if resolved.transform.takes != "bytes" else ""
    what = f"{decoded}{transform_key(transform, params)} to {first.dtype}{list(first.shape)}, {SENT}one core"
    return {"per_core_rate": rate, "unit": "images per CPU-second", "clock": "cpu", "what": what,
            "transform": transform, "params": params, "version": resolved.version, "data": manifest,
            "machine": machine_kind(), "when": time.strftime("%Y-%m-%d %H:%M"), "seconds": seconds}


def _pinned(measure):
    """Run `measure()` on one core of this process's set, then give the set back."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        return measure()
    finally:
        os.sched_setaffinity(0, before)


def load(path: Path) -> dict:
    """A calibration file, or an empty one where there is none yet; ValueError naming the file when it
    cannot be read or is not a calibration (a JSON object)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it as a calibration ({exc.__class__.__name__}: {exc})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not a calibration (not JSON: {exc}); run `stoker calibrate` again") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a calibration (a JSON object of rates, not {type(data).__name__}); "
                         "run `stoker calibrate` again")
    return data


def checked_rate(entry: object, name: str, where: str) -> float:
    """An entry's per_core_rate, a finite positive number; ValueError naming the file and entry otherwise."""
    rate = entry.get("per_core_rate") if isinstance(entry, dict) else None
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
        raise ConfigError(f"{where}: {name}'s per_core_rate is {rate!r}, not a positive number; run `stoker "
                         "calibrate` again, or pass --per-core-rate")
    clock = entry.get("clock", "wall") if isinstance(entry, dict) else None
    if clock not in ("cpu", "wall"):  # absent: written before rates were CPU time
        raise ConfigError(f"{where}: {name}'s clock is {clock!r}, neither \"cpu\" (CPU time) nor absent (an older "
                         "wall-clock rate); run `stoker calibrate` again, or pass --per-core-rate")
    return float(rate)


def _write(out: Path | None, result: dict) -> None:
    """Whole or not at all: a new file beside `out`, then renamed over it (a crash leaves the old one)."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=out.parent, prefix=f".{out.name}.", delete=False) as f:
        f.write(json.dumps(result, indent=1))
    os.replace(f.name, out)


def writable(out: Path | None) -> dict:
    """What `out` holds now (load), once it is known that it can be written: minutes of measuring
    must not end in "permission denied". OSError naming the file otherwise."""
    if out is None:
        return {}
    kept = load(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.is_dir():
            raise IsADirectoryError(21, "it is a folder")
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}."):
            pass  # the folder takes a new file: what _write renames over out
    except FileExistsError:
        raise ResourceError(f"cannot write the calibration to {out}: a file stands where its folder should be") \
            from None
    except OSError as exc:
        raise ResourceError(f"cannot write the calibration to {out}: {exc.strerror or exc}") from None
    return kept


def calibrate(imagenet: str, wikipedia: str, seconds: float = 15.0, out: Path | None = None,
              tokens: str | None = None) -> dict:
    """Per-core rates for the datasets (images through the built-in train transform; with `tokens`, a token
    set's manifest, its tokens job and tokenizer too) on one pinned core; written to `out` as JSON, keeping
    the rates of other transforms already in it."""
    def measure() -> dict:
        train = transform_entry(imagenet, seconds)
        text = Manifest.load(wikipedia)
        return {"imagenet": {**train, "what": f"decode + random resized crop + flip to 224 px, {SENT}one core"},
                "wikipedia": wikipedia_entry(text, seconds), PACKED: wikipedia_entry(text, seconds, pack=True),
                **(_token_entries(tokens, seconds) if tokens else {})}

    result = writable(out)
    measured = _pinned(measure)
    result |= measured | {"machine": machine_kind(), "when": time.strftime("%Y-%m-%d %H:%M"), "seconds_each": seconds}
    result["transforms"] = {**result.get("transforms", {}), DEFAULT_TRANSFORM: measured["imagenet"]}
    _write(out, result)
    return result


def _token_entries(manifest: str, seconds: float) -> dict:
    tokens = Manifest.load(manifest)
    return {TOKENS: tokens_entry(tokens, seconds), TOKENIZE: tokenize_entry(tokens, seconds)}


def calibrate_tokens(manifest: str, seconds: float = 15.0, out: Path | None = None) -> dict:
    """A token set's tokens job and its tokenizer alone, each on one pinned core, added to `out` (those two
    entries replaced, the rest kept): what `stoker plan --dataset tokens` reads."""
    result = writable(out)
    measured = _pinned(lambda: _token_entries(manifest, seconds))
    stamp = {"machine": machine_kind(), "when": time.strftime("%Y-%m-%d %H:%M"), "seconds": seconds}
    result |= {name: {**entry, **stamp} for name, entry in measured.items()}
    _write(out, result)
    return result


def calibrate_transform(imagenet: str, transform: str, params: str = "", seconds: float = 15.0,
                        out: Path | None = None) -> dict:
    """One transform's per-core rate on one pinned core, added to `out` (its entry replaced, the rest kept)."""
    result = writable(out)
    entry = _pinned(lambda: transform_entry(imagenet, seconds, transform, params))
    result["transforms"] = {**result.get("transforms", {}), transform_key(transform, params): entry}
    _write(out, result)
    return entry


def rate_text(entry: dict) -> str:
    """An entry's per-core rate in words; one written before rates were CPU time says it is wall clock."""
    if entry.get("clock") == "cpu":
        return f"{entry['per_core_rate']:,.0f} {entry['unit']}"
    return (f"{entry['per_core_rate']:,.0f} {entry.get('unit', 'images/s')} per core (wall clock: measured before "
            f"`stoker calibrate` counted CPU time; calibrate again for a figure other work on the host does not move)")


def calibration_notes(entry: dict, calibration: dict, where: str) -> list[str]:
    """What a plan from this entry should say about it: a rate measured on another machine kind (its
    cores may be faster or slower than these), or by the wall clock (it measured the neighbours too)."""
    notes = []
    machine = entry.get("machine") or calibration.get("machine")
    if machine and machine == platform.machine():
        notes.append(f"{where} names the machine it was measured on only by its architecture ({machine}), not its "
                     f"CPU: calibrate again on a worker host of the kind you plan for to record it")
    elif machine and machine != machine_kind():
        notes.append(f"{where} was measured on {machine}, not on this machine ({machine_kind()}): its per-core rate "
                     f"is that machine's; calibrate on a worker host of the kind you plan for")
    if entry.get("clock", "wall") == "wall":
        notes.append(f"{where}'s rate {entry['per_core_rate']:,.0f} is by the wall clock (measured before `stoker "
                     f"calibrate` counted CPU time): other work on that host moved it; calibrate again")
    return notes


def transform_rate(calibration: dict, transform: str, params: str = "", where: str = "the calibration") -> dict:
    """The entry of `transform` in a calibration; ValueError saying how to measure it when there is none."""
    key = transform_key(transform, params)
    kept = calibration.get("transforms", {})
    found = kept.get(key) if isinstance(kept, dict) else None
    if found is None and key == DEFAULT_TRANSFORM and "imagenet" in calibration:
        found = calibration["imagenet"]  # written before rates were kept per transform: the train crop at 224
    if found is None:
        known = ", ".join(sorted(kept)) if isinstance(kept, dict) and kept else "none"
        given = f" --transform-params '{parse_params(params)}'" if parse_params(params) else ""
        command = "stoker calibrate" if key == DEFAULT_TRANSFORM else f"stoker calibrate --transform {transform}{given}"
        raise ConfigError(f"{where} has no rate for transform {key} (it has: {known}); measure one on a worker host "
                         f"with `{command}`, or pass --per-core-rate")
    return found
