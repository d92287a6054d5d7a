"""Edge attribution patching (EAP) and its integrated-gradients form (EAP-IG).

For an edge u -> r (sender u, receiver r; interp.analysis.circuits.graph), patching the corrupted
run so that only r reads u's clean output changes the metric by about

    score[u -> r, b] = sum over positions t of (a_u,clean[b, t] - a_u,corrupt[b, t]) . g_r[b, t]

g_r = d metric_b / d x_r at the corrupted run, x_r the receiver's own copy of the residual stream
(before its norm: a zero leaf added to it, interp.analysis.circuits.passes). One clean forward,
one corrupted forward with every receiver's leaf, one backward give every edge's score; the
logits receiver reads the answer position only. `per_position=True` also keeps the terms per
example and position t ([E, N, T]: where on the residual stream the edge carries its effect).

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
from interp.analysis.circuits.positional import fold
from interp.tasks.base import Batch
from models.memory import budget_bytes, progress_bar, rows_that_fit

ACTIVATIONS_PER_LAYER = 40  # d_model-wide activations one block keeps per position for the backward (rough)


@dataclass
class EdgeScores:
    """Scores of every edge of `graph`: per_example [E, N] float64 and their mean `scores` [E];
    per_position [E, N, T] (per_example split over the positions the sender wrote at) when asked for. method "eap", "eap-ig" or "exact";
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
    if getattr(graph, "base", None) is not None:  # positional: the base graph's per-position scores, folded
        return fold(eap(model, clean, corrupt, metric=metric, graph=graph.base, answer=answer, per_position=True),
                    graph, per_position)
    pair = setup(model, clean, corrupt, metric, graph, answer)
    grads = _receiver_grads(model, pair, pair.corrupt.tokens, None, 1)
    return _scores(pair, grads, "eap", per_position)


def eap_ig(model, clean: Batch, corrupt: Batch, steps: int = 8, metric: str = "logit_diff",
           graph: Graph | None = None, answer: str | None = None, per_position: bool = False,
           rows: int | None = None, max_memory: int | float | str | None = None,
           progress: bool = True) -> EdgeScores:
    """EAP-IG scores with `steps` interpolation steps (module docstring); rows: the most rows
    (step, example) per pass (default: as many steps per pass as fit in max_memory,
    models.memory.budget_bytes, estimated by `row_bytes`; MemoryRefused when one step of every
    example does not fit). progress: a bar over the passes."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1; got {steps!r}")
    if getattr(graph, "base", None) is not None:  # positional: the base graph's per-position scores, folded
        return fold(eap_ig(model, clean, corrupt, steps=steps, metric=metric, graph=graph.base, answer=answer,
                           per_position=True, rows=rows, max_memory=max_memory, progress=progress), graph, per_position)
    pair = setup(model, clean, corrupt, metric, graph, answer)
    n, length = clean.tokens.shape
    if rows is None:
        per_row = row_bytes(model, pair.graph, length)
        rows = n * rows_that_fit(n * per_row, budget_bytes(max_memory), steps, f"eap_ig over N={n}, T={length}",
                                 hint="pass fewer examples or a larger max_memory")
    per_pass = max(1, int(rows) // n)
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


def row_bytes(model, graph: Graph, length: int) -> float:
    """Estimated bytes of one example row of a gradient pass: per position, each receiver's leaf
    and gradient, each slot's copy of the stream and its norm (and, inside a recurrent mixer,
    about 4 d_model more), every per-head sender output, and the blocks' own activations."""
    width = model.cfg.d_model
    item = next(model.parameters()).element_size()
    slots = sum(2 + (0 if r.slots[0][0].endswith(("hook_q", "hook_k", "hook_v")) else 4)
                for r in graph.receivers if r.slots)
    heads = sum(1 for s in graph.senders if s.head is not None)
    per_position = 2 * len(graph.receivers) + slots + heads + ACTIVATIONS_PER_LAYER * graph.n_layers
    return float(length * width * item * per_position)


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
    """Per edge (clean - corrupt) . g_r, summed over positions (and kept per position): for each
    group of receivers with the same senders (one block's mixer inputs, its MLP, the logits), one
    batched product [N, U, T D] x [N, T D, R]."""
    graph = pair.graph
    n, length = pair.clean.tokens.shape
    per_example = torch.zeros(graph.n_edges, n, dtype=torch.float64)
    positions = torch.zeros(graph.n_edges, n, length, dtype=torch.float64) if per_position else None
    groups: dict[tuple, list[int]] = {}
    for r in range(len(graph.receivers)):
        senders = tuple(graph.edges[graph.incoming(r), 0].tolist())
        if senders:
            groups.setdefault((graph.receivers[r].site == "logits", senders), []).append(r)
    for (logits, senders), receivers in groups.items():
        at = pair.at if logits else None
        diff = torch.stack([sender_value(graph.senders[s], pair.clean_acts, at)
                            - sender_value(graph.senders[s], pair.corrupt_acts, at) for s in senders])  # [U, N, t, D]
        grad = torch.stack([grads[r] for r in receivers]).to(diff)  # [R, N, t, D]
        products = torch.bmm(diff.transpose(0, 1).flatten(2), grad.permute(1, 2, 3, 0).flatten(1, 2))  # [N, U, R]
        for j, r in enumerate(receivers):
            edges = graph.incoming(r)
            per_example[edges] = products[:, :, j].T.double().cpu()
            if positions is not None:
                terms = torch.einsum("untd,ntd->unt", diff.double(), grad[j].double()).cpu()  # [U, N, t]
                if logits:  # the answer position of each example
                    positions[edges[:, None], torch.arange(n)[None], pair.at.cpu()[None]] = terms[:, :, 0]
                else:
                    positions[edges] = terms
    return EdgeScores(graph, per_example, method, pair, positions)
