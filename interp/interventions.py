"""Interchange interventions, ablations and corruptions on named sites.

A `Site(hook, position, head=None, subspace=None)` names one activation: a hook in the model's
grammar (`blocks.0.mixer.hook_out`), a position (a role of the batch such as "key", "value",
"query" - per-example positions from `batch.roles` - an int index, or None for every position),
optionally one head of a [B, T, H, ...] activation and a subspace: a projection matrix P [d, k]
with orthonormal columns, d the size of the selected feature vector; a subspace patch replaces
only the component in span(P):  f <- f + P P^T (f_source - f).

Layout: activations are [B, T, ...] with the head axis (if any) third, except `hook_pattern`
[B, H, T, T], whose position is the query axis (2) and head axis 1.

Interchange (SCIENCE.md section 2). The clean run is cached once (only the hooks the sites need);
the corrupted run is replayed with one site patched from the clean run. Many sites and example
pairs go through one forward pass: each row of a pass is one (site, example) pair - a corrupted
example, repeated once per site - and one hook per hook name writes each row's own site from the
clean cache. Pairs whose patch cannot change the answer (a site after the answer position, or a
clean value equal to the corrupted one) are not run. A hook on `hook_state` that changes the
states is a causal state patch (models.hooks.scan_with_state_hook), so patching the state at a
position makes the recurrence continue from the clean state.

    restoration[s, b] = (p_patched[s, b](y_b) - p_corrupt[b](y_b)) / (p_clean[b](y_b) - p_corrupt[b](y_b))

where y_b is the clean answer token: the clean target at the answer-prediction position (by
default the last loss_mask position of each example; `answer=<role>` names a role instead).
Examples with p_clean - p_corrupt <= min_effect are dropped (restoration NaN) and counted.

Every forward pass of one call runs on the instrumented path (`models.instrumented()`), so clean,
corrupt and patched runs are computed alike: patching a run with its own values gives back its
probabilities bit for bit.

Ablations: `ablate` replaces a site by zero or by its mean over a reference batch (the subspace
component only, for subspace sites) and reports the answer probability and accuracy per site.
`ablate_short_conv(model, width, mode)` shortens every short convolution in place at load time.

Corruptions: `corrupt_ar` / `corrupt_atr` / `corrupt_key` replace the queried key's occurrences
in context by a key absent from the example, so the query no longer matches.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

import models
from interp.tasks.base import Batch

METRICS = ("restoration",)
ABLATION_MODES = ("zero", "mean")
SHORT_CONV_MODES = ("truncate", "identity")

# ---------------------------------------------------------------------------------------------
# Sites
# ---------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Site:
    """One patchable activation: hook name, position (role | int | None), head, subspace [d, k]."""

    hook: str
    position: str | int | None = None
    head: int | None = None
    subspace: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.hook, str):
            raise TypeError(f"Site.hook must be a hook name (str); got {type(self.hook).__name__}")
        if self.position is not None and (
            isinstance(self.position, bool) or not isinstance(self.position, (str, int))
        ):
            raise TypeError(
                f"Site.position must be a role name (str), an int index or None; got {self.position!r}"
            )
        if self.head is not None and (
            isinstance(self.head, bool) or not isinstance(self.head, int) or self.head < 0
        ):
            raise ValueError(f"Site.head must be None or an int >= 0; got {self.head!r}")
        if self.subspace is not None:
            self.subspace = check_subspace(self.subspace)

    @property
    def label(self) -> str:
        """`hook@position[.head][/k-dim]`, e.g. `blocks.0.mixer.hook_out@value`."""
        text = f"{self.hook}@{'all' if self.position is None else self.position}"
        if self.head is not None:
            text += f".h{self.head}"
        if self.subspace is not None:
            text += f"/{self.subspace.shape[1]}d"
        return text

    @property
    def layer(self) -> int | None:
        match = re.match(r"blocks\.(\d+)\.", self.hook)
        return int(match.group(1)) if match else None

    @property
    def component(self) -> str:
        """The hook name without its `blocks.{l}.` prefix (`mixer.hook_out`)."""
        return re.sub(r"^blocks\.\d+\.", "", self.hook)

    def __repr__(self) -> str:
        return f"Site({self.label})"


def check_subspace(subspace) -> torch.Tensor:
    """A float [d, k] matrix with orthonormal columns (P^T P = I within 1e-4)."""
    if not isinstance(subspace, torch.Tensor):
        raise TypeError(f"subspace must be a torch.Tensor [d, k]; got {type(subspace).__name__}")
    if subspace.dim() != 2 or not subspace.dtype.is_floating_point or subspace.shape[1] < 1:
        raise ValueError(
            f"subspace must be a float [d, k] matrix with k >= 1; got dtype {subspace.dtype}, "
            f"shape {tuple(subspace.shape)}"
        )
    gram = subspace.double().T @ subspace.double()
    error = (gram - torch.eye(gram.shape[0], dtype=torch.float64)).abs().max().item()
    if error > 1e-4:
        raise ValueError(
            f"subspace columns must be orthonormal (P^T P = I); max |P^T P - I| = {error:.3g}. "
            "Orthonormalise first, e.g. torch.linalg.qr(P).Q"
        )
    return subspace.detach()


def site_grid(
    model,
    hooks: Sequence[str],
    roles: Sequence[str | int],
    layers: Iterable[int] | None = None,
    head: int | None = None,
) -> list[Site]:
    """Sites for every layer x hook x role, layer-major.

    hooks: templates with `{l}` for the layer ("blocks.{l}.mixer.hook_out") or plain names
    (taken once). layers: default every layer of the model. Every name is checked.
    """
    if isinstance(hooks, str) or isinstance(roles, str):
        raise TypeError("hooks and roles must be sequences (lists), not a single string")
    layer_list = list(range(model.cfg.n_layers) if layers is None else layers)
    sites: list[Site] = []
    for template in (h for h in hooks if "{l}" not in h):
        sites += [Site(template, role, head) for role in roles]
    for layer in layer_list:
        for template in (h for h in hooks if "{l}" in h):
            sites += [Site(template.format(l=layer), role, head) for role in roles]
    check_sites(model, sites)
    return sites


def check_sites(model, sites: Sequence[Site]) -> list[Site]:
    """The sites as a list; TypeError/ValueError for non-sites and unknown hook names."""
    if isinstance(sites, Site):
        sites = [sites]
    sites = list(sites)
    if not sites:
        raise ValueError("sites must hold at least one Site; got none")
    for site in sites:
        if not isinstance(site, Site):
            raise TypeError(f"sites must be Site objects; got {type(site).__name__}: {site!r}")
        model.hook_point(site.hook)  # ValueError with close matches
    return sites


# ---------------------------------------------------------------------------------------------
# Batches: positions, answers
# ---------------------------------------------------------------------------------------------


def _check_batch(name: str, batch) -> None:
    if not isinstance(batch, Batch):
        raise TypeError(f"{name} must be an interp.tasks.base.Batch; got {type(batch).__name__}")


def check_pair(clean: Batch, corrupt: Batch) -> None:
    _check_batch("clean", clean)
    _check_batch("corrupt", corrupt)
    if clean.tokens.shape != corrupt.tokens.shape:
        raise ValueError(
            f"clean and corrupt tokens must have the same shape [N, T]; got clean "
            f"{tuple(clean.tokens.shape)} and corrupt {tuple(corrupt.tokens.shape)}"
        )


def site_positions(batch: Batch, position: str | int | None, which: str = "batch") -> torch.Tensor:
    """Positions [N, k] (int64) of a site in each example of `batch`."""
    n, length = batch.tokens.shape
    if position is None:
        return torch.arange(length).expand(n, length)
    if isinstance(position, int):
        if not -length <= position < length:
            raise ValueError(f"position {position} is out of range for length T={length}")
        return torch.full((n, 1), position % length, dtype=torch.long)
    if position not in batch.roles:
        raise ValueError(
            f"role {position!r} is not in the {which} batch's roles; available: {sorted(batch.roles)}"
        )
    pos = batch.roles[position].long()
    if pos.dim() == 1:
        pos = pos[:, None]
    if pos.dim() != 2 or pos.shape[0] != n:
        raise ValueError(f"role {position!r} must be [N] or [N, k] with N={n}; got {tuple(pos.shape)}")
    if bool((pos < 0).any()) or bool((pos >= length).any()):
        raise ValueError(f"role {position!r} holds positions outside [0, {length}) in the {which} batch")
    return pos


def answer_positions(batch: Batch, answer: str | None = None, which: str = "batch") -> torch.Tensor:
    """Answer-prediction position per example [N]: the last loss_mask position, or a role."""
    if answer is not None:
        pos = site_positions(batch, answer, which)
        if pos.shape[1] != 1:
            raise ValueError(f"answer role {answer!r} must give one position per example; got {tuple(pos.shape)}")
        return pos[:, 0]
    has_loss = batch.loss_mask.any(dim=1)
    if not bool(has_loss.all()):
        missing = torch.nonzero(~has_loss)[:5, 0].tolist()
        raise ValueError(f"every {which} example needs a loss_mask position (the answer); examples {missing} have none")
    length = batch.tokens.shape[1]
    return (length - 1) - batch.loss_mask.flip(1).long().argmax(dim=1)


def answer_probs(logits: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """p(tokens[b]) at positions[b] from logits [N, T, V] -> [N] float64."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    probs = logits[rows, positions.to(logits.device)].double().softmax(-1)  # [N, V]
    return probs[rows, tokens.to(logits.device)].cpu()


