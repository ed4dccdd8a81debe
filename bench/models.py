"""The models the benches train, defined once: the ResNet-style CNN (basic residual blocks with BatchNorm), the
transformer encoder classifier and the AMP recipe's MLP; random weights, nothing downloaded. Run a bench as
`python bench/bench_x.py`, which puts this folder on sys.path; tests/speedprobe loads this file by its path."""

from __future__ import annotations

import itertools

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


class EncoderClassifier(nn.Module):
    """Token embeddings with learned positions, an `nn.TransformerEncoder` (dropout 0.1), the mean over the sequence,
    a Linear to the classes."""

    def __init__(self, vocabulary: int = 1000, sequence: int = 32, width: int = 128, classes: int = 2,
                 heads: int = 4, feedforward: int = 512, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.position = nn.Parameter(torch.randn(1, sequence, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, nhead=heads, dim_feedforward=feedforward, dropout=0.1,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.position).mean(dim=1))


class MLP(nn.Module):
    """Linear+ReLU layers and a last Linear: the AMP recipe's make_model, as a class (on torch 2.13 `model.compile()`
    leaves a bare `nn.Sequential` uncompiled; see bench/bench_speedprobe.py)."""

    def __init__(self, sizes: tuple[int, ...]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        return self.layers[-1](x)
