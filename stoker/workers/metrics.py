"""Worker metrics, aggregated across the daemon's processes (multi-process mode)."""

from __future__ import annotations

import glob
import os
from collections import Counter as Tally

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, multiprocess, start_http_server

from stoker.pipeline.cpu_clock import BatchCost
from stoker.protos.errors import ResourceError

IMAGE_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        """`registry`: the default one in a worker process (its multi-process files); a fresh one in tests."""
        r = registry
        self.samples = Counter("stoker_worker_samples", "Samples produced into sent batches", registry=r)
        self.batches = Counter("stoker_worker_batches", "Batches sent", registry=r)
        self.bytes_sent = Counter("stoker_worker_bytes_sent", "Tensor bytes sent", registry=r)
        self.decode_errors = Counter("stoker_worker_decode_errors", "Samples skipped as undecodable", registry=r)
        self.credit_wait = Counter("stoker_worker_credit_wait_seconds",
                                   "Time spent waiting for consumer credit (host ahead of accelerator)", registry=r)
        self.decode_seconds = Histogram("stoker_worker_decode_seconds", "JPEG decode time per image",
                                        buckets=IMAGE_BUCKETS, registry=r)
        self.decodes = Counter("stoker_worker_decodes", "Images decoded, by how (plain, spliced, whole, rejected, "
                               "pillow: see pipeline.images.augment.DECODE_PATHS)", ["path"], registry=r)
        self.augment_seconds = Histogram("stoker_worker_augment_seconds", "Crop/resize/flip time per image",
                                         buckets=IMAGE_BUCKETS, registry=r)
        self.sequences = Counter("stoker_worker_sequences", "Text: BERT examples (tokens: document pieces) sent",
                                 registry=r)
        self.tokens = Counter("stoker_worker_tokens", "Text: non-padding tokens sent", registry=r)
        self.token_slots = Counter("stoker_worker_token_slots",
                                   "Text: token slots one sequence per row would take (packing=before) and "
                                   "that were sent (packing=after); padding = 1 - tokens / slots", ["packing"],
                                   registry=r)
        self.example_seconds = Counter("stoker_worker_example_seconds",
                                       "Text: time making examples (pairs, truncation, masking)", registry=r)
        self.pack_seconds = Counter("stoker_worker_pack_seconds", "Text: time packing and writing rows", registry=r)
        self.lm_rows = Counter("stoker_worker_lm_rows", "Tokens: causal-LM rows of --lm-seq-len sent", registry=r)
        self.units = Counter("stoker_worker_units", "Work units completed", registry=r)
        self.sends_timed_out = Counter("stoker_worker_sends_timed_out", "Batches that could not be sent within the "
                                       "deadline because the rank's connection was gone (their units handed back)",
                                       registry=r)
        self.restarts = Counter("stoker_worker_process_restarts", "Worker processes restarted after a crash",
                                registry=r)
        self.short_of_tasks = Counter("stoker_worker_short_of_tasks", "Worker processes the host could not start, or "
                                      "that could not start a thread (a pids, process or thread limit, or memory): "
                                      "tried again after a back-off", registry=r)
        self.shard_fetches = Counter("stoker_worker_shard_fetches", "Shards fetched from object storage into this "
                                     "host's cache, by whether their bytes matched the manifest's sha256 (ok, "
                                     "mismatch)", ["result"], registry=r)
        self.shard_cache_damaged = Counter("stoker_worker_shard_cache_damaged", "Cached shard copies found not to "
                                           "match the manifest's sha256 when opened (fetched again)", registry=r)
        self.shard_cache_evictions = Counter("stoker_worker_shard_cache_evictions",
                                             "Cached shards removed to keep the cache under its limit", registry=r)
        self.shards_refused = Counter("stoker_worker_shards_refused", "Shards a worker process refused, their "
                                      "samples skipped, by what differs from the manifest (sha256, rows, schema) "
                                      "or unreadable", ["reason"], registry=r)
        self.processes = Gauge("stoker_worker_processes", "Live worker processes", multiprocess_mode="livesum",
                               registry=r)
        self.cpu_seconds = Counter("stoker_worker_cpu_seconds", "CPU seconds of the worker processes (every thread), "
                                   "counted as each batch is sent: what making the batches cost", registry=r)
        self.cpu_wait_seconds = Counter("stoker_worker_cpu_wait_seconds", "Seconds the worker processes were "
                                        "runnable but had no core (schedstat run delay: CPU taken by other "
                                        "processes or by a CPU quota)", registry=r)
        self.cpu_wait_measured = Gauge("stoker_worker_cpu_wait_measured", "1 where the kernel gives the worker "
                                       "processes' run delay (schedstat), 0 where the CPU wait is not measured",
                                       multiprocess_mode="min", registry=r)
        self.throttled_batches = Counter("stoker_worker_throttled_batches", "Batches made while the processes' "
                                         "cgroup CPU quota throttled them", registry=r)


    def count_cpu(self, cost: BatchCost) -> None:
        """One sent batch's cost (pipeline.cpu_clock)."""
        self.cpu_seconds.inc(cost.cpu_s)
        self.cpu_wait_measured.set(0 if cost.cpu_wait_s is None else 1)
        if cost.cpu_wait_s is not None:
            self.cpu_wait_seconds.inc(cost.cpu_wait_s)
        if cost.throttled:
            self.throttled_batches.inc()

    def count_shard_events(self, events: Tally[str]) -> None:
        """pipeline.store.open_shards' events (the shard cache's, and shards refused) as these metrics."""
        for event, count in events.items():
            if event == "fetched":
                self.shard_fetches.labels(result="ok").inc(count)
            elif event == "fetch_mismatch":
                self.shard_fetches.labels(result="mismatch").inc(count)
            elif event == "damaged":
                self.shard_cache_damaged.inc(count)
            elif event == "evicted":
                self.shard_cache_evictions.inc(count)
            elif event.startswith("refused:"):
                self.shards_refused.labels(reason=event.split(":", 1)[1]).inc(count)


class _SizedFilesCollector(multiprocess.MultiProcessCollector):
    """prometheus_client's multi-process collector, minus the files a starting process has made
    and not yet sized: a scrape in that instant would fail whole with a 500
    (prometheus/client_python#1199), and worker processes start whenever one is restarted."""

    def collect(self):
        sized = []
        for path in glob.glob(os.path.join(self._path, "*.db")):
            try:
                if os.path.getsize(path) >= 8:  # the used-bytes header and one aligned entry
                    sized.append(path)
            except FileNotFoundError:  # a dead process's live gauge, removed since the glob
                pass
        return self.merge(sized, accumulate=True)


def serve_multiprocess(port: int, addr: str, flag: str = "--metrics-port") -> int:
    """Serve the aggregate of every process's metrics files; returns the bound port. `flag`: the option
    the user set the port with, named when it is taken (`stoker run` calls it --worker-metrics-port)."""
    registry = CollectorRegistry()
    _SizedFilesCollector(registry)
    try:
        server, _ = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise ResourceError(f"cannot serve worker metrics on {addr}:{port}: {exc.strerror or exc} "
                      f"(pick another with {flag})") from exc
    return int(server.server_port)
