"""Each read of a compiled graph's input gets its own gradient, summed by autograd in eager's order.

Why: eager autograd adds the gradients of a tensor's uses one by one, in
the order their backward functions run, for the uses of a layer usually
the last first: ``((g4 + g3) + g2) + g1``. A compiled graph's backward
returned one gradient per input, the sum of that graph's reads already
made. Where the reads of one tensor fall in several compiled graphs (an
encoder's output read twice by the cross-attention of each decoder layer,
the layers split into graphs by layerdrop; a weight shared by two
segments), autograd then added those partial sums, ``(g4 + g3) + (g2 +
g1)``: another rounding. Parameters and activations differed from eager
in the last bits from the first call (1e-14 to 4e-8 on BART, mBART and
Whisper with layerdrop, and Mixtral's eager experts).

So before AOTAutograd sees dynamo's graph, an input that needs a gradient
and is read more than once becomes one input per read, and the compiled
function is handed the same tensor once per read. Its backward returns
one gradient per read, and autograd adds them to the tensor's gradient
one by one, in the order of the inputs: the last read's input comes
first, as eager's backward reaches it first.

A read of an op's result that is the input itself counts as a read of the
input: ``x.to(torch.float32)`` of a float32 ``x`` (an RMSNorm's first line,
in Mixtral's and Qwen2-MoE's layers) hands back ``x``, so eager adds the
gradients of the norm's ``pow`` and ``*`` to ``x`` one by one. Each such
read gets a copy of the op, made from an input of its own. Before, the
graph saw one read of ``x`` and summed the two inside its backward: with
``x``'s residual read in another graph (a per-expert loop breaks the layer
into several), parameters differed from eager's in the last bits.

So does a read of a view of the input that the graph also returns
(Qwen2-MoE's ``hidden_states.view(-1, hidden)``, read by its shared expert
in the graph and by the routed experts in later ones). AOTAutograd makes
that output again outside the graph, as a view of the caller's tensor, and
the later reads add their gradients there, one by one as on eager's view;
the graph's own reads had been summed inside its backward and added to
the input apart. Each now gets a view of an input of its own, and the
tensor gets their gradients one by one, after the later reads' sum, as
eager's view hands it the same sum.

An input written in place, or returned by the graph itself, keeps its one
input: splitting it would change what the write or the caller sees.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx

_READERS = ("call_function", "call_method", "call_module")
#: What dynamo keeps on its graph module besides the graph, read by AOTAutograd (sources, compile id).
_DYNAMO_ATTRIBUTES = ("_param_name_to_source", "_source_to_user_stacks", "compile_subgraph_reason", "shape_env")


@dataclass(frozen=True)
class SplitInputs:
    """Per input of the split graph, the index of the caller's input it is handed."""

    sources: tuple[int, ...]

    def expand(self, args: Sequence[Any]) -> list[Any]:
        """The caller's inputs as the split graph takes them: a split input once per read."""
        return [args[i] for i in self.sources]


def _writes(user: torch.fx.Node) -> bool:
    """Whether a node may write to its arguments or hand them out: an in-place op or method, a function told
    ``inplace=True`` or given ``out=``, an item assignment; any node but an op (the graph's output)."""
    if user.op not in _READERS:
        return True
    target = user.target
    if isinstance(target, torch._ops.OpOverload):
        return bool(target._schema.is_mutable)
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if name.endswith("_") and not name.endswith("__") or "setitem" in name or "out" in user.kwargs:
        return True
    return user.kwargs.get("inplace") is True or _inplace_argument(target, user.args)


def _inplace_argument(target: Any, args: tuple[Any, ...]) -> bool:
    """Whether ``inplace=True`` is given by position (``F.relu(x, True)``)."""
    try:
        position = _inplace_position(target)
    except TypeError:  # a target that cannot be a cache key
        return False
    return position is not None and position < len(args) and args[position] is True


@functools.lru_cache(maxsize=None)
def _inplace_position(target: Any) -> int | None:
    """Where a function takes ``inplace`` by position (None: it takes none). Read once per function: a
    graph asks of every call in it."""
    try:
        parameters = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return None
    return parameters.index("inplace") if "inplace" in parameters else None


