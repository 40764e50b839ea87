"""The objects side of the walk that finds the step's state (capture/reachable.py): objects give fields.

Why a module of its own: ``NameWalk`` reads the user's functions for the
names they hold (cells, defaults, globals) and finds objects there; what
those objects keep is a separate question with a case for each kind of
object found on real training code: a module of the user's code (its data),
a container of callbacks, an optimizer and its custom fields, a gradient
scaler, an object of the user's classes, the submodules, buffers and kept
configs of an ``nn.Module``. ``HeldObjects`` answers it, handing back to the
name walk the callables and classes it meets (their code runs in the step).
"""

from __future__ import annotations

import collections
import functools
import itertools
import types
from typing import Any, Callable, Iterator

import torch
from torch import nn

from graphprof.capture.held_values import CONTENTS_LIMIT
from graphprof.capture.locations import (
    DATA_TYPES, Location, attribute_location, data_fields, fields_of, first_visit, item_location, object_fields,
    own_attribute_location, user_class, user_module, watched_object,
)
from graphprof.capture.scaler_state import scaler_fields
from graphprof.capture.state import held_in_container

#: What ``nn.Module.__init__`` puts in every module's ``__dict__``: torch's machinery, not the step's state.
_MODULE_INTERNALS = frozenset(vars(nn.Module())) | {"training"}


def _container(value: Any) -> bool:
    """A list, tuple or dict (a ``defaultdict(list)`` of callbacks too), not a tensor's or a library's
    mapping: those are looked into for what they keep, not for their items' own state."""
    return type(value) in (list, tuple, dict) or type(value) is collections.defaultdict


class HeldObjects:
    """The fields of the objects the walk found (``roots``, the name walk's), and what those objects keep.

    It shares with the name walk (``NameWalk``, capture/reachable.py) the
    objects waiting to be read (``roots``) and the names walked code has
    (``code_names``), and hands it what a callable binds (``bound``) and the
    classes whose methods may run in the step (``follow_methods``).
    """

    def __init__(self, roots: list[tuple[str, Any]], code_names: set[str],
                 bound: Callable[[str, Any], Iterator[tuple[Location, Any, bool]]],
                 follow_methods: Callable[[type], None]) -> None:
        self.roots = roots
        self.code_names = code_names
        self.bound = bound
        self.follow_methods = follow_methods
        self.seen: set[int] = set()  # objects whose fields were yielded

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
