"""LeNet-5 (LeCun et al. 1998) as used for Fashion-MNIST in Jaeger et al. 2018.

The 28x28 Fashion-MNIST images are padded by 2 in the first convolution, which gives the classic
32x32 geometry and 61,706 parameters. ReLU and max pooling replace the original tanh and
subsampling layers, as in the modern reference implementations.
"""

import torch
import torch.nn as nn

from . import ModelSpec, register


class LeNet5(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, kernel_size=5, padding=2),  # (B, 6, 28, 28)
            nn.ReLU(),
            nn.MaxPool2d(2),  # (B, 6, 14, 14)
            nn.Conv2d(6, 16, kernel_size=5),  # (B, 16, 10, 10)
            nn.ReLU(),
            nn.MaxPool2d(2),  # (B, 16, 5, 5)
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),  # (B, 400)
            nn.Linear(16 * 5 * 5, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


register(
    ModelSpec(
        name="lenet5",
        build=LeNet5,
        input_shape=(1, 28, 28),
        num_classes=10,
        description="LeNet-5, 61.7 k parameters (Fashion-MNIST workload of the seed paper)",
    )
)