def _same_tensor(node: torch.fx.Node) -> dict[torch.fx.Node, torch.fx.Node | None]:
    """``node`` and the nodes that hand back ``node``'s own tensor (``x.to(torch.float32)`` of a float32
    ``x``, ``x.float()``, ``x.contiguous()`` of a contiguous one), each with the node it was made from.

    Eager's reads of such a result are reads of the input itself, each a gradient autograd adds to it
    (an RMSNorm's ``x.to(torch.float32)`` read by ``pow`` and by ``*``). Dynamo's example value says which
    they are: the op returned the very tensor it was given. A view is another tensor, with an autograd
    node of its own that sums its reads first, as the graph does; an in-place op (which also returns its
    tensor) leaves the graph unsplit."""
    same: dict[torch.fx.Node, torch.fx.Node | None] = {node: None}
    pending = [node]
    while pending:
        member = pending.pop()
        value = member.meta.get("example_value")
        if not isinstance(value, torch.Tensor):
            continue
        for user in member.users:
            if user.op in _READERS and not _writes(user) and (
                    user.meta.get("example_value") is value or _returned_view(user, value)):
                same[user] = member
                pending.append(user)
    return same


def _returned_view(node: torch.fx.Node, base: torch.Tensor) -> bool:
    """Whether ``node`` is a view of ``base`` that the graph returns. AOTAutograd makes such an output
    again outside the graph, as a view of the caller's tensor: the reads after the graph add their
    gradients on that view, and the ones in the graph must reach the tensor one by one too, as they
    reach eager's view (its reshape of their sum is the sum of their reshapes)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    value = node.meta.get("example_value")
    return (isinstance(value, torch.Tensor) and value._is_view() and any(user.op == "output" for user in node.users)
            and StorageWeakRef(value.untyped_storage()) == StorageWeakRef(base.untyped_storage()))


def _reads_of(same: dict[torch.fx.Node, torch.fx.Node | None], order: dict[torch.fx.Node, int]
              ) -> list[tuple[torch.fx.Node, torch.fx.Node]] | None:
    """Each read of the tensor ``same`` holds, as (reader, the node it reads), in the graph's order and
    each reader's order of arguments; None where one is the graph's output (or another non-op)."""
    users = sorted({user for member in same for user in member.users if user not in same}, key=order.__getitem__)
    if any(user.op not in _READERS and not _returns_view(user, same) for user in users):
        return None
    users = [user for user in users if user.op in _READERS]
    reads: list[tuple[torch.fx.Node, torch.fx.Node]] = []
    for user in users:
        found: list[torch.fx.Node] = []
        torch.fx.node.map_arg((user.args, user.kwargs), found.append)
        reads += [(user, arg) for arg in found if arg in same]
    return reads


def _returns_view(user: torch.fx.Node, same: dict[torch.fx.Node, torch.fx.Node | None]) -> bool:
    """Whether ``user`` is the graph's output and returns of ``same`` only views (``_returned_view``): an
    input or its very tensor returned keeps its one input, its reads inside the graph unsplit."""
    if user.op != "output":
        return False
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg(user.args, found.append)
    return all(same[arg] is not None and arg.meta.get("example_value") is not same[arg].meta.get(  # type: ignore[union-attr]
        "example_value") for arg in found if arg in same)


def _splittable(node: torch.fx.Node, example: Any, order: dict[torch.fx.Node, int]) -> bool:
    if not isinstance(example, torch.Tensor) or not example.requires_grad:
        return False
    reads = _reads_of(_same_tensor(node), order)  # a graph that writes in place is not split at all
    return reads is not None and len(reads) > 1


def _example_copy(example: torch.Tensor) -> torch.Tensor:
    """Another tensor like ``example``, fake, of static shape. Not ``example`` itself, which AOTAutograd would
    merge back into one input, nor a view of it, which it would guard by a source these inputs lack. A real
    one AOTAutograd made fake itself, with sizes of symbols no source names: a graph returning a view of
    the input had dynamo guard on them, and fail."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    if isinstance(example, FakeTensor):
        with example.fake_mode:
            made = torch.empty_strided(example.size(), example.stride(), dtype=example.dtype, device=example.device)
        return made.requires_grad_(example.requires_grad)
    with unset_fake_temporarily():
        made = torch.empty_strided(example.size(), example.stride(), dtype=example.dtype, device=example.device)
    fake_mode = torch._guards.detect_fake_mode()
    if fake_mode is not None:
        made = fake_mode.from_tensor(made, static_shapes=True)
    return made.requires_grad_(example.requires_grad)


