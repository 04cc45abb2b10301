"""ResNet-18 (He et al. 2016) for 28x28 single-channel images: the communication-heavy workload.

11.2 M parameters (45 MB of fp32 gradients per step, 180x LeNet-5) put data-parallel training in
the bandwidth-bound regime. The stem is the small-image variant used for CIFAR (one 3x3
convolution, no max pooling) so that 28x28 Fashion-MNIST keeps enough resolution through the
four stages (28 -> 28 -> 14 -> 7 -> 4).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from . import ModelSpec, register


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, in_channels: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        widths, layers = (64, 128, 256, 512), []
        c = widths[0]
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            layers += [BasicBlock(c, w, stride), BasicBlock(w, w, 1)]
            c = w
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),  # (B, 64, 28, 28)
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
            *layers,  # (B, 512, 4, 4)
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),  # (B, 512)
            nn.Linear(c, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


register(
    ModelSpec(
        name="resnet18",
        build=ResNet18,
        input_shape=(1, 28, 28),
        num_classes=10,
        description="ResNet-18 for 28x28 images, 11.2 M parameters (communication-heavy regime)",
    )
)
