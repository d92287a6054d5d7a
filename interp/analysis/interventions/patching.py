"""The patch engine: one forward hook per hook name, each row of a pass patched at its own site.

Layout: activations are [B, T, ...] with the head axis (if any) third, except `hook_pattern`
and `hook_attn_scores` [B, H, T, T], whose position is the query axis (2) and head axis 1. A hook on `hook_state` that
changes the states is a causal state patch (models.hooks.state.scan_with_state_hook), so patching the
state at a position makes the recurrence continue from the patched state; hook_state sites are
patched by a declared `models.StatePatch` (the same values), which a recurrent mixer runs on its
fast kernels without forming every state. Each (site, example) pair resumes from its site's block
and first position (`model.resume_from`), many pairs per pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

import models
from interp.analysis.interventions.planning import (LazyStates, Planner, is_state, logits_at, reading_at,
                                                    resume_states, takes_at)
from interp.analysis.interventions.sites import (Site, answer_positions, answer_probs, check_aligned, check_pair,
                                                 check_sites, site_positions)
from interp.tasks.base import Batch
from models.memory import progress_bar

HEAD_FIRST = ("hook_pattern", "hook_attn_scores")  # [B, H, T, T]: time (the query) at axis 2


def time_first(act: torch.Tensor, hook: str) -> torch.Tensor:
    """A view with time at axis 1 and heads (if any) at axis 2."""
    return act.transpose(1, 2) if hook.endswith(HEAD_FIRST) else act


def select_site(view: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor, site: Site) -> torch.Tensor:
    """view [R, T, ...] -> [m, k, ...] at rows [m] and positions [m, k] (and the site's head)."""
    if site.head is None:
        return view[rows[:, None], pos]
    if view.dim() < 3 or site.head >= view.shape[2]:
        raise ValueError(
            f"site {site.label}: head {site.head} does not exist; the activation (time-major) has "
            f"shape {tuple(view.shape)} and heads at axis 2"
        )
    return view[rows[:, None], pos, site.head]


def _write(view: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor, site: Site, value: torch.Tensor) -> None:
    if site.head is None:
        view[rows[:, None], pos] = value
    else:
        view[rows[:, None], pos, site.head] = value


def _project(site: Site, current: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """current + P P^T (source - current) on the flattened feature vectors [m, k, d]."""
    if site.subspace is None:
        return source
    m, k = current.shape[:2]
    d = math.prod(current.shape[2:])
    if d != site.subspace.shape[0]:
        raise ValueError(
            f"site {site.label}: subspace has d={site.subspace.shape[0]} rows but the selected "
            f"activation has {d} features (shape {tuple(current.shape[2:])})"
        )
    basis = site.subspace.to(current)
    delta = (source - current).reshape(m, k, d)
    return current + ((delta @ basis) @ basis.T).reshape(current.shape)


# source(site index, example indices [n], current values [m=n, k, ...]) -> new values (a hook_state site
# over several positions: current holds zeros, the shape only; the sources here read its shape only)
Source = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


def _patch_hooks(sites, site_of_row, example_of_row, target_pos, source: Source, end: int) -> list[tuple[str, Callable]]:
    """One forward hook per hook name: row r of the forward (example example_of_row[r]) is
    patched at sites[site_of_row[r]]. site_of_row, example_of_row: [R] int64. The pass covers
    positions < end; an activation with m time steps holds the last m of them (a resumed run,
    `SequenceModel.resume_from`)."""
    by_hook: dict[str, list[int]] = {}
    for s in torch.unique(site_of_row).tolist():
        by_hook.setdefault(sites[s].hook, []).append(s)

    def make(site_ids):
        def patch(act: torch.Tensor, hook) -> torch.Tensor:
            out = act.clone()
            view = time_first(out, hook.name)
            offset = end - view.shape[1]  # the position of the first time step here
            for s in site_ids:
                site = sites[s]
                rows = torch.nonzero(site_of_row == s)[:, 0]
                examples = example_of_row[rows]
                pos = target_pos[s][examples].to(act.device) - offset  # [m, k]
                if bool((pos < 0).any()):
                    raise RuntimeError(f"site {site.label}: a resumed pass starts after the site (internal error)")
                rows = rows.to(act.device)
                current = select_site(view, rows, pos, site)
                new = source(s, examples, current).to(current)
                if new.shape != current.shape:
                    raise ValueError(
                        f"site {site.label}: the source has shape {tuple(new.shape)} but the target "
                        f"activation at the site has shape {tuple(current.shape)}"
                    )
                _write(view, rows, pos, site, _project(site, current, new))
            return out

        return patch

    return [(hook, _state_patch(sites, site_ids, site_of_row, example_of_row, target_pos, source, end)
             if hook.endswith("hook_state") else make(site_ids)) for hook, site_ids in by_hook.items()]


def _state_patch(sites, site_ids, site_of_row, example_of_row, target_pos, source: Source, end: int) -> models.StatePatch:
    """The patch of `_patch_hooks` on a hook_state as a declared StatePatch: one entry per (row,
    site position), times counted from the pass's end (so full and resumed passes alike); its fn
    computes the new states at the entries it is given (with_index: a step's, or all) from the
    current ones as the hook function does (head, subspace). A row patched at several steps (a
    site over several positions) is patched in step order, each step on the state the earlier
    ones left (models.StatePatch)."""
    rows, times, spans = [], [], []  # spans: (site, members [m], its entries' first place, k)
    for s in site_ids:
        members = torch.nonzero(site_of_row == s)[:, 0]  # [m]
        pos = target_pos[s][example_of_row[members]]  # [m, k]
        spans.append((s, members, sum(len(r) for r in rows), pos.shape[1]))
        rows.append(members[:, None].expand_as(pos).reshape(-1))
        times.append((pos - end).reshape(-1))
    sources: dict[int, torch.Tensor] = {}  # site over several positions -> its source [m, k, ...]

    def source_at(s: int, members: torch.Tensor, k: int, place: torch.Tensor, now: torch.Tensor) -> torch.Tensor:
        """The source [n, 1, ...] at the entries place [n] (member * k + position) of site s, now
        [n, 1, ...] their current values: one position a member, from them; else computed once."""
        if k == 1:
            new = source(s, example_of_row[members[place]], now)
        else:
            if s not in sources:
                sources[s] = source(s, example_of_row[members], now.new_zeros(len(members), k, *now.shape[2:]))
            new = sources[s][(place // k).to(now.device), (place % k).to(now.device)][:, None]
        if new.shape != now.shape:
            raise ValueError(f"site {sites[s].label}: the source has shape {tuple(new.shape)} but the target "
                             f"activation at the site has shape {tuple(now.shape)}")
        return new.to(now)

    def fn(current: torch.Tensor, index: torch.Tensor) -> torch.Tensor:  # [n, *S] at the entries index [n]
        out = current.clone()
        for s, members, first, k in spans:
            mine = ((index >= first) & (index < first + len(members) * k)).nonzero()[:, 0]  # in current
            if not len(mine):
                continue
            place = index[mine] - first  # member * k + position
            block = out[mine.to(out.device)][:, None]  # [n_s, 1, *S]
            every = torch.arange(len(mine), device=out.device)
            zero = torch.zeros(len(mine), 1, dtype=torch.long, device=out.device)
            now = select_site(block, every, zero, sites[s])  # [n_s, 1, ...]
            new = source_at(s, members, k, place, now)
            _write(block, every, zero, sites[s], _project(sites[s], now, new))
            out[mine.to(out.device)] = block[:, 0]
        return out

    return models.StatePatch(torch.cat(rows), torch.cat(times), fn=fn, with_index=True)


def _device(model) -> torch.device:
    """Where the model's parameters (or buffers) live; the CPU for a model with neither."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def rows_per_pass(batch_size, n_examples: int) -> int:
    """batch_size checked; None -> max(N, 512) rows (sites are packed when N is small)."""
    if batch_size is None:
        return max(n_examples, 512)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size (rows per forward pass) must be None or a positive int; got {batch_size!r}")
    return batch_size


def patched_answer_probs(
    model,
    target: Batch,
    sites: Sequence[Site],
    source: Source,
    answer_tokens: torch.Tensor,
    answer_pos: torch.Tensor,
    batch_size: int,
    skip: torch.Tensor | None = None,
    unpatched: tuple | None = None,
    resume_cache=None,
    score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    stats: dict | None = None,
    plan: tuple[list, list[int]] | None = None,
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Run `target` with each site patched: (p(answer_tokens) [S, N] float64, argmax ==
    answer_tokens [S, N] bool, scores [S, N, m] float64 or None) at answer_pos.

    score(logits [R, V] at the answer, examples [R]) -> [R, m]: more numbers per pair (unpatched
    then holds a third entry, the [N, m] scores of the unpatched run). stats: a dict that gets
    "run" (pairs run) and "passes" (forward passes).

    The (site, example) pairs are packed into forward passes of up to batch_size rows (row r:
    example b patched at site s), sites of one hook sharing one hook. skip [S, N] bool marks
    pairs whose patch is known to change nothing; they take `unpatched` = (p [N], correct [N]).
    resume_cache: the target run's `model.resume_hooks()` activations (the states may be
    `StatesAt`, see planning.resume_states); with it a pair at a block site runs from its block
    and first position on (`SequenceModel.resume_from`), up to its last site or answer
    position; pairs are grouped into passes by (block, hook, first position). Pairs whose site
    lies after the answer must then be in `skip` (they cannot be resumed). plan: (groups, rows
    per pass of each group) as `_resume_groups` gives them, chosen by the caller (patch_from's
    planner); default the groups with batch_size rows. Every pass reads the logits at the
    answer position only ([R, V], `SequenceModel.read_out`). progress: a bar over the pairs.
    """
    batch_size = rows_per_pass(batch_size, len(target))
    n_sites, n_total = len(sites), len(target)
    target_pos = [site_positions(target, site.position, "target") for site in sites]
    device = _device(model)
    probs = torch.empty(n_sites, n_total, dtype=torch.float64)
    correct = torch.empty(n_sites, n_total, dtype=torch.bool)
    scores = None
    if skip is not None:
        probs[:] = unpatched[0]
        correct[:] = unpatched[1]
    if score is not None:
        scores = torch.empty(n_sites, n_total, unpatched[2].shape[1], dtype=torch.float64)
        scores[:] = unpatched[2]
    passes = 0
    todo = torch.ones(n_sites, n_total, dtype=torch.bool) if skip is None else ~skip
    pairs = torch.nonzero(todo)  # [P, 2] (site, example), site-major
    if plan is None:
        groups = _resume_groups(pairs, sites, target_pos, answer_pos, merge=merge_row_positions(model)) if resume_cache is not None else [(None, 0, pairs)]
        plan = (groups, [batch_size] * len(groups))
    length = target.tokens.shape[1]
    with torch.no_grad(), progress_bar(len(pairs), progress, desc="interchange", unit="pair") as bar:
        for (layer, start, group), size in zip(*plan):
            for first in range(0, len(group), size):
                site_of_row, example_of_row = group[first : first + size].unbind(1)
                end = length if layer is None else _pass_end(site_of_row, example_of_row, target_pos, answer_pos)
                for hook in {sites[s].hook for s in torch.unique(site_of_row).tolist()}:
                    getattr(source, "prefetch", lambda _: None)(hook)  # a lazy source computes outside the pass
                hooks = _patch_hooks(sites, site_of_row, example_of_row, target_pos, source, end)
                at = answer_pos[example_of_row].to(device)
                if layer is None:
                    at_answer = logits_at(model, target.tokens[example_of_row].to(device), at, model.run_with_hooks,
                                          fwd_hooks=hooks)
                else:  # only the mixers whose per-step hooks are patched take the instrumented path
                    with models.instrumented(False), model.hooks(hooks):
                        at_answer = model.resume_from(resume_cache, example_of_row.to(device), layer, start, end, at=at)
                passes += 1
                want = answer_tokens[example_of_row]
                probs[site_of_row, example_of_row] = probs_at(at_answer, want)  # at_answer [R, V]
                correct[site_of_row, example_of_row] = at_answer.argmax(-1).cpu() == want
                if score is not None:
                    scores[site_of_row, example_of_row] = score(at_answer, example_of_row).double().cpu()
                bar.update(len(site_of_row))
    if stats is not None:
        stats.update(run=len(pairs), passes=passes)
    return probs, correct, scores


def probs_at(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """p(tokens[r]) from logits [R, V] at one position per row -> [R] float64."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    return logits.double().softmax(-1)[rows, tokens.to(logits.device)].cpu()


MERGE_ROW_POSITIONS = 256
# ... for models up to this d_model; a row x position costs about d_model^2 while a pass's fixed
# cost (Python, hooks, reading the weights once) grows more slowly, so wider models merge less:
# at d_model 768 (GPT-2 small, Mamba-130m) merging 256 row x positions to save one pass was 1/3
# of a grid's work (every position, N = 8, T = 64).
MERGE_REFERENCE_WIDTH = 64


def merge_row_positions(model) -> float:
    """The merge threshold of `_resume_groups` for this model: MERGE_ROW_POSITIONS up to
    MERGE_REFERENCE_WIDTH, then falling with (MERGE_REFERENCE_WIDTH / d_model)^2."""
    width = getattr(getattr(model, "cfg", None), "d_model", 0) or MERGE_REFERENCE_WIDTH
    return MERGE_ROW_POSITIONS * min(1.0, (MERGE_REFERENCE_WIDTH / width) ** 2)


SHARED_PASS_HOOKS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "mixer.hook_out", "mixer.hook_state")


def _resume_groups(pairs, sites, target_pos, answer_pos, stride: int = 1,
                   merge: float | None = None) -> list[tuple[int | None, int, torch.Tensor]]:
    """Split (site, example) pairs [P, 2] into (block, start, pairs) groups, by block, hook and
    first site position (small groups merged, see MERGE_ROW_POSITIONS). One hook per pass keeps
    the per-step (instrumented) path to the passes that patch such hooks (hook_conv, hook_k,
    ...); the hooks of SHARED_PASS_HOOKS, whose patches keep every mixer on its fast path
    (hook_state: a declared StatePatch), share passes, so that a pass has more rows. Sites
    outside the blocks (hook_embed, hook_final, ...) form one group of whole passes (None, 0).
    stride: starts are snapped down to multiples of it (fewer resume positions whose states a
    resumed pass reads; the positions between are recomputed, unpatched). merge: the threshold
    (default MERGE_ROW_POSITIONS; patch_from passes merge_row_positions(model))."""
    merge = MERGE_ROW_POSITIONS if merge is None else merge
    first_pos = torch.stack([pos.min(dim=1).values for pos in target_pos])[pairs[:, 0], pairs[:, 1]]  # [P]
    if bool((first_pos > answer_pos[pairs[:, 1]]).any()):
        raise RuntimeError("a pair whose site lies after the answer reached a resumed pass (internal error)")
    first_pos = first_pos // stride * stride
    hook_ids = {hook: 0 if hook.endswith(SHARED_PASS_HOOKS) else i + 1
                for i, hook in enumerate(sorted({s.hook for s in sites}))}
    layer = torch.tensor([-1 if s.layer is None else s.layer for s in sites])[pairs[:, 0]]  # [P]
    hook = torch.tensor([hook_ids[s.hook] for s in sites])[pairs[:, 0]]  # [P]
    outside = layer < 0
    groups: list[tuple[int | None, int, torch.Tensor]] = [(None, 0, pairs[outside])] if outside.any() else []
    keys, inside = torch.stack([layer, hook, first_pos], dim=1)[~outside], pairs[~outside]  # [P', 3], [P', 2]
    order = np.lexsort(keys.numpy().T[::-1])  # by block, then hook, then start
    keys, inside = keys[order], inside[order]
    distinct, counts = torch.unique_consecutive(keys, dim=0, return_counts=True)
    previous = None
    for (block, hook_id, start), members in zip(distinct.tolist(), inside.split(counts.tolist())):
        if previous == (block, hook_id) and len(members) * (start - groups[-1][1]) < merge:
            groups[-1] = (block, groups[-1][1], torch.cat([groups[-1][2], members]))
        else:
            groups.append((block, start, members))
        previous = (block, hook_id)
    return groups


def _pass_end(site_of_row, example_of_row, target_pos, answer_pos) -> int:
    """One past the last position a resumed pass needs: every site position and answer of its rows."""
    last = answer_pos[example_of_row].max()
    for s in torch.unique(site_of_row).tolist():
        last = max(last, target_pos[s][example_of_row[site_of_row == s]].max())
    return int(last) + 1


def run_cached(model, batch: Batch, hooks: Sequence[str], batch_size: int, at: torch.Tensor | None = None):
    """logits and {hook: activation [N, ...]} of `batch`, in chunks of batch_size rows. at [N]:
    the logits [N, V] at one position per example (no [N, T, V] is formed); None: [N, T, V]."""
    device = _device(model)
    logits, store = [], {h: [] for h in hooks}
    with torch.no_grad():
        for start in range(0, len(batch), batch_size):
            tokens = batch.tokens[start : start + batch_size].to(device)
            where = None if at is None else at[start : start + batch_size].to(device)
            with reading_at(model, tokens, where):
                chunk_logits, cache = model.run_with_cache(tokens, names=list(hooks))
            if where is not None and not takes_at(model):
                chunk_logits = chunk_logits[torch.arange(len(where), device=where.device), where]
            logits.append(chunk_logits)
            for h in hooks:
                store[h].append(cache[h])
    return torch.cat(logits), {h: torch.cat(v) for h, v in store.items()}


def _source_from_cache(sites, cache, source_pos) -> Source:
    def source(s: int, examples: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        site = sites[s]
        act = cache[site.hook]
        view = time_first(act, site.hook)
        pos = source_pos[s][examples].to(act.device)
        if pos.shape != current.shape[:2]:
            raise ValueError(
                f"site {site.label}: source and target give different numbers of positions "
                f"({pos.shape[1]} vs {current.shape[1]}) per example"
            )
        return select_site(view, examples.to(act.device), pos, site)

    source.prefetch = cache.__getitem__  # type: ignore[attr-defined]  # before a pass's hooks are attached
    return source


def check_site_values(sites, source: Source, source_pos) -> None:
    """ValueError, as a patched pass gives it, for a site's head that does not exist or a subspace
    whose rows are not its feature count (read from the first example's source value)."""
    first = torch.zeros(1, dtype=torch.long)
    for s, site in enumerate(sites):
        value = source(s, first, source_pos[s][first])   # [1, k, ...] (the positions [1, k] give the shape)
        _project(site, value, value)


def after_answer(target_pos, target_ans) -> torch.Tensor:
    """[S, N] bool: every site position lies after the answer position (causality: a no-op)."""
    return torch.stack([(pos > target_ans[:, None]).all(1) for pos in target_pos])


def _same_value(sites, source: Source, target_cache, target_pos) -> torch.Tensor:
    """[S, N] bool: the source equals the target's own value at the site (a no-op patch)."""
    examples = torch.arange(len(target_pos[0]))  # sites are never empty (check_sites)
    same = torch.zeros(len(sites), len(examples), dtype=torch.bool)
    for s in sorted(range(len(sites)), key=lambda i: sites[i].hook):  # one hook after another (LazyStates)
        site = sites[s]
        current = select_site(time_first(target_cache[site.hook], site.hook), examples, target_pos[s], site)  # [N, k, ...]
        same[s] = (source(s, examples, current) == current).flatten(1).all(1).cpu()
    return same


def patch_from(model, source: Batch, target: Batch, sites, y, target_ans, batch_size, skip_noops,
               names: tuple[str, str] = ("source", "target"), resume: bool = False, score_from=None,
               source_ans: torch.Tensor | None = None, max_memory=None, progress: bool = False,
               plan_sites=None, shared=None, gate=None):
    """Cache `source` (and `target`), then run `target` patched at each site from `source`.
    Returns (source logits [N, V] at source_ans (default: the last position), target logits
    [N, V] at target_ans, p_target(y) [N], p_patched(y) [S, N], scores [S, N, m] or None, stats
    {"run", "skipped", "passes"}). Runs on the current path. resume: patched runs start at the
    site's block and first position (`patched_answer_probs`). score_from(source logits, target
    logits, both [N, V]) -> a `score` function of patched_answer_probs (None: no scores).
    max_memory: the budget (models.memory) the planner (planning.Planner) fits the caches and
    the rows per pass to; MemoryRefused before any work when one row does not fit. progress: a
    bar over the pairs.
    plan_sites, shared: one unit of a grid (interventions.grid): the caches and the plan are made
    for every site of the grid (plan_sites), so that the cached source and target runs are the
    same for each unit of these examples, and shared(compute) returns them (computing them with
    compute() the first time): later units skip the two cached runs.
    gate(p_source(y) [N], p_target(y) [N]) -> bool, called once the two runs are cached: False
    runs no patched pass (every pair takes the target's values, counted as skipped).
    """
    plan_sites = sites if plan_sites is None else plan_sites
    hooks = sorted({s.hook for s in plan_sites})
    source_pos = [site_positions(source, s.position, names[0]) for s in sites]
    target_pos = [site_positions(target, s.position, names[1]) for s in sites]
    for site, src, dst in zip(sites, source_pos, target_pos):
        if src.shape != dst.shape:
            raise ValueError(f"site {site.label}: {names[0]} and {names[1]} roles give different shapes "
                             f"{tuple(src.shape)} and {tuple(dst.shape)}")
    resume = resume and hasattr(model, "resume_from")
    resumed = resume_hook_names(model, plan_sites) if resume else []
    resid = [h for h in resumed if not is_state(h)]
    carry = [h for h in resumed if is_state(h)]  # the passes read these at the resume positions only
    planner = Planner(model, target.tokens, hooks, resid, skip_noops, max_memory, batch_size, lazy=resume)
    if source_ans is None:
        source_ans = torch.full((len(source),), source.tokens.shape[1] - 1)

    def runs():
        return (run_cached(model, source, planner.source_names, planner.chunk, at=source_ans),
                run_cached(model, target, planner.target_names, planner.chunk, at=target_ans))

    (source_logits, source_cache), (target_logits, target_cache) = runs() if shared is None else shared(runs)
    source_cache = LazyStates(model, source_cache, planner.chunk, planner.lazy)
    target_cache = LazyStates(model, target_cache, planner.chunk, planner.lazy)
    p_target = probs_at(target_logits, y)
    correct_target = target_logits.argmax(-1).cpu() == y
    score = None if score_from is None else score_from(source_logits, target_logits)
    rows = torch.arange(len(target))
    unpatched = (p_target, correct_target) + (() if score is None else (score(target_logits, rows).double().cpu(),))
    from_source = _source_from_cache(sites, source_cache, source_pos)
    skip = None
    if gate is not None and not gate(probs_at(source_logits, y), p_target):
        check_site_values(sites, from_source, source_pos)   # what a pass would refuse, refused without one
        skip = torch.ones(len(sites), len(target), dtype=torch.bool)
    elif skip_noops or resume:  # a resumed pass cannot start after its answer: those pairs are no-ops
        skip = after_answer(target_pos, target_ans)
        if skip_noops:
            skip |= _same_value(sites, from_source, target_cache, target_pos)
    pairs = torch.nonzero(torch.ones(len(sites), len(target), dtype=torch.bool) if skip is None else ~skip)  # [P, 2]
    if not len(pairs):
        groups, sizes, resume_cache = [], [], None
    elif resume:
        merge = merge_row_positions(model)
        groups, sizes = planner.passes(lambda stride: _resume_groups(pairs, sites, target_pos, target_ans, stride, merge))
        kept = [h for h in resid + carry if h in target_cache.cache]  # carry: where planner.whole_states
        resume_cache = resume_states(model, {h: target_cache.cache[h] for h in kept}, groups, planner.chunk)
    else:
        groups, sizes, resume_cache = *planner.passes(lambda stride: [(None, 0, pairs)]), None
    target_cache = None  # only the resume cache is read from here on
    stats: dict = {}
    p_patched, _, scores = patched_answer_probs(model, target, sites, from_source, y, target_ans, batch_size,
                                                skip=skip, unpatched=unpatched, resume_cache=resume_cache,
                                                score=score, stats=stats, plan=(groups, sizes), progress=progress)
    stats["skipped"] = 0 if skip is None else int(skip.sum())
    return source_logits, target_logits, p_target, p_patched, scores, stats


def resume_hook_names(model, sites) -> list[str]:
    """The activations a resumed pass reads, for blocks from the first site's block on."""
    layers = [s.layer for s in sites if s.layer is not None]
    if not layers or not hasattr(model, "resume_hooks"):
        return []
    hooks = model.resume_hooks(min(layers))
    return hooks["resid"] + hooks["carry"]


def patched_probs(
    model,
    source: Batch,
    target: Batch,
    sites: Sequence[Site],
    answer_tokens: torch.Tensor | None = None,
    answer: str | None = None,
    batch_size: int | None = None,
    skip_noops: bool = True,
    resume: bool = True,
) -> torch.Tensor:
    """Run `target` with each site patched from the `source` run -> p(answer) [S, N] float64.

    answer_tokens [N]: the token whose probability is read (default: the source's answer, the
    source target at its answer position); read at the target's answer position.
    skip_noops, resume: see `interchange`.
    """
    check_pair(source, target)
    sites = check_sites(model, sites)
    check_aligned(source, target, sites, answer)
    batch_size = rows_per_pass(batch_size, len(target))
    target_ans = answer_positions(target, answer, "target")
    if answer_tokens is None:
        source_ans = answer_positions(source, answer, "source")
        answer_tokens = source.targets[torch.arange(len(source)), source_ans]
    with models.instrumented():
        return patch_from(model, source, target, sites, answer_tokens, target_ans, batch_size, skip_noops,
                          resume=resume)[3]


