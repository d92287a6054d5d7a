"""Shared timing helpers for the benchmark scripts (run them from the repository root).

On a shared machine a contender timed alone meets whatever load happens to run then; timed in
rounds with its rivals (`interleaved`: every contender once per round, the order reversed every
other round so none always runs first, right after the same neighbour, or on caches its
neighbour warmed) the load hits all alike. Report the minimum (closest to the machine's unloaded
speed) beside the median (what the load left), and the load average the rounds ran under. Each
round also records the calling thread's CPU time (time.thread_time: the time it ran, page faults
included, not the time other processes held its core), which stays meaningful for one-thread
contenders when the load exceeds the cores; it is not the wall time a user waits.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable


def timed(fn, repeats: int) -> float:
    """Median wall time of fn() over `repeats` runs, after one warm-up run (for a contender
    without rivals; rivals go through `interleaved`)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass
class Timing:
    """The wall times and the calling thread's CPU times (seconds) of one contender, one per round."""

    times: list[float] = field(default_factory=list)
    cpu_times: list[float] = field(default_factory=list)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def cpu_min(self) -> float:
        return min(self.cpu_times)


@dataclass
class Rounds:
    """interleaved's result: a Timing per contender and the 1-minute load average before and after."""

    timings: dict[str, Timing]
    load_before: float
    load_after: float

    def __getitem__(self, name: str) -> Timing:
        return self.timings[name]

    @property
    def load(self) -> str:
        return f"{self.load_before:.1f}-{self.load_after:.1f}"


def load_average() -> float:
    """The machine's 1-minute load average (runnable processes; 2 cores here)."""
    return os.getloadavg()[0]


def interleaved(contenders: dict[str, Callable[[], object]], rounds: int = 5, warmup: int = 1) -> Rounds:
    """Time every contender once per round for `rounds` rounds after `warmup` untimed rounds, the
    order reversed every other round. contenders: {name: fn} (fn() runs one repetition)."""
    if not contenders:
        raise ValueError("interleaved: contenders must name at least one function; got none")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"interleaved: rounds must be a positive int; got {rounds!r}")
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    timings = {name: Timing() for name in names}
    before = load_average()
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            start, cpu = time.perf_counter(), time.thread_time()
            contenders[name]()
            timings[name].times.append(time.perf_counter() - start)
            timings[name].cpu_times.append(time.thread_time() - cpu)
    return Rounds(timings, before, load_average())
