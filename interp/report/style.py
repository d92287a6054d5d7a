"""What every figure builder shares: the colour cycle, the check of a {name: value} argument and
readable log-axis ticks."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from plotly.colors import qualitative


def palette_color(index: int, count: int = 0) -> str:
    """The index-th colour of plotly's qualitative palette (10 colours, cycling), or of its 24-colour
    palette (Dark24) when `count`, the number of colours the figure needs, is past 10."""
    palette = qualitative.Plotly if count <= len(qualitative.Plotly) else qualitative.Dark24
    return palette[index % len(palette)]


def check_mapping(name: str, value) -> None:
    """`value` must be a non-empty mapping (e.g. model name -> result); ValueError naming `name` otherwise."""
    if not isinstance(value, Mapping) or not value:
        raise ValueError(f"{name} must be a non-empty mapping of name -> value; got {value!r}")


def log_ticks(values) -> dict:
    """Ticks for a log axis over the finite positive `values`: 1, 2, 5 x 10^k within a factor 1.5 of
    their range (powers of ten only past three decades, every few past eight), written as plain numbers (plotly.js labels the minor ticks of a short log axis with one
    digit, "2" for 20 or 200, which reads as a broken axis), plus the smallest and largest value where
    fewer than 3 such ticks fall there; {} (plotly's own) when there is no such value."""
    placed = np.asarray(values, dtype=float)
    placed = placed[np.isfinite(placed) & (placed > 0)]
    if not placed.size:
        return {}
    low, high = float(placed.min()), float(placed.max())
    first, last = math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 2
    decades = math.log10(high / low)
    every = max(1, math.ceil(decades / 8))            # at most about 8 labelled decades
    multipliers = (1, 2, 5) if decades <= 3 else (1,)  # 1-2-5 only on short axes
    ticks = [m * 10.0 ** k for k in range(first, last, every) for m in multipliers
             if low / 1.5 <= m * 10.0 ** k <= high * 1.5]
    if len(ticks) < 3:
        ticks = sorted(set(ticks) | {float(f"{low:.3g}"), float(f"{high:.3g}")})
    return {"tickmode": "array", "tickvals": ticks, "ticktext": [f"{t:.6g}" for t in ticks]}

