"""BERT example creation + masking + packing on one core, on the real Wikipedia text.

(a) in-process: every work unit of one epoch of the default corpus (10,033 lead sections,
    256 documents a unit) through `TextUnitSource`, pinned to core 0, for sequence lengths
    128 and 512, unpacked and packed (and whole-word masking). Sequences/s per core, tokens/s,
    and the padding share of the token slots one sequence per row vs as packed.
(b) through the service: one `stoker worker` process pinned to core 0 sending to a null
    consumer on core 1, at length 512 packed, 3 epochs, sequences/s after the first batch,
    as a ratio to (a) for the same config.
(c) sensitivity: (a) at 512 packed again with a busy process pinned to the same core, and with
    one on the other core. A neighbour on the pinned core halves the figure; each run records
    how much of its core went elsewhere (`CoreWatch`), so a halved figure explains itself.
Medians of `repeats` runs; results go to benchmarks/results/text.{json,md}.
Targets: >= 5,000 sequences/s per core at length 512; packing removes >= 80% of padding.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict

from benchmarks.common import run_with_worker
from benchmarks.report import CoreWatch, header, write_results
from stoker.accel.consumer import Consumer, ConsumerConfig
from stoker.datasets import default_wikipedia
from stoker.pipeline.job import JobConfig
from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.batching import TextUnitSource, unit_text_batches
from stoker.pipeline.text.docs import read_doc_shard
from stoker.pipeline.text.examples import Specials, TextConfig
from stoker.pipeline.text.vocab import Vocab

WORKER_CORE, CONSUMER_CORE = 0, 1
UNIT_DOCS = 256
BATCH = 64
SERVICE_EPOCHS = 3

CONFIGS = {
    "128 unpacked": TextConfig(seq_len=128),
    "128 packed (3/row)": TextConfig(seq_len=128, pack=True),
    "128 packed, whole-word": TextConfig(seq_len=128, pack=True, whole_word_mask=True),
    "512 unpacked": TextConfig(seq_len=512),
    "512 packed (3/row)": TextConfig(seq_len=512, pack=True),
    "512 packed (6/row)": TextConfig(seq_len=512, pack=True, pack_max_sequences=6),
    "512 packed, whole-word": TextConfig(seq_len=512, pack=True, whole_word_mask=True),
}


def in_process(manifest: Manifest, cfg: TextConfig) -> dict:
    vocab = Vocab.load(manifest.relative_uri(manifest.vocab))
    specials = Specials.of(vocab)
    sources = [TextUnitSource(read_doc_shard(manifest.shard_uri(i), manifest.shards[i], vocab.size), cfg, specials, 0)
               for i in range(len(manifest.shards))]
    units = EpochPlan(manifest, UNIT_DOCS, 1, 0).units(0)
    sequences = real = slots = unpacked = 0
    with CoreWatch(WORKER_CORE) as core:
        started = time.perf_counter()
        for unit in units:
            for batch in unit_text_batches(sources.__getitem__, unit, cfg, 0, BATCH):
                sequences += batch.sequences
                real += batch.real_tokens
                slots += batch.token_slots
                unpacked += batch.unpacked_slots
        elapsed = time.perf_counter() - started
    return {"sequences_per_s": sequences / elapsed, "tokens_per_s": real / elapsed, "sequences": sequences,
            "core": core.as_dict(),
            "padding_unpacked": 1 - real / unpacked, "padding_sent": 1 - real / slots,
            "padding_removed": 1 - (slots - real) / (unpacked - real)}


def through_service(manifest_uri: str, cfg: TextConfig) -> float:
    consumer_cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=0)
    job = JobConfig(manifest_uri=manifest_uri, dataset="wikipedia", batch_size=BATCH, text=cfg, epochs=SERVICE_EPOCHS)
    summary = run_with_worker(Consumer(consumer_cfg, job), str(WORKER_CORE))
    consumer_docs = Manifest.load(manifest_uri).num_samples
    assert summary.per_epoch_unique == [consumer_docs] * SERVICE_EPOCHS
    return summary.sequences_per_s  # after the first batch: process start-up is not example making


@contextlib.contextmanager
def busy_neighbour(core: int) -> Iterator[None]:
    """A process spinning on `core` for the duration, as a suite or a build sharing the machine would."""
    spin = f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.3)
        yield
    finally:
        spinner.kill()
        spinner.wait()


def sensitivity(manifest: Manifest, repeats: int) -> dict[str, dict]:
    cfg = CONFIGS["512 packed (3/row)"]
    found = {}
    for where, core in (("a busy process on the same core", WORKER_CORE), ("a busy process on the other core",
                                                                            CONSUMER_CORE)):
        with busy_neighbour(core):
            runs = [in_process(manifest, cfg) for _ in range(repeats)]
        found[where] = {"sequences_per_s": statistics.median(r["sequences_per_s"] for r in runs),
                        "others_share": statistics.median(r["core"]["others_share"] for r in runs)}
        print(f"512 packed (3/row), {where}: {found[where]['sequences_per_s']:.0f} sequences/s", flush=True)
    return found


def main(repeats: int = 3) -> dict:
    manifest_uri = str(default_wikipedia())
    manifest = Manifest.load(manifest_uri)
    two_cores = len(os.sched_getaffinity(0)) >= 2
    os.sched_setaffinity(0, {WORKER_CORE})
    rows = {}
    for name, cfg in CONFIGS.items():
        runs = [in_process(manifest, cfg) for _ in range(repeats)]
        best = dict(runs[0])
        best["sequences_per_s"] = statistics.median(r["sequences_per_s"] for r in runs)
        best["tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in runs)
        best["runs_sequences_per_s"] = [r["sequences_per_s"] for r in runs]
        best["core"] = {key: max(r["core"][key] for r in runs) for key in ("others_share", "steal_share")}
        rows[name] = best
        print(f"{name}: {best['sequences_per_s']:.0f} sequences/s, padding {best['padding_unpacked']:.3f} -> "
              f"{best['padding_sent']:.3f}", flush=True)
    service = None
    if two_cores:
        os.sched_setaffinity(0, {CONSUMER_CORE})
        service_cfg = CONFIGS["512 packed (3/row)"]
        runs = [through_service(manifest_uri, service_cfg) for _ in range(repeats)]
        service = {"config": "512 packed (3/row)", "sequences_per_s": statistics.median(runs), "runs": runs,
                   "ratio_to_in_process": statistics.median(runs) / rows["512 packed (3/row)"]["sequences_per_s"]}
        print(f"through the service: {service['sequences_per_s']:.0f} sequences/s", flush=True)
        os.sched_setaffinity(0, {WORKER_CORE})
    neighbours = sensitivity(manifest, repeats) if two_cores else {}
    result = {
        **header("text", "tokenizers"),
        "documents": manifest.num_samples, "unit_documents": UNIT_DOCS, "batch_rows": BATCH, "repeats": repeats,
        "configs": {name: asdict(cfg) for name, cfg in CONFIGS.items()},
        "in_process": rows, "service": service, "sensitivity": neighbours,
    }
    table = (f"| one core, {manifest.num_samples} real lead sections, median of {repeats} | sequences/s | tokens/s "
             "| padding, 1 per row | padding, as sent | padding removed |\n|---|---|---|---|---|---|\n")
    for name, r in rows.items():
        table += (f"| {name} | {r['sequences_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | "
                  f"{100 * r['padding_unpacked']:.1f}% | {100 * r['padding_sent']:.1f}% | "
                  f"{100 * r['padding_removed']:.1f}% |\n")
    if service:
        table += (f"| 512 packed (3/row) through `stoker worker` -> ZeroMQ -> null consumer | "
                  f"{service['sequences_per_s']:,.0f} ({service['ratio_to_in_process']:.2f}x in-process) | | | | |\n")
    for where, r in neighbours.items():
        share = r["sequences_per_s"] / rows["512 packed (3/row)"]["sequences_per_s"]
        table += (f"| 512 packed (3/row), {where} ({100 * r['others_share']:.0f}% of core {WORKER_CORE} to others) | "
                  f"{r['sequences_per_s']:,.0f} ({share:.2f}x alone) | | | | |\n")
    write_results("text", result, table)
    print(table)
    return result
