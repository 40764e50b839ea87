"""Numbers outside the step's own state that a captured step was seen to assign: inputs from then on.

A module's attributes and the fields of a config it keeps are
configuration (capture/inputs.py): their numbers are baked into the graph,
because library code hands them to torch's C++ (``F.dropout(p=self.p)``,
``eps=self.eps``), which takes no traced number. But a module may also
count in ``forward`` (``self.calls += 1``) and decide on the count. The
capture call then assigns a number computed from a constant, and a replay
would assign that same constant on every call.

A step may also read such a number and rebind it for the next call from
values of its own (BYOL's ``ema.beta = tau(k)``, a temperature annealed at
the step's end): the read was baked, so a replay went on using the capture
call's value while the assignment itself was replayed right.

Such an assignment is held by its value at the call's start
(``PythonState.held``), so the next call sees the change and captures
again; and the location is noted here, so that this next capture reads the
number as an input, as it reads the step's own counters: traced
arithmetic, replayed correctly on every later call.

Entries are keyed by the owner's id with a weak reference, never by the
owner itself (a module class may define ``__eq__`` without ``__hash__``),
and go with their owner. A stale id only makes a number an input, which a
replay reads at run time: never a wrong result.
"""

from __future__ import annotations

import weakref
from typing import Any


class AssignedNumbers:
    """Locations (owner, key) whose numbers a captured step assigned."""

    def __init__(self) -> None:
        self._keys: dict[int, tuple[weakref.ref, set[Any]]] = {}

    def add(self, owner: Any, key: Any) -> None:
        """Note that a step assigns ``owner``'s ``key`` (an owner that cannot be weakly referenced is
        not noted: its number stays configuration, and every such call captures again)."""
        entry = self._keys.get(id(owner))
        if entry is not None and entry[0]() is owner:
            entry[1].add(key)
            return
        ident = id(owner)
        try:
            ref = weakref.ref(owner, lambda _, ident=ident: self._keys.pop(ident, None))  # type: ignore[misc]
        except TypeError:
            return
        self._keys[ident] = (ref, {key})

    def __contains__(self, location: tuple[Any, Any]) -> bool:
        owner, key = location
        entry = self._keys.get(id(owner))
        return entry is not None and entry[0]() is owner and key in entry[1]


#: Every capture in the process consults the same record: the numbers are the objects', not a step's.
ASSIGNED_NUMBERS = AssignedNumbers()
