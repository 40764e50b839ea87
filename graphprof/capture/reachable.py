"""The walk that finds the step's state: what it reaches by name, and what those reach.

Reachable means: the function's closure cells, the globals its code names,
its bound ``self`` and defaults, attributes of those objects one level down,
every module under the models found there, and the fields of the objects
those modules keep (a config); and the same of every function of the user's
code that these name (a helper the step calls, also under a library's
decorator such as ``@torch.no_grad()``). Below those, plain objects along
fields the walked code names (``self.cfg.train.use_l2``), the data of the
user's own modules it names (``cfg.SCALE``), and what the functions and
partials kept in its lists and dicts bind (minGPT's callbacks). State the
step reaches only through other objects is not watched: the README says so.

Why a module apart from ``locations``: those are the places a value lives
and how a check reads them; this is the search for them, which grew with
each kind of state found on real training code.
"""

from __future__ import annotations

import collections
import dis
import functools
import importlib.util
import inspect
import itertools
import sys
import types
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from graphprof.capture.held_values import CONTENTS_LIMIT, PLAIN_TYPES
from graphprof.capture.locations import (
    DATA_TYPES, Location, attribute_location, called_function, cell_location, data_fields, default_locations,
    fields_of, first_visit, item_location, object_fields, own_attribute_location, tuple_slot, user_class, user_module, users_file,
    watched_object, wrapper_chain,
)
from graphprof.capture.scaler_state import scaler_fields
from graphprof.capture.state import held_in_container, partial_bindings


def reachable_locations(fn: Callable[..., Any], arguments: Sequence[tuple[str, Any]] = (),
                        hooks: Sequence[Any] = (),
                        walked: list[types.FunctionType] | None = None) -> Iterator[tuple[Location, Any, bool]]:
    """Every (location, value, is_user_state) the step can reach by name or is given as an object
    (``arguments``, capture/arguments.py), one level into plain objects, and what the hooks on its
    modules reach the same way (``hooks``, capture/module_structure.py: they run inside the step).
    ``walked``, when given, receives every function whose names the walk reads: the code the step
    may run (capture/double_backward.py reads it).

    Modules' attributes are watched for changes but are not user state: their
    numbers (``in_features``, a dropout ``p``) are configuration that library
    code type-checks, so they never become input scalars.
    """
    wrappers = wrapper_chain(fn)
    for wrapper in wrappers:  # ``wrapper.calls += 1`` in a decorator's wrapper
        yield from data_fields(wrapper, getattr(wrapper, "__name__", "the step"))
    target = called_function(inspect.unwrap(fn))  # a ``partialmethod`` as ``__call__``: a partial
    roots: list[tuple[str, Any]] = []
    if isinstance(target, functools.partial):  # what it binds is the step's: its keywords can be written
        for name, value in target.keywords.items():
            yield item_location(target.keywords, name, name), value, True
        roots += partial_bindings(target)
        target = inspect.unwrap(target.func)
    if isinstance(target, nn.Module):
        roots.append(("self", target))
    target = called_function(target)  # a trainer object: its ``__call__``, whose ``self`` it is
    self_obj = getattr(target, "__self__", None)
    func = getattr(target, "__func__", target)
    code = getattr(func, "__code__", None)
    if self_obj is not None:
        roots.append(("self", self_obj))
    # The function's names, and those of a function it holds in its closure (a wrapper around
    # the real step: ``def call(batch): return step(**batch)``), one level down; the hooks' too;
    # and those of every function of the user's code these name, through a library's decorator too,
    # and of the methods of the user's classes whose objects they reach (a module's ``forward``).
    walk = _Walk(func, roots, walked)
    walk.wrappers = {id(w) for w in wrappers}
    if code is not None:
        walk.functions.append(func)
        walk.followed.add(id(func))
    for wrapper in wrappers:  # a decorator's wrapper runs in the step too
        walk.follow(wrapper)
    for i, hook in enumerate(hooks):
        if isinstance(hook, functools.partial):  # ``register_forward_hook(partial(hook, name))``: what it binds
            yield from walk.bound(f"hook {i}", hook)
            continue
        hook_self = getattr(hook, "__self__", None)
        hook_func = getattr(hook, "__func__", hook)
        if hook_self is not None and not isinstance(hook_self, types.ModuleType):
            roots.append((f"hook {i}'s object", hook_self))
        if isinstance(hook_func, types.FunctionType):
            walk.functions.append(hook_func)
        elif not isinstance(hook_func, types.BuiltinFunctionType):
            roots.append((f"hook {i}", hook_func))  # a callable object
    yield from walk.names()
    roots += arguments
    while roots:
        yield from walk.objects()
        yield from walk.names()  # the globals of the methods the objects' classes brought


