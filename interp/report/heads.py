"""Figures of the per-head DeltaNet analysis and its HTML report.

    beta_histograms({label: (edges, counts [H, bins])})     beta per head
    head_ablation(rows, baseline)                             accuracy with each head's beta ablated
    head_metric_bars(rows, metrics)                           one bar series per metric
    write_heads_report(RunAnalysis, path, title)              the report of `interp heads`
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp.report.html import Table, Text, write_report
from interp.report.style import check_mapping, palette_color


def _head_label(row: Mapping[str, Any]) -> str:
    prefix = f"{row['model']} " if "model" in row else ""
    return f"{prefix}L{row.get('layer', 0)}H{row['head']}"


def beta_histograms(histograms: Mapping[str, tuple[np.ndarray, np.ndarray]],
                    title: str = "beta per head") -> go.Figure:
    """One panel per entry {label: (edges [bins + 1], counts [H, bins])}, one bar series per head.

    Counts are shown as fractions of the entry's tokens; a dotted line marks beta = 1 (eigenvalue 0).
    """
    check_mapping("results", histograms)
    height = max(300, 260 * len(histograms))
    spacing = min(90 / height, 0.9 / max(1, len(histograms) - 1))     # room for each panel's x title
    fig = make_subplots(rows=len(histograms), cols=1, subplot_titles=list(histograms), shared_xaxes=True,
                        vertical_spacing=spacing)
    for row, (label, (edges, counts)) in enumerate(histograms.items(), start=1):
        edges, counts = np.asarray(edges, dtype=float), np.asarray(counts, dtype=float)
        if counts.ndim != 2 or counts.shape[1] != len(edges) - 1:
            raise ValueError(f"histogram {label!r}: counts must be [H, bins] with bins = len(edges) - 1; "
                             f"got counts {counts.shape} and {len(edges)} edges")
        centres, widths = (edges[1:] + edges[:-1]) / 2, np.diff(edges)
        for head, head_counts in enumerate(counts):
            fraction = head_counts / max(head_counts.sum(), 1.0)
            fig.add_trace(go.Bar(x=centres, y=fraction, width=widths, name=f"head {head}", opacity=0.6,
                                 marker_color=palette_color(head), legendgroup=f"head {head}", showlegend=row == 1),
                          row=row, col=1)
        fig.add_vline(x=1.0, line_dash="dot", line_color="gray", row=row, col=1)
    fig.update_xaxes(title="beta", showticklabels=True)
    fig.update_yaxes(title="fraction of tokens")
    fig.update_layout(title=title, template="plotly_white", barmode="overlay",
                      height=height)
    return fig


def head_ablation(rows: Sequence[Mapping[str, Any]], baseline: float | Mapping[str, float],
                  title: str = "Reveal accuracy with one head's beta ablated") -> go.Figure:
    """Grouped bars: accuracy per head (rows with layer, head, mode, accuracy [, model]) by mode,
    with the unablated accuracy as a dashed line (one per model when `baseline` is a mapping)."""
    if not rows:
        raise ValueError("rows must be a non-empty list of {layer, head, mode, accuracy} dicts")
    fig = go.Figure()
    for index, mode in enumerate(dict.fromkeys(row["mode"] for row in rows)):
        selected = [row for row in rows if row["mode"] == mode]
        fig.add_trace(go.Bar(x=[_head_label(r) for r in selected], y=[r["accuracy"] for r in selected],
                             name=mode, marker_color=palette_color(index)))
    baselines = baseline.items() if isinstance(baseline, Mapping) else [("unablated", baseline)]
    for index, (name, value) in enumerate(baselines):     # labels alternate ends so close lines stay legible
        fig.add_hline(y=float(value), line_dash="dash", line_color="gray", annotation_text=f"{name}: {float(value):.3f}",
                      annotation_position="top left" if index % 2 == 0 else "top right")
    fig.update_yaxes(range=[0, 1.05], title="accuracy on reveal tokens")
    fig.update_xaxes(title="ablated head")
    fig.update_layout(title=title, template="plotly_white", barmode="group")
    return fig


def head_metric_bars(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str],
                     title: str = "State effective rank per head", yaxis: str = "effective rank") -> go.Figure:
    """Grouped bars of per-head values (rows with layer, head [, model] and each of `metrics`)."""
    if not rows or not metrics:
        raise ValueError("rows and metrics must be non-empty")
    fig = go.Figure()
    for index, metric in enumerate(metrics):
        if any(metric not in row for row in rows):
            raise ValueError(f"metric {metric!r} is missing from some rows; row keys: {sorted(rows[0])}")
        fig.add_trace(go.Bar(x=[_head_label(r) for r in rows], y=[r[metric] for r in rows], name=metric,
                             marker_color=palette_color(index)))
    fig.update_yaxes(title=yaxis)
    fig.update_xaxes(title="head (layer L, head H)")
    fig.update_layout(title=title, template="plotly_white", barmode="group")
    return fig


def write_heads_report(analysis, path: str | Path, title: str) -> Path:
    """The HTML report of an interp.analysis.heads.RunAnalysis: the per-head table, beta histograms,
    the per-head ablation bars and the effective ranks."""

    hist = {f"{analysis.name} layer {layer}": h for layer, h in analysis.histograms.items()}
    rows = analysis.rows()
    sections = [
        Text(f"Unablated reveal accuracy: {analysis.ablation.baseline:.4f}: the share of every revealed value of "
             "every trace predicted right. Training reports the final-state accuracy instead (the last revealed "
             "value only), so the two can differ on the same run; this one is the stricter.\n\n"
             "Per head: beta statistics (beta_mean, beta_max; frac_beta>1, the share of tokens with a negative "
             "transition eigenvalue 1 - beta), min_eig = 1 - max beta (-1 at beta = 2, a reflection), the mean "
             "effective rank of the state S_t (state_rank: exp entropy of its normalised singular values) and of "
             "the head's centred state trajectory (traj_rank: the dimension its state moves in), the mean state "
             "norm, and the reveal accuracy with that head's beta alone clamped to [0, 1] (acc_clamp01: its "
             "negative eigenvalues removed) or pinned to its mean (acc_pin_mean, a control). A head that "
             "carries the permutation state has beta near 2, a low traj_rank, and its clamp collapses the "
             "accuracy while the other heads' clamps do not (docs/deltanet-heads.md in the repository)."),
        Table([{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
              heading="Per-head summary"),
        beta_histograms(hist),
        head_ablation(analysis.ablation.rows, analysis.ablation.baseline),
        head_metric_bars(rows, ["state_rank", "traj_rank"]),
    ]
    return write_report(path, title, sections)
