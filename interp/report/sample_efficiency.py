"""Figures of the sample-efficiency study (docs/sample-efficiency.md); each returns a go.Figure.

    n_star_vs_length(n_star_rows)     N* against training length per model x format (log y); the
                                      joint N* as a dashed line of its colour; conditions that never
                                      converged as open markers at the search's bound
    kappa_bars(kappa_rows)            kappa per model, one bar per format from 1 to kappa (log y: up is
                                      sharing, down interference); hatched: a lower bound (kappa_low)
                                      where N*_joint was found but some N*_n was not
    kappa_vs_ood(kappa_rows)          kappa (or its lower bound, labelled) against the joint model's
                                      OOD accuracy at each OOD length
    write_sample_efficiency_report(path, n_star_rows, kappa_rows, trials) -> Path

Rows are the tidy rows of `interp.analysis.sample_efficiency` (NStar.row(), kappa_rows()).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from interp.report.html import Table, Text, write_report
from interp.report.style import log_ticks, palette_color

Rows = Sequence[Mapping[str, Any]]


def _check_rows(name: str, rows: Rows, needed: Sequence[str]) -> None:
    if isinstance(rows, (str, bytes, Mapping)) or not rows:
        raise ValueError(f"{name} must be a non-empty list of row dicts; got {rows!r}")
    for index, row in enumerate(rows):
        missing = [k for k in needed if k not in row]
        if missing:
            raise ValueError(f"{name}[{index}] lacks {missing}")


def _series(rows: Rows) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((f"{row['model']} ({row['task']})", row["format"]), []).append(row)
    return groups


def n_star_vs_length(rows: Rows, title: str = "N* against training length") -> go.Figure:
    """One line per model x format (log y); joint N* dashed; open markers: no convergence <= bound."""
    _check_rows("rows", rows, ("model", "task", "format", "length", "n_star", "n_max"))
    fig = go.Figure()
    dashes = {"outcome": "solid", "acot": "dot", "cot": "dashdot"}
    groups = sorted(_series(rows).items())
    for index, ((model, fmt), series) in enumerate(groups):
        shift = 0.06 * (index - (len(groups) - 1) / 2)   # open markers of different series side by side
        color, name = palette_color(index), f"{model} {fmt}"
        per_length = sorted((r for r in series if r["length"] != "joint"), key=lambda r: r["length"])
        found = [r for r in per_length if r["n_star"] is not None]
        fig.add_trace(go.Scatter(x=[r["length"] for r in found], y=[r["n_star"] for r in found], name=name,
                                 mode="lines+markers", line=dict(color=color, dash=dashes.get(fmt, "solid")),
                                 legendgroup=name,
                                 hovertemplate="length %{x}<br>N* %{y}<extra>" + name + "</extra>"))
        missing = [r for r in per_length if r["n_star"] is None]
        if missing:
            fig.add_trace(go.Scatter(x=[r["length"] + shift for r in missing], y=[r["n_max"] for r in missing],
                                     mode="markers", marker=dict(color=color, symbol="circle-open", size=11),
                                     name=f"{name}: not converged", legendgroup=name, showlegend=not found,
                                     hovertemplate="length %{x}<br>no convergence up to N = %{y}<extra>"
                                                   + name + "</extra>"))
        for joint in (r for r in series if r["length"] == "joint" and r["n_star"] is not None):
            lengths = [r["length"] for r in per_length] or [0]
            fig.add_trace(go.Scatter(x=[min(lengths), max(lengths)], y=[joint["n_star"]] * 2, mode="lines",
                                     line=dict(color=color, dash="dash", width=1), legendgroup=name,
                                     name=f"{name}: joint", showlegend=False,
                                     hovertemplate="joint N* %{y}<extra>" + name + "</extra>"))
    fig.update_xaxes(title="training length n", dtick=1)
    values = [r["n_star"] if r["n_star"] is not None else r["n_max"] for r in rows]
    fig.update_yaxes(type="log", title="N* (training sequences)", **log_ticks([v for v in values if v is not None]))
    fig.update_layout(title=title + " (dashed: N*_joint over all lengths; open: none converged)",
                      template="plotly_white", legend_title="model, format")
    return fig


def kappa_bars(rows: Rows, title: str = "Sharing coefficient kappa = sum_n N*_n / N*_joint") -> go.Figure:
    """Bars from 1 to kappa per model (x), one per format; NaN (some N* missing) left out."""
    _check_rows("rows", rows, ("model", "task", "format", "kappa"))
    fig = go.Figure()
    formats = sorted({r["format"] for r in rows})
    for index, fmt in enumerate(formats):
        chosen = [r for r in rows if r["format"] == fmt and not math.isnan(r["kappa"])]
        kappas = [r["kappa"] for r in chosen]
        fig.add_trace(go.Bar(x=[f"{r['model']} ({r['task']})" for r in chosen], y=[k - 1 for k in kappas], base=1,
                             customdata=kappas, name=fmt, marker_color=palette_color(index),
                             hovertemplate="%{x}<br>kappa %{customdata:.2f}<extra>" + fmt + "</extra>"))
        bounded = [r for r in rows if r["format"] == fmt and math.isnan(r["kappa"])
                   and math.isfinite(r.get("kappa_low", math.nan)) and r["kappa_low"] > 0]
        if bounded:   # N*_joint found, some N*_n not: kappa is at least kappa_low
            lows = [r["kappa_low"] for r in bounded]
            fig.add_trace(go.Bar(x=[f"{r['model']} ({r['task']})" for r in bounded], y=[k - 1 for k in lows], base=1,
                                 customdata=lows, name=f"{fmt}: lower bound", marker_color=palette_color(index),
                                 marker_pattern_shape="/", opacity=0.6,
                                 hovertemplate="%{x}<br>kappa >= %{customdata:.2f}<extra>" + fmt + "</extra>"))
    # on a log axis a shape takes the data value but an annotation its log10 (y = 1 would sit at 10)
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.add_annotation(y=0.0, yref="y", x=0.0, xref="x domain", text="kappa = 1 (no sharing)", showarrow=False,
                       xanchor="left", yanchor="bottom")
    fig.update_yaxes(type="log", title="kappa")
    fig.update_xaxes(title="model (task)")
    fig.update_layout(title=title, barmode="group", template="plotly_white", legend_title="format", showlegend=True)
    return fig


def kappa_vs_ood(rows: Rows, title: str = "kappa against the joint model's accuracy beyond L") -> go.Figure:
    """Scatter: x = kappa (log), y = final-state accuracy of the joint model at each ood length.

    Each condition is labelled once, at its first OOD length (its markers at the other lengths share
    its x, and their labels overlapped where the accuracies were close). Each label sits on the side
    of its point that faces the middle of the plot (right of points in the left half, left of those in
    the right half; below points near accuracy 1), and the x range is padded by a fifth of a decade, so
    no label runs past the plot's edge.
    """
    _check_rows("rows", rows, ("model", "task", "format", "kappa", "max_length"))
    fig = go.Figure()
    symbols = ["circle", "diamond", "square", "triangle-up"]
    factors = sorted({int(k.split("_")[-1]) // int(r["max_length"]) for r in rows for k in r
                      if k.startswith("ood_acc_")})
    traces = []
    for factor in factors:
        points = [(r, r.get(f"ood_acc_{factor * int(r['max_length'])}"), _kappa_or_bound(r)) for r in rows]
        traces.append((factor, [(r, a, k) for r, a, k in points if a is not None and not math.isnan(a) and k[0] is not None]))
    logs = [math.log10(k) for _, points in traces for _, _, (k, _) in points if k > 0] + [0.0]   # 0: the kappa = 1 line
    lo, hi = min(logs) - 0.2, max(logs) + 0.2
    middle = (lo + hi) / 2

    def side(kappa: float, accuracy: float) -> str:
        return ("bottom" if accuracy > 0.85 else "top") + (" right" if kappa <= 0 or math.log10(kappa) < middle else " left")

    for index, (factor, points) in enumerate(traces):
        fig.add_trace(go.Scatter(
            # each condition is labelled once, at its first OOD length (its other markers share its x)
            x=[k for _, _, (k, _) in points], y=[a for _, a, _ in points], mode="markers" if index else "markers+text",
            text=[f"{r['model']} {r['format']}{' (kappa >=)' if low else ''}" for r, _, (_, low) in points],
            textposition=[side(k, a) for _, a, (k, _) in points], cliponaxis=False,
            marker=dict(size=11, symbol=symbols[index % len(symbols)], color=palette_color(index)),
            name=f"at {factor}L", hovertemplate="kappa %{x:.2f}<br>accuracy %{y:.3f}<br>%{text}<extra></extra>"))
    fig.update_layout(showlegend=True)
    fig.add_vline(x=1.0, line_dash="dot", line_color="gray")
    fig.update_xaxes(type="log", title="kappa", range=[lo, hi], **log_ticks([10 ** lo, 10 ** hi]))
    fig.update_yaxes(range=[0, 1.05], title="final-state accuracy of the joint model")
    fig.update_layout(title=title, template="plotly_white", legend_title="OOD length")
    return fig


def _kappa_or_bound(row: Mapping[str, Any]) -> tuple[float | None, bool]:
    """(kappa, False), or (its lower bound, True) where only the bound is known, or (None, False)."""
    if not math.isnan(row["kappa"]):
        return row["kappa"], False
    low = row.get("kappa_low", math.nan)
    return (low, True) if math.isfinite(low) and low > 0 else (None, False)


def write_sample_efficiency_report(path: str | Path, n_star_rows: Rows, kappa_rows: Rows,
                                   trials: Rows = (), notes: str = "") -> Path:
    """One offline HTML file: the three figures, the N* and kappa tables, and the trial count."""
    converged = sum(1 for t in trials if t.get("converged"))
    sections: list = [Text(
        "N*: the smallest training-set size at which at least one configuration (lr x seed) reaches "
        "validation loss below the threshold within the step budget (geometric then binary search). "
        "kappa = sum over n of N*_n / N*_joint: > 1 shared mechanism across lengths, ~1 isolated "
        f"solutions, < 1 interference. {len(trials)} trials, {converged} converged." + (f"\n\n{notes}" if notes else ""))]
    sections.append(n_star_vs_length(n_star_rows))
    if kappa_rows:
        sections += [kappa_bars(kappa_rows), kappa_vs_ood(kappa_rows), Table(kappa_rows, heading="kappa")]
    sections.append(Table(n_star_rows, heading="N* per condition"))
    return write_report(path, "Sample efficiency and sharing", sections)
