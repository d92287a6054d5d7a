"""Figures of effective attention (interp.analysis.effective_attention).

    effective_attention_heatmap(EffectiveAttention, example, index, tokens)   M[t, s] as a heatmap
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

MAX_TICKS = 24  # tick labels per axis at most (every k-th position beyond)


def effective_attention_heatmap(result, example: int = 0, index: int = 0, tokens: Sequence[str] | None = None,
                                title: str = "Effective attention") -> go.Figure:
    """M[t, s] of one example and one channel / head (`index` into the result's selected ones),
    laid out like an attention pattern: rows the query (output) position t, columns the key
    (input) position s, both numeric axes in the sequence's own positions however the result was
    windowed (tokens, when given, name every position of the sequence in the tick labels); blank
    where s > t. The title names the layer and mixer, the channel or head shown (and the others
    selected), the example, and what x and y are. The colour scale diverges around 0 (an SSM's or
    the delta rule's M can be negative), symmetric to the largest |M|; for a dense transition
    (result.blocks) the blocks' Frobenius norms, from 0. A window whose every key follows every
    query (nothing to draw) says so in the plot area."""
    matrix = result.matrix
    if not 0 <= example < matrix.shape[0] or not 0 <= index < matrix.shape[1]:
        raise ValueError(f"example must be in [0, {matrix.shape[0]}) and index in [0, {matrix.shape[1]}); "
                         f"got example={example}, index={index}")
    grid = matrix[example, index].cpu().numpy().astype(float)
    rows = np.arange(grid.shape[0]) + result.start  # t
    cols = np.arange(grid.shape[1]) + result.source_start  # s
    grid[cols[None, :] > rows[:, None]] = np.nan  # s > t: not an input of y_t (left blank, not drawn as 0)
    empty = bool(np.isnan(grid).all())
    bound = (0.0 if empty else float(np.nanmax(np.abs(grid)))) or 1.0
    if result.blocks is None:
        scale = dict(zmin=-bound, zmax=bound, zmid=0.0, colorscale="RdBu")
        name, bar = "M[t, s]", "M[t, s]<br>weight of x_s<br>in y_t"
    else:
        scale = dict(zmin=0.0, zmax=bound, colorscale="Blues")
        name, bar = "||M[t, s]||_F", "||M[t, s]||_F<br>norm of the<br>n x n block"
    fig = go.Figure(go.Heatmap(
        z=grid, x=cols, y=rows, **scale, colorbar={"title": {"text": bar}, "exponentformat": "e"},
        hovertemplate=f"query t %{{y}}, key s %{{x}}<br>{name} %{{z:.4g}}<extra></extra>"))
    fig.update_xaxes(title=f"key position s (input {_short(result.value_name)})", showgrid=False, zeroline=False,
                     range=[cols[0] - 0.5, cols[-1] + 0.5], **_ticks(cols, tokens),
                     tickangle=-90 if tokens is not None else None)
    fig.update_yaxes(title=f"query position t (output {_short(result.output_name)})", showgrid=False,
                     zeroline=False, range=[rows[-1] + 0.5, rows[0] - 0.5], **_ticks(rows, tokens))  # t down
    if empty:
        fig.add_annotation(text=f"no key s <= t: keys {cols[0]}..{cols[-1]} all follow queries "
                                f"{rows[0]}..{rows[-1]}", xref="paper", yref="paper", x=0.5, y=0.5,
                           showarrow=False)
    fig.update_layout(title={"text": _title(result, title, example, index), "font": {"size": 15}},
                      template="plotly_white", height=560, width=760, margin={"t": 90})
    return fig


def _title(result, title: str, example: int, index: int) -> str:
    """'{title}: layer 1 (mamba), channel 17, example 0' and a second line with the other selected
    channels / heads and what M maps."""
    where = [f"layer {result.layer}" + (f" ({result.mixer})" if result.mixer else "")] \
        if result.layer is not None else ([result.mixer] if result.mixer else [])
    selected, note = result.index, ""
    if result.blocks is not None:
        what = "n x n blocks"
    elif selected is None:
        what = f"{result.axis} {index}"
    else:
        what = f"{result.axis} {selected[index]}"
        if len(selected) > 1:
            note = f"selected {result.axis}s {', '.join(map(str, selected))}; "
    line = ", ".join([*where, what, f"example {example}"])
    return (f"{title}: {line}<br><sup>{note}y_t = sum over s <= t of M[t, s] x_s; x: {result.value_name}; "
            f"y: {result.output_name}</sup>")


def _short(name: str) -> str:
    """'x (the scanned input)' -> 'x': the symbol, for an axis title (the title line has the rest)."""
    return name.split(" (")[0]


def _ticks(positions: np.ndarray, tokens: Sequence[str] | None) -> dict:
    """Tick values at the positions (every k-th, at most MAX_TICKS), labelled 't' or 't: token'."""
    step = max(1, math.ceil(len(positions) / MAX_TICKS))
    shown = positions[::step]
    labels = [f"{p}" if tokens is None else f"{p}: {tokens[p]}" for p in shown]
    return {"tickmode": "array", "tickvals": shown.tolist(), "ticktext": labels}
