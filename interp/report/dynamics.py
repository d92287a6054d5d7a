"""Plotly figures of the error-control study (shared/SCIENCE.md section 1); each returns a go.Figure.

    drift_curves({name: DriftResult}, {name: Tcross}, train_length)   q(t), the tau line, Tcross markers
    tcross_vs_mp(rows)                      Tcross against mp on log-log axes, Pearson r in the title
    jacobian_spectra(Spectra, example=0)    eigenvalues in the complex plane (unit circle) and
                                            singular values over steps
    state_projection({step: (coords [N, k], labels [N])})   states on U (first two dimensions),
                                            coloured by the true state, one panel per step
    write_drift_report(ErrorControl, path)  the report of `interp drift`
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp.analysis import dynamics
from interp.analysis.error_control import FIT_STREAM, recurrent_layer
from interp.report.evaluation import accuracy_vs_length
from interp.report.html import Table, Text, write_report
from interp.report.style import check_mapping, palette_color
from interp.training.evaluate import stream_seed
from probes.subspace import DriftResult, Tcross


def drift_curves(drifts: Mapping[str, DriftResult], tcrosses: Mapping[str, Tcross] | None = None,
                 train_length: int | None = None, title: str = "Drift ratio q(t) = R(t) / M") -> go.Figure:
    """One q(t) line per model, the tau line, and a marker at each Tcross: filled at a measured
    crossing (t, q(t)), open at an estimated one (t, tau) when it is finite (it may lie past the
    horizon, which widens the axis)."""
    check_mapping("drifts", drifts)
    tcrosses = tcrosses or {}
    fig = go.Figure()
    taus = set()
    for index, (name, result) in enumerate(drifts.items()):
        if not isinstance(result, DriftResult):
            raise TypeError(f"drifts[{name!r}] must be a DriftResult; got {type(result).__name__}")
        taus.add(result.tau)
        color = palette_color(index)
        fig.add_trace(go.Scatter(x=result.steps, y=result.q, mode="lines", name=name, legendgroup=name,
                                 line={"color": color},
                                 hovertemplate="t %{x}<br>q %{y:.3f}<extra>" + name + "</extra>"))
        cross = tcrosses.get(name)
        if cross is None or not np.isfinite(cross.value):
            continue
        y = float(result.q[cross.index]) if not cross.estimated else cross.tau
        label = f"Tcross {cross.value:.0f}" + (" (estimated)" if cross.estimated else "")
        fig.add_trace(go.Scatter(
            x=[cross.value], y=[y], mode="markers", name=f"{name} {label}", legendgroup=name, showlegend=False,
            marker={"color": color, "size": 11, "symbol": "circle-open" if cross.estimated else "circle",
                    "line": {"width": 2, "color": color}},
            hovertemplate=label + "<extra>" + name + "</extra>"))
    for tau in sorted(taus):
        fig.add_hline(y=tau, line_dash="dot", line_color="gray", annotation_text=f"tau = {tau:g}",
                      annotation_position="top left")
    if train_length is not None:
        fig.add_vline(x=train_length, line_dash="dash", line_color="gray",
                      annotation_text=f"train length {train_length}", annotation_position="top right")
    fig.update_xaxes(title="step t")
    fig.update_yaxes(title="q(t)", rangemode="tozero")
    fig.update_layout(title=title, template="plotly_white", legend_title="model")
    return fig


def loglog_pearson(x: Sequence[float], y: Sequence[float]) -> tuple[float, int]:
    """(Pearson r of log x and log y, number of points) over the pairs where both are finite and
    positive; r is NaN with fewer than 3 such points or when either side is constant."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-D of the same length; got shapes {x.shape} and {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    lx, ly = np.log(x[keep]), np.log(y[keep])
    if keep.sum() < 3 or lx.std() == 0 or ly.std() == 0:
        return float("nan"), int(keep.sum())
    return float(np.corrcoef(lx, ly)[0, 1]), int(keep.sum())


