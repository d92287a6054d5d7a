"""from_pretrained(transformers Lfm2ForCausalLM): parity of logits, every block and the gradients
on tiny random configs (every parameter jittered); hook_conv and hook_state against the source's
own conv activations and conv cache; a window patch against the source's cache patched while it
decodes; decoding against the full forward and HF generate; round trip; refusals."""

import pytest
import torch

import models
from models.interop import UnsupportedConfig
from tests.interop_parity import VOCAB, assert_causal_state_patch, assert_parity, assert_round_trip, jitter
from tests.test_interop_fla import with_config

tf = pytest.importorskip("transformers")
T = 20
IDS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)


def lfm2_source(**overrides):
    """conv, attention, conv (full_attn_idxs [1]), W = 3, GQA 4 / 2 heads, RoPE with qk norm."""
    torch.manual_seed(0)
    fields = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, full_attn_idxs=[1], conv_L_cache=3, block_multiple_of=8, norm_eps=1e-5,
                  tie_word_embeddings=False, **IDS)
    return jitter(tf.Lfm2ForCausalLM(tf.Lfm2Config(**{**fields, **overrides})))


def tokens(batch=2, length=T, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("overrides", [
    {},
    dict(conv_bias=True, conv_L_cache=4, tie_word_embeddings=True, norm_eps=1e-3),
    dict(full_attn_idxs=[2], block_auto_adjust_ff_dim=False),
])
def test_parity(overrides):
    source = lfm2_source(**overrides)
    model = models.from_pretrained(source)
    kinds = ["lfm2_conv" if kind == "conv" else "attention" for kind in source.config.layer_types]
    assert model.cfg.mixers == kinds
    assert_parity(source, model, tokens(), atol=1e-4)


def test_conv_layers_only():
    """No attention layer: no positions (transformers' cache then cannot count its length, so the
    source runs without one)."""
    source = lfm2_source(full_attn_idxs=[])
    model = models.from_pretrained(source)
    assert model.cfg.mixers == ["lfm2_conv"] * 3 and model.cfg.positional == "none"
    with torch.no_grad():
        expected = source(tokens(), use_cache=False).logits
        for path in ("fast", "instrumented"):
            torch.testing.assert_close(model.set_execution_path(path)(tokens()), expected, atol=1e-4, rtol=0)


def test_hook_conv_and_state_are_the_sources_conv():
    """hook_gate * hook_conv is what the source's out_proj reads; hook_state at the last step is
    the source's conv cache (the last W conv inputs) and hook_bx its newest column."""
    source = lfm2_source()
    model = models.from_pretrained(source)
    conv = source.model.layers[2].conv
    seen = {}
    handle = conv.out_proj.register_forward_pre_hook(lambda m, args: seen.setdefault("gated", args[0]))
    names = [f"blocks.2.mixer.{n}" for n in ("hook_conv", "hook_gate", "hook_state", "hook_bx")]
    try:
        with torch.no_grad():
            out = source(tokens(), use_cache=True)
            _, cache = model.run_with_cache(tokens(), names=names)
    finally:
        handle.remove()
    conv_cache = out.past_key_values.get_conv_state(2)  # [B, C, W]
    mixer = "blocks.2.mixer."
    torch.testing.assert_close(cache[mixer + "hook_gate"] * cache[mixer + "hook_conv"], seen["gated"], atol=1e-5, rtol=0)
    assert cache[mixer + "hook_state"].shape == (2, T, 16, 3)
    torch.testing.assert_close(cache[mixer + "hook_state"][:, -1], conv_cache, atol=1e-6, rtol=0)
    torch.testing.assert_close(cache[mixer + "hook_state"][:, :, :, -1], cache[mixer + "hook_bx"], atol=0, rtol=0)


def test_every_hook_is_reachable():
    """run_with_cache over every listed hook point of the import (hook_names(): the opt-in per-head
    attention inputs are requested by name only): each is recorded, and the logits are those of
    the plain forward."""
    model = models.from_pretrained(lfm2_source())
    with torch.no_grad():
        plain = model(tokens())
        logits, cache = model.run_with_cache(tokens())
    torch.testing.assert_close(logits, plain, atol=1e-6, rtol=0)
    for name in model.hook_names():
        assert name in cache, name
    assert cache["blocks.0.mixer.hook_conv"].shape == (2, T, 16)
    assert cache["blocks.1.mixer.hook_pattern"].shape == (2, 4, T, T)


def hf_stepwise_patched(source, toks, layer, t, window):
    """The source decoding one token at a time through its own cache, its conv cache of `layer`
    replaced by window [B, C, W] right after step t -> logits [B, T, V]."""
    cache, logits = None, []
    with torch.no_grad():
        for s in range(toks.shape[1]):
            out = source(input_ids=toks[:, s : s + 1], cache=cache, use_cache=True)
            cache = out.past_key_values
            if s == t:
                cache.get_conv_state(layer).copy_(window)
            logits.append(out.logits)
    return torch.cat(logits, dim=1)


def test_window_patch_equals_the_sources_patched_cache():
    """A hook_state patch at step t on a conv layer gives the logits of the source decoding with
    its conv cache replaced by the same window after step t, at every later step (the source's
    read-out at t is done before its cache is patched; ours reads the patched window there). On
    the last layer, so that no attention reads our changed output at t; the window forgets after
    W - 1 = 2 steps."""
    source = lfm2_source()
    model = models.from_pretrained(source)
    toks, t = tokens(), 7
    window = torch.randn(2, 16, 3, generator=torch.Generator().manual_seed(3))

    def patch(state, hook):
        state[:, t] = window
        return state

    with torch.no_grad():
        ours = model.run_with_hooks(toks, fwd_hooks=[("blocks.2.mixer.hook_state", patch)])
        unpatched = model(toks)
    expected = hf_stepwise_patched(source, toks, 2, t, window)
    torch.testing.assert_close(ours[:, t + 1:], expected[:, t + 1:], atol=1e-4, rtol=0)
    torch.testing.assert_close(expected[:, : t + 1], unpatched[:, : t + 1], atol=1e-4, rtol=0)
    changed = (ours - unpatched).abs().amax((0, 2))  # [T]
    assert bool((changed[t : t + 3] > 1e-3).all()) and bool((changed[t + 3:] == 0).all())
    assert_causal_state_patch(model, toks, "blocks.0.mixer.hook_state", t, (16, 3))


def decoded_step_by_step(model, tokens, prompt: int):
    """models.decoding.step.advance over tokens [B, T]: the first `prompt` in one call, then one token
    a call; each call's logits must equal the full forward on tokens (1e-5). -> the final state."""
    from models.decoding.step import advance

    with torch.no_grad():
        full = model(tokens)
        logits, state = advance(model, tokens[:, :prompt], all_logits=True)
        steps = [logits]
        for s in range(prompt, tokens.shape[1]):
            step, state = advance(model, tokens[:, s : s + 1], state, all_logits=True)
            steps.append(step)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    return state


def test_decoding_steps_equal_the_full_forward_and_hf_generate():
    source = lfm2_source()
    model = models.from_pretrained(source)
    prompt, new = tokens(batch=3, length=12), 16
    with torch.no_grad():
        expected = source.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                   do_sample=False, min_new_tokens=0, **IDS | {"eos_token_id": None})
    generated = model.generate(prompt, new, progress=False)
    assert torch.equal(generated, expected)
    state = decoded_step_by_step(model, generated, 12)
    assert state.layers[0]["state"].shape == (3, 16, 3)  # the conv window, W entries


