"""from_pretrained of transformers' Kimi Linear (KDA + NoPE MLA, dense and DeepSeek-style MoE MLPs)
on tiny random configs, every parameter jittered: logits, every layer and the input gradients on
both paths (<= 1e-4 float32; T beyond the KDA chunks), every hook firing with the KDA states equal
to the source's cache, decoding steps against the full forward (1e-5) and greedy tokens against
transformers' generate, causal KDA state patches against the source continued from the patched
state, the router against the source's, resumed interventions, round trips, and refused configs.

transformers runs fla's Triton kernels when fla is installed (they need a GPU); its own torch
fallbacks (the wrappers' __wrapped__: a recurrent loop for decoding, the chunked form otherwise)
are the reference here."""

import importlib

import pytest
import torch

import models
from interp.analysis.interventions import corrupt_ar, interchange, site_grid
from models import StatePatch
from models.interop import UnsupportedConfig
from models.interop.reference import stepwise_logits
from tests.interop_parity import VOCAB, assert_causal_state_patch, assert_parity, assert_round_trip, jitter
from tests.test_decoding import decode_and_compare
from tests.test_decoding_hf import hf_greedy
from tests.test_interventions import TASK, ar_batch
from tests.test_interventions import VOCAB as TASK_VOCAB

tf = pytest.importorskip("transformers")
T = 70  # > the source's 64-step chunk and our 16-step one
KERNELS = ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention", "causal_conv1d_fn", "causal_conv1d_update")
H, K = 4, 8  # KDA heads and head width: hook_state [H, V = K, K]
LAST = 3  # the last layer, a KDA one after the MLA layer (a patch there reaches no later keys)
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=40, moe_intermediate_size=12, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=8, q_lora_rank=None, qk_rope_head_dim=4,
              v_head_dim=6, qk_nope_head_dim=8, n_group=2, topk_group=1, num_experts_per_tok=2, num_local_experts=4,
              n_shared_experts=1, linear_head_dim=K, linear_num_heads=H, linear_conv_kernel_dim=3,
              layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
              mlp_layer_types=["dense", "sparse", "sparse", "dense"], pad_token_id=0, bos_token_id=0, eos_token_id=0)


@pytest.fixture(autouse=True)
def torch_kernels(monkeypatch):
    """transformers' torch reference functions in place of fla's Triton kernels."""
    module = importlib.import_module("transformers.models.kimi_linear.modeling_kimi_linear")
    for name in KERNELS:
        function = getattr(module, name)
        monkeypatch.setattr(module, name, getattr(function, "__wrapped__", function))


def kimi_source(**overrides):
    """KDA, MLA, KDA, KDA; dense, sparse, sparse, dense MLPs (two expert groups, top 1 group)."""
    config = tf.KimiLinearConfig(**{**COMMON, **overrides})
    config._experts_implementation = "eager"  # the grouped-matmul experts need 16-byte strides
    torch.manual_seed(0)
    return jitter(tf.KimiLinearForCausalLM(config))


def tokens(batch=2, length=T, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def imported():
    source = kimi_source()  # (building runs no kernel: torch_kernels patches each test's calls)
    return source, models.from_pretrained(source)


def test_layout():
    model = models.from_pretrained(kimi_source())
    assert model.cfg.mixers == ["kda", "mla", "kda", "kda"] and model.cfg.positional == "none"
    assert model.cfg.moe["layers"] == [1, 2] and model.cfg.moe["routing"] == "sigmoid"
    assert model.cfg.moe["n_group"] == 2 and model.cfg.moe["d_shared"] == 12
    assert model.blocks[0].mixer.state_shape == (H, K, K)


def test_parity_in_float32(imported):
    source, model = imported
    assert_parity(source, model, tokens(), atol=1e-4)


@pytest.mark.parametrize("overrides", [
    dict(mlp_layer_types=["dense"] * 4),  # no MoE
    dict(q_lora_rank=6, attention_bias=True, n_group=1, norm_topk_prob=False, n_shared_experts=2,
         layer_types=["full_attention", "linear_attention", "full_attention", "linear_attention"]),
    dict(tie_word_embeddings=True, qk_rope_head_dim=0, mlp_layer_types=["sparse"] * 4),
    dict(layer_types=None, linear_attn_config={"head_dim": 6, "num_heads": 2, "short_conv_kernel_size": 4,
                                               "kda_layers": [1, 2, 4], "full_attn_layers": [3]}),
], ids=["dense", "q_lora_bias", "all_sparse", "checkpoint_linear_attn_config"])
def test_variants_parity(overrides):
    source = kimi_source(**overrides)
    assert_parity(source, models.from_pretrained(source), tokens(length=40), atol=1e-4)


def test_every_hook_fires_and_states_are_the_source_cache(imported):
    source, model = imported
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens())
        out = source(tokens(), use_cache=True)
    assert set(cache) == set(model.hook_names())
    for layer in (0, 2, 3):  # transformers keeps [H, K, V]
        torch.testing.assert_close(cache[f"blocks.{layer}.mixer.hook_state"][:, -1],
                                   out.cache.get_recurrent_state(layer, state_idx=0).transpose(-1, -2),
                                   atol=1e-5, rtol=0)
    assert cache["blocks.1.mixer.hook_pattern"].shape == (2, 4, T, T)
    assert cache["blocks.0.mixer.hook_dt"].shape == (2, T, H, K)


