"""Figures of interchange interventions and ablations (retrieval mechanisms).

    restoration_heatmap(InterchangeResult, labels=)  layers x positions (roles) per hook
    position_labels(batch)                           {position: "3 key 24%"}: the roles at each position
    accuracy_vs_d_conv({model: {width: accuracy}})   short-conv ablation bars
    attribution_scatter(exact, estimate)             per-site means: attribution vs interchange
    restoration_bound(*results)                      one colour scale for several heatmaps
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp.report.style import check_mapping, palette_color

MAX_SIDE_BY_SIDE_ROLES = 6  # more roles (positions) than this: one heatmap per row


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


def restoration_bound(*results) -> float:
    """The colour scale's |restoration| limit that shows every result's site means:
    max(1, largest |mean restoration|) over them (pass it as `bound` to compare heatmaps)."""
    means = np.abs(np.concatenate([np.asarray(r.mean(), dtype=float).ravel() for r in results]))
    finite = means[np.isfinite(means)]
    return max(1.0, float(finite.max())) if finite.size else 1.0


def cell_text(value: float, digits: int = 2) -> str:
    """A heatmap cell: value to `digits` decimals, "" for NaN, never "-0.00" (a value that rounds
    to zero is written without its sign)."""
    if np.isnan(value):
        return ""
    text = f"{value:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def position_labels(batch, min_share: float = 0.0) -> dict[str, str]:
    """{str(position): label} for every position of a batch with roles (AR, MQAR, ATR, ...): the
    position, then each role found there, with the share of examples where it is there when that
    is not all of them ("7 query", "3 key 26%"). Roles in more than `min_share` of the examples
    are named. A role is a position per example ([N]) or several ([N, k], e.g. MQAR's queries)."""
    length = batch.tokens.shape[1]
    found: dict[int, list[str]] = {p: [] for p in range(length)}
    for role, where in batch.roles.items():
        where = where[:, None] if where.dim() == 1 else where                        # [N, k]
        shares = np.zeros(length)
        for column in where.T:
            shares += np.bincount(column.cpu().numpy() % length, minlength=length) / len(column)
        for position in np.flatnonzero(shares > min_share):
            share = min(1.0, float(shares[position]))
            found[int(position)].append(role if share >= 1.0 else f"{role} {share:.0%}")
    return {str(p): " ".join([str(p), *roles]) for p, roles in found.items()}


def restoration_heatmap(result, title: str = "Restoration", bound: float | None = None,
                        labels: Mapping[str, str] | None = None) -> go.Figure:
    """One heatmap per hook component (layers x roles) of the mean restoration of an
    InterchangeResult; cells show the value. The colour scale diverges around 0 (no restoration,
    white): positive blue, negative red, symmetric to `bound` (default max(1, largest |restoration|);
    give two figures one bound to compare them by colour), so a full restoration (1), an overshoot
    (> 1) and a reversal (< 0) all have their own colour. Panels sit side by side for a few roles
    and one above the other for a grid of many positions, so every cell's value stays legible.
    labels: {position as the sites name it: axis label} (position_labels(batch): the roles there)."""
    components, layers, roles, grid = restoration_grid(result)
    if bound is None:
        bound = restoration_bound(result)
    elif isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0:
        raise ValueError(f"bound must be a number > 0 (the colour scale's |restoration| limit) or None; got {bound!r}")
    stacked = len(roles) > MAX_SIDE_BY_SIDE_ROLES and len(components) > 1
    shape = dict(rows=len(components), cols=1, vertical_spacing=0.5 / len(components)) if stacked else \
        dict(rows=1, cols=len(components), horizontal_spacing=0.12)
    fig = make_subplots(**shape, subplot_titles=components)
    for index, component in enumerate(components):
        cell = dict(row=index + 1, col=1) if stacked else dict(row=1, col=index + 1)
        text = [[cell_text(v) for v in row] for row in grid[index]]
        fig.add_trace(go.Heatmap(
            z=grid[index], x=[(labels or {}).get(role, role) for role in roles], y=[f"layer {layer}" for layer in layers],
            zmin=-bound, zmax=bound, zmid=0.0,
            colorscale="RdBu", text=text, texttemplate="%{text}", name=component,
            showscale=index == len(components) - 1, colorbar={"title": "restoration"},
            hovertemplate="%{y}, %{x}<br>restoration %{z:.3f}<extra>" + component + "</extra>"), **cell)
        fig.update_xaxes(title="patched position (role: share of examples)" if labels else "patched position",
                         type="category", **cell)
        fig.update_yaxes(title="layer", **cell)
    fig.update_yaxes(autorange="reversed")
    height = 120 + len(components) * (90 + 45 * len(layers)) if stacked else 320
    beyond = int((np.abs(grid[np.isfinite(grid)]) > bound).sum())
    clipped = f"; {beyond} cells beyond ±{bound:.2g} drawn at the scale's end, their values written" if beyond else ""
    fig.update_layout(title=f"{title} ({result.n_kept} of {len(result.kept)} pairs kept{clipped})",
                      template="plotly_white", height=height)
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


QUANTITY_TITLES = {"restoration": "restoration of p(y)", "logit_diff_restoration": "restoration of logit(y) - logit(y')"}


def attribution_scatter(exact, estimate, quantities=("restoration", "logit_diff_restoration"),
                        title: str = "Attribution estimate vs exact interchange, per site") -> go.Figure:
    """One panel per quantity (an InterchangeResult attribute, e.g. "restoration"): each site's mean
    over the examples both results keep, exact (interchange) on x against the estimate (attribute)
    on y, coloured by hook component, with the line y = x (a perfect estimate lies on it)."""
    if [s.label for s in exact.sites] != [s.label for s in estimate.sites]:
        raise ValueError("exact and estimate must cover the same sites")
    unknown = [q for q in quantities if q not in QUANTITY_TITLES]
    if isinstance(quantities, str) or unknown or not quantities:
        raise ValueError(f"quantities must be a non-empty list of {list(QUANTITY_TITLES)}; got {quantities!r}")
    kept = exact.kept & estimate.kept
    components = list(dict.fromkeys(s.component for s in exact.sites))
    fig = make_subplots(rows=1, cols=len(quantities), subplot_titles=[QUANTITY_TITLES[q] for q in quantities],
                        horizontal_spacing=0.1)
    for col, quantity in enumerate(quantities, start=1):
        means = [getattr(r, quantity)[:, kept].nanmean(1).numpy() for r in (exact, estimate)]  # [S] each
        finite = np.concatenate([m[np.isfinite(m)] for m in means])
        low, high = (min(0.0, float(finite.min())), max(1.0, float(finite.max()))) if finite.size else (0.0, 1.0)
        fig.add_trace(go.Scatter(x=[low, high], y=[low, high], mode="lines", line={"color": "#999", "dash": "dot"},
                                 name="y = x", showlegend=col == 1, hoverinfo="skip"), row=1, col=col)
        for index, component in enumerate(components):
            rows = [i for i, s in enumerate(exact.sites) if s.component == component]
            fig.add_trace(go.Scatter(
                x=means[0][rows], y=means[1][rows], mode="markers", name=component, legendgroup=component,
                showlegend=col == 1, marker={"color": palette_color(index), "size": 8},
                text=[exact.sites[i].label for i in rows],
                hovertemplate="%{text}<br>exact %{x:.3f}<br>estimate %{y:.3f}<extra></extra>"), row=1, col=col)
        fig.update_xaxes(title="exact (interchange)", row=1, col=col)
        fig.update_yaxes(title="estimate (attribution)", row=1, col=col)
    fig.update_layout(title=f"{title} ({int(kept.sum())} of {len(kept)} pairs kept)", template="plotly_white",
                      height=460, legend_title="hook")
    return fig
