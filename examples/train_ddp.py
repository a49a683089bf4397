"""A data-parallel training script fed by Stoker: the same command on every accelerator node.

    torchrun --nnodes 2 --nproc-per-node 8 --node-rank R --master-addr NODE0 --master-port 29500 \
        examples/train_ddp.py /shared/imagenet/manifest.json
    # and on each CPU host: stoker worker --dispatcher tcp://NODE0:5561 --procs 16 --keys keys --key-name cpu-0

Run again with the same command after a crash (or with fewer nodes), and it continues from the
last checkpoint: every sample once per epoch.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from stoker import JobConfig, Loader

parser = argparse.ArgumentParser()
parser.add_argument("manifest")
parser.add_argument("--epochs", type=int, default=90)
parser.add_argument("--batch-size", type=int, default=256)
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--checkpoint", default="checkpoint.pt")
parser.add_argument("--save-every", type=int, default=500, help="steps")
args = parser.parse_args()

cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")  # first: the Loader meets rank 0 through its store
device = f"cuda:{os.environ['LOCAL_RANK']}" if cuda else "cpu"
model = DistributedDataParallel(nn.Sequential(  # your model here
    nn.Conv2d(3, 32, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 1000)).to(device))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
mean = torch.tensor([123.7, 116.3, 103.5], device=device).view(1, 3, 1, 1)

job = JobConfig(manifest_uri=args.manifest, epochs=args.epochs, batch_size=args.batch_size,
                image_size=args.image_size)
loader = Loader(job, device=device)  # rank, world size, addresses from torchrun; keys from $STOKER_KEYS
if os.path.exists(args.checkpoint):  # restarted in place, or at another world size
    saved = torch.load(args.checkpoint, map_location="cpu")  # a path every node reads
    model.module.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    loader.load_state_dict(saved["data"])  # the job's position: any world size continues it
with loader:
    while loader.epoch < loader.epochs:
        for batch in loader:  # len(loader) steps, the same on every rank
            x = batch["image"].permute(0, 3, 1, 2).float().sub(mean).div(58.0)  # uint8 NHWC, on the device
            loss = nn.functional.cross_entropy(model(x), batch["label"].long())
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduces: every rank takes each step together
            optimizer.step()
            if batch.step % args.save_every == args.save_every - 1 and dist.get_rank() == 0:
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                            "data": loader.state_dict()}, args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)  # a crash mid-save keeps the last one
dist.destroy_process_group()
