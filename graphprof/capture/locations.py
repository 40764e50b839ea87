"""Where the step's Python values live: a ``Location`` for each place, and which objects are watched.

A ``Location`` can be read and written back (an undone capture puts every
value back), and says where it lives (``place``, ``owner``, ``key``) so that
a generated check can read it without a call (capture/replay_check.py).
The predicates here (``watched_object``, ``user_class``, ``user_module``,
``plain_object``) say whose fields are the step's state; the walk that
finds the places is capture/reachable.py.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import operator
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn

from graphprof.capture.held_values import PLAIN_TYPES, Place
from graphprof.capture.sources import installed, is_library


class _Absent:
    """What ``Location.read`` gives for a place the step took away."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<absent>"


#: A place that is gone: its key or attribute deleted (``del S["x"]``, ``delattr``, ``prune.remove``'s
#: buffer), its index past a shortened list's end, a closure's variable deleted (``del total``).
ABSENT: Any = _Absent()


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
    #: How the step's own write here is repeated by a replay, where not as ``set`` (``item_location``).
    replay: Callable[[Any], None] | None = None

    def write(self, value: Any) -> None:
        """Write ``value`` here as the step did (a replay's ``set`` effect), where ``set`` is graphprof's."""
        (self.replay or self.set)(value)

    @property
    def field(self) -> tuple[Any, Any]:
        """(object, name) of the field this location is: what ``ASSIGNED_NUMBERS`` notes."""
        return (self.owner if self.keeper is None else self.keeper), self.key

    def read(self) -> Any:
        """The value here, or ``ABSENT`` where the step deleted the key, attribute or index.

        Why: a step may take away what it was found holding (``prune.remove``
        deletes the mask buffer it reads, ``del self.cache``). Read with
        ``get``, such a place raised ``KeyError`` in the middle of putting a
        refused capture's state back, which stopped there and left the values
        after it, graphprof's traced numbers among them, in the user's objects.
        """
        try:
            return self.get()
        except (KeyError, IndexError, AttributeError, ValueError):  # ValueError: a closure's cell emptied
            return ABSENT


def attribute_location(obj: Any, name: str, label: str) -> Location:
    """Where ``obj.name`` lives, labelled ``{label}.{name}`` (``label``: the object's own)."""
    return Location(f"{label}.{name}", lambda: getattr(obj, name), lambda v: setattr(obj, name, v),
                    Place.ATTRIBUTE, obj, name)


def own_attribute_location(obj: Any, name: str, label: str) -> Location:
    """``obj.name`` as the object itself holds it, in its ``__dict__``: None where only its class has one.

    Why not ``attribute_location``: a method read through the object is a new
    bound method at every read, never the captured one. Held so (an
    optimizer's ``step``), a wrapper the user sets on the object, or takes off
    it, between calls is a change the next call captures anew, where a replay
    of the graph captured without it kept counting, or not, as before.
    """
    fields = vars(obj)

    def put(value: Any) -> None:
        if value is None:
            fields.pop(name, None)
        else:
            fields[name] = value

    return Location(f"{label}.{name}", functools.partial(fields.get, name), put, Place.WITHIN, obj, name)


def cell_location(cell: types.CellType, label: str) -> Location:
    def put(v: Any) -> None:
        cell.cell_contents = v
    return Location(label, lambda: cell.cell_contents, put, Place.CELL, cell)


def default_locations(f: types.FunctionType) -> Iterator[tuple[Location, Any]]:
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
        yield tuple_slot(defaults, i, name), value
    kwdefaults = f.__kwdefaults__ or {}
    for name, value in kwdefaults.items():
        yield item_location(kwdefaults, name, name), value


def tuple_slot(owner: tuple, i: int, label: str, keeper: Any = None) -> Location:
    """Item ``i`` of a tuple (a function's defaults, a partial's arguments): read, never rebound."""
    return Location(label, functools.partial(operator.getitem, owner, i), _read_only(label), Place.ITEM, owner, i,
                    keeper)


def _read_only(name: str) -> Callable[[Any], None]:
    def put(value: Any) -> None:
        raise TypeError(f"{name} is read where it is kept, never rebound")
    return put


