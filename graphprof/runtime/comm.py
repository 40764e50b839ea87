"""Timing DistributedDataParallel's gradient allreduces, bucket by bucket.

DDP's Reducer launches one allreduce per gradient bucket from C++ autograd
hooks, while backward goes on; no captured graph holds them. graphprof
registers a DDP communication hook (``register_comm_hook``) that does what
DDP does without one and notes, per bucket, its bytes, when it was launched
and when it completed. The profile gets them as a "comm" graph (one node per
bucket, op ``c10d.allreduce``) next to the segments and host graph.

Numerics are DDP's own, bit for bit. Without a hook the Reducer multiplies
each gradient by ``1/world_size`` while copying it into the bucket
(``mul_out``) and allreduces the sum; with a hook it copies the gradient
unscaled and the hook owns the scaling. So this hook multiplies the bucket by
``1/world_size`` (a float multiply, as ``mul_out`` does), then allreduces.
Where the Reducer would divide instead (``batched_grad_copy=True``; a
gradient that already is a bucket view with ``gradient_as_bucket_view=True``,
whose divide and multiply differ in the last bit unless the world size is a
power of two) the hook divides, or is not registered when the two cases could
mix. ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook``
divides, which is why it is not used as is. A model that already has a hook,
mixed precision or the Python reducer is left alone: its buckets are then
not timed, and the profile's meta says why.

A bucket's time runs from launch (after scaling) to the completion of its
allreduce, measured in the future's callback. It overlaps the backward
compute that goes on meanwhile, and on a fast rank it includes waiting for
slower ranks to launch the same bucket.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from graphprof.capture.state import discover_state
from graphprof.profile.model import AttrValue, DistributedInfo, GraphKind, GraphRecord, NodeRecord, Phase

log = logging.getLogger("graphprof")
#: Steps of bucket events kept (a profile never holds more steps than this).
MAX_STEPS = 1000


@dataclass(frozen=True)
class BucketEvent:
    """One allreduce of one gradient bucket in one step."""

    bucket: int
    nbytes: int
    numel: int
    dtype: str
    n_params: int
    world_size: int
    launch_ns: int
    done_ns: int


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def hook_refusal(ddp: Any) -> str | None:
    """Why graphprof must not register its hook on ``ddp`` (None when it may)."""
    if getattr(ddp, "_comm_hooks", None):
        return "the model has its own DDP communication hook"
    if getattr(ddp, "mixed_precision", None) is not None:
        return "DDP mixed precision installs its own hook"
    if getattr(ddp, "_use_python_reducer", False):
        return "the Python reducer (compiled autograd) is in use"
    size = ddp.process_group.size()
    if (getattr(ddp, "gradient_as_bucket_view", False) and not getattr(ddp, "batched_grad_copy", False)
            and not _is_power_of_two(size)):
        return ("with gradient_as_bucket_view=True and a world size that is not a power of two, "
                "DDP's own scaling cannot be reproduced bit for bit")
    return None


class CommTimer:
    """Per-bucket allreduce times of the DDP modules a traced function uses."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock
        self.recording = False
        self.attached = 0
        self.notes: list[str] = []
        self._current: list[BucketEvent] = []
        self._steps: OrderedDict[int, tuple[BucketEvent, ...]] = OrderedDict()

    def attach(self, ddp: Any) -> bool:
        """Register the timing hook on one DDP module; False (and a note) when it must not be."""
        reason = hook_refusal(ddp)
        if reason is None:
            try:
                ddp.register_comm_hook(None, self._hook_for(ddp))
            except RuntimeError as exc:  # e.g. a built-in C++ hook registered earlier
                reason = f"DDP refused the hook ({str(exc).strip().splitlines()[0]})"
        if reason is not None:
            self.notes.append(f"gradient allreduces not timed: {reason}")
            log.info("graphprof: %s", self.notes[-1])
            return False
        self.attached += 1
        return True

    def _hook_for(self, ddp: Any) -> Callable[[Any, Any], torch.futures.Future]:
        import torch.distributed as dist

        group = ddp.process_group
        size = group.size()
        # The Reducer divides a flat bucket with batched_grad_copy; it multiplies otherwise (a bucket
        # view it divides is only allowed where the two agree: hook_refusal).
        divide = bool(getattr(ddp, "batched_grad_copy", False))
        clock, current = self._clock, self._current

        # No annotations: DDP checks that a hook's are dist.GradBucket and Future[Tensor] objects, and
        # this module's annotations are strings (``from __future__ import annotations``).
        def graphprof_allreduce(state, bucket):  # type: ignore[no-untyped-def]
            buffer = bucket.buffer()
            if divide:
                buffer.div_(size)
            else:
                buffer.mul_(1.0 / size)
            recording = self.recording
            launch_ns = clock() if recording else 0
            future = dist.all_reduce(buffer, group=group, async_op=True).get_future()
            meta = (bucket.index(), buffer.numel() * buffer.element_size(), buffer.numel(),
                    str(buffer.dtype).removeprefix("torch."), len(bucket.parameters()))

            def completed(fut: torch.futures.Future) -> torch.Tensor:
                if recording:
                    current.append(BucketEvent(*meta, size, launch_ns, clock()))
                return fut.value()[0]

            return future.then(completed)

        # The hook runs inside the traced call: dynamo must not compile it into a segment.
        return torch._dynamo.disable(graphprof_allreduce)

    def begin_step(self, recording: bool) -> None:
        self.recording = recording and self.attached > 0
        self._current.clear()

    def end_step(self, index: int) -> None:
        """Keep the bucket events of step ``index`` (DDP has waited for all of them by now)."""
        if self.recording:
            self._steps[index] = tuple(self._current)
            while len(self._steps) > MAX_STEPS:
                self._steps.popitem(last=False)
        self.recording = False
        self._current.clear()

    def events(self, index: int) -> tuple[BucketEvent, ...]:
        return self._steps.get(index, ())

    def graph_record(self, step_indices: Sequence[int], graph_id: int) -> GraphRecord | None:
        """The "comm" graph of steps ``step_indices``: one node per bucket; None without events."""
        per_step = [self.events(i) for i in step_indices]
        first: dict[int, BucketEvent] = {}
        for events in per_step:
            for ev in sorted(events, key=lambda e: e.launch_ns):
                first.setdefault(ev.bucket, ev)
        if not first:
            return None
        nodes = []
        for node_id, (bucket, ev) in enumerate(first.items()):
            times = tuple(sum((e.done_ns - e.launch_ns) for e in events if e.bucket == bucket)
                          for events in per_step)
            attrs: tuple[tuple[str, AttrValue], ...] = (
                ("bucket", bucket), ("bytes", ev.nbytes), ("collective", "allreduce"), ("params", ev.n_params),
                ("source", "ddp_comm_hook"), ("world_size", ev.world_size))
            nodes.append(NodeRecord(
                id=node_id, name=f"allreduce bucket {bucket}", op="c10d.allreduce", type="allreduce",
                in_shapes=((ev.numel,),), in_dtypes=(ev.dtype,), out_shapes=((ev.numel,),), out_dtypes=(ev.dtype,),
                module="", phase=Phase.BACKWARD, flops=0, bytes_read=ev.nbytes, bytes_written=ev.nbytes,
                host_time_ns=times, attrs=attrs))
        return GraphRecord(id=graph_id, name="comm", kind=GraphKind.HOST, nodes=tuple(nodes))

    def meta(self) -> dict[str, Any]:
        """What the profile's ``DistributedInfo.details`` say about DDP communication."""
        out: dict[str, Any] = {"ddp_buckets_timed": self.attached > 0}
        if self.notes:
            out["notes"] = list(self.notes)
        return out


def ddp_modules(fn: Callable[..., Any]) -> list[Any]:
    """The DistributedDataParallel modules ``fn`` reaches by name (closure, globals, self)."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return []
    state = discover_state(fn)
    return [m for _, m in state.modules.values() if isinstance(m, DistributedDataParallel)]


def comm_timer_for(fn: Callable[..., Any], clock: Callable[[], int]) -> CommTimer | None:
    """A CommTimer attached to every DDP module of ``fn``; None when it has none."""
    modules = ddp_modules(fn)
    if not modules:
        return None
    timer = CommTimer(clock)
    for ddp in modules:
        timer.attach(ddp)
    return timer


def distributed_info(timer: CommTimer | None) -> DistributedInfo | None:
    """``meta.distributed`` of a profile taken now: rank, world size, backend, host
    (and what was timed of DDP's communication); None outside a process group."""
    from graphprof.capture.distributed import distributed_meta

    info = distributed_meta()
    if info is None:
        return None
    return DistributedInfo(rank=info["rank"], world_size=info["world_size"], backend=info["backend"],
                           host=info["host"], details=timer.meta() if timer is not None else {})
