"""What every figure builder shares: the colour cycle and the check of a {name: value} argument."""

from __future__ import annotations

from collections.abc import Mapping

from plotly.colors import qualitative


def palette_color(index: int) -> str:
    """The index-th colour of plotly's qualitative palette (cycling)."""
    palette = qualitative.Plotly
    return palette[index % len(palette)]


def check_mapping(name: str, value) -> None:
    """`value` must be a non-empty mapping (e.g. model name -> result); ValueError naming `name` otherwise."""
    if not isinstance(value, Mapping) or not value:
        raise ValueError(f"{name} must be a non-empty mapping of name -> value; got {value!r}")