_IMPORT_NAME = dis.opmap["IMPORT_NAME"]


def local_imports(f: types.FunctionType) -> list[tuple[str, types.ModuleType]]:
    """The modules of the user's own code that a function imports in its body (``import cfg``, ``from
    . import cfg``, ``from .cfg import SCALE`` inside the step, then ``cfg.SCALE``): their data is the
    step's to watch, as a global module's is. (A quick look at the bytecode first: most functions
    import nothing.)"""
    code = f.__code__
    if bytes([_IMPORT_NAME]) not in code.co_code[::2]:
        return []
    package = getattr(f, "__globals__", {}).get("__package__") or ""
    instructions = list(dis.get_instructions(code))
    found = []
    for i, instruction in enumerate(instructions):
        if instruction.opname != "IMPORT_NAME" or i < 2:
            continue
        level, names = instructions[i - 2].argval, instructions[i - 1].argval  # IMPORT_NAME's two operands
        try:
            base = importlib.util.resolve_name("." * level + instruction.argval, package) if level else \
                instruction.argval
        except (ImportError, TypeError, ValueError):
            continue
        candidates = [base, *(f"{base}.{name}" for name in (names if isinstance(names, tuple) else ()))]
        for name in candidates:
            module = sys.modules.get(name)
            if isinstance(module, types.ModuleType) and user_module(module):
                found.append((name, module))
    return found


#: What ``nn.Module.__init__`` puts in every module's ``__dict__``: torch's machinery, not the step's state.
_MODULE_INTERNALS = frozenset(vars(nn.Module())) | {"training"}


def _container(value: Any) -> bool:
    """A list, tuple or dict (a ``defaultdict(list)`` of callbacks too), not a tensor's or a library's
    mapping: those are looked into for what they keep, not for their items' own state."""
    return type(value) in (list, tuple, dict) or type(value) is collections.defaultdict

#: Methods run for the user's objects without their code naming them: a module's forward, a call.
_CALLED_FOR_THE_USER = frozenset({"forward", "__call__"})


