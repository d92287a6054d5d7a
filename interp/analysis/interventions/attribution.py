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
by row. Every run is on the instrumented path (`models.instrumented()`), as in interchange.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

import models
from interp.analysis.interventions.interchange import InterchangeResult, restoration
from interp.analysis.interventions.patching import select_site, time_first
from interp.analysis.interventions.sites import Site, answer_positions, answer_probs, check_pair, check_sites, site_positions
from interp.tasks.base import Batch


def attribute(
    model,
    clean: Batch,
    corrupt: Batch,
    sites: Sequence[Site],
    min_effect: float = 0.01,
    answer: str | None = None,
) -> InterchangeResult:
    """Attribution-patching estimates of interchange(model, clean, corrupt, sites) (module docstring)."""
    if isinstance(min_effect, bool) or not isinstance(min_effect, (int, float)) or min_effect < 0:
        raise ValueError(f"min_effect must be a float >= 0; got {min_effect!r}")
    check_pair(clean, corrupt)
    sites = check_sites(model, sites)
    hooks = sorted({s.hook for s in sites})
    clean_ans = answer_positions(clean, answer, "clean")
    corrupt_ans = answer_positions(corrupt, answer, "corrupt")
    rows = torch.arange(len(clean))
    y = clean.targets[rows, clean_ans]  # [N] the clean answer tokens

    def answer_mass(logits: torch.Tensor) -> torch.Tensor:  # sum_b p_b(y_b) at the corrupt answer
        return logits[rows, corrupt_ans].softmax(-1)[rows, y].sum()

    with models.instrumented():
        with torch.no_grad():
            clean_logits, clean_cache = model.run_with_cache(clean.tokens, names=hooks)
        corrupt_logits, cache = model.run_with_cache(corrupt.tokens, names=hooks, incl_bwd=True, metric=answer_mass)
    p_clean = answer_probs(clean_logits, clean_ans, y)
    p_corrupt = answer_probs(corrupt_logits, corrupt_ans, y)
    delta = torch.zeros(len(sites), len(clean), dtype=torch.float64)
    for i, site in enumerate(sites):
        grad_name = site.hook + "_grad"
        if grad_name not in cache:  # the answer does not depend on this activation
            continue
        source_pos = site_positions(clean, site.position, "clean")  # [N, k]
        target_pos = site_positions(corrupt, site.position, "corrupt")
        a_clean = select_site(time_first(clean_cache[site.hook], site.hook), rows, source_pos, site)
        a_corrupt = select_site(time_first(cache[site.hook], site.hook), rows, target_pos, site)
        grad = select_site(time_first(cache[grad_name], site.hook), rows, target_pos, site)
        diff = a_clean - a_corrupt  # [N, k, ...]
        if site.subspace is not None:
            basis = site.subspace.to(diff.real.dtype)
            flat = diff.reshape(*diff.shape[:2], -1)
            diff = ((flat @ basis) @ basis.T).reshape(diff.shape)
        product = diff * grad.conj() if diff.is_complex() else diff * grad  # torch's complex grad: d/dRe + i d/dIm
        delta[i] = product.real.reshape(len(clean), -1).sum(-1).double()
    p_estimate = p_corrupt + delta
    values, kept = restoration(p_estimate, p_clean, p_corrupt, float(min_effect))
    return InterchangeResult(sites, values, p_estimate, p_clean, p_corrupt, kept, float(min_effect))
