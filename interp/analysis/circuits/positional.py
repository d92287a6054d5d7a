"""Positional circuits: scores and masks of a graph whose nodes are split by position group
(interp.analysis.circuits.graph.positional_graph: sender u@g, receiver r@g, edge u@g -> r@g).

A pair fixes the groups' positions per example: masks [G, N, T] bool, group g's positions in
example n, a partition of the T positions (a role claims its positions in the order given; an
int position p is p in every example, negative from the end; "other" is every position left).
Patching edge u@g -> r@g adds mask_g * (a_u,source - a_u,current) to r's input, so patching every
group of an edge patches the edge, the full positional graph gives the source run and the empty
one the base run (interp.analysis.circuits.edge_patching). Since an edge's EAP score is a sum
over positions t, the positional scores are the base graph's per-position scores summed over each
group (`fold`):

    score[u@g -> r@g, n] = sum over t in group g of example n of score[u -> r, n, t]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from interp.analysis.circuits.graph import Graph
from interp.analysis.interventions.sites import site_positions
from interp.tasks.base import Batch


def position_masks(batch: Batch, positions: Sequence[str], which: str = "clean") -> torch.Tensor:
    """[G, N, T] bool: the groups' positions in each example (module docstring); positions: the
    group names of a positional graph (its `positions`, "other" last)."""
    n, length = batch.tokens.shape
    masks = torch.zeros(len(positions), n, length, dtype=torch.bool)
    claimed = torch.zeros(n, length, dtype=torch.bool)
    for g, name in enumerate(positions[:-1]):
        where = int(name) if name.lstrip("-").isdigit() else name
        mask = torch.zeros(n, length, dtype=torch.bool)
        mask.scatter_(1, site_positions(batch, where, which), True)
        masks[g] = mask & ~claimed
        claimed |= mask
    masks[-1] = ~claimed
    return masks


def check_positional_pair(clean: Batch, corrupt: Batch, positions: Sequence[str]) -> torch.Tensor:
    """The clean pair's masks [G, N, T]; ValueError when the corrupted examples' roles put a group
    elsewhere (an edge joins the same positions of both runs)."""
    masks, corrupt_masks = position_masks(clean, positions, "clean"), position_masks(corrupt, positions, "corrupt")
    if not torch.equal(masks, corrupt_masks):
        g, n = (int(i) for i in torch.nonzero((masks != corrupt_masks).any(2))[0])
        at = [torch.nonzero(m[g, n])[:, 0].tolist() for m in (masks, corrupt_masks)]
        raise ValueError(f"pair {n}: position group {positions[g]!r} is at position(s) {at[0]} of the clean prompt and "
                         f"{at[1]} of the corrupted one; a positional circuit's edges join equal positions, so every "
                         f"group of {list(positions)} must be at the same positions in both (patch such pairs by role "
                         "with interchange or attribute)")
    return masks


def fold(scores, graph: Graph, per_position: bool = False):
    """EdgeScores of positional `graph` from its base graph's scores (per_position [E, N, T]
    needed) summed over each group's positions; per_position: keep them per position too."""
    if scores.per_position is None:
        raise ValueError("fold needs the base graph's scores per position (per_position=True)")
    if scores.graph is not graph.base:
        raise ValueError("scores must be of the positional graph's base graph")
    pair = replace(scores.setup, graph=graph, positions=check_positional_pair(
        scores.setup.clean, scores.setup.corrupt, graph.positions))
    masks = pair.positions.to(scores.per_position)  # [G, N, T]
    per_example = torch.einsum("ent,gnt->egn", scores.per_position, masks).flatten(0, 1)  # [E G, N]
    positions = None
    if per_position:
        positions = (scores.per_position[:, None] * masks[None]).flatten(0, 1)  # [E G, N, T]
    return replace(scores, graph=graph, per_example=per_example, setup=pair, per_position=positions)
