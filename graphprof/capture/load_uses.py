"""What each name load in the user's code reads, and what the code does with the object it loads.

Why a module of its own: ``NameReads`` (capture/name_reads.py) traces the
user's frames instruction by instruction, and must answer each instruction
with one lookup. The work of reading a code object's bytecode once, before
its first instruction runs, is here: which instructions load or store a
name, whether a load reaches names dynamically (``getattr``, ``vars``), and
whether the loaded object is appended to (``hist.append``), has its last
item read (``hist[-1]``), is measured, summed, subscripted or tested for
truth (answered by a growing list's traced view, capture/growing_lists.py),
is assigned to a local (an alias) or is read any other way.
"""

from __future__ import annotations

import dis
import types

#: Instructions that assign or delete a global (noted apart from the loads: ``NameReads.stored_globals``).
_GLOBAL_WRITES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})
#: Besides ``LOAD_*``: instructions that read a name (a global or attribute imported, a class cell).
_READS = frozenset({"IMPORT_FROM", "IMPORT_NAME", "LOAD_CLASSDEREF", "DELETE_DEREF", "DELETE_NAME"})
#: Variables through which code reaches others without naming them (builtins and modules it calls).
_DYNAMIC = frozenset({"globals", "locals", "vars", "eval", "exec", "getattr", "gc", "inspect"})
#: Attributes that do the same (``model.eval()`` is not one: an attribute named like a builtin).
_DYNAMIC_ATTRIBUTES = frozenset({"__dict__", "__closure__", "__globals__", "_getframe", "f_globals", "f_locals",
                                 "f_back", "currentframe", "stack", "getmembers", "cell_contents", "get_referrers",
                                 "get_referents"})
#: Instructions that read an attribute (their names are checked against ``_DYNAMIC_ATTRIBUTES``).
_ATTRIBUTE_READS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR", "IMPORT_FROM"})

_APPEND, READ, _LAST, TRACED, _ALIAS = "append", "read", "last", "traced", "alias"
#: A load's use other than appending: (kind, names, ``READ``, ``_LAST``, ``TRACED`` or ``_ALIAS``,
#: and for ``_ALIAS`` the (kind, name) of the local it is assigned to).
Use = tuple[str, tuple[str, ...], str, "tuple[str, str] | None"]


class Load:
    """One load instruction of the user's code: the names it reads, what for (None: appending to
    the object, or a constant that names nothing), and whether it reaches names dynamically; or
    (``stores``) an instruction that assigns or deletes the global it names."""

    __slots__ = ("names", "use", "dynamic", "stores")

    def __init__(self, names: tuple[str, ...], use: Use | None, dynamic: bool, stores: bool = False) -> None:
        self.names, self.use, self.dynamic, self.stores = names, use, dynamic, stores


def code_loads(code: types.CodeType) -> dict[int, Load]:
    """Offset -> each load (and each global store) in the user's ``code``: what it reads, and for what."""
    loads: dict[int, Load] = {}
    instructions = [ins for ins in dis.get_instructions(code) if ins.opname != "EXTENDED_ARG"]
    for j, ins in enumerate(instructions):
        if ins.opname in _GLOBAL_WRITES:
            loads[ins.offset] = Load((ins.argval,), None, False, stores=True)
            continue
        if not (ins.opname.startswith("LOAD_") or ins.opname in _READS):
            continue
        # Any kind of name, each name of a fused instruction (``LOAD_FAST_LOAD_FAST`` in 3.13):
        # a name loaded as a local in one frame counts as loaded as a global too.
        names = ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)
        names = tuple(n for n in names if isinstance(n, str))
        if names:
            dynamic = _DYNAMIC_ATTRIBUTES if ins.opname in _ATTRIBUTE_READS else _DYNAMIC
            loads[ins.offset] = Load(names, _read_use(instructions, j),
                                     any(n in dynamic for n in names))
    return loads


def _read_use(instructions: list[dis.Instruction], j: int) -> Use | None:
    """What the load ``instructions[j]`` is used for, where that is not appending to it."""
    ins = instructions[j]
    names: tuple[str, ...]
    if ins.opname == "LOAD_CONST":
        kind, names = "item", ((ins.argval,) if isinstance(ins.argval, str) else ())
    else:
        kind = _KINDS.get(ins.opname, "")
        names = ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)
        names = tuple(n for n in names if isinstance(n, str))
    if not kind or not names:
        return None
    how = _use(instructions, j)
    if len(names) > 1 and how is not None:  # a fused load: only the last name's use is known
        how = READ
    alias = None
    if how is _ALIAS:
        store = instructions[j + 2 if ins.opname == "LOAD_CONST" else j + 1]
        alias = ("cell" if store.opname == "STORE_DEREF" else "fast", str(store.argval))
    return (kind, names, how, alias) if how is not None and how is not _APPEND else None
