"""Host scalars read from tensors during whole-step capture (``.item()``).

Why this exists: torch's Adam and AdamW read their step count with ``.item()``
and do the bias correction in Python floats. A static trace would bake that
float into the graph, and every later step would reuse step 2's correction.
Instead ``.item()`` returns a ``TracedScalar``: it carries the real value (so
the capture step computes exactly what eager does) and an fx node. Python
arithmetic on it records ``operator.*`` nodes, and when it reaches a torch op
as a scalar argument the op's node refers to that node. At replay the graph
therefore does the same ``_local_scalar_dense`` and the same float arithmetic
as eager Python: bitwise the same numbers, nothing baked.

Uses that a static graph cannot replay (branching on the value, printing it,
``float()``) raise ``DataDependentError`` at capture time, so capture falls
back or fails loudly instead of silently baking a constant. (``math.sqrt``
and the other functions of ``math`` record a node: capture/math_calls.py.)

*Input* scalars are different: their value is known before the step runs
(an optimizer hyperparameter, an int argument, a counter the step reads from
its own objects; see ``inputs.py``). Branching on one, comparing it or using
it as an index is allowed: the capture records a ``Guard`` (the expression
and the outcome seen), and a replay first checks every guard on the call's
own values, before anything runs; a different outcome selects or captures
another graph. Values derived only from inputs are inputs too. (A guard,
and the check each distinct one gets, is capture/guards.py's; finding and
recording traced numbers outside torch's ops, capture/scalar_operands.py's.)
"""

from __future__ import annotations

import math
import operator
import sys
from typing import Any, Callable

import torch
import torch.fx

from graphprof.capture.call_numbers import CallScalars, number_leaves
from graphprof.capture.grad_scaler import OVERFLOW_BRANCH, add_overflow_check
from graphprof.capture.guards import Guard
from graphprof.capture.printed_texts import PRINTED_TEXTS
from graphprof.capture.sources import installed, is_library, is_standard_library, user_source


class DataDependentError(RuntimeError):
    """The function uses a tensor's value on the host in a way a static graph cannot replay."""

    #: The path the refused capture was on (capture/refused_paths.py), set by the capture it left.
    refused_path: Any = None
    #: Whether only this call's values chose the refused path, and another call's would take one a
    #: graph can replay (a gradient scaler's overflow, capture/grad_scaler.py): the call runs eagerly,
    #: and the next one captures again.
    this_call_only: bool = False


_Number = (int, float, bool)


#: On a reader node whose value a check before the replay cannot have: a phrase saying what it reads
#: and why it is unknown then (``the time (time.perf_counter)``; ``StepLR.last_lr[0], read after
#: StepLR.step``). Values computed from it carry it too.
READ_DURING_STEP = "graphprof.read_during_step"


def read_during_step(operands: Any) -> str | None:
    """Why an operand is known only while the step runs (``READ_DURING_STEP``), or None.

    Why refused: a guard is checked before the replay runs. A clock's later
    readings have not been taken then (a check that read them early and out
    of order captured a step that logs by elapsed time on every call), and a
    rate read after the step's own scheduler step would be read before the
    replay steps it: the check saw the rate the call started with, and on the
    call where the schedule crossed the branch's threshold the replay took the
    other branch than eager, silently. Each value computed from such a read
    carries the phrase (``_record``), so this is one look per operand, not a
    walk of the arithmetic behind it.
    """
    for op in operands:
        phrase = op.node.meta.get(READ_DURING_STEP) if isinstance(op, TracedScalar) else None
        if phrase is not None:
            return str(phrase)
    return None


def _refuse_read_during_step(what: str, operands: Any) -> None:
    """Refuse a guard or a text on an operand a check before the replay cannot read (``read_during_step``)."""
    during = read_during_step(operands)
    if during is not None:
        raise DataDependentError(f"{what} at {user_source(2)} depends on {during}, which a replay cannot "
                                 "know before it runs")


