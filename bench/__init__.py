"""Benchmarks (not tests; never collected by pytest)."""
