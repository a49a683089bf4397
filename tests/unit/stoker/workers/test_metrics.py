"""stoker/workers/metrics.py: shard events as counters, a scrape that survives a starting process, a clear port
error."""

from __future__ import annotations

import socket
import struct
from collections import Counter as Tally

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from stoker.workers.metrics import WorkerMetrics, _SizedFilesCollector, serve_multiprocess


def test_shard_events_become_their_counters():
    registry = CollectorRegistry()
    WorkerMetrics(registry).count_shard_events(Tally({"fetched": 3, "fetch_mismatch": 1, "damaged": 2, "evicted": 4,
                                                      "refused:sha256": 1, "refused:rows": 2, "hit": 9}))
    value = registry.get_sample_value
    assert value("stoker_worker_shard_fetches_total", {"result": "ok"}) == 3
    assert value("stoker_worker_shard_fetches_total", {"result": "mismatch"}) == 1
    assert value("stoker_worker_shard_cache_damaged_total") == 2
    assert value("stoker_worker_shard_cache_evictions_total") == 4
    assert value("stoker_worker_shards_refused_total", {"reason": "sha256"}) == 1
    assert value("stoker_worker_shards_refused_total", {"reason": "rows"}) == 2


def test_a_scrape_skips_the_file_a_starting_process_has_not_sized_yet(tmp_path):
    written = MmapedDict(str(tmp_path / "counter_100.db"))
    written.write_value(mmap_key("stoker_worker_batches", "stoker_worker_batches_total", [], [], "Batches sent"), 7.0,
                        0.0)
    written.close()
    (tmp_path / "counter_101.db").touch()  # made by a process this instant, not yet sized
    with pytest.raises(struct.error):  # what prometheus_client's own collector does with it: the whole scrape fails
        list(MultiProcessCollector(None, path=str(tmp_path)).collect())
    samples = {s.name: s.value for m in _SizedFilesCollector(None, path=str(tmp_path)).collect() for s in m.samples}
    assert samples == {"stoker_worker_batches_total": 7.0}


def test_a_taken_port_names_the_flag_to_change(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve worker metrics on 127.0.0.1:{port}.*--worker-metrics-port"):
            serve_multiprocess(port, "127.0.0.1", flag="--worker-metrics-port")
