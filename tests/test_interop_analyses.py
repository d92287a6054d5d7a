"""Every analysis of the toolkit on imported models (tiny random transformers Mamba, GPT-2 and
the Jamba hybrid): caches, causal state patches (against the source run step by step from the
patched state), resid patches (against the same patch hooked into the source), interchange,
ablations, dynamics Jacobians and the drift probe."""

import numpy as np
import pytest
import torch

import models
from interp.analysis import dynamics
from interp.analysis import error_control as ec
from interp.analysis.interventions import (
    Site,
    ablate,
    corrupt_ar,
    interchange,
    site_grid,
)
from interp.tasks import make_task
from interp.training.evaluate import stream_seed
from models.interop.convert import layer_output
from models.interop.reference import stepwise_logits
from probes import subspace as ps
from tests.interop_parity import jitter
from tests.test_interventions import TASK, VOCAB, ar_batch

tf = pytest.importorskip("transformers")
IDS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)


def source(name: str, vocab: int = VOCAB):
    torch.manual_seed(0)
    if name == "mamba":
        model = tf.MambaForCausalLM(tf.MambaConfig(vocab_size=vocab, hidden_size=16, state_size=4, num_hidden_layers=2,
                                                   conv_kernel=3, **IDS))
    elif name == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=vocab, n_embd=16, n_layer=2, n_head=4, n_positions=64,
                                                 attn_implementation="eager", **IDS))
    else:
        model = tf.JambaForCausalLM(tf.JambaConfig(
            vocab_size=vocab, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=0, mamba_d_state=4, mamba_d_conv=3,
            num_experts=1, **IDS))
    return jitter(model, scale=0.3)


@pytest.fixture(scope="module", params=["mamba", "gpt2", "jamba"])
def imported(request):
    src = source(request.param)
    return request.param, src, models.from_pretrained(src)


@pytest.fixture(scope="module")
def pair():
    clean = ar_batch(12, 4, seed=0)
    return clean, corrupt_ar(clean, TASK, seed=1)


def test_run_with_cache_exposes_the_source_internals(imported, pair):
    name, src, model = imported
    tokens = pair[0].tokens
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        out = src(tokens, use_cache=True, output_attentions=name == "gpt2")
    torch.testing.assert_close(logits, out.logits, atol=1e-4, rtol=0)
    assert set(cache) == set(model.hook_names())
    if name in ("mamba", "jamba"):  # our last state is the source's cached recurrent state, same layout
        torch.testing.assert_close(cache["blocks.1.mixer.hook_state"][:, -1],
                                   out.cache.get_recurrent_state(1, state_idx=0), atol=1e-5, rtol=0)
    if name == "gpt2":
        for layer, attention in enumerate(out.attentions):
            torch.testing.assert_close(cache[f"blocks.{layer}.mixer.hook_pattern"], attention, atol=1e-6, rtol=0)


def test_causal_state_patch_equals_the_source_continued_from_the_patched_state(imported, pair):
    """A hook_state patch of the last layer at step t: every later step continues from the patched
    state, as the source run token by token with its cached state replaced after step t. Ours
    also reads the patched state out at t itself (the source's step loop cannot: its read-out of
    step t is done when the cache is patched), so logits agree at every position but t."""
    name, src, model = imported
    if name == "gpt2":
        pytest.skip("GPT-2 has no recurrent state (its resid patch is tested below)")
    clean, corrupt = pair
    t, hook = 4, "blocks.1.mixer.hook_state"  # jamba: attention, mamba
    with torch.no_grad():
        _, donor = model.run_with_cache(clean.tokens, names=[hook])

        def patch(state, hook):
            state[:, t] = donor[hook.name][:, t]
            return state

        ours = model.run_with_hooks(corrupt.tokens, fwd_hooks=[(hook, patch)])
        unpatched = model(corrupt.tokens)
    reference = stepwise_logits(src, corrupt.tokens, {(1, t): donor[hook][:, t].clone()})
    prefilled = stepwise_logits(src, corrupt.tokens, {(1, t): donor[hook][:, t].clone()}, prefill=t + 1)
    torch.testing.assert_close(prefilled, reference, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="outside"):
        stepwise_logits(src, corrupt.tokens, {(1, t): donor[hook][:, t]}, prefill=t + 2)
    torch.testing.assert_close(ours[:, t + 1:], reference[:, t + 1:], atol=1e-4, rtol=0)
    torch.testing.assert_close(reference[:, : t + 1], unpatched[:, : t + 1], atol=1e-4, rtol=0)
    assert torch.equal(ours[:, :t], unpatched[:, :t])
    assert (ours[:, t] - unpatched[:, t]).abs().max() > 1e-3  # our read-out at t sees the patch
    assert (ours[:, t + 1:] - unpatched[:, t + 1:]).abs().max() > 1e-3  # and it propagates