#: How each load instruction reaches a name: a closure cell, a global, a local (a default
#: argument's parameter) or an attribute.
_KINDS = {"LOAD_DEREF": "cell", "LOAD_CLASSDEREF": "cell", "LOAD_CLOSURE": "cell", "LOAD_GLOBAL": "global",
          "LOAD_NAME": "global", "LOAD_FAST": "fast", "LOAD_FAST_CHECK": "fast", "LOAD_FAST_AND_CLEAR": "fast",
          "LOAD_FAST_LOAD_FAST": "fast", "LOAD_FAST_BORROW": "fast", "LOAD_FAST_BORROW_LOAD_FAST_BORROW": "fast",
          "LOAD_ATTR": "attribute", "LOAD_METHOD": "attribute", "LOAD_SUPER_ATTR": "attribute"}


def _use(instructions: list[dis.Instruction], j: int) -> str | None:
    """What the code does with the object loaded by ``instructions[j]``: appends to it
    (``hist.append``), reads its last item (``hist[-1]``), or anything else (read). For a string
    constant: the use of the item it subscripts (``logs["loss"].append``), None where it is not
    a subscript (a constant is not a name)."""
    k = j + 1
    if instructions[j].opname == "LOAD_CONST":
        if k >= len(instructions) or instructions[k].opname != "BINARY_SUBSCR":
            return None
        k += 1
    if k >= len(instructions):
        return READ
    nxt = instructions[k]
    if nxt.opname in ("LOAD_METHOD", "LOAD_ATTR") and nxt.argval in ("append", "extend"):
        return _APPEND
    if nxt.opname in ("STORE_FAST", "STORE_DEREF") and isinstance(nxt.argval, str):
        return _ALIAS
    if (nxt.opname == "LOAD_CONST" and nxt.argval == -1 and k + 1 < len(instructions)
            and instructions[k + 1].opname == "BINARY_SUBSCR"):
        return _LAST
    start = j - 1 if instructions[j].opname in ("LOAD_CONST", "LOAD_ATTR") else j  # where the object's load began
    if _truth_test(nxt) or _measured(instructions, start, k) or _subscripted(instructions, k):
        return TRACED
    return READ


#: Instructions an index may be made of (``hist[-k:]``, ``hist[i - 1]``) between the list's load and its subscript.
_INDEX_PARTS = frozenset({"LOAD_CONST", "LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE", "LOAD_NAME", "UNARY_NEGATIVE",
                          "BUILD_SLICE", "BINARY_OP", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"})


def _truth_test(ins: dis.Instruction) -> bool:
    """``if hist:``, ``x if hist else y``, ``not hist``: the object's truth is asked for."""
    name = ins.opname
    return (name in ("UNARY_NOT", "TO_BOOL") or name.startswith("JUMP_IF_")
            or (name.startswith("POP_JUMP") and (name.endswith("IF_FALSE") or name.endswith("IF_TRUE"))))


def _measured(instructions: list[dis.Instruction], start: int, k: int) -> bool:
    """``len(hist)``, ``sum(hist)``: the object is the one argument of a call of the builtin."""
    if start < 1 or k >= len(instructions):
        return False
    callee = instructions[start - 1]
    if callee.opname not in ("LOAD_GLOBAL", "LOAD_NAME") or callee.argval not in ("len", "sum"):
        return False
    call = instructions[k + 1] if instructions[k].opname == "PRECALL" and k + 1 < len(instructions) else instructions[k]
    return call.opname == "CALL" and call.arg == 1


def _subscripted(instructions: list[dis.Instruction], k: int) -> bool:
    """``hist[-3:]``, ``hist[i]``: the next subscript takes the object (the stack, from ``k`` on, holds it
    and an index made of loads and arithmetic)."""
    depth = 1
    for ins in instructions[k:k + 8]:
        if ins.opname == "BINARY_SUBSCR":
            return depth == 2
        if ins.opname == "BINARY_SLICE":  # ``hist[a:b]`` from Python 3.12: the object, start and stop
            return depth == 3
        if ins.opname not in _INDEX_PARTS:
            return False
        depth += dis.stack_effect(ins.opcode, ins.arg)
    return False
