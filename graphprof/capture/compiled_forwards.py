"""Which module forwards a segmented step compiles, and the entry through which each is compiled.

Segmented capture (capture/segmented.py) compiles the forwards of the
modules the step reaches, not the step: the step's own Python runs eagerly.
Which forwards (DDP's own stays eager, a forward that is a whole training
step gives way to its children), the entry that gives each forward a dynamo
cache of its own, and the wrapper that hands a compiled graph a split input
once per read are decided here, apart from the capture's bookkeeping.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from graphprof.capture.dynamo_entry import DirectEntry
from graphprof.capture.gradient_uses import SplitInputs


def compile_targets(module: nn.Module) -> list[nn.Module]:
    """The modules whose forwards are compiled for ``module``: DDP's own forward stays eager (its Reducer
    is Python), and so does a forward that is a whole training step (a GAN module's ``forward`` that
    runs both players' backward and optimizer steps: compiled, its second backward went through
    the graph a second time, where eager runs): its submodules are compiled instead."""
    from torch.nn.parallel import DistributedDataParallel
    if isinstance(module, DistributedDataParallel):
        return [module.module]
    if _trains(type(module).forward) or "forward" in vars(module):
        # A forward set on the module itself (a library's wrapper) runs as set: compiled forwards are
        # installed through the class (capture/installed_forwards.py), which it hides.
        return [target for child in module.children() for target in compile_targets(child)]
    return [module]


def _trains(forward: Any) -> bool:
    """Whether a forward's own code calls ``backward`` (``loss.backward()``, ``torch.autograd.backward``)."""
    code = getattr(forward, "__code__", None)
    return code is not None and "backward" in code.co_names


def compiled_forward(module: nn.Module, backend: Any) -> Callable[..., Any]:
    """``module.forward`` compiled behind an entry function with a code object of its own.

    Dynamo keeps compiled graphs per code object. torch.compile wraps a
    forward defined in torch (``nn.Sequential``'s) in one wrapper shared by
    all of them, and every model of one class shares its forward: past
    ``recompile_limit`` (8) entries dynamo runs it eagerly without a word.
    A fresh entry function per traced module gives each its own cache.
    While its one cached graph's guards hold, it is called without entering
    dynamo's frame machinery (capture/dynamo_entry.py says why that is exact).
    """
    forward = module.forward

    def entry(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    entry.__code__ = entry.__code__.replace()  # a new code object: a cache of its own
    return DirectEntry(entry, torch.compile(entry, backend=backend, dynamic=False))


def expanding(compiled: Callable[..., Any], split: SplitInputs) -> Callable[..., Any]:
    """``compiled`` called with the caller's inputs, a split input handed once per read; never traced by
    dynamo, as AOTAutograd's own function is not."""
    def run(*args: Any) -> Any:
        return compiled(*split.expand(args))

    return torch._dynamo.disable(run, reason="runs a graph graphprof compiled")
