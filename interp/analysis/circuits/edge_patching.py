"""Exact edge patching (path patching): runs in which chosen edges carry another run's values.

In a run of the `base` tokens with the edge set P patched from `source` activations, each
receiver r reads

    x_r = x_r(this run) + sum over (u -> r) in P of (a_u,source - a_u(this run))

i.e. every sender's current output on the edges kept, its source output on the patched ones, so
that a patched edge carries the source value to r and to r only (r's other inputs, and every other
receiver reading u, see u as computed in this run). Mixers run per receiver slot as in
interp.analysis.circuits.passes. Patching no edge gives the base run; patching every edge gives
the source run (the senders sum to the stream: hook_embed + mixer and MLP outputs).

`edge_effects` scores single edges: the corrupted run with one edge carrying its clean value,
minus the corrupted run (what EAP estimates to first order). `patched_metric` evaluates edge
sets: K masks [K, E] (True = patched) at once, K x N rows per pass.

Units (edge_effects' executor=, out=, chunk=; interp.analysis.circuits.units): a unit is a chunk
of `chunk` edges (default about UNIT_ROWS = 1024 patched rows: edge_chunk(N)), run by the
in-process code (`effects_unit`) on the Setup shipped to the worker; the [k, N] rows are
concatenated in order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from interp.analysis.circuits.metrics import Setup
from interp.analysis.circuits.passes import edge_pass, sender_value
from interp.analysis.circuits.positional import gather_positions
from interp.analysis.circuits.units import (cat_units, check_chunk, chunked, edge_chunk, model_device, setup_to,
                                            span_units)
from interp.analysis.units import UnitWork, run_units
from models.memory import progress_bar


def patched_metric(model, pair: Setup, masks: torch.Tensor, base: str = "clean", source: str = "corrupt",
                   rows: int | None = None, progress: bool = False) -> torch.Tensor:
    """The metric [K, N] float64 of the `base` run ("clean" / "corrupt") with each edge set of
    masks [K, E] (bool, True = patched) carrying `source` values: "clean", "corrupt" or "mean"
    (each sender's mean over the clean examples, per position). rows: the most rows per pass
    (default K x N at once, at least N)."""
    masks = check_masks(pair, masks)
    if base not in ("clean", "corrupt"):
        raise ValueError(f"base must be 'clean' or 'corrupt'; got {base!r}")
    if source not in ("clean", "corrupt", "mean"):
        raise ValueError(f"source must be 'clean', 'corrupt' or 'mean'; got {source!r}")
    tokens = getattr(pair, base).tokens.to(pair.at.device)
    acts = {name: gather_positions(value, pair.index(base, source))  # at the base run's positions (joined by role)
            for name, value in _source_acts(pair, source).items()}
    n = len(tokens)
    per_pass = max(1, (len(masks) if rows is None else int(rows) // n))
    out = []
    with torch.no_grad(), progress_bar(len(masks), progress, desc="edge patching", unit="set") as bar:
        for chunk in masks.split(per_pass):
            out.append(_run(model, pair, tokens, acts, chunk, base))
            bar.update(len(chunk))
    return torch.cat(out)


def check_masks(pair: Setup, masks) -> torch.Tensor:
    """masks as a bool [K, E] tensor over pair.graph's edges; ValueError for anything else."""
    graph = pair.graph
    masks = torch.as_tensor(masks)
    if masks.dtype != torch.bool or masks.dim() != 2 or masks.shape[1] != graph.n_edges:
        raise ValueError(f"masks must be a bool [K, E] tensor with E = {graph.n_edges} edges; got "
                         f"{masks.dtype} {tuple(masks.shape)}")
    return masks


def edge_effects(model, pair: Setup, edges: Sequence[int] | torch.Tensor, rows: int | None = None,
                 progress: bool = False, executor=None, out=None, chunk: int | None = None) -> torch.Tensor:
    """[k, N] float64: metric(corrupted run with edge e carrying its clean value) - metric(corrupted).
    executor, out, chunk: as units of `chunk` edges (module docstring; progress: a bar over them);
    without any of them, one run as before."""
    edges = torch.as_tensor(edges, dtype=torch.long).reshape(-1)
    if len(edges) and (edges.min() < 0 or edges.max() >= pair.graph.n_edges):
        raise ValueError(f"edges must be indices in [0, {pair.graph.n_edges}); got {edges.tolist()[:8]}")
    if chunked(executor, out, chunk):
        return effects_grid(model, pair, edges, rows, chunk, executor, out, progress)
    masks = torch.zeros(len(edges), pair.graph.n_edges, dtype=torch.bool)
    masks[torch.arange(len(edges)), edges] = True
    patched = patched_metric(model, pair, masks, base="corrupt", source="clean", rows=rows, progress=progress)
    return patched - pair.corrupt_metric


def effects_grid(model, pair: Setup, edges: torch.Tensor, rows: int | None, chunk, executor, out,
                 progress: bool) -> torch.Tensor:
    """edge_effects [k, N] as units of edges, merged (module docstring)."""
    if not len(edges):
        return torch.zeros(0, len(pair.at), dtype=torch.float64)
    size = check_chunk(chunk, len(edges), edge_chunk(len(pair.at)), "edges")
    units = span_units(len(edges), size, "edges")
    work = UnitWork(model, effects_unit, {"setup": pair, "edges": edges, "rows": rows}, name="edge-effects",
                    options={"chunk": size, "rows": rows})
    results = run_units(work, units, executor=executor, out=out, progress=progress)
    return cat_units(units, results, "effects")  # [k, N]


def effects_unit(model, inputs: dict, spec: dict) -> dict[str, torch.Tensor]:
    """One unit: the exact effects [k, N] of its edges (a worker runs this)."""
    start, stop = spec["edges"]
    pair = setup_to(inputs["setup"], model_device(model))
    return {"effects": edge_effects(model, pair, inputs["edges"][start:stop], rows=inputs["rows"])}


def _source_acts(pair: Setup, source: str) -> dict:
    if source == "mean":
        return {name: value.mean(0, keepdim=True).expand_as(value) for name, value in pair.clean_acts.items()}
    return pair.clean_acts if source == "clean" else pair.corrupt_acts


def _run(model, pair: Setup, tokens: torch.Tensor, acts: dict, masks: torch.Tensor, base: str = "clean") -> torch.Tensor:
    """One pass of K x N rows (row k N + b: edge set k, example b) of the `base` run's tokens,
    acts the source values at its positions -> metric [K, N]. A positional graph's masks [K, E G]
    are read as [K, E, G] over its base graph's edges, each group's patch weighted by its positions
    (pair.positions [G, N, T] of the clean run, at the base run's positions)."""
    graph, k, n = pair.graph.pass_graph, len(masks), len(tokens)
    at = pair.answer_at(base).repeat(k)
    groups = max(1, len(pair.graph.positions))
    masks = masks.view(k, graph.n_edges, groups)

    def delta_of(r, x, current):
        edges = graph.incoming(r)
        chosen = masks[:, edges]  # [K, U, G]
        used = chosen.any(2).any(0)  # [U]
        if not bool(used.any()):
            return None
        where = at if graph.receivers[r].site == "logits" else None
        weights = _position_weights(pair, chosen[:, used], where, x, base)  # [K, U', N, t]
        delta = torch.zeros_like(x).view(k, n, *x.shape[1:])
        for u, weight in zip(graph.edges[edges[used], 0].tolist(), weights.unbind(1)):
            sender = graph.senders[u]
            sets = torch.nonzero(weight.flatten(1).any(1))[:, 0]  # [K'] the edge sets patching u -> r
            diff = (sender_value(sender, acts, where[:n] if where is not None else None).to(x)[None]
                    - sender_value(sender, current, where).view(k, n, *x.shape[1:])[sets])  # [K', N, t, D]
            delta.index_add_(0, sets, weight[sets][..., None] * diff)
        return delta.view_as(x)

    logits, _ = edge_pass(model, graph, tokens.repeat(k, 1), at, delta_of)
    return pair.metric(logits, torch.arange(n, device=at.device).repeat(k)).view(k, n).cpu()


def _position_weights(pair: Setup, chosen: torch.Tensor, where: torch.Tensor | None, x: torch.Tensor,
                      base: str = "clean") -> torch.Tensor:
    """[K, U, N, t] 0 / 1: where each patched edge set k carries sender u into a receiver reading x
    [K N, t, D] (t = T, or 1 at the answer positions `where`) of the `base` run. chosen [K, U, G] bool."""
    k, n = chosen.shape[0], len(pair.at)
    if pair.positions is None:  # one group, every position
        return chosen[..., 0, None, None].to(x).expand(-1, -1, n, x.shape[1])
    masks = gather_positions(pair.positions.to(x.device), pair.index(base, "clean"), 2)  # [G, N, T]
    if where is not None:
        masks = masks[:, torch.arange(n, device=x.device), where[:n].to(x.device)][..., None]  # [G, N, 1]
    return torch.einsum("kug,gnt->kunt", chosen.to(x), masks.to(x))
