"""PyTorch Lightning fed by Stoker: a LightningModule as usual, and StokerDataModule for the data.

    python examples/lightning_train.py /shared/imagenet/manifest.json --accelerator gpu --devices 8 --workers 16
    # or under torchrun (then Lightning starts no processes of its own), one command per node:
    torchrun --nnodes 2 --nproc-per-node 8 --node-rank R --master-addr NODE0 --master-port 29500 \
        examples/lightning_train.py /shared/imagenet/manifest.json --accelerator gpu --devices 8 --nodes 2

Every sample once per epoch, the same number of steps on every rank. Checkpoints every --save-every
steps hold the data position too: run again with --ckpt-path CHECKPOINT and it continues from there.
"""

import argparse

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from stoker import JobConfig
from stoker.lightning import StokerDataModule

parser = argparse.ArgumentParser()
parser.add_argument("manifest")
parser.add_argument("--epochs", type=int, default=90)
parser.add_argument("--batch-size", type=int, default=256)
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--accelerator", default="cpu", help="gpu on GPU machines")
parser.add_argument("--devices", type=int, default=1, help="ranks on this machine")
parser.add_argument("--nodes", type=int, default=1)
parser.add_argument("--workers", type=int, default=4, help="decode processes per machine (0: stoker worker hosts)")
parser.add_argument("--checkpoint-dir", default="checkpoints")
parser.add_argument("--save-every", type=int, default=500, help="steps")
parser.add_argument("--ckpt-path", help="a checkpoint to continue from")
args = parser.parse_args()


class Classifier(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(  # your model here
            nn.Conv2d(3, 32, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 1000))
        self.register_buffer("mean", torch.tensor([123.7, 116.3, 103.5]).view(1, 3, 1, 1))

    def training_step(self, batch, batch_idx):
        x = batch["image"].permute(0, 3, 1, 2).float().sub(self.mean).div(58.0)  # uint8 NHWC, on the device
        loss = nn.functional.cross_entropy(self.net(x), batch["label"].long())
        self.log("loss", loss, batch_size=batch.rows)  # batch.epoch, batch.step: where the data stands
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


job = JobConfig(manifest_uri=args.manifest, epochs=args.epochs, batch_size=args.batch_size,
                image_size=args.image_size)
data = StokerDataModule(job, workers=args.workers)  # the loader's position goes into every checkpoint
every = ModelCheckpoint(dirpath=args.checkpoint_dir, every_n_train_steps=args.save_every, save_top_k=-1)
trainer = Trainer(accelerator=args.accelerator, devices=args.devices, num_nodes=args.nodes,
                  strategy="ddp" if args.devices * args.nodes > 1 else "auto", max_epochs=job.epochs,
                  callbacks=[every], default_root_dir=args.checkpoint_dir)
trainer.fit(Classifier(), datamodule=data, ckpt_path=args.ckpt_path)  # ckpt_path: model, optimizer and data