#: Where guards recorded now go (the active capture's list); empty outside a capture.
GUARD_SINKS: list[list[Guard]] = []
#: The active capture's stack of scalars passed to the torch call now running (the
#: recorder links the op nodes that call creates to them); empty outside a capture.
PENDING_SINKS: list[list[list["TracedScalar"]]] = []
#: One set per torch call running with scalars, innermost last: the ids of the scalars the op nodes it
#: made were linked to (the recorder adds them to every set). A scalar read from a tensor that no node
#: took was baked into the graph as the capture call's number.
LINKED_SINKS: list[set[int]] = []


_COMPARISONS = (operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne)


class TracedScalar:
    """A Python number read from a tensor, with the fx node that computes it at replay."""

    __slots__ = ("value", "node", "_graph", "_where", "is_input", "counted")

    def __init__(self, value: int | float | bool, node: torch.fx.Node, graph: torch.fx.Graph, where: str,
                 is_input: bool = False, counted: bool = False) -> None:
        self.value = value
        self.node = node
        self._graph = graph
        self._where = where
        #: Known before the step runs (derived only from inputs): guards may be taken on it.
        self.is_input = is_input
        #: Computed from inputs and counters the step keeps and advances (an optimizer's ``step``,
        #: read after its ``+= 1``): a check can compute it before the step runs, but it changes
        #: every call, so only the outcome of a comparison or a branch is guarded, never the value.
        self.counted = counted and not is_input

    # -- recording arithmetic ------------------------------------------------
    def _record(self, fn: Callable[..., Any], *operands: Any) -> "TracedScalar | Any":
        for op in operands:
            if not isinstance(op, (TracedScalar, *_Number)):
                return NotImplemented
        values = [op.value if isinstance(op, TracedScalar) else op for op in operands]
        result = fn(*values)
        args = tuple(op.node if isinstance(op, TracedScalar) else op for op in operands)
        node = self._graph.call_function(fn, args)
        node.meta["graphprof_scalar"] = True
        for op in operands:  # arithmetic belongs where its operand was read
            if isinstance(op, TracedScalar) and "graphprof.capture" in op.node.meta:
                node.meta["graphprof.capture"] = op.node.meta["graphprof.capture"]
                break
        during = read_during_step(operands)
        if during is not None:  # a value computed from a clock reading or a late read carries it
            node.meta[READ_DURING_STEP] = during
        scalars = [op for op in operands if isinstance(op, TracedScalar)]
        is_input = all(op.is_input for op in scalars)
        counted = all(op.is_input or op.counted for op in scalars)
        # Named where the value came from: a refusal names the read that makes it unknown before the
        # step, not the hyperparameter it was first combined with (RAdam's ``rho_inf - ...``).
        where = next((op._where for op in scalars if not op.is_input), self._where)
        return TracedScalar(result, node, self._graph, where, is_input, counted)

    def __add__(self, o: Any) -> Any: return self._record(operator.add, self, o)
    def __radd__(self, o: Any) -> Any: return self._record(operator.add, o, self)
    def __sub__(self, o: Any) -> Any: return self._record(operator.sub, self, o)
    def __rsub__(self, o: Any) -> Any: return self._record(operator.sub, o, self)
    def __mul__(self, o: Any) -> Any: return self._record(operator.mul, self, o)
    def __rmul__(self, o: Any) -> Any: return self._record(operator.mul, o, self)
    def __truediv__(self, o: Any) -> Any: return self._record(operator.truediv, self, o)
    def __rtruediv__(self, o: Any) -> Any: return self._record(operator.truediv, o, self)
    def __floordiv__(self, o: Any) -> Any: return self._record(operator.floordiv, self, o)
    def __rfloordiv__(self, o: Any) -> Any: return self._record(operator.floordiv, o, self)
    def __mod__(self, o: Any) -> Any: return self._record(operator.mod, self, o)
    def __rmod__(self, o: Any) -> Any: return self._record(operator.mod, o, self)
    def __pow__(self, o: Any) -> Any: return self._record(operator.pow, self, o)
    def __rpow__(self, o: Any) -> Any: return self._record(operator.pow, o, self)
    def __neg__(self) -> Any: return self._record(operator.neg, self)
    def __pos__(self) -> Any: return self._record(operator.pos, self)
    def __abs__(self) -> Any: return self._record(operator.abs, self)
    # round(loss.item(), 4) in a logged value, math.floor of a computed count: traced like arithmetic.
    def __round__(self, ndigits: Any = None) -> Any:
        return self._record(round, self) if ndigits is None else self._record(round, self, ndigits)
    def __floor__(self) -> Any: return self._record(math.floor, self)
    def __ceil__(self) -> Any: return self._record(math.ceil, self)
    def __trunc__(self) -> Any: return self._record(math.trunc, self)

    # -- uses a static graph cannot replay -------------------------------------
    def _refuse(self, what: str) -> Any:
        if self.is_input:  # named by where it is kept (self.n): say where it is used
            raise DataDependentError(f"{what} of {self._where} (a value the step reads) at {user_source(3)} "
                                     "cannot be replayed by a static graph")
        raise DataDependentError(f"{what} of a value read from a tensor with .item() at {self._where} "
                                 "cannot be replayed by a static graph")

    def _guarded(self, what: str, op: Callable[..., Any], *operands: Any) -> Any:
        """The real outcome of ``op`` on input scalars, kept as a guard; refused otherwise."""
        scalars = [o for o in operands if isinstance(o, TracedScalar)]
        if any(not isinstance(o, (TracedScalar, *_Number)) for o in operands):
            return NotImplemented if op in _COMPARISONS else self._refuse(what)
        outcome_only = op is bool or op in _COMPARISONS  # two outcomes: a guard on one is a path, not a value
        if not GUARD_SINKS and is_standard_library(sys._getframe(2).f_code.co_filename):
            # No capture is recording: the standard library between the step's end and the state's
            # restore (a logger comparing its manager's ``disable``, which the step reaches, while a
            # failed capture unwinds). Refusing there replaced the step's own error by graphprof's.
            # (graphprof's own comparisons outside a capture still refuse: its effects rely on that.)
            return op(*(o.value if isinstance(o, TracedScalar) else o for o in operands))
        if op is bool and GUARD_SINKS and not self.is_input and sys._getframe(2).f_code is OVERFLOW_BRANCH:
            return self._overflow_branch()
        if not GUARD_SINKS or not all(s.is_input or (s.counted and outcome_only) for s in scalars):
            return self._refuse(what)
        _refuse_read_during_step(what, scalars)
        result = op(*(o.value if isinstance(o, TracedScalar) else o for o in operands))
        GUARD_SINKS[-1].append(Guard(op, tuple(o.node if isinstance(o, TracedScalar) else o for o in operands),
                                     result, self._where))
        return result

    def _overflow_branch(self) -> bool:
        """GradScaler's ``if not found_inf_sum:`` (capture/grad_scaler.py): on a call that steps, False with
        a node that checks each replay's sum; a call that skips the step is not captured."""
        if self.value:
            error = DataDependentError(f"a call whose gradients overflowed (the gradient scaler skipped the "
                                       f"optimizer's step at {self._where}), a path a replay runs eagerly")
            error.this_call_only = True
            raise error
        add_overflow_check(self._graph, self.node)
        return False

    def _text(self, what: str, op: Callable[..., str], *spec: str) -> str:
        """The text of a number the step formats for ``print`` or a logger alone: a marker the replay's
        output node formats (``printed_texts``). Any other text of an input scalar is kept as a guard on that text
        (one graph per text); of a number read from a tensor, refused: a replay only knows it once it runs.

        Why a guard: library code formats numbers the caller passes whether or not the text is shown
        (transformers' ``generate`` builds a message naming ``max_length`` on every call), and a step
        logs its settings (``print(f"lr {group['lr']}")``). A value the step reads from its objects is
        known before it runs. Once such a text changes between calls, the step falls back to segments
        with one warning (``tracing``): a number that changed once is nearly always a counter or a
        logged value (``print(f"step {self.n}")``), which would change on every call.
        """
        if PRINTED_TEXTS:  # a text only ``print`` or a logger takes: formatted by the replay's output node
            if PRINTED_TEXTS[-1].percent(self, op.__name__, self._where):
                return op(self.value, *spec)  # ``"%s" % n``: noted, read back from the string
            marker = PRINTED_TEXTS[-1].defer(self, op, spec, f"{user_source(2)} ({self._where})")
            if marker is not None:
                return marker
        if not self.is_input or not GUARD_SINKS:
            return self._refuse(what)  # type: ignore[no-any-return]
        _refuse_read_during_step(what, (self,))  # a clock, or a rate read after the step's scheduler step
        text = op(self.value, *spec)
        GUARD_SINKS[-1].append(Guard(op, (self.node, *spec), text, f"{user_source(2)} ({self._where})"))
        return text

    def __bool__(self) -> bool: return self._guarded("branching on the value", bool, self)
    def __float__(self) -> float:
        if PRINTED_TEXTS and PRINTED_TEXTS[-1].percent(self, "float", self._where):
            return float(self.value)  # ``print("loss %.4f" % loss.item())``: noted, read back from the string
        return float(self._guarded("float()", float, self))

    def __int__(self) -> int:
        if PRINTED_TEXTS and PRINTED_TEXTS[-1].percent(self, "int", self._where):
            return int(self.value)
        return int(self._guarded("int()", int, self))

    def __index__(self) -> int:
        if PRINTED_TEXTS and PRINTED_TEXTS[-1].percent(self, "index", self._where):
            return operator.index(self.value)  # type: ignore[arg-type]  # a float raises, as eager's would
        return operator.index(self._guarded("using as an index", operator.index, self))

    def __str__(self) -> str: return self._text("printing", str)
    def __format__(self, spec: str) -> str: return self._text("formatting", format, spec)
    def __lt__(self, o: Any) -> bool: return self._guarded("comparing", operator.lt, self, o)
    def __le__(self, o: Any) -> bool: return self._guarded("comparing", operator.le, self, o)
    def __gt__(self, o: Any) -> bool: return self._guarded("comparing", operator.gt, self, o)
    def __ge__(self, o: Any) -> bool: return self._guarded("comparing", operator.ge, self, o)
    def __eq__(self, o: object) -> bool: return self._guarded("comparing", operator.eq, self, o)  # type: ignore[override]
    def __ne__(self, o: object) -> bool: return self._guarded("comparing", operator.ne, self, o)  # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        """The number's own type for the user's code, TracedScalar for torch's, graphprof's and libraries'.

        Why: ``if isinstance(cfg.scale, float):`` in the step was False in the
        capture call (an input is a TracedScalar there) and True in eager, so
        the replays ran the other branch, silently. ``isinstance`` asks an
        object's ``__class__`` when its type does not match; only the user's
        code is answered with the number's type (the type is held per graph, so
        another type captures another graph). ``type(x) is float`` still sees
        TracedScalar: the README says so.
        """
        caller = sys._getframe(1).f_code.co_filename
        if is_library(caller) or installed(caller):
            return TracedScalar
        return type(self.value)

    def __repr__(self) -> str:
        if GUARD_SINKS:  # the step's own ``repr(n)``, ``f"{n!r}"``, ``"%r" % n``: its text, as ``str``
            return self._text("repr()", repr)
        return f"TracedScalar({self.value!r}, node={self.node.name})"  # outside a capture: for debugging

    def __getattr__(self, name: str) -> Any:
        """A numpy scalar's ``round`` (yolov5's ``np.interp(ni, xi, [1, n]).round()``): recorded as
        arithmetic is. Any other attribute is missing, as the class says."""
        if name == "round" and type(self.value).__module__ == "numpy":
            return lambda decimals=0: self._record(_numpy_round, self, decimals)
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """A numpy ufunc of numbers (``np.cos(np.pi * it / total)`` in a schedule): a node that calls it at
        replay, as ``math``'s functions are (capture/math_calls.py); arrays and ``out=`` are not taken."""
        if method != "__call__" or kwargs or ufunc.nout != 1:
            return NotImplemented
        return self._record(ufunc, *inputs)

    # Reaching a torch function as an argument (a Scalar position): the
    # capture's TorchFunctionMode unwraps it and links the op node to it. This
    # method exists so that torch's argument parser accepts the object.
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return call_with_scalars(func, args, kwargs or {})


