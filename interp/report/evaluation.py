"""Figures of accuracy by length and of training; each returns a go.Figure.

    accuracy_vs_length({model: LengthEval | {length: accuracy}}, threshold=0.9, train_length=60)
    position_accuracy({model: LengthEval}, length)
    training_curves({model: metrics records})       loss and accuracy against step
    mp_rows / mp_table({model: LengthEval})          mp and accuracy at each length
    curves({name: values})                           one line per entry (norm decay, R^2 per position)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp.report.style import check_mapping, palette_color
from interp.training.evaluate import LengthEval, max_passing_length


def _accuracies(result: LengthEval | Mapping[int, float]) -> dict[int, float]:
    if isinstance(result, LengthEval):
        return dict(result.final_accuracy)
    if isinstance(result, Mapping):
        return {int(k): float(v) for k, v in result.items()}
    raise TypeError(f"a result must be a LengthEval or a {{length: accuracy}} mapping; got {type(result).__name__}")


def accuracy_vs_length(results: Mapping[str, LengthEval | Mapping[int, float]], threshold: float = 0.9,
                       train_length: int | None = None, title: str = "Final-state accuracy vs length") -> go.Figure:
    """One line per model: final-state accuracy against evaluated length (log x, ticks at the
    evaluated lengths when there are at most 12), the mp threshold and the training length."""
    check_mapping("results", results)
    fig = go.Figure()
    evaluated: set[int] = set()
    for name, result in results.items():
        acc = _accuracies(result)
        lengths = sorted(acc)
        evaluated.update(lengths)
        fig.add_trace(go.Scatter(x=lengths, y=[acc[t] for t in lengths], mode="lines+markers", name=name,
                                 hovertemplate="length %{x}<br>accuracy %{y:.3f}<extra>" + name + "</extra>"))
    fig.add_hline(y=threshold, line_dash="dot", line_color="gray",
                  annotation_text=f"mp threshold {threshold:.0%}", annotation_position="bottom right")
    if train_length is not None:
        # on a log axis a shape takes the data value but an annotation its log10: add_vline's own
        # annotation at x = 60 would sit at 10^60 and stretch the axis to 1e63
        fig.add_vline(x=train_length, line_dash="dash", line_color="gray")
        fig.add_annotation(x=float(np.log10(train_length)), xref="x", y=1.0, yref="y domain", showarrow=False,
                           text=f"train length {train_length}", xanchor="left", yanchor="top")
    fig.update_xaxes(type="log", title="sequence length")
    if len(evaluated) <= 12:                              # ticks at the evaluated lengths themselves
        fig.update_xaxes(tickvals=sorted(evaluated), ticktext=[str(t) for t in sorted(evaluated)])
    fig.update_yaxes(range=[0, 1.05], title="final-state accuracy")
    fig.update_layout(title=title, template="plotly_white", legend_title="model")
    return fig


def position_accuracy(results: Mapping[str, LengthEval], length: int,
                      title: str | None = None) -> go.Figure:
    """Per-position accuracy at one evaluated length, one line per model."""
    check_mapping("results", results)
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


LINE_STYLES = {  # what each trace of training_curves draws, shown once in the legend as a grey key
    "training loss": dict(mode="lines", line={"dash": "solid"}),
    "training accuracy": dict(mode="lines+markers", line={"dash": "dot"}, marker={"symbol": "square", "size": 4}),
    "evaluation final-state accuracy": dict(mode="markers", marker={"symbol": "circle-open", "size": 8}),
}


def training_curves(metrics: Mapping[str, Sequence[Mapping[str, Any]]],
                    title: str = "Training curves") -> go.Figure:
    """Training loss (log y) and accuracy against step, and evaluation accuracy, per model: one
    colour per model. The legend has one entry per model (a click hides all its traces) after a
    grey key of the three line styles (loss a solid line, training accuracy a dotted line with
    square markers, evaluation final-state accuracy open circles), so it stays short with many
    runs; below 12 models it sits at the right, past that under the panels."""
    check_mapping("results", metrics)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("training loss", "accuracy"))
    for label, style in LINE_STYLES.items():
        fig.add_trace(go.Scatter(x=[None], y=[None], name=label, legendgroup="style", legendrank=1,
                                 hoverinfo="skip", **_coloured(style, "grey")), row=1, col=2)
    for index, (name, records) in enumerate(metrics.items()):
        _add_run_traces(fig, name, records, palette_color(index, len(metrics)))
    fig.update_yaxes(type="log", title="cross-entropy, nats (log scale)", row=1, col=1)
    fig.update_yaxes(range=[0, 1.05], title="accuracy", row=1, col=2)
    fig.update_xaxes(title="step")
    below = len(metrics) >= 12
    legend = dict(orientation="h", yanchor="top", y=-0.18, x=0) if below else {}
    rows_of_legend = -(-(len(metrics) + len(LINE_STYLES)) // 4) if below else 0
    fig.update_layout(title=title, template="plotly_white", legend=dict(title="run", **legend),
                      height=450 + 24 * rows_of_legend)
    return fig


def _add_run_traces(fig: go.Figure, name: str, records: Sequence[Mapping[str, Any]], color: str) -> None:
    """One run's loss, training accuracy and evaluation accuracy in `color`; only the loss is in the
    legend (named by the run), the others follow it through the legend group."""
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    steps = [r["step"] for r in train]
    styles = {key: _coloured(style, color) for key, style in LINE_STYLES.items()}
    fig.add_trace(go.Scatter(x=steps, y=[r["loss"] for r in train], name=name, legendgroup=name,
                             hovertemplate="step %{x}<br>loss %{y:.4g}<extra>" + name + "</extra>",
                             **styles["training loss"]), row=1, col=1)
    fig.add_trace(go.Scatter(x=steps, y=[r["accuracy"] for r in train], name=f"{name} training accuracy",
                             legendgroup=name, showlegend=False, **styles["training accuracy"]), row=1, col=2)
    if evals:
        fig.add_trace(go.Scatter(
            x=[r["step"] for r in evals], y=[r["accuracy"] for r in evals], name=f"{name} evaluation accuracy",
            legendgroup=name, showlegend=False, text=[f"length {r['length']}" for r in evals],
            hovertemplate="step %{x}<br>%{text}<br>accuracy %{y:.3f}", **styles["evaluation final-state accuracy"]),
            row=1, col=2)


def _coloured(style: dict, color: str) -> dict:
    return {key: ({**value, "color": color} if key in ("line", "marker") else value) for key, value in style.items()}


def mp_rows(results: Mapping[str, LengthEval | Mapping[int, float]], threshold: float = 0.9) -> list[dict[str, Any]]:
    """One row per model: {"model", "mp", "acc@T" for every evaluated length T}."""
    check_mapping("results", results)
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
    fig.update_layout(title=f"mp (largest length with accuracy >= {threshold:.0%})", template="plotly_white",
                      height=max(220, 140 + 30 * (len(rows) + 1)))
    return fig


def curves(lines: Mapping[str, Sequence[float]], xtitle: str, ytitle: str, title: str,
           log_y: bool = False, x: Sequence[float] | None = None) -> go.Figure:
    """One line per entry {name: values [T]} against x (default 0..T-1), e.g. norm decay or R^2 per position."""
    check_mapping("results", lines)
    fig = go.Figure()
    for name, values in lines.items():
        values = np.asarray(values, dtype=float)
        xs = np.arange(len(values)) if x is None else np.asarray(x)
        fig.add_trace(go.Scatter(x=xs, y=values, mode="lines", name=name))
    fig.update_xaxes(title=xtitle)
    fig.update_yaxes(title=ytitle, type="log" if log_y else "linear")
    fig.update_layout(title=title, template="plotly_white")
    return fig