def test_round_trip_is_bit_identical(tmp_path):
    assert_round_trip(models.from_pretrained(lfm2_source(conv_bias=True)), tmp_path / "run", tokens())


def test_from_a_checkpoint_directory(tmp_path):
    source = lfm2_source()
    source.save_pretrained(tmp_path / "ckpt")
    model = models.from_pretrained(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()), source(tokens()).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("make, message", [
    (lambda: with_config(lfm2_source(), layer_types=["conv", "sliding_attention", "conv"]), "layer_types="),
    (lambda: with_config(lfm2_source(), rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                         "rope_theta": 1e6}), "rope_parameters="),
])
def test_config_we_cannot_represent_raises(make, message):
    with pytest.raises(UnsupportedConfig, match=message):
        models.from_pretrained(make())


def test_analyses_run_on_the_import():
    """Interchange and ablations (hook_state of the conv layers included) resumed from their sites
    equal whole passes; autograd state Jacobians of a conv layer are the window's shift."""
    from interp.analysis import dynamics
    from interp.analysis.interventions import Site, ablate, corrupt_ar, interchange, site_grid
    from tests.test_interventions import TASK, ar_batch
    from tests.test_interventions import VOCAB as TASK_VOCAB

    model = models.from_pretrained(lfm2_source(vocab_size=TASK_VOCAB))
    clean = ar_batch(12, 4, seed=0)
    corrupt = corrupt_ar(clean, TASK, seed=1)
    sites = site_grid(model, ["blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_out"], ["key", "value"])
    resumed, whole = (interchange(model, clean, corrupt, sites, min_effect=0.0, resume=r) for r in (True, False))
    torch.testing.assert_close(resumed.p_patched, whole.p_patched, atol=1e-6, rtol=0)
    assert (whole.p_patched - whole.p_corrupt).abs().max() > 1e-4
    hooks = [h for h in model.hook_names() if h.endswith(("mixer.hook_out", "mixer.hook_state"))]
    ablation_sites = [Site(h, role) for h in hooks for role in ("key", "query")]
    resumed, whole = (ablate(model, clean, ablation_sites, mode="zero", resume=r) for r in (True, False))
    torch.testing.assert_close(resumed.p_answer, whole.p_answer, atol=1e-6, rtol=0)
    jac = dynamics.jacobians(model, clean.tokens[:2], layer=0, method="autograd", chunk_size=4).values
    n = 16 * 3  # [B, T, n, n]: d h_t / d h_{t-1} moves each channel's window one tap to the left
    shift = torch.zeros(16, 3, 16, 3)
    for c in range(16):
        shift[c, 0, c, 1] = shift[c, 1, c, 2] = 1.0
    torch.testing.assert_close(jac[:, 1:], shift.reshape(n, n).expand_as(jac[:, 1:]), atol=0, rtol=0)


def test_selected_channels_of_the_window():
    """run_with_cache(heads=...) keeps the chosen channels of the conv window (axis 2 of hook_state)."""
    model = models.from_pretrained(lfm2_source())
    name = "blocks.0.mixer.hook_state"
    with torch.no_grad():
        _, full = model.run_with_cache(tokens(), names=[name])
        _, kept = model.run_with_cache(tokens(), names=[name], heads=[3, -1])
    assert torch.equal(kept[name], full[name][:, :, [3, 15]])
