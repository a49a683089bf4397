"""A fault-tolerant language-model job (torchft): replica groups that die and come back, every token once.

    torchft_lighthouse --min_replicas 1 &                       # once, somewhere every group reaches
    stoker dispatch --data tokens/manifest.json --dataset tokens --world-size 2 \\
        --control-bind tcp://HOST:5561 --job-secret /shared/job.key --insecure &
    stoker worker --dispatcher tcp://HOST:5561 &    # on each CPU host
    TORCHFT_LIGHTHOUSE=http://HOST:29510 python examples/train_torchft.py tcp://HOST:5561 \\
        --job-secret /shared/job.key --group 0 --groups 2 --state-dir /shared/state    # one per group

Each torchft replica group is one rank of a Stoker job whose dispatcher runs apart (`stoker dispatch`),
so any group may die. The loader is made with `commit_steps=True`: a step counts only when torchft
commits it (`manager.should_commit()`), and a batch whose step was not committed (a peer died during
the all-reduce) comes again with the next `next()`. Right after each commit the group saves the loader's
position; a group restarted in place (the same command) loads it and steps the rest of its stream
once, while the other groups go on. The model's weights come from a live peer (torchft's healing),
the data position from the group's own file. The model is a stand-in: put yours in its place.
"""

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torchft import Manager, ProcessGroupGloo

from stoker import ConsumerConfig, Loader

parser = argparse.ArgumentParser()
parser.add_argument("dispatcher", help="the job's `stoker dispatch --control-bind` endpoint")
parser.add_argument("--job-secret", required=True, help="the dispatcher's --job-secret file")
parser.add_argument("--group", type=int, required=True, help="this replica group's number, from 0")
parser.add_argument("--groups", type=int, required=True, help="replica groups (the job's --world-size)")
parser.add_argument("--state-dir", required=True, help="where each group keeps its loader position")
parser.add_argument("--host", default="127.0.0.1", help="this machine's address as the workers reach it")
parser.add_argument("--vocab-size", type=int, default=65536, help="above every token id of the set")
parser.add_argument("--commits", help="append one JSON line per committed step here (an audit of what counted)")
args = parser.parse_args()

state_file = Path(args.state_dir) / f"group{args.group}.json"
store = dist.TCPStore(args.host, 0, is_master=True, wait_for_workers=False)  # this group's own store
model = nn.Sequential(nn.Embedding(args.vocab_size, 32), nn.Linear(32, args.vocab_size))  # your model here
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
manager = Manager(
    pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), min_replica_size=1,
    load_state_dict=lambda saved: (model.load_state_dict(saved["model"]), optimizer.load_state_dict(saved["optim"])),
    state_dict=lambda: {"model": model.state_dict(), "optim": optimizer.state_dict()},
    replica_id=f"stoker_group_{args.group}", store_addr=args.host, store_port=store.port, rank=0, world_size=1,
    timeout=timedelta(seconds=10))

config = ConsumerConfig(data_bind=f"tcp://{args.host}:0", dispatcher=args.dispatcher, job_secret=args.job_secret,
                        metrics_port=None)
loader = Loader(config=config, rank=args.group, world_size=args.groups, commit_steps=True)
if state_file.exists():  # restarted in place: the rest of this group's stream, from its last commit
    loader.load_state_dict(json.loads(state_file.read_text()))
with loader:
    while loader.epoch < loader.epochs:
        for batch in loader:  # an uncommitted batch comes again here
            manager.start_quorum()
            if batch.rows:
                logits = model(batch["input_ids"].long())
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].long().flatten())
            else:  # an empty piece: a step all the same
                loss = model(torch.zeros(1, 1, dtype=torch.long)).sum() * 0.0
            optimizer.zero_grad()
            loss.backward()
            for param in model.parameters():  # averaged across the live groups; a failure marks the step
                manager.allreduce(param.grad).wait()
            if not manager.should_commit():
                print(f"group {args.group}: epoch {batch.epoch} step {batch.step} not committed; it comes again",
                      flush=True)
                continue
            loader.commit(batch)  # first, so the step's window without a saved position is as short as can be
            state_file.with_suffix(".tmp").write_text(json.dumps(loader.state_dict()))
            os.replace(state_file.with_suffix(".tmp"), state_file)  # a crash mid-save keeps the last one
            if args.commits:
                with open(args.commits, "a") as log:
                    log.write(json.dumps({"group": args.group, "pid": os.getpid(), "epoch": batch.epoch,
                                          "step": batch.step, "documents": batch.sample_ids.tolist()}) + "\n")
            optimizer.step()  # a group killed before this heals its weights from a live peer
manager.shutdown(wait=False)
