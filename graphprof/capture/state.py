"""Find the user's modules and optimizers, and name the tensors they own.

A traced step usually closes over ``model``, ``opt`` and ``loss_fn``. Looking
them up in the function's closure, globals and bound ``self`` lets graphprof
name parameters (``layer1.0.conv1.weight``), attribute ops to modules
(``layer1.0.conv1``, ``Conv2d``), and tell parameters, buffers, gradients and
optimizer state apart for the memory model. Discovery only names things: the
captured graph is correct without it.
"""

from __future__ import annotations

import functools
import inspect
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from graphprof.capture.dtensor import local_shard
from graphprof.capture.locations import called_function, object_fields
from graphprof.capture.module_structure import hook_functions
from graphprof.passes.records import StateRecord, StateRole


@dataclass
class StateIndex:
    """Names and roles of the tensors and modules a traced function can reach."""

    modules: dict[int, tuple[str, nn.Module]] = field(default_factory=dict)
    tensors: dict[int, StateRecord] = field(default_factory=dict)
    params: dict[int, nn.Parameter] = field(default_factory=dict)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    roots: list[nn.Module] = field(default_factory=list)
    _by_path: dict[str, nn.Module] = field(default_factory=dict, repr=False)  # module_at's index
    _objects: tuple[nn.Module, ...] = field(default=(), repr=False)  # module_objects' list

    def module_objects(self) -> tuple[nn.Module, ...]:
        """The modules, in ``modules`` order, without their names.

        Their ``training`` flags are read before every replay
        (capture/baked_values.py); a tuple kept between calls saves unpacking
        each (name, module) pair every time.
        """
        if len(self._objects) != len(self.modules):  # modules were added since it was built
            self._objects = tuple(m for _, m in self.modules.values())
        return self._objects

    def module_name(self, module: nn.Module) -> str:
        entry = self.modules.get(id(module))
        return entry[0] if entry is not None else type(module).__name__

    def module_at(self, path: str) -> nn.Module | None:
        """The module registered under ``path`` (None when unknown)."""
        if not path:
            return None
        if len(self._by_path) != len(self.modules):  # modules were added since it was built
            self._by_path = {name: m for name, m in self.modules.values()}
        return self._by_path.get(path)

    def describe(self, tensor: torch.Tensor) -> StateRecord | None:
        return self.tensors.get(id(tensor))

    def name(self, tensor: torch.Tensor, record: StateRecord) -> None:
        """Record ``tensor``'s name and role, for a DTensor its local shard's too (what a graph holds)."""
        self.tensors[id(tensor)] = record
        shard = local_shard(tensor)
        if shard is not tensor:
            self.tensors[id(shard)] = record

    def module_of(self, tensor: torch.Tensor) -> str:
        record = self.tensors.get(id(tensor))
        return record.module if record is not None else ""

    def refresh_gradients(self) -> None:
        """Record the current ``.grad`` tensors (they change every step)."""
        for p in self.params.values():
            if p.grad is not None:
                base = self.tensors[id(p)]
                self.name(p.grad, StateRecord(f"{base.name}.grad", StateRole.GRADIENT, base.module))


