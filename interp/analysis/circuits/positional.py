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

Alignment by role (`role_alignment`). A pair whose corrupted prompt holds a group elsewhere (its
`corrupted_roles`: names of other token lengths, names in another order; prompts of different
lengths) joins the k-th position of each group in the clean prompt to the k-th in the corrupted
one (a role: its position in each; "other": the positions left, in order; the answer first in its
group): align [N, T], the corrupted position of each clean position. Every difference is then
taken between aligned positions, a_u,clean[t] - a_u,corrupt[align[t]] (EAP's and EAP-IG's scores,
EAP-IG's path, edge patching's source values), so such a pair scores as the same pair with its
roles at equal positions would; per-position scores and masks are in the clean prompt's positions.
A graph over every position has no groups to align by: a pair whose answers or roles sit at
different positions is refused (`check_whole_pair`).
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


def role_alignment(clean: Batch, corrupt: Batch, positions: Sequence[str], at: torch.Tensor,
                   corrupt_at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the clean pair's masks [G, N, T], align [N, T] int64 or None): align[n, t] is the position
    of the corrupted prompt that clean position t of example n is joined to, the k-th position of
    a group in the clean prompt to its k-th in the corrupted one (the answer first in its group, so
    that the answers are joined); None where every group and the answer sit at the same positions
    in both (position t to position t). ValueError, one line naming the pair, where a group holds
    more positions in one prompt than in the other or the answers lie in different groups."""
    masks, corrupt_masks = position_masks(clean, positions, "clean"), position_masks(corrupt, positions, "corrupt")
    if torch.equal(masks, corrupt_masks) and torch.equal(at.cpu(), corrupt_at.cpu()):
        return masks, None
    counts, corrupt_counts = masks.sum(2), corrupt_masks.sum(2)  # [G, N]
    if not torch.equal(counts, corrupt_counts):
        g, n = (int(i) for i in torch.nonzero(counts != corrupt_counts)[0])
        at_g = [torch.nonzero(m[g, n])[:, 0].tolist() for m in (masks, corrupt_masks)]
        raise ValueError(f"pair {n}: position group {positions[g]!r} is at position(s) {at_g[0]} of the clean prompt and "
                         f"{at_g[1]} of the corrupted one; a positional circuit joins a group's positions in order, so "
                         "it needs as many in both (give the roles distinct positions)")
    n, length = masks.shape[1:]
    rows = torch.arange(n)
    group, corrupt_group = masks.long().argmax(0), corrupt_masks.long().argmax(0)  # [N, T]
    if not torch.equal(group[rows, at.cpu()], corrupt_group[rows, corrupt_at.cpu()]):
        i = int(torch.nonzero(group[rows, at.cpu()] != corrupt_group[rows, corrupt_at.cpu()])[0, 0])
        raise ValueError(f"pair {i}: the clean answer (position {int(at[i])}) is in position group "
                         f"{positions[int(group[i, at[i]])]!r} and the corrupted answer (position {int(corrupt_at[i])}) "
                         f"in {positions[int(corrupt_group[i, corrupt_at[i]])]!r}; give the answer's role a group of "
                         "its own")
    align = torch.empty(n, length, dtype=torch.long)
    align.scatter_(1, _order(group, at), _order(corrupt_group, corrupt_at))
    return masks, align


def _order(group: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """[N, T] the positions sorted by group, the answer first in its group, then by position."""
    n, length = group.shape
    key = group * (length + 1) + torch.arange(length) + 1
    rows, at = torch.arange(n), at.cpu()
    key[rows, at] = group[rows, at] * (length + 1)  # the answer first in its group
    return key.argsort(1)


def check_whole_pair(clean: Batch, corrupt: Batch, at: torch.Tensor, corrupt_at: torch.Tensor) -> None:
    """ValueError, one line naming the pair, where a pair's answers or roles sit at different
    positions of its two prompts: a circuit over every position joins position t to position t."""
    hint = ("a circuit over every position patches position t from position t; give it position groups with the roles "
            f"(interp circuit --positions {','.join(sorted(clean.roles)) or 'ROLE,...'}) to align the pair by role")
    differ = torch.nonzero(at.cpu() != corrupt_at.cpu())[:, 0]
    if len(differ):
        i = int(differ[0])
        raise ValueError(f"pair {i} has its clean answer at position {int(at[i])} and its corrupted answer at "
                         f"{int(corrupt_at[i])} (prompts of different lengths, aligned by role only); {hint}")
    for name in sorted(clean.roles):
        if name in corrupt.roles and not torch.equal(clean.roles[name], corrupt.roles[name]):
            i = int(torch.nonzero((clean.roles[name] != corrupt.roles[name]).reshape(len(at), -1).any(1))[0, 0])
            raise ValueError(f"pair {i} has role {name!r} at position(s) {clean.roles[name][i].tolist()} of the clean "
                             f"prompt and {corrupt.roles[name][i].tolist()} of the corrupted one; {hint}")


def gather_positions(x: torch.Tensor, index: torch.Tensor | None, dim: int = 1) -> torch.Tensor:
    """x [..., N, T, ...] (examples on dim - 1, positions on dim) read at positions index [N, T]:
    out[.., n, t, ..] = x[.., n, index[n, t], ..]; x itself where index is None."""
    if index is None:
        return x
    index = index.to(x.device)
    rows = torch.arange(index.shape[0], device=x.device)[:, None]
    lead = (slice(None),) * (dim - 1)
    return x[lead + (rows, index)]


def inverse(index: torch.Tensor | None) -> torch.Tensor | None:
    """The inverse permutation of each row of index [N, T]."""
    if index is None:
        return None
    return torch.empty_like(index).scatter_(1, index, torch.arange(index.shape[1], device=index.device).expand_as(index))


def fold(scores, graph: Graph, per_position: bool = False):
    """EdgeScores of positional `graph` from its base graph's scores (per_position [E, N, T]
    needed) summed over each group's positions; per_position: keep them per position too."""
    if scores.per_position is None:
        raise ValueError("fold needs the base graph's scores per position (per_position=True)")
    if scores.graph is not graph.base:
        raise ValueError("scores must be of the positional graph's base graph")
    masks, _ = role_alignment(scores.setup.clean, scores.setup.corrupt, graph.positions, scores.setup.at.cpu(),
                              scores.setup.answer_at("corrupt").cpu())
    pair = replace(scores.setup, graph=graph, positions=masks)
    masks = pair.positions.to(scores.per_position)  # [G, N, T]
    per_example = torch.einsum("ent,gnt->egn", scores.per_position, masks).flatten(0, 1)  # [E G, N]
    positions = None
    if per_position:
        positions = (scores.per_position[:, None] * masks[None]).flatten(0, 1)  # [E G, N, T]
    return replace(scores, graph=graph, per_example=per_example, setup=pair, per_position=positions)
