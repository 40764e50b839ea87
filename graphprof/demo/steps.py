"""Ready-to-run demo training steps.

Each factory builds a model, optimizer and a *plain* (undecorated) step
closure, bundled as a :class:`DemoStep`. Keeping the closure undecorated lets
callers wrap it however they like (capture, profile, compile) and compare
against eager execution of the very same function.

Determinism matters here because tests and benchmarks compare runs: every
factory seeds the global RNG before building the model, so two calls with
the same seed produce bitwise-identical parameters, and ``make_inputs(i)``
draws from a private ``torch.Generator`` seeded from ``i`` so inputs are
reproducible and do not disturb (or depend on) the global RNG.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from graphprof.demo.models import GPT, ResNet

__all__ = [
    "DEMO_STEPS",
    "DemoStep",
    "cnn_bn_dropout_step",
    "gpt_adam_step",
    "gpt_adamw_step",
    "mlp_sgd_step",
    "resnet_sgd_step",
    "tiny_op_mlp_step",
]


@dataclass(frozen=True)
class DemoStep:
    """A model, its optimizer and a train step closure over both.

    ``step_fn(*make_inputs(i))`` runs one full step (zero_grad, forward,
    loss, backward, optimizer step) and returns the loss; for inference-only
    steps ``optimizer`` is ``None`` and ``step_fn`` returns the output.
    """

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    step_fn: Callable[..., torch.Tensor]
    make_inputs: Callable[[int], tuple[Any, ...]]


def _generator(index: int, salt: int) -> torch.Generator:
    """Private RNG for step ``index``; ``salt`` keeps factories' streams apart."""
    g = torch.Generator()
    g.manual_seed(salt * 1_000_003 + index)
    return g


def _make_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Standard supervised step: the shape every demo workload shares."""

    def step_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        optimizer.step()
        return loss

    return step_fn


def resnet_sgd_step(batch_size: int = 16, image_size: int = 32, seed: int = 0) -> DemoStep:
    """Small ResNet + SGD with momentum and weight decay (conv/BN workload)."""
    torch.manual_seed(seed)
    model = ResNet()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    step_fn = _make_train_step(model, opt, nn.CrossEntropyLoss())
    num_classes = model.fc.out_features

    def make_inputs(index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(index, 1)
        x = torch.randn(batch_size, 3, image_size, image_size, generator=g)
        y = torch.randint(0, num_classes, (batch_size,), generator=g)
        return x, y

    return DemoStep("resnet", model, opt, step_fn, make_inputs)


def _gpt_step(
    name: str,
    make_opt: Callable[[nn.Module], torch.optim.Optimizer],
    batch_size: int,
    seq_len: int,
    seed: int,
    gpt_kwargs: dict[str, Any],
) -> DemoStep:
    """Shared GPT builder; only the optimizer differs between variants."""
    torch.manual_seed(seed)
    gpt_kwargs.setdefault("n_ctx", max(64, seq_len))
    model = GPT(**gpt_kwargs)
    model.train()
    opt = make_opt(model)
    vocab = model.vocab_size

    def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    step_fn = _make_train_step(model, opt, lm_loss)

    def make_inputs(index: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Draw T+1 tokens and shift, so targets really are the next tokens.
        g = _generator(index, 2)
        tokens = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=g)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    return DemoStep(name, model, opt, step_fn, make_inputs)


def gpt_adamw_step(
    batch_size: int = 8, seq_len: int = 64, seed: int = 0, **gpt_kwargs: Any
) -> DemoStep:
    """Tiny GPT + AdamW: the canonical transformer training workload."""
    return _gpt_step(
        "gpt",
        lambda m: torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1),
        batch_size,
        seq_len,
        seed,
        gpt_kwargs,
    )


def gpt_adam_step(
    batch_size: int = 8, seq_len: int = 64, seed: int = 0, **gpt_kwargs: Any
) -> DemoStep:
    """Tiny GPT + Adam, to contrast optimizer update costs with AdamW."""
    return _gpt_step(
        "gpt-adam",
        lambda m: torch.optim.Adam(m.parameters(), lr=1e-3),
        batch_size,
        seq_len,
        seed,
        gpt_kwargs,
    )


def mlp_sgd_step(batch_size: int = 32, seed: int = 0) -> DemoStep:
    """3-layer MLP regression: the simplest non-trivial training step."""
    torch.manual_seed(seed)
    in_dim, hidden, out_dim = 32, 64, 8
    model = nn.Sequential(
        nn.Linear(in_dim, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, out_dim),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step_fn = _make_train_step(model, opt, nn.MSELoss())

    def make_inputs(index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(index, 3)
        return torch.randn(batch_size, in_dim, generator=g), torch.randn(
            batch_size, out_dim, generator=g
        )

    return DemoStep("mlp", model, opt, step_fn, make_inputs)


def cnn_bn_dropout_step(batch_size: int = 8, seed: int = 0) -> DemoStep:
    """Small CNN with BatchNorm and Dropout.

    Exercises train-mode-only behaviour (BN running-stat updates and random
    dropout masks), which a static-graph profiler must handle correctly.
    """
    torch.manual_seed(seed)
    num_classes, image_size = 10, 16
    model = nn.Sequential(
        nn.Conv2d(3, 8, kernel_size=3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, kernel_size=3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Flatten(),
        nn.Dropout(0.5),
        nn.Linear(16 * (image_size // 2) ** 2, num_classes),
    )
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step_fn = _make_train_step(model, opt, nn.CrossEntropyLoss())

    def make_inputs(index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(index, 4)
        x = torch.randn(batch_size, 3, image_size, image_size, generator=g)
        y = torch.randint(0, num_classes, (batch_size,), generator=g)
        return x, y

    return DemoStep("cnn", model, opt, step_fn, make_inputs)


def tiny_op_mlp_step(
    depth: int = 64, width: int = 16, batch_size: int = 4, seed: int = 0
) -> DemoStep:
    """Deep stack of tiny Linear+Tanh layers: deliberately dispatch-bound.

    Each op does almost no arithmetic, so runtime is dominated by per-op
    Python/dispatcher overhead -- the case where graph capture and replay
    should help most.
    """
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step_fn = _make_train_step(model, opt, nn.MSELoss())

    def make_inputs(index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(index, 5)
        return torch.randn(batch_size, width, generator=g), torch.randn(
            batch_size, width, generator=g
        )

    return DemoStep("tiny-mlp", model, opt, step_fn, make_inputs)


DEMO_STEPS: dict[str, Callable[..., DemoStep]] = {
    "resnet": resnet_sgd_step,
    "gpt": gpt_adamw_step,
    "gpt-adam": gpt_adam_step,
    "mlp": mlp_sgd_step,
    "cnn": cnn_bn_dropout_step,
    "tiny-mlp": tiny_op_mlp_step,
}