def within_location(location: Location, key: Any, label: str) -> Location:
    """``location``'s value's ``[key]`` (its ``len`` for ``key`` None), read through ``location`` on every
    call: an item of a tuple the step replaces (an RNN's ``hidden``). Never written: the step's new
    tuple is ``location``'s own change."""
    def get() -> Any:
        value = location.get()
        return len(value) if key is None else value[key]

    return Location(label, get, _read_only(label), Place.WITHIN, location, key)


def item_location(container: dict, key: Any, label: str, keeper: Any = None) -> Location:
    """``container[key]``: graphprof's own writes (``set``) through ``own_method``, the step's replayed
    ones (``write``) through the container's class, as the step's ``container[key] = value`` went."""
    put = own_method(container, "__setitem__")
    return Location(label, lambda: container[key], lambda v: put(key, v), Place.ITEM, container, key, keeper,
                    lambda v: container.__setitem__(key, v))


def own_method(container: Any, name: str) -> Callable[..., Any]:
    """``container``'s method ``name`` as the nearest class of its not defined in the user's code has
    it (``dict.__setitem__`` for a ``class LogDict(dict)``, ``OrderedDict``'s for a subclass of that):
    how graphprof writes and restores the step's dicts itself.

    Why: a dict class of the user's own with its own ``__setitem__`` (one
    that records the keys written, or validates the values) ran for
    graphprof's writes too, the inputs it puts where numbers are kept during
    the capture and the values it puts back: the record got entries eager's
    has not, and a validating one saw graphprof's traced numbers. The step's
    own writes still go through the user's method, in the capture call and,
    by ``Location.write``, in every replay, as they do in eager. A library's
    method (``OrderedDict``'s, which keeps the order of its keys) is kept. A
    user's class that keeps its items elsewhere too (an EasyDict's attributes)
    is refused before the step runs (``keeps_items_elsewhere``): written around
    its method, that copy would keep the step's values after a restore.
    """
    for cls in type(container).__mro__:
        if name in cls.__dict__ and not _users_class(cls):
            return functools.partial(cls.__dict__[name], container)
    return getattr(container, name)


def keeps_items_elsewhere(container: dict) -> bool:
    """Whether ``container``'s class is the user's, with its own ``__setitem__``, and the object keeps
    its items elsewhere too: as attributes (an EasyDict's ``cfg.lr`` is ``cfg["lr"]``), or in a dict
    or list it holds. graphprof's own writes (``own_method``) would leave that copy stale."""
    setitem = next(cls for cls in type(container).__mro__ if "__setitem__" in cls.__dict__)
    if not _users_class(setitem):
        return False
    items = {id(item) for item in container.values()}
    for name, field in (fields_of(container) or {}).items():
        held = field.values() if isinstance(field, dict) else field if type(field) is list else ()
        if name in container or id(field) in items or any(id(value) in items for value in held):
            return True
    return False


def _users_class(cls: type) -> bool:
    """A class of the user's code: of ``__main__``, of a file of the user's, or of a module with no file."""
    if cls.__module__ == "builtins":
        return False
    filename = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return filename is None or users_file(filename)


#: The standard library's bags of attributes: a class whose whole state is its ``__dict__``, which
#: the user fills (``args.global_step``), with no behaviour of its own that reads it.
ATTRIBUTE_BAGS = (types.SimpleNamespace, argparse.Namespace)


def plain_object(value: Any) -> bool:
    """An object of a class from the user's own code (an ``AverageMeter`` kept in a dict of meters),
    or a namespace (``ATTRIBUTE_BAGS``): its fields are the step's state, as those of an object the
    step names are. Not one of a library's (the loggers in ``logging``'s registry, whose levels the
    library compares).

    Why namespaces: ``S["args"] = SimpleNamespace(global_step=0, log=[])`` is a
    user's object in all but its class's file. Skipped as a library's, its
    counter stopped at the capture call's value in every replay, its list
    stopped growing, and a field the user changed between calls was not read,
    all silently. Only these exact classes: a library's subclass may give its
    fields a meaning of its own (a nested-key namespace), as a logger does.
    """
    if type(value) in ATTRIBUTE_BAGS:
        return True
    if isinstance(value, nn.Module) or not watched_object(value):
        return False
    module = sys.modules.get(type(value).__module__)
    filename = getattr(module, "__file__", None)
    return filename is None or users_file(filename)


