"""A replay that raises: what it had changed when it stopped, and how to give the caller eager's outcome.

An op of a replayed graph can raise where eager raises too: a token id out
of range in an embedding, a class out of range in a loss, an allocation that
does not fit. A caller may catch that and go on (skip the batch), and must
then find what eager leaves. Eager leaves everything the step did before
the error: its Python effects, the gradients its backward set. A replay
does not: it assigns gradients and repeats the step's Python at its end.

Why this is decidable: the replay runs eager's ops in eager's order, so the
node that raised (from the traceback through the generated code,
``codegen.compile_graph``'s line map) tells what ran before it. The user's
state is as it was before the call when nothing up to that node, the node
included, did any of these:

* wrote a tensor the user holds (a parameter, an argument, state read at
  run time, a view of one; writes the schema does not declare included,
  capture/snapshot.py), as ``index_add_`` does before it raises;
* ran a host effect, or drew from a generator of the step's own (the
  default generators are put back from a copy taken at the call's start);
* dropped gradients where the capture did not see the step drop them, or
  that the step reads before it drops them (capture/grad_reads.py).

Then running the step eagerly from there gives exactly eager's error and
eager's state. Otherwise ``FailedReplay.written`` says what stands in the way.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Callable

import numpy as np
import torch
import torch.fx
import torch.utils._pytree as pytree

from graphprof.capture.data_assignments import assigned_data
from graphprof.capture.grad_scaler import OVERFLOW_CHECK, GradientsOverflowed, overflow_checks
from graphprof.capture.host_nodes import SILENT_AGAIN, is_reader
from graphprof.capture.scalars import DataDependentError
from graphprof.capture.snapshot import arguments_by_name, written_arguments
from graphprof.capture.captured_step import CapturedStep
from graphprof.capture.grad_drops import DROPS_GRADS
from graphprof.passes.records import CAPTURE, STATE, StateRole
from graphprof.runtime.allocator import node_device_types
from graphprof.runtime.kept_buffers import KEPT_BUFFER_BYTES, attribute, storage_bytes

#: Modules whose functions compute on Python numbers only (``n + 1``, ``math.sqrt``).
_PURE_MODULES = frozenset({"_operator", "operator", "math"})
#: Builtins a traced number's arithmetic records (``round(x)``).
_PURE_BUILTINS = (round,)


def _pure(target: Any) -> bool:
    """Whether a node calling ``target`` computes a number and changes nothing (numpy's ufuncs too)."""
    return (getattr(target, "__module__", None) in _PURE_MODULES or isinstance(target, np.ufunc)
            or any(target is f for f in _PURE_BUILTINS))


class ReplayError(Exception):
    """A replay raised ``error``; ``failure`` says whether the step can be run again eagerly."""

    def __init__(self, error: BaseException, failure: "FailedReplay") -> None:
        super().__init__(str(error))
        self.error = error
        self.failure = failure


@dataclass(frozen=True)
class FailedReplay:
    """Where a replay raised, and what it had changed by then."""

    #: The op that raised and its line, for a sentence ("" when the traceback does not say).
    node: str
    #: What the replay had changed that eager's run from the same state cannot be given back, in
    #: words; None when the user's state is as before the call (the generators once ``restore`` ran).
    written: str | None
    #: Puts back the default generators' states of the call's start.
    restore: Callable[[], None]


def failing_node(error: BaseException, executable: Any) -> torch.fx.Node | None:
    """The node of ``executable`` (a ``compile_graph`` function) whose line ``error`` was raised from."""
    code = getattr(executable, "__code__", None)
    lines = getattr(executable, "__graphprof_nodes__", None)
    if code is None or lines is None:
        return None
    tb: TracebackType | None = error.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code is code:
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is None or not 0 < line <= len(lines):
        return None
    return lines[line - 1]


def _nodes(value: Any) -> list[torch.fx.Node]:
    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.fx.Node)]


def describe(node: torch.fx.Node) -> str:
    """``node`` for a sentence: its op and the user's line (``embedding at train.py:41``)."""
    target = node.target
    name = target.overloadpacket.__name__ if isinstance(target, torch._ops.OpOverload) else node.name
    record = node.meta.get(CAPTURE)
    return f"{name} at {record.source}" if record is not None and record.source else name


def _held_name(node: torch.fx.Node) -> str:
    """The user's name of the tensor ``node`` is or views (``weight``, ``input0``), else the node's."""
    seen = node
    for _ in range(64):  # views of views: a short chain back to the state it views
        record = seen.meta.get(STATE)
        if record is not None:
            return str(record.name)
        inputs = seen.all_input_nodes
        if not inputs:
            break
        seen = inputs[0]
    return node.name


