"""Circuits: edge sets chosen by score, pruned, and evaluated by patching everything outside them.

`extract(scores, n=..., fraction=..., threshold=...)` keeps the edges of largest |score| (the n
best, a fraction of all, or those with |score| >= threshold), then prunes to the edges on a path
from the embedding to the logits: a sender is *live* if it is the embedding or one of its
receivers has a kept edge from a live sender; a receiver is *useful* if it is the logits or feeds
a sender with a kept edge into a useful receiver. Pruned edges change nothing when the baseline is
the corrupted run (a sender none of whose inputs is kept computes its corrupted output; an edge
into a receiver that reaches no logit moves nothing the metric reads).

`faithfulness(model, pair, masks)` runs the clean input with every edge outside each circuit
carrying its corrupted (or mean) value (interp.analysis.circuits.edge_patching):

    faithfulness = (mean_b m_circuit[b] - mean_b m_corrupt[b]) / (mean_b m_clean[b] - mean_b m_corrupt[b])

1 for the full graph, 0 for the empty one (with baseline "corrupt"). `faithfulness_curve` gives
it against circuit size for each scoring method; `rescore` replaces the top-k estimates by exact
edge effects.

Units (executor=, out=, chunk=; interp.analysis.circuits.units): `faithfulness` and
`faithfulness_curve` split their circuits into units of (method, `chunk` circuits) (default about
UNIT_ROWS = 1024 patched rows: edge_chunk(N) circuits), each evaluated by the in-process code
(`faithfulness_unit`) on its method's Setup, the circuits extracted in the driver; the values are
merged in order. `rescore` runs edge_patching.edge_effects' units (chunks of its top-k edges).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from interp.analysis.circuits.eap import EdgeScores
from interp.analysis.circuits.edge_patching import check_masks, edge_effects, patched_metric
from interp.analysis.circuits.graph import Graph
from interp.analysis.circuits.metrics import Setup
from interp.analysis.circuits.units import check_chunk, chunked, edge_chunk, model_device, setup_to, span_units
from interp.analysis.units import UnitWork, run_units


@dataclass
class Circuit:
    """kept [E] bool over graph's edges (after pruning); scores [E] the scores it was chosen by."""

    graph: Graph
    kept: torch.Tensor
    scores: torch.Tensor

    @property
    def n_edges(self) -> int:
        return int(self.kept.sum())

    def edge_names(self) -> list[str]:
        names = self.graph.edge_names()
        return [names[i] for i in torch.nonzero(self.kept)[:, 0].tolist()]

    def nodes(self) -> list[str]:
        """The senders with a kept edge out of them, then the logits if any edge reaches them."""
        senders = sorted(set(self.graph.edges[self.kept, 0].tolist()))
        return [self.graph.senders[s].name for s in senders]

    def __repr__(self) -> str:
        return f"Circuit({self.n_edges} of {self.graph.n_edges} edges, {len(self.nodes())} senders)"


def extract(scores: EdgeScores, n: int | None = None, fraction: float | None = None,
            threshold: float | None = None, prune: bool = True) -> Circuit:
    """The circuit of the edges of largest |score| (exactly one of n, fraction, threshold), pruned
    to paths from the embedding to the logits (module docstring)."""
    given = [x is not None for x in (n, fraction, threshold)]
    if sum(given) != 1:
        raise ValueError(f"give exactly one of n, fraction, threshold; got n={n!r}, fraction={fraction!r}, "
                         f"threshold={threshold!r}")
    values = scores.scores.abs()
    total = len(values)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= total):
        raise ValueError(f"n must be an int in [0, {total}] (the number of edges); got {n!r}")
    if fraction is not None and not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1]; got {fraction!r}")
    if threshold is not None:
        kept = values >= float(threshold)
    else:
        count = n if n is not None else int(round(fraction * total))
        kept = torch.zeros(total, dtype=torch.bool)
        kept[values.argsort(descending=True, stable=True)[:count]] = True
    return Circuit(scores.graph, prune_edges(scores.graph, kept) if prune else kept, scores.scores)


def prune_edges(graph: Graph, kept: torch.Tensor) -> torch.Tensor:
    """kept [E] bool reduced to the edges on a path embed -> logits (module docstring)."""
    kept = kept.clone()
    sender_of = {s.name: i for i, s in enumerate(graph.senders)}
    feeds = [[sender_of[name] for name in r.feeds] for r in graph.receivers]  # receiver -> senders
    src, dst = graph.edges[:, 0], graph.edges[:, 1]
    while True:
        live = torch.zeros(len(graph.senders), dtype=torch.bool)
        live[[i for i, s in enumerate(graph.senders) if s.kind == "embed"]] = True  # (embed@g of a positional graph)
        for r in range(len(graph.receivers)):  # receivers in block order: upstream senders settle first
            if bool((kept & (dst == r) & live[src]).any()):
                live[feeds[r]] = True
        useful = torch.zeros(len(graph.receivers), dtype=torch.bool)
        useful[[i for i, r in enumerate(graph.receivers) if r.site == "logits"]] = True
        for r in reversed(range(len(graph.receivers))):
            out_of = torch.tensor(feeds[r], dtype=torch.long)
            if len(out_of) and bool((kept & torch.isin(src, out_of) & useful[dst]).any()):
                useful[r] = True
        pruned = kept & live[src] & useful[dst]
        if torch.equal(pruned, kept):
            return kept
        kept = pruned