def tcross_vs_mp(rows: Sequence[Mapping[str, Any]], title: str = "Tcross vs mp",
                 color_by: str = "model") -> go.Figure:
    """Scatter of rows {"tcross", "mp", color_by, ...} on log-log axes; estimated Tcross (key
    "tcross_estimated") drawn as open markers. Rows whose mp or Tcross is missing, zero or infinite
    cannot be placed on log axes and are left out (the title counts them). Pearson r of the logs
    over the placed points is in the title."""
    if not rows:
        raise ValueError("rows must be a non-empty sequence of dicts with 'tcross' and 'mp'")
    for index, row in enumerate(rows):
        if "tcross" not in row or "mp" not in row:
            raise ValueError(f"rows[{index}] needs keys 'tcross' and 'mp'; got {sorted(row)}")
    value = lambda v: float("nan") if v is None else float(v)  # noqa: E731
    mp = np.array([value(r["mp"]) for r in rows])
    tc = np.array([value(r["tcross"]) for r in rows])
    r, count = loglog_pearson(mp, tc)
    fig = go.Figure()
    groups = list(dict.fromkeys(str(row.get(color_by, "")) for row in rows))
    for index, group in enumerate(groups):
        for estimated in (False, True):
            picked = [i for i, row in enumerate(rows) if str(row.get(color_by, "")) == group
                      and bool(row.get("tcross_estimated", False)) == estimated
                      and np.isfinite(mp[i]) and np.isfinite(tc[i]) and mp[i] > 0 and tc[i] > 0]
            if not picked:
                continue
            text = [", ".join(f"{k}={rows[i][k]}" for k in ("model", "group", "seed") if k in rows[i]) for i in picked]
            fig.add_trace(go.Scatter(
                x=mp[picked], y=tc[picked], mode="markers", text=text,
                name=group + (" (Tcross estimated)" if estimated else ""), legendgroup=group,
                marker={"color": palette_color(index), "size": 10, "symbol": "circle-open" if estimated else "circle",
                        "line": {"width": 2, "color": palette_color(index)}},
                hovertemplate="%{text}<br>mp %{x}<br>Tcross %{y:.1f}<extra></extra>"))
    left_out = len(rows) - count
    fig.update_xaxes(type="log", title="mp (max-passing length)")
    fig.update_yaxes(type="log", title="Tcross (steps)")
    suffix = f"Pearson r (log-log) = {r:.2f} over {count} runs" if np.isfinite(r) else f"r undefined ({count} runs)"
    if left_out:
        suffix += f"; {left_out} left out (no mp or infinite Tcross)"
    fig.update_layout(title=f"{title}: {suffix}", template="plotly_white", legend_title=color_by)
    return fig