# ---------------------------------------------------------------------------------------------
# The patch engine: one forward hook per hook name, each replica patched at its own site
# ---------------------------------------------------------------------------------------------


def _layout(act: torch.Tensor, hook: str) -> torch.Tensor:
    """A view with time at axis 1 and heads (if any) at axis 2."""
    return act.transpose(1, 2) if hook.endswith("hook_pattern") else act


def _select(view: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor, site: Site) -> torch.Tensor:
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


# source(site index, example indices [n], current values [m=n, k, ...]) -> new values
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
            view = _layout(out, hook.name)
            offset = end - view.shape[1]  # the position of the first time step here
            for s in site_ids:
                site = sites[s]
                rows = torch.nonzero(site_of_row == s)[:, 0]
                examples = example_of_row[rows]
                pos = target_pos[s][examples].to(act.device) - offset  # [m, k]
                if bool((pos < 0).any()):
                    raise RuntimeError(f"site {site.label}: a resumed pass starts after the site (internal error)")
                rows = rows.to(act.device)
                current = _select(view, rows, pos, site)
                new = source(s, examples, current).to(current)
                if new.shape != current.shape:
                    raise ValueError(
                        f"site {site.label}: the source has shape {tuple(new.shape)} but the target "
                        f"activation at the site has shape {tuple(current.shape)}"
                    )
                _write(view, rows, pos, site, _project(site, current, new))
            return out

        return patch

    return [(hook, make(site_ids)) for hook, site_ids in by_hook.items()]


