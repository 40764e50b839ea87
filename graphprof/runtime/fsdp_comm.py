"""Timing FSDP2's collectives, and what sharding holds in memory, per rank and step.

FSDP2 issues its all-gathers (before a module's forward and backward) and
reduce-scatters (of gradients, after a module's backward) from module and
autograd hooks that run eagerly, outside every captured graph. With torch
2.13 it calls ``dist.all_gather_single`` and ``dist.reduce_scatter_single``
(``all_gather_into_tensor`` and ``reduce_scatter_tensor`` are aliases of
them), and ``dist.all_reduce`` for HSDP. While a recorded step runs,
graphprof replaces those three functions of ``torch.distributed`` by
wrappers that call the original and note the collective's kind, its
NCCL-tests size (the gathered output for an all-gather, the input for a
reduce-scatter, the buffer for an all-reduce), the FSDP module and phase
that issued it (found from FSDP's parameter group on the call stack), and
its launch and completion times. The original runs with the same arguments:
nothing FSDP computes changes. They are put back when the step ends, so
nothing outside a recorded step is wrapped.

A collective called with ``async_op=False`` completes before it returns
(gloo on CPU: the calling thread waits for it); with ``async_op=True`` its
completion is the time its Work's future completes. On an accelerator both
are host times: a collective FSDP queues on its own stream returns at once,
and its device time is not seen here.

Overlap. Per step, the communication intervals (launch to completion) and
the computation intervals (the runs of the captured graphs: segments and
optimizer) are merged into unions; hidden communication is the time both
run, exposed communication the rest of the communication union. On gloo
every FSDP2 collective is synchronous on the thread that computes, so
nothing is hidden: hidden 0, exposed = communication. The figures are
computed from intervals so that the same arithmetic holds where collectives
do run beside computation (async work on gloo's threads, GPU streams).

Memory, measured at the end of each recorded step (after the optimizer, before
the next ``zero_grad``): bytes of the local shards of parameters, gradients
and optimizer state; the largest total of unsharded parameter storage FSDP
held at once (sampled after every collective, which is when it grows); and the
same model's need unsharded, from the global shapes.
"""

from __future__ import annotations

import functools
import inspect
import sys
from types import FrameType
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from graphprof.capture.dtensor import is_dtensor, local_shard
from graphprof.capture.fsdp import fsdp_modules
from graphprof.capture.state import discover_state
from graphprof.profile.model import NS_PER_S, AttrValue, GraphKind, GraphRecord, NodeRecord, Phase

#: Steps of events kept (a profile never holds more steps than this).
MAX_STEPS = 1000
#: ``torch.distributed`` function → (collective kind, which tensor argument is the NCCL-tests size).
_WRAPPED: dict[str, tuple[str, str]] = {
    "all_gather_single": ("allgather", "output_tensor"),  # the gathered output
    "reduce_scatter_single": ("reduce_scatter", "input"),  # the input before scattering
    "all_reduce": ("allreduce", "tensor"),
}


@dataclass(frozen=True)
class CollectiveEvent:
    """One collective FSDP issued in one step."""

    kind: str
    nbytes: int
    numel: int
    dtype: str
    world_size: int
    module: str  # the FSDP module's path ("" for the root)
    phase: Phase
    launch_ns: int
    done_ns: int
    blocking: bool  # async_op=False: the calling thread waited for it


@dataclass(frozen=True)
class ShardedMemory:
    """Bytes one rank holds at the end of a step, against the same model unsharded."""

    params_bytes: int
    grads_bytes: int
    optimizer_state_bytes: int
    unsharded_peak_bytes: int
    unsharded_params_bytes: int
    unsharded_grads_bytes: int
    unsharded_optimizer_state_bytes: int


