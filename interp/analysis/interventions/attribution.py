"""Attribution patching: the first-order estimate of every interchange at once.

For a site s (hook, position, head, subspace) and example b, patching the corrupted run with the
clean activation changes the clean answer's probability by about

    dp[s, b] = sum over the site's positions (and head, features) of
               (a_clean[b] - a_corrupt[b]) * d p_b(y_b) / d a   at the corrupted run

(a subspace site projects the difference on span(P) first). From one clean forward (activations),
one corrupted forward and one backward (`run_with_cache(incl_bwd=True)`: d p / d a for every hook
at once; for `hook_state` the total derivative through the recurrence, so the estimate is that of
the causal state patch). The estimates come back as an `InterchangeResult` over the same sites and
examples as `interchange`, p_patched = p_corrupt + dp, restoration from it, so the two line up row
by row. The runs take each mixer's own path (the fast one unless a hook needs per-step states),
and the products are formed per hook over every position at once, not per site. `metrics=`
("logit_diff", "kl") estimates interchange's other per-pair numbers the same way, one more
corrupted forward and backward each. `agreement(exact, estimate)` scores the estimates against
interchange's exact values on the same grid (Pearson r over pairs and over site means, top-k recall).

Units (executor=, out=, chunk=; interp.analysis.units): a unit is a chunk of `chunk` examples
(default UNIT_EXAMPLES = 256) over every site, estimated by the in-process code on its own
(`attribution_unit`: its runs planned to the budget resolved once in the driver and pinned); the
per-example estimates ([S, n] and [n]) are concatenated along the examples.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import torch

from interp.analysis.interventions.interchange import EXTRA_METRICS, InterchangeResult, restoration
from interp.analysis.interventions.patching import probs_at, time_first
from interp.analysis.interventions.planning import (HINT, READ_OUT_FLOATS, LazyStates, block_input, block_inputs,
                                                    describe, footprint, is_state, layer_of, logits_at, reading_at,
                                                    takes_at)
from interp.analysis.interventions.sites import (Site, answer_positions, check_aligned, check_pair, check_sites,
                                                 rival_answers, site_positions)
from interp.analysis.units import Unit, UnitWork, chunks, run_units
from interp.tasks.base import Batch
from models.memory import budget_bytes, progress_bar, rows_that_fit

GRAPH_FACTOR = 1.0  # a forward's graph for the backward: its blocks' activations, the kernels' saved tensors
UNIT_EXAMPLES = 256  # examples per unit (default chunk)
# an InterchangeResult's tensors, examples last: [S, n] per pair, [n] per example
RESULT_TENSORS = ("restoration", "p_patched", "p_clean", "p_corrupt", "kept", "logit_diff_patched", "logit_diff_clean",
                  "logit_diff_corrupt", "kl_patched", "kl_corrupt")


def attribute(
    model,
    clean: Batch,
    corrupt: Batch,
    sites: Sequence[Site],
    min_effect: float = 0.01,
    answer: str | None = None,
    metrics: Sequence[str] = (),
    max_memory: int | float | str | None = None,
    progress: bool = True,
    executor=None,
    out=None,
    chunk: int | None = None,
) -> InterchangeResult:
    """Attribution-patching estimates of interchange(model, clean, corrupt, sites) (module docstring).

    metrics: also estimate interchange's "logit_diff" (logit(y) - logit(y'), y' as interchange
    takes it) and / or "kl" (KL(p_clean || p_patched)) to first order the same way, each from
    one more corrupted forward and backward (their gradients at the corrupted run). The logit
    difference is nearer linear in the activations than a saturating probability, so its
    estimates usually track the exact values more closely (benchmarks/RESULTS.md).
    max_memory: the budget (models.memory.budget_bytes; default half the memory available now).
    Every run reads its logits at the answer position only ([N, V]); the planner (`plan_groups`)
    splits the hooks into groups, and the examples into chunks where one example's run does not
    fit beside a hook, so that each group's corrupted forward and backward fit beside the clean
    activations of its examples (one clean forward per chunk of examples, the states recomputed
    per block on demand);
    models.memory.MemoryRefused, one line naming the hooks, the estimate and the budget, before
    any work when one example with one hook does not fit. progress: a bar over the groups (over
    the units of a grid).
    executor, out, chunk: run as units of `chunk` examples (module docstring) on `executor` (None:
    here; else an executor of interp.sweep.executors), each finished unit kept in `out`; the
    result is a function of the inputs and the chunk alone. Without any of them, one run as before.
    """
    if isinstance(min_effect, bool) or not isinstance(min_effect, (int, float)) or min_effect < 0:
        raise ValueError(f"min_effect must be a float >= 0; got {min_effect!r}")
    if isinstance(metrics, str) or any(m not in EXTRA_METRICS for m in metrics):
        raise ValueError(f"metrics must be a list of {EXTRA_METRICS}; got {metrics!r}")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool; got {progress!r}")
    check_pair(clean, corrupt)
    sites = check_sites(model, sites)
    check_aligned(clean, corrupt, sites, answer)
    if executor is not None or out is not None or chunk is not None:
        options = dict(min_effect=float(min_effect), answer=answer, metrics=list(metrics))
        return attribution_grid(model, clean, corrupt, sites, options, max_memory, chunk, executor, out, progress)
    hooks = sorted({s.hook for s in sites})
    clean_ans = answer_positions(clean, answer, "clean")
    corrupt_ans = answer_positions(corrupt, answer, "corrupt")
    rows = torch.arange(len(clean))
    y = clean.targets[rows, clean_ans]  # [N] the clean answer tokens
    chunks = plan_groups(model, clean.tokens, hooks, budget_bytes(max_memory))
    with torch.no_grad():
        clean_at = _answer_logits(model, clean.tokens, clean_ans, chunks)  # [N, V]
        corrupt_at = _answer_logits(model, corrupt.tokens, corrupt_ans, chunks)

    def answer_mass(logits: torch.Tensor, ex: torch.Tensor) -> torch.Tensor:  # sum_b p_b(y_b), logits [R, V]
        return logits.softmax(-1)[torch.arange(len(ex)), y[ex]].sum()

    runs = [answer_mass]
    clean_at, corrupt_at = clean_at.double(), corrupt_at.double()
    rival = rival_answers(corrupt, corrupt_at, y, corrupt_ans)  # [N]
    clean_logp = clean_at.log_softmax(-1)  # [N, V]

    def logit_diff(logits: torch.Tensor, ex: torch.Tensor) -> torch.Tensor:  # sum_b logit(y_b) - logit(y'_b)
        at = torch.arange(len(ex))
        return (logits[at, y[ex]] - logits[at, rival[ex]]).sum()

    def kl(logits: torch.Tensor, ex: torch.Tensor) -> torch.Tensor:  # sum_b KL(p_clean,b || p_b)
        logp = logits.double().log_softmax(-1)
        return (clean_logp[ex].exp() * (clean_logp[ex] - logp)).sum()

    runs += [{"logit_diff": logit_diff, "kl": kl}[m] for m in EXTRA_METRICS if m in metrics]
    with progress_bar(len(chunks) * len(runs), progress, desc="attribution", unit="group") as bar:
        deltas = [_estimates(model, sites, chunks, clean, corrupt, (clean_ans, corrupt_ans), metric, bar)
                  for metric in runs]
    p_clean, p_corrupt = probs_at(clean_at, y), probs_at(corrupt_at, y)
    p_estimate = p_corrupt + deltas.pop(0)
    values, kept = restoration(p_estimate, p_clean, p_corrupt, float(min_effect))
    identical = (clean.tokens == corrupt.tokens).all(1)  # p_clean = p_corrupt by construction, as interchange
    values[:, identical], kept = 1.0, kept | identical
    result = InterchangeResult(sites, values, p_estimate, p_clean, p_corrupt, kept, float(min_effect))
    if "logit_diff" in metrics:
        result.logit_diff_clean = (clean_at[rows, y] - clean_at[rows, rival]).cpu()
        result.logit_diff_corrupt = (corrupt_at[rows, y] - corrupt_at[rows, rival]).cpu()
        result.logit_diff_patched = result.logit_diff_corrupt + deltas.pop(0)
    if "kl" in metrics:
        result.kl_corrupt = (clean_logp.exp() * (clean_logp - corrupt_at.log_softmax(-1))).sum(-1).cpu()
        result.kl_patched = result.kl_corrupt + deltas.pop(0)
    return result


def attribution_grid(model, clean: Batch, corrupt: Batch, sites: list[Site], options: dict, max_memory, chunk,
                     executor, out, progress: bool) -> InterchangeResult:
    """attribute as units of examples, merged (module docstring); the budget resolved here once."""
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"chunk must be a positive int (examples per unit); got {chunk!r}")
    size = min(UNIT_EXAMPLES if chunk is None else chunk, len(clean))
    units = [Unit(f"e{a:06d}-{b:06d}", {"examples": [a, b]}) for a, b in chunks(len(clean), size)]
    inputs = {**options, "clean": clean, "corrupt": corrupt, "sites": sites}
    work = UnitWork(model, attribution_unit, inputs, name="attribution",
                    options={**options, "chunk": size, "max_memory": max_memory},
                    pinned={"max_memory": budget_bytes(max_memory)})
    results = run_units(work, units, executor=executor, out=out, progress=progress)
    merged = {name: torch.cat([results[u.key][name] for u in units], -1)  # examples last
              for name in RESULT_TENSORS if name in results[units[0].key]}
    return InterchangeResult(sites, min_effect=options["min_effect"], **merged)


def attribution_unit(model, inputs: dict, spec: dict) -> dict[str, torch.Tensor]:
    """One unit: the estimates of its examples at every site (a worker runs this)."""
    part, device = slice(*spec["examples"]), next(model.parameters()).device
    clean, corrupt = inputs["clean"].select(part).to(device), inputs["corrupt"].select(part).to(device)
    with torch.enable_grad():
        result = attribute(model, clean, corrupt, inputs["sites"],
                           min_effect=inputs["min_effect"], answer=inputs["answer"], metrics=inputs["metrics"],
                           max_memory=inputs["max_memory"], progress=False)
    return {name: getattr(result, name) for name in RESULT_TENSORS if getattr(result, name) is not None}


def plan_groups(model, tokens: torch.Tensor, hooks: list[str], budget: int) -> list[tuple[slice, list[str]]]:
    """[(examples, hooks)]: the runs of one estimate, each a corrupted forward and backward of
    those examples caching those hooks (beside one clean forward per chunk of examples), sized to
    `budget`. A run records its graph from the first block of its hooks on (`grad_from`); one
    example of it holds that graph (GRAPH_FACTOR x the activations of every block from there,
    planning.Footprint.graph_row), its clean cache (every hook but the states, which are
    recomputed per block, planning.LazyStates) and per hook its clean and corrupted activations
    and gradient (3 x [T, ...]; a recurrent state also its per-step graph, 2 x more). All
    examples per run where the first hook fits beside them, else as many as fit; hooks taken in
    block order and packed greedily."""
    fp = footprint(model, tokens)
    n, length = tokens.shape
    hooks = sorted(hooks, key=lambda h: (first_block(model, h), h))
    light = {h for h in hooks if not is_state(h)} | {block_input(h) for h in hooks if is_state(h)}
    clean = fp.cache(light, 1)  # one example's clean cache, held through every run of its chunk

    def graph(hook: str) -> float:  # one example's graph of a run whose first hook is `hook`
        return GRAPH_FACTOR * fp.graph_row(first_block(model, hook)) + clean

    per_hook = {h: length * fp.per_position[h] * (5.0 if is_state(h) else 3.0) for h in hooks}
    what = f"attribution at {describe(hooks)} over N={n}, T={length}"
    rows = rows_that_fit(max(graph(h) + per_hook[h] for h in hooks), budget, n, what, hint=HINT)
    groups: list[list[str]] = [[]]
    for hook in hooks:
        if groups[-1] and sum(per_hook[h] for h in groups[-1]) + per_hook[hook] > budget / rows - graph(groups[-1][0]):
            groups.append([])
        groups[-1].append(hook)
    return [(slice(first, first + rows), group) for first in range(0, n, rows) for group in groups]


def first_block(model, hook: str) -> int:
    """The block from which a run caching `hook` must record its graph: the hook's block;
    0 for hook_embed and other hooks before the blocks; the number of blocks after them."""
    if hook.startswith("blocks."):
        return layer_of(hook)
    after = hook.startswith(("hook_final", "hook_logits", "norm_final"))
    return len(getattr(model, "blocks", ())) if after else 0


@contextlib.contextmanager
def grad_from(model, first: int):
    """Within the context, a forward records the autograd graph from block `first` on only:
    the blocks before it run without one (forward pre-hooks on the model and on that block; the
    block's input becomes a leaf that requires grad). A no-op for first <= 0 or a model without
    blocks. The gradients at block `first` and later are those of the whole graph."""
    blocks = getattr(model, "blocks", None)
    if first <= 0 or blocks is None or first >= len(blocks):
        yield
        return

    def stop(module, args):
        torch.set_grad_enabled(False)

    def start(module, args):
        torch.set_grad_enabled(True)
        return (args[0].detach().requires_grad_(),) + tuple(args[1:])

    handles = [model.register_forward_pre_hook(stop), blocks[first].register_forward_pre_hook(start)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _answer_logits(model, tokens: torch.Tensor, at: torch.Tensor, chunks) -> torch.Tensor:
    """logits [N, V] at positions at [N], in the plan's chunks of examples."""
    spans = list(dict.fromkeys((c.start, c.stop) for c, _ in chunks))
    return torch.cat([logits_at(model, tokens[a:b], at[a:b]) for a, b in spans])


def _estimates(model, sites, chunks, clean: Batch, corrupt: Batch, answers, metric, bar) -> torch.Tensor:
    """The first-order change of metric [S, N] float64 per site and example: per planned run,
    one corrupted forward and backward (d metric / d a of its hooks); one clean forward per chunk
    of examples (`_clean_cache`)."""
    delta = torch.zeros(len(sites), len(clean), dtype=torch.float64)
    clean_cache, cached_for = None, None
    for examples, hooks in chunks:
        ex = torch.arange(len(clean))[examples]
        part_clean, part_corrupt = clean.select(examples), corrupt.select(examples)
        if cached_for != (examples.start, examples.stop):  # one clean run per chunk of examples
            clean_cache, cached_for = None, (examples.start, examples.stop)
            clean_cache = _clean_cache(model, part_clean, sorted({h for e, hs in chunks if e == examples for h in hs}))
        first = min(first_block(model, h) for h in hooks)
        with reading_at(model, part_corrupt.tokens, answers[1][examples]), grad_from(model, first):
            _, cache = model.run_with_cache(part_corrupt.tokens, names=hooks, incl_bwd=True,
                                            metric=lambda logits: metric(_read(model, logits, answers[1][examples]), ex))
        groups: dict[tuple, list[int]] = {}  # sites that read the same features of the same hook
        for i, site in enumerate(sites):
            if site.hook in hooks and site.hook + "_grad" in cache:  # else the metric does not depend on it: 0
                groups.setdefault((site.hook, site.head, id(site.subspace)), []).append(i)
        for ids in groups.values():
            delta[ids, examples] = _group_estimates([sites[i] for i in ids], clean_cache, cache, part_clean, part_corrupt)
        bar.update(1)
    return delta


def _clean_cache(model, clean: Batch, hooks: list[str]) -> LazyStates:
    """The clean activations of every hook of one chunk of examples from one forward: the states
    of a SequenceModel recomputed per block from the cached block input when asked for
    (planning.LazyStates), the others cached."""
    lazy = [h for h in hooks if is_state(h) and hasattr(model, "resume_from")]
    names = sorted({h for h in hooks if h not in lazy}.union(*(block_inputs(model, h) for h in lazy)))
    with torch.no_grad():
        cache = model.run_with_cache(clean.tokens, names=names)[1] if names else {}
    return LazyStates(model, cache, len(clean), lazy)


def _read(model, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """logits [R, V] at the answer: as they come where the model read them there, else picked."""
    return logits if takes_at(model) else logits[torch.arange(len(positions)), positions]


def _features(act: torch.Tensor, site: Site) -> torch.Tensor:
    """The site's features at every position: act [N, T, ...] (time-first) -> [N, T, D] (its head
    selected; on span(P) as coordinates P^T f for a subspace site, P P^T d . g = P^T d . P^T g)."""
    if site.head is not None:
        if act.dim() < 3 or site.head >= act.shape[2]:
            raise ValueError(f"site {site.label}: head {site.head} does not exist; the activation (time-major) "
                             f"has shape {tuple(act.shape)} and heads at axis 2")
        act = act[:, :, site.head]
    flat = act.reshape(*act.shape[:2], -1)
    if site.subspace is None:
        return flat
    if flat.shape[2] != site.subspace.shape[0]:
        raise ValueError(f"site {site.label}: subspace has d={site.subspace.shape[0]} rows but the selected "
                         f"activation has {flat.shape[2]} features (shape {tuple(act.shape[2:])})")
    return flat @ site.subspace.to(device=flat.device, dtype=flat.dtype)


def _dot(diff: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Re(diff . conj(grad)) over the last axis (torch's complex grad is d/dRe + i d/dIm)."""
    return (diff * grad.conj()).real.sum(-1) if diff.is_complex() else (diff * grad).sum(-1)


def _group_estimates(group: list[Site], clean_cache, cache, clean: Batch, corrupt: Batch) -> torch.Tensor:
    """dp [len(group), N] float64 for sites of one hook, head and subspace, all at once.

    Per position t: own[n, t] = (a_clean[n, t] - a_corrupt[n, t]) . grad[n, t]; a site sums it over
    its target positions, except where its clean (source) position differs from the target one.
    """
    site, hook = group[0], group[0].hook
    source = _features(time_first(clean_cache[hook], hook), site)  # [N, T, D]
    target = _features(time_first(cache[hook], hook), site)
    grad = _features(time_first(cache[hook + "_grad"], hook), site)
    own = _dot(source - target, grad)  # [N, T]
    targets = [site_positions(corrupt, s.position, "corrupt") for s in group]  # [N, k] each
    src = torch.cat([site_positions(clean, s.position, "clean") for s in group], 1).to(own.device)  # [N, K]
    tgt = torch.cat(targets, 1).to(own.device)
    owner = torch.cat([torch.full((p.shape[1],), j) for j, p in enumerate(targets)]).to(own.device)  # [K]: site
    terms = own.gather(1, tgt)  # [N, K]
    n, j = torch.nonzero(src != tgt, as_tuple=True)
    if len(n):
        t = tgt[n, j]
        terms[n, j] = _dot(source[n, src[n, j]] - target[n, t], grad[n, t])
    out = torch.zeros(len(group), len(clean), dtype=torch.float64, device=own.device)
    return out.index_add_(0, owner, terms.T.double()).cpu()


def agreement(exact: InterchangeResult, estimate: InterchangeResult, of: str = "restoration",
              top: int | None = None) -> dict:
    """How well `estimate` (attribute) tracks `exact` (interchange) on the same sites and examples.

    of: "restoration" (of p(y)) or "logit_diff_restoration". Over the pairs both keep: r_pairs,
    the Pearson r over every (site, example) pair; r_nonzero, over the pairs where either value is
    nonzero (a site before the corruption is 0 in both), n_nonzero of them; r_site_means, over the
    per-site means; r_site_median, the median over sites of each site's r across examples; recall_top, the fraction of the `top` sites of largest exact mean that are
    among the `top` of largest estimated mean (what a screen that keeps `top` sites finds; default
    min(8, number of sites)).
    NaN where a correlation is undefined (fewer than 3 values or a constant) and recall_top NaN
    where fewer than `top` sites have a mean (no kept example).
    """
    if [s.label for s in exact.sites] != [s.label for s in estimate.sites] or len(exact.kept) != len(estimate.kept):
        raise ValueError("exact and estimate must cover the same sites and examples (attribute and interchange "
                         "called with the same sites, clean and corrupt)")
    if of not in ("restoration", "logit_diff_restoration"):
        raise ValueError(f"of must be 'restoration' or 'logit_diff_restoration'; got {of!r}")
    top = min(8, len(exact.sites)) if top is None else top
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= len(exact.sites):
        raise ValueError(f"top must be an int in [1, {len(exact.sites)}] (the number of sites); got {top!r}")
    kept = (exact.kept & estimate.kept).numpy()
    ex, at = getattr(exact, of)[:, kept].numpy(), getattr(estimate, of)[:, kept].numpy()  # [S, kept]
    nonzero = (ex != 0) | (at != 0)
    ex_means, at_means = _nanmean(ex), _nanmean(at)  # [S]
    ranked = [set(np.argsort(-np.nan_to_num(m, nan=-np.inf), kind="stable")[:top]) for m in (ex_means, at_means)]
    defined = min(np.isfinite(ex_means).sum(), np.isfinite(at_means).sum()) >= top  # else the tops are arbitrary
    per_site = np.array([_pearson(e, a) for e, a in zip(ex, at)])  # [S]
    return {"r_pairs": _pearson(ex.ravel(), at.ravel()), "r_nonzero": _pearson(ex[nonzero], at[nonzero]),
            "n_nonzero": int(nonzero.sum()), "r_site_means": _pearson(ex_means, at_means),
            "r_site_median": float(np.median(per_site[np.isfinite(per_site)])) if np.isfinite(per_site).any()
            else float("nan"),
            "recall_top": len(ranked[0] & ranked[1]) / top if defined else float("nan")}


def _nanmean(values: np.ndarray) -> np.ndarray:
    """Row means over the finite entries [S] (NaN for a row with none), without numpy's warning."""
    finite = np.isfinite(values)
    counts = finite.sum(1)
    sums = np.where(finite, values, 0.0).sum(1)
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    return float(np.corrcoef(a, b)[0, 1]) if len(a) > 2 and a.std() > 0 and b.std() > 0 else float("nan")
