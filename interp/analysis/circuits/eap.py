"""Edge attribution patching (EAP) and its integrated-gradients form (EAP-IG).

For an edge u -> r (sender u, receiver r; interp.analysis.circuits.graph), patching the corrupted
run so that only r reads u's clean output changes the metric by about

    score[u -> r, b] = sum over positions t of (a_u,clean[b, t] - a_u,corrupt[b, t]) . g_r[b, t]

g_r = d metric_b / d x_r at the corrupted run, x_r the receiver's own copy of the residual stream
(before its norm: a zero leaf added to it, interp.analysis.circuits.passes). One clean forward,
one corrupted forward with every receiver's leaf, one backward give every edge's score; the
logits receiver reads the answer position only. `per_position=True` also keeps the terms per t.

EAP-IG (Hanna et al. 2024) replaces g_r by its mean along the straight path between the
corrupted and the clean input embeddings, at the k midpoints alpha_j = (j + 1/2) / k:

    g_r <- (1/k) sum_j g_r(hook_embed = e_corrupt + alpha_j (e_clean - e_corrupt))

the k steps run as one batch of k N rows (in passes of at most `rows` rows). The scores into
every receiver from the embedding then sum to about metric(clean) - metric(corrupt) (completeness).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from interp.analysis.circuits.graph import Graph
from interp.analysis.circuits.metrics import Setup, setup
from interp.analysis.circuits.passes import edge_pass, sender_value
from interp.tasks.base import Batch
from models.memory import progress_bar


@dataclass
class EdgeScores:
    """Scores of every edge of `graph`: per_example [E, N] float64 and their mean `scores` [E];
    per_position [E, T] (mean over examples) when asked for. method "eap", "eap-ig" or "exact";
    setup: the pair and metric they were computed for."""

    graph: Graph
    per_example: torch.Tensor
    method: str
    setup: Setup
    per_position: torch.Tensor | None = None

    @property
    def scores(self) -> torch.Tensor:
        return self.per_example.mean(1)

    def top(self, n: int = 10) -> list[tuple[str, float]]:
        """The n edges of largest |score|, as (name, score)."""
        order = self.scores.abs().argsort(descending=True)[:n].tolist()
        names = self.graph.edge_names()
        return [(names[i], float(self.scores[i])) for i in order]

    def __repr__(self) -> str:
        return f"EdgeScores({self.method}, {self.graph.n_edges} edges x {self.per_example.shape[1]} examples)"


def eap(model, clean: Batch, corrupt: Batch, metric: str = "logit_diff", graph: Graph | None = None,
        answer: str | None = None, per_position: bool = False) -> EdgeScores:
    """EAP scores of every edge (module docstring). metric: "prob", "logit_diff" or "kl"
    (interp.analysis.circuits.metrics); answer: a role naming the answer position (default the last
    loss_mask position)."""
    pair = setup(model, clean, corrupt, metric, graph, answer)
    grads = _receiver_grads(model, pair, pair.corrupt.tokens, None, 1)
    return _scores(pair, grads, "eap", per_position)


def eap_ig(model, clean: Batch, corrupt: Batch, steps: int = 8, metric: str = "logit_diff",
           graph: Graph | None = None, answer: str | None = None, per_position: bool = False,
           rows: int | None = None, progress: bool = True) -> EdgeScores:
    """EAP-IG scores with `steps` interpolation steps (module docstring); rows: the most rows
    (step, example) per pass (default every step at once). progress: a bar over the passes."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1; got {steps!r}")
    pair = setup(model, clean, corrupt, metric, graph, answer)
    n = len(clean)
    per_pass = steps if rows is None else max(1, int(rows) // n)
    alphas = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps
    total: dict[int, torch.Tensor] = {}
    chunks = list(alphas.split(per_pass))
    with progress_bar(len(chunks), progress, desc="eap-ig", unit="pass") as bar:
        for chunk in chunks:
            for r, g in _receiver_grads(model, pair, pair.corrupt.tokens, chunk, len(chunk)).items():
                g = g.view(len(chunk), n, *g.shape[1:]).sum(0)
                total[r] = g if r not in total else total[r] + g
            bar.update(1)
    return _scores(pair, {r: g / steps for r, g in total.items()}, "eap-ig", per_position)


def _receiver_grads(model, pair: Setup, tokens: torch.Tensor, alphas: torch.Tensor | None,
                    copies: int) -> dict[int, torch.Tensor]:
    """{receiver: d (sum of the metric over rows) / d x_r [copies N, T, D]} at `tokens` repeated
    `copies` times, the embedding interpolated by alphas [copies] when given."""
    n = len(tokens)
    tokens = tokens.repeat(copies, 1)
    at = pair.at.repeat(copies)
    examples = torch.arange(n, device=at.device).repeat(copies)
    leaves: dict[int, torch.Tensor] = {}

    def delta_of(r, x, current):
        leaves[r] = torch.zeros_like(x, requires_grad=True)
        return leaves[r]

    hooks = []
    if alphas is not None:
        clean_e, corrupt_e = pair.clean_acts["hook_embed"], pair.corrupt_acts["hook_embed"]
        weights = alphas.to(clean_e).repeat_interleave(n)[:, None, None]  # [copies N, 1, 1]
        path = corrupt_e.repeat(copies, 1, 1) + weights * (clean_e - corrupt_e).repeat(copies, 1, 1)
        hooks = [("hook_embed", lambda x, hook: path.to(x))]
    with torch.enable_grad():
        logits, _ = edge_pass(model, pair.graph, tokens, at, delta_of, hooks)
        value = pair.metric(logits, examples).sum()
        order = sorted(leaves)
        grads = torch.autograd.grad(value, [leaves[r] for r in order], allow_unused=True)
    return {r: (torch.zeros_like(leaves[r]) if g is None else g).detach() for r, g in zip(order, grads)}


def _scores(pair: Setup, grads: dict[int, torch.Tensor], method: str, per_position: bool) -> EdgeScores:
    """Per edge (clean - corrupt) . g_r, summed over positions (and kept per position)."""
    graph = pair.graph
    n, length = pair.clean.tokens.shape
    per_example = torch.zeros(graph.n_edges, n, dtype=torch.float64)
    positions = torch.zeros(graph.n_edges, length, dtype=torch.float64) if per_position else None
    for r, receiver in enumerate(graph.receivers):
        edges = graph.incoming(r)
        if not len(edges):
            continue
        at = pair.at if receiver.site == "logits" else None
        senders = [graph.senders[s] for s in graph.edges[edges, 0].tolist()]
        diff = torch.stack([sender_value(s, pair.clean_acts, at) - sender_value(s, pair.corrupt_acts, at)
                            for s in senders])  # [U, N, T or 1, D]
        terms = torch.einsum("untd,ntd->unt", diff.double(), grads[r].double())  # [U, N, T or 1]
        per_example[edges] = terms.sum(2).cpu()
        if positions is not None:
            if at is None:
                positions[edges] = terms.mean(1).cpu()
            else:  # the answer position of each example
                positions[edges] = _at_positions(terms[:, :, 0], pair.at, length)
    return EdgeScores(graph, per_example, method, pair, positions)


def _at_positions(values: torch.Tensor, at: torch.Tensor, length: int) -> torch.Tensor:
    """[U, N] values each at its example's position at [N] -> [U, T] mean over examples."""
    out = torch.zeros(values.shape[0], length, dtype=torch.float64, device=values.device)
    out.index_add_(1, at, values.double())
    return out.cpu() / values.shape[1]
