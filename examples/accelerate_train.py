"""Training with Hugging Face Accelerate, fed by Stoker: the same command on every node.

    accelerate launch --multi_gpu --num_processes 8 examples/accelerate_train.py /shared/imagenet/manifest.json

On CPUs only, launch it the same way: `--multi_gpu` is the flag that starts N processes (through
torchrun); `--cpu` starts one (without an MPI hostfile, accelerate's simple launcher runs the script
once), so this script asks for the CPU itself when there is no GPU. Local process 0 of each node
starts the node's decode processes. Run again with the same command after a crash, and it
continues from the last checkpoint: every sample once per epoch.
"""

import argparse
import os
import shutil

import torch
from accelerate import Accelerator
from torch import nn

from stoker import JobConfig, Loader

parser = argparse.ArgumentParser()
parser.add_argument("manifest")
parser.add_argument("--epochs", type=int, default=90)
parser.add_argument("--batch-size", type=int, default=256)
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--workers", type=int, default=8, help="decode processes on each node")
parser.add_argument("--checkpoint", default="checkpoints", help="folder (on a path every node reads)")
parser.add_argument("--save-every", type=int, default=500, help="steps")
args = parser.parse_args()

# first: Accelerate initialises the process group, and the Loader meets rank 0 through its store.
# cpu=True where there is no GPU, or every process would take itself for the only one.
accelerator = Accelerator(cpu=not torch.cuda.is_available())
job = JobConfig(manifest_uri=args.manifest, epochs=args.epochs, batch_size=args.batch_size,
                image_size=args.image_size)
# One worker daemon per node, beside local process 0, feeds every rank of the node: the node's cores are
# counted once, and a free process makes whichever rank's batch is due (not one rank's only).
workers = args.workers if accelerator.is_local_main_process else 0
loader = Loader(job, workers=workers, device=str(accelerator.device))  # rank and world size: Accelerate's
model = nn.Sequential(  # your model here
    nn.Conv2d(3, 32, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 1000))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # the Loader comes back as it went in
accelerator.register_for_checkpointing(loader)  # save_state/load_state carry the data position too
latest = os.path.join(args.checkpoint, "latest")
if os.path.exists(latest):  # restarted: before the loader's first use
    accelerator.load_state(latest)
mean = torch.tensor([123.7, 116.3, 103.5], device=accelerator.device).view(1, 3, 1, 1)


def save_checkpoint(name: str) -> None:
    """Every process calls save_state (process 0 writes the model, the optimizer and the data position,
    each process its random state); then `latest` moves to the new folder, so a crash mid-save keeps the
    last whole checkpoint."""
    accelerator.save_state(os.path.join(args.checkpoint, name))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        previous = os.readlink(latest) if os.path.islink(latest) else None
        link = latest + ".tmp"
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(name, link)
        os.replace(link, latest)
        if previous not in (None, name):
            shutil.rmtree(os.path.join(args.checkpoint, previous), ignore_errors=True)


with loader:
    while loader.epoch < loader.epochs:
        for batch in loader:  # len(loader) steps, the same on every process
            x = batch["image"].permute(0, 3, 1, 2).float().sub(mean).div(58.0)  # uint8 NHWC, on the device
            loss = nn.functional.cross_entropy(model(x), batch["label"].long())
            optimizer.zero_grad()
            accelerator.backward(loss)  # every process takes each step together
            optimizer.step()
            if batch.step % args.save_every == args.save_every - 1:
                save_checkpoint(f"epoch-{batch.epoch}-step-{batch.step + 1}")  # the position after this batch
accelerator.end_training()
