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
each kind of state found on real training code. This module walks the
user's functions for the names they hold; what the objects found there keep
is capture/reachable_objects.py's part of the walk.
"""

from __future__ import annotations

import dis
import functools
import importlib.util
import inspect
import sys
import types
from typing import Any, Callable, Iterator, Sequence

from torch import nn

from graphprof.capture.held_values import PLAIN_TYPES
from graphprof.capture.locations import (
    Location, called_function, cell_location, data_fields, default_locations, item_location, tuple_slot, user_module,
    users_file, wrapper_chain,
)
from graphprof.capture.reachable_objects import HeldObjects
from graphprof.capture.state import partial_bindings


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
    walk = NameWalk(func, roots, walked)
    held = HeldObjects(walk.roots, walk.code_names, walk.bound, walk.follow_methods)
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
        yield from held.objects()
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


#: Methods run for the user's objects without their code naming them: a module's forward, a call.
_CALLED_FOR_THE_USER = frozenset({"forward", "__call__"})


class NameWalk:
    """The walk of ``reachable_locations``: functions give names (cells, defaults, globals), names give
    objects, objects give fields (``HeldObjects``, capture/reachable_objects.py) and, through their
    classes' methods, functions again."""

    def __init__(self, step: Any, roots: list[tuple[str, Any]], walked: list[types.FunctionType] | None = None) -> None:
        self.step = step
        self.walked = walked  # every function read, in order, when the caller asked for them
        #: ids of the decorators' wrappers, whose fields ``reachable_locations`` yields itself.
        self.wrappers: set[int] = set()
        self.roots = roots
        self.functions: list[types.FunctionType] = []
        self.followed: set[int] = set()
        self.named: set[tuple[int, str]] = set()
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