class _Walk:
    """The walk of ``reachable_locations``: functions give names (cells, defaults, globals), names give
    objects, objects give fields and, through their classes' methods, functions again."""

    def __init__(self, step: Any, roots: list[tuple[str, Any]], walked: list[types.FunctionType] | None = None) -> None:
        self.step = step
        self.walked = walked  # every function read, in order, when the caller asked for them
        #: ids of the decorators' wrappers, whose fields ``reachable_locations`` yields itself.
        self.wrappers: set[int] = set()
        self.roots = roots
        self.functions: list[types.FunctionType] = []
        self.followed: set[int] = set()
        self.named: set[tuple[int, str]] = set()
        self.seen: set[int] = set()  # objects whose fields were yielded
        self.classes: set[int] = set()
        #: The names the walked code has (``co_names``: attributes it reads, methods it calls).
        self.code_names: set[str] = set()
        #: (name, function) of the user's classes' methods, followed once walked code names them.
        self.methods: list[tuple[str, Any]] = []

    def follow(self, value: Any) -> None:
        """Walk, like the step, the user's functions ``value`` is or wraps (``@torch.no_grad()`` on a
        helper): a helper the step calls keeps its counters and logs in its own closure and globals."""
        for helper in wrapper_chain(value):
            if id(helper) not in self.followed:
                self.followed.add(id(helper))
                self.functions.append(helper)

    def follow_methods(self, cls: type) -> None:
        """Note the methods of the user's classes in ``cls``'s MRO (``methods_named`` follows them): a
        module's ``forward`` reading a global flag or scale, a logger's method appending to a global
        list, run inside the step."""
        for klass in cls.__mro__:
            if id(klass) in self.classes or (klass.__module__ or "").startswith(("torch", "builtins")):
                continue
            self.classes.add(id(klass))
            for name, attribute in list(vars(klass).items()):
                if isinstance(attribute, (staticmethod, classmethod)):
                    attribute = attribute.__func__
                if isinstance(attribute, property):
                    self.methods += [(name, accessor) for accessor in (attribute.fget, attribute.fset) if accessor]
                elif isinstance(attribute, types.FunctionType):
                    self.methods.append((name, attribute))

    def methods_named(self) -> bool:
        """Follow the noted methods that walked code names (``tracker.update(...)``, ``self.helper()``)
        or that torch calls (``forward``, ``__call__``); whether any was. Why not all: a class's other
        methods (its ``__init__``) do not run in the step, and what they name is not its state."""
        before = len(self.functions)
        waiting = []
        for name, method in self.methods:
            if name in self.code_names or name in _CALLED_FOR_THE_USER:
                self.follow(method)
            else:
                waiting.append((name, method))
        self.methods = waiting
        return len(self.functions) > before

    def kept_callables(self, container: Any, label: str) -> Iterator[tuple[Location, Any, bool]]:
        """What the functions kept in a list, tuple or dict bind and name, and the containers inside:
        minGPT's ``self.callbacks = {"on_batch_end": [log_loss]}``, a dict of loss partials. Why: a
        callback's closure list, appended to in the step, was reached by no name, and the replays
        appended nothing (the capture call left graphprof's own number in it)."""
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for key, item in itertools.islice(items, CONTENTS_LIMIT):  # a table of data is not a list of callbacks
            if isinstance(item, (functools.partial, types.FunctionType, types.MethodType)):
                yield from self.bound(f"{label}[{key!r}]", item)
            elif _container(item):
                self.roots.append((f"{label}[{key!r}]", item))

    def named_deeper(self, name: str, value: Any) -> bool:
        """Whether the walk goes on into ``value``, a plain object kept in a field named ``name`` of one
        whose fields it watches: when walked code names that field (``self.cfg.train.use_l2`` has
        ``train`` among its names). Why: a flag or a counter three levels down was read or counted in
        the capture call only, and every replay kept that call's branch and count, silently. Why only
        named fields: the objects reachable through every field are many; a check per call reads each
        one watched."""
        return name in self.code_names and watched_object(value) and not isinstance(value, nn.Module)

    def module_fields(self, module: types.ModuleType, label: str) -> Iterator[tuple[Location, Any, bool]]:
        """The data of a module of the user's code that walked code names (``cfg.SCALE``, ``cfg.FLAG``
        of ``import cfg``): a config module changed between calls is read as a global is, where a
        replay kept the capture call's values. Functions, classes and modules in it are code; a function
        it names is walked as the step's helpers are (``sched_utils.get_lr(it)`` counting calls in its
        module's global: the replays never counted)."""
        fields = vars(module)
        for name in sorted(self.code_names.intersection(fields)):
            value = fields[name]
            if isinstance(value, (types.FunctionType, functools.partial)):
                yield from self.bound(f"{label}.{name}", value)
                continue
            if user_class(value):  # ``utils.Stats.bump()``: its data and its methods, as a global class's
                self.roots.append((f"{label}.{name}", value))
                continue
            if isinstance(name, str) and not name.startswith("__") and (type(value) in DATA_TYPES or watched_object(value)):
                yield item_location(fields, name, f"{label}.{name}"), value, True
                self.roots.append((f"{label}.{name}", value))

    def optimizer(self, optimizer: torch.optim.Optimizer, label: str) -> Iterator[tuple[Location, Any, bool]]:
        """An optimizer's own fields (``optimizer_fields``), and what a ``step`` set on the object binds
        and names: a wrapper of the user's (``opt.step = counted``, counting or logging, then calling the
        step it replaced) runs in the step as a helper does. Why: its counter was counted in the capture
        call only, and the replays neither counted nor logged, silently. Torch's wrapper (an LR
        scheduler's) and a library's are not the user's code: nothing of theirs is followed."""
        yield from optimizer_fields(optimizer, label, self.seen)
        own_step = vars(optimizer).get("step")
        yield own_attribute_location(optimizer, "step", label), own_step, False  # set, replaced or removed later
        if own_step is not None:
            yield from self.bound(f"{label}.step", own_step)

    def bound(self, name: str, value: Any) -> Iterator[tuple[Location, Any, bool]]:
        """What a callable the step holds binds, and the function it runs: a partial's arguments
        (``log = partial(append_to, history)``) and a bound method's object (``update = tracker.update``).
        Why: the list or object so bound was reached by no name, and a replay neither logged nor counted."""
        while isinstance(value, functools.partial):
            arguments = value.args
            for i, argument in enumerate(arguments):
                label = f"{name} argument {i}"
                if (id(arguments), label) not in self.named and type(argument) not in PLAIN_TYPES:
                    self.named.add((id(arguments), label))
                    # keeper: the partial, which reads the argument when called (no code loads it by a name)
                    yield tuple_slot(arguments, i, label, value), argument, True
                    self.roots.append((label, argument))
            for key, argument in value.keywords.items():
                if (id(value.keywords), key) not in self.named:
                    self.named.add((id(value.keywords), key))
                    yield item_location(value.keywords, key, f"{name} keyword {key}"), argument, True
                    self.roots.append((f"{name} keyword {key}", argument))
            value = value.func
        if isinstance(value, types.MethodType) and not isinstance(value.__self__, types.ModuleType):
            self.roots.append((f"{name}.__self__", value.__self__))
            value = value.__func__
        self.follow(value)

    def names(self) -> Iterator[tuple[Location, Any, bool]]:
        """The closure cells, defaults and named globals of every function waiting to be walked, and of
        the noted methods that walked code comes to name."""
        functions, roots, named = self.functions, self.roots, self.named
        while functions or self.methods_named():
            f = functions.pop(0)
            if self.walked is not None:
                self.walked.append(f)
            if f is not self.step and id(f) not in self.wrappers and users_file(f.__code__.co_filename):
                # ``helper.calls += 1`` in a helper the step calls: a counter on the function, as on a
                # decorator's wrapper (the step's own and its wrappers' fields are yielded already)
                yield from data_fields(f, getattr(f, "__qualname__", "a helper"))
            f_code = f.__code__
            self.code_names.update(f_code.co_names)
            for name, cell in zip(f_code.co_freevars, getattr(f, "__closure__", None) or ()):
                try:
                    value = cell.cell_contents
                except ValueError:
                    continue
                if (id(cell), "") in named or name == "__class__":  # ``super()``'s cell: the method's class
                    continue
                named.add((id(cell), ""))
                yield cell_location(cell, name), value, True
                roots.append((name, value))
                if f is self.step and isinstance(value, types.FunctionType) and id(value) not in self.followed:
                    self.followed.add(id(value))
                    functions.append(value)
                yield from self.bound(name, value)
            for location, value in default_locations(f):  # ``def step(x, log=log, stats=stats)``
                if (id(value), location.describe) not in named and type(value) not in PLAIN_TYPES:
                    named.add((id(value), location.describe))
                    yield location, value, True
                    roots.append((location.describe, value))
            globals_ = getattr(f, "__globals__", {})
            for name in f_code.co_names:
                if name in globals_ and (id(globals_), name) not in named:
                    named.add((id(globals_), name))
                    yield item_location(globals_, name, name), globals_[name], True
                    roots.append((name, globals_[name]))
                    yield from self.bound(name, globals_[name])
            roots += [(name, module) for name, module in local_imports(f)]

    def objects(self) -> Iterator[tuple[Location, Any, bool]]:
        """The fields of the objects found so far (``roots``, emptied), and their modules' and keeps'."""
        seen = self.seen
        roots = list(self.roots)
        self.roots.clear()
        roots += [held for label, obj in list(roots) for held in held_in_container(obj, label)]
        for label, obj in roots:
            if user_module(obj) and first_visit(obj, seen):
                yield from self.module_fields(obj, label)
                continue
            if _container(obj) and id(obj) not in seen:
                seen.add(id(obj))
                yield from self.kept_callables(obj, label)
            if isinstance(obj, torch.optim.Optimizer) and id(obj) not in seen:
                seen.add(id(obj))
                yield from self.optimizer(obj, label)
            if isinstance(obj, torch.amp.GradScaler) and id(obj) not in seen:
                seen.add(id(obj))
                yield from scaler_fields(obj, label)
            if user_class(obj) and id(obj) not in seen:
                seen.add(id(obj))
                yield from data_fields(obj, label)
                # ``Stats.bump()``, a static or class method counting in its module's global: walked once
                # the step names it, as an object's methods are (its global was counted in the capture only).
                self.follow_methods(obj)
            if not watched_object(obj) or id(obj) in seen:
                continue
            objects = [(label, obj)]
            if not isinstance(obj, nn.Module):
                fields = object_fields(obj)
                objects += [(f"{label}.{k}", v) for k, v in fields.items() if watched_object(v)]
                for k, v in fields.items():
                    if isinstance(v, torch.optim.Optimizer) and id(v) not in seen:
                        seen.add(id(v))
                        yield from self.optimizer(v, f"{label}.{k}")
                    if isinstance(v, torch.amp.GradScaler) and id(v) not in seen:
                        seen.add(id(v))
                        yield from scaler_fields(v, f"{label}.{k}")
                objects += [held for k, v in fields.items() for held in held_in_container(v, f"{label}.{k}")]
            for olabel, o in objects:
                if isinstance(o, torch.optim.Optimizer):  # ``self.optimizers = [opt]``: an optimizer's own fields
                    if id(o) not in seen:  # (walked as a plain object's, its groups' numbers became inputs
                        seen.add(id(o))    # twice over, and were left in the user's groups)
                        yield from self.optimizer(o, olabel)
                    continue
                if isinstance(o, nn.Module):
                    members = [(f"{olabel}.{p}" if p else olabel, m) for p, m in o.named_modules()]
                else:
                    members = [(olabel, o)]
                for mlabel, m in members:
                    if not first_visit(m, seen):
                        continue
                    self.follow_methods(type(m))
                    torch_layer = isinstance(m, nn.Module) and (type(m).__module__ or "").startswith("torch.")
                    for k, v in list((vars(m) if isinstance(m, nn.Module) else object_fields(m)).items()):
                        if isinstance(m, nn.Module) and (k in _MODULE_INTERNALS or torch_layer and k.startswith("_")):
                            continue  # torch's machinery (a Conv's ``_reversed_padding_repeated_twice``)
                        # A module's numbers are configuration (never inputs); its lists and dicts (a
                        # Lightning-style ``self._logged.setdefault(name, []).append(v)``) are the step's.
                        yield attribute_location(m, k, mlabel), v, not isinstance(m, nn.Module) or _container(v)
                        if _container(v):
                            self.roots.append((f"{mlabel}.{k}", v))  # what it keeps: callbacks, partials
                        if not isinstance(m, nn.Module) and m is not obj and self.named_deeper(k, v):
                            self.roots.append((f"{mlabel}.{k}", v))  # ``self.cfg.train.use_l2``: walked next
                        if isinstance(m, nn.Module) and _held_by_module(v) and id(v) not in seen:
                            seen.add(id(v))
                            yield from _fields_of(v, f"{mlabel}.{k}")
                    if isinstance(m, nn.Module):
                        yield from buffer_locations(m, mlabel)


