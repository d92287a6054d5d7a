"""The metrics a circuit is scored and evaluated with, per example at the answer position (as
interchange's: interp.analysis.interventions.interchange):

    "prob"        p(y_b), y_b the clean answer
    "logit_diff"  logit(y_b) - logit(y'_b), y'_b the corrupted answer (sites.rival_answers)
    "kl"          KL(p_clean,b || p_b) over the vocabulary (0 at the clean run)

A `Setup` fixes a (clean, corrupt) pair: answer positions (the same in both: edges join equal
positions), the answer tokens, the metric as a function of answer logits [R, V] and the
examples [R] the rows belong to, and for a positional graph its groups' positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from interp.analysis.circuits.graph import Graph, build_graph
from interp.analysis.circuits.passes import edge_pass
from interp.analysis.circuits.positional import check_positional_pair
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


def check_setup(model, clean: Batch, corrupt: Batch, metric: str = "logit_diff", graph: Graph | None = None,
                answer: str | None = None) -> tuple[Graph, torch.Tensor]:
    """(the graph, answer positions at [N]) of a pair checked as `setup` checks it (no model run)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}; got {metric!r}")
    check_pair(clean, corrupt)
    graph = build_graph(model) if graph is None else graph
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be an interp.analysis.circuits.Graph or None; got {type(graph).__name__}")
    at = answer_positions(clean, answer, "clean")
    corrupt_at = answer_positions(corrupt, answer, "corrupt")
    if not torch.equal(at, corrupt_at):
        i = int(torch.nonzero(at != corrupt_at)[0, 0])
        raise ValueError(f"clean and corrupt must have their answers at the same positions (edges join equal "
                         f"positions); pair {i} has its clean answer at position {int(at[i])} and its corrupted answer "
                         f"at {int(corrupt_at[i])} (prompts of different lengths align by role only: interchange and "
                         "attribute at role sites)")
    return graph, at


def setup(model, clean: Batch, corrupt: Batch, metric: str = "logit_diff", graph: Graph | None = None,
          answer: str | None = None, corrupt_pass=None) -> Setup:
    """Check the pair, run it once each (no gradient) and fix the metric (module docstring).
    corrupt_pass(graph, tokens, at) -> (logits, acts) runs the corrupted tokens instead (EAP's
    forward with the receivers' leaves, so that the corrupted run is not run twice)."""
    graph, at = check_setup(model, clean, corrupt, metric, graph, answer)
    masks = None if graph.base is None else check_positional_pair(clean, corrupt, graph.positions)
    device = next(model.parameters()).device
    with torch.no_grad():
        clean_logits, clean_acts = edge_pass(model, graph.pass_graph, clean.tokens.to(device), at.to(device), _none)
        if corrupt_pass is None:
            corrupt_logits, corrupt_acts = edge_pass(model, graph.pass_graph, corrupt.tokens.to(device),
                                                     at.to(device), _none)
    if corrupt_pass is not None:
        corrupt_logits, corrupt_acts = corrupt_pass(graph.pass_graph, corrupt.tokens.to(device), at.to(device))
    y = clean.targets[torch.arange(len(clean)), at].to(device)  # [N] the clean answers
    rival = rival_answers(corrupt, corrupt_logits.double().cpu(), y.cpu(), at).to(device)
    clean_logp = clean_logits.double().log_softmax(-1) if metric == "kl" else None  # [N, V]
    fn = AnswerMetric(metric, y, rival, clean_logp)
    rows = torch.arange(len(clean), device=device)
    return Setup(graph, clean, corrupt, at.to(device), metric, fn, _detached(clean_acts), _detached(corrupt_acts),
                 fn(clean_logits, rows).detach().cpu(), fn(corrupt_logits, rows).detach().cpu(), y.cpu(), rival.cpu(),
                 masks)


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
