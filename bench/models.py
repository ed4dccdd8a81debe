"""The ResNet-style CNN the benches train (basic residual blocks with BatchNorm), defined once: random weights,
nothing downloaded. Run a bench as `python bench/bench_x.py`, which puts this folder on sys.path."""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with BatchNorm, ReLU, and the shortcut added before the last ReLU."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """A CIFAR-style ResNet: 3x3 stem, stages of two basic blocks (the first of each later stage strides 2), head."""

    def __init__(self, widths: tuple[int, ...] = (8, 16, 32), classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(inplace=True))
        blocks = []
        inputs = widths[0]
        for stage, width in enumerate(widths):
            for block in range(2):
                blocks.append(BasicBlock(inputs, width, 2 if stage > 0 and block == 0 else 1))
                inputs = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inputs, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.blocks(self.stem(images))).flatten(1))