#: What torch's ``Optimizer`` keeps in an optimizer's ``__dict__`` (hooks, its state and groups, and
#: the counting ``step`` an LR scheduler puts there): torch's business, in the graph or replayed.
TORCH_OPTIMIZER_FIELDS = frozenset({
    "defaults", "param_groups", "state", "step", "_opt_called", "_warned_capturable_if_run_uncaptured",
    "_zero_grad_profile_name", "_optimizer_step_pre_hooks", "_optimizer_step_post_hooks",
    "_optimizer_state_dict_pre_hooks", "_optimizer_state_dict_post_hooks",
    "_optimizer_load_state_dict_pre_hooks", "_optimizer_load_state_dict_post_hooks"})


def optimizer_fields(optimizer: torch.optim.Optimizer, label: str,
                     seen: set[int]) -> Iterator[tuple[Location, Any, bool]]:
    """The fields a custom optimizer keeps besides torch's (``self.t += 1`` in its ``step``), and
    those of the plain objects it keeps, one level down, as a named object's are watched.

    They are the user's state, like a plain object's: a number is an input and
    its change an effect. Why: its ``step`` runs only in the capture call, and
    a counter it kept there stayed at that call's value in every replay.
    Torch's own optimizer classes keep nothing else public: a public field on
    one of theirs is the user's (``self.calls += 1`` in a wrapper the user
    bound to it as its ``step``), watched as a custom optimizer's; their
    private fields are torch's. Why the objects it keeps:
    a wrapper's ``step`` decides on their fields (accelerate's
    ``AcceleratedOptimizer`` steps only when ``self.gradient_state.sync_gradients``
    is set): a segmented step's optimizer is captured on its own, with nothing
    else of the step in reach, and replayed the update it captured on every
    call, accumulating ones included. ``seen``: objects whose fields were
    yielded already (the caller's).
    """
    torch_class = (type(optimizer).__module__ or "").startswith("torch.")
    for k, v in list(vars(optimizer).items()):
        if k in TORCH_OPTIMIZER_FIELDS or torch_class and (not isinstance(k, str) or k.startswith("_")):
            continue
        yield attribute_location(optimizer, k, label), v, True
        if isinstance(v, torch.optim.Optimizer):  # ``Lookahead(base)``: the optimizer it wraps, as an optimizer
            if first_visit(v, seen):  # (as a plain object, its groups' numbers became inputs twice)
                yield from optimizer_fields(v, f"{label}.{k}", seen)
            continue
        if watched_object(v) and not isinstance(v, nn.Module) and first_visit(v, seen):
            for field, value in list((fields_of(v) or {}).items()):
                yield attribute_location(v, field, f"{label}.{k}"), value, True