def _numpy_round(value: Any, decimals: int) -> Any:
    """``value.round(decimals)`` of a numpy scalar: the node a replay calls."""
    return value.round(decimals)


#: Functions that make a tensor of the data they are given: a number read from a tensor becomes one
#: ``scalar_tensor`` node linked to it, where the tensor's data would be a constant of the capture call.
_NEW_TENSOR = (torch.tensor, torch.as_tensor, torch.asarray)


def call_with_scalars(func: Any, args: tuple, kwargs: dict) -> Any:
    """Call ``func`` with TracedScalars unwrapped, linking the op node to their nodes.

    A number read from a tensor that none of the call's op nodes takes as an
    argument was baked into the graph (``torch.tensor(loss.item())``: the
    tensor's data is a constant): a replay would use the capture call's
    number, so the capture is refused instead. ``torch.tensor`` and its kin
    of one such number, and one assigned into a tensor (``t[i] = number``),
    are made as ``torch.scalar_tensor``, which takes it.
    """
    if (func in _NEW_TENSOR and len(args) == 1 and type(args[0]) is TracedScalar and PENDING_SINKS
            and kwargs.keys() <= {"dtype", "device", "requires_grad"}):
        return _scalar_tensor(args[0], **kwargs)
    if (func is torch.Tensor.__setitem__ and len(args) == 3 and type(args[2]) is TracedScalar and PENDING_SINKS
            and isinstance(args[0], torch.Tensor)):  # ``history[i] = loss.item()``: the number as the tensor's type
        value = _scalar_tensor(args[2], dtype=args[0].dtype, device=args[0].device)
        return call_with_scalars(func, (args[0], args[1], value), kwargs)
    found = CallScalars(func, number_leaves((args, kwargs), _is_traced_scalar))
    args = unwrap_scalars(args, found)
    kwargs = unwrap_scalars(kwargs, found)
    if not PENDING_SINKS:
        return func(*args, **kwargs)
    pending = PENDING_SINKS[-1]
    pending.append(found)
    linked: set[int] = set()
    LINKED_SINKS.append(linked)
    try:
        out = func(*args, **kwargs)
    finally:
        pending.pop()
        LINKED_SINKS.pop()
    baked = next((s for s in found if not s.is_input and id(s) not in linked), None)
    if baked is not None:
        raise DataDependentError(
            f"a value read from a tensor with .item() at {baked._where} reaches {_torch_name(func)} as a number the "
            "graph would keep (a constant, a size), which a static graph cannot replay; keep it a tensor "
            "(.detach() instead of .item())")
    return out