def test_resid_patch_equals_the_same_patch_hooked_into_the_source(imported, pair):
    _, src, model = imported
    tokens, t = pair[0].tokens, 5
    converter = models.interop.registry.converter_for(type(src).__name__, src.config.model_type)

    def ours(act, hook):
        act[:, t] = act[:, t] * 2.0
        return act

    def theirs(module, inputs, output):
        hidden = layer_output(output).clone()
        hidden[:, t] = hidden[:, t] * 2.0
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    handle = converter.source_blocks(src)[0].register_forward_hook(theirs)
    try:
        with torch.no_grad():
            expected = src(tokens).logits
    finally:
        handle.remove()
    with torch.no_grad():
        patched = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_post", ours)])
    torch.testing.assert_close(patched, expected, atol=1e-4, rtol=0)


def test_interchange_resumed_equals_whole_passes(imported, pair):
    _, _, model = imported
    clean, corrupt = pair
    sites = site_grid(model, ["blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_out"], ["key", "value"])
    resumed, whole = (interchange(model, clean, corrupt, sites, min_effect=0.0, resume=r) for r in (True, False))
    torch.testing.assert_close(resumed.p_patched, whole.p_patched, atol=1e-6, rtol=0)
    own = interchange(model, clean, clean, sites, min_effect=0.0)
    assert torch.equal(own.p_patched, own.p_clean.expand_as(own.p_patched))  # a patch with its own values
    assert (whole.p_patched - whole.p_corrupt).abs().max() > 1e-4


def test_ablations_resumed_equal_whole_passes(imported, pair):
    _, _, model = imported
    clean, _ = pair
    hooks = [h for h in model.hook_names() if h.endswith(("mixer.hook_out", "mixer.hook_state"))]
    sites = [Site(h, role) for h in hooks for role in ("key", "query")]
    for mode in ("zero", "mean"):
        resumed, whole = (ablate(model, clean, sites, mode=mode, resume=r) for r in (True, False))
        torch.testing.assert_close(resumed.p_answer, whole.p_answer, atol=1e-6, rtol=0)
        assert (whole.p_answer - whole.baseline_p).abs().max() > 1e-4


def test_dynamics_jacobians(imported, pair):
    name, _, model = imported
    tokens = pair[0].tokens[:3]
    if name == "gpt2":
        with pytest.raises(ValueError, match="not a RecurrentMixer"):
            dynamics.jacobians(model, tokens, layer=0)
        return
    structured = dynamics.jacobians(model, tokens, layer=1, method="structured")  # jamba: attention, mamba
    autograd = dynamics.jacobians(model, tokens, layer=1, method="autograd", chunk_size=4)
    assert structured.diagonal
    torch.testing.assert_close(structured.dense(), autograd.values, atol=1e-5, rtol=1e-5)
    values = structured.values  # exp(dt A): every entry in (0, 1)
    assert values.min() > 0 and values.max() < 1


@pytest.mark.parametrize("name", ["mamba", "gpt2"])
def test_drift_probe_equals_the_probes_on_the_same_cache(name):
    task = make_task("C6", format="acot")
    model = models.from_pretrained(source(name, vocab=task.vocab_size))
    result = ec.analyze(model, task, 12, [12, 24], n_fit=10, n_drift=6, n_eval=8, n_jac=2, seed=5, chunk=4,
                        calibrate=False)
    site = ec.default_site(model)
    assert result.site == site == ("blocks.1.mixer.hook_state" if name == "mamba" else "blocks.1.hook_resid_post")
    fit = task.sample(10, 12, stream_seed(5, ec.FIT_STREAM, 0))
    with torch.no_grad():
        _, cache = model.run_with_cache(fit.tokens, names=[site])
    sub = ps.state_subspace(ps.centroids(cache[site].float(), fit.states))
    np.testing.assert_allclose(result.subspace.basis, sub.basis, atol=1e-6)
    long = task.sample(6, 24, stream_seed(5, ec.DRIFT_STREAM, 0))
    with torch.no_grad():
        _, cache = model.run_with_cache(long.tokens, names=[site])
    np.testing.assert_allclose(result.drift.q, ps.drift(cache[site].float(), long.states, sub).q, rtol=1e-6)
    assert (result.contraction is not None) == (name == "mamba")
