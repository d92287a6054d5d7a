"""The axis ranges a browser draws for a plotly figure, computed from the figure itself (no kaleido),
and the checks that every trace's data is visible and not squeezed by what else sets the range.

plotly.js rules used here (plotly.js 4.1, what plotly 7.1 embeds; checked in Chromium by
tests/browser.py): an axis with `range` set (and autorange not true) draws that range, in log10
units on a log axis. Otherwise it autoranges over the traces on it (log10 of the values on a log
axis; a bar from its base, default 0, to base + value), the shapes whose xref / yref is that axis (data values, like traces),
the annotations on it (their x / y taken *as given*, i.e. in log10 units on a log axis: the label
of `add_vline(x=60, annotation_text=...)` on a log axis sits at 10^60 and stretches the axis to
1e63), 0 when rangemode is 'tozero', plus a small padding. Categorical axes are not checked (their
range is the list of categories).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go

AXIS = re.compile(r"^([xy])axis(\d*)$")
PAD = 0.05


@dataclass
class Axis:
    name: str                      # layout key: xaxis, yaxis2, ...
    ref: str                       # trace / shape reference: x, y2, ...
    log: bool
    explicit: list | None          # layout range when autorange is off
    rangemode: str | None
    data: list = field(default_factory=list)          # axis units (log10 on log axes)
    decorations: list = field(default_factory=list)   # shape / annotation coordinates (as given)
    invisible: list = field(default_factory=list)     # data a log axis cannot draw (<= 0)
    categorical: bool = False

    def drawn(self) -> tuple[float, float]:
        """The range the browser draws, in axis units."""
        if self.explicit is not None:
            lo, hi = sorted(float(v) for v in self.explicit)
            return lo, hi
        values = list(self.data) + list(self.decorations)
        if self.rangemode == "tozero" and not self.log:
            values.append(0.0)
        lo, hi = min(values), max(values)
        span = hi - lo if hi > lo else (1.0 if not self.log else 0.5)
        return lo - PAD * span, hi + PAD * span


def _ref(name: str) -> str:
    letter, number = AXIS.match(name).groups()
    return letter + number


def _numbers(values) -> np.ndarray | None:
    """Finite float values of a data array, or None when it is categorical (strings)."""
    if values is None:
        return np.array([])
    flat = np.asarray(values, dtype=object).ravel()
    out = []
    for v in flat:
        if v is None:
            continue
        if isinstance(v, str):
            return None
        out.append(float(v))
    out = np.array(out, dtype=float)
    return out[np.isfinite(out)]


def axes_of(fig: go.Figure) -> dict[str, Axis]:
    """Every x / y axis of the figure with the data, decorations and settings that fix its range
    (axis order: as the layout and traces name them)."""
    layout = fig.to_dict()["layout"]
    axes: dict[str, Axis] = {}

    def axis(ref: str) -> Axis:
        name = f"{ref[0]}axis{ref[1:]}"
        if name not in axes:
            spec = layout.get(name, {})
            explicit = spec.get("range") if spec.get("autorange") not in (True, "reversed") else None
            axes[name] = Axis(name, ref, spec.get("type") == "log", explicit, spec.get("rangemode"))
            if spec.get("type") == "category":
                axes[name].categorical = True
        return axes[name]

    for name in layout:
        if AXIS.match(name):
            axis(_ref(name))
    for trace in fig.data:
        if trace.type in ("table", "pie", "sankey"):
            continue
        kind = trace.type
        for letter in "xy":
            ax = axis(getattr(trace, f"{letter}axis", None) or letter)
            values = getattr(trace, letter, None)
            numbers = _numbers(values)
            if numbers is None:
                ax.categorical = True
                continue
            if kind == "heatmap" and values is None:
                continue                                  # cells indexed 0..n-1: always in range
            if kind == "bar" and letter == "x" and getattr(trace, "width", None) is not None and numbers.size:
                width = np.broadcast_to(np.asarray(trace.width, dtype=float), numbers.shape)
                numbers = np.concatenate([numbers - width / 2, numbers + width / 2])
            if kind == "bar" and letter == ("y" if (trace.orientation or "v") == "v" else "x"):
                base = _numbers(trace.base) if trace.base is not None else None
                base = np.zeros(1) if base is None else np.broadcast_to(base, numbers.shape)
                numbers = np.concatenate([base, base + numbers])   # a bar spans base .. base + value
            if ax.log:
                ax.invisible.extend(numbers[numbers <= 0].tolist())
                numbers = np.log10(numbers[numbers > 0])
            ax.data.extend(numbers.tolist())
    for kind in ("shapes", "annotations"):
        for item in layout.get(kind, []):
            for letter in "xy":
                ref = item.get(f"{letter}ref", letter)
                if not re.fullmatch(r"[xy]\d*", ref or ""):
                    continue                              # paper / domain coordinates do not range
                keys = (f"{letter}0", f"{letter}1") if kind == "shapes" else (letter,)
                ax = axis(ref)
                for key in keys:
                    value = item.get(key)
                    if value is None or isinstance(value, str):
                        continue
                    if kind == "shapes" and ax.log:       # shapes: data values; annotations: as given
                        if value <= 0:
                            ax.invisible.append(float(value))
                            continue
                        value = np.log10(value)
                    ax.decorations.append(float(value))
    return axes


def range_problems(fig: go.Figure, label: str) -> list[str]:
    """What a reader would see wrong: data outside the drawn range, data a log axis cannot draw, a
    log axis reaching more than a decade past its data, a linear axis more than 10x wider than
    its data's extent, a line's label drawn elsewhere on a log axis, colour values outside a fixed
    colour range."""
    problems = []
    for ax in axes_of(fig).values():
        if ax.categorical or not ax.data:
            continue
        lo, hi = ax.drawn()
        data = np.array(ax.data)
        d_lo, d_hi = float(data.min()), float(data.max())
        slack = 1e-9 * max(1.0, abs(lo), abs(hi))
        units = "log10 " if ax.log else ""
        if d_lo < lo - slack or d_hi > hi + slack:
            problems.append(f"{label}: {ax.name} draws {units}[{lo:.4g}, {hi:.4g}] but its data span "
                            f"{units}[{d_lo:.4g}, {d_hi:.4g}]")
        if ax.invisible:
            problems.append(f"{label}: {ax.name} is a log axis with non-positive data {ax.invisible[:5]}")
        if ax.log and (lo < d_lo - 1 or hi > d_hi + 1):
            problems.append(f"{label}: log axis {ax.name} draws 10^{lo:.3g}..10^{hi:.3g} for data "
                            f"10^{d_lo:.3g}..10^{d_hi:.3g} (more than a decade past the data)")
        extent = max(d_hi - d_lo, abs(d_lo), abs(d_hi))
        if not ax.log and extent > 0 and hi - lo > 10 * extent:     # all-zero data: any range is fine
            problems.append(f"{label}: linear axis {ax.name} draws [{lo:.4g}, {hi:.4g}] for data in "
                            f"[{d_lo:.4g}, {d_hi:.4g}]")
    layout = fig.to_dict()["layout"]
    for letter in "xy":                        # add_hline / add_vline labels on a log axis
        for shape in layout.get("shapes", []):
            ref = shape.get(f"{letter}ref", letter)
            ax = axes_of(fig).get(f"{letter}axis{ref[1:]}") if re.fullmatch(r"[xy]\d*", ref or "") else None
            if ax is None or not ax.log or shape.get(f"{letter}0") != shape.get(f"{letter}1"):
                continue
            value = shape.get(f"{letter}0")
            for note in layout.get("annotations", []):
                if note.get(f"{letter}ref", letter) == ref and note.get(letter) == value and value != 0:
                    problems.append(f"{label}: the label {note.get('text')!r} of the line at {letter} = {value} on "
                                    f"log axis {ax.name} is drawn at 10^{value} (annotations take log10 there)")
    for index, trace in enumerate(fig.data):
        bounds = None
        if trace.type == "heatmap" and trace.zmin is not None and trace.zmax is not None and trace.zauto is not True:
            bounds, values = (trace.zmin, trace.zmax), trace.z
        elif getattr(trace, "marker", None) is not None and getattr(trace.marker, "cmin", None) is not None:
            bounds, values = (trace.marker.cmin, trace.marker.cmax), trace.marker.color
        if bounds is None:
            continue
        numbers = _numbers(values)
        if numbers is not None and numbers.size and (numbers.min() < bounds[0] or numbers.max() > bounds[1]):
            problems.append(f"{label}: trace {index} ({trace.name}) colours values in [{numbers.min():.4g}, "
                            f"{numbers.max():.4g}] on a scale clipped to [{bounds[0]:.4g}, {bounds[1]:.4g}]")
    return problems
