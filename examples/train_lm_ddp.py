"""A data-parallel language-model job on a token set, restartable at any world size (torchrun elastic).

    torchrun --nnodes 1:4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        examples/train_lm_ddp.py tokens/manifest.json --checkpoint /shared/lm.pt

The same shape as examples/train_ddp.py, for a token set (`stoker prepare tokens`, or a mixture of
several: `stoker prepare mixture`): rank 0 saves the model, the optimizer and the loader's position
every --save-every steps; a job restarted (in place, or by torchrun with fewer or more nodes) loads
them and goes on, every document of the epoch once whatever the world size. The model is a stand-in
(an embedding and a linear head): put yours in its place.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from stoker import JobConfig, LMConfig, Loader

parser = argparse.ArgumentParser()
parser.add_argument("manifest")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--seq-len", type=int, default=512)
parser.add_argument("--vocab-size", type=int, default=65536, help="above every token id of the set")
parser.add_argument("--checkpoint", default="lm-checkpoint.pt")
parser.add_argument("--save-every", type=int, default=500, help="steps")
args = parser.parse_args()

cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")  # first: the Loader meets rank 0 through its store
device = f"cuda:{os.environ['LOCAL_RANK']}" if cuda else "cpu"
model = DistributedDataParallel(nn.Sequential(  # your model here
    nn.Embedding(args.vocab_size, 64), nn.Linear(64, args.vocab_size)).to(device))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

job = JobConfig(manifest_uri=args.manifest, dataset="tokens", epochs=args.epochs, batch_size=args.batch_size,
                lm=LMConfig(args.seq_len))
loader = Loader(job, device=device)  # rank, world size, addresses from torchrun; keys from $STOKER_KEYS
if os.path.exists(args.checkpoint):  # restarted in place, or at another world size
    saved = torch.load(args.checkpoint, map_location="cpu")  # a path every node reads
    model.module.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    loader.load_state_dict(saved["data"])  # the job's position: any world size continues it
with loader:
    while loader.epoch < loader.epochs:
        for batch in loader:  # len(loader) steps, the same on every rank
            if batch.rows:  # rows of seq_len token ids, labels already shifted (-100: nothing to predict)
                logits = model(batch["input_ids"].long())
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].long().flatten())
            else:  # an empty piece (a rank with fewer rows than the epoch's steps): a step all the same
                loss = model(torch.zeros(1, 1, dtype=torch.long, device=device)).sum() * 0.0
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduces: every rank takes each step together
            optimizer.step()
            if batch.step % args.save_every == args.save_every - 1 and dist.get_rank() == 0:
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                            "data": loader.state_dict()}, args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)  # a crash mid-save keeps the last one
dist.destroy_process_group()
