"""Edge attribution patching (EAP) and its integrated-gradients form (EAP-IG).

For an edge u -> r (sender u, receiver r; interp.analysis.circuits.graph), patching the corrupted
run so that only r reads u's clean output changes the metric by about

    score[u -> r, b] = sum over positions t of (a_u,clean[b, t] - a_u,corrupt[b, t]) . g_r[b, t]

g_r = d metric_b / d x_r at the corrupted run, x_r the receiver's own copy of the residual stream
(before its norm). A clean forward and one corrupted forward and backward give every edge's
score: the corrupted run is the pass with the receivers' leaves (interp.analysis.circuits.
gradients: g_r by the rows of a mixer's input maps where it has them, else by a zero leaf in the
receiver's own copy), and the scores of each group of receivers with the same senders are one
batched product with the senders' differences. The logits receiver reads the
answer position only. `per_position=True` also keeps the terms per example and position t
([E, N, T]: where on the residual stream the edge carries its effect).

EAP-IG (Hanna et al. 2024) replaces g_r by its mean along the straight path between the
corrupted and the clean input embeddings, at the k midpoints alpha_j = (j + 1/2) / k:

    g_r <- (1/k) sum_j g_r(hook_embed = e_corrupt + alpha_j (e_clean - e_corrupt))

the k steps run as one batch of k N rows (in passes of at most `rows` rows; each pass's products
are added up, so only one pass's gradients are held). The scores into
every receiver from the embedding then sum to about metric(clean) - metric(corrupt) (completeness).

Units (executor=, out=, chunk=; interp.analysis.units, interp.analysis.circuits.units): a unit is a
chunk of `chunk` examples (default UNIT_PROMPTS = 64), scored by the in-process code on its own
(`prompt_unit`: its Setup, its gradient passes); per_example [E, N] (per_position [E, N, T]) and
the Setup are concatenated along the examples. EAP-IG's rows per pass are resolved once in the
driver (from max_memory, for the largest unit) and pinned. A positional graph runs its base graph
per position and is folded after merging.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from interp.analysis.circuits.gradients import Gradients, LeafPass, fast_receivers
from interp.analysis.circuits.graph import Graph, block_mixers
from interp.analysis.circuits.metrics import Setup, check_setup, setup
from interp.analysis.circuits.passes import sender_value
from interp.analysis.circuits.positional import fold, gather_positions
from interp.analysis.circuits.units import UNIT_PROMPTS, cat_units, check_chunk, chunked, span_units
from interp.analysis.units import UnitWork, one_thread_unit, run_units
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
        answer: str | None = None, per_position: bool = False, executor=None, out=None,
        chunk: int | None = None, progress: bool = True, groups=None) -> EdgeScores:
    """EAP scores of every edge (module docstring). metric: "prob", "logit_diff" or "kl"
    (interp.analysis.circuits.metrics); answer: a role naming the answer position (default the last
    loss_mask position). executor, out, chunk: run as units of `chunk` examples (module docstring;
    the result is a function of the inputs and the chunk alone, on any executor); without any of
    them, one run as before. progress: a bar over the units (none without units). groups: align
    the pair by these position groups (set by a positional graph for the run of its base graph:
    interp.analysis.circuits.positional)."""
    if chunked(executor, out, chunk):
        options = dict(method="eap", metric=metric, answer=answer, per_position=per_position)
        return prompt_grid(model, clean, corrupt, graph, options, None, chunk, executor, out, progress)
    if getattr(graph, "base", None) is not None:  # positional: the base graph's per-position scores, folded
        return fold(eap(model, clean, corrupt, metric=metric, graph=graph.base, answer=answer, per_position=True,
                        groups=graph.positions), graph, per_position)
    runs: list[LeafPass] = []

    def corrupt_pass(pass_graph: Graph, tokens: torch.Tensor, at: torch.Tensor):  # the leaves' pass
        runs.append(LeafPass(model, pass_graph, tokens, at))
        return runs[0].logits, runs[0].acts

    pair = setup(model, clean, corrupt, metric, graph, answer, corrupt_pass=corrupt_pass, groups=groups)
    examples = torch.arange(len(pair.at), device=pair.at.device)
    scorer = _Scorer(pair, per_position)
    scorer.add(runs[0].gradients(pair.metric(runs[0].logits, examples).sum()), 1)
    return scorer.scores("eap")


def eap_ig(model, clean: Batch, corrupt: Batch, steps: int = 8, metric: str = "logit_diff",
           graph: Graph | None = None, answer: str | None = None, per_position: bool = False,
           rows: int | None = None, max_memory: int | float | str | None = None,
           progress: bool = True, executor=None, out=None, chunk: int | None = None, groups=None) -> EdgeScores:
    """EAP-IG scores with `steps` interpolation steps (module docstring); rows: the most rows
    (step, example) per pass (default: as many steps per pass as fit in max_memory,
    models.memory.budget_bytes, estimated by `row_bytes`; MemoryRefused when one step of every
    example does not fit). progress: a bar over the passes (over the units of a grid).
    executor, out, chunk: as eap's (rows resolved for the largest unit, pinned in out); groups: as
    eap's."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1; got {steps!r}")
    if chunked(executor, out, chunk):
        options = dict(method="eap-ig", metric=metric, answer=answer, per_position=per_position, steps=steps,
                       rows=rows, max_memory=max_memory)
        return prompt_grid(model, clean, corrupt, graph, options, rows, chunk, executor, out, progress)
    if getattr(graph, "base", None) is not None:  # positional: the base graph's per-position scores, folded
        return fold(eap_ig(model, clean, corrupt, steps=steps, metric=metric, graph=graph.base, answer=answer,
                           per_position=True, rows=rows, max_memory=max_memory, progress=progress, groups=graph.positions),
                    graph, per_position)
    pair = setup(model, clean, corrupt, metric, graph, answer, groups=groups)
    n, length = clean.tokens.shape
    if rows is None:
        rows = resolve_rows(model, pair.graph, n, length, steps, max_memory)
    per_pass = max(1, int(rows) // n)
    alphas = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps
    scorer = _Scorer(pair, per_position)
    chunks = list(alphas.split(per_pass))
    with progress_bar(len(chunks), progress, desc="eap-ig", unit="pass") as bar:
        for chunk in chunks:
            scorer.add(_gradients(model, pair, len(chunk), chunk), len(chunk))
            bar.update(1)
    return scorer.scores("eap-ig", steps)


def resolve_rows(model, graph: Graph, n: int, length: int, steps: int, max_memory) -> int:
    """Rows per pass (a multiple of n): as many steps of n examples as fit in max_memory."""
    per_row = row_bytes(model, graph, length)
    return n * rows_that_fit(n * per_row, budget_bytes(max_memory), steps, f"eap_ig over N={n}, T={length}",
                             hint="pass fewer examples or a larger max_memory")


def row_bytes(model, graph: Graph, length: int) -> float:
    """Estimated bytes of one example row of a gradient pass (gradients.LeafPass): per position,
    the blocks' own activations, each map leaf read by map rows and its gradient, each other
    receiver's leaf and gradient, and for a slot receiver without map rows its copy of the stream
    and its norm in the side run (inside a recurrent mixer about 4 d_model more)."""
    width = model.cfg.d_model
    item = next(model.parameters()).element_size()
    fast = fast_receivers(model, graph)
    maps = {(layer, slot, attr) for layer, slot, ranges in fast.values() for attr, _, _ in ranges}
    map_width = sum(getattr(block_mixers(model.blocks[layer])[slot], attr).out_features for layer, slot, attr in maps)
    others = [r for i, r in enumerate(graph.receivers) if i not in fast]
    slots = sum(2 + (0 if r.slots[0][0].endswith(("hook_q", "hook_k", "hook_v")) else 4) for r in others if r.slots)
    per_position = (2 * len(others) + slots + ACTIVATIONS_PER_LAYER * graph.n_layers) * width + 2 * map_width
    return float(length * item * per_position)


def _gradients(model, pair: Setup, copies: int, alphas: torch.Tensor | None) -> Gradients:
    """Every receiver's gradient of the summed metric at the corrupted tokens repeated `copies`
    times, the embedding interpolated by alphas [copies] when given (gradients.LeafPass)."""
    tokens = pair.corrupt.tokens.to(pair.at.device)
    n = len(tokens)
    hooks = []
    if alphas is not None:  # the clean embedding at the corrupted run's positions (joined by role)
        clean_e = gather_positions(pair.clean_acts["hook_embed"], pair.index("corrupt", "clean"))
        corrupt_e = pair.corrupt_acts["hook_embed"]
        weights = alphas.to(clean_e).repeat_interleave(n)[:, None, None]  # [copies N, 1, 1]
        path = corrupt_e.repeat(copies, 1, 1) + weights * (clean_e - corrupt_e).repeat(copies, 1, 1)
        hooks = [("hook_embed", lambda x, hook: path.to(x))]
    at = pair.answer_at("corrupt")
    run = LeafPass(model, pair.graph, tokens.repeat(copies, 1), at.repeat(copies), hooks, capture=False)
    examples = torch.arange(n, device=pair.at.device).repeat(copies)
    return run.gradients(pair.metric(run.logits, examples).sum())


class _Scorer:
    """Per edge (clean - corrupt) . g_r summed over positions (and kept per position), added up
    over gradient passes: for each group of receivers with the same senders (one block's mixer
    inputs, its MLP, the logits), one batched product [N, U, T D] x [N, T D, R] with the senders'
    differences stacked once ([N, U, T D], the senders of a group a prefix of the graph's)."""

    def __init__(self, pair: Setup, per_position: bool) -> None:
        graph = self.graph = pair.graph
        self.pair = pair
        n, length = pair.clean.tokens.shape
        self.per_example = torch.zeros(graph.n_edges, n, dtype=torch.float64)
        self.positions = torch.zeros(graph.n_edges, n, length, dtype=torch.float64) if per_position else None
        self.groups: dict[tuple, list[int]] = {}
        for r in range(len(graph.receivers)):
            senders = tuple(graph.edges[graph.incoming(r), 0].tolist())
            if senders:
                self.groups.setdefault((graph.receivers[r].site == "logits", senders), []).append(r)
        wide = [s for s, sender in enumerate(graph.senders) if sender.channels is None]  # into the stream
        self.index = {s: i for i, s in enumerate(wide)}
        self.diff = torch.stack([self._diff(s, None) for s in wide], 1)  # [N, U, T, D]
        self.diff_at = self.diff[torch.arange(n), :, pair.at.to(self.diff.device)][:, :, None]  # [N, U, 1, D]

    def _diff(self, sender: int, at: torch.Tensor | None) -> torch.Tensor:
        """[N, t, w] clean - corrupt at the clean run's positions (the corrupted values at the
        positions joined to them: interp.analysis.circuits.positional), or at the answers."""
        s, pair = self.graph.senders[sender], self.pair
        if at is not None:
            return sender_value(s, pair.clean_acts, at) - sender_value(s, pair.corrupt_acts, pair.answer_at("corrupt"))
        return sender_value(s, pair.clean_acts) - gather_positions(sender_value(s, pair.corrupt_acts), pair.align)

    def _group_diff(self, senders: tuple, logits: bool) -> torch.Tensor:
        """[N, U, t, w]: a view of the stacked differences where the senders are consecutive there."""
        if not all(s in self.index for s in senders):  # a conv node's channels
            return torch.stack([self._diff(s, self.pair.at if logits else None) for s in senders], 1)
        rows = [self.index[s] for s in senders]
        stacked = self.diff_at if logits else self.diff
        if rows == list(range(rows[0], rows[0] + len(rows))):
            return stacked[:, rows[0]:rows[0] + len(rows)]
        return stacked[:, rows]

    def add(self, grads: Gradients, copies: int) -> None:
        graph, n = self.graph, self.diff.shape[0]
        for (logits, senders), receivers in self.groups.items():
            diff = self._group_diff(senders, logits)  # [N, U, t, w]
            grad = grads.of(receivers, copies).to(diff)  # [R, N, t, w] at the corrupted run's positions
            if not logits:
                grad = gather_positions(grad, self.pair.align, 2)  # at the clean run's
            products = torch.bmm(diff.flatten(2), grad.flatten(2).permute(1, 2, 0))  # [N, U, R]
            wide = diff.double() if self.positions is not None else None
            for j, r in enumerate(receivers):
                edges = graph.incoming(r)
                self.per_example[edges] += products[:, :, j].T.double().cpu()
                if wide is not None:
                    terms = torch.einsum("nutd,ntd->unt", wide, grad[j].double()).cpu()  # [U, N, t]
                    if logits:  # the answer position of each example
                        at = self.pair.at.cpu()[None]
                        self.positions[edges[:, None], torch.arange(n)[None], at] += terms[:, :, 0]
                    else:
                        self.positions[edges] += terms

    def scores(self, method: str, steps: int = 1) -> EdgeScores:
        positions = None if self.positions is None else self.positions / steps
        return EdgeScores(self.graph, self.per_example / steps, method, self.pair, positions)


# ----------------------------------------------------------------------------- units (module docstring)


def prompt_grid(model, clean: Batch, corrupt: Batch, graph: Graph | None, options: dict, rows: int | None,
                chunk, executor, out, progress: bool) -> EdgeScores:
    """EAP / EAP-IG (options["method"]) as units of examples, merged (module docstring)."""
    graph, _ = check_setup(model, clean, corrupt, options["metric"], graph, options["answer"])  # refused here, not in units
    base, groups = graph.pass_graph, graph.positions or None
    size = check_chunk(chunk, len(clean), UNIT_PROMPTS, "examples")
    units = span_units(len(clean), size, "examples")
    wide = options["per_position"] or graph.base is not None  # a positional graph folds base scores per position
    inputs = {**options, "clean": clean, "corrupt": corrupt, "graph": base, "per_position": wide}
    if groups is not None:  # the units' pairs are aligned by the positional graph's groups
        inputs["groups"] = groups
    pinned = {}
    if options["method"] == "eap-ig":  # rows per pass planned once, for the largest unit
        steps, length = options["steps"], clean.tokens.shape[1]
        pinned["rows"] = rows if rows is not None else resolve_rows(model, base, size, length, steps,
                                                                   options["max_memory"])
    work = UnitWork(model, prompt_unit, inputs, name=options["method"],
                    options={**options, "chunk": size, "positions": list(graph.positions)}, pinned=pinned)
    results = run_units(work, units, executor=executor, out=out, progress=progress)
    with one_thread_unit():   # the Setup once, here: unit files and transfers carry scores only
        pair = setup(model, clean, corrupt, options["metric"], base, options["answer"], groups=groups)
    per_position = cat_units(units, results, "per_position", 1) if wide else None  # [E, N, T]
    scores = EdgeScores(base, cat_units(units, results, "per_example", 1), options["method"], pair, per_position)
    return scores if graph.base is None else fold(scores, graph, options["per_position"])


def prompt_unit(model, inputs: dict, spec: dict) -> dict[str, torch.Tensor]:
    """One unit: EAP or EAP-IG scores of its examples (a worker runs this)."""
    part = slice(*spec["examples"])
    clean, corrupt = inputs["clean"].select(part), inputs["corrupt"].select(part)
    common = dict(metric=inputs["metric"], graph=inputs["graph"], answer=inputs["answer"],
                  per_position=inputs["per_position"], groups=inputs.get("groups"))
    with torch.enable_grad():
        if inputs["method"] == "eap":
            scores = eap(model, clean, corrupt, **common)
        else:
            scores = eap_ig(model, clean, corrupt, steps=inputs["steps"], rows=inputs["rows"], progress=False, **common)
    out = {"per_example": scores.per_example}  # [E, n]
    if scores.per_position is not None:
        out["per_position"] = scores.per_position  # [E, n, T]
    return out
