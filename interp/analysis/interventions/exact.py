"""The raw numbers of one exact interchange run (interchange's module docstring): what a whole grid
or one unit of it (interventions.grid) computes before restoration is formed."""

from __future__ import annotations

import sys

import torch

import models
from interp.analysis.interventions.grid import site_grid_units
from interp.analysis.interventions.patching import patch_from, probs_at, rows_per_pass
from interp.analysis.interventions.sites import Site, answer_positions, rival_answers
from interp.tasks.base import Batch
from models.memory import progress_enabled


def measure(model, clean: Batch, corrupt: Batch, sites: list[Site], batch_size, answer, skip_noops: bool,
            resume: bool, metrics, max_memory, progress: bool, min_effect: float = 0.0, plan_sites=None, shared=None,
            announce: bool | None = None) -> dict[str, torch.Tensor]:
    """The raw numbers of one interchange run: p_patched [S, N], p_clean [N], p_corrupt [N],
    stats [3] (pairs run, skipped, passes) and, with metrics, scores [S, N, 2] (logit
    difference, KL), ld_clean [N], scores_corrupt [N, 2]. No pair is run when min_effect keeps
    no example (kept_gate; announce: what it says). plan_sites, shared: one unit of a grid
    (patching.patch_from)."""
    batch_size = rows_per_pass(batch_size, len(clean))
    clean_ans = answer_positions(clean, answer, "clean")
    corrupt_ans = answer_positions(corrupt, answer, "corrupt")
    y = clean.targets[torch.arange(len(clean)), clean_ans]  # [N] the clean answer tokens
    rows = torch.arange(len(clean))
    extras: dict = {}

    def score_from(clean_at, corrupt_at):  # logits [N, V] at the clean / corrupt answer positions
        """Per-pair scores [R, m]: logit(y) - logit(y') and KL(p_clean || p) at the answer."""
        at = corrupt_at.double()  # [N, V]
        y_corrupt = rival_answers(corrupt, at, y, corrupt_ans)
        clean_logp = clean_at.double().log_softmax(-1)  # [N, V]

        def score(logits_at, examples):  # [R, V], [R]
            logits_at = logits_at.double()
            ld = logits_at.gather(1, y[examples, None]) - logits_at.gather(1, y_corrupt[examples, None])
            logp = clean_logp[examples]
            kl = (logp.exp() * (logp - logits_at.log_softmax(-1))).sum(-1, keepdim=True)
            return torch.cat([ld, kl], 1)

        clean_at = clean_at.double()
        extras.update(ld_clean=clean_at[rows, y] - clean_at[rows, y_corrupt], scores_corrupt=score(at, rows))
        return score

    with models.instrumented():
        clean_at, _, p_corrupt, p_patched, scores, stats = patch_from(
            model, clean, corrupt, sites, y, corrupt_ans, batch_size, skip_noops, ("clean", "corrupt"), resume,
            score_from=score_from if metrics else None, source_ans=clean_ans, max_memory=max_memory,
            progress=progress, plan_sites=plan_sites, shared=shared,
            gate=kept_gate(clean, corrupt, len(sites), min_effect, announce),
        )
    raw = dict(p_patched=p_patched, p_clean=probs_at(clean_at, y), p_corrupt=p_corrupt,
               stats=torch.tensor([stats["run"], stats["skipped"], stats["passes"]]))
    if metrics:
        raw.update(scores=scores, **extras)
    return raw