def test_the_mla_hooks_are_the_source_attention(imported):
    """hook_pattern is the source's attention weights (eager attention)."""
    source, model = imported
    source.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            weights = source(tokens(), output_attentions=True).attentions[0]
    finally:
        source.config._attn_implementation = "sdpa"
    _, cache = model.run_with_cache(tokens(), names=["blocks.1.mixer.hook_pattern"])
    torch.testing.assert_close(cache["blocks.1.mixer.hook_pattern"], weights, atol=1e-6, rtol=0)


def test_causal_state_patch_equals_the_source_continued_from_it(imported):
    source, model = imported
    t, hook = 9, f"blocks.{LAST}.mixer.hook_state"
    assert_causal_state_patch(model, tokens(length=t + 6), hook, t, (H, K, K))
    donor = torch.randn(2, H, K, K, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model.run_with_hooks(tokens(length=30), fwd_hooks=[(hook, StatePatch([0, 1], [t, t], values=donor))])
    reference = stepwise_logits(source, tokens(length=30), {(LAST, t): donor.transpose(-1, -2).clone()},
                                prefill=t + 1)
    torch.testing.assert_close(ours[:, t + 1:], reference[:, t + 1:], atol=1e-4, rtol=0)
    assert (ours[:, t + 1:] - model(tokens(length=30))[:, t + 1:]).abs().max() > 1e-3


def test_each_decoding_step_equals_the_full_forward(imported):
    _, model = imported
    worst, _ = decode_and_compare(model, tokens(length=18), steps=8)
    assert worst < 1e-5, worst


def test_greedy_tokens_equal_hf_generate(imported):
    source, model = imported
    prompt = tokens(batch=3, length=20) % (VOCAB - 1) + 1
    expected = hf_greedy(source, prompt, None)
    assert torch.equal(model.generate(prompt, expected.shape[1] - prompt.shape[1], progress=False), expected)


def test_a_state_patch_while_decoding_equals_the_full_forward(imported):
    _, model = imported
    patch = StatePatch([0, 2], [14, 14], deltas=torch.randn(2, H, K, K, generator=torch.Generator().manual_seed(7)) * 4)
    fwd_hooks = [(f"blocks.{LAST}.mixer.hook_state", patch)]
    out, cache = model.generate(tokens(batch=3, length=12), 8, fwd_hooks=fwd_hooks, cache_names=["hook_logits"],
                                progress=False)
    full = model.run_with_hooks(out[:, :-1], fwd_hooks=fwd_hooks)
    torch.testing.assert_close(cache["hook_logits"], full, atol=1e-5, rtol=1e-5)
    assert (full[[0, 2], 14:] - model(out[:, :-1])[[0, 2], 14:]).abs().amax() > 1e-3


def test_moe_routes_as_the_source(imported):
    source, model = imported
    seen = []
    handle = source.model.layers[1].mlp.gate.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        with torch.no_grad():
            source(tokens())
    finally:
        handle.remove()
    logits, weights, index = seen[0]  # [N, E], [N, k], [N, k] (the source's slots unsorted)
    names = [f"blocks.1.mlp.hook_{n}" for n in ("router_logits", "expert_indices", "expert_weights")]
    _, cache = model.run_with_cache(tokens(), names=names)
    torch.testing.assert_close(cache[names[0]].flatten(0, 1), logits, atol=1e-5, rtol=0)
    ours_index, order = cache[names[1]].flatten(0, 1).sort(-1)
    theirs_index, their_order = index.sort(-1)
    assert torch.equal(ours_index, theirs_index)
    # the normalising sums add the slots in another order: a few float32 ulps of weights up to 2.4
    torch.testing.assert_close(cache[names[2]].flatten(0, 1).gather(-1, order), weights.gather(-1, their_order),
                               atol=4e-6, rtol=0)


def test_interchange_resumed_equals_whole_passes():
    model = models.from_pretrained(kimi_source(vocab_size=TASK_VOCAB))
    clean = ar_batch(8, 4, seed=0)
    corrupt = corrupt_ar(clean, TASK, seed=1)
    sites = site_grid(model, ["blocks.{l}.hook_resid_pre", f"blocks.{LAST}.mixer.hook_state"], ["key", "value"])
    resumed, whole = (interchange(model, clean, corrupt, sites, min_effect=0.0, resume=r) for r in (True, False))
    torch.testing.assert_close(resumed.p_patched, whole.p_patched, atol=1e-6, rtol=0)
    assert (whole.p_patched - whole.p_corrupt).abs().max() > 1e-4


def test_round_trip_and_checkpoint_directory(imported, tmp_path):
    source, model = imported
    assert_round_trip(model, tmp_path / "run", tokens())
    source.save_pretrained(tmp_path / "ckpt")
    loaded = models.from_pretrained(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens()), source(tokens()).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("overrides, message", [
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(num_key_value_heads=2), "num_key_value_heads=2"),
    (dict(n_shared_experts=0), "n_shared_experts=0"),
    (dict(layer_types=["linear_attention", "sliding_attention", "linear_attention", "linear_attention"]),
     "layer_types="),
])
def test_config_we_cannot_represent_raises(overrides, message):
    with pytest.raises(UnsupportedConfig, match=message):
        models.from_pretrained(kimi_source(**overrides))
