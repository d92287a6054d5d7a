"""Attribution patching: the estimate is the directional derivative of the patched answer
probability (and logit difference, KL) along each interchange (finite differences), on every kind
of site; rows line up with interchange's."""

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

import models
from interp.analysis.interventions import Site, attribute, interchange, site_positions
from interp.analysis.interventions.patching import _patch_hooks, _source_from_cache
from interp.analysis.interventions.sites import rival_answers

sys.path.insert(0, str(Path(__file__).parent))
from test_interventions import TASK, VOCAB, ar_batch, corrupt_ar  # noqa: E402


@pytest.fixture(scope="module")
def pair():
    clean = ar_batch(6, 3, seed=0)
    return clean, corrupt_ar(clean, TASK, seed=1)


def partial_patch_logits(model, clean, corrupt, sites, eps):
    """Answer logits [S, N, V] with each site moved the fraction eps from the corrupt value towards the clean."""
    n = len(clean)
    with torch.no_grad(), models.instrumented():
        _, cache = model.run_with_cache(clean.tokens, names=sorted({s.hook for s in sites}))
        source = _source_from_cache(sites, cache, [site_positions(clean, s.position) for s in sites])
        out = []
        for i in range(len(sites)):
            rows = torch.full((n,), i), torch.arange(n)
            towards = lambda s, ex, cur: cur + eps * (source(s, ex, cur) - cur)  # noqa: E731
            hooks = _patch_hooks(sites, *rows, [site_positions(corrupt, s.position) for s in sites], towards,
                                 clean.tokens.shape[1])
            out.append(model.run_with_hooks(corrupt.tokens, fwd_hooks=hooks)[:, -1].double())  # the answer position
    return torch.stack(out)


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
    estimate = attribute(model, clean, corrupt, sites, min_effect=0.0, metrics=["logit_diff", "kl"])
    exact = interchange(model, clean, corrupt, sites, min_effect=0.0, metrics=["logit_diff", "kl"])
    assert estimate.labels == exact.labels
    for name in ("p_corrupt", "p_clean", "logit_diff_clean", "logit_diff_corrupt", "kl_corrupt"):
        torch.testing.assert_close(getattr(estimate, name), getattr(exact, name), atol=1e-12, rtol=0)
    eps = 1e-6
    logits = partial_patch_logits(model, clean, corrupt, sites, eps)  # [S, N, V]
    rows, y, last = torch.arange(len(clean)), clean.targets[:, -1], clean.tokens.shape[1] - 1
    rival = rival_answers(corrupt, model(corrupt.tokens)[:, -1].double(), y, torch.full((len(clean),), last))
    clean_logp = model(clean.tokens)[:, -1].double().log_softmax(-1)
    moved = {"p_patched": logits.softmax(-1)[:, rows, y],
             "logit_diff_patched": logits[:, rows, y] - logits[:, rows, rival],
             "kl_patched": (clean_logp.exp() * (clean_logp - logits.log_softmax(-1))).sum(-1)}
    for name, at_eps in moved.items():
        base = {"p_patched": exact.p_corrupt, "logit_diff_patched": exact.logit_diff_corrupt,
                "kl_patched": exact.kl_corrupt}[name]
        finite = (at_eps.detach() - base) / eps
        slope = getattr(estimate, name) - base
        torch.testing.assert_close(slope, finite, atol=1e-6 + 1e-4 * finite.abs().max().item(), rtol=1e-3,
                                   msg=lambda m: f"{name}: {m}")
        assert slope.abs().max() > 1e-4


def test_attribution_checks_its_arguments(pair):
    clean, corrupt = pair
    model = models.build("tanh_rnn", vocab_size=VOCAB, d_model=8)
    with pytest.raises(ValueError, match="min_effect"):
        attribute(model, clean, corrupt, [Site("blocks.0.mixer.hook_out", "key")], min_effect=-1)
    with pytest.raises(ValueError, match="hook_ot"):
        attribute(model, clean, corrupt, [Site("blocks.0.mixer.hook_ot", "key")])
    with pytest.raises(ValueError, match="metrics"):
        attribute(model, clean, corrupt, [Site("blocks.0.mixer.hook_out", "key")], metrics=["restoration"])


@pytest.mark.parametrize("name", models.list_models())
def test_every_model_of_the_zoo_attributes_its_derivative(name, pair):
    """On every model: the estimate at a block input, a mixer output and (where the mixer has
    one) the recurrent state is the finite-difference slope of the patched answer probability."""
    clean, corrupt = pair
    torch.manual_seed(0)
    model = models.build(name, vocab_size=VOCAB, d_model=16, n_heads=2, d_state=4, n_layers=2).double()
    sites = [Site("blocks.1.hook_resid_pre", "key"), Site("blocks.0.mixer.hook_out", "value")]
    sites += [Site("blocks.0.mixer.hook_state", "key")] if "blocks.0.mixer.hook_state" in model.hook_names() else []
    estimate = attribute(model, clean, corrupt, sites, min_effect=0.0)
    exact = interchange(model, clean, corrupt, sites, min_effect=0.0)
    torch.testing.assert_close(estimate.p_corrupt, exact.p_corrupt, atol=1e-12, rtol=0)
    eps = 1e-6
    at_eps = partial_patch_logits(model, clean, corrupt, sites, eps).softmax(-1)[:, torch.arange(len(clean)),
                                                                                 clean.targets[:, -1]]
    finite, slope = (at_eps - exact.p_corrupt) / eps, estimate.p_patched - exact.p_corrupt
    torch.testing.assert_close(slope, finite, atol=1e-6 + 1e-4 * finite.abs().max().item(), rtol=1e-3)
    assert slope.abs().max() > 1e-6