def jacobian_spectra(spec, example: int = 0, title: str = "Jacobian spectra") -> go.Figure:
    """Left: the eigenvalues of every step of one example in the complex plane, coloured by step,
    with the unit circle. Right: the singular values against step (one line per index)."""
    from interp.analysis.dynamics import Spectra

    if not isinstance(spec, Spectra):
        raise TypeError(f"spec must be an interp.analysis.dynamics.Spectra; got {type(spec).__name__}")
    batch = spec.eigenvalues.shape[0]
    if isinstance(example, bool) or not isinstance(example, int) or not 0 <= example < batch:
        raise ValueError(f"example must be an int in [0, {batch}); got {example!r}")
    eig = spec.eigenvalues[example].detach().cpu().numpy()                 # [T, m]
    sv = spec.singular_values[example].detach().cpu().numpy()              # [T, m]
    steps = np.arange(1, eig.shape[0] + 1)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("eigenvalues (complex plane)", "singular values"))
    angle = np.linspace(0, 2 * np.pi, 200)
    fig.add_trace(go.Scatter(x=np.cos(angle), y=np.sin(angle), mode="lines", name="unit circle",
                             line={"color": "gray", "dash": "dot"}, hoverinfo="skip"), row=1, col=1)
    fig.add_trace(go.Scatter(
        x=eig.real.ravel(), y=eig.imag.ravel(), mode="markers", name="eigenvalues",
        marker={"size": 5, "color": np.repeat(steps, eig.shape[1]), "colorscale": "Viridis",
                "colorbar": {"title": "step", "x": 0.44}, "opacity": 0.7},
        hovertemplate="%{x:.3f} + %{y:.3f}i<extra>eigenvalue</extra>"), row=1, col=1)
    for j in range(sv.shape[1]):
        fig.add_trace(go.Scatter(x=steps, y=sv[:, j], mode="lines", name=f"sigma_{j + 1}",
                                 line={"color": palette_color(j)}), row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray", row=1, col=2)
    fig.update_xaxes(title="Re", row=1, col=1)
    fig.update_yaxes(title="Im", scaleanchor="x", scaleratio=1, row=1, col=1)
    fig.update_xaxes(title="step t", row=1, col=2)
    fig.update_yaxes(title="singular value", row=1, col=2)
    fig.update_layout(title=title, template="plotly_white")
    return fig


def state_projection(snapshots: Mapping[int, tuple[np.ndarray, np.ndarray]],
                     title: str = "States on U (first two dimensions)") -> go.Figure:
    """One panel per step: coordinates on U [N, k] (first two; k = 1 is drawn on a line)
    coloured by the true state [N]; one trace per (step, state)."""
    check_mapping("snapshots", snapshots)
    steps = sorted(snapshots)
    fig = make_subplots(rows=1, cols=len(steps), subplot_titles=[f"step {s}" for s in steps])
    classes = sorted({int(c) for s in steps for c in np.asarray(snapshots[s][1]).ravel()})
    for col, step in enumerate(steps, start=1):
        coords, labels = np.asarray(snapshots[step][0]), np.asarray(snapshots[step][1])
        if coords.ndim != 2 or labels.shape != coords.shape[:1]:
            raise ValueError(f"snapshots[{step}] must be (coords [N, k], labels [N]); got shapes "
                             f"{coords.shape} and {labels.shape}")
        y = coords[:, 1] if coords.shape[1] > 1 else np.zeros(len(coords))
        for index, state in enumerate(classes):
            mask = labels == state
            fig.add_trace(go.Scatter(
                x=coords[mask, 0], y=y[mask], mode="markers", name=f"state {state}", legendgroup=str(state),
                showlegend=col == 1, marker={"color": palette_color(index), "size": 6, "opacity": 0.75},
                hovertemplate=f"state {state}<br>u1 %{{x:.3f}}<br>u2 %{{y:.3f}}<extra>step {step}</extra>"),
                row=1, col=col)
        fig.update_xaxes(title="u1", row=1, col=col)
        fig.update_yaxes(title="u2", row=1, col=col)
    fig.update_layout(title=title, template="plotly_white", legend_title="true state")
    return fig


def write_drift_report(result, path: str | Path, title: str | None = None, model=None,
                       task=None) -> Path:
    """HTML report of one analysis: numbers, q(t), projections on U, accuracy by length, and (when
    model and task are given and the site is a recurrent state) the Jacobian spectra on U."""
    summary = result.summary()
    rows = [{k: v for k, v in summary.items() if k != "accuracy"}]
    sections = [
        Text(f"Site {result.site}; centroids and U from in-distribution sequences of length "
             f"{result.train_length}; drift on sequences of length {summary['horizon']}. Tcross is "
             f"{'estimated from the drift rate' if result.tcross.estimated else 'the first crossing'} "
             f"(tau = {result.tcross.tau}).", heading="What was measured"),
        Table(rows, heading="Summary"),
        drift_curves({result.name: result.drift}, {result.name: result.tcross}, result.train_length),
        state_projection(result.snapshots, title=f"{result.name}: states on U (first two dimensions)"),
        accuracy_vs_length({result.name: result.evaluation}, result.evaluation.threshold,
                                   result.train_length),
    ]
    layer = recurrent_layer(model, result.site) if model is not None else None
    if layer is not None and task is not None:
        tokens = task.sample(1, result.train_length, stream_seed(0, FIT_STREAM, 3)).tokens
        jac = dynamics.jacobians(model, tokens, layer)
        sections.append(jacobian_spectra(dynamics.spectra(jac, result.subspace.basis),
                                            title=f"{result.name}: spectrum of Q^T J_t Q on U"))
    return write_report(path, title or f"Error control: {result.name}", sections)