def watched_object(value: Any) -> bool:
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
    return not module.startswith(("torch", "builtins", "transformers", "graphprof")) and (
        fields_of(value) is not None or bool(object_fields(value)))


#: The attributes watched on a class the step names or a function it runs: data, not methods or descriptors.
DATA_TYPES = PLAIN_TYPES | {list, dict}


def user_class(value: Any) -> bool:
    """A class defined in the user's code (not a library's, not a module, optimizer or exception
    class), whose public data attributes the step may keep state in (``Trainer.count += 1``)."""
    if not isinstance(value, type) or issubclass(value, (nn.Module, torch.optim.Optimizer, BaseException)):
        return False
    source = getattr(sys.modules.get(value.__module__), "__file__", None) or ""
    return value.__module__ == "__main__" or bool(source) and users_file(source)


def user_module(value: Any) -> bool:
    """A module of the user's own code (a ``config.py`` the step imports, a namespace it made with
    ``types.ModuleType``), not a library's."""
    if not isinstance(value, types.ModuleType):
        return False
    source = getattr(value, "__file__", None) or ""
    if not source:  # ``types.ModuleType("cfg")`` as a namespace; not a built-in or frozen module (a spec)
        return getattr(value, "__spec__", None) is None and value.__name__ not in sys.builtin_module_names
    return users_file(source)


def users_file(filename: str) -> bool:
    """A file of the user's own code: not torch's, graphprof's or the standard library's, not installed."""
    return not installed(filename) and not is_library(filename)


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
        if isinstance(name, str) and not name.startswith("_") and type(value) in DATA_TYPES:
            yield attribute_location(owner, name, label), value, True


def called_function(target: Any) -> Any:
    """What runs when ``target`` is called: a callable object's ``__call__``, bound to it (a trainer
    written as a class, ``Trainer(...)`` traced itself); any other callable as it is.

    Why: such an object has no ``__code__``, ``__self__`` or closure. Its
    fields (``self.n += 1``), model and optimizer were reached by no name, so
    they were not watched: a refused capture left the counter counted and the
    fallback counted it again; and no frame was the step's own, so the walk
    for code that catches exceptions went on into the caller's ``try``. Bound,
    it is the method of an object, which the step's analysis already knows.
    A ``functools.partialmethod`` as ``__call__`` is bound the same way: its
    object's fields were not watched either, and a number the step logged there
    reached the user as graphprof's own traced value.
    """
    if isinstance(target, (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial,
                           type, nn.Module)):
        return target
    call = inspect.getattr_static(type(target), "__call__", None)  # the class's own, or one it inherits
    if isinstance(call, types.FunctionType):
        return types.MethodType(call, target)
    if isinstance(call, functools.partialmethod):  # ``__call__ = partialmethod(run, scale=2.0)``
        # Bound as Python binds it: a ``functools.partial`` of the bound method, whose object and
        # arguments are the step's state like any partial's.
        return call.__get__(target, type(target))
    return target


def wrapper_chain(fn: Any) -> list[types.FunctionType]:
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


def object_fields(value: Any) -> dict[str, Any]:
    """``value``'s fields: its ``__dict__`` and the ``__slots__`` of its classes that are set (a trainer
    class with ``__slots__``, traced itself, has no ``__dict__`` for ``vars`` to read)."""
    fields = dict(fields_of(value) or {})
    for cls in type(value).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__"):
                try:
                    fields.setdefault(name, object.__getattribute__(value, name))
                except AttributeError:  # a slot not set
                    continue
    return fields


def fields_of(value: Any) -> dict[str, Any] | None:
    """``value``'s plain ``__dict__``, read as the interpreter keeps it (None without one):
    ``hasattr`` and ``vars`` call the object's own ``__getattribute__``, which a proxy may make raise."""
    try:
        fields = object.__getattribute__(value, "__dict__")
    except Exception:  # slots only, or a descriptor that refuses
        return None
    return fields if type(fields) is dict else None
