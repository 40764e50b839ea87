"""Where a string the step makes goes: the output calls it reaches, when it reaches nothing else.

Why: a formatted number's text is a marker that the replay's output node
formats (``printed_texts``). The marker is only right where the string
reaches ``print`` or a logger and nothing else: compared, hashed, measured or
kept, it would be the capture call's marker, not eager's text. Printing it
straight (``print(f"loss {l:.4f}")``) was the only form taken; the PyTorch
examples also build the line first: ``mesg = "{}\\tEpoch {}: loss
{:.6f}".format(time.ctime(), e, l); print(mesg)`` (fast_neural_style),
``print("L: " + str(round(l, 4)))``, ``print("\\t".join([a, f"{l:.3f}"]))``.

How: from the expression that makes the text, up the source's tree, the
string may pass only through

* ``+`` with another text the source makes itself (a string constant, an
  f-string, ``str(...)``, ``"...".format(...)``, ``time.ctime()``, or a
  ``+`` of those): each is a ``str``, whose ``+`` keeps both texts as they
  are;
* an item of a list or tuple written out as the only argument of a
  constant string's ``join``;
* a field of an f-string or of a constant string's ``format`` with no spec
  and no conversion (a width would pad the marker);
* an assignment to a local name of a function (not a closure's cell, not
  a module's or a class's name, in a function that does not call
  ``locals()`` or ``vars()``), every read of which goes on by these same
  rules (a name assigned again from itself refuses);

and end as an argument of ``print`` or the message of a logging call (which
``printed_texts`` checks are Python's and logging's own). Anything else
(``.upper()``, ``len``, a comparison, a dict key, ``kept.append(mesg)``, a
``return``) is None: the caller refuses as before.
"""

from __future__ import annotations

import ast
import functools
import string
from types import CodeType

#: Logging calls whose message a record keeps as it is given (``Logger._log``, patched by the capture).
LOG_METHODS = frozenset({"debug", "info", "warning", "error", "critical", "exception", "fatal"})
#: Calls that hand the step's locals to whoever asks: a name's reads are then not all in the source.
_NAMESPACE_CALLS = frozenset({"locals", "vars"})


@functools.lru_cache(maxsize=64)
def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    """Each node's parent, by the node's id (the tree is cached, so ids stay its nodes')."""
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def output_calls(tree: ast.AST, node: ast.expr, code: CodeType, direct: bool = False) -> tuple[ast.Call, ...] | None:
    """The ``print(...)`` and ``<logger>.<method>(...)`` calls the string ``node`` makes reaches, if it reaches
    nothing else (``direct``: only as their own argument, as ``%``-formatting's read-back needs); else None."""
    parents = _parents(tree)
    if direct:
        parent = parents.get(id(node))
        return (parent,) if isinstance(parent, ast.Call) and _an_output_argument(parent, node) else None
    return _reached(node, parents, tree, code, frozenset())


def _an_output_argument(call: ast.Call, node: ast.AST) -> bool:
    """``print(..., node, ...)`` or ``<owner>.info(node, ...)`` (whether these are Python's own print and
    a logger's method is ``printed_texts``' to check, with the frame)."""
    if isinstance(call.func, ast.Name) and call.func.id == "print":
        return any(arg is node for arg in call.args)
    return (isinstance(call.func, ast.Attribute) and call.func.attr in LOG_METHODS and bool(call.args)
            and call.args[0] is node)


def _reached(node: ast.AST, parents: dict[int, ast.AST], tree: ast.AST, code: CodeType,
             names: frozenset[str]) -> tuple[ast.Call, ...] | None:
    parent = parents.get(id(node))
    if isinstance(parent, ast.Call):
        if _an_output_argument(parent, node):
            return (parent,)
        if _plain_format_field(parent, node):
            return _reached(parent, parents, tree, code, names)
        return None
    if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Add):
        other = parent.right if parent.left is node else parent.left
        return _reached(parent, parents, tree, code, names) if made_text(other) else None
    if isinstance(parent, (ast.List, ast.Tuple)) and isinstance(parent.ctx, ast.Load):
        joining = parents.get(id(parent))
        if isinstance(joining, ast.Call) and _a_constant_join(joining) and joining.args[0] is parent:
            return _reached(joining, parents, tree, code, names)
        return None
    if isinstance(parent, ast.FormattedValue) and parent.value is node:
        if parent.conversion != -1 or parent.format_spec is not None:
            return None
        return _reached(parents[id(parent)], parents, tree, code, names)
    if (isinstance(parent, ast.Assign) and parent.value is node and len(parent.targets) == 1
            and isinstance(parent.targets[0], ast.Name)):
        return _name_reaches(parent.targets[0].id, parent, parents, tree, code, names)
    return None


