"""Python values a captured graph was decided on, held between calls: a change means another graph.

The step's Python runs once, in the capture call, and decides things from
the state it reaches (capture/inputs.py): a flag (``if self.zero_grad:``),
a dropout's ``p``, a loss function held in a closure, a config string.
Numbers the step keeps are inputs the graph reads at run time; everything
else is baked into the graph as the capture call saw it. A user who changes
one between calls (a dropout schedule, a flag switched after warm-up, a loss
function swapped) would otherwise get the old decision replayed, silently.

So every watched location is held: before each replay its value must
still be the captured one (``Hold.VALUE``: the same object, or for a plain
``int``/``float``/``bool``/``str``/``None`` an equal value of the same
type), and an input number must still have its captured type
(``Hold.TYPE``: arithmetic traced on an ``int`` is not that of a
``float``). A tensor the step keeps (``self.ema``) is read by the graph at
run time, as numbers are, so only what the graph was specialised to is held
(``Hold.TENSOR``: type, shape, strides, dtype, device, ``requires_grad``). A
location the step assigns is held by its type only: its value is the step's
own output (holding it would capture every call), but a step that reads it
first decided on its kind (``if self.best is None``), which the type keeps.
Lists and dicts the step appends to or updates are held by identity (the
graph's effects write into those very objects); one it only reads is held
with its items (``Hold.CONTENTS``), up to ``CONTENTS_LIMIT`` items.

Every replay asks, so ``compile_held_check`` writes the tests out as one
straight-line function: each value read where it lives (an attribute, a
cell, an item) without a call, compared as ``HeldValue.holds`` compares it.
``first_change`` is the readable answer (what changed) and the reference.
"""

from __future__ import annotations

import enum
import keyword
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

#: The key every namespace of graphprof's generated checks has: it holds the user's values, reads none
#: of them during a step (capture/name_reads.py tells it from the user's dicts by it).
GENERATED = "__graphprof_generated__"
#: Types whose values are held by equality (with their exact type), not by identity.
PLAIN_TYPES = frozenset({int, float, bool, str, bytes, type(None)})
#: The most items of a list or dict held item by item: comparing them costs time on every call, so a
#: bigger one (a vocabulary, a table of labels) is held as the same object only.
CONTENTS_LIMIT = 256


class Hold(enum.Enum):
    """What must stay as captured: the value itself, only its type (an input read at run time), or a
    list or dict the step reads but does not change: the same object with the same items."""

    VALUE = "value"
    TYPE = "type"
    CONTENTS = "contents"
    TENSOR = "tensor"  # a tensor the graph reads at run time: its type, shape, strides, dtype, device, requires_grad
    KEYS = "keys"  # a dict the step added keys to: the same object with the keys it had before the step


class Place(enum.Enum):
    """Where a held value lives, so that a generated check can read it without a call."""

    ATTRIBUTE = "attribute"  # getattr(owner, key)
    CELL = "cell"  # owner.cell_contents
    ITEM = "item"  # owner[key]
    WITHIN = "within"  # read(): part of a value read where it lives (an item of a tuple the step replaces)


@dataclass(frozen=True, slots=True)
class HeldValue:
    """One watched location and what its value must stay for the graph to hold."""

    describe: str
    place: Place
    owner: Any
    key: Any
    hold: Hold
    value: Any  # the captured value (VALUE, CONTENTS), its type (TYPE) or its fields (TENSOR)
    read: Callable[[], Any]
    #: CONTENTS: the items at capture (a list, or a dict's items as a list of pairs), and the dict
    #: keys whose numbers are inputs of their own (only their type is held).
    items: tuple = ()
    input_keys: frozenset = frozenset()

    def holds(self, now: Any) -> bool:
        """Whether ``now``, the location's value at a call's start, keeps the captured decision."""
        if self.hold is Hold.TYPE:
            return type(now) is self.value
        if self.hold is Hold.CONTENTS:
            return now is self.value and self._same_items(now)
        if self.hold is Hold.TENSOR:
            return tensor_fields(now) == self.value
        if self.hold is Hold.KEYS:
            return now is self.value and len(now) == len(self.items) and all(map(same_value, now, self.items))
        return same_value(now, self.value)

    def _same_items(self, now: Any) -> bool:
        if type(now) is list or type(now) is deque:
            return len(now) == len(self.items) and all(map(same_value, now, self.items))
        if len(now) != len(self.items):
            return False
        for (key, item), (was_key, was) in zip(now.items(), self.items):
            if key is not was_key and key != was_key:
                return False
            if key in self.input_keys:
                if type(item) is not type(was):
                    return False
            elif not same_value(item, was):
                return False
        return True


