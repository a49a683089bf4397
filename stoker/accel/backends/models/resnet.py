"""ResNet v1.5 in plain PyTorch: the MLPerf ResNet-50 (stride 2 on the 3x3 of each bottleneck).

The same layout as torchvision's `resnet50` / `resnet18`, so the parameter counts match
(25,557,032 and 11,689,512 at 1,000 classes). `width` scales every channel count, for the
small models the tests train on a 2-core machine. The last BatchNorm of each residual
branch can start at zero (as MLPerf's reference does), so each block starts as identity.
"""

from __future__ import annotations

import torch
from torch import nn


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)]


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.branch = nn.Sequential(*_conv_bn(cin, width, 1), nn.ReLU(inplace=True),
                                    *_conv_bn(width, width, 3, stride), nn.ReLU(inplace=True),  # v1.5: stride here
                                    *_conv_bn(width, cout, 1))
        self.shortcut = nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.branch(x) + self.shortcut(x))


class Basic(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        self.branch = nn.Sequential(*_conv_bn(cin, width, 3, stride), nn.ReLU(inplace=True), *_conv_bn(width, width, 3))
        identity = stride == 1 and cin == width
        self.shortcut = nn.Identity() if identity else nn.Sequential(*_conv_bn(cin, width, 1, stride))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.branch(x) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, block: type[Bottleneck] | type[Basic], depths: tuple[int, ...], classes: int = 1000,
                 width: int = 64, zero_init_residual: bool = True) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(3, width, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        stages, cin = [], width
        for index, depth in enumerate(depths):
            planes = width * 2 ** index
            blocks = []
            for b in range(depth):
                blocks.append(block(cin, planes, 2 if b == 0 and index > 0 else 1))
                cin = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, (Bottleneck, Basic)):
                    nn.init.zeros_(m.branch[-1].get_parameter("weight"))  # typed, unlike the attribute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def resnet50(classes: int = 1000, width: int = 64) -> ResNet:
    return ResNet(Bottleneck, (3, 4, 6, 3), classes, width)


def resnet18(classes: int = 1000, width: int = 64) -> ResNet:
    return ResNet(Basic, (2, 2, 2, 2), classes, width)
