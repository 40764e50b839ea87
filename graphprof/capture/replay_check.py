"""One generated function that says whether a call replays a captured path as it stands.

Before a replay, ``CapturedPaths.select`` (tracing/captured_paths.py) asks four questions of every call: is the
input signature the last call's (``LastSignature.matches``), are the baked
optimizer settings, module modes and held Python values unchanged
(``BakedValues``, capture/held_values.py), are the gradients and optimizer state as at capture (``CapturedStep.entry_mismatch``),
and does every guard hold (``CapturedStep.broken_guard``). Each is cheap on
its own, but on a step of tiny ops their sum is graphprof's own time in the
step, and right after a step it is paid with cold caches: a dozen Python
frames, a loop reading 129 modules' flags through one polymorphic attribute
site, tuples built only to be compared.

``replay_check`` writes the same four tests out as one straight-line
function for one (signature, path) pair: the same reads of the same objects,
compared the same way, each module's flag read at a site of its own. It is a
sufficient test only: it returns True only where the four questions would
select this path, and False wherever it is not sure (anything it does not
know, such as a changed list of optimizers, falls back to the full
questions, which also name what changed). So a False costs one slow call and
never a wrong replay.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Generic, TypeVar

import torch
from torch.utils.hooks import RemovableHandle

from graphprof.capture.baked_values import BakedValues
from graphprof.capture.module_structure import REGISTRATIONS
from graphprof.capture.signature import LastSignature, ambient_state, autocast_state
from graphprof.capture.captured_step import CapturedStep

#: ``check(args, kwargs)``: True when the call would replay the path the check was written for.
ReplayCheck = Callable[[tuple, dict], bool]
Runner = TypeVar("Runner")


class Path(Generic[Runner]):
    """One captured graph of a signature: its runner, its step, the values baked into it, and its
    replay check (None where the key has no ``LastSignature`` or the tests cannot be written out)."""

    __slots__ = ("runner", "captured", "baked", "check")

    def __init__(self, runner: Runner, captured: CapturedStep, baked: BakedValues) -> None:
        self.runner = runner
        self.captured = captured
        self.baked = baked
        self.check: ReplayCheck | None = None

    @classmethod
    def of(cls, runner: Runner, captured: CapturedStep, last: LastSignature | None) -> "Path[Runner]":
        """A new capture's path, its check written now (in the capture call, not in a profiled step)."""
        path = cls(runner, captured, BakedValues(captured.state, captured.held, captured.structure,
                                                    captured.modes_at_entry, captured.modes_read))
        if last is not None:
            path.check = replay_check(last, path.baked, captured)
        return path


class _Code:
    """The function's lines and the objects its code names (bound as globals)."""

    def __init__(self) -> None:
        self.globals: dict[str, Any] = {"_grad_enabled": torch.is_grad_enabled, "_Tensor": torch.Tensor,
                                        "_Parameter": torch.nn.Parameter, "_list": list,
                                        "_tuple": tuple, "_map": map, "_all": all, "_sum": sum, "_len": len,
                                        "_is": operator.is_, "_dict_get": dict.get,
                                        "_requires_grad": operator.attrgetter("requires_grad"),
                                        "_any_autocast": torch._C._is_any_autocast_enabled,
                                        "_autocast_state": autocast_state, "_default_dtype": torch.get_default_dtype,
                                        "_ambient_state": ambient_state}
        self.lines = ["def check(args, kwargs):"]

    def bind(self, value: Any, hint: str) -> str:
        name = f"_{hint}{len(self.globals)}"
        self.globals[name] = value
        return name

    def fail_if(self, condition: str) -> None:
        self.lines += [f"    if {condition}:", "        return False"]

    def fail_if_any(self, conditions: list[str]) -> None:
        if conditions:
            self.fail_if(" or ".join(conditions))


def replay_check(last: LastSignature, baked: BakedValues, step: CapturedStep) -> ReplayCheck | None:
    """The check for the path (``baked``, ``step``) of ``last``'s signature, or None where the
    path's tests cannot be written out (``BakedValues`` has no exact cheap test for its groups)."""
    if (baked.group_tests is None or baked.state is not step.state
            or (baked.modes_read and len(baked.state.module_objects()) != len(baked.modes))):
        return None
    code = _Code()
    _signature(code, last)
    _optimizers(code, baked, step)
    _modules(code, baked)
    _held(code, baked)
    _gradients(code, step)
    if step.guards:
        code.fail_if(f"{code.bind(step.compile_guards().broken, 'guards')}(_list(args)) is not None")
    code.lines.append("    return True")
    exec(compile("\n".join(code.lines), "<graphprof replay check>", "exec"), code.globals)  # noqa: S102 - our own generated text
    return code.globals["check"]  # type: ignore[no-any-return]


