"""Plotly figures of the error-control study (docs/drift.md); each returns a go.Figure.

    drift_curves({name: DriftResult}, {name: Tcross}, train_length)   q(t), the tau line, Tcross markers
    tcross_vs_mp(rows)                      Tcross against mp on log-log axes, Pearson r in the title
    definition_correlations(rows)           per Tcross definition: Pearson r of log mp and log Tcross
    tcross_vs_mp_by_definition(rows)        one log-log panel per definition, r in each panel's title
    readability_curves({name: Calibration}) read-out accuracy against the displacement ratio, tau_cal
    jacobian_spectra(Spectra, example=0)    eigenvalues in the complex plane (unit circle) and
                                            singular values over steps
    state_projection({step: (coords [N, k], labels [N])})   states on U (first two dimensions),
                                            coloured by the true state, one panel per step
    write_drift_report(ErrorControl, path)  the report of `interp drift`
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp.analysis import dynamics
from interp.analysis.correlation import loglog_pearson
from interp.analysis.error_control import DEFINITIONS, FIT_STREAM, recurrent_layer
from interp.report.evaluation import accuracy_vs_length
from interp.report.html import Table, Text, write_report
from interp.report.style import check_mapping, log_ticks, palette_color
from interp.training.evaluate import stream_seed
from probes.fisher import FISHER_LEVEL
from probes.readability import Calibration
from probes.subspace import DriftResult, Tcross


def drift_curves(drifts: Mapping[str, DriftResult], tcrosses: Mapping[str, Tcross] | None = None,
                 train_length: int | None = None, title: str = "Drift ratio q(t) = R(t) / M") -> go.Figure:
    """One q(t) line per model, the tau line, and a marker at each Tcross: filled at a measured
    crossing (t, q(t)), open at an estimated one (t, tau) when it is finite (it may lie past the
    horizon, which widens the axis). The axis is logarithmic where q spans more than two decades
    (`_value_axis`; values it cannot draw there, zero and numerical zeros, are left out of the line)."""
    check_mapping("drifts", drifts)
    for name, result in drifts.items():
        if not isinstance(result, DriftResult):
            raise TypeError(f"drifts[{name!r}] must be a DriftResult; got {type(result).__name__}")
    tcrosses = tcrosses or {}
    fig = go.Figure()
    taus = {result.tau for result in drifts.values()}
    axis, floor = _value_axis(np.concatenate([np.asarray(r.q, dtype=float) for r in drifts.values()]
                                             + [np.asarray(sorted(taus))]))
    for index, (name, result) in enumerate(drifts.items()):
        color = palette_color(index)
        shown = np.where(np.asarray(result.q, dtype=float) > floor, result.q, np.nan)
        fig.add_trace(go.Scatter(x=result.steps, y=shown, mode="lines", name=name, legendgroup=name,
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
        _level_line(fig, tau, f"tau = {tau:.3g}", axis)
    if train_length is not None:
        fig.add_vline(x=train_length, line_dash="dash", line_color="gray",
                      annotation_text=f"train length {train_length}", annotation_position="top right")
    fig.update_xaxes(title="step t")
    fig.update_yaxes(title="q(t)", **axis)
    fig.update_layout(title=title, template="plotly_white", legend_title="model")
    return fig


def _value_axis(values: np.ndarray) -> tuple[dict[str, Any], float]:
    """(axis settings, floor): a log axis (whole-number ticks) where the finite values above 1e-12 of the
    largest span more than two decades (a state that grows by 1e9 over the horizon flattens every threshold
    on a linear axis), the floor below which values are not drawn on it (zero, numerical zeros such as the
    time-indexed spread at step 1); else linear from zero, floor -inf."""
    finite = values[np.isfinite(values)]
    top = float(finite.max()) if finite.size else 0.0
    shown = finite[finite > 1e-12 * top] if top > 0 else finite[:0]
    if shown.size and shown.max() / shown.min() > 100:
        return {"type": "log", **log_ticks(shown)}, 1e-12 * top
    return {"rangemode": "tozero"}, -np.inf


def _level_line(fig: go.Figure, y: float, text: str, axis: dict[str, Any]) -> None:
    """A dotted horizontal line at y with its label at its left end; on a log axis the label's y is given as
    log10(y), since plotly.js places annotations on a log axis by the exponent (add_hline's own label is
    drawn at 10^y there)."""
    fig.add_hline(y=y, line_dash="dot", line_color="gray")
    at = float(np.log10(y)) if axis.get("type") == "log" else y
    fig.add_annotation(x=0, xref="x domain", y=at, yref="y", text=text, showarrow=False, xanchor="left",
                       yanchor="bottom")


def fisher_figure(curve: np.ndarray, cross: Tcross | None, train_length: int | None = None,
                  title: str = "Fisher separation F(t)") -> go.Figure:
    """F(t) (probes.fisher) over the steps, its level (where a linear read-out of two Gaussian classes errs
    10%) and the first crossing below it."""
    curve = np.asarray(curve, dtype=float)
    steps = np.arange(1, curve.shape[0] + 1)
    axis, floor = _value_axis(np.append(curve, FISHER_LEVEL))
    fig = go.Figure(go.Scatter(x=steps, y=np.where(curve > floor, curve, np.nan), mode="lines", name="F(t)", line={"color": palette_color(0)},
                               hovertemplate="t %{x}<br>F %{y:.3f}<extra></extra>"))
    _level_line(fig, FISHER_LEVEL, f"level {FISHER_LEVEL:.3f}", axis)
    if cross is not None and np.isfinite(cross.value):
        fig.add_trace(go.Scatter(x=[cross.value], y=[curve[cross.index]], mode="markers", name=f"Tcross {cross.value:.0f}",
                                 marker={"color": palette_color(0), "size": 11}))
    if train_length is not None:
        fig.add_vline(x=train_length, line_dash="dash", line_color="gray",
                      annotation_text=f"train length {train_length}", annotation_position="top right")
    fig.update_xaxes(title="step t")
    fig.update_yaxes(title="F(t): smallest whitened centroid distance", **axis)
    fig.update_layout(title=title, template="plotly_white")
    return fig


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
    if not fig.data:
        fig.add_annotation(text="no run has both an mp and a finite Tcross: nothing to place",
                           xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False, font={"size": 14})
    fig.update_xaxes(type="log", title="mp (max-passing length)", **_single_value_range(mp), **log_ticks(mp))
    fig.update_yaxes(type="log", title="Tcross (steps)", **_single_value_range(tc), **log_ticks(tc))
    suffix = f"Pearson r (log-log) = {r:.2f} over {count} runs" if np.isfinite(r) else f"r undefined ({count} runs)"
    if left_out:
        suffix += f"; {left_out} left out (no mp or infinite Tcross)"
    fig.update_layout(title=f"{title}: {suffix}", template="plotly_white", legend_title=color_by)
    return fig


def _single_value_range(values: np.ndarray) -> dict[str, Any]:
    """{"range": [log10 v - 0.5, log10 v + 0.5]} when every placeable value (finite, > 0) is one v: plotly.js
    would pad a single value by a decade each way; else {} (autorange)."""
    placed = values[np.isfinite(values) & (values > 0)]
    if placed.size and np.all(placed == placed[0]):
        center = float(np.log10(placed[0]))
        return {"range": [center - 0.5, center + 0.5]}
    return {}


def _definition_rows(rows: Sequence[Mapping[str, Any]], definition: str) -> list[dict[str, Any]]:
    """rows (ErrorControl.summary() dicts, plus any labels) with "tcross" / "tcross_estimated" taken
    from that definition's entries."""
    out = []
    for index, row in enumerate(rows):
        if "tcross_by_definition" not in row or "mp" not in row:
            raise ValueError(f"rows[{index}] needs 'mp' and 'tcross_by_definition' (ErrorControl.summary()); "
                             f"got keys {sorted(row)}")
        value = row["tcross_by_definition"].get(definition)
        estimated = row.get("tcross_estimated_by_definition", {}).get(definition)
        out.append(dict(row) | {"tcross": float("nan") if value is None else value,
                                "tcross_estimated": bool(estimated)})
    return out