def _device(model) -> torch.device:
    """Where the model's parameters (or buffers) live; the CPU for a model with neither."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def _rows_per_pass(batch_size, n_examples: int) -> int:
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
    unpatched: tuple[torch.Tensor, torch.Tensor] | None = None,
    resume_cache=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `target` with each site patched: (p(answer_tokens) [S, N] float64, argmax ==
    answer_tokens [S, N] bool) at answer_pos.

    The (site, example) pairs are packed into forward passes of up to batch_size rows (row r:
    example b patched at site s), sites of one hook sharing one hook. skip [S, N] bool marks
    pairs whose patch is known to change nothing; they take `unpatched` = (p [N], correct [N]).
    resume_cache: the target run's `model.resume_hooks()` activations; with it a pair at a block
    site runs from its block and first position on (`SequenceModel.resume_from`), up to its
    last site or answer position; pairs are grouped into passes by (block, hook, first position).
    Pairs whose site lies after the answer must then be in `skip` (they cannot be resumed).
    """
    batch_size = _rows_per_pass(batch_size, len(target))
    n_sites, n_total = len(sites), len(target)
    target_pos = [site_positions(target, site.position, "target") for site in sites]
    device = _device(model)
    probs = torch.empty(n_sites, n_total, dtype=torch.float64)
    correct = torch.empty(n_sites, n_total, dtype=torch.bool)
    if skip is not None:
        probs[:] = unpatched[0]
        correct[:] = unpatched[1]
    todo = torch.ones(n_sites, n_total, dtype=torch.bool) if skip is None else ~skip
    pairs = torch.nonzero(todo)  # [P, 2] (site, example), site-major
    groups = _resume_groups(pairs, sites, target_pos, answer_pos) if resume_cache is not None else [(None, 0, pairs)]
    length = target.tokens.shape[1]
    with torch.no_grad():
        for layer, start, group in groups:
            for first in range(0, len(group), batch_size):
                site_of_row, example_of_row = group[first : first + batch_size].unbind(1)
                end = length if layer is None else _pass_end(site_of_row, example_of_row, target_pos, answer_pos)
                hooks = _patch_hooks(sites, site_of_row, example_of_row, target_pos, source, end)
                if layer is None:
                    logits = model.run_with_hooks(target.tokens[example_of_row].to(device), fwd_hooks=hooks)
                else:  # only the mixers whose per-step hooks are patched take the instrumented path
                    with models.instrumented(False), model.hooks(hooks):
                        logits = model.resume_from(resume_cache, example_of_row.to(device), layer, start, end)
                at, want = answer_pos[example_of_row] - start, answer_tokens[example_of_row]
                probs[site_of_row, example_of_row] = answer_probs(logits, at, want)
                rows = torch.arange(logits.shape[0], device=logits.device)
                correct[site_of_row, example_of_row] = logits[rows, at.to(logits.device)].argmax(-1).cpu() == want
    return probs, correct