def tensor_fields(value: Any) -> tuple:
    """What a graph reading a tensor at run time was specialised to (``()`` for a non-tensor)."""
    if not isinstance(value, torch.Tensor):
        return ()
    return (type(value), tuple(value.shape), value.stride(), value.dtype, value.device, value.requires_grad)


def same_value(now: Any, was: Any) -> bool:
    """The same object, or for a plain value an equal one of the same type."""
    return now is was or (type(was) in PLAIN_TYPES and type(now) is type(was) and bool(now == was))


def first_change(held: Sequence[HeldValue]) -> str | None:
    """The phrase naming the first held value that changed since the capture, or None."""
    for h in held:
        try:
            now = h.read()
        except Exception:
            return f"{h.describe} is gone"
        if not h.holds(now):
            if h.hold is Hold.CONTENTS and now is h.value:
                return f"the items of {h.describe} changed"
            if h.hold is Hold.KEYS and now is h.value:
                return f"the keys of {h.describe} changed"
            if h.hold is Hold.TENSOR:
                return f"{h.describe} changed from {_fields(h.value)} to {_fields(tensor_fields(now))}"
            was = h.value.__name__ if h.hold is Hold.TYPE else _short(h.value)
            is_now = type(now).__name__ if h.hold is Hold.TYPE else _short(now)
            return f"{h.describe} changed from {was} to {is_now}"
    return None


def _fields(fields: tuple) -> str:
    if not fields:
        return "not a tensor"
    kind, shape, stride, dtype, device, requires_grad = fields
    grad = ", requires_grad" if requires_grad else ""
    return (f"a {kind.__name__} of shape {list(shape)} (strides {list(stride)}) "
            f"{str(dtype).removeprefix('torch.')} on {device}{grad}")


def _short(value: Any) -> str:
    text = repr(value) if type(value) in PLAIN_TYPES else f"a {type(value).__name__} object"
    return text if len(text) <= 60 else text[:57] + "..."


def compile_held_check(held: Sequence[HeldValue]) -> Callable[[], bool]:
    """``check()``: True when every held value holds (``HeldValue.holds``), as generated code.

    A read that fails (a deleted attribute) fails the check: ``first_change``
    then names it.
    """
    names: dict[str, Any] = {"_getattr": getattr, GENERATED: True}

    def bind(value: Any, hint: str) -> str:
        name = f"_{hint}{len(names)}"
        names[name] = value
        return name

    if not held:
        return _nothing_held
    lines = ["def check():", "    try:"]
    for h in held:
        where = _read(h, bind)
        if h.hold is Hold.TYPE:
            test = f"type({where}) is not {bind(h.value, 'type')}"
        elif h.hold in (Hold.CONTENTS, Hold.TENSOR, Hold.KEYS):  # compared by HeldValue itself
            test = f"not {bind(h.holds, 'holds')}({where})"
        elif type(h.value) in PLAIN_TYPES:
            value = bind(h.value, "value")
            test = f"(v := {where}) is not {value} and (type(v) is not {bind(type(h.value), 'type')} or v != {value})"
        else:
            test = f"{where} is not {bind(h.value, 'value')}"
        lines += [f"        if {test}:", "            return False"]
    lines += ["    except Exception:", "        return False", "    return True"]
    exec(compile("\n".join(lines), "<graphprof held values>", "exec"), names)  # noqa: S102 - our own generated text
    return names["check"]  # type: ignore[no-any-return]


def _nothing_held() -> bool:
    """The check of a graph that holds no Python value."""
    return True


def _read(h: HeldValue, bind: Callable[[Any, str], str]) -> str:
    """The expression reading a held value where it lives (what ``h.read`` does)."""
    if h.place is Place.WITHIN:
        return f"{bind(h.read, 'read')}()"
    owner = bind(h.owner, "owner")
    if h.place is Place.CELL:
        return f"{owner}.cell_contents"
    if h.place is Place.ATTRIBUTE:
        key = h.key
        if isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key) and not key.startswith("__"):
            return f"{owner}.{key}"
        return f"_getattr({owner}, {bind(key, 'key')})"
    return f"{owner}[{bind(h.key, 'key')}]"