def candidate_objects(fn: Callable[..., Any], depth: int = 0,
                       arguments: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, Any]]:
    """Objects the function can reach by name: closure, globals, bound self, defaults, and the
    objects it is given (``arguments``: a model, an optimizer, capture/arguments.py).

    A function held in the closure (a wrapper around the real step: ``def
    call(batch): return step(**batch)``) is followed one level: its model and
    optimizer are the step's too.
    """
    found: list[tuple[str, Any]] = []
    if isinstance(fn, nn.Module):  # tracing a module directly: it is the model (and may keep its optimizer)
        return [("self", fn), *kept_optimizers(fn, "self")]
    target = called_function(inspect.unwrap(fn))  # a ``partialmethod`` as ``__call__``: a partial
    if isinstance(target, functools.partial):  # functools.partial(step, model=model, opt=opt)
        found.extend(partial_bindings(target))
        target = inspect.unwrap(target.func)
    target = called_function(target)  # a trainer object: its ``__call__``, whose ``self`` it is
    self_obj = getattr(target, "__self__", None)
    func = getattr(target, "__func__", target)
    code = getattr(func, "__code__", None)
    if self_obj is not None:
        found.append(("self", self_obj))
        found.extend((k, v) for k, v in object_fields(self_obj).items()
                     if isinstance(v, (nn.Module, torch.optim.Optimizer)))
    if code is not None:
        for name, cell in zip(code.co_freevars, getattr(func, "__closure__", None) or ()):
            try:
                found.append((name, cell.cell_contents))
            except ValueError:  # empty cell
                continue
        globals_ = getattr(func, "__globals__", {})
        found.extend((n, globals_[n]) for n in code.co_names if n in globals_)
    for default in getattr(func, "__defaults__", None) or ():
        found.append(("default", default))
    found.extend(arguments)
    if depth == 0 and code is not None:
        cells = zip(code.co_freevars, getattr(func, "__closure__", None) or ())
        inner = [c.cell_contents for _, c in cells if _filled(c) and isinstance(c.cell_contents, types.FunctionType)]
        for f in inner:
            found.extend(candidate_objects(f, depth + 1))
    # One level into plain user objects (a dataclass or config holding the
    # model and optimizer); never into modules, classes or torch's own objects.
    nested: list[tuple[str, Any]] = []
    for name, obj in found:
        nested.extend(held_in_container(obj, name))
        if isinstance(obj, (nn.Module, torch.optim.Optimizer, types.ModuleType, type)) or callable(obj):
            continue
        if type(obj).__module__.startswith("torch") or not hasattr(obj, "__dict__"):
            continue
        for k, v in vars(obj).items():
            if isinstance(v, (nn.Module, torch.optim.Optimizer)):
                nested.append((k, v))
            else:
                nested.extend(held_in_container(v, k))
    found += nested
    # The optimizers the modules keep, each once: a module named twice, or an optimizer also named, adds none.
    seen = {id(obj) for _, obj in found}
    walked: set[int] = set()
    for name, module in list(found):
        if not isinstance(module, nn.Module) or id(module) in walked:
            continue
        walked.add(id(module))
        for where, opt in kept_optimizers(module, name):
            if id(opt) not in seen:
                seen.add(id(opt))
                found.append((where, opt))
    return found


def kept_optimizers(module: nn.Module, label: str) -> list[tuple[str, torch.optim.Optimizer]]:
    """The optimizers ``module`` and its submodules keep as attributes (``self.opt`` of a module whose
    forward is a whole training step): the step's optimizers, as one it names is.

    Why: one found by no name was not routed when the step ran as segments, so
    torch.compile traced Adam's step inside the module's compiled forward, and
    the parameters differed from eager's from the first call, silently."""
    found = []
    for path, m in module.named_modules():
        for name, value in vars(m).items():
            where = f"{label}.{name}" if path == "" else f"{label}.{path}.{name}"
            items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(
                value, (list, tuple)) else [(None, value)]
            found += [(where if key is None else f"{where}[{key!r}]", item) for key, item in items
                      if isinstance(item, torch.optim.Optimizer)]  # (one kept in a list or dict too)
    return found


def partial_bindings(step: functools.partial) -> list[tuple[str, Any]]:
    """(name, value) of what a ``functools.partial`` step binds: the same objects on every call."""
    return [(f"partial argument {i}", a) for i, a in enumerate(step.args)] + list(step.keywords.items())


def held_in_container(value: Any, label: str) -> list[tuple[str, Any]]:
    """The modules and optimizers a plain list, tuple or dict holds (``models = [encoder, decoder]``,
    ``self.nets = {"G": G, "D": D}``), one level in, labelled ``label[key]``."""
    if type(value) in (list, tuple):
        items: Any = enumerate(value)
    elif type(value) is dict:
        items = value.items()
    else:
        return []
    return [(f"{label}[{key!r}]", v) for key, v in items if isinstance(v, (nn.Module, torch.optim.Optimizer))]


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - reading an empty cell raises ValueError
    except ValueError:
        return False
    return True


def wrapped_optimizers(optimizers: list[torch.optim.Optimizer]) -> list[torch.optim.Optimizer]:
    """``optimizers``, each followed by the optimizers it keeps in its own fields, at any depth: timm's
    ``Lookahead(base)`` and SAM keep the optimizer that does the update (and its state: Adam's step
    counts, Lookahead's slow weights) as ``self.base_optimizer``. Why: that state was reached by no
    name, and the capture was refused for reading tensors it did not know."""
    found: dict[int, torch.optim.Optimizer] = {}
    waiting = list(optimizers)
    while waiting:
        opt = waiting.pop(0)
        if id(opt) in found:
            continue
        found[id(opt)] = opt
        waiting += [v for v in vars(opt).values() if isinstance(v, torch.optim.Optimizer)]
    return list(found.values())


