"""Where the step's Python values live, and which of them a capture watches.

Reachable means: the function's closure cells, the globals its code names,
its bound ``self`` and defaults, attributes of those objects one level down,
every module under the models found there, and the fields of the objects
those modules keep (a config); and the same of every function of the user's
code that these name (a helper the step calls, also under a library's
decorator such as ``@torch.no_grad()``). Below those, plain objects along
fields the walked code names (``self.cfg.train.use_l2``), the data of the
user's own modules it names (``cfg.SCALE``), and what a partial kept in a
list or dict binds. State the step reaches only through other objects is
not watched: the README says so.

A ``Location`` can be read and written back (an undone capture puts every
value back), and says where it lives (``place``, ``owner``, ``key``) so that
a generated check can read it without a call (capture/replay_check.py).
"""

from __future__ import annotations

import collections
import functools
import inspect
import itertools
import operator
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from graphprof.capture.held_values import CONTENTS_LIMIT, PLAIN_TYPES, Place
from graphprof.capture.sources import installed, is_library
from graphprof.capture.state import held_in_container, partial_bindings


@dataclass(frozen=True, slots=True)
class Location:
    """A place holding a Python value: an attribute, a closure cell, a global, a dict or list slot."""

    describe: str
    get: Callable[[], Any]
    set: Callable[[Any], None]
    place: Place  # with owner and key: how a generated check reads it (capture/replay_check.py)
    owner: Any
    key: Any = None
    #: The object whose field this is, where ``owner`` is its ``__dict__`` (a config's fields).
    keeper: Any = None

    @property
    def field(self) -> tuple[Any, Any]:
        """(object, name) of the field this location is: what ``ASSIGNED_NUMBERS`` notes."""
        return (self.owner if self.keeper is None else self.keeper), self.key


def _attr(obj: Any, name: str, label: str) -> Location:
    return Location(f"{label}.{name}", lambda: getattr(obj, name), lambda v: setattr(obj, name, v),
                    Place.ATTRIBUTE, obj, name)


def _cell(cell: types.CellType, label: str) -> Location:
    def put(v: Any) -> None:
        cell.cell_contents = v
    return Location(label, lambda: cell.cell_contents, put, Place.CELL, cell)


def _default_locations(f: types.FunctionType) -> Iterator[tuple[Location, Any]]:
    """The function's default argument values, each where it lives (its ``__defaults__`` slot).

    Binding state as defaults (``def step(x, counter=counter, log=log)``) is the
    loop-safe way to close over it: a counter or log so bound was never watched,
    and a replay neither counted nor logged. A default cannot be rebound by the
    step (that rebinds the parameter), only changed in place, so its slot is
    read, never written.
    """
    code = f.__code__
    defaults = f.__defaults__ or ()
    names = code.co_varnames[code.co_argcount - len(defaults):code.co_argcount]
    for i, (name, value) in enumerate(zip(names, defaults)):
        yield _tuple_slot(defaults, i, name), value
    kwdefaults = f.__kwdefaults__ or {}
    for name, value in kwdefaults.items():
        yield item_location(kwdefaults, name, name), value


def _tuple_slot(owner: tuple, i: int, label: str, keeper: Any = None) -> Location:
    """Item ``i`` of a tuple (a function's defaults, a partial's arguments): read, never rebound."""
    return Location(label, functools.partial(operator.getitem, owner, i), _read_only(label), Place.ITEM, owner, i,
                    keeper)


def _read_only(name: str) -> Callable[[Any], None]:
    def put(value: Any) -> None:
        raise TypeError(f"the default value of {name} cannot be rebound")
    return put


def item_location(container: dict, key: Any, label: str, keeper: Any = None) -> Location:
    return Location(label, lambda: container[key], lambda v: container.__setitem__(key, v), Place.ITEM,
                    container, key, keeper)


