"""Per-core rate from shards on S3 against the same shards on local disk.

The default 2,000-image set is uploaded to a real S3-protocol server (moto's standalone
server, on loopback, core 1), then one `stoker worker` process on core 0 feeds a null
consumer (core 1) one epoch: (a) from the local shards, (b) from s3:// with an empty shard
cache (the host fetches each shard once, then maps its copy), (c) from s3:// with the cache
warm. Runs alternate; medians of 3 go to benchmarks/results/object_storage.{json,md}.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import free_port, run_with_worker
from benchmarks.report import header, write_results
from stoker.accel.consumer import Consumer, ConsumerConfig
from stoker.datasets import default_imagenet
from stoker.pipeline.job import JobConfig
from stoker.pipeline.store.storage import upload_folder

WORKER_CORE, SERVER_CORE = "0", "1"
BUCKET = "bench"


def _epoch(manifest: str) -> float:
    cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=None)
    consumer = Consumer(cfg, JobConfig(manifest_uri=manifest, epochs=1))
    summary = run_with_worker(consumer, WORKER_CORE)
    assert summary.unique_samples == summary.samples == consumer.manifest.num_samples
    return summary.delivered_samples_per_s


def _start_server() -> tuple[subprocess.Popen, str]:
    port = free_port()
    server = subprocess.Popen(["taskset", "-c", SERVER_CORE, str(Path(sys.executable).with_name("moto_server")),
                               "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", access_key="bench",
                           secret_key="bench", region="us-east-1", allow_bucket_creation=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            fs.create_dir(BUCKET)
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline:
                server.kill()
                raise SystemExit("moto_server did not start (pip install 'moto[server]')") from None
            time.sleep(0.2)


def main(repeats: int = 3) -> dict:
    local = default_imagenet()
    server, endpoint = _start_server()
    cache = Path(tempfile.mkdtemp(prefix="stoker-bench-cache-"))
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1",
                      AWS_ENDPOINT_URL=endpoint, STOKER_SHARD_CACHE=str(cache))
    try:
        upload_folder(local.parent, f"s3://{BUCKET}/synth")
        remote = f"s3://{BUCKET}/synth/manifest.json"
        for path in local.parent.glob("*.arrow"):  # the local contender reads from a warm page cache too
            path.read_bytes()
        rows: dict[str, list[float]] = {"local": [], "s3_cold": [], "s3_warm": []}
        for i in range(repeats):
            rows["local"].append(_epoch(str(local)))
            shutil.rmtree(cache, ignore_errors=True)
            rows["s3_cold"].append(_epoch(remote))
            rows["s3_warm"].append(_epoch(remote))
            print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.0f} img/s" for k, v in rows.items()), flush=True)
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(cache, ignore_errors=True)
    medians = {k: statistics.median(v) for k, v in rows.items()}
    result = {**header("object_storage", "moto"), "images_per_s": rows, "medians": medians}
    table = ("| one worker process on core 0, null consumer, one epoch of 2,000 images | images/s, median of "
             f"{repeats} | vs local |\n|---|---|---|\n"
             f"| (a) local shards (memory-mapped) | {medians['local']:.0f} | 1.00 |\n"
             f"| (b) s3:// (moto on loopback), empty shard cache | {medians['s3_cold']:.0f} | "
             f"{medians['s3_cold'] / medians['local']:.2f} |\n"
             f"| (c) s3://, shard cache warm | {medians['s3_warm']:.0f} | "
             f"{medians['s3_warm'] / medians['local']:.2f} |\n")
    write_results("object_storage", result, table)
    print(table)
    return result


if __name__ == "__main__":
    main()