def _torch_name(func: Any) -> str:
    """``torch.tensor``, ``Tensor.add``: a torch function as the user writes it."""
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    owner, _, short = name.rpartition(".")
    if owner in ("_VariableFunctionsClass", "") and getattr(torch, short, None) is func:
        return f"torch.{short}"
    return f"Tensor.{short}" if owner in ("TensorBase", "Tensor") else name


def _scalar_tensor(value: TracedScalar, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Any:
    """``torch.tensor(value, ...)`` of one number as a ``scalar_tensor`` taking it: the same dtype (the
    default float type for a float, int64 for an int, bool for a bool) and the same number."""
    if dtype is None:
        dtype = {bool: torch.bool, int: torch.int64}.get(type(value.value), torch.get_default_dtype())
    out = call_with_scalars(torch.scalar_tensor, (value,), {"dtype": dtype, "device": device})
    return out.requires_grad_() if requires_grad else out


def _is_traced_scalar(value: Any) -> bool:
    return isinstance(value, TracedScalar)


def unwrap_scalars(tree: Any, found: list[TracedScalar]) -> Any:
    """Replace TracedScalars by their values, collecting them in ``found``."""
    if isinstance(tree, TracedScalar):
        found.append(tree)
        return tree.value
    if isinstance(tree, list):
        return [unwrap_scalars(x, found) for x in tree]
    if isinstance(tree, tuple):
        return tuple(unwrap_scalars(x, found) for x in tree)
    if isinstance(tree, dict):
        return {k: unwrap_scalars(v, found) for k, v in tree.items()}
    return tree