def _name_reaches(name: str, assignment: ast.AST, parents: dict[int, ast.AST], tree: ast.AST, code: CodeType,
                  names: frozenset[str]) -> tuple[ast.Call, ...] | None:
    """The output calls every read of the local ``name`` (assigned at ``assignment``) reaches, or None."""
    if name in names or name not in code.co_varnames or name in code.co_cellvars or name in code.co_freevars:
        return None
    function = parents.get(id(assignment))
    while function is not None and not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                                             ast.ClassDef, ast.Module)):
        function = parents.get(id(function))
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or function.name != code.co_name:
        return None
    calls: list[ast.Call] = []
    for node in _own_nodes(function):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _NAMESPACE_CALLS:
            return None
        if isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name) \
                and node.target.id == name:
            return None
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            reached = _reached(node, parents, tree, code, names | {name})
            if reached is None:
                return None
            calls += reached
    return tuple(calls)


def _own_nodes(function: ast.AST) -> list[ast.AST]:
    """The nodes of ``function``'s body, not those of functions, lambdas or classes defined in it (their
    reads of its names are a closure's: refused by the name's cell)."""
    found: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        found.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))
    return found


def made_text(node: ast.AST) -> bool:
    """An expression the source itself makes a ``str`` of: a string constant, an f-string, ``str(...)``,
    ``"...".format(...)``, ``"...".join(...)``, ``time.ctime()`` and its kin, or a ``+`` of those. (``str`` being Python's is
    ``printed_texts``' to check, with the frame, where it formats a number.)"""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return made_text(node.left) and made_text(node.right)
    if isinstance(node, ast.Call):
        return (a_str_call(node) or _a_constant_join(node) or a_time_text_call(node)
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "format"
                    and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str)))
    return False


def a_str_call(node: ast.AST) -> bool:
    """``str(x)``: one argument, no keywords."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str"
            and len(node.args) == 1 and not node.keywords and not isinstance(node.args[0], ast.Starred))


def a_time_text_call(node: ast.AST) -> bool:
    """``time.ctime()``, ``ctime()``, ``time.strftime(fmt)``: a call of a name of capture/time_texts.py's
    (that it is the time's is known when the capture's stand-in is the function the call runs)."""
    if not isinstance(node, ast.Call) or node.keywords:
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return name in ("ctime", "asctime", "strftime")


def _a_constant_join(node: ast.Call) -> bool:
    """``"sep".join(<list or tuple written out>)``."""
    return (isinstance(node.func, ast.Attribute) and node.func.attr == "join" and isinstance(node.func.value, ast.Constant)
            and isinstance(node.func.value.value, str) and len(node.args) == 1 and not node.keywords
            and isinstance(node.args[0], (ast.List, ast.Tuple)))


def _plain_format_field(call: ast.Call, node: ast.AST) -> bool:
    """``node`` is a positional argument of a constant string's ``format`` that every field reading it
    writes as it is: no spec, no conversion, no attribute or item of it (a width would pad the marker)."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "format" and isinstance(func.value, ast.Constant)
            and isinstance(func.value.value, str)):
        return False
    if any(isinstance(arg, ast.Starred) for arg in call.args) or any(k.arg is None for k in call.keywords):
        return False
    index = next((i for i, arg in enumerate(call.args) if arg is node), None)
    if index is None:
        return False
    try:
        fields = [f for f in string.Formatter().parse(func.value.value) if f[1] is not None]
    except ValueError:
        return False
    automatic = 0
    for _, named, spec, conversion in fields:
        if spec and "{" in spec:  # a nested field (``{:{}}``) numbers the arguments too
            return False
        field = named or ""
        if field == "":
            field, automatic = str(automatic), automatic + 1
        key = field.split(".", 1)[0].split("[", 1)[0]
        if key == str(index) and (field != key or spec or conversion):
            return False
    return True
