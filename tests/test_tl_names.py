"""TransformerLens hook names and cache keys resolve to ours (models.tl.names): against TL's own
cache on the same GPT-2 weights (float64, 1e-10) where TL is installed, hand-written otherwise."""

import pytest
import torch

from models.tl.names import NoCounterpart, act_name, tl_act_name, to_ours
from tests import tl_oracle

# every HookedTransformer name of a GPT-2 with our counterpart (l = 0); hook_embed aside
TL_TO_OURS = {
    "blocks.0.hook_resid_pre": "blocks.0.hook_resid_pre",
    "blocks.0.hook_resid_mid": "blocks.0.hook_resid_mid",
    "blocks.0.hook_resid_post": "blocks.0.hook_resid_post",
    "blocks.0.hook_attn_out": "blocks.0.mixer.hook_out",
    "blocks.0.hook_mlp_out": "blocks.0.mlp.hook_out",
    "blocks.0.ln1.hook_scale": "blocks.0.norm_mixer.hook_scale",
    "blocks.0.ln2.hook_scale": "blocks.0.norm_mlp.hook_scale",
    "blocks.0.attn.hook_q": "blocks.0.mixer.hook_q",
    "blocks.0.attn.hook_k": "blocks.0.mixer.hook_k",
    "blocks.0.attn.hook_v": "blocks.0.mixer.hook_v",
    "blocks.0.attn.hook_z": "blocks.0.mixer.hook_z",
    "blocks.0.attn.hook_attn_scores": "blocks.0.mixer.hook_attn_scores",
    "blocks.0.attn.hook_pattern": "blocks.0.mixer.hook_pattern",
    "blocks.0.attn.hook_result": "blocks.0.mixer.hook_result",
    "blocks.0.mlp.hook_pre": "blocks.0.mlp.hook_pre",
    "blocks.0.mlp.hook_post": "blocks.0.mlp.hook_post",
    "ln_final.hook_scale": "norm_final.hook_scale",
}
NORMALIZED = ["blocks.0.ln1.hook_normalized", "blocks.0.ln2.hook_normalized", "ln_final.hook_normalized"]
NONE_HERE = [*NORMALIZED, "blocks.0.attn.hook_rot_q", "blocks.0.mlp.hook_mid"]
SHORT = {("q", 0, "attn"): "blocks.0.attn.hook_q", ("scale", 0, "ln1"): "blocks.0.ln1.hook_scale",
         ("resid_pre", 0, None): "blocks.0.hook_resid_pre",
         ("embed",): "hook_embed", ("k2",): "blocks.2.attn.hook_k", ("scale1ln2",): "blocks.1.ln2.hook_scale",
         ("pattern", 1): "blocks.1.attn.hook_pattern", ("attn", 2): "blocks.2.attn.hook_pattern",
         ("scale",): "ln_final.hook_scale", ("post", 1): "blocks.1.mlp.hook_post",
         ("attn_out", -1): "blocks.2.hook_attn_out", ("mlp_out", 0): "blocks.0.hook_mlp_out",
         ("v", 1, "a"): "blocks.1.attn.hook_v", ("blocks.0.attn.hook_pattern",): "blocks.0.attn.hook_pattern"}


@pytest.fixture(scope="module")
def setup():
    source = tl_oracle.gpt2_source()
    model = tl_oracle.ours(source)
    ids = tl_oracle.tokens()
    with torch.no_grad():
        _, cache = model.run_with_cache(ids)
    return source, model, ids, cache


def test_tl_full_names_translate_to_ours():
    for tl, ours in TL_TO_OURS.items():
        assert to_ours(tl) == ours
        assert to_ours(tl + "_grad") == ours + "_grad"
    assert to_ours("blocks.11.hook_attn_out") == "blocks.11.mixer.hook_out"
    assert to_ours("blocks.0.mixer.hook_state") == "blocks.0.mixer.hook_state"  # ours pass through


def test_get_act_name_shorthand_as_tl_writes_it():
    """TL's own examples of get_act_name (its docstring), then ours of them."""
    assert tl_act_name("k", 6, "a") == "blocks.6.attn.hook_k"
    assert tl_act_name("pre", 2) == "blocks.2.mlp.hook_pre"
    assert tl_act_name("embed") == "hook_embed"
    assert tl_act_name("normalized", 27, "ln2") == "blocks.27.ln2.hook_normalized"
    assert tl_act_name("k6") == "blocks.6.attn.hook_k"
    assert tl_act_name("scale4ln1") == "blocks.4.ln1.hook_scale"
    assert tl_act_name("pre5") == "blocks.5.mlp.hook_pre"
    assert act_name("scale4ln1") == "blocks.4.norm_mixer.hook_scale"
    assert act_name("attn", 3) == "blocks.3.mixer.hook_pattern"