def _held_writes(node: torch.fx.Node, schema: Any, values: dict[str, Any], fresh: set[torch.fx.Node],
                 roots: Callable[[torch.fx.Node], frozenset[torch.fx.Node]], kept: frozenset[torch.fx.Node],
                 used: set[torch.fx.Node] | None) -> str | None:
    """What op ``node`` (its schema, its arguments by name) writes that the user holds (not the replay's
    own, nor all within ``kept``: those it adds to ``used``), in words; None when nothing."""
    for name in written_arguments(schema, values):
        held = [v for v in _nodes(values.get(name)) if v not in fresh]
        changed = [v for v in held if not roots(v) <= kept]
        if changed:
            return f"written {_held_name(changed[0])} ({describe(node)})"
        if used is not None:
            for v in held:
                used |= roots(v)
    return None


def first_change(graph: torch.fx.Graph, stop: torch.fx.Node, kept: frozenset[torch.fx.Node] = frozenset(),
                 used: set[torch.fx.Node] | None = None) -> str | None:
    """What the nodes before ``stop``, and ``stop`` itself, changed that outlives the call, in words;
    None when nothing.

    A tensor is the replay's own ("fresh") when an op made it, not a view
    of anything else: writing one changes nothing the user holds. Anything
    the rules do not know (a host effect, an op without a schema) counts as
    a change. The op that raised counts too: ``index_add_`` writes the rows
    before the first bad index, then raises.

    ``kept`` are ``get_attr`` nodes whose storage the replay copies at its
    start and puts back when it fails (runtime/kept_buffers.py): a write to
    a tensor that is, or views, only those is no change; each one written is
    added to ``used``. What a tensor views ("its roots") is followed through
    every argument an op's schema says its result may alias, so a write
    through a view of a kept buffer and a parameter together is a change.
    """
    fresh: set[torch.fx.Node] = set()
    aliases: dict[torch.fx.Node, frozenset[torch.fx.Node]] = {}  # roots of the held tensors ops made

    def roots(value: torch.fx.Node) -> frozenset[torch.fx.Node]:
        return aliases.get(value, frozenset((value,)))  # a graph input, state, or a value of unknown kind

    for node in graph.nodes:
        if node.op != "call_function":
            if node is stop:
                return None
            continue
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            schema = target._schema
            values = arguments_by_name(schema, node.args, node.kwargs)
            written = _held_writes(node, schema, values, fresh, roots, kept, used)
            if written is not None:
                return written if node is not stop else f"{written}, part of it before it raised"
            if node is stop:
                return None
            if _draws(node) and node.kwargs.get("generator") is not None:
                return f"drawn from the step's own generator ({describe(node)})"
            aliased = [v for arg in schema.arguments if arg.alias_info is not None for v in _nodes(values.get(arg.name))]
            if all(v in fresh for v in aliased):  # a new tensor, or a view of the replay's own
                fresh.add(node)
            else:
                aliases[node] = frozenset().union(*(roots(v) for v in aliased))
        elif node is stop:
            return None
        elif target is operator.getitem:
            if node.args and node.args[0] in fresh:
                fresh.add(node)
            elif node.args and isinstance(node.args[0], torch.fx.Node):
                aliases[node] = roots(node.args[0])
        elif is_reader(node) or node.meta.get(DROPS_GRADS) or node.meta.get(OVERFLOW_CHECK) or _pure(target):
            continue  # (gradients dropped where eager drops them: eager had dropped them too; a check reads)
        elif node.meta.get(SILENT_AGAIN) is not None and node.meta[SILENT_AGAIN]():
            continue  # a warning eager's run would not show again
        else:
            return f"run {getattr(target, '__name__', target)} ({describe(node)})"
    return None


def diagnose(step: CapturedStep, executable: Any, error: BaseException, restore: Callable[[], None],
             kept: frozenset[torch.fx.Node] = frozenset()) -> FailedReplay:
    """What the replay of ``step`` by ``executable`` (its plain or instrumented code) that raised
    ``error`` had changed; ``restore`` puts back the generators of the call's start, and the storage of
    the ``kept`` buffers (``kept_buffers``)."""
    raised = failing_node(error, executable)
    if raised is None:
        return FailedReplay("", "stopped where graphprof cannot tell", restore)
    nodes = list(step.graph_module.graph.nodes)
    position = {node.name: i for i, node in enumerate(nodes)}
    at = position.get(raised.name)
    if at is None or nodes[at].target is not raised.target:
        return FailedReplay(raised.name, "stopped where graphprof cannot tell", restore)
    return FailedReplay(describe(nodes[at]), changed_until(step, nodes, at, kept), restore)