def definition_correlations(rows: Sequence[Mapping[str, Any]],
                            definitions: Sequence[str] = DEFINITIONS) -> list[dict[str, Any]]:
    """One row per definition: Pearson r of log mp and log Tcross over the runs where both are finite
    and positive ("placed"), out of "total" (rows as for tcross_vs_mp_by_definition)."""
    table = []
    for definition in definitions:
        picked = _definition_rows(rows, definition)
        r, count = loglog_pearson([np.nan if x["mp"] is None else x["mp"] for x in picked],
                                  [x["tcross"] for x in picked])
        table.append({"definition": definition, "pearson_r_loglog": r, "placed": count, "total": len(picked)})
    return table


def tcross_vs_mp_by_definition(rows: Sequence[Mapping[str, Any]], definitions: Sequence[str] = DEFINITIONS,
                               title: str = "Tcross vs mp by definition", color_by: str = "model",
                               columns: int = 2) -> go.Figure:
    """One log-log panel of Tcross against mp per definition ("DRIFT/THRESHOLD"), Pearson r of the
    logs in each panel's title. rows: ErrorControl.summary() dicts (with "tcross_by_definition"),
    optionally with labels such as "model", "group", "seed". Open markers: estimated Tcross."""
    if not rows:
        raise ValueError("rows must be a non-empty sequence of ErrorControl.summary() dicts")
    if not definitions:
        raise ValueError("definitions must name at least one of " + ", ".join(DEFINITIONS))
    table = {row["definition"]: row for row in definition_correlations(rows, definitions)}
    titles = []
    for definition in definitions:
        r, placed = table[definition]["pearson_r_loglog"], table[definition]["placed"]
        titles.append(f"{definition}: r = {r:.2f} ({placed} runs)" if np.isfinite(r)
                      else f"{definition}: r undefined ({placed} runs)")
    n_rows = -(-len(definitions) // columns)
    specs = [[{} if r * columns + c < len(definitions) else None for c in range(columns)] for r in range(n_rows)]
    fig = make_subplots(rows=n_rows, cols=columns, subplot_titles=titles, horizontal_spacing=0.1,
                        vertical_spacing=0.5 / n_rows, specs=specs)
    groups = list(dict.fromkeys(str(row.get(color_by, "")) for row in rows))
    for index, definition in enumerate(definitions):
        at = {"row": index // columns + 1, "col": index % columns + 1}
        picked = _definition_rows(rows, definition)
        for g, group in enumerate(groups):
            for estimated in (False, True):
                points = [x for x in picked if str(x.get(color_by, "")) == group and x["tcross_estimated"] == estimated
                          and x["mp"] is not None and np.isfinite(x["tcross"]) and x["mp"] > 0 and x["tcross"] > 0]
                if not points:
                    continue
                text = [", ".join(f"{k}={x[k]}" for k in ("model", "group", "seed") if k in x) for x in points]
                fig.add_trace(go.Scatter(
                    x=[x["mp"] for x in points], y=[x["tcross"] for x in points], mode="markers", text=text,
                    name=group, legendgroup=group, showlegend=index == 0 and not estimated,
                    marker={"color": palette_color(g), "size": 9, "symbol": "circle-open" if estimated else "circle",
                            "line": {"width": 2, "color": palette_color(g)}},
                    hovertemplate="%{text}<br>mp %{x}<br>Tcross %{y:.1f}<extra>" + definition + "</extra>"), **at)
        if table[definition]["placed"] == 0:      # plotly.js draws no subplot without a trace: give it one
            fig.add_trace(go.Scatter(x=[], y=[], showlegend=False, hoverinfo="skip"), **at)
            ref = "" if index == 0 else str(index + 1)
            fig.add_annotation(text="nothing to place", xref=f"x{ref} domain", yref=f"y{ref} domain", x=0.5, y=0.5,
                               showarrow=False)
        fig.update_xaxes(type="log", title="mp", **at)
        fig.update_yaxes(type="log", title="Tcross", **at)
    fig.update_layout(title=title + " (open markers: Tcross estimated from the drift rate)",
                      template="plotly_white", legend_title=color_by, height=300 * n_rows + 120)
    return fig


def readability_curves(calibrations: Mapping[str, Calibration],
                       title: str = "Readability of the read-out: accuracy with states moved along U") -> go.Figure:
    """Accuracy of each model's read-out against the displacement ratio r (to M), the accuracy
    threshold as a dotted line and tau_cal as a marker on each curve (NaN tau_cal: no marker)."""
    check_mapping("calibrations", calibrations)
    fig = go.Figure()
    levels = set()
    for index, (name, cal) in enumerate(calibrations.items()):
        if not isinstance(cal, Calibration):
            raise TypeError(f"calibrations[{name!r}] must be a probes.readability.Calibration; got {type(cal).__name__}")
        levels.add(cal.threshold)
        color = palette_color(index)
        fig.add_trace(go.Scatter(x=cal.ratios, y=cal.accuracy, mode="lines+markers", name=name, legendgroup=name,
                                 line={"color": color},
                                 hovertemplate="r %{x:.3f}<br>accuracy %{y:.3f}<extra>" + name + "</extra>"))
        if cal.fits:
            label = f"tau_cal {cal.tau:.3f}" + (" (lower bound)" if cal.censored else "")
            fig.add_trace(go.Scatter(x=[cal.tau], y=[float(np.interp(cal.tau, cal.ratios, cal.accuracy))],
                                     mode="markers+text", text=[label], textposition="top left", showlegend=False,
                                     cliponaxis=False,
                                     legendgroup=name, marker={"color": color, "size": 12, "symbol": "diamond"},
                                     hovertemplate=label + "<extra>" + name + "</extra>"))
    for level in sorted(levels):
        fig.add_hline(y=level, line_dash="dot", line_color="gray", annotation_text=f"{level:.0%}",
                      annotation_position="bottom left")
    lowest = min([float(np.min(c.accuracy)) for c in calibrations.values()] + sorted(levels)[:1])
    fig.update_xaxes(title="displacement along U / M (r)")
    fig.update_yaxes(range=[np.floor(max(0.0, lowest - 0.05) * 10) / 10, 1.02], title="read-out accuracy")
    fig.update_layout(title=title, template="plotly_white", legend_title="model")
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
    fig = make_subplots(rows=1, cols=2, subplot_titles=("eigenvalues (complex plane)", "singular values"),
                        horizontal_spacing=0.2)
    angle = np.linspace(0, 2 * np.pi, 200)
    fig.add_trace(go.Scatter(x=np.cos(angle), y=np.sin(angle), mode="lines", name="unit circle",
                             line={"color": "gray", "dash": "dot"}, hoverinfo="skip"), row=1, col=1)
    fig.add_trace(go.Scatter(
        x=eig.real.ravel(), y=eig.imag.ravel(), mode="markers", name="eigenvalues",
        marker={"size": 5, "color": np.repeat(steps, eig.shape[1]), "colorscale": "Viridis",
                "colorbar": {"title": "step", "x": 0.41, "thickness": 14}, "opacity": 0.7},
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
        fig.update_yaxes(title="u2" if coords.shape[1] > 1 else "(U is 1-dimensional)", row=1, col=col)
    fig.update_layout(title=title, template="plotly_white", legend_title="true state")
    return fig


def write_drift_report(result, path: str | Path, title: str | None = None, model=None,
                       task=None) -> Path:
    """HTML report of one analysis: numbers, q(t), projections on U, accuracy by length, and (when
    model and task are given and the site is a recurrent state) the Jacobian spectra on U."""
    summary = result.summary()
    rows = [{"quantity": k, "value": v} for k, v in summary.items() if not isinstance(v, (dict, list))]
    drifts = {f"{result.name} pooled": result.drift}
    crossings = {f"{result.name} pooled": result.crossings.get("pooled/fixed", result.tcross)}
    if result.drift_time is not None:
        drifts[f"{result.name} time-indexed"] = result.drift_time
        if "time/fixed" in result.crossings:
            crossings[f"{result.name} time-indexed"] = result.crossings["time/fixed"]
    if getattr(result, "drift_same", None) is not None:
        drifts[f"{result.name} same-step"] = result.drift_same
        if "same/fixed" in result.crossings:
            crossings[f"{result.name} same-step"] = result.crossings["same/fixed"]
    cal = result.calibration
    cal_text = ("not calibrated" if cal is None else
                f"tau_cal = {cal.tau:.3f}{' (a lower bound)' if cal.censored else ''}" if cal.fits else
                f"undefined: the read-out scores {cal.base_accuracy:.3f} < {cal.threshold} on unmoved states")
    sections = [
        Text(f"Site {result.site}; centroids and U from in-distribution sequences of length "
             f"{result.train_length}; drift on sequences of length {summary['horizon']}. Headline "
             f"definition {result.definition}: Tcross "
             f"{'estimated from the drift rate' if result.tcross.estimated else 'is the first crossing'} "
             f"(tau = {result.tcross.tau:.3g}). Calibrated readability threshold: {cal_text}.\n\n"
             "Definitions: pooled = spread around centroids pooled over all in-distribution positions, "
             "relative to their smallest distance M; excess = pooled minus its in-distribution mean; "
             "time = spread around the class centroids of each step, relative to the separation at the "
             "start (M_ref); same = the same spread relative to the separation of that step (M_t; "
             "scale-invariant). Thresholds: fixed tau, calibrated (the displacement along U at which "
             "the model's own read-out falls below the accuracy threshold) or theory (the ratio at which "
             "the closest pair of isotropic Gaussian classes in U's dimension is misread 10%); +burn-in: the "
             "first crossing after the steps before the class is first read from U at 90% (summary: burn_in). "
             "The table's tests column names the seed's sentence each reading tests (docs/drift.md). "
             "fisher (our own) = the smallest "
             "distance between the class centroids of each step in within-class-whitened U, crossing where it "
             f"falls below {FISHER_LEVEL:.3f} (a linear read-out of two Gaussian classes then errs 10%): it counts "
             "only the spread that confuses classes.", heading="What was measured"),
        Table(rows, heading="Summary"),
        Table([{k: v for k, v in row.items()} for row in result.definition_rows()],
              heading="Tcross by definition"),
        drift_curves(drifts, crossings, result.train_length,
                     title="Drift ratio q(t) (pooled: R / M; time-indexed: R_t / M_ref; same-step: R_t / M_t) "
                           "at the fixed tau"),
        *([fisher_figure(result.fisher, result.crossings.get("fisher/fixed"), result.train_length,
                         title=f"{result.name}: Fisher separation F(t) of the classes on U")]
          if result.fisher is not None else []),
        state_projection(result.snapshots, title=f"{result.name}: states on U (first two dimensions)"),
        accuracy_vs_length({result.name: result.evaluation}, result.evaluation.threshold,
                                   result.train_length),
    ]
    if "time/calibrated" in result.crossings and result.drift_time is not None:
        at_cal = {f"{result.name} pooled": replace(result.drift, tau=cal.tau),
                  f"{result.name} time-indexed": replace(result.drift_time, tau=cal.tau_for(result.drift_time.M))}
        sections.insert(4, drift_curves(at_cal, dict(zip(at_cal, (result.crossings["pooled/calibrated"],
                                                                   result.crossings["time/calibrated"]))),
                                        result.train_length, title="Drift ratio q(t) at the calibrated tau "
                                        "(the same displacement D = tau_cal * M: tau_cal for pooled, D / M_ref for time-indexed)"))
    if cal is not None:
        sections.append(readability_curves({result.name: cal}))
    layer = recurrent_layer(model, result.site) if model is not None else None
    if layer is not None and task is not None:
        tokens = task.sample(1, result.train_length, stream_seed(0, FIT_STREAM, 3)).tokens
        jac = dynamics.jacobians(model, tokens, layer)
        sections.append(jacobian_spectra(dynamics.spectra(jac, result.subspace.basis),
                                            title=f"{result.name}: spectrum of Q^T J_t Q on U"))
    return write_report(path, title or f"Error control: {result.name}", sections)
