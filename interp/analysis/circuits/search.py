"""The smallest faithful circuit of a ranking: how many of the top-scored edges a circuit needs to
recover a target share of the metric.

    found = smallest_faithful(model, scores, target=0.8)
    found.circuit          the circuit (None when no size reaches the target), found.rows the sizes tried

Sizes n (edges taken by |score| before pruning, circuit.extract) are tried on a grid: every n when
the graph has at most `grid` edges, else about `grid` sizes spread geometrically from 1 to all
edges; then bisection between the largest size below the first passing one and that size
(faithfulness need not rise with n: the result is the smallest passing size among those tried,
which `rows` lists). A fixed share of edges (`extract(fraction=...)`) can round to no edge at
all on a small graph (5% of 6 edges) or to edges that pruning removes; a target does not.

When the corrupted examples do not move the metric (clean and corrupted means within `tolerance`
of each other), faithfulness is undefined and nothing is searched: `reason` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from interp.analysis.circuits.circuit import Circuit, extract, faithfulness
from interp.analysis.circuits.eap import EdgeScores


@dataclass
class FaithfulSearch:
    """circuit: the smallest circuit reaching `target` (None: none did); rows: one per size tried
    {n (edges taken before pruning), n_edges (after), faithfulness}, by n; reason: why circuit is
    None, with what to try ("" when found). target None: a size given otherwise (one row)."""

    target: float | None
    circuit: Circuit | None
    rows: list[dict] = field(default_factory=list)
    reason: str = ""

    @property
    def faithfulness(self) -> float | None:
        """The circuit's faithfulness (None without a circuit)."""
        return None if self.circuit is None else next(row["faithfulness"] for row in self.rows
                                                      if row["n_edges"] == self.circuit.n_edges)

    @property
    def everything(self) -> bool:
        """The circuit found is every edge on a path to the logits: the ranking singles out nothing smaller."""
        return self.circuit is not None and self.circuit.n_edges == self.rows[-1]["n_edges"] and \
            self.rows[-1]["n"] == self.circuit.graph.n_edges

    @property
    def best(self) -> dict | None:
        """The row of highest faithfulness (None when nothing was tried)."""
        return max(self.rows, key=lambda row: row["faithfulness"], default=None)


def size_grid(total: int, grid: int) -> list[int]:
    """Sizes 1..total: all of them when total <= grid, else about `grid` spread geometrically (1 and total in)."""
    if total <= grid:
        return list(range(1, total + 1))
    return sorted({int(n) for n in np.unique(np.round(np.geomspace(1, total, grid)))} | {1, total})


def smallest_faithful(model, scores: EdgeScores, target: float = 0.8, grid: int = 24, baseline: str = "corrupt",
                      tolerance: float = 1e-6, rows: int | None = None, executor=None) -> FaithfulSearch:
    """The smallest circuit of `scores`' ranking whose faithfulness is >= target (module docstring);
    executor: where the grid's circuits are evaluated (as faithfulness's units), None here."""
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target <= 1:
        raise ValueError(f"target must be a faithfulness in (0, 1]; got {target!r}")
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 2:
        raise ValueError(f"grid must be an int >= 2 (sizes tried before bisection); got {grid!r}")
    setup = scores.setup
    effect = float(setup.clean_metric.mean() - setup.corrupt_metric.mean())
    if abs(effect) <= tolerance:
        return FaithfulSearch(target, None, reason=(
            f"the corrupted examples do not move the metric (mean clean - corrupted = {effect:.3g}), so no circuit "
            "can recover any of it: check that the run solves its task (interp eval), or corrupt another role "
            "(--corrupt value)"))
    tried: dict[int, tuple[Circuit, float]] = {}

    def evaluate(sizes: list[int]) -> None:
        circuits = [extract(scores, n=n) for n in sizes]
        values = faithfulness(model, setup, torch.stack([c.kept for c in circuits]), baseline, rows,
                              executor=executor, progress=False)
        tried.update({n: (c, float(v)) for n, c, v in zip(sizes, circuits, values)})

    evaluate(size_grid(scores.graph.n_edges, grid))
    passing = [n for n in sorted(tried) if tried[n][1] >= target]
    if passing:
        low = max((n for n in tried if n < passing[0]), default=0)
        high = passing[0]
        while high - low > 1:                                   # bisection inside the first passing step
            middle = (low + high) // 2
            evaluate([middle])
            low, high = (low, middle) if tried[middle][1] >= target else (middle, high)
    found = FaithfulSearch(target, None, [{"n": n, "n_edges": tried[n][0].n_edges, "faithfulness": tried[n][1]}
                                          for n in sorted(tried)])
    first = min((n for n in tried if tried[n][1] >= target), default=None)
    if first is not None:
        found.circuit = tried[first][0]
    else:
        best = found.best
        found.reason = (f"no circuit of this ranking reaches faithfulness {target:g}: the best tried is "
                        f"{best['faithfulness']:.3f} with {best['n_edges']} of {scores.graph.n_edges} edges "
                        "(the full graph recovers 1 by construction unless pruning leaves edges out). Try finer nodes "
                        "(--positions key,value,query, --conv-nodes, --channel-groups), more pairs (--n) or a lower "
                        "--target")
    return found
