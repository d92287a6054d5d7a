"""Attribution patching: the estimate is the directional derivative of the patched answer
probability along each interchange (finite differences), on every kind of site; rows line up
with interchange's."""

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

import models
from interp.analysis.interventions import Site, attribute, interchange, site_positions
from interp.analysis.interventions.patching import _patch_hooks, _source_from_cache, answer_probs

sys.path.insert(0, str(Path(__file__).parent))
from test_interventions import TASK, VOCAB, ar_batch, corrupt_ar  # noqa: E402


@pytest.fixture(scope="module")
def pair():
    clean = ar_batch(6, 3, seed=0)
    return clean, corrupt_ar(clean, TASK, seed=1)


def partial_patch_probs(model, clean, corrupt, sites, eps):
    """p(y) [S, N] with each site moved the fraction eps from the corrupt value towards the clean."""
    n = len(clean)
    y = clean.targets[torch.arange(n), -1]
    with torch.no_grad(), models.instrumented():
        _, cache = model.run_with_cache(clean.tokens, names=sorted({s.hook for s in sites}))
        source = _source_from_cache(sites, cache, [site_positions(clean, s.position) for s in sites])
        out = torch.empty(len(sites), n, dtype=torch.float64)
        for i in range(len(sites)):
            rows = torch.full((n,), i), torch.arange(n)
            towards = lambda s, ex, cur: cur + eps * (source(s, ex, cur) - cur)  # noqa: E731
            hooks = _patch_hooks(sites, *rows, [site_positions(corrupt, s.position) for s in sites], towards,
                                 clean.tokens.shape[1])
            logits = model.run_with_hooks(corrupt.tokens, fwd_hooks=hooks)
            out[i] = answer_probs(logits, torch.full((n,), clean.tokens.shape[1] - 1), y)
    return out


@pytest.mark.parametrize("name", ["mamba", "transformer", "deltanet", "s4d"])
def test_attribution_is_the_derivative_along_each_interchange(name, pair):
    clean, corrupt = pair
    # a role at other positions in the corrupted run: the clean key patched into the corrupted value
    clean = dataclasses.replace(clean, roles={**clean.roles, "moved": clean.roles["key"]})
    corrupt = dataclasses.replace(corrupt, roles={**corrupt.roles, "moved": corrupt.roles["value"]})
    torch.manual_seed(0)
    model = models.build(name, vocab_size=VOCAB, d_model=16, n_heads=2, d_state=4, n_layers=2).double()
    hooks = [h for h in model.hook_names() if h.startswith("blocks.0.") and h.endswith(
        ("hook_resid_pre", "mixer.hook_out", "mixer.hook_state", "hook_pattern", "hook_v", "hook_result"))]
    sites = [Site(h, role) for h in hooks for role in ("key", "value", "moved")] + [Site("blocks.1.hook_resid_pre", None)]
    sites += [Site(h, "key", head=1) for h in hooks if h.endswith(("hook_v", "hook_pattern", "hook_result"))]
    sites += [Site("blocks.1.hook_resid_mid", "value", subspace=torch.linalg.qr(torch.randn(16, 3)).Q.double())]
    estimate = attribute(model, clean, corrupt, sites, min_effect=0.0)
    exact = interchange(model, clean, corrupt, sites, min_effect=0.0)
    assert estimate.labels == exact.labels
    torch.testing.assert_close(estimate.p_corrupt, exact.p_corrupt, atol=1e-12, rtol=0)
    torch.testing.assert_close(estimate.p_clean, exact.p_clean, atol=1e-12, rtol=0)
    eps = 1e-6
    finite = (partial_patch_probs(model, clean, corrupt, sites, eps) - exact.p_corrupt) / eps
    slope = estimate.p_patched - estimate.p_corrupt
    torch.testing.assert_close(slope, finite, atol=1e-6 + 1e-4 * finite.abs().max().item(), rtol=1e-3)
    assert slope.abs().max() > 1e-4


def test_attribution_checks_its_arguments(pair):
    clean, corrupt = pair
    model = models.build("tanh_rnn", vocab_size=VOCAB, d_model=8)
    with pytest.raises(ValueError, match="min_effect"):
        attribute(model, clean, corrupt, [Site("blocks.0.mixer.hook_out", "key")], min_effect=-1)
    with pytest.raises(ValueError, match="hook_ot"):
        attribute(model, clean, corrupt, [Site("blocks.0.mixer.hook_ot", "key")])
