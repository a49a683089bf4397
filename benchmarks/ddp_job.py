"""The lock-step training job the data-parallel benchmark runs under torchrun (gloo on the CPU).

    torchrun --nproc-per-node N benchmarks/ddp_job.py MANIFEST OUT CONTROL_PORT HOST_TIMEOUT_S

A one-layer model on 64 px images: the step is cheap, so what the job's rate shows is the
feeding. DDP all-reduces the gradient every step, so every rank waits for every other. Each
rank writes OUT/rank-R.json: the wall time of every step and the rows it trained on.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from stoker import ConsumerConfig, JobConfig, Loader

IMAGE = 64
BATCH = 32


def main() -> None:
    manifest, out, control_port, host_timeout = sys.argv[1:]
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = DistributedDataParallel(nn.Sequential(nn.Flatten(), nn.Linear(3 * IMAGE * IMAGE, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    config = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind=f"tcp://127.0.0.1:{control_port}",
                            metrics_port=None, host_timeout_s=float(host_timeout))
    times, rows = [], 0
    with Loader(JobConfig(manifest_uri=manifest, batch_size=BATCH, image_size=IMAGE), config=config) as loader:
        for batch in loader:
            loss = nn.functional.cross_entropy(model(batch["image"].float()), batch["label"].long() % 10)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            times.append(time.time())
            rows += batch.rows
    (Path(out) / f"rank-{dist.get_rank()}.json").write_text(json.dumps({"times": times, "rows": rows}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