# A resumed group joins the one before it (same block and hook, earlier start) when that adds
# fewer than this many row x position steps (its rows times the start difference): a few more
# positions computed, one pass fewer (a pass has a fixed cost of its own).
MERGE_ROW_POSITIONS = 256


def _resume_groups(pairs, sites, target_pos, answer_pos) -> list[tuple[int | None, int, torch.Tensor]]:
    """Split (site, example) pairs [P, 2] into (block, start, pairs) groups, by block, hook and
    first site position (small groups merged, see MERGE_ROW_POSITIONS). One hook per pass keeps
    the per-step (instrumented) path to the passes that patch hook_state and the like. Sites
    outside the blocks (hook_embed, hook_final, ...) form one group of whole passes (None, 0)."""
    first_pos = torch.stack([pos.min(dim=1).values for pos in target_pos])[pairs[:, 0], pairs[:, 1]]  # [P]
    hook_ids = {hook: i for i, hook in enumerate(sorted({s.hook for s in sites}))}
    layer = torch.tensor([-1 if s.layer is None else s.layer for s in sites])[pairs[:, 0]]  # [P]
    hook = torch.tensor([hook_ids[s.hook] for s in sites])[pairs[:, 0]]  # [P]
    if bool((first_pos > answer_pos[pairs[:, 1]]).any()):
        raise RuntimeError("a pair whose site lies after the answer reached a resumed pass (internal error)")
    outside = layer < 0
    groups: list[tuple[int | None, int, torch.Tensor]] = [(None, 0, pairs[outside])] if outside.any() else []
    keys, inside = torch.stack([layer, hook, first_pos], dim=1)[~outside], pairs[~outside]  # [P', 3], [P', 2]
    order = np.lexsort(keys.numpy().T[::-1])  # by block, then hook, then start
    keys, inside = keys[order], inside[order]
    distinct, counts = torch.unique_consecutive(keys, dim=0, return_counts=True)
    previous = None
    for (block, hook_id, start), members in zip(distinct.tolist(), inside.split(counts.tolist())):
        if previous == (block, hook_id) and len(members) * (start - groups[-1][1]) < MERGE_ROW_POSITIONS:
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


def run_cached(model, batch: Batch, hooks: Sequence[str], batch_size: int):
    """logits [N, T, V] and {hook: activation [N, ...]} of `batch`, in chunks of batch_size."""
    device = _device(model)
    logits, store = [], {h: [] for h in hooks}
    with torch.no_grad():
        for start in range(0, len(batch), batch_size):
            chunk_logits, cache = model.run_with_cache(
                batch.tokens[start : start + batch_size].to(device), names=list(hooks)
            )
            logits.append(chunk_logits)
            for h in hooks:
                store[h].append(cache[h])
    return torch.cat(logits), {h: torch.cat(v) for h, v in store.items()}


