"""``@graphprof.trace``: the traced function, and the policy that decides how each of its calls runs.

traced_function.py holds the decorator and the call path; captured_paths.py
the graphs kept per input signature and the choice among them; fallbacks.py
when capturing stops and what a call that cannot replay does instead;
profiles.py the profiles handed back; optimizer_graph.py a segmented step's
optimizer update. ``trace`` and ``TracedFunction`` are this package's public
names.
"""

from graphprof.tracing.traced_function import TracedFunction, trace

__all__ = ["TracedFunction", "trace"]