def restoration(p_patched: torch.Tensor, p_clean: torch.Tensor, p_corrupt: torch.Tensor,
                min_effect: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    """(restoration [S, N] with NaN where dropped, kept [N]) from p_patched [S, N], p_clean, p_corrupt [N]."""
    effect = p_clean - p_corrupt
    kept = effect > min_effect
    value = (p_patched - p_corrupt) / torch.where(kept, effect, torch.ones_like(effect))
    return torch.where(kept, value, torch.full_like(value, float("nan"))), kept


def kept_gate(clean: Batch, corrupt: Batch, n_sites: int, min_effect: float, announce: bool | None):
    """gate(p_clean [N], p_corrupt [N]) -> whether any example passes min_effect (identical clean
    and corrupted tokens always count), for patching.patch_from: called once the clean and
    corrupted runs are cached, before any patched pass. announce: None says nothing (a unit of a
    grid); else one line on stderr when none is kept, and the count kept when announce is True
    (a progress flag)."""
    identical = (clean.tokens == corrupt.tokens).all(1)

    def gate(p_clean: torch.Tensor, p_corrupt: torch.Tensor) -> bool:
        kept = restoration(p_clean[None], p_clean, p_corrupt, min_effect)[1] | identical
        n_kept, n = int(kept.sum()), len(kept)
        if announce is not None and n_kept == 0:
            largest, best = float((p_clean - p_corrupt).max()), float(p_clean.max())
            print(f"interchange: none of the {n} examples has p_clean - p_corrupt > min_effect {min_effect:g} at its "
                  f"answer (largest {largest:.3g}, p_clean at most {best:.3g}): "
                  f"no (site, example) pair is run and every restoration is NaN; lower min_effect or check the "
                  f"model predicts the answers", file=sys.stderr)
        elif announce is not None and progress_enabled(announce):
            print(f"interchange: {n_kept} of {n} examples pass min_effect {min_effect:g}; "
                  f"running up to {n_sites * n} (site, example) pairs", file=sys.stderr)
        return n_kept > 0

    return gate


PER_EXAMPLE = ("p_clean", "p_corrupt", "ld_clean", "scores_corrupt")  # the rest is per pair [S, N, ...]


_SHARED: dict = {}   # the cached runs of the last example chunk this process ran a unit of: key -> (kept, runs)


def interchange_unit(model, inputs: dict, spec: dict) -> dict[str, torch.Tensor]:
    """One unit's raw numbers (a worker runs this; interventions.grid). Its examples' clean and
    corrupted runs are cached once per process for every unit of the same examples: planned for
    the whole grid's sites, they are the same runs whichever unit asks first (shared_runs)."""
    (s0, s1), (e0, e1) = spec["sites"], spec["examples"]
    examples = slice(e0, e1)
    return measure(model, inputs["clean"].select(examples), inputs["corrupt"].select(examples),
                   inputs["sites"][s0:s1], **inputs["options"], max_memory=inputs["max_memory"], progress=False,
                   plan_sites=inputs["sites"], shared=lambda runs: shared_runs(model, inputs, (e0, e1), runs))


def shared_runs(model, inputs: dict, examples: tuple[int, int], runs):
    """runs() of this grid's example chunk, computed once per process: the entry is keyed by the
    objects of the grid (model, batches, sites; held by the entry, so their ids stay theirs), the
    weights' storages and version counters (a model changed in place misses), the options and the
    chunk. One entry at a time; clear_shared_runs() drops it."""
    kept = (model, inputs["clean"], inputs["corrupt"], inputs["sites"])
    weights = tuple((t.data_ptr(), t._version) for t in model.state_dict().values())
    key = (tuple(map(id, kept)), weights, repr(inputs["options"]), inputs["max_memory"], examples)
    if key not in _SHARED:
        _SHARED.clear()
        _SHARED[key] = (kept, runs())
    return _SHARED[key][1]


def clear_shared_runs() -> None:
    _SHARED.clear()


def interchange_grid(model, clean: Batch, corrupt: Batch, sites: list[Site], options: dict, max_memory,
                     chunk, executor, out, progress: bool) -> dict[str, torch.Tensor]:
    """measure's numbers for the whole grid, run as units (interventions.grid)."""
    inputs = {"clean": clean, "corrupt": corrupt, "sites": list(sites), "options": options}
    try:
        return site_grid_units(model, interchange_unit, inputs, len(sites), len(clean), PER_EXAMPLE, "interchange",
                               options, max_memory, chunk, executor, out, progress)
    finally:
        clear_shared_runs()   # units run here hold their runs no longer than the grid
