"""Figures of interchange interventions and ablations (retrieval mechanisms).

    restoration_heatmap(InterchangeResult)           layers x roles per hook
    accuracy_vs_d_conv({model: {width: accuracy}})   short-conv ablation bars
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp.report.style import check_mapping


def restoration_grid(result) -> tuple[list[str], list[int], list[str], np.ndarray]:
    """(hook components, layers, roles, mean restoration [C, L, R]) of an interp.analysis.interventions
    InterchangeResult whose sites form a grid; NaN where a (component, layer, role) is missing."""
    sites, means = result.sites, result.mean().tolist()
    components = list(dict.fromkeys(s.component for s in sites))
    layers = sorted({s.layer for s in sites if s.layer is not None})
    roles = list(dict.fromkeys("all" if s.position is None else str(s.position) for s in sites))
    if any(s.layer is None for s in sites):
        raise ValueError("restoration_grid needs per-layer sites (hooks named blocks.{l}.*)")
    grid = np.full((len(components), len(layers), len(roles)), np.nan)
    for site, value in zip(sites, means):
        role = "all" if site.position is None else str(site.position)
        grid[components.index(site.component), layers.index(site.layer), roles.index(role)] = value
    return components, layers, roles, grid


def restoration_heatmap(result, title: str = "Restoration") -> go.Figure:
    """One heatmap per hook component (layers x roles) of the mean restoration of an
    InterchangeResult; cells show the value. The colour scale diverges around 0 (no restoration,
    white): positive blue, negative red, symmetric to max(1, largest |restoration|), so a full
    restoration (1), an overshoot (> 1) and a reversal (< 0) all have their own colour."""
    components, layers, roles, grid = restoration_grid(result)
    finite = np.abs(grid[np.isfinite(grid)])
    bound = max(1.0, float(finite.max())) if finite.size else 1.0
    fig = make_subplots(rows=1, cols=len(components), subplot_titles=components, horizontal_spacing=0.12)
    for index, component in enumerate(components):
        text = [["" if np.isnan(v) else f"{v:.2f}" for v in row] for row in grid[index]]
        fig.add_trace(go.Heatmap(
            z=grid[index], x=roles, y=[f"layer {layer}" for layer in layers], zmin=-bound, zmax=bound, zmid=0.0,
            colorscale="RdBu", text=text, texttemplate="%{text}", name=component,
            showscale=index == len(components) - 1, colorbar={"title": "restoration"},
            hovertemplate="%{y}, %{x}<br>restoration %{z:.3f}<extra>" + component + "</extra>"),
            row=1, col=index + 1)
        fig.update_xaxes(title="patched position", row=1, col=index + 1)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=f"{title} ({result.n_kept} of {len(result.kept)} pairs kept)",
                      template="plotly_white", height=320)
    return fig


def accuracy_vs_d_conv(results: Mapping[str, Mapping[int, float]],
                       title: str = "Accuracy vs short-conv width (ablated at load time)") -> go.Figure:
    """Grouped bars: accuracy against the kept short-conv width, one bar series per model."""
    check_mapping("results", results)
    fig = go.Figure()
    for name, by_width in results.items():
        widths = sorted((int(w) for w in by_width), reverse=True)
        fig.add_trace(go.Bar(x=[str(w) for w in widths], y=[float(by_width[w]) for w in widths], name=name,
                             text=[f"{float(by_width[w]):.2f}" for w in widths], textposition="outside",
                             hovertemplate="width %{x}<br>accuracy %{y:.3f}<extra>" + name + "</extra>"))
    fig.update_xaxes(title="short-conv width kept (d_conv)", type="category")
    fig.update_yaxes(range=[0, 1.1], title="accuracy")
    fig.update_layout(title=title, template="plotly_white", barmode="group", legend_title="model")
    return fig
