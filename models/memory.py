"""Memory budgets and progress bars shared by every long or large computation.

A budget is how many bytes one call may hold beyond the model's weights:

    max_memory=None       DEFAULT_FRACTION of the memory available now (MemAvailable on Linux)
    max_memory=8e9        8 GB (an int or float number of bytes)
    max_memory="512MiB"   a string with a unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB,
                          GiB, TiB (powers of 1024)

Planners estimate the bytes of their work up front (`estimate` below), choose how many rows a
pass takes so that it fits (`rows_that_fit`), and refuse before any work with `MemoryRefused`:
one line naming what was asked for, the estimate and the budget.

`progress_bar` is tqdm on stderr, off with `enabled=False` or the environment variable
INTERP_PROGRESS=0 (the test suite sets it).
"""

from __future__ import annotations

import os
import re
import sys

DEFAULT_FRACTION = 0.5  # of the memory available when the call starts
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class MemoryRefused(MemoryError):
    """Raised before any work when even the smallest piece of it would not fit the budget."""


def available_bytes() -> int:
    """Bytes of memory available now: /proc/meminfo's MemAvailable, else the physical memory."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def budget_bytes(max_memory: int | float | str | None = None, argument: str = "max_memory") -> int:
    """The budget in bytes that `max_memory` names (module docstring); ValueError naming
    `argument` for anything else."""
    if max_memory is None:
        return int(DEFAULT_FRACTION * available_bytes())
    if isinstance(max_memory, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", max_memory)
        unit = match and (match.group(2).lower() or "b")
        if not match or unit not in _UNITS:
            raise ValueError(f"{argument} must be a number of bytes or a size such as '8GB' or '512MiB' "
                             f"(units {', '.join(k.upper() if len(k) < 3 else k[0].upper() + 'i' + k[2].upper() for k in _UNITS)}); "
                             f"got {max_memory!r}")
        value = float(match.group(1)) * _UNITS[unit]
    elif isinstance(max_memory, (int, float)) and not isinstance(max_memory, bool):
        value = float(max_memory)
    else:
        raise ValueError(f"{argument} must be None (a share of the available memory), a number of bytes or a "
                         f"size such as '8GB'; got {type(max_memory).__name__} {max_memory!r}")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{argument} must be a positive, finite size; got {max_memory!r}")
    return int(value)


def format_bytes(n: float) -> str:
    """'403 MB', '1.57 GB': three significant digits in powers of 1000."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def refuse(what: str, estimate: float, budget: int, hint: str = "") -> MemoryRefused:
    """The one-line refusal (to raise): what needs about estimate bytes, over the budget."""
    line = f"{what} needs about {format_bytes(estimate)}, over the memory budget of {format_bytes(budget)}"
    return MemoryRefused(line + (f"; {hint}" if hint else ""))


def rows_that_fit(per_row: float, budget: int, wanted: int, what: str, fixed: float = 0.0, hint: str = "") -> int:
    """How many rows (1 ... wanted) of per_row bytes fit in budget beside `fixed` bytes; refuses
    (MemoryRefused naming `what`) when not even one does."""
    if fixed + per_row > budget:
        raise refuse(f"{what} (one row {format_bytes(per_row)}"
                     + (f" beside {format_bytes(fixed)} held)" if fixed else ")"), fixed + per_row, budget, hint)
    return max(1, min(wanted, int((budget - fixed) // max(per_row, 1))))


def progress_enabled(enabled: bool = True) -> bool:
    """Whether a bar shows: enabled, and INTERP_PROGRESS is not '0'."""
    return bool(enabled) and os.environ.get("INTERP_PROGRESS", "1") != "0"


def progress_bar(total: int | None, enabled: bool = True, desc: str = "", unit: str = "it", **options):
    """A tqdm bar on stderr with counts and ETA (disabled per progress_enabled)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not progress_enabled(enabled), desc=desc, unit=unit, file=sys.stderr,
                dynamic_ncols=True, leave=False, **options)