def test_names_without_counterpart_raise_saying_so_and_what_to_read():
    for name in NONE_HERE:
        with pytest.raises(NoCounterpart, match="no counterpart here") as info:
            to_ours(name)
        assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert to_ours("blocks.3.hook_mlp_in") == "blocks.3.hook_mlp_in" and to_ours("hook_pos_embed") == "hook_pos_embed"
    with pytest.raises(KeyError, match="before the rotation"):
        to_ours("blocks.3.attn.hook_rot_k")
    assert to_ours("blocks.3.hook_q_input") == "blocks.3.mixer.hook_q_input"  # tests/test_tl_head_inputs.py
    assert to_ours("blocks.3.attn.hook_attn_in") == "blocks.3.mixer.hook_attn_in"


def test_cache_takes_tl_keys(setup):
    _, model, _, cache = setup
    for tl, ours in TL_TO_OURS.items():
        assert torch.equal(cache[tl], cache[ours]), tl
        assert tl in cache
    for key, tl in SHORT.items():
        assert torch.equal(cache[key if len(key) > 1 else key[0]], cache[to_ours(tl)]), key
    assert torch.equal(cache["scale", 0, "norm_mlp"], cache["blocks.0.norm_mlp.hook_scale"])  # ours still
    assert torch.equal(cache["mixer_out", 1], cache["blocks.1.mixer.hook_out"])
    assert torch.equal(cache["pos_embed"], cache["hook_pos_embed"]) and torch.equal(cache["mlp_in", 1],
                                                                                    cache["blocks.1.hook_mlp_in"])
    torch.testing.assert_close(cache["hook_token_embed"] + cache["hook_pos_embed"], cache["hook_embed"], atol=0, rtol=0)
    with pytest.raises(KeyError, match="no counterpart"):
        cache["rot_q", 1]


def test_cache_computes_tl_normalized(setup):
    """TL's hook_normalized: (x - mean) / scale of the norm's input; the norm's gain and bias
    applied to it give the next module's input (our mixer.hook_in, hook_final)."""
    _, model, ids, cache = setup
    for layer, key in [(1, ("normalized", 1, "ln1")), (None, "ln_final.hook_normalized"), (None, ("normalized",))]:
        normed = cache[key if len(key) > 1 or isinstance(key, str) else key[0]]
        norm = model.norm_final if layer is None else model.blocks[layer].norm_mixer
        after = cache["hook_final"] if layer is None else cache[f"blocks.{layer}.mixer.hook_in"]
        torch.testing.assert_close(normed * norm.weight + norm.bias, after, atol=1e-12, rtol=0)
        assert normed.mean(-1).abs().max() < 1e-12
    mid = cache["blocks.2.hook_resid_mid"]
    torch.testing.assert_close(cache["normalized", -1, "ln2"], (mid - mid.mean(-1, keepdim=True))
                               / (mid.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt(), atol=1e-12, rtol=0)
    assert ("normalized", 0, "ln2") in cache
    with torch.no_grad():
        _, partial = model.run_with_cache(ids, names=["blocks.0.hook_resid_pre"])
    assert ("normalized", 0, "ln1") not in partial
    with pytest.raises(KeyError, match="no counterpart"):
        partial["normalized", 0, "ln1"]
    with pytest.raises(TypeError, match="layer type"):
        cache["q", 0, 3]


def test_hook_functions_fire_under_tl_names(setup):
    _, model, ids, _ = setup
    seen = []

    def record(x, hook):
        seen.append(hook.name)

    with torch.no_grad():
        model.run_with_hooks(ids, fwd_hooks=[("blocks.1.attn.hook_pattern", record), ("ln_final.hook_scale", record),
                                             ("blocks.0.hook_mlp_out", record)])
        _, cache = model.run_with_cache(ids, names=["blocks.0.ln1.hook_scale", "blocks.2.attn.hook_z"])
    assert seen == ["blocks.0.mlp.hook_out", "blocks.1.mixer.hook_pattern", "norm_final.hook_scale"]
    assert sorted(cache) == ["blocks.0.norm_mixer.hook_scale", "blocks.2.mixer.hook_z"]
    assert model.hook_point("blocks.2.ln2.hook_scale") is model.blocks[2].norm_mlp.hook_scale
    with pytest.raises(ValueError, match="no counterpart"):
        model.run_with_hooks(ids, fwd_hooks=[("blocks.0.mlp.hook_mid", record)])
    with pytest.raises(ValueError, match="unknown hook name"):
        model.hook_point("blocks.0.attn.hook_nonsense")


@pytest.fixture(scope="module")
def lens_cache(setup):
    source, _, ids, _ = setup
    bridge = tl_oracle.lens(source)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids)
    return bridge, cache


