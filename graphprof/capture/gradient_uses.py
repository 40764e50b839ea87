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

An input written in place, or returned by the graph, keeps its one input:
splitting it would change what the write or the caller sees.
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


def _reads(user: torch.fx.Node, node: torch.fx.Node) -> int:
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg((user.args, user.kwargs), found.append)
    return sum(1 for arg in found if arg is node)


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


def _splittable(node: torch.fx.Node, example: Any) -> bool:
    if not isinstance(example, torch.Tensor) or not example.requires_grad:
        return False
    users = list(node.users)  # a graph that writes in place is not split at all: only the output is left out here
    return sum(_reads(user, node) for user in users) > 1 and all(user.op in _READERS for user in users)


def _example_copy(example: torch.Tensor) -> torch.Tensor:
    """Another tensor like ``example``, fake where it is. Not ``example`` itself, which AOTAutograd would merge
    back into one input, nor a view of it, which it would guard by a source these inputs lack."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    context = example.fake_mode if isinstance(example, FakeTensor) else unset_fake_temporarily()
    with context:
        made = torch.empty_strided(example.size(), example.stride(), dtype=example.dtype, device=example.device)
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
    split = [_splittable(node, example) for node, example in zip(placeholders, example_inputs)]
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
        reads = [user for user in sorted(node.users, key=order.__getitem__) for _ in range(_reads(user, node))]
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
        handed = dict(zip(range(len(reads)), reversed(inputs)))  # read number -> its input
        _assign_reads(node, reads, handed)
    copied.graph.lint()
    copied.recompile()
    return copied, examples, SplitInputs(tuple(sources))


def _assign_reads(node: torch.fx.Node, reads: list[torch.fx.Node], handed: dict[int, torch.fx.Node]) -> None:
    """Point read number ``i`` of ``node`` (in ``reads``' order, a user once per read) at ``handed[i]``."""
    number = 0
    for user in dict.fromkeys(reads):
        def swap(arg: torch.fx.Node) -> torch.fx.Node:
            nonlocal number
            if arg is not node:
                return arg
            number += 1
            return handed[number - 1]

        user.args = torch.fx.node.map_arg(user.args, swap)  # type: ignore[assignment]
        user.kwargs = torch.fx.node.map_arg(user.kwargs, swap)  # type: ignore[assignment]
