"""A plain torchrun DDP training script fed by Stoker, as a user writes one (gloo on the CPU here).

    torchrun --nproc-per-node N tests/ddp_script.py --data MANIFEST --out DIR [--epochs 2]

Each rank trains a small model (a narrow ResNet-18, or one linear layer) on its own Stoker
stream; DDP all-reduces the gradients in every backward pass, so the ranks step in lock-step:
no rank takes step k + 1 before every rank has had its batch k. Each rank appends a line per
step to DIR/rank-R[-resumed].jsonl (the sample ids it trained on, the time), so a test can check
that the ranks' streams cover the data set exactly once per epoch with no overlap, that every
rank took the same number of steps, and how long the longest wait between two steps was.

--save-at K: rank 0 saves `loader.state_dict()` to DIR/state.json after step K and goes on.
--stop-after K: after K steps rank 0 saves it, and every rank leaves cleanly.
--crash-after K: after K steps every rank dies at once (os._exit), as a crashed job does.
--resume: continue from DIR/state.json. --control-port P: rank 0's control socket (0: the
loader's default on loopback).
--lm-seq-len L: a tokens job (causal-LM rows of L, --lm-mode packed|concat) stepping a one-layer next-token
model; each step's line also holds a sha256 of its tensors and len(loader) as the step saw it.
--bert-seq-len L: a BERT (wikipedia) job of sequences of L, stepping an embedding's mean; its lines as a tokens job's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from stoker import ConsumerConfig, JobConfig, Loader
from stoker.accel.backends.models.resnet import resnet18
from stoker.pipeline.text.examples import TextConfig
from stoker.pipeline.text.lm_layout import LMConfig

VOCAB = 1024  # above the ids of the tests' tokenizers (tests/token_corpus.py: 300)
BERT_VOCAB = 30522  # BERT's uncased WordPiece


def make_model(kind: str, image_size: int, lm: bool = False, bert: bool = False) -> nn.Module:
    if bert:
        return nn.Sequential(nn.Embedding(BERT_VOCAB, 4), nn.Linear(4, 1))
    if lm:
        return nn.Sequential(nn.Embedding(VOCAB, 8), nn.Linear(8, VOCAB))
    if kind == "linear":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * image_size * image_size, 4))
    return resnet18(4, 16)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=13)
    parser.add_argument("--unit-batches", type=int, default=JobConfig.unit_batches)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--model", choices=("resnet18", "linear"), default="resnet18")
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--host-timeout", type=float, default=3.0)
    parser.add_argument("--save-at", type=int, default=0)
    parser.add_argument("--stop-after", type=int, default=0)
    parser.add_argument("--crash-after", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--lm-seq-len", type=int, default=0)
    parser.add_argument("--lm-mode", default="packed")
    parser.add_argument("--bert-seq-len", type=int, default=0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    lm = LMConfig(args.lm_seq_len, args.lm_mode) if args.lm_seq_len else None
    bert = TextConfig(seq_len=args.bert_seq_len) if args.bert_seq_len else None
    text = lm is not None or bert is not None
    model = DistributedDataParallel(make_model(args.model, args.image_size, lm is not None, bert is not None))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    mean = torch.tensor([123.7, 116.3, 103.5]).view(1, 3, 1, 1)

    config = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind=f"tcp://127.0.0.1:{args.control_port}",
                            metrics_port=0, host_timeout_s=args.host_timeout)
    job = JobConfig(manifest_uri=args.data, epochs=args.epochs, batch_size=args.batch_size,
                    unit_batches=args.unit_batches,
                    image_size=args.image_size, **({"dataset": "tokens", "lm": lm} if lm else {}),
                    **({"dataset": "wikipedia", "text": bert} if bert else {}))
    loader = Loader(job, config=config)  # rank and world size from torchrun's environment
    state_file = args.out / "state.json"
    if args.resume:
        loader.load_state_dict(json.loads(state_file.read_text()))
    suffix = "-resumed" if args.resume else ""
    record = open(args.out / f"rank-{rank}{suffix}.jsonl", "w", buffering=1)
    taken = 0
    with loader:
        while loader.epoch < loader.epochs:
            record.write(json.dumps({"len": len(loader), "epoch": loader.epoch}) + "\n")
            for batch in loader:
                if text and not batch.rows:  # an empty step: through DDP's forward, so that it all-reduces too
                    loss = model(torch.zeros(1, 1, dtype=torch.long)).sum() * 0.0
                elif bert is not None:
                    loss = model(batch["input_ids"].long()).mean()
                elif lm is not None:
                    logits = model(batch["input_ids"].long())
                    loss = loss_fn(logits.flatten(0, 1), batch["labels"].long().flatten())  # -100 ignored
                else:
                    images = batch["image"].permute(0, 3, 1, 2).float().sub(mean).div(58.0)
                    loss = loss_fn(model(images), batch["label"].long())
                optimizer.zero_grad()
                loss.backward()  # DDP all-reduces here: a rank with a missing step would hang
                optimizer.step()
                line = {"epoch": batch.epoch, "step": batch.step, "rows": batch.rows,
                        "ids": batch.sample_ids.tolist(), "at": time.time()}
                if text:
                    tensors = b"".join(batch[name].numpy().tobytes() for name in sorted(batch))
                    line.update(digest=hashlib.sha256(tensors).hexdigest(), len_now=len(loader))
                record.write(json.dumps(line) + "\n")
                taken += 1
                if rank == 0 and taken in (args.save_at, args.stop_after):
                    state_file.write_text(json.dumps(loader.state_dict()))
                if taken == args.crash_after:
                    os._exit(17)
                if taken == args.stop_after:
                    dist.barrier()
                    break
            if taken == args.stop_after:
                break
    # rank 0 holds the job's dispatcher; the others have its figures from its answers
    record.write(json.dumps({"units_released": loader.consumer.dispatcher.stats().releases}) + "\n")
    record.close()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
