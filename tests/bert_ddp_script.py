"""A torchrun DDP script fed by a BERT (`--dataset wikipedia`) Stoker job, as tests/ddp_script.py is for images
and tokens (the same DIR/rank-R.jsonl records, so its tests read both alike; gloo on the CPU here).

    torchrun --nproc-per-node N tests/bert_ddp_script.py --data MANIFEST --out DIR --control-port P [--pack]

A BERT rank cannot know its epoch's steps ahead (its rows depend on the examples its units make): at an epoch
end every rank learns the longest stream's count from the dispatcher and splits its last batch to match.
DDP all-reduces in every backward pass, so a rank left waiting for that count while another waits in the
all-reduce would hang the job: these records say it did not.
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

from stoker import ConsumerConfig, JobConfig, Loader
from stoker.pipeline.text.examples import TextConfig

VOCAB = 30522  # BERT's uncased WordPiece


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--pack", action="store_true")
    parser.add_argument("--host-timeout", type=float, default=ConsumerConfig.host_timeout_s)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Embedding(VOCAB, 4), nn.Linear(4, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    config = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind=f"tcp://127.0.0.1:{args.control_port}",
                            metrics_port=0, host_timeout_s=args.host_timeout)
    job = JobConfig(manifest_uri=args.data, dataset="wikipedia", epochs=args.epochs, batch_size=args.batch_size,
                    text=TextConfig(seq_len=args.seq_len, pack=args.pack))
    record = open(args.out / f"rank-{rank}.jsonl", "w", buffering=1)
    with Loader(job, config=config) as loader:  # rank and world size from torchrun's environment
        while loader.epoch < loader.epochs:
            record.write(json.dumps({"len": len(loader), "epoch": loader.epoch}) + "\n")
            for batch in loader:
                if batch.rows:
                    loss = model(batch["input_ids"].long()).mean()
                else:  # an empty piece of a split batch: a step all the same, through DDP, so it all-reduces too
                    loss = model(torch.zeros(1, 1, dtype=torch.long)).mean() * 0.0
                optimizer.zero_grad()
                loss.backward()  # DDP all-reduces here: a rank with a missing step would hang
                optimizer.step()
                record.write(json.dumps({"epoch": batch.epoch, "step": batch.step, "rows": batch.rows,
                                         "ids": batch.sample_ids.tolist(), "at": time.time(),
                                         "len_now": len(loader)}) + "\n")
        units_released = loader.consumer.dispatcher.stats().releases
    record.write(json.dumps({"units_released": units_released}) + "\n")
    record.close()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
