"""Interchange interventions, ablations and corruptions on named sites.

A `Site(hook, position, head=None, subspace=None)` names one activation (interventions.sites:
roles as positions, one head, a subspace).

Modules: `sites` (Site, grids, positions), `patching` (the patch engine), `planning` (memory:
what runs, caches and passes hold, estimated up front against `max_memory`; recurrent states
recomputed per block and kept only at resume positions), `interchange`,
`attribution` (attribution patching: every interchange's first-order estimate from one forward
and backward; `agreement` scores it against interchange), `ablation`, `corruption`; the public names are re-exported here.

Layout: activations are [B, T, ...] with the head axis (if any) third, except `hook_pattern`
and `hook_attn_scores` [B, H, T, T], whose position is the query axis (2) and head axis 1.

Interchange (docs/restoration.md). The clean run is cached once (only the hooks the sites need);
the corrupted run is replayed with one site patched from the clean run. Many sites and example
pairs go through one forward pass: each row of a pass is one (site, example) pair - a corrupted
example, repeated once per site - and one hook per hook name writes each row's own site from the
clean cache. Pairs whose patch cannot change the answer (a site after the answer position, or a
clean value equal to the corrupted one) are not run. A hook on `hook_state` that changes the
states is a causal state patch (models.hooks.state.scan_with_state_hook), so patching the state at a
position makes the recurrence continue from the clean state.

    restoration[s, b] = (p_patched[s, b](y_b) - p_corrupt[b](y_b)) / (p_clean[b](y_b) - p_corrupt[b](y_b))

where y_b is the clean answer token: the clean target at the answer-prediction position (by
default the last loss_mask position of each example; `answer=<role>` names a role instead).
Examples with p_clean - p_corrupt <= min_effect are dropped (restoration NaN) and counted.

Every run reads its logits at the answer position only ([rows, V]): memory does not grow with
vocab x positions. Every forward pass of one call runs on the instrumented path (`models.instrumented()`), so clean,
corrupt and patched runs are computed alike: patching a run with its own values gives back its
probabilities bit for bit.

Ablations: `ablate` replaces a site by zero or by its mean over a reference batch (the subspace
component only, for subspace sites) and reports the answer probability and accuracy per site.
`ablate_short_conv(model, width, mode)` shortens every short convolution in place at load time.

Corruptions: `corrupt_ar` / `corrupt_atr` / `corrupt_key` replace the queried key's occurrences
in context by a key absent from the example, so the query no longer matches; `corrupt_ar_value` /
`corrupt_value` swap the queried value instead (the corrupted run then has its own answer).
"""

from interp.analysis.interventions.ablation import (ABLATION_MODES, SHORT_CONV_MODES, AblationResult, ablate,
                                                    ablate_short_conv, short_convs, site_means)
from interp.analysis.interventions.attribution import agreement, attribute
from interp.analysis.interventions.corruption import (corrupt_ar, corrupt_ar_value, corrupt_atr, corrupt_key,
                                                      corrupt_value)
from interp.analysis.interventions.interchange import (EXTRA_METRICS, METRICS, InterchangeResult, interchange,
                                                       restoration)
from interp.analysis.interventions.patching import patched_answer_probs, patched_probs, run_cached
from interp.analysis.interventions.sites import (Site, answer_positions, answer_probs, check_pair, check_sites,
                                                 check_subspace, site_grid, site_positions)

__all__ = [
    "ABLATION_MODES", "AblationResult", "EXTRA_METRICS", "InterchangeResult", "METRICS", "SHORT_CONV_MODES",
    "Site", "ablate", "ablate_short_conv", "agreement", "answer_positions", "answer_probs", "attribute", "check_pair",
    "check_sites", "check_subspace", "corrupt_ar", "corrupt_ar_value", "corrupt_atr", "corrupt_key",
    "corrupt_value", "interchange", "patched_answer_probs", "patched_probs", "restoration", "run_cached",
    "short_convs", "site_grid", "site_means", "site_positions",
]
