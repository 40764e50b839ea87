"""Cost formulas of elementwise ops: arithmetic, activations and their
backward, random fills, optimizer updates (``_foreach_*`` and fused) and the
host scalar arithmetic recorded from ``.item()`` values.

An elementwise op costs ``k`` FLOPs per element it produces, where ``k``
counts the operations of its defining expression (each arithmetic op,
comparison, select or transcendental function is 1; the expression is given
next to ``k``). In-place variants (``add_``) and ``_foreach_`` variants
(``_foreach_add_``, summed over the list) share the functional op's ``k``.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch

from graphprof.passes.cost_formulas import (
    OpCall, builtin, cost, free_formula, is_one, numel, read_bytes, register_builtin, tensors_in,
    written_bytes,
)
from graphprof.passes.records import CostRecord

PerElement = Callable[[OpCall], int]


def _const(k: int) -> PerElement:
    return lambda call: k


def _alpha(call: OpCall) -> int:
    """a + alpha * b: the multiply by alpha is only done when alpha is not 1."""
    return 1 if is_one(call.arg("alpha", 1)) else 2


def _value_times(call: OpCall) -> int:
    """addcmul/addcdiv: self + value * (t1 op t2); the value multiply when value is not 1."""
    if call.arg("scalars") is not None:
        return 3
    return 2 if is_one(call.arg("value", 1)) else 3


def _clamp(call: OpCall) -> int:
    """One comparison per bound given."""
    bounds = [call.arg("min"), call.arg("max")]
    return max(1, sum(b is not None for b in bounds))


def _gelu(call: OpCall) -> int:
    """erf form 0.5*x*(1+erf(x/sqrt2)): 5; tanh form 0.5*x*(1+tanh(c*(x+0.044715*x^3))): 9."""
    return 9 if call.arg("approximate", "none") == "tanh" else 5


def _gelu_backward(call: OpCall) -> int:
    """g*(Phi(x) + x*phi(x)) recomputed from x: 10 (erf form), 14 (tanh form)."""
    return 14 if call.arg("approximate", "none") == "tanh" else 10


#: k per produced element, by aten op name.
ELEMENTWISE: dict[str, PerElement] = {
    # one operation each
    **{name: _const(1) for name in (
        "abs", "neg", "mul", "div", "reciprocal", "sqrt", "rsqrt", "exp", "exp2", "expm1",
        "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
        "tanh", "erf", "erfc", "erfinv", "sign", "sgn", "floor", "ceil", "round", "trunc", "frac",
        "relu", "clamp_min", "clamp_max", "minimum", "maximum", "fmin", "fmax", "eq", "ne", "lt",
        "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and",
        "bitwise_or", "bitwise_xor", "bitwise_not", "where", "masked_fill", "pow", "square", "fmod",
        "remainder", "atan2", "isnan", "isinf", "isfinite", "threshold", "threshold_backward",
        "tril", "triu", "signbit", "floor_divide", "rsub",
    )},
    "add": _alpha,
    "sub": _alpha,
    "addcmul": _value_times,      # self + value * t1 * t2
    "addcdiv": _value_times,      # self + value * t1 / t2
    "lerp": _const(3),            # self + w * (end - self)
    "clamp": _clamp,
    "clip": _clamp,
    "hardtanh": _const(2),        # min(max(x, lo), hi)
    "hardtanh_backward": _const(2),
    "relu6": _const(2),
    "leaky_relu": _const(2),      # x > 0 ? x : a*x
    "leaky_relu_backward": _const(2),
    "elu": _const(4),             # x > 0 ? x : a*(exp(x) - 1)
    "elu_backward": _const(3),
    "sigmoid": _const(4),         # 1 / (1 + exp(-x))
    "sigmoid_backward": _const(3),  # g * y * (1 - y)
    "tanh_backward": _const(3),   # g * (1 - y*y)
    "silu": _const(5),            # x * sigmoid(x)
    "silu_backward": _const(9),   # g * s * (1 + x * (1 - s))
    "gelu": _gelu,
    "gelu_backward": _gelu_backward,
    "softplus": _const(4),        # x*b > t ? x : log(1 + exp(b*x)) / b
    "softplus_backward": _const(5),
    "hardswish": _const(5),       # x * min(max(x + 3, 0), 6) / 6
    "hardswish_backward": _const(4),
    "hardsigmoid": _const(4),
    "hardsigmoid_backward": _const(3),
    "mish": _const(6),            # x * tanh(softplus(x))
    "mish_backward": _const(11),
    "logit": _const(3),
    "nan_to_num": _const(3),      # isnan, isinf, select
    "xlogy": _const(3),
    "native_dropout_backward": _const(2),  # g * mask * scale
    "_prelu_kernel": _const(2),   # x > 0 ? x : w*x
    "_prelu_kernel_backward": _const(5),  # g*(x > 0 ? 1 : w): 3; g*x where x <= 0: 2
}

#: Random fills: one draw per element (bernoulli also compares with p).
RANDOM: dict[str, int] = {
    "uniform": 1, "normal": 1, "random": 1, "exponential": 1, "geometric": 1, "cauchy": 1,
    "log_normal": 1, "bernoulli": 2, "rand_like": 1, "randn_like": 1, "randint_like": 1,
    "rand": 1, "randn": 1, "randint": 1, "randperm": 1,
}


def _self_tensor(call: OpCall) -> torch.Tensor | None:
    first = call.args[0] if call.args else None
    return first if isinstance(first, torch.Tensor) else None


def _elementwise(k: PerElement, write_only: bool) -> Callable[[OpCall], CostRecord]:
    def formula(call: OpCall) -> CostRecord:
        flops = k(call) * call.out_numel
        if write_only:
            self_t = _self_tensor(call)
            return cost(call, flops, bytes_read=read_bytes(t for t in call.inputs if t is not self_t))
        return cost(call, flops)

    return formula


def _foreach(k: PerElement, write_only: bool) -> Callable[[OpCall], CostRecord]:
    """A ``_foreach_`` op: ``k`` per element over every tensor of the list it produces."""
    def formula(call: OpCall) -> CostRecord:
        produced = tensors_in(call.out) or list(call.written)
        flops = k(call) * sum(numel(t) for t in produced)
        if write_only:
            mine = {id(t) for t in tensors_in(call.args[0])}
            return cost(call, flops, bytes_read=read_bytes(t for t in call.inputs if id(t) not in mine))
        return cost(call, flops)

    return formula


def _register_elementwise(name: str, k: PerElement) -> None:
    """The op, its in-place variant and its ``_foreach_`` variants, where torch has them."""
    builtin(name)(_elementwise(k, write_only=False))
    builtin(f"{name}_", optional=True)(_elementwise(k, write_only=False))
    builtin(f"_foreach_{name}", optional=True)(_foreach(k, write_only=False))
    builtin(f"_foreach_{name}_", optional=True)(_foreach(k, write_only=False))


def _register_all() -> None:
    for name, k in ELEMENTWISE.items():
        _register_elementwise(name, k)
    for name, per in RANDOM.items():
        if name.endswith("_like") or name in ("rand", "randn", "randint", "randperm"):
            builtin(name)(_elementwise(_const(per), write_only=True))
        else:
            builtin(f"{name}_")(_elementwise(_const(per), write_only=True))
    # prims: the elementwise primitives of decomposed graphs (AOTAutograd segments) share the rules
    for name, k in ELEMENTWISE.items():
        builtin(f"prims::{name}")(_elementwise(k, write_only=False))
    builtin("prims::fma")(_elementwise(_const(2), write_only=False))  # a * b + c
    builtin("bernoulli")(_elementwise(_const(2), write_only=False))
    builtin("normal")(_elementwise(_const(1), write_only=False))
    for name in ("fill", "zero", "copy"):  # overwrite self: only a source is read
        builtin([name, f"{name}_"])(_elementwise(_const(0), write_only=True))
        builtin(f"_foreach_{name}_", optional=True)(_foreach(_const(0), write_only=True))


_register_all()


@builtin("native_dropout")
def _native_dropout(call: OpCall) -> CostRecord:
    """Training: draw, compare with p, multiply by mask and by 1/(1-p): 4 per element."""
    train = call.arg("train")
    return cost(call, (4 if train is not False else 0) * call.out_numel)


# -- optimizer: fused kernels ------------------------------------------------------
def _param_elements(call: OpCall) -> int:
    return sum(numel(t) for t in tensors_in(call.args[0]))


def _weight_decay_flops(call: OpCall, decoupled: bool) -> int:
    if call.arg("weight_decay", 0) == 0:
        return 0
    return 1 if decoupled else 2  # p *= 1 - lr*wd ; g = g + wd * p


def _fused_cost(call: OpCall, per_element: int, state_lists: tuple[str, ...]) -> CostRecord:
    """A fused optimizer kernel writes the parameters and its state lists; the
    schema also marks the gradients mutable, but they are only written when
    unscaled (``grad_scale``) or negated (``maximize``)."""
    lists = ["self", *state_lists]
    if call.arg("grad_scale") is not None or call.arg("maximize", False):
        lists.append("grads")
    written = [t for name in lists for t in tensors_in(call.arg(name))]
    return cost(call, per_element * _param_elements(call), bytes_written=written_bytes(written))


@builtin(["_fused_adam_", "_fused_adam", "_fused_adamw_", "_fused_adamw"])
def _fused_adam(call: OpCall) -> CostRecord:
    """Per element, as the unfused Adam of torch.optim: lerp 3, mul 1, addcmul 3,
    sqrt 1, div 1, add eps 1, addcdiv 3 = 13; weight decay +2 (Adam) or +1
    (AdamW, decoupled); amsgrad +1 (max). The step count is incremented outside."""
    decoupled = "adamw" in call.target.overloadpacket.__name__
    amsgrad = bool(call.arg("amsgrad", False))
    per = 13 + _weight_decay_flops(call, decoupled) + (1 if amsgrad else 0)
    state = ("exp_avgs", "exp_avg_sqs") + (("max_exp_avg_sqs",) if amsgrad else ())
    return _fused_cost(call, per, state)


@builtin(["_fused_sgd_", "_fused_sgd"])
def _fused_sgd(call: OpCall) -> CostRecord:
    """Per element, as the foreach SGD: weight decay 2, buf = m*buf + (1-d)*g
    (2, or 3 with dampening), nesterov g + m*buf 2, p -= lr*g 2."""
    per = 2 + _weight_decay_flops(call, decoupled=False)
    momentum = call.arg("momentum", 0) != 0
    if momentum:
        per += (2 if call.arg("dampening", 0) == 0 else 3) + (2 if call.arg("nesterov", False) else 0)
    return _fused_cost(call, per, ("momentum_buffer_list",) if momentum else ())


@builtin(["_fused_adagrad_", "_fused_adagrad"])
def _fused_adagrad(call: OpCall) -> CostRecord:
    """Per element: sum += g*g 2, p -= lr * g / (sqrt(sum) + eps) 4; weight decay +2."""
    per = 6 + _weight_decay_flops(call, decoupled=False)
    return _fused_cost(call, per, ("state_sums",))


# -- host scalar arithmetic ----------------------------------------------------------
def _host_scalar(call: OpCall) -> CostRecord:
    """Python arithmetic on host numbers (``.item()`` values): 1 FLOP, no tensor bytes."""
    return CostRecord(flops=1, bytes_read=0, bytes_written=0)


HOST_ARITHMETIC: tuple[Callable[..., Any], ...] = (
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
    operator.pow, operator.neg, operator.pos, operator.abs, operator.lt, operator.le, operator.gt,
    operator.ge, operator.eq, operator.ne,
)
register_builtin(HOST_ARITHMETIC, _host_scalar)
register_builtin((operator.getitem,), free_formula())