def changed_until(step: CapturedStep, nodes: list[torch.fx.Node], at: int, kept: frozenset[torch.fx.Node] = frozenset(),
                  used: set[torch.fx.Node] | None = None) -> str | None:
    """What a replay of ``step`` (its graph's ``nodes``) that stops at ``nodes[at]`` has changed that eager's
    run from the call's start cannot give back, in words; None when nothing (``first_change`` says what
    ``kept`` and ``used`` are)."""
    written = first_change(step.graph_module.graph, nodes[at], kept, used)
    if written is None and step.drop_unseen:
        written = "dropped gradients where the capture did not see the step drop them (zero_grad)"
    dropped_before = step.start_clears or any(n.meta.get(DROPS_GRADS) for n in nodes[:at])
    if written is None and step.dropped_grads_read and dropped_before:
        written = "dropped gradients the step reads before it drops them (p.grad before zero_grad)"
    return written


def overflowed(failed: ReplayError) -> bool:
    """Whether a replay stopped at an overflow check (capture/grad_scaler.py) before it changed anything:
    eager's run of the call skips the optimizer's step, and later calls replay again."""
    return isinstance(failed.error, GradientsOverflowed) and failed.failure.written is None


def refuse_unsafe_overflow_checks(step: CapturedStep) -> frozenset[torch.fx.Node]:
    """Refuse a captured step whose replay could stop at an overflow check after it had written something
    the user holds (gradients accumulated into, another optimizer's update): such a replay could not
    give the caller eager's skipped step.

    Module buffers are the exception: BatchNorm writes its running statistics
    and ``num_batches_tracked`` in the forward, long before the check. Their
    storage is small, so a replay keeps a copy of it and puts it back before
    eager's run (runtime/kept_buffers.py). Returns the ``get_attr`` nodes of
    the buffers written before a check (none for a graph without checks),
    when their storage is ``KEPT_BUFFER_BYTES`` at most. Not a buffer the
    step gives new data (``.data = ...``, capture/data_assignments.py): the
    copy's storage would be the capture call's, not the one a replay writes.
    """
    graph = step.graph_module.graph
    checks = overflow_checks(graph)
    if not checks:
        return frozenset()
    nodes = list(graph.nodes)
    assigned = assigned_data(graph)  # their storage changes with every replay: not kept, a write to one refuses
    buffers = frozenset(n for n in nodes if n.op == "get_attr" and getattr(n.meta.get(STATE), "role", None)
                        is StateRole.BUFFER and isinstance(value := attribute(step.graph_module, n), torch.Tensor)
                        and id(value) not in assigned)
    used: set[torch.fx.Node] = set()
    for check in checks:
        _refuse_unless_unchanged(step, nodes, check, buffers, used, "")
    size = storage_bytes([attribute(step.graph_module, n) for n in used])
    if size > KEPT_BUFFER_BYTES:
        for check in checks:  # names the first buffer written, as for any other write
            _refuse_unless_unchanged(step, nodes, check, frozenset(), None,
                                     f" ({size} bytes of buffers, more than the {KEPT_BUFFER_BYTES} a replay "
                                     "copies to put them back)")
    return frozenset(used)


def _refuse_unless_unchanged(step: CapturedStep, nodes: list[torch.fx.Node], check: torch.fx.Node,
                             kept: frozenset[torch.fx.Node], used: set[torch.fx.Node] | None, why: str) -> None:
    written = changed_until(step, nodes, nodes.index(check), kept, used)
    if written is not None:
        raise DataDependentError(
            f"the gradient scaler's check for overflowed gradients ({describe(check)}) comes after the step "
            f"has {written}{why}, so a replay whose gradients overflow could not run the step again as eager "
            "would")


def _draws(node: torch.fx.Node) -> bool:
    """Whether ``node`` is an op that draws random numbers (from ``generator=``, else the default one)."""
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


def random_devices(graph: torch.fx.Graph) -> tuple[str, ...]:
    """The device types whose default generator the graph's ops draw from."""
    found: set[str] = set()
    for node in graph.nodes:
        if node.op == "call_function" and _draws(node) and node.kwargs.get("generator") is None:
            found |= node_device_types(node) or {"cpu"}
    return tuple(sorted(found))


def saved_generators(devices: tuple[str, ...]) -> Callable[[], None]:
    """A copy of the default generators' states of ``devices`` now; calling it puts them back."""
    states = []
    for device in devices:
        if device == "cpu":
            states.append((torch.set_rng_state, torch.get_rng_state()))
        else:
            module = torch.get_device_module(device)
            states.append((module.set_rng_state, module.get_rng_state()))

    def restore() -> None:
        for set_state, state in states:
            set_state(state)

    return restore

