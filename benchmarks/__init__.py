"""Reproducible measurements of graphprof (not part of the test suite)."""
