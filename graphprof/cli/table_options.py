"""The table options every command that prints a node table shares (``analyze``, ``diff``).

One definition of the flags and one reading of them back into ``TableOptions``,
so that ``analyze`` and ``diff`` spell and validate them the same way. They
mirror MegEngine's profile_analyze where it has the option.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphprof.analysis.options import TableOptions


#: MegEngine's --print-only device|host: the table alone, on that clock ("auto" is the device
#: clock when one was recorded, and the host clock on a CPU).
_MEGENGINE_PRINT_ONLY = {"device": "auto", "host": "host"}


def add_table_options(parser: argparse.ArgumentParser, top: int = 10) -> None:
    """Add the table options of ``graphprof analyze`` to ``parser`` (for every command that prints a table).

    Read them back with ``table_options_from_args``. They mirror MegEngine's
    profile_analyze where it has the option, and ``Profile.table``'s keywords.
    """
    from graphprof.analysis.options import AGGREGATE_BY, AGGREGATES, CLOCKS, PHASES, PRINT_ONLY, STATS, TableOptions

    default = TableOptions()
    g = parser.add_argument_group("table options")
    g.add_argument("-t", "--top", type=int, default=top, metavar="N", help=f"rows to show, 0 = all (default {top})")
    g.add_argument("--type", action="append", metavar="T",
                   help="keep ops of this type; addmm, aten.addmm and aten.addmm.default all match (repeatable)")
    g.add_argument("--name", "--opr-name", metavar="REGEX",
                   help="keep nodes whose name matches (re.search; --opr-name is MegEngine's spelling)")
    g.add_argument("--module", metavar="REGEX", help="keep nodes whose module path matches (re.search)")
    g.add_argument("--input-dtype", metavar="D", help="keep nodes with an input of this dtype (float32, torch.float16, ...)")
    g.add_argument("--phase", action="append", choices=PHASES, help="keep nodes of this phase (repeatable)")
    g.add_argument("--aggregate", choices=AGGREGATES,
                   help="fold nodes with this function; without --aggregate-by into one row 'all'")
    g.add_argument("--aggregate-by", choices=AGGREGATE_BY, help="one row per group (sums without --aggregate)")
    g.add_argument("--module-depth", type=int, metavar="N", help="with --aggregate-by module: group by the first N path parts")
    g.add_argument("--order-by", default=default.order_by, metavar="[+]COL",
                   help="order by any column (time, flops, flop_per_s, bytes_moved, bandwidth, intensity, "
                        f"live_bytes, calls, id, type, in_shapes, ...); + = ascending (default {default.order_by})")
    g.add_argument("--min-time", type=float, metavar="S", help="drop single nodes faster than S seconds")
    g.add_argument("--max-time", type=float, metavar="S", help="drop single nodes slower than S seconds")
    g.add_argument("--stat", default=default.stat, choices=STATS,
                   help=f"statistic over profiled steps (default {default.stat})")
    g.add_argument("--clock", default=default.clock, choices=CLOCKS, help="host or device time (auto: device when recorded)")
    g.add_argument("--show-host", dest="clock", action="store_const", const="host",
                   help="MegEngine's spelling of --clock host")
    g.add_argument("--print-only", choices=(*PRINT_ONLY, *_MEGENGINE_PRINT_ONLY),
                   help="print only the summary or only the table (MegEngine's device and host: the table "
                        "on that clock)")
    g.add_argument("--format", default=default.format, metavar="FMT",
                   help="a tabulate format (simple, github, grid, fancy_grid, ...), or csv or json with raw SI numbers")
    g.add_argument("--wiki", "--confluence", dest="format", action="store_const", const="orgtbl",
                   help="MegEngine's wiki table: --format orgtbl")
    g.add_argument("--columns", metavar="COL,...",
                   help="print these columns in this order (keys or aliases as --order-by takes; 'all' for every "
                        "one); also the fields of --format json/csv")
    g.add_argument("--wide", action="store_true",
                   help="every default column, names unclipped, whatever the width")
    g.add_argument("--width", type=int, metavar="N",
                   help="fit the table to N characters (default: COLUMNS, else the terminal, else 120)")


def table_options_from_args(args: argparse.Namespace) -> "TableOptions":
    """The validated TableOptions of parsed ``add_table_options`` flags (ValueError: one sentence)."""
    from graphprof.analysis.options import TABLE_KEYWORDS, make_options

    keywords = {key: getattr(args, key) for key in TABLE_KEYWORDS}  # each flag's dest is its keyword
    if keywords["print_only"] in _MEGENGINE_PRINT_ONLY:  # MegEngine's device or host table
        keywords["print_only"], keywords["clock"] = "table", _MEGENGINE_PRINT_ONLY[keywords["print_only"]]
    return make_options(**keywords)
