"""The options of a profile table, shared by ``graphprof analyze`` and ``Profile.table``.

One frozen dataclass so the CLI, the Python API and the report and diff
commands accept the same options with the same meaning and the same checks.
``TableOptions`` is the one place the options, their defaults and their checks
are written; ``make_options`` maps the keyword spellings users type
(``type``, ``phase``, ``min_time`` ...) onto it, and the CLI reads its flags'
names and defaults from both. A bad
value raises ``TableOptionError`` (a ValueError) whose message is one sentence
the CLI prints as is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable

from graphprof.analysis.columns import parse_order_by, resolve_columns
from graphprof.analysis.option_errors import TableOptionError

AGGREGATES = ("sum", "mean", "max", "min")
AGGREGATE_BY = ("type", "module", "source", "shape", "scope", "phase", "graph")
STATS = ("median", "mean", "min", "max")
PHASES = ("forward", "backward", "optimizer", "other")
PRINT_ONLY = ("summary", "table")
CLOCKS = ("auto", "host", "device")
#: Formats handled by graphprof itself; every other name is a tabulate table format.
DATA_FORMATS = ("csv", "json")
#: Narrowest table width accepted: the rank, time and share columns, and a name.
MIN_WIDTH = 40

_DTYPE_ALIASES = {
    "float": "float32", "half": "float16", "double": "float64", "long": "int64", "int": "int32",
    "short": "int16", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64",
    "cfloat": "complex64", "cdouble": "complex128",
}


def normalize_dtype(name: str) -> str:
    """``torch.float32``, ``Float32`` (MegEngine) and ``float`` all become ``float32``."""
    key = name.strip().lower()
    key = key.removeprefix("torch.")
    return _DTYPE_ALIASES.get(key, key)


def normalize_type(name: str) -> str:
    """``aten::addmm`` (torch.profiler's spelling) becomes ``aten.addmm``; others are kept."""
    return name.strip().replace("::", ".")


#: MegEngine operator classes (``--type ConvolutionForward`` in its docs) and the aten op
#: types that do the same work. Elemwise and Reduce cover too many ops to name here.
MEGENGINE_TYPES: dict[str, tuple[str, ...]] = {
    "ConvolutionForward": ("convolution",),
    "ConvBiasForward": ("convolution",),
    "ConvolutionBackwardData": ("convolution_backward",),
    "ConvolutionBackwardFilter": ("convolution_backward",),
    "MatrixMul": ("mm", "addmm", "matmul"),
    "BatchedMatrixMul": ("bmm", "baddbmm"),
    "PoolingForward": ("max_pool2d_with_indices", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"),
    "PoolingBackward": ("max_pool2d_with_indices_backward", "avg_pool2d_backward",
                        "_adaptive_avg_pool2d_backward"),
    "BNForward": ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training"),
    "BNBackward": ("native_batch_norm_backward",),
    "Concat": ("cat",),
    "Dimshuffle": ("permute", "transpose", "t"),
    "Copy": ("copy_", "_to_copy", "clone"),
}


def expand_type(name: str) -> tuple[str, ...]:
    """The op type spellings ``--type name`` selects: itself, or the aten types of a MegEngine class."""
    key = normalize_type(name)
    return MEGENGINE_TYPES.get(key, (key,))


@dataclass(frozen=True)
class TableOptions:
    """What to select, how to group and order, and how to print a profile table.

    Times are seconds. ``top=0`` shows every row. ``order_by`` is a column key
    or alias, ``+`` in front means ascending. ``aggregate_by`` without
    ``aggregate`` sums; ``aggregate`` without ``aggregate_by`` folds every
    selected node into one row "all" (as MegEngine's profile_analyze does).
    """

    top: int = 10
    types: tuple[str, ...] = ()
    name: str | None = None
    module: str | None = None
    input_dtype: str | None = None
    phases: tuple[str, ...] = ()
    aggregate: str | None = None
    aggregate_by: str | None = None
    order_by: str = "time"
    min_time_s: float | None = None
    max_time_s: float | None = None
    stat: str = "median"
    print_only: str | None = None
    format: str = "simple"
    module_depth: int | None = None
    clock: str = "auto"
    #: Console layout: ``width`` in characters (None: the terminal's, COLUMNS, else 120),
    #: ``wide`` prints every default column unclipped, ``columns`` names the columns
    #: (keys or aliases, "all" for every one); json/csv print ``columns`` too.
    width: int | None = None
    wide: bool = False
    columns: tuple[str, ...] = ()
    _compiled: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def aggregated(self) -> bool:
        return self.aggregate is not None or self.aggregate_by is not None

    @property
    def aggregate_fn(self) -> str:
        return self.aggregate or "sum"

    @property
    def filtered(self) -> bool:
        return bool(self.types or self.name or self.module or self.input_dtype or self.phases
                    or self.min_time_s is not None or self.max_time_s is not None)

    def regex(self, which: str) -> re.Pattern[str] | None:
        """The compiled ``name`` or ``module`` pattern (compiled once, by ``validate``)."""
        return self._compiled.get(which)

    def validate(self) -> "TableOptions":
        """Check every value; return self so calls chain. Raises TableOptionError."""
        _choice("--aggregate", self.aggregate, AGGREGATES)
        _choice("--aggregate-by", self.aggregate_by, AGGREGATE_BY)
        _choice("--stat", self.stat, STATS)
        _choice("--print-only", self.print_only, PRINT_ONLY)
        _choice("--clock", self.clock, CLOCKS)
        for phase in self.phases:
            _choice("--phase", phase, PHASES)
        if isinstance(self.top, bool) or not isinstance(self.top, int) or self.top < 0:
            raise TableOptionError(f"--top must be a whole number >= 0 (0 shows all rows), not {self.top!r}")
        if self.module_depth is not None:
            if isinstance(self.module_depth, bool) or not isinstance(self.module_depth, int) or self.module_depth < 1:
                raise TableOptionError(f"--module-depth must be a whole number >= 1, not {self.module_depth!r}")
            if self.aggregate_by != "module":
                raise TableOptionError("--module-depth only applies with --aggregate-by module")
        for flag, value in (("--min-time", self.min_time_s), ("--max-time", self.max_time_s)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value != value):
                raise TableOptionError(f"{flag} must be a number of seconds, not {value!r}")
        if self.min_time_s is not None and self.max_time_s is not None and self.min_time_s > self.max_time_s:
            raise TableOptionError(
                f"--min-time ({self.min_time_s:g} s) is larger than --max-time ({self.max_time_s:g} s), so nothing can match")
        for flag, text in (("--type", self.types), ("--name", self.name), ("--module", self.module)):
            if text is not None and not isinstance(text, (str, tuple)):
                raise TableOptionError(f"{flag} must be text, not {text!r}")
        for which, flag in (("name", "--name"), ("module", "--module")):
            pattern = getattr(self, which)
            if pattern is not None:
                try:
                    self._compiled[which] = re.compile(pattern)
                except re.error as exc:
                    raise TableOptionError(f"{flag} {pattern!r} is not a valid regular expression ({exc})") from None
        parse_order_by(self.order_by)
        if self.width is not None and (isinstance(self.width, bool) or not isinstance(self.width, int)
                                       or self.width < MIN_WIDTH):
            raise TableOptionError(f"--width must be a whole number >= {MIN_WIDTH}, not {self.width!r}")
        resolve_columns(self.columns)
        if not isinstance(self.format, str) or not self.format:
            raise TableOptionError(f"--format must be a format name, not {self.format!r}")
        return self  # the format name itself is checked by the renderer, which knows the formats


def _choice(flag: str, value: str | None, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value is not None and value not in choices:
        raise TableOptionError(f"{flag} {value!r} is not one of {', '.join(choices)}")


def _as_tuple(value: str | Iterable[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def _column_list(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"time,name, flops"`` or a list of names -> a tuple of stripped names."""
    parts = value.split(",") if isinstance(value, str) else (value or ())
    return tuple(p.strip() for p in parts if p.strip())


def _same(value: Any) -> Any:
    return value


#: make_options' keywords that are spelled or typed differently from their TableOptions field:
#: keyword -> (field, conversion). Every other field is its own keyword, taken as it is.
_KEYWORD_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "type": ("types", _as_tuple), "phase": ("phases", _as_tuple),
    "min_time": ("min_time_s", _same), "max_time": ("max_time_s", _same),
    "wide": ("wide", bool), "columns": ("columns", _column_list),
}
_FIELD_KEYWORDS = {name: key for key, (name, _) in _KEYWORD_FIELDS.items()}
#: Every keyword make_options takes, in TableOptions' field order (Profile.table's and the CLI's names).
TABLE_KEYWORDS: tuple[str, ...] = tuple(
    _FIELD_KEYWORDS.get(f.name, f.name) for f in fields(TableOptions) if f.init)


def make_options(top: int = TableOptions.top, **keywords: Any) -> TableOptions:
    """TableOptions from the keyword names the CLI uses (``type``, ``phase``, ``min_time`` ...), validated.

    ``type``, ``phase`` and ``columns`` take one value or several (``columns`` also
    ``"a,b"``); ``min_time``/``max_time`` are seconds; a keyword left out keeps
    TableOptions' default.
    """
    values: dict[str, Any] = {"top": top}
    for key, value in keywords.items():
        if key not in TABLE_KEYWORDS:
            raise TypeError(f"make_options() got an unexpected keyword argument {key!r}")
        name, convert = _KEYWORD_FIELDS.get(key, (key, _same))
        values[name] = convert(value)
    return TableOptions(**values).validate()


def with_changes(options: TableOptions, **changes: Any) -> TableOptions:
    """A validated copy of ``options`` with some fields changed."""
    return replace(options, **changes).validate()
