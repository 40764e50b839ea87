"""Built-in demo models and training steps.

Used by ``graphprof demo``, the benchmarks and the test suite, so that all
of them profile the same small, deterministic, CPU-friendly workloads.
"""

from __future__ import annotations

from graphprof.demo.models import GPT, MLP, BasicBlock, Block, CausalSelfAttention, ResNet
from graphprof.demo.steps import (
    DEMO_STEPS,
    DemoStep,
    cnn_bn_dropout_step,
    gpt_adam_step,
    gpt_adamw_step,
    mlp_sgd_step,
    resnet_sgd_step,
    tiny_op_mlp_step,
)

__all__ = [
    "DEMO_STEPS",
    "GPT",
    "MLP",
    "BasicBlock",
    "Block",
    "CausalSelfAttention",
    "DemoStep",
    "ResNet",
    "cnn_bn_dropout_step",
    "gpt_adam_step",
    "gpt_adamw_step",
    "mlp_sgd_step",
    "resnet_sgd_step",
    "tiny_op_mlp_step",
]
