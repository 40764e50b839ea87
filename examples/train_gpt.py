"""Profile a small GPT training step (AdamW) on CPU with graphprof.

Run:  python examples/train_gpt.py
AdamW reads its step count with .item(); graphprof keeps that live in the
graph, so the profiled steps compute exactly what eager PyTorch computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.profiler import record_function

import graphprof
from graphprof.demo.models import GPT

torch.manual_seed(0)
model = GPT(vocab_size=256, n_ctx=64, d_model=64, n_layer=2, n_head=4)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)


@graphprof.trace(profiling=True)
def train_step(tokens: torch.Tensor) -> torch.Tensor:
    opt.zero_grad()
    with record_function("forward+loss"):  # becomes the nodes' scope
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    return loss


if __name__ == "__main__":
    for step in range(8):
        loss = train_step(torch.randint(0, 256, (8, 65)))
    print(f"loss after {step + 1} steps: {loss.item():.4f}\n")
    profile = train_step.get_profile()
    print(profile.table(top=15))
    profile.save("gpt_profile.json")
    print("\nsaved gpt_profile.json; try: graphprof analyze gpt_profile.json -t 20")
