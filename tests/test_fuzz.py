"""Seeded fuzz: mutated profiles through every command give exit 0/1/2, one-line errors, clean terminals.

The long run is ``python -m benchmarks.fuzz_cli --cases 4000``; this one is
bounded to about half a minute so it runs with the suite.
"""

from __future__ import annotations

from benchmarks.fuzz_cli import fuzz


def test_mutated_profiles_never_crash_or_inject() -> None:
    tally = fuzz(cases=120, seed=2026, deadline_s=30.0)
    assert tally.cases >= 20
    assert not tally.failures, {k: tally.examples[k] for k in tally.failures}
    assert tally.exits[0] > 0 and tally.exits[2] > 0  # the mutations reach both valid and invalid files