def _copy(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, dict[torch.fx.Node, torch.fx.Node]]:
    """A copy of dynamo's graph module to change: dynamo reads the placeholders of its own to call the result."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, env))
    copied = torch.fx.GraphModule(gm, graph)
    copied.meta = dict(gm.meta)
    for old, new in env.items():  # dynamo's source of each input, an attribute of the node that ``graph_copy`` drops
        if hasattr(old, "_dynamo_source"):
            new._dynamo_source = old._dynamo_source  # type: ignore[attr-defined]
    for name in _DYNAMO_ATTRIBUTES:
        if hasattr(gm, name):
            setattr(copied, name, getattr(gm, name))
    return copied, env


def split_gradient_uses(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
                        ) -> tuple[torch.fx.GraphModule, list[Any], SplitInputs] | None:
    """A copy of ``gm`` in which each read of a gradient-needing input read more than once has an input of its
    own, the example inputs to match, and how to hand it the caller's inputs. None where no input is split,
    and where the graph writes in place at all: AOTAutograd is told the new inputs are other tensors than the
    one they are, which it must know of a tensor a write may change."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs) or any(_writes(n) for n in gm.graph.nodes if n.op in _READERS):
        return None
    order = {node: position for position, node in enumerate(gm.graph.nodes)}
    split = [_splittable(node, example, order) for node, example in zip(placeholders, example_inputs)]
    if not any(split):
        return None
    copied, env = _copy(gm)
    order = {node: position for position, node in enumerate(copied.graph.nodes)}
    sources: list[int] = []
    examples: list[Any] = []
    for index, (old, example) in enumerate(zip(placeholders, example_inputs)):
        sources.append(index)
        examples.append(example)
        if not split[index]:
            continue
        node = env[old]
        same = _same_tensor(node)
        reads = _reads_of(same, order) or []
        # The placeholder dynamo made stays first and takes the last read; new ones follow, earlier reads later.
        inputs, cursor = [node], node
        for number in range(1, len(reads)):
            with copied.graph.inserting_after(cursor):
                cursor = copied.graph.placeholder(f"{node.name}_read{number}")
            cursor.meta.update(node.meta)
            cursor._dynamo_source = None  # type: ignore[attr-defined]  # AOTAutograd's dedup of sources skips it
            inputs.append(cursor)
            sources.append(index)
            examples.append(_example_copy(example))
        _assign_reads(copied.graph, same, [user for user, _ in reads], list(reversed(inputs)))
    copied.graph.lint()
    copied.recompile()
    return copied, examples, SplitInputs(tuple(sources))


def _assign_reads(graph: torch.fx.Graph, same: dict[torch.fx.Node, torch.fx.Node | None],
                  reads: list[torch.fx.Node], handed: list[torch.fx.Node]) -> None:
    """Point read number ``i`` of the tensor ``same`` holds (``reads``' order, a reader once per read) at
    ``handed[i]``: a read of a node that hands back its input (``x.to(x.dtype)``) reads a copy of that node
    made from ``handed[i]``. The nodes copied are left with no reader, and removed."""
    inputs = iter(handed)
    for user in dict.fromkeys(reads):
        def swap(arg: torch.fx.Node, user: torch.fx.Node = user) -> torch.fx.Node:
            return _remade(graph, same, arg, next(inputs), user) if arg in same else arg

        user.args = torch.fx.node.map_arg(user.args, swap)  # type: ignore[assignment]
        user.kwargs = torch.fx.node.map_arg(user.kwargs, swap)  # type: ignore[assignment]
    for member, made_from in reversed(list(same.items())):
        if made_from is not None and not member.users:
            graph.erase_node(member)


def _remade(graph: torch.fx.Graph, same: dict[torch.fx.Node, torch.fx.Node | None], member: torch.fx.Node,
            start: torch.fx.Node, before: torch.fx.Node) -> torch.fx.Node:
    """``member`` made again, from ``start`` in place of the input it was made from, just before ``before``."""
    chain: list[torch.fx.Node] = []
    while same[member] is not None:
        chain.append(member)
        member = same[member]  # type: ignore[assignment]
    made = start
    for node in reversed(chain):
        def from_made(arg: torch.fx.Node, parent: torch.fx.Node | None = same[node], made: torch.fx.Node = made
                      ) -> torch.fx.Node:
            return made if arg is parent else arg

        with graph.inserting_before(before):
            made = graph.node_copy(node, from_made)
    return made
