"""Benchmarks: print figures, never assert timings."""