def faithfulness(model, pair: Setup, masks: torch.Tensor, baseline: str = "corrupt",
                 rows: int | None = None, executor=None, out=None, chunk: int | None = None,
                 progress: bool = True) -> torch.Tensor:
    """Faithfulness [K] float64 of circuits masks [K, E] (True = in the circuit) (module docstring);
    baseline: "corrupt" or "mean" (what the edges outside carry). executor, out, chunk: as units
    of `chunk` circuits (module docstring; progress: a bar over them); without any of them, one
    run as before."""
    if baseline not in ("corrupt", "mean"):
        raise ValueError(f"baseline must be 'corrupt' or 'mean'; got {baseline!r}")
    masks = torch.as_tensor(masks)
    if masks.dim() == 1:
        masks = masks[None]
    if chunked(executor, out, chunk):
        return circuits_grid(model, {"": pair}, {"": check_masks(pair, masks)}, baseline, rows, chunk, executor,
                             out, progress)[""]
    metric = patched_metric(model, pair, ~masks, base="clean", source=baseline, rows=rows)  # [K, N]
    clean, corrupt = pair.clean_metric.mean(), pair.corrupt_metric.mean()
    return (metric.mean(1) - corrupt) / (clean - corrupt)


def faithfulness_curve(model, scores: Mapping[str, EdgeScores], fractions: Sequence[float] = (
        0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0), baseline: str = "corrupt",
        rows: int | None = None, executor=None, out=None, chunk: int | None = None,
        progress: bool = True) -> list[dict]:
    """Rows {method, fraction, n_edges (after pruning), faithfulness} for each scoring method (all on
    the same pair and graph) and circuit size, the circuits of one method evaluated in one batch.
    executor, out, chunk: as units of (method, `chunk` circuits) (module docstring; progress: a
    bar over them)."""
    circuits = {method: [extract(scored, fraction=f) for f in fractions] for method, scored in scores.items()}
    masks = {method: torch.stack([c.kept for c in found]) for method, found in circuits.items()}  # [F, E] each
    if chunked(executor, out, chunk):
        if baseline not in ("corrupt", "mean"):
            raise ValueError(f"baseline must be 'corrupt' or 'mean'; got {baseline!r}")
        values = circuits_grid(model, {m: s.setup for m, s in scores.items()}, masks, baseline, rows, chunk,
                               executor, out, progress)
    else:
        values = {m: faithfulness(model, scores[m].setup, masks[m], baseline, rows) for m in scores}
    return [{"method": method, "fraction": float(f), "n_edges": c.n_edges, "faithfulness": float(v)}
            for method, found in circuits.items() for f, c, v in zip(fractions, found, values[method])]


def circuits_grid(model, setups: Mapping[str, Setup], masks: Mapping[str, torch.Tensor], baseline: str,
                  rows: int | None, chunk, executor, out, progress: bool = True) -> dict[str, torch.Tensor]:
    """{method: faithfulness [K]} of each method's circuits masks [K, E] on its Setup, as units of
    (method, chunk circuits) merged in order (module docstring)."""
    methods = list(masks)
    largest = max(len(m) for m in masks.values())
    size = check_chunk(chunk, largest, edge_chunk(max(len(p.at) for p in setups.values())), "circuits")
    units = {m: span_units(len(masks[m]), size, "circuits", prefix=f"m{i:02d}_") for i, m in enumerate(methods)}
    for m in methods:
        units[m] = [replace(u, spec={**u.spec, "method": m}) for u in units[m]]
    every = [u for m in methods for u in units[m]]
    work = UnitWork(model, faithfulness_unit, {"setups": dict(setups), "masks": dict(masks), "baseline": baseline,
                                                "rows": rows},
                    name="faithfulness", options={"chunk": size, "baseline": baseline, "rows": rows,
                                                  "methods": methods})
    results = run_units(work, every, executor=executor, out=out, progress=progress)
    return {m: torch.cat([results[u.key]["faithfulness"] for u in units[m]]) for m in methods}


def faithfulness_unit(model, inputs: dict, spec: dict) -> dict[str, torch.Tensor]:
    """One unit: the faithfulness [k] of its method's circuits (a worker runs this)."""
    start, stop = spec["circuits"]
    method = spec["method"]
    pair = setup_to(inputs["setups"][method], model_device(model))
    return {"faithfulness": faithfulness(model, pair, inputs["masks"][method][start:stop], inputs["baseline"],
                                         inputs["rows"])}


def rescore(model, scores: EdgeScores, k: int = 50, rows: int | None = None, executor=None, out=None,
            chunk: int | None = None, progress: bool = True) -> EdgeScores:
    """A copy of scores whose k edges of largest |score| carry their exact single-edge effects
    (edge_patching.edge_effects: the corrupted run with that edge clean); method + "+exact".
    executor, out, chunk: edge_effects' units of `chunk` edges (module docstring; progress: a bar
    over them, none without units)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an int >= 0; got {k!r}")
    top = scores.scores.abs().argsort(descending=True, stable=True)[:k]
    per_example = scores.per_example.clone()
    per_example[top] = edge_effects(model, scores.setup, top, rows=rows,
                                    progress=progress and chunked(executor, out, chunk), executor=executor, out=out,
                                    chunk=chunk)
    return EdgeScores(scores.graph, per_example, scores.method + "+exact", scores.setup)
