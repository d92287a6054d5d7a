"""Plotly figure builders; each returns a go.Figure.

    accuracy_vs_length({model: LengthEval | {length: accuracy}}, threshold=0.9, train_length=60)
    position_accuracy({model: LengthEval}, length)
    training_curves({model: metrics records})       loss and accuracy against step
    mp_table({model: LengthEval})                    mp and accuracy at each length
    restoration_heatmap(InterchangeResult)           layers x roles per hook (retrieval mechanisms)
    accuracy_vs_d_conv({model: {width: accuracy}})   short-conv ablation bars
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp.evaluate import LengthEval, max_passing_length


def _accuracies(result: LengthEval | Mapping[int, float]) -> dict[int, float]:
    if isinstance(result, LengthEval):
        return dict(result.final_accuracy)
    if isinstance(result, Mapping):
        return {int(k): float(v) for k, v in result.items()}
    raise TypeError(f"a result must be a LengthEval or a {{length: accuracy}} mapping; got {type(result).__name__}")


def _check_results(results: Mapping[str, Any]) -> None:
    if not isinstance(results, Mapping) or not results:
        raise ValueError(f"results must be a non-empty mapping of model name -> result; got {results!r}")


def accuracy_vs_length(results: Mapping[str, LengthEval | Mapping[int, float]], threshold: float = 0.9,
                       train_length: int | None = None, title: str = "Final-state accuracy vs length") -> go.Figure:
    """One line per model: final-state accuracy against evaluated length (log x)."""
    _check_results(results)
    fig = go.Figure()
    for name, result in results.items():
        acc = _accuracies(result)
        lengths = sorted(acc)
        fig.add_trace(go.Scatter(x=lengths, y=[acc[t] for t in lengths], mode="lines+markers", name=name,
                                 hovertemplate="length %{x}<br>accuracy %{y:.3f}<extra>" + name + "</extra>"))
    fig.add_hline(y=threshold, line_dash="dot", line_color="gray",
                  annotation_text=f"mp threshold {threshold:.0%}", annotation_position="bottom left")
    if train_length is not None:
        fig.add_vline(x=train_length, line_dash="dash", line_color="gray",
                      annotation_text=f"train length {train_length}", annotation_position="top right")
    fig.update_xaxes(type="log", title="sequence length")
    fig.update_yaxes(range=[0, 1.05], title="final-state accuracy")
    fig.update_layout(title=title, template="plotly_white", legend_title="model")
    return fig


def position_accuracy(results: Mapping[str, LengthEval], length: int,
                      title: str | None = None) -> go.Figure:
    """Per-position accuracy at one evaluated length, one line per model."""
    _check_results(results)
    fig = go.Figure()
    for name, result in results.items():
        if not isinstance(result, LengthEval) or length not in result.position_accuracy:
            raise ValueError(f"result for {name!r} has no per-position accuracy at length {length}")
        curve = result.position_accuracy[length]
        fig.add_trace(go.Scatter(x=np.arange(1, len(curve) + 1), y=curve, mode="lines", name=name))
    fig.update_xaxes(title="position")
    fig.update_yaxes(range=[0, 1.05], title="accuracy")
    fig.update_layout(title=title or f"Accuracy by position at length {length}", template="plotly_white")
    return fig


def training_curves(metrics: Mapping[str, Sequence[Mapping[str, Any]]],
                    title: str = "Training curves") -> go.Figure:
    """Training loss (log y) and accuracy against step, and evaluation accuracy, per model."""
    _check_results(metrics)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("training loss", "accuracy"))
    for index, (name, records) in enumerate(metrics.items()):
        color = _color(index)
        train = [r for r in records if r.get("kind") == "train"]
        evals = [r for r in records if r.get("kind") == "eval"]
        steps = [r["step"] for r in train]
        fig.add_trace(go.Scatter(x=steps, y=[r["loss"] for r in train], name=f"{name} loss",
                                 line_color=color, legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=steps, y=[r["accuracy"] for r in train], name=f"{name} train acc",
                                 line_color=color, legendgroup=name), row=1, col=2)
        if evals:
            fig.add_trace(go.Scatter(
                x=[r["step"] for r in evals], y=[r["accuracy"] for r in evals], mode="markers",
                name=f"{name} eval final-state acc", marker_color=color, legendgroup=name,
                text=[f"length {r['length']}" for r in evals],
                hovertemplate="step %{x}<br>%{text}<br>accuracy %{y:.3f}"), row=1, col=2)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_yaxes(range=[0, 1.05], row=1, col=2)
    fig.update_xaxes(title="step")
    fig.update_layout(title=title, template="plotly_white")
    return fig


def mp_rows(results: Mapping[str, LengthEval | Mapping[int, float]], threshold: float = 0.9) -> list[dict[str, Any]]:
    """One row per model: {"model", "mp", "acc@T" for every evaluated length T}."""
    _check_results(results)
    rows = []
    for name, result in results.items():
        acc = _accuracies(result)
        mp = max_passing_length(acc, threshold)
        rows.append({"model": name, "mp": mp if mp is not None else "none",
                     **{f"acc@{t}": round(acc[t], 4) for t in sorted(acc)}})
    return rows


def mp_table(results: Mapping[str, LengthEval | Mapping[int, float]], threshold: float = 0.9) -> go.Figure:
    """A table of mp (largest length with accuracy >= threshold) and accuracy per length."""
    rows = mp_rows(results, threshold)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    fig = go.Figure(go.Table(header={"values": columns},
                             cells={"values": [[row.get(c, "") for row in rows] for c in columns]}))
    fig.update_layout(title=f"mp (largest length with accuracy >= {threshold:.0%})", template="plotly_white")
    return fig


def _color(index: int) -> str:
    import plotly.express as px

    palette = px.colors.qualitative.Plotly
    return palette[index % len(palette)]


# ----------------------------------------------------------------------------- per-head analyses (H10)


def _head_label(row: Mapping[str, Any]) -> str:
    prefix = f"{row['model']} " if "model" in row else ""
    return f"{prefix}L{row.get('layer', 0)}H{row['head']}"


def beta_histograms(histograms: Mapping[str, tuple[np.ndarray, np.ndarray]],
                    title: str = "beta per head") -> go.Figure:
    """One panel per entry {label: (edges [bins + 1], counts [H, bins])}, one bar series per head.

    Counts are shown as fractions of the entry's tokens; a dotted line marks beta = 1 (eigenvalue 0).
    """
    _check_results(histograms)
    fig = make_subplots(rows=len(histograms), cols=1, subplot_titles=list(histograms), shared_xaxes=True)
    for row, (label, (edges, counts)) in enumerate(histograms.items(), start=1):
        edges, counts = np.asarray(edges, dtype=float), np.asarray(counts, dtype=float)
        if counts.ndim != 2 or counts.shape[1] != len(edges) - 1:
            raise ValueError(f"histogram {label!r}: counts must be [H, bins] with bins = len(edges) - 1; "
                             f"got counts {counts.shape} and {len(edges)} edges")
        centres, widths = (edges[1:] + edges[:-1]) / 2, np.diff(edges)
        for head, head_counts in enumerate(counts):
            fraction = head_counts / max(head_counts.sum(), 1.0)
            fig.add_trace(go.Bar(x=centres, y=fraction, width=widths, name=f"head {head}", opacity=0.6,
                                 marker_color=_color(head), legendgroup=f"head {head}", showlegend=row == 1),
                          row=row, col=1)
        fig.add_vline(x=1.0, line_dash="dot", line_color="gray", row=row, col=1)
    fig.update_xaxes(title="beta", row=len(histograms), col=1)
    fig.update_yaxes(title="fraction of tokens")
    fig.update_layout(title=title, template="plotly_white", barmode="overlay",
                      height=max(300, 220 * len(histograms)))
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
                             name=mode, marker_color=_color(index)))
    baselines = baseline.items() if isinstance(baseline, Mapping) else [("unablated", baseline)]
    for name, value in baselines:
        fig.add_hline(y=float(value), line_dash="dash", line_color="gray",
                      annotation_text=f"{name}: {float(value):.3f}", annotation_position="top left")
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
                             marker_color=_color(index)))
    fig.update_yaxes(title=yaxis)
    fig.update_layout(title=title, template="plotly_white", barmode="group")
    return fig


def curves(lines: Mapping[str, Sequence[float]], xtitle: str, ytitle: str, title: str,
           log_y: bool = False, x: Sequence[float] | None = None) -> go.Figure:
    """One line per entry {name: values [T]} against x (default 0..T-1), e.g. norm decay or R^2 per position."""
    _check_results(lines)
    fig = go.Figure()
    for name, values in lines.items():
        values = np.asarray(values, dtype=float)
        xs = np.arange(len(values)) if x is None else np.asarray(x)
        fig.add_trace(go.Scatter(x=xs, y=values, mode="lines", name=name))
    fig.update_xaxes(title=xtitle)
    fig.update_yaxes(title=ytitle, type="log" if log_y else "linear")
    fig.update_layout(title=title, template="plotly_white")
    return fig


# ---------------------------------------------------------------------------------------------
# Retrieval mechanisms (examples/retrieval_mechanisms.py)
# ---------------------------------------------------------------------------------------------


def restoration_grid(result) -> tuple[list[str], list[int], list[str], np.ndarray]:
    """(hook components, layers, roles, mean restoration [C, L, R]) of an interp.interventions
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
    InterchangeResult; cells show the value, the colour scale is fixed to [0, 1]."""
    components, layers, roles, grid = restoration_grid(result)
    fig = make_subplots(rows=1, cols=len(components), subplot_titles=components, horizontal_spacing=0.12)
    for index, component in enumerate(components):
        text = [["" if np.isnan(v) else f"{v:.2f}" for v in row] for row in grid[index]]
        fig.add_trace(go.Heatmap(
            z=grid[index], x=roles, y=[f"layer {layer}" for layer in layers], zmin=0.0, zmax=1.0,
            colorscale="Viridis", text=text, texttemplate="%{text}", name=component,
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
    _check_results(results)
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
