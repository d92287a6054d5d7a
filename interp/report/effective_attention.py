"""Figures of effective attention (interp.analysis.effective_attention).

    effective_attention_heatmap(EffectiveAttention, example, index, tokens)   M[t, s] as a heatmap
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go


def effective_attention_heatmap(result, example: int = 0, index: int = 0, tokens: Sequence[str] | None = None,
                                title: str = "Effective attention") -> go.Figure:
    """M[t, s] of one example and one channel / head (`index` into the result's selected ones),
    laid out like an attention pattern (rows the output position t, columns the input position s,
    labelled with their positions in the sequence however the result was windowed; blank where
    s > t; tokens, when given, name every position of the sequence). The colour
    scale diverges around 0 (an SSM's or the delta rule's M can be negative), symmetric to the
    largest |M|; for a dense transition (result.blocks) the blocks' Frobenius norms, from 0."""
    matrix = result.matrix
    if not 0 <= example < matrix.shape[0] or not 0 <= index < matrix.shape[1]:
        raise ValueError(f"example must be in [0, {matrix.shape[0]}) and index in [0, {matrix.shape[1]}); "
                         f"got example={example}, index={index}")
    grid = matrix[example, index].cpu().numpy().astype(float)
    rows = np.arange(grid.shape[0]) + result.start  # t
    cols = np.arange(grid.shape[1]) + result.source_start  # s
    grid[cols[None, :] > rows[:, None]] = np.nan  # s > t: not an input of y_t (left blank, not drawn as 0)
    selected = result.index
    bound = (float(np.nanmax(np.abs(grid))) if not np.isnan(grid).all() else 0.0) or 1.0
    if result.blocks is None:
        scale = dict(zmin=-bound, zmax=bound, zmid=0.0, colorscale="RdBu")
        name, what = "M[t, s]", f"{result.axis} {index if selected is None else selected[index]}"
    else:
        scale = dict(zmin=0.0, zmax=bound, colorscale="Blues")
        name, what = "||M[t, s]||_F", "n x n blocks"
    fig = go.Figure(go.Heatmap(
        z=grid, x=_labels(cols, tokens), y=_labels(rows, tokens), **scale, colorbar={"title": name},
        hovertemplate=f"t %{{y}}, s %{{x}}<br>{name} %{{z:.4f}}<extra></extra>"))
    fig.update_xaxes(title=f"input position s ({result.value_name})")
    fig.update_yaxes(title="output position t", autorange="reversed")
    fig.update_layout(title=f"{title}: {what}, example {example}", template="plotly_white",
                      height=520, width=600)
    return fig


def _labels(positions: np.ndarray, tokens: Sequence[str] | None) -> list[str]:
    """'t' or 't: token' per position."""
    return [f"{p}" if tokens is None else f"{p}: {tokens[p]}" for p in positions]
