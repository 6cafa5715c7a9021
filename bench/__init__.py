"""Benchmark and test harness: run from the repository root by scripts/ and tests; not installed."""