def discover_state(fn: Callable[..., Any], arguments: Sequence[tuple[str, Any]] = ()) -> StateIndex:
    """Build the StateIndex of everything ``fn`` reaches through names, and of the objects it is
    given (``arguments``, capture/arguments.py)."""
    index = StateIndex()
    candidates = candidate_objects(fn, arguments=arguments)
    roots = [(n, o) for n, o in candidates if isinstance(o, nn.Module)]
    optimizers = wrapped_optimizers([o for _, o in candidates if isinstance(o, torch.optim.Optimizer)])
    # The root with most parameters is "the model": its paths get no prefix.
    roots.sort(key=lambda item: -sum(p.numel() for p in item[1].parameters()))
    optimizers = wrapped_optimizers([*optimizers, *hooked_optimizers([m for _, m in roots])])
    for rank, (var, root) in enumerate(roots):
        if id(root) in index.modules:
            continue
        prefix = "" if rank == 0 else var
        index.roots.append(root)
        for path, module in root.named_modules(prefix=prefix):
            index.modules.setdefault(id(module), (path, module))
        for path, module in root.named_modules(prefix=prefix):
            for pname, p in module.named_parameters(recurse=False):
                if id(p) not in index.tensors:
                    full = f"{path}.{pname}" if path else pname
                    index.name(p, StateRecord(full, StateRole.PARAMETER, path))
                    index.params[id(p)] = p
            for bname, b in module.named_buffers(recurse=False):
                if id(b) not in index.tensors:
                    full = f"{path}.{bname}" if path else bname
                    index.name(b, StateRecord(full, StateRole.BUFFER, path))
    for oi, opt in enumerate(optimizers):
        index.optimizers.append(opt)
        for gi, group in enumerate(opt.param_groups):
            for key, value in group.items():  # a tensor learning rate, updated in place by its schedulers
                if isinstance(value, torch.Tensor) and id(value) not in index.tensors:
                    index.name(value, StateRecord(f"optimizer{oi}.param_groups[{gi}].{key}",
                                                  StateRole.OPTIMIZER_STATE, ""))
            for pi, p in enumerate(group["params"]):
                if id(p) not in index.tensors:
                    index.name(p, StateRecord(f"optimizer{oi}.param{pi}", StateRole.PARAMETER, ""))
                    index.params[id(p)] = p
                base = index.tensors[id(p)]
                for key, value in opt.state.get(p, {}).items():
                    if isinstance(value, torch.Tensor):
                        index.name(value, StateRecord(f"{base.name}.{key}", StateRole.OPTIMIZER_STATE, base.module))
    index.refresh_gradients()
    return index


def hooked_optimizers(roots: Sequence[nn.Module]) -> list[torch.optim.Optimizer]:
    """The optimizers the user's gradient hooks on the models' parameters reach by name: torch's
    "optimizer in backward" (``p.register_post_accumulate_grad_hook(lambda p: opts[p].step())``),
    which steps one optimizer per parameter inside the backward.

    Why: the step reaches them through no name of its own, so their state was
    no state the graph knew (SGD's momentum buffer was refused as an unknown
    tensor, Adam's step count read as a number), and the step ran as segments,
    where the same optimizers stepped in the step's body replay.
    """
    modules = [m for root in roots for m in root.modules()]
    found = [o for hook in hook_functions(modules) for _, o in candidate_objects(hook, depth=1)
             if isinstance(o, torch.optim.Optimizer)]
    return list({id(o): o for o in found}.values())


def state_tensors(index: StateIndex) -> Iterator[torch.Tensor]:
    """The tensors the step's state holds: parameters, modules' buffers, optimizers' state and tensors
    their groups hold (a tensor learning rate)."""
    yield from index.params.values()
    for _, module in index.modules.values():
        yield from module.parameters(recurse=False)
        yield from module.buffers(recurse=False)
    for optimizer in index.optimizers:
        for per_param in optimizer.state.values():
            yield from (v for v in per_param.values() if isinstance(v, torch.Tensor))
        for group in optimizer.param_groups:
            yield from (v for k, v in group.items() if k != "params" and isinstance(v, torch.Tensor))


def add_parameter(index: StateIndex, param: nn.Parameter) -> None:
    """Register a parameter seen during capture that discovery did not find."""
    if id(param) not in index.tensors:
        index.tensors[id(param)] = StateRecord(f"param{len(index.params)}", StateRole.PARAMETER, "")
    index.params.setdefault(id(param), param)
