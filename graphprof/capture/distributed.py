"""What capture must do differently when a step communicates (``torch.distributed``).

Found by experiment (torch 2.13, gloo, CPU), and why each rule exists:

* **DistributedDataParallel is not replayed from a whole-step graph.**
  ``make_fx`` does record DDP's bucket allreduce (a ``c10d.allreduce_`` node
  fed by the gradients scaled into the bucket, and copies back out of it),
  but not the ``Work.wait()`` the C++ Reducer calls before it copies the
  averaged bucket back into ``.grad``: a replayed graph reads the bucket
  while gloo is still writing it, and the ranks' gradients (then their
  parameters) silently diverge. With waits added (below) a 2-rank replay
  did match eager bitwise, but the graph is still one frozen step of the
  Reducer, not DDP: it replays, at every step, the bucket-order broadcasts
  of the iteration where the Reducer rebuilt its buckets; it runs the
  allreduces one after another instead of overlapping them with backward
  (so its profile is not the user's run); and ``no_sync``, unused-parameter
  search or a later bucket rebuild are not seen. So whole-step capture
  refuses a step that uses a DDP module (``refuse_ddp``); ``capture="auto"``
  then falls back to segmented capture, where DDP's own Reducer does the
  communication and ``graphprof.runtime.comm`` times it.
* **A collective called directly** (``dist.all_reduce(t)``) is recorded as a
  ``c10d.*`` op returning a Work handle; the ``wait()`` eager code calls on it
  is Python, not an op, so it is not recorded either. ``wait_for_collectives``
  makes each such node wait on its own Work right after launching it: replay
  then communicates and reads the reduced values, as eager does. A collective
  the user launched with ``async_op=True`` and waited on later is waited on
  at once (less overlap, same values). The node's time covers launch and
  completion.
"""

from __future__ import annotations

import contextlib
import functools
import socket
from typing import Any, Callable, Iterator

import torch
import torch.fx

from graphprof.capture.step_warnings import own_global_hooks
from graphprof.capture.fsdp import REASON as FSDP_REASON, FullyShardedStep, is_fsdp
from graphprof.passes.annotate import is_op_node
from graphprof.passes.cost_formulas_comm import WORK_OPS, schema_name


#: Set on a function that only runs an optimizer's step: the modules it names are there to name
#: parameters, it does not run them (a module it does run is still refused when called).
OPTIMIZER_ONLY = "__graphprof_optimizer_only__"


class DistributedDataParallelStep(RuntimeError):
    """The step runs a DistributedDataParallel module, which one static graph cannot replay."""


def _is_ddp(module: torch.nn.Module) -> bool:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # torch built without distributed support
        return False
    return isinstance(module, DistributedDataParallel)


_REASON = ("DistributedDataParallel communicates from C++ autograd hooks; a static graph would replay one step "
           "of its Reducer (without the waits on its allreduces) instead of running DDP")


@contextlib.contextmanager
def refuse_ddp(fn: Callable[..., Any] | None = None) -> Iterator[None]:
    """Raise ``DistributedDataParallelStep`` for a step that uses a DDP module (``FullyShardedStep`` for FSDP2).

    A DDP or FSDP2 module ``fn`` reaches by name (closure, globals, ``self``)
    is refused on entering the block, before anything runs: nothing to undo,
    and no collective is run twice. One reached otherwise is refused when it
    is called, before its forward runs (capture then restores what the step wrote).
    """
    if fn is not None and not getattr(fn, OPTIMIZER_ONLY, False):
        from graphprof.capture.state import discover_state

        for _, module in discover_state(fn).modules.values():
            _refuse(module)

    def check(module: torch.nn.Module, args: Any) -> None:
        _refuse(module)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(check)
    try:
        with own_global_hooks(handle):
            yield
    finally:
        handle.remove()


def _refuse(module: torch.nn.Module) -> None:
    if _is_ddp(module):
        raise DistributedDataParallelStep(_REASON)
    if is_fsdp(module):
        raise FullyShardedStep(FSDP_REASON)


def _wait_all(out: Any) -> None:
    """Wait on every Work handle in an op's result (a Work, or a tuple ending in one)."""
    items = out if isinstance(out, (tuple, list)) else (out,)
    for item in items:
        if isinstance(item, torch.ScriptObject) or type(item).__name__ == "Work":
            item.wait()


@functools.lru_cache(maxsize=None)
def waiting(op: Callable[..., Any]) -> Callable[..., Any]:
    """``op`` followed by a wait on the Work handle it returns; same result."""
    def launch_and_wait(*args: Any, **kwargs: Any) -> Any:
        out = op(*args, **kwargs)
        _wait_all(out)
        return out

    launch_and_wait.__name__ = f"{schema_name(op).replace('::', '_')}_and_wait"
    launch_and_wait.__qualname__ = launch_and_wait.__name__
    launch_and_wait.__graphprof_op__ = op  # type: ignore[attr-defined]
    return launch_and_wait


def wait_for_collectives(gm: torch.fx.GraphModule) -> int:
    """Make every ``c10d.*`` op node of a whole-step graph wait for its collective.

    Run after the passes: they keep describing the node by its op (annotation,
    cost, attrs are already written), only the callable that runs changes.
    Returns the number of nodes changed.
    """
    changed = 0
    for node in gm.graph.nodes:
        if is_op_node(node) and schema_name(node.target) in WORK_OPS:
            node.target = waiting(node.target)
            changed += 1
    if changed:
        gm.recompile()
    return changed


def distributed_meta() -> dict[str, Any] | None:
    """Rank, world size and backend of the default process group; None when there is none."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    return {
        "rank": int(dist.get_rank()),
        "world_size": int(dist.get_world_size()),
        "backend": str(dist.get_backend()),
        "host": socket.gethostname(),
    }
