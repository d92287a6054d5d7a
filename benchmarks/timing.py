"""Shared timing helper for the benchmark scripts (run them from the repository root)."""

from __future__ import annotations

import statistics
import time


def timed(fn, repeats: int) -> float:
    """Median wall time of fn() over `repeats` runs, after one warm-up run."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