def union_ns(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint intervals covering ``intervals``."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def overlap_ns(comm: Iterable[tuple[int, int]], compute: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """(communication time, the part of it computation ran beside), from intervals."""
    a, b = union_ns(comm), union_ns(compute)
    total = sum(e - s for s, e in a)
    hidden, j = 0, 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            hidden += min(e, b[k][1]) - max(s, b[k][0])
            k += 1
    return total, hidden


def _caller_group() -> tuple[str, Phase]:
    """The FSDP module path and phase of the parameter group whose hook issued this collective."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        group = frame.f_locals.get("self")
        if type(group).__name__ == "FSDPParamGroup":
            state = getattr(getattr(group, "_training_state", None), "name", "")
            phase = Phase.FORWARD if state == "FORWARD" else Phase.BACKWARD if "BACKWARD" in state else Phase.OTHER
            return getattr(group, "_module_fqn", "") or "", phase
        frame = frame.f_back
    return "", Phase.OTHER


def _nbytes(t: Any) -> tuple[int, int, str]:
    t = local_shard(t)
    if not isinstance(t, torch.Tensor):
        return 0, 0, ""
    return t.numel() * t.element_size(), t.numel(), str(t.dtype).removeprefix("torch.")


def _storage_bytes(tensors: Iterable[Any]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and not is_dtensor(t):
            storage = t.untyped_storage()
            if storage.nbytes() > 0:
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _global_bytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0  # a DTensor's numel is global


class FsdpCommTimer:
    """Collective events and sharded memory of the FSDP2 modules a traced function uses."""

    def __init__(self, modules: Sequence[torch.nn.Module], clock: Callable[[], int]) -> None:
        self._clock = clock
        self._modules = list(modules)
        self._optimizers: list[torch.optim.Optimizer] = []
        self._current: list[CollectiveEvent] = []
        self._unsharded_peak = 0
        self._saved: list[tuple[Any, str, Any]] = []
        self._wrappers: dict[str, Callable[..., Any]] = {}  # made once, installed for each recorded step
        self.recording = False
        #: Told of each blocking collective as it completes (the segmented step's timeline, so that host gaps
        #: leave the collective's time to the comm graph).
        self.sink: Callable[[CollectiveEvent], None] | None = None
        self.steps: dict[int, tuple[tuple[CollectiveEvent, ...], ShardedMemory]] = {}

    def watch_optimizers(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        self._optimizers = list(optimizers)

    # -- wrapping ---------------------------------------------------------------
    def _wrap(self, original: Callable[..., Any], kind: str, size_arg: str) -> Callable[..., Any]:
        import torch.distributed as dist

        clock, current = self._clock, self._current

        signature = inspect.signature(original)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            arguments = signature.bind_partial(*args, **kwargs).arguments
            tensor, group = arguments.get(size_arg), arguments.get("group")
            module, phase = _caller_group()
            nbytes, numel, dtype = _nbytes(tensor)
            size = dist.get_world_size(group if isinstance(group, dist.ProcessGroup) else None)
            launch = clock()
            work = original(*args, **kwargs)
            meta = (kind, nbytes, numel, dtype, size, module, phase, launch)
            if work is None or not hasattr(work, "get_future"):
                event = CollectiveEvent(*meta, clock(), True)
                current.append(event)
                if self.sink is not None:
                    self.sink(event)
                self._sample_unsharded(nbytes if kind == "allgather" else 0)
            else:
                def completed(fut: torch.futures.Future) -> None:
                    current.append(CollectiveEvent(*meta, clock(), False))

                work.get_future().then(completed)
            return work

        return torch._dynamo.disable(timed)

    def _install(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for name, (kind, size_arg) in _WRAPPED.items():
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapper = self._wrappers.get(name)
            if wrapper is None or wrapper.__wrapped_original__ is not original:  # type: ignore[attr-defined]
                wrapper = self._wrappers[name] = self._wrap(original, kind, size_arg)
                wrapper.__wrapped_original__ = original  # type: ignore[attr-defined]
            for namespace in (dist, c10d):
                if getattr(namespace, name, None) is original:
                    self._saved.append((namespace, name, original))
                    setattr(namespace, name, wrapper)

    def _uninstall(self) -> None:
        for namespace, name, original in reversed(self._saved):
            setattr(namespace, name, original)
        self._saved.clear()

    def _sample_unsharded(self, gathered_bytes: int) -> None:
        """Unsharded parameter storage alive now, plus the buffer an all-gather just filled."""
        outputs = (t for m in self._modules for fp in _fsdp_params(m) for t in getattr(fp, "all_gather_outputs", ()))
        self._unsharded_peak = max(self._unsharded_peak, _storage_bytes(outputs) + gathered_bytes)

    # -- steps ------------------------------------------------------------------
    def begin_step(self, recording: bool) -> None:
        self.recording = recording
        self._current.clear()
        self._unsharded_peak = 0
        if recording:
            self._install()

    def end_step(self, index: int) -> None:
        """Keep step ``index``'s collectives and memory (FSDP has waited for every collective by now)."""
        self._uninstall()
        if self.recording:
            self.steps[index] = (tuple(sorted(self._current, key=lambda e: e.launch_ns)), self.memory())
            while len(self.steps) > MAX_STEPS:
                self.steps.pop(next(iter(self.steps)))
        self.recording = False
        self._current.clear()

    @property
    def _params(self) -> list[Any]:
        return list({id(p): p for m in self._modules for p in m.parameters()}.values())

    def memory(self) -> ShardedMemory:
        params = self._params
        grads = [p.grad for p in params if p.grad is not None]
        states = [v for opt in self._optimizers for p in params
                  for v in opt.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
        local = lambda ts: sum(_nbytes(t)[0] for t in ts)  # noqa: E731
        return ShardedMemory(
            params_bytes=local(params), grads_bytes=local(grads), optimizer_state_bytes=local(states),
            unsharded_peak_bytes=self._unsharded_peak,
            unsharded_params_bytes=sum(map(_global_bytes, params)),
            unsharded_grads_bytes=sum(_global_bytes(p) for p in params if p.grad is not None),
            unsharded_optimizer_state_bytes=sum(map(_global_bytes, states)))

    # -- the profile --------------------------------------------------------------
    def graph_record(self, step_indices: Sequence[int], graph_id: int) -> GraphRecord | None:
        """The "comm" graph of ``step_indices``: one node per collective FSDP issues in a step."""
        keyed: list[dict[tuple, CollectiveEvent]] = []
        order: dict[tuple, CollectiveEvent] = {}
        for index in step_indices:
            counts: dict[tuple, int] = {}
            mine: dict[tuple, CollectiveEvent] = {}
            for ev in self.steps.get(index, ((), None))[0]:
                base = (ev.kind, ev.module, ev.phase)
                key = (*base, counts.get(base, 0))
                counts[base] = key[-1] + 1
                mine[key] = ev
                order.setdefault(key, ev)
            keyed.append(mine)
        if not order:
            return None
        nodes = []
        for node_id, (key, ev) in enumerate(order.items()):
            where = ev.module or "root"
            times_ns = tuple(m[key].done_ns - m[key].launch_ns if key in m else 0 for m in keyed)
            attrs: tuple[tuple[str, AttrValue], ...] = (
                ("blocking", bool(ev.blocking)), ("bytes", ev.nbytes), ("collective", ev.kind), ("source", "fsdp"),
                ("world_size", ev.world_size))
            nodes.append(NodeRecord(
                id=node_id, name=f"{ev.kind} {where} ({ev.phase.value})" + (f" #{key[-1] + 1}" if key[-1] else ""),
                op=f"c10d.{ev.kind}", type=ev.kind, in_shapes=((ev.numel,),), in_dtypes=(ev.dtype,),
                out_shapes=((ev.numel,),), out_dtypes=(ev.dtype,), module=ev.module, phase=ev.phase, flops=0,
                bytes_read=ev.nbytes, bytes_written=ev.nbytes, host_time_ns=times_ns, attrs=attrs))
        return GraphRecord(id=graph_id, name="comm", kind=GraphKind.HOST, nodes=tuple(nodes))

    def extra(self, step_indices: Sequence[int], compute: dict[int, list[tuple[int, int]]]) -> dict[str, Any]:
        """``DistributedInfo.fsdp``: per step, communication, hidden time and memory."""
        per_step: dict[str, Any] = {}
        for index in step_indices:
            if index not in self.steps:
                continue
            events, memory = self.steps[index]
            comm_ns, hidden_ns = overlap_ns(((e.launch_ns, e.done_ns) for e in events), compute.get(index, ()))
            per_step[str(index)] = {"comm_s": comm_ns / NS_PER_S, "hidden_s": hidden_ns / NS_PER_S,
                                    "memory": dict(memory.__dict__)}
        return {"modules": len(self._modules), "steps": per_step}


def _fsdp_params(module: torch.nn.Module) -> list[Any]:
    get_state = getattr(module, "_get_fsdp_state", None)
    state = get_state() if callable(get_state) else None
    group = getattr(state, "_fsdp_param_group", None)
    return list(getattr(group, "fsdp_params", ()) or ())


def fsdp_timer_for(fn: Callable[..., Any], clock: Callable[[], int]) -> FsdpCommTimer | None:
    """A timer for the FSDP2 modules ``fn`` reaches by name; None when it has none."""
    state = discover_state(fn)
    modules = fsdp_modules(state.roots)
    if not modules:
        return None
    timer = FsdpCommTimer(modules, clock)
    timer.watch_optimizers(state.optimizers)
    return timer