def _signature(code: _Code, last: LastSignature) -> None:
    """``LastSignature.matches``: positional tensors only, each field compared as it compares them."""
    code.fail_if(f"kwargs or len(args) != {last.count} or _grad_enabled() is not {last.grad_enabled}")
    autocast = ("_any_autocast()" if last.autocast is None
                else f"_autocast_state() != {code.bind(last.autocast, 'autocast')}")
    code.fail_if(f"_default_dtype() is not {code.bind(last.default_dtype, 'dtype')} or {autocast}")
    code.fail_if(f"_ambient_state() != {code.bind(last.ambient, 'ambient')}")
    if not last.count:
        return
    names = [f"a{i}" for i in range(last.count)]
    code.lines.append(f"    {', '.join(names)}, = args")
    for a, (shape, stride, dtype, device, requires_grad) in zip(names, last.tensors):
        code.fail_if(f"(type({a}) is not _Tensor and type({a}) is not _Parameter) or {a}.shape != "
                     f"{code.bind(shape, 'shape')} or {a}.stride() != {code.bind(stride, 'stride')} or "
                     f"{a}.dtype is not {code.bind(dtype, 'dtype')} or "
                     f"{a}.requires_grad is not {code.bind(requires_grad, 'requires_grad')} or "
                     f"{a}.device != {code.bind(device, 'device')}"
                     + (f" or {a}.grad is not None" if requires_grad is True else ""))


def _optimizers(code: _Code, baked: BakedValues, step: CapturedStep) -> None:
    """The same optimizers in the same order, each group passing its ``BakedValues`` test, and as
    many parameters with state as at capture (``entry_mismatch``)."""
    state = step.state
    optimizers = list(state.optimizers)
    names = [code.bind(opt, "opt") for opt in optimizers]
    code.lines.append(f"    optimizers = {code.bind(state, 'state')}.optimizers")
    code.fail_if_any([f"type(optimizers) is not _list or len(optimizers) != {len(optimizers)}"]
                     + [f"optimizers[{j}] is not {name}" for j, name in enumerate(names)])
    tests = iter(baked.group_tests or ())
    for name, opt in zip(names, optimizers):
        code.lines.append(f"    groups = {name}.param_groups")
        code.fail_if(f"type(groups) is not _list or len(groups) != {len(opt.param_groups)}")
        code.fail_if_any([f"not {code.bind(next(tests), 'group')}(groups[{g}])"
                          for g in range(len(opt.param_groups))])
    read = step.optimizer_state_read
    names = [name for name, r in zip(names, read or [True] * len(names)) if r]  # the stateful optimizers'
    code.fail_if_any([f"len({name}.state) != {count}"
                      for name, count in zip(names, step.optimizer_states_at_entry)])
    code.fail_if_any([f"{name}.state is not {code.bind(state_dict, 'state')}"
                      for name, state_dict in zip(names, step.optimizer_state_objects)])
    entries = step.optimizer_state_entries
    if entries is None:  # nothing noted: nothing for ``entry_mismatch`` to compare either
        return
    # The very per-parameter dicts, and values in them, the graph holds: C-level maps, no frame per parameter.
    code.fail_if_any([f"not _all(_map(_is, {name}.state.values(), {code.bind(dicts, 'dicts')}))"
                      for name, dicts in zip(names, entries.dicts) if dicts])
    if entries.values:
        code.fail_if(f"_sum(_map(_len, {code.bind(entries.every, 'dicts')})) != {len(entries.values)} or not _all(_map(_is, "
                     f"_map(_dict_get, {code.bind(entries.holders, 'holders')}, {code.bind(entries.keys, 'keys')}), "
                     f"{code.bind(entries.values, 'values')}))")


def _modules(code: _Code, baked: BakedValues) -> None:
    """Every module's ``training`` flag as at capture, read from the tuple ``_unchanged`` reads (none
    where no code the step ran names the flag, ``BakedValues.modes_read``)."""
    modules = baked.state.module_objects()
    tuple_name = code.bind(modules, "modules")
    code.fail_if(f"{code.bind(baked.state.module_objects, 'objects')}() is not {tuple_name}")
    if not modules or not baked.modes_read:
        return
    # Unpacked into locals: one read of the tuple, not a global per module.
    names = [f"m{i}" for i in range(len(modules))]
    code.lines.append(f"    {', '.join(names)}, = {tuple_name}")
    code.fail_if_any([f"{name}.training is not {mode if type(mode) is bool else code.bind(mode, 'mode')}"
                      for name, mode in zip(names, baked.modes)])


def _held(code: _Code, baked: BakedValues) -> None:
    """The held Python values, by their own generated check (capture/held_values.py), and the
    modules' structure by its two counts (capture/module_structure.py): when one moved, the long
    way looks closer and, where nothing of this graph changed, takes the new counts."""
    if baked.held:
        code.fail_if(f"not {code.bind(baked.held_check, 'held')}()")
    structure = baked.structure
    if structure is not None:
        counts = code.bind(structure.counts, "counts")
        code.fail_if(f"{code.bind(REGISTRATIONS, 'registrations')}.count != {counts}[0] or "
                     f"{code.bind(RemovableHandle, 'handles')}.next_id != {counts}[1]")
        if structure.hooks_to_compare:
            code.fail_if(f"not {code.bind(structure.counts_hold, 'hooks')}()")


def _gradients(code: _Code, step: CapturedStep) -> None:
    """Each parameter's ``requires_grad``, and each checked one's ``.grad`` present or absent, as at
    capture (``entry_mismatch``)."""
    if step.requires_grad_at_entry:
        code.fail_if(f"_tuple(_map(_requires_grad, {code.bind(step.grad_params, 'params')})) != "
                     f"{code.bind(step.requires_grad_at_entry, 'requires_grad')}")
    params, expected = step.entry_checked
    code.fail_if_any([f"{code.bind(p, 'p')}.grad is {'' if present else 'not '}None"
                      for p, present in zip(params, expected)])
    if step.dropped_grads_read:  # the step reads gradients it drops: they must be there, as at capture
        code.fail_if(f"{code.bind(step.clear_grads[0], 'p')}.grad is None")
