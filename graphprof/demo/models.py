"""Small demo models written from scratch for profiling.

These models exist so that ``graphprof`` has realistic, self-contained
workloads to capture without depending on torchvision or transformers.
They are intentionally written in the most "visible" style possible:
activations are ``nn.Module`` instances rather than functional calls and
attention is computed with explicit matmuls, so every interesting op shows
up as its own node in a captured graph and can be attributed to a named
submodule (e.g. ``layer2.0.conv1`` or ``blocks.1.attn.c_attn``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "MLP",
    "BasicBlock",
    "Block",
    "CausalSelfAttention",
    "GPT",
    "ResNet",
]


# --------------------------------------------------------------------------
# ResNet
# --------------------------------------------------------------------------


def _conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    """3x3 conv without bias (BN follows, so a bias would be redundant)."""
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection (ResNet-18/34 style block).

    The shortcut is an explicit ``nn.Sequential`` of 1x1 conv + BN when the
    shape changes and ``nn.Identity`` otherwise, so the profiler sees the
    projection as its own attributable submodule.
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_ch, out_ch, stride)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=False)
        self.conv2 = _conv3x3(out_ch, out_ch)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut: nn.Module
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_ch),
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """A small CIFAR-style ResNet with three stages.

    Sized so that a training step at batch 16, 32x32 runs in a few tens of
    milliseconds on CPU, while still exercising conv, batch norm (with
    running-stat buffers), residual adds, pooling and a linear head.
    """

    def __init__(
        self,
        blocks_per_stage: Sequence[int] = (1, 1, 1),
        widths: Sequence[int] = (16, 32, 64),
        num_classes: int = 10,
        in_channels: int = 3,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if len(blocks_per_stage) != 3 or len(widths) != 3:
            raise ValueError("ResNet expects exactly three stages")
        self.conv1 = _conv3x3(in_channels, widths[0])
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=False)
        in_ch = widths[0]
        stages: list[nn.Sequential] = []
        for i, (n_blocks, width) in enumerate(zip(blocks_per_stage, widths)):
            stride = 1 if i == 0 else 2
            blocks: list[nn.Module] = []
            for j in range(n_blocks):
                blocks.append(BasicBlock(in_ch, width, stride if j == 0 else 1))
                in_ch = width
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(self.drop(x))


# --------------------------------------------------------------------------
# GPT
# --------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention computed with explicit ops.

    We deliberately avoid ``F.scaled_dot_product_attention``: a fused SDPA
    kernel would hide the two attention matmuls, the mask fill and the
    softmax inside one opaque node. Spelling them out keeps every matmul a
    visible, separately costed node in the captured graph.
    """

    mask: torch.Tensor

    def __init__(self, d_model: int, n_head: int, n_ctx: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_head != 0:
            raise ValueError(f"d_model={d_model} not divisible by n_head={n_head}")
        self.n_head = n_head
        self.d_model = d_model
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        # Non-persistent: the mask is derived from n_ctx, so it should not be
        # saved in (or required by) state_dict checkpoints.
        mask = torch.tril(torch.ones(n_ctx, n_ctx, dtype=torch.bool)).view(1, 1, n_ctx, n_ctx)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.c_attn(x).split(self.d_model, dim=2)
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_drop(att)
        y = torch.matmul(att, v)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.c_proj(y))


class MLP(nn.Module):
    """GPT-2 feed-forward block (d -> 4d -> d) with a GELU module.

    ``act`` is an ``nn.GELU`` module rather than ``F.gelu`` so the
    activation is attributed to ``blocks.N.mlp.act`` in profiles.
    """

    def __init__(self, d_model: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.c_proj = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln_1(x))``, ``x + mlp(ln_2(x))``."""

    def __init__(self, d_model: int, n_head: int, n_ctx: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, n_ctx, dropout)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A tiny GPT-2 style decoder-only language model.

    Defaults are small enough for CPU tests but structurally faithful
    (learned position embeddings, pre-norm blocks, final LayerNorm, bias-free
    LM head), so the op mix resembles a real transformer training step.
    ``tie_weights`` shares ``lm_head.weight`` with ``wte.weight`` to exercise
    parameter aliasing in captured graphs.
    """

    def __init__(
        self,
        vocab_size: int = 256,
        n_ctx: int = 64,
        d_model: int = 64,
        n_layer: int = 2,
        n_head: int = 4,
        dropout: float = 0.0,
        tie_weights: bool = False,
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.n_ctx = n_ctx
        self.d_model = d_model
        self.n_layer = n_layer
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(n_ctx, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            [Block(d_model, n_head, n_ctx, dropout) for _ in range(n_layer)]
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Map token ids ``(B, T)`` to logits ``(B, T, vocab_size)``."""
        _, T = idx.shape
        if T > self.n_ctx:
            raise ValueError(f"sequence length {T} exceeds n_ctx={self.n_ctx}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def matmul_weight_count(self) -> int:
        """Number of weights in matrices that participate in matmuls.

        This is the ``N`` in the usual ``6 * N * tokens`` training-FLOP
        estimate: every ``nn.Linear`` weight (attention ``c_attn``/``c_proj``,
        MLP ``c_fc``/``c_proj`` and ``lm_head``), excluding embedding lookups,
        biases and norm parameters, which cost no matmul FLOPs. The LM head
        counts even when tied to ``wte`` because its matmul still runs.
        """
        return sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
