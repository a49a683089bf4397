"""The `torch` accelerator: a real PyTorch training step on the consumer (CPU or CUDA).

`prepare` turns a received batch into device tensors: the uint8 NHWC frame is wrapped
without a copy, moved to the device (through a pinned buffer and a side stream on CUDA,
ordered by an event), then converted, normalised and laid out channels_last there. `step_prepared`
runs forward, loss, backward and the optimizer. The consumer's prefetcher calls `prepare`
for batch N+1 while `step_prepared` runs batch N.

Your own model: pass any `step_fn(images, labels) -> loss` built around your model and
optimizer to `TorchAccelerator(step_fn=...)`; Stoker's code does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from stoker.accel.backends.models.resnet import resnet18, resnet50
from stoker.accel.backends.optimizers import LARS
from stoker.accel.backends.training import TrainingStep
from stoker.accel.batch import ReceivedBatch
from stoker.accel.jpeg_decode import DecodedBatch
from stoker.protos.errors import ConfigError

MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
MODELS = {"resnet50": resnet50, "resnet18": resnet18}
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class TorchConfig:
    model: str = "resnet18"  # resnet50 | resnet18
    device: str = "cpu"
    width: int = 64  # channel width of the first stage (64 = the published models)
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-5
    label_smoothing: float = 0.0
    optimizer: str = "sgd"  # or "lars" (MLPerf's large-batch ResNet-50 optimizer)
    precision: str = "fp32"  # or "bf16": autocast the forward pass (how A100/H100 figures are measured)
    log_every: int = 20


@dataclass
class Prepared:
    images: torch.Tensor  # float, normalised, channels_last, on the device
    labels: torch.Tensor
    ready: torch.cuda.Event | None = None  # CUDA: the copy has landed


@dataclass
class TorchAccelerator(TrainingStep):
    cfg: TorchConfig
    classes: int
    step_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    name: str = "torch"
    losses: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.cfg.model not in MODELS:
            raise ConfigError(f"unknown model {self.cfg.model!r} (choose {', '.join(MODELS)})")
        if self.cfg.width < 16 or self.cfg.width % 16:
            # narrower first stages crashed (heap corruption in backward) with this CPU build of torch
            raise ConfigError(f"--width {self.cfg.width}: use a multiple of 16 (64 is the published model)")
        self.device: torch.device = torch.device(self.cfg.device)
        self.model = MODELS[self.cfg.model](self.classes, self.cfg.width).to(self.device)
        # torch's stubs leave out Module.to's memory_format keyword, which it takes (as Tensor.to does)
        self.model = self.model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        if self.cfg.optimizer == "lars":
            self.optimizer = LARS(self.model.parameters(), lr=self.cfg.lr, momentum=self.cfg.momentum,
                                  weight_decay=self.cfg.weight_decay)
        elif self.cfg.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.cfg.lr, momentum=self.cfg.momentum,
                                             weight_decay=self.cfg.weight_decay)
        else:
            raise ConfigError(f"optimizer {self.cfg.optimizer!r}: choose sgd or lars for ResNet")
        if self.cfg.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.cfg.precision!r}: choose {' or '.join(PRECISIONS)}")
        self.loss = nn.CrossEntropyLoss(label_smoothing=self.cfg.label_smoothing)
        self.mean = torch.tensor(MEAN, device=self.device).view(1, 3, 1, 1)
        self.std = torch.tensor(STD, device=self.device).view(1, 3, 1, 1)
        self.copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.steps = 0
        self.log_every = self.cfg.log_every

    def prepare(self, batch: ReceivedBatch | DecodedBatch) -> Prepared:
        labels = torch.from_numpy(np.asarray(batch.labels, dtype=np.int64))
        if isinstance(batch.images, torch.Tensor):  # decoded on the device already (--decode-on accelerator)
            return self._prepare_on_device(batch.images, labels)
        images = torch.from_numpy(np.asarray(batch.images))  # a view of the received frame
        if self.copy_stream is None:
            return Prepared(self._normalise(images.to(self.device)), labels.to(self.device))
        with torch.cuda.stream(self.copy_stream):
            host = images.pin_memory()
            x = self._normalise(host.to(self.device, non_blocking=True))
            y = labels.pin_memory().to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self.copy_stream)
        return Prepared(x, y, ready)

    def _prepare_on_device(self, images: torch.Tensor, labels: torch.Tensor) -> Prepared:
        if self.copy_stream is None:
            return Prepared(self._normalise(images.to(self.device)), labels.to(self.device))
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))  # the decoder's copy-out
            x = self._normalise(images)
            y = labels.pin_memory().to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self.copy_stream)
        return Prepared(x, y, ready)

    def _normalise(self, nhwc: torch.Tensor) -> torch.Tensor:
        x = nhwc.permute(0, 3, 1, 2).float()
        return ((x - self.mean) / self.std).contiguous(memory_format=torch.channels_last)

    def step_prepared(self, batch: Prepared) -> None:
        if batch.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(batch.ready)
        self.model.train()
        if self.step_fn is not None:
            loss = self.step_fn(batch.images, batch.labels)
        else:
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16"):
                loss = self.loss(self.model(batch.images), batch.labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        self.record(loss)
