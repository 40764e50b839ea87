"""A result the step also keeps is handed back as the kept object, as eager hands it back.

``self.history.append(out); return out``, ``stats = {...}; self.last = stats;
return stats`` and ``return self.metrics`` (a dict the step updates) return
an object the step keeps: eager's ``ret is trainer.last`` is True, and
changing the returned dict changes the kept one. A replay rebuilt the result
from the graph's outputs, a copy of its own; and a kept dict the step
updates in place had its numbers made real by its effect before the result
was flattened, so every replay returned the capture call's numbers.

Before the effects are made, ``kept_places`` notes where each list, tuple,
dict or deque the watched state holds lives (an appended item by its place
from the end: the list grows on every call). ``read_kept_results`` then puts
in the result, for each returned container found there, a reader that runs
after the effects and reads it where it is kept: the replay's own object, the
one its effects filled or updated.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterable, Sequence

import torch.fx

from graphprof.capture.host_nodes import reader_node
from graphprof.capture.locations import Location

_CONTAINERS = (list, tuple, dict, deque)
#: How deep below a watched value, and how many of its items in all, ``kept_places`` looks.
_DEPTH = 3
_ITEMS = 10_000

#: Where a container lives: what to call it, a function that reads it there, and the container (held, so
#: that no other object takes its id while the map lives).
KeptPlace = tuple[str, Callable[[], Any], Any]


def note_containers(value: Any, what: str, read: Callable[[], Any], into: dict[int, KeptPlace],
                    budget: list[int] | None = None, depth: int = 0) -> None:
    """Note in ``into`` (id -> place) ``value`` and the containers in it, when they are lists, tuples,
    dicts or deques, each read through ``read`` (an appended item by its place from the end: a list the
    step appends to has its new items last on every call). The first place noted for one is kept."""
    budget = [_ITEMS] if budget is None else budget
    if type(value) not in _CONTAINERS or id(value) in into or budget[0] <= 0:
        return
    into[id(value)] = (what, read, value)
    if depth >= _DEPTH:
        return
    items: Sequence[tuple[Any, Any]]
    items = list(value.items()) if isinstance(value, dict) else [(i - len(value), v) for i, v in enumerate(value)]
    budget[0] -= len(items)
    for key, item in items:
        note_containers(item, what, _item_reader(read, key), into, budget, depth + 1)


def _item_reader(read: Callable[[], Any], key: Any) -> Callable[[], Any]:
    return lambda: read()[key]


def kept_places(locations: Iterable[Location]) -> dict[int, KeptPlace]:
    """id -> where, for each container the values at ``locations`` hold, as they are now."""
    places: dict[int, KeptPlace] = {}
    budget = [_ITEMS]
    for location in locations:
        try:
            value = location.get()
        except Exception:  # a property that raises: nothing kept there
            continue
        note_containers(value, location.describe, location.get, places, budget)
    return places


class KeptResult:
    """A returned container read where it is kept: one leaf of the result, its reader's node."""

    __slots__ = ("node", "read")

    def __init__(self, node: torch.fx.Node, read: Callable[[], Any]) -> None:
        self.node, self.read = node, read


def read_kept_results(out: Any, places: dict[int, KeptPlace], graph: torch.fx.Graph, record: Any) -> Any:
    """``out`` with each container the step keeps (``places``) replaced by a ``KeptResult``, whose
    reader (at the graph's end, after the effects) gives a replay the kept object."""
    if not places:
        return out

    def walk(value: Any) -> Any:
        place = places.get(id(value)) if type(value) in _CONTAINERS else None
        if place is not None:
            what, read, _ = place
            return KeptResult(reader_node(graph, read, f"kept {what}", record), read)
        if type(value) in (list, tuple):
            return type(value)(walk(v) for v in value)
        if type(value) is dict:
            return {k: walk(v) for k, v in value.items()}
        return value
    return walk(out)