def _source_from_cache(sites, cache, source_pos) -> Source:
    def source(s: int, examples: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        site = sites[s]
        act = cache[site.hook]
        view = _layout(act, site.hook)
        pos = source_pos[s][examples].to(act.device)
        if pos.shape != current.shape[:2]:
            raise ValueError(
                f"site {site.label}: source and target give different numbers of positions "
                f"({pos.shape[1]} vs {current.shape[1]}) per example"
            )
        return _select(view, examples.to(act.device), pos, site)

    return source


def _after_answer(target_pos, target_ans) -> torch.Tensor:
    """[S, N] bool: every site position lies after the answer position (causality: a no-op)."""
    return torch.stack([(pos > target_ans[:, None]).all(1) for pos in target_pos])


def _same_value(sites, source: Source, target_cache, target_pos) -> torch.Tensor:
    """[S, N] bool: the source equals the target's own value at the site (a no-op patch)."""
    examples = torch.arange(len(target_pos[0]))  # sites are never empty (check_sites)
    same = torch.zeros(len(sites), len(examples), dtype=torch.bool)
    for s, site in enumerate(sites):
        current = _select(_layout(target_cache[site.hook], site.hook), examples, target_pos[s], site)  # [N, k, ...]
        same[s] = (source(s, examples, current) == current).flatten(1).all(1).cpu()
    return same


def _patch_from(model, source: Batch, target: Batch, sites, y, target_ans, batch_size, skip_noops,
                names: tuple[str, str] = ("source", "target"), resume: bool = False):
    """Cache `source` (and `target`), then run `target` patched at each site from `source`.
    Returns (source logits, p_target(y) [N], p_patched(y) [S, N]). Runs on the current path.
    resume: patched runs start at the site's block and first position (`patched_answer_probs`)."""
    hooks = sorted({s.hook for s in sites})
    source_pos = [site_positions(source, s.position, names[0]) for s in sites]
    target_pos = [site_positions(target, s.position, names[1]) for s in sites]
    for site, src, dst in zip(sites, source_pos, target_pos):
        if src.shape != dst.shape:
            raise ValueError(f"site {site.label}: {names[0]} and {names[1]} roles give different shapes "
                             f"{tuple(src.shape)} and {tuple(dst.shape)}")
    resume = resume and hasattr(model, "resume_from")
    resume_hooks = _resume_hooks(model, sites) if resume else []
    source_logits, source_cache = run_cached(model, source, hooks, batch_size)
    target_logits, target_cache = run_cached(
        model, target, sorted(set(hooks if skip_noops else []) | set(resume_hooks)), batch_size
    )
    p_target = answer_probs(target_logits, target_ans, y)
    rows = torch.arange(len(target))
    correct_target = target_logits[rows, target_ans.to(target_logits.device)].argmax(-1).cpu() == y
    from_source = _source_from_cache(sites, source_cache, source_pos)
    skip = None
    if skip_noops or resume:  # a resumed pass cannot start after its answer: those pairs are no-ops
        skip = _after_answer(target_pos, target_ans)
    if skip_noops:
        skip |= _same_value(sites, from_source, target_cache, target_pos)
    p_patched, _ = patched_answer_probs(model, target, sites, from_source, y, target_ans, batch_size,
                                        skip=skip, unpatched=(p_target, correct_target),
                                        resume_cache=target_cache if resume else None)
    return source_logits, p_target, p_patched


def _resume_hooks(model, sites) -> list[str]:
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
    batch_size = _rows_per_pass(batch_size, len(target))
    target_ans = answer_positions(target, answer, "target")
    if answer_tokens is None:
        source_ans = answer_positions(source, answer, "source")
        answer_tokens = source.targets[torch.arange(len(source)), source_ans]
    with models.instrumented():
        return _patch_from(model, source, target, sites, answer_tokens, target_ans, batch_size, skip_noops,
                           resume=resume)[2]


# ---------------------------------------------------------------------------------------------
# Interchange
# ---------------------------------------------------------------------------------------------


@dataclass
class InterchangeResult:
    """Restoration per site and example.

    restoration [S, N] float64 (NaN for dropped examples), p_patched [S, N], p_clean [N],
    p_corrupt [N], kept [N] bool; labels[s] names sites[s]; n_kept examples passed the filter.
    """

    sites: list[Site]
    restoration: torch.Tensor
    p_patched: torch.Tensor
    p_clean: torch.Tensor
    p_corrupt: torch.Tensor
    kept: torch.Tensor
    min_effect: float

    @property
    def labels(self) -> list[str]:
        return [s.label for s in self.sites]

    @property
    def n_kept(self) -> int:
        return int(self.kept.sum())

    def mean(self) -> torch.Tensor:
        """Mean restoration per site over the kept examples [S] (NaN when none is kept)."""
        return self.restoration[:, self.kept].mean(dim=1)

    def sem(self) -> torch.Tensor:
        """Standard error of the mean per site [S] (NaN with fewer than 2 kept examples)."""
        values = self.restoration[:, self.kept]
        if values.shape[1] < 2:
            return torch.full((len(self.sites),), float("nan"), dtype=torch.float64)
        return values.std(dim=1) / math.sqrt(values.shape[1])

    def __getitem__(self, label: str) -> torch.Tensor:
        """Restoration [N] of the site with this label."""
        if label not in self.labels:
            raise KeyError(models.hooks.unknown_name_message("site label", label, self.labels))
        return self.restoration[self.labels.index(label)]

    def to_dataframe(self, per: str = "site"):
        """Tidy pandas DataFrame: per="site" (mean, sem, n_kept) or per="example" (one row each)."""
        import pandas as pd

        meta = [
            {"site": s.label, "hook": s.hook, "layer": s.layer, "component": s.component,
             "position": "all" if s.position is None else s.position, "head": s.head}
            for s in self.sites
        ]
        if per == "site":
            mean, sem = self.mean().tolist(), self.sem().tolist()
            return pd.DataFrame(
                [{**m, "mean": mean[i], "sem": sem[i], "n_kept": self.n_kept, "n": len(self.kept)}
                 for i, m in enumerate(meta)]
            )
        if per == "example":
            n = self.restoration.shape[1]
            frame = pd.DataFrame(meta).loc[np.repeat(np.arange(len(meta)), n)].reset_index(drop=True)
            frame["example"] = np.tile(np.arange(n), len(meta))
            frame["restoration"] = self.restoration.reshape(-1).numpy()
            frame["p_patched"] = self.p_patched.reshape(-1).numpy()
            frame["p_clean"] = np.tile(self.p_clean.numpy(), len(meta))
            frame["p_corrupt"] = np.tile(self.p_corrupt.numpy(), len(meta))
            frame["kept"] = np.tile(self.kept.numpy(), len(meta))
            return frame
        raise ValueError(f"per must be 'site' or 'example'; got {per!r}")

    def __repr__(self) -> str:
        return (f"InterchangeResult({len(self.sites)} sites x {len(self.kept)} examples, "
                f"{self.n_kept} kept with p_clean - p_corrupt > {self.min_effect})")


def restoration(p_patched: torch.Tensor, p_clean: torch.Tensor, p_corrupt: torch.Tensor,
                min_effect: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    """(restoration [S, N] with NaN where dropped, kept [N]) from p_patched [S, N], p_clean, p_corrupt [N]."""
    effect = p_clean - p_corrupt
    kept = effect > min_effect
    value = (p_patched - p_corrupt) / torch.where(kept, effect, torch.ones_like(effect))
    return torch.where(kept, value, torch.full_like(value, float("nan"))), kept


def interchange(
    model,
    clean: Batch,
    corrupt: Batch,
    sites: Sequence[Site],
    metric: str = "restoration",
    batch_size: int | None = None,
    min_effect: float = 0.01,
    answer: str | None = None,
    skip_noops: bool = True,
    resume: bool = True,
) -> InterchangeResult:
    """Patch each site of the corrupted run from the clean run; restoration per site and example.

    batch_size: rows per forward pass ((site, example) pairs are packed up to it); default
    max(N, 512). On a CPU the cost per row does not fall with larger passes (it can rise for
    memory-bound scans), so packing pays where a pass's fixed cost dominates: small N, or a GPU,
    where passes of several thousand rows cost little more than one of N.
    answer: a role naming the answer-prediction position (default the last loss_mask position).
    Positions come from clean.roles for the source and corrupt.roles for the target.
    skip_noops: pairs whose patch cannot change the answer are not run and get p_corrupt: every
    site position after the answer position (the model is causal), or the clean value equal to
    the corrupt one at the site (a patch with the run's own value is a no-op). Same result, bit
    for bit; False runs every pair.
    resume: a patched run starts at the site's block and first position from the corrupt run's
    cached block inputs and recurrent states (everything before is the corrupt run's, by
    causality) and stops at the last site or answer position: the work per pair falls with the
    site's depth and position (`SequenceModel.resume_from`; attention still reads every earlier
    key, and mixers without a carried state - Based, BaseConv, Hyena, see Mixer.resume_context -
    recompute their prefix). The values agree with whole passes up to float rounding (1e-6
    measured, tests/test_interventions.py); False runs whole passes.
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}; got {metric!r}")
    if isinstance(min_effect, bool) or not isinstance(min_effect, (int, float)) or min_effect < 0:
        raise ValueError(f"min_effect must be a float >= 0; got {min_effect!r}")
    check_pair(clean, corrupt)
    sites = check_sites(model, sites)
    batch_size = _rows_per_pass(batch_size, len(clean))
    clean_ans = answer_positions(clean, answer, "clean")
    corrupt_ans = answer_positions(corrupt, answer, "corrupt")
    y = clean.targets[torch.arange(len(clean)), clean_ans]  # [N] the clean answer tokens
    with models.instrumented():
        clean_logits, p_corrupt, p_patched = _patch_from(
            model, clean, corrupt, sites, y, corrupt_ans, batch_size, skip_noops, ("clean", "corrupt"), resume
        )
    p_clean = answer_probs(clean_logits, clean_ans, y)
    values, kept = restoration(p_patched, p_clean, p_corrupt, float(min_effect))
    return InterchangeResult(sites, values, p_patched, p_clean, p_corrupt, kept, float(min_effect))


# ---------------------------------------------------------------------------------------------
# Ablations
# ---------------------------------------------------------------------------------------------


@dataclass
class AblationResult:
    """Answer probability and correctness with each site ablated (separately).

    p_answer [S, N], correct [S, N] bool; baseline_p [N], baseline_correct [N] (no ablation).
    """

    sites: list[Site]
    mode: str
    p_answer: torch.Tensor
    correct: torch.Tensor
    baseline_p: torch.Tensor
    baseline_correct: torch.Tensor

    @property
    def labels(self) -> list[str]:
        return [s.label for s in self.sites]

    def accuracy(self) -> torch.Tensor:
        return self.correct.double().mean(dim=1)

    def to_dataframe(self):
        import pandas as pd

        acc, p = self.accuracy().tolist(), self.p_answer.mean(dim=1).tolist()
        return pd.DataFrame(
            [{"site": s.label, "hook": s.hook, "layer": s.layer, "component": s.component,
              "position": "all" if s.position is None else s.position, "head": s.head,
              "mode": self.mode, "accuracy": acc[i], "p_answer": p[i],
              "baseline_accuracy": self.baseline_correct.double().mean().item(),
              "baseline_p_answer": self.baseline_p.mean().item()}
             for i, s in enumerate(self.sites)]
        )


def site_means(model, reference: Batch, sites: Sequence[Site], batch_size: int | None = None) -> list[torch.Tensor]:
    """Mean activation of each site over `reference` (over examples and the site's positions;
    per position for position=None) -> one tensor per site."""
    with models.instrumented():
        _, cache = run_cached(model, reference, sorted({s.hook for s in sites}),
                              _rows_per_pass(batch_size, len(reference)))
    means = []
    for site in sites:
        pos = site_positions(reference, site.position, "reference")
        view = _layout(cache[site.hook], site.hook)
        values = _select(view, torch.arange(len(reference)), pos, site)  # [N, k, ...]
        means.append(values.mean(dim=0) if site.position is None else values.mean(dim=(0, 1)))
    return means


def ablate(
    model,
    batch: Batch,
    sites: Sequence[Site],
    mode: str = "zero",
    reference: Batch | None = None,
    batch_size: int | None = None,
    answer: str | None = None,
    resume: bool = True,
) -> AblationResult:
    """Zero- or mean-ablate each site separately; answer probability and accuracy per site.

    mode "mean" replaces the site by its mean over `reference` (default: `batch` itself). For a
    subspace site only the component in the subspace is replaced (zero: projected out).
    resume: each ablated run starts at the site's block and first position from the batch's own
    cached run (as in `interchange`; sites after the answer keep the baseline); False: whole passes.
    """
    if mode not in ABLATION_MODES:
        raise ValueError(f"mode must be one of {ABLATION_MODES}; got {mode!r}")
    _check_batch("batch", batch)
    sites = check_sites(model, sites)
    if reference is not None:
        _check_batch("reference", reference)
    batch_size = _rows_per_pass(batch_size, len(batch))
    ans = answer_positions(batch, answer)
    y = batch.targets[torch.arange(len(batch)), ans]
    means = site_means(model, batch if reference is None else reference, sites, batch_size) if mode == "mean" else None

    def source(s: int, examples: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        if means is None:
            return torch.zeros_like(current)
        mean = means[s].to(current)  # [*feat] or, for position=None, [T, *feat]
        if mean.shape != current.shape[2 - (sites[s].position is None):]:
            raise ValueError(
                f"site {sites[s].label}: mean over the reference has shape {tuple(mean.shape)}, the "
                f"batch's activation {tuple(current.shape[1:])} (position=None needs equal lengths)"
            )
        return mean.expand_as(current)

    resume = resume and hasattr(model, "resume_from")
    with models.instrumented():
        logits, cache = run_cached(model, batch, _resume_hooks(model, sites) if resume else [], batch_size)
        baseline_p = answer_probs(logits, ans, y)
        baseline_correct = logits[torch.arange(len(batch)), ans].argmax(-1).cpu() == y
        skip = _after_answer([site_positions(batch, s.position) for s in sites], ans) if resume else None
        p_answer, correct = patched_answer_probs(model, batch, sites, source, y, ans, batch_size, skip=skip,
                                                 unpatched=(baseline_p, baseline_correct),
                                                 resume_cache=cache if resume else None)
    return AblationResult(sites, mode, p_answer, correct, baseline_p, baseline_correct)


# ---------------------------------------------------------------------------------------------
# Short-conv ablation (at load time, no retraining)
# ---------------------------------------------------------------------------------------------


def short_convs(model) -> list[tuple[str, torch.Tensor]]:
    """Every short-conv kernel of the model: [(name, weight [C, W])], weight[:, -1] the tap on x_t.

    Found by, in order of precedence for a module and everything inside it:
      - a `short_convs()` method returning [(name, weight [C, W])] (views into its parameters);
      - 2-D parameters named `conv_weight` or `*_conv_weight` (models.kernels.short_conv's [C, W]);
      - depthwise `nn.Conv1d` modules (groups == in == out channels), weight[:, 0] as [C, W].
    """
    found: list[tuple[str, torch.Tensor]] = []
    listed: list[str] = []
    for path, module in model.named_modules():
        if any(path.startswith(prefix + ".") for prefix in listed):
            continue
        prefix = f"{path}." if path else ""
        if callable(getattr(module, "short_convs", None)):
            listed.append(path)
            found += [(prefix + name, weight) for name, weight in module.short_convs()]
            continue
        if isinstance(module, torch.nn.Conv1d) and module.groups == module.in_channels == module.out_channels:
            found.append((prefix + "weight", module.weight[:, 0]))
            continue
        for name, param in module.named_parameters(recurse=False):
            if (name == "conv_weight" or name.endswith("_conv_weight")) and param.dim() == 2:
                found.append((prefix + name, param))
    return found


def ablate_short_conv(model, width: int = 1, mode: str = "truncate") -> list[str]:
    """Shorten every short convolution in place; returns the names of the kernels changed.

    mode "truncate": keep the last `width` taps (the current step and width-1 before it) and zero
    the older ones, which equals a width-`width` convolution; width=1 is "no mixing across time"
    (a per-channel scale). mode "identity": the kernel becomes a delta at the current step
    (weight[:, -1] = 1, others 0; `width` is ignored); biases are left as they are.
    """
    if mode not in SHORT_CONV_MODES:
        raise ValueError(f"mode must be one of {SHORT_CONV_MODES}; got {mode!r}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be an int >= 1; got {width!r}")
    kernels = short_convs(model)
    if not kernels:
        raise ValueError(
            "the model has no short convolutions: no module defines short_convs(), a 2-D "
            "`conv_weight` parameter or a depthwise nn.Conv1d"
        )
    with torch.no_grad():
        for _, weight in kernels:
            if mode == "identity":
                weight.zero_()
                weight[:, -1] = 1.0
            elif width < weight.shape[1]:
                weight[:, : weight.shape[1] - width] = 0.0
    return [name for name, _ in kernels]


# ---------------------------------------------------------------------------------------------
# Corruptions
# ---------------------------------------------------------------------------------------------


def corrupt_key(
    batch: Batch,
    candidates: Iterable[int],
    seed,
    key_role: str = "key",
    query_role: str = "query",
) -> Batch:
    """Replace the queried key in context by a candidate token absent from the example.

    For each example (and each query of an [N, k] role) the query token q = tokens[query]; every
    occurrence of q before the query position (the `key` role's position among them) becomes one
    new token drawn uniformly from `candidates` minus the tokens of the example, so the query no
    longer matches. targets, loss_mask, states and roles are kept (they describe the clean answer).
    """
    _check_batch("batch", batch)
    rng = seed if isinstance(seed, np.random.Generator) else None
    if rng is None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int or a numpy Generator; got {seed!r}")
        rng = np.random.default_rng(int(seed))
    pool = np.asarray(sorted(set(int(c) for c in candidates)), dtype=np.int64)
    if pool.size == 0:
        raise ValueError("candidates must hold at least one token id; got none")
    keys = site_positions(batch, key_role).numpy()  # [N, k]
    queries = site_positions(batch, query_role).numpy()
    if keys.shape != queries.shape:
        raise ValueError(f"roles {key_role!r} and {query_role!r} must have the same shape; got "
                         f"{keys.shape} and {queries.shape}")
    tokens = batch.tokens.clone()
    array = tokens.numpy()
    for b in range(array.shape[0]):
        free = np.setdiff1d(pool, array[b])
        if free.size < keys.shape[1]:
            raise ValueError(f"example {b}: fewer than {keys.shape[1]} candidate keys are absent from it")
        new = rng.choice(free, size=keys.shape[1], replace=False)
        for j in range(keys.shape[1]):
            query_token = array[b, queries[b, j]]
            if array[b, keys[b, j]] != query_token:
                raise ValueError(
                    f"example {b}: the {key_role!r} token {array[b, keys[b, j]]} at position "
                    f"{keys[b, j]} does not match the query token {query_token}"
                )
            context = np.nonzero(array[b, : queries[b, j]] == query_token)[0]
            array[b, context] = new[j]
    return Batch(tokens, batch.targets.clone(), batch.loss_mask.clone(), batch.states.clone(),
                 {k: v.clone() for k, v in batch.roles.items()})


def _token_ids(task, attribute: str) -> Iterable[int]:
    if not hasattr(task, attribute):
        raise TypeError(f"task must expose `{attribute}` (the token ids to draw from); "
                        f"{type(task).__name__} has none")
    return getattr(task, attribute)


def corrupt_ar(batch: Batch, task, seed) -> Batch:
    """AR / MQAR: swap each queried key in context for a key (task.key_ids) not in the example."""
    return corrupt_key(batch, _token_ids(task, "key_ids"), seed)


def corrupt_atr(batch: Batch, task, seed) -> Batch:
    """ATR: swap the queried terminal's occurrences in context for a terminal
    (task.terminal_ids) absent from the document."""
    return corrupt_key(batch, _token_ids(task, "terminal_ids"), seed)