def plain_object(value: Any) -> bool:
    """An object of a class from the user's own code (an ``AverageMeter`` kept in a dict of meters):
    its fields are the step's state, as those of an object the step names are. Not one of a
    library's (the loggers in ``logging``'s registry, whose levels the library compares)."""
    if isinstance(value, nn.Module) or not _watched(value):
        return False
    module = sys.modules.get(type(value).__module__)
    filename = getattr(module, "__file__", None)
    return filename is None or not (is_library(filename) or installed(filename))


def attribute_location(obj: Any, name: str, label: str) -> Location:
    """Where ``obj.name`` lives, labelled ``{label}.{name}`` (``label``: the object's own)."""
    return _attr(obj, name, label)


def _watched(value: Any) -> bool:
    """Objects whose own Python state is the step's business (not torch's, not a module object)."""
    if isinstance(value, (types.ModuleType, type, types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return False
    if isinstance(value, (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)):
        return False  # optimizer state is in the graph; schedulers are replayed as host calls
    if isinstance(value, nn.Module):
        return True
    module = type(value).__module__ or ""
    # graphprof's own objects: a global named like an attribute the step uses (``opt.step`` puts
    # ``step`` in co_names) can be the traced function itself, whose counters are not the step's.
    return not module.startswith(("torch", "builtins", "transformers", "graphprof")) and fields_of(value) is not None


#: The attributes watched on a class the step names or a function it runs: data, not methods or descriptors.
_DATA_TYPES = PLAIN_TYPES | {list, dict}


def user_class(value: Any) -> bool:
    """A class defined in the user's code (not a library's, not a module, optimizer or exception
    class), whose public data attributes the step may keep state in (``Trainer.count += 1``)."""
    if not isinstance(value, type) or issubclass(value, (nn.Module, torch.optim.Optimizer, BaseException)):
        return False
    source = getattr(sys.modules.get(value.__module__), "__file__", None) or ""
    return value.__module__ == "__main__" or bool(source) and not installed(source) and not is_library(source)


def user_module(value: Any) -> bool:
    """A module of the user's own code (a ``config.py`` the step imports, a namespace it made with
    ``types.ModuleType``), not a library's."""
    if not isinstance(value, types.ModuleType):
        return False
    source = getattr(value, "__file__", None) or ""
    if not source:  # ``types.ModuleType("cfg")`` as a namespace; not a built-in or frozen module (a spec)
        return getattr(value, "__spec__", None) is None and value.__name__ not in sys.builtin_module_names
    return not installed(source) and not is_library(source)


def data_fields(owner: Any, label: str) -> Iterator[tuple[Location, Any, bool]]:
    """The public data attributes of a class the step names or of a function it runs, watched as an
    object's fields are.

    Why: a counter or a log kept on a class (``Trainer.count += 1``,
    ``Stats.history.append(...)``) or on a decorator's wrapper function
    (``wrapper.calls += 1``) ran only in the capture call and stayed at that
    call's value in every replay, silently. Methods, properties and names with
    a leading underscore are the owner's machinery, not state.
    """
    for name, value in list(vars(owner).items()):
        if isinstance(name, str) and not name.startswith("_") and type(value) in _DATA_TYPES:
            yield _attr(owner, name, label), value, True


def _wrapper_chain(fn: Any) -> list[types.FunctionType]:
    """The functions of the user's code from ``fn`` down its ``__wrapped__`` chain (``functools.wraps``),
    ``fn`` first: a library's wrapper (``torch.no_grad()`` as a decorator) keeps no state of the step's."""
    chain: list[types.FunctionType] = []
    seen: list[Any] = []
    if not isinstance(fn, types.FunctionType) and callable(fn) and not isinstance(fn, (type, nn.Module)):
        try:  # a callable object wrapping a function (a traced one); a proxy's own lookup may raise
            fn = getattr(fn, "__wrapped__", None)
        except Exception:
            return chain
    while isinstance(fn, types.FunctionType) and all(fn is not f for f in seen):
        seen.append(fn)
        filename = fn.__code__.co_filename
        if not is_library(filename) and not installed(filename):
            chain.append(fn)
        fn = getattr(fn, "__wrapped__", None)
    return chain


def object_keys(obj: Any) -> tuple[int, ...]:
    """The ids a watched object is known by: its own, and its ``__dict__``'s (``first_visit``)."""
    fields = fields_of(obj)
    return (id(obj),) if fields is None else (id(obj), id(fields))


def first_visit(obj: Any, seen: set[int]) -> bool:
    """Whether ``obj``'s fields are not watched yet (``seen``: ``object_keys`` of those that are),
    noting that they now are.

    Why the ``__dict__`` too: the instances of a class that share one ``__dict__`` (the Borg
    pattern: accelerate's ``GradientState``, which the accelerator, its optimizer and its
    scheduler each hold an instance of) are one state. Watched once per instance, the second
    watch took its snapshot after the first had put input scalars in the shared dict, and held
    them: no later call ever matched, and a gradient-accumulation loop captured until the
    storm limit sent it to segments.
    """
    keys = object_keys(obj)
    if any(key in seen for key in keys):
        return False
    seen.update(keys)
    return True


def fields_of(value: Any) -> dict[str, Any] | None:
    """``value``'s plain ``__dict__``, read as the interpreter keeps it (None without one):
    ``hasattr`` and ``vars`` call the object's own ``__getattribute__``, which a proxy may make raise."""
    try:
        fields = object.__getattribute__(value, "__dict__")
    except Exception:  # slots only, or a descriptor that refuses
        return None
    return fields if type(fields) is dict else None


def reachable_locations(fn: Callable[..., Any], arguments: Sequence[tuple[str, Any]] = (),
                        hooks: Sequence[Any] = ()) -> Iterator[tuple[Location, Any, bool]]:
    """Every (location, value, is_user_state) the step can reach by name or is given as an object
    (``arguments``, capture/arguments.py), one level into plain objects, and what the hooks on its
    modules reach the same way (``hooks``, capture/module_structure.py: they run inside the step).

    Modules' attributes are watched for changes but are not user state: their
    numbers (``in_features``, a dropout ``p``) are configuration that library
    code type-checks, so they never become input scalars.
    """
    wrappers = _wrapper_chain(fn)
    for wrapper in wrappers:  # ``wrapper.calls += 1`` in a decorator's wrapper
        yield from data_fields(wrapper, getattr(wrapper, "__name__", "the step"))
    target = inspect.unwrap(fn)
    roots: list[tuple[str, Any]] = []
    if isinstance(target, functools.partial):  # what it binds is the step's: its keywords can be written
        for name, value in target.keywords.items():
            yield item_location(target.keywords, name, name), value, True
        roots += partial_bindings(target)
        target = inspect.unwrap(target.func)
    if isinstance(target, nn.Module):
        roots.append(("self", target))
    self_obj = getattr(target, "__self__", None)
    func = getattr(target, "__func__", target)
    code = getattr(func, "__code__", None)
    if self_obj is not None:
        roots.append(("self", self_obj))
    # The function's names, and those of a function it holds in its closure (a wrapper around
    # the real step: ``def call(batch): return step(**batch)``), one level down; the hooks' too;
    # and those of every function of the user's code these name, through a library's decorator too,
    # and of the methods of the user's classes whose objects they reach (a module's ``forward``).
    walk = _Walk(func, roots)
    if code is not None:
        walk.functions.append(func)
        walk.followed.add(id(func))
    for wrapper in wrappers:  # a decorator's wrapper runs in the step too
        walk.follow(wrapper)
    for i, hook in enumerate(hooks):
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

    def __init__(self, step: Any, roots: list[tuple[str, Any]]) -> None:
        self.step = step
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
        for helper in _wrapper_chain(value):
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
        return name in self.code_names and _watched(value) and not isinstance(value, nn.Module)

    def module_fields(self, module: types.ModuleType, label: str) -> Iterator[tuple[Location, Any, bool]]:
        """The data of a module of the user's code that walked code names (``cfg.SCALE``, ``cfg.FLAG``
        of ``import cfg``): a config module changed between calls is read as a global is, where a
        replay kept the capture call's values. Functions, classes and modules in it are code."""
        fields = vars(module)
        for name in sorted(self.code_names.intersection(fields)):
            value = fields[name]
            if isinstance(name, str) and not name.startswith("__") and (type(value) in _DATA_TYPES or _watched(value)):
                yield item_location(fields, name, f"{label}.{name}"), value, True
                self.roots.append((f"{label}.{name}", value))

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
                    yield _tuple_slot(arguments, i, label, value), argument, True
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
                yield _cell(cell, name), value, True
                roots.append((name, value))
                if f is self.step and isinstance(value, types.FunctionType) and id(value) not in self.followed:
                    self.followed.add(id(value))
                    functions.append(value)
                yield from self.bound(name, value)
            for location, value in _default_locations(f):  # ``def step(x, log=log, stats=stats)``
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
                yield from optimizer_fields(obj, label, seen)
            if user_class(obj) and id(obj) not in seen:
                seen.add(id(obj))
                yield from data_fields(obj, label)
            if not _watched(obj) or id(obj) in seen:
                continue
            objects = [(label, obj)]
            if not isinstance(obj, nn.Module):
                objects += [(f"{label}.{k}", v) for k, v in vars(obj).items() if _watched(v)]
                for k, v in vars(obj).items():
                    if isinstance(v, torch.optim.Optimizer) and id(v) not in seen:
                        seen.add(id(v))
                        yield from optimizer_fields(v, f"{label}.{k}", seen)
                objects += [held for k, v in vars(obj).items() for held in held_in_container(v, f"{label}.{k}")]
            for olabel, o in objects:
                if isinstance(o, nn.Module):
                    members = [(f"{olabel}.{p}" if p else olabel, m) for p, m in o.named_modules()]
                else:
                    members = [(olabel, o)]
                for mlabel, m in members:
                    if not first_visit(m, seen):
                        continue
                    self.follow_methods(type(m))
                    torch_layer = isinstance(m, nn.Module) and (type(m).__module__ or "").startswith("torch.")
                    for k, v in list(vars(m).items()):
                        if isinstance(m, nn.Module) and (k in _MODULE_INTERNALS or torch_layer and k.startswith("_")):
                            continue  # torch's machinery (a Conv's ``_reversed_padding_repeated_twice``)
                        # A module's numbers are configuration (never inputs); its lists and dicts (a
                        # Lightning-style ``self._logged.setdefault(name, []).append(v)``) are the step's.
                        yield _attr(m, k, mlabel), v, not isinstance(m, nn.Module) or _container(v)
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
    Torch's own optimizer classes keep nothing else. Why the objects it keeps:
    a wrapper's ``step`` decides on their fields (accelerate's
    ``AcceleratedOptimizer`` steps only when ``self.gradient_state.sync_gradients``
    is set): a segmented step's optimizer is captured on its own, with nothing
    else of the step in reach, and replayed the update it captured on every
    call, accumulating ones included. ``seen``: objects whose fields were
    yielded already (the caller's).
    """
    if (type(optimizer).__module__ or "").startswith("torch."):
        return
    for k, v in list(vars(optimizer).items()):
        if k in TORCH_OPTIMIZER_FIELDS:
            continue
        yield _attr(optimizer, k, label), v, True
        if _watched(v) and not isinstance(v, nn.Module) and first_visit(v, seen):
            for field, value in list((fields_of(v) or {}).items()):
                yield _attr(v, field, f"{label}.{k}"), value, True


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
