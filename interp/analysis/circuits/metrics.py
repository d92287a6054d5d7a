"""The metrics a circuit is scored and evaluated with, per example at the answer position (as
interchange's: interp.analysis.interventions.interchange):

    "prob"        p(y_b), y_b the clean answer
    "logit_diff"  logit(y_b) - logit(y'_b), y'_b the corrupted answer (sites.rival_answers)
    "kl"          KL(p_clean,b || p_b) over the vocabulary (0 at the clean run)

A `Setup` fixes a (clean, corrupt) pair: answer positions (the same in both, or in a positional
graph joined by role: interp.analysis.circuits.positional), the answer tokens, the metric as a function of answer logits [R, V] and the
examples [R] the rows belong to, and for a positional graph its groups' positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from interp.analysis.circuits.graph import Graph, build_graph
from interp.analysis.circuits.passes import edge_pass
from interp.analysis.circuits.positional import check_whole_pair, inverse, role_alignment
from interp.analysis.interventions.sites import answer_positions, check_pair, rival_answers
from interp.tasks.base import Batch

METRICS = ("prob", "logit_diff", "kl")


@dataclass
class Setup:
    """A scored pair: graph, answer positions at [N], clean / corrupt activations of every sender
    ({hook: [N, T, ...]}, detached), the metric per example of the clean and corrupted runs [N]
    float64, metric(logits [R, V], examples [R]) -> [R] (an AnswerMetric: it pickles), and the
    answer tokens y and y' [N]. Every field is data, so a Setup pickles (for workers) and has a
    stable interp.analysis.units.digest."""

    graph: Graph
    clean: Batch
    corrupt: Batch
    at: torch.Tensor
    metric_name: str
    metric: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    clean_acts: dict
    corrupt_acts: dict
    clean_metric: torch.Tensor
    corrupt_metric: torch.Tensor
    answers: torch.Tensor  # [N] y, the clean answers
    rivals: torch.Tensor  # [N] y', the corrupted answers of the logit difference
    positions: torch.Tensor | None = None  # [G, N, T] bool: a positional graph's groups (circuits.positional)
    corrupt_at: torch.Tensor | None = None  # [N] the corrupted answer positions where they differ from at
    align: torch.Tensor | None = None  # [N, T] int64: the corrupted position of each clean one (None: the same)

    def answer_at(self, which: str) -> torch.Tensor:
        """The answer positions [N] of the "clean" or "corrupt" run."""
        return self.at if which != "corrupt" or self.corrupt_at is None else self.corrupt_at.to(self.at.device)

    def index(self, base: str, source: str) -> torch.Tensor | None:
        """[N, T]: the `source` run's position joined to each position of the `base` run ("clean",
        "corrupt"; "mean" is the clean run's frame), None where they are the same."""
        source = "clean" if source == "mean" else source
        if self.align is None or base == source:
            return None
        return self.align if base == "clean" else inverse(self.align)


def check_setup(model, clean: Batch, corrupt: Batch, metric: str = "logit_diff", graph: Graph | None = None,
                answer: str | None = None, groups=None) -> tuple[Graph, torch.Tensor]:
    """(the graph, answer positions at [N]) of a pair checked as `setup` checks it (no model run)."""
    graph, at, _ = _checked(model, clean, corrupt, metric, graph, answer, groups)
    return graph, at


def _checked(model, clean: Batch, corrupt: Batch, metric: str, graph, answer, groups) -> tuple:
    """(graph, at, (corrupt_at, masks, align)): the pair aligned by the graph's position groups (or
    `groups`: a positional graph's, for a run of its base graph), else refused unless its answers
    and roles sit at equal positions (interp.analysis.circuits.positional)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}; got {metric!r}")
    check_pair(clean, corrupt)
    graph = build_graph(model) if graph is None else graph
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be an interp.analysis.circuits.Graph or None; got {type(graph).__name__}")
    at = answer_positions(clean, answer, "clean")
    corrupt_at = answer_positions(corrupt, answer, "corrupt")
    groups = graph.positions if groups is None else tuple(groups)
    if not groups:
        check_whole_pair(clean, corrupt, at, corrupt_at)
        return graph, at, (None, None, None)
    masks, align = role_alignment(clean, corrupt, groups, at, corrupt_at)
    return graph, at, (None if align is None else corrupt_at, masks if graph.base is not None else None, align)


def setup(model, clean: Batch, corrupt: Batch, metric: str = "logit_diff", graph: Graph | None = None,
          answer: str | None = None, corrupt_pass=None, groups=None) -> Setup:
    """Check the pair, run it once each (no gradient) and fix the metric (module docstring).
    corrupt_pass(graph, tokens, at) -> (logits, acts) runs the corrupted tokens instead (EAP's
    forward with the receivers' leaves, so that the corrupted run is not run twice). groups: align
    the pair by these position groups (a positional graph's, for a run of its base graph)."""
    graph, at, (moved_at, masks, align) = _checked(model, clean, corrupt, metric, graph, answer, groups)
    corrupt_at = at if moved_at is None else moved_at
    device = next(model.parameters()).device
    with torch.no_grad():
        clean_logits, clean_acts = edge_pass(model, graph.pass_graph, clean.tokens.to(device), at.to(device), _none)
        if corrupt_pass is None:
            corrupt_logits, corrupt_acts = edge_pass(model, graph.pass_graph, corrupt.tokens.to(device),
                                                     corrupt_at.to(device), _none)
    if corrupt_pass is not None:
        corrupt_logits, corrupt_acts = corrupt_pass(graph.pass_graph, corrupt.tokens.to(device), corrupt_at.to(device))
    y = clean.targets[torch.arange(len(clean)), at].to(device)  # [N] the clean answers
    rival = rival_answers(corrupt, corrupt_logits.double().cpu(), y.cpu(), corrupt_at).to(device)
    clean_logp = clean_logits.double().log_softmax(-1) if metric == "kl" else None  # [N, V]
    fn = AnswerMetric(metric, y, rival, clean_logp)
    rows = torch.arange(len(clean), device=device)
    return Setup(graph, clean, corrupt, at.to(device), metric, fn, _detached(clean_acts), _detached(corrupt_acts),
                 fn(clean_logits, rows).detach().cpu(), fn(corrupt_logits, rows).detach().cpu(), y.cpu(), rival.cpu(),
                 masks, moved_at, align)


def _none(receiver, x, current):
    return None


def _detached(acts: dict) -> dict:
    return {name: value.detach() for name, value in acts.items()}


@dataclass
class AnswerMetric:
    """The metric `name` (module docstring) as metric(logits [R, V], examples [R]) -> [R] float64:
    y, rival [N] the answers y and y'; clean_logp [N, V] float64 the clean log-probabilities (for
    "kl" only, else None). A dataclass, so that a Setup pickles (workers) and digests."""

    name: str
    y: torch.Tensor
    rival: torch.Tensor
    clean_logp: torch.Tensor | None = None

    def __call__(self, logits: torch.Tensor, ex: torch.Tensor) -> torch.Tensor:
        if self.name == "prob":
            return logits.double().softmax(-1).gather(1, self.y[ex, None])[:, 0]
        if self.name == "logit_diff":
            logits = logits.double()
            return (logits.gather(1, self.y[ex, None]) - logits.gather(1, self.rival[ex, None]))[:, 0]
        logp = self.clean_logp[ex]
        return (logp.exp() * (logp - logits.double().log_softmax(-1))).sum(-1)
