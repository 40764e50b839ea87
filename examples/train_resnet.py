"""Profile a ResNet training step (SGD with momentum) on CPU with graphprof.

Run:  python examples/train_resnet.py
Copy the pattern: decorate the whole step, call it as usual, read the profile.
"""

from __future__ import annotations

import torch
from torch import nn

import graphprof
from graphprof.demo.models import ResNet

torch.manual_seed(0)
model = ResNet()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
loss_fn = nn.CrossEntropyLoss()


@graphprof.trace(profiling=True)
def train_step(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    opt.zero_grad()
    loss = loss_fn(model(images), labels)
    loss.backward()
    opt.step()
    return loss


if __name__ == "__main__":
    for step in range(8):  # call 1 eager, call 2 captures, call 3 measures workspace, calls 4.. are profiled
        images, labels = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
        loss = train_step(images, labels)
    print(f"loss after {step + 1} steps: {loss.item():.4f}\n")
    profile = train_step.get_profile()
    print(profile.table(top=15))
    profile.save("resnet_profile.json")
    print("\nsaved resnet_profile.json; try: graphprof analyze resnet_profile.json -t 20")
