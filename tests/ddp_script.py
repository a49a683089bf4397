"""A plain torchrun DDP training script fed by Stoker, as a user writes one (gloo on the CPU here).

    torchrun --nproc-per-node 2 tests/ddp_script.py --data MANIFEST --out DIR [--epochs 2]

Each rank trains a narrow ResNet-18 on its own Stoker stream and writes, per step, the sample
ids it trained on to DIR/rank-R.json, so the test can check that the ranks' streams cover the
data set exactly once per epoch with no overlap, and that both took the same number of steps.
With --stop-after K the job saves `loader.state_dict()` (rank 0) after K steps and exits;
with --resume it continues from there.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from accel.models.resnet import resnet18
from stoker import ConsumerConfig, JobConfig, Loader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=13)
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--stop-after", type=int, default=0, help="save the data position after this many steps")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(resnet18(4, 16))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    mean = torch.tensor([123.7, 116.3, 103.5]).view(1, 3, 1, 1)

    config = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind=f"tcp://127.0.0.1:{args.control_port}",
                            metrics_port=0, host_timeout_s=3.0)
    job = JobConfig(manifest_uri=args.data, epochs=args.epochs, batch_size=args.batch_size, unit_batches=2,
                    image_size=32)
    loader = Loader(job, config=config)  # rank and world size from torchrun's environment
    state_file = args.out / "state.json"
    if args.resume:
        loader.load_state_dict(json.loads(state_file.read_text()))
    record = {"rank": rank, "steps": [], "len": []}
    taken = 0
    with loader:
        while loader.epoch < loader.epochs:
            record["len"].append(len(loader))
            for batch in loader:
                images = batch["image"].permute(0, 3, 1, 2).float().sub(mean).div(58.0)
                loss = loss_fn(model(images), batch["label"].long())
                optimizer.zero_grad()
                loss.backward()  # DDP all-reduces here: a rank with a missing step would hang
                optimizer.step()
                record["steps"].append({"epoch": batch.epoch, "step": batch.step, "rows": batch.rows,
                                        "ids": batch.sample_ids.tolist(), "at": time.time()})
                taken += 1
                if args.stop_after and taken == args.stop_after:
                    if rank == 0:
                        state_file.write_text(json.dumps(loader.state_dict()))
                    dist.barrier()
                    break
            if args.stop_after and taken == args.stop_after:
                break
    if rank == 0:  # the job's dispatcher lives in rank 0's process
        record["units_released"] = loader.consumer.dispatcher.stats().releases
    suffix = "-resumed" if args.resume else ""
    (args.out / f"rank-{rank}{suffix}.json").write_text(json.dumps(record))
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
