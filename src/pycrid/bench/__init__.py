"""Benchmarks of a CRI runtime, each figure beside a floor measured in the same run.

``pycrid bench`` (``command.py``) runs them against any CRI socket on the node; the
repository's ``python -m bench`` runs the same sections against a pycrid it starts on the
test registry, and adds what needs that registry (the pull section)."""
