"""FSDP2 (``torch.distributed.fsdp.fully_shard``) steps: why they are not one static graph.

Found by experiment (torch 2.13, gloo, CPU, a 2-block transformer with
``fully_shard`` per block and on the root, AdamW):

* A whole-step ``make_fx`` capture of an FSDP2 step either fails ("Attempted
  to access the data pointer on an invalid python storage": FSDP2 frees the
  unsharded parameters' storage with ``resize_(0)`` after use) or, when it
  gets through, records one step of FSDP's runtime as constants: the
  unsharded parameter buffers of that step, the all-gathers and
  reduce-scatters in the order its prefetching chose then, and the copies in
  and out of its padded buffers. Replaying that crashed a rank (SIGSEGV) and
  could not do what FSDP decides each step (which module to all-gather next,
  when to free, when gradients are reduced). So whole-step capture refuses a
  step that uses an FSDP2 module, like a DDP one (``capture/distributed.py``),
  and ``capture="auto"`` profiles it as segments: FSDP's hooks run eagerly,
  as in the user's run, ``runtime/fsdp_comm.py`` times the collectives they
  issue, and the optimizer's whole-step graph runs on the local shards of
  the DTensor parameters (``capture/dtensor.py``).
"""

from __future__ import annotations

from typing import Any, Iterable

from torch import nn

REASON = ("FSDP2 (fully_shard) all-gathers parameters and frees their unsharded storage in module hooks, and "
          "chooses its prefetch and reduce-scatter schedule at run time; a static graph would replay one step "
          "of those decisions instead of running FSDP")


class FullyShardedStep(RuntimeError):
    """The step runs an FSDP2 module, which one static graph cannot replay."""


def _fsdp_module_type() -> type | None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch built without distributed support
        return None
    return FSDPModule


_FSDP_MODULE = _fsdp_module_type()


def is_fsdp(module: Any) -> bool:
    """True for a module ``fully_shard`` was applied to."""
    return _FSDP_MODULE is not None and isinstance(module, _FSDP_MODULE)


def fsdp_modules(modules: Iterable[nn.Module]) -> list[nn.Module]:
    """The FSDP2 modules among ``modules`` and their submodules, each once, outermost first."""
    seen: dict[int, nn.Module] = {}
    for root in modules:
        for module in root.modules():
            if is_fsdp(module):
                seen.setdefault(id(module), module)
    return list(seen.values())