def test_same_values_as_transformer_lens_under_its_names(setup, lens_cache):
    """Every TL key of the bridge's cache that has a counterpart gives TL's values (1e-10); TL's
    hook_embed + hook_pos_embed is our hook_embed."""
    _, _, _, cache = setup
    _, theirs = lens_cache
    compared = set()
    for layer in range(tl_oracle.LAYERS):
        for tl in TL_TO_OURS:
            name = tl.replace("blocks.0.", f"blocks.{layer}.")
            if name in theirs.cache_dict:
                torch.testing.assert_close(cache[name], theirs[name], atol=1e-10, rtol=0)
                compared.add(name)
    for key in set(SHORT) - {("embed",)}:  # TL's hook_embed is the token embedding only: below
        torch.testing.assert_close(cache[key if len(key) > 1 else key[0]], theirs[key if len(key) > 1 else key[0]],
                                   atol=1e-10, rtol=0)
    for layer in range(tl_oracle.LAYERS):
        for name in NORMALIZED[:2]:
            name = name.replace("blocks.0.", f"blocks.{layer}.")
            torch.testing.assert_close(cache[name], theirs[name], atol=1e-10, rtol=0)
    torch.testing.assert_close(cache["ln_final.hook_normalized"], theirs["ln_final.hook_normalized"], atol=1e-10, rtol=0)
    torch.testing.assert_close(cache["hook_embed"], theirs["hook_embed"] + theirs["hook_pos_embed"], atol=1e-10, rtol=0)
    torch.testing.assert_close(cache["hook_token_embed"], theirs["hook_embed"], atol=1e-10, rtol=0)
    torch.testing.assert_close(cache["hook_pos_embed"], theirs["hook_pos_embed"], atol=1e-10, rtol=0)
    assert len(compared) == 15 * tl_oracle.LAYERS + 1  # every block name but hook_result (not in TL's cache), ln_final's


def test_patch_under_tl_name_equals_tl_patch(setup, lens_cache):
    """The same hook function under the same TL name changes both models' logits alike."""
    _, model, ids, _ = setup
    bridge, _ = lens_cache

    def knockout(pattern, hook):  # attend only to the first position from head 1
        pattern = pattern.clone()
        pattern[:, 1] = 0.0
        pattern[:, 1, :, 0] = 1.0
        return pattern

    def double_scale(scale, hook):
        return scale * 2.0

    hooks = [("blocks.1.attn.hook_pattern", knockout), ("blocks.0.ln2.hook_scale", double_scale)]
    with torch.no_grad():
        mine, theirs = model.run_with_hooks(ids, fwd_hooks=hooks), bridge.run_with_hooks(ids, fwd_hooks=hooks)
        plain = model(ids)
    assert (mine - plain).abs().max() > 1e-2
    torch.testing.assert_close(mine, theirs, atol=1e-10, rtol=0)


def test_mlp_in_and_pos_embed_patches_equal_tl_patches(setup, lens_cache):
    """TL's hook_mlp_in (the MLP's own copy of the residual) and hook_pos_embed patched alike: the
    residual stream keeps its value past hook_mlp_in, only the MLP sees the change."""
    _, model, ids, _ = setup
    bridge, _ = lens_cache

    def halve(x, hook):
        x = x.clone()
        x[:, 2:] *= 0.5
        return x

    hooks = [("blocks.1.hook_mlp_in", halve), ("hook_pos_embed", halve)]
    bridge.set_use_hook_mlp_in(True)
    try:
        with torch.no_grad():
            mine, theirs = model.run_with_hooks(ids, fwd_hooks=hooks), bridge.run_with_hooks(ids, fwd_hooks=hooks)
    finally:
        bridge.set_use_hook_mlp_in(False)
    assert (mine - model(ids)).abs().max() > 1e-2
    torch.testing.assert_close(mine, theirs, atol=1e-10, rtol=0)


def test_mlp_in_patch_changes_the_mlp_input_only(setup):
    _, model, ids, _ = setup
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=["blocks.1.hook_resid_mid", "blocks.1.mlp.hook_out",
                                                    "blocks.1.hook_resid_post"],
                                        fwd_hooks=[("blocks.1.hook_mlp_in", lambda x, hook: torch.zeros_like(x))])
        zero_mlp = model.blocks[1].mlp(model.blocks[1].norm_mlp(torch.zeros_like(cache["blocks.1.hook_resid_mid"])))
    torch.testing.assert_close(cache["blocks.1.mlp.hook_out"], zero_mlp, atol=1e-12, rtol=0)
    torch.testing.assert_close(cache["blocks.1.hook_resid_post"], cache["blocks.1.hook_resid_mid"] + zero_mlp,
                               atol=1e-12, rtol=0)
