"""Ops whose kernels read autograd's grad mode, replayed with the mode they were captured in.

A replayed graph runs under ``torch.no_grad()``: its backward is explicit,
so autograd must not record it again. A few kernels decide *what they
compute* from grad mode rather than from their arguments. On CPU,
``mkldnn_rnn_layer`` (one layer and direction of ``nn.LSTM``) returns the
oneDNN workspace that its backward needs only while grad mode is on; under
``no_grad`` it returns none and the captured ``mkldnn_rnn_layer_backward``
fails. Such a node runs with grad mode on *below* the autograd dispatch key:
the kernel sees what eager showed it, and still nothing is recorded.

A node needs this only when the graph uses an output that exists only with
grad mode on (the workspace, read by the backward); an inference step's
layer runs as captured.

For the same reason a replay's results carry no record of its ops: a
function that runs no backward and returns a tensor autograd can still
differentiate is refused (``refuse_differentiable_outputs``); one whose
backward used the graph gets eager's flags back (capture/kept_history.py).
"""

from __future__ import annotations

import dataclasses

import functools
from typing import Any, Callable

import operator

import torch
import torch.fx

from graphprof.capture.scalars import DataDependentError

aten = torch.ops.aten

#: Op -> indices of the outputs its kernel produces only while grad mode is on.
GRAD_MODE_OUTPUTS: dict[Any, frozenset[int]] = {
    aten.mkldnn_rnn_layer.default: frozenset({3}),
}


def needs_grad_mode(node: torch.fx.Node) -> bool:
    """True when ``node``'s op reads grad mode and the graph uses what it produces only with it on."""
    outputs = GRAD_MODE_OUTPUTS.get(node.target)
    if outputs is None:
        return False
    return any(user.target is operator.getitem and user.args[1] in outputs and user.users
               for user in node.users)


def with_grad_mode(op: Callable[..., Any]) -> Callable[..., Any]:
    """``op`` called with grad mode on and autograd's recording skipped, as eager's kernel saw it."""
    @functools.wraps(op)
    def call(*args: Any, **kwargs: Any) -> Any:
        with torch.enable_grad(), torch._C._AutoDispatchBelowAutograd():
            return op(*args, **kwargs)
    return call


def refuse_differentiable_outputs(out_flat: list[Any], backwards: int) -> None:
    """Refuse a step that returns a tensor autograd can still differentiate and runs no backward itself.

    Why: a replay runs the graph under ``no_grad`` (its backward, when it has
    one, is explicit), so what it returns carries no record of its ops. A step with
    a backward returns a loss whose graph that backward already used (a replay gives
    it eager's flags, capture/kept_history.py); a step
    without one (a traced forward pass, ``loss = fwd(x).sum(); loss.backward()``
    outside it) hands its result to a backward outside, which would fail on the
    first replay. Such a step is profiled as segments, whose results keep it.
    """
    if backwards:
        return
    made = next((t.grad_fn for t in out_flat if isinstance(t, torch.Tensor) and t.grad_fn is not None), None)
    if made is not None:
        raise DataDependentError(
            f"the step returns a tensor autograd can still differentiate (made by {type(made).__name__}) and runs "
            "no backward itself: a replayed graph returns it without autograd's record, so a backward outside the "
            "step would fail (under torch.no_grad() it is returned as it is)")


def refuse_opaque_outputs(out_flat: list[Any], made_in_step: Callable[[Any], bool]) -> None:
    """Refuse a step that returns an object (a dataclass of its own) holding a tensor or a number the
    step made (``made_in_step``), with a sentence that says so. An object holding only what it held
    before the step (a module returned as it is) is the same object on every call, as before.

    Why: such an object is one leaf of the returned structure, so its fields
    are not outputs of the graph; the capture failed deep inside make_fx with
    "a number read at run time ... NotImplementedError", naming nothing the
    user wrote. A dict, a tuple, a namedtuple or a ``ModelOutput`` is
    flattened and replayed, and so is a dataclass whose fields are all it
    holds (``batches.rebuildable_output``); this object is not.
    """
    for leaf in out_flat:
        if isinstance(leaf, (torch.Tensor, type)) or made_in_step(leaf):
            continue
        fields = getattr(leaf, "__dict__", None)
        if dataclasses.is_dataclass(leaf):
            fields = {f.name: getattr(leaf, f.name, None) for f in dataclasses.fields(leaf)}
        if type(fields) is not dict:
            continue
        held = next((k for k, v in fields.items() if made_in_step(v)), None)
        if held is not None:
            rebuilt = (" (a dataclass is rebuilt only when its fields are all it holds: no __post_init__, no other "
                       "attribute)" if dataclasses.is_dataclass(leaf) else "")
            raise DataDependentError(
                f"the step returns a {type(leaf).__name__} whose {held} is a tensor or a number the step computes: "
                f"a replayed graph cannot rebuild such an object{rebuilt}; return a dict, a tuple or a namedtuple")