def buffer_locations(module: nn.Module, label: str) -> Iterator[tuple[Location, Any, bool]]:
    """The module's buffers, where ``self.avg = 0.9 * self.avg + ...`` in its forward replaces one.

    Their ``keeper`` is the module: a buffer the step does not replace is the
    model's state, held by the module's registration counts, not per call.
    """
    buffers = module._buffers
    for name, value in list(buffers.items()):
        if value is not None:
            yield item_location(buffers, name, f"{label}.{name}" if label else name, module), value, False


def _held_by_module(value: Any) -> bool:
    """An object a module keeps whose fields its ``forward`` may read: a config (``self.config.act``,
    a dataclass, a Hugging Face ``PretrainedConfig``). Torch's own objects are torch's business."""
    if isinstance(value, (nn.Module, torch.Tensor, types.ModuleType, type, types.FunctionType, types.MethodType,
                          types.BuiltinFunctionType, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)):
        return False
    module = type(value).__module__ or ""
    return not module.startswith(("torch", "builtins", "graphprof")) and type(getattr(value, "__dict__", None)) is dict


def _fields_of(obj: Any, label: str) -> Iterator[tuple[Location, Any, bool]]:
    """The fields of an object a module keeps, read from its ``__dict__``.

    Configuration, not user state (like a module's own attributes). Read as
    dict items: a class may override ``__getattribute__`` (``PretrainedConfig``
    maps attribute aliases in Python), which would make every check a Python
    call, and the fields themselves are the state a forward's reads come from.
    """
    fields = vars(obj)
    for k, v in list(fields.items()):
        if isinstance(k, str):
            yield item_location(fields, k, f"{label}.{k}", obj), v, False

