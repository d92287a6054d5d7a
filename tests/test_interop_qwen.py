"""from_pretrained of transformers' Qwen3-Next, Qwen3.5 and Qwen3.5-MoE (Gated DeltaNet + gated
attention, a sparse MoE MLP) on tiny random configs, every parameter jittered: parity of logits,
every block and the input gradients on both paths (T beyond the 64-step chunks), greedy tokens
equal to transformers' generate, causal GDN state patches against the source continued from the
patched state, the MoE hooks against the source's router, and the configs we refuse."""

import importlib

import pytest
import torch

import models
from interp.analysis import dynamics
from interp.analysis.interventions import Site, ablate, corrupt_ar, interchange, site_grid
from models import StatePatch
from models.interop import UnsupportedConfig
from models.interop.load import load_directory
from models.interop.reference import stepwise_logits
from tests.interop_parity import VOCAB, assert_causal_state_patch, assert_parity, assert_round_trip, jitter
from tests.test_decoding import decode_and_compare
from tests.test_decoding_hf import NEW, hf_greedy
from tests.test_interventions import TASK, ar_batch
from tests.test_interventions import VOCAB as TASK_VOCAB

tf = pytest.importorskip("transformers")
T = 80  # > the GDN chunk (64) of both sides
FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
KERNELS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
           "causal_conv1d_update")
COMMON = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, linear_conv_kernel_dim=3, linear_key_head_dim=4, linear_value_head_dim=6,
              linear_num_key_heads=2, linear_num_value_heads=4, pad_token_id=0, bos_token_id=0, eos_token_id=0,
              layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=10, shared_expert_intermediate_size=12)


@pytest.fixture(autouse=True)
def torch_kernels(monkeypatch):
    """With fla installed transformers runs fla's Triton kernels, which need a GPU: its own torch
    reference functions (the wrappers' __wrapped__) instead."""
    for family in FAMILIES:
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        for name in KERNELS:
            function = getattr(module, name)
            monkeypatch.setattr(module, name, getattr(function, "__wrapped__", function))


def built(model_class, config):
    for c in (config, getattr(config, "text_config", config)):
        c._experts_implementation = "eager"  # the grouped-matmul experts need 16-byte strides
    torch.manual_seed(0)
    return jitter(model_class(config))


def next_source(**overrides):
    """GDN, attention, GDN, attention; sparse MLPs but in layer 1 (mlp_only_layers)."""
    config = tf.Qwen3NextConfig(**{**COMMON, **MOE, "intermediate_size": 24, "mlp_only_layers": [1], **overrides})
    return built(tf.Qwen3NextForCausalLM, config)


def qwen35_source(**overrides):
    return built(tf.Qwen3_5ForCausalLM, tf.Qwen3_5TextConfig(**{**COMMON, "intermediate_size": 24, **overrides}))


def qwen35_moe_source(**overrides):
    return built(tf.Qwen3_5MoeForCausalLM, tf.Qwen3_5MoeTextConfig(**{**COMMON, **MOE, **overrides}))


def multimodal_source(moe: bool):
    """Qwen3.5(-MoE)ForConditionalGeneration: a tiny vision tower beside the language model."""
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=16, patch_size=2,
                  spatial_merge_size=1, temporal_patch_size=1)
    text = {**COMMON, **MOE} if moe else {**COMMON, "intermediate_size": 24}
    config_class = tf.Qwen3_5MoeConfig if moe else tf.Qwen3_5Config
    model_class = tf.Qwen3_5MoeForConditionalGeneration if moe else tf.Qwen3_5ForConditionalGeneration
    return built(model_class, config_class(text_config=text, vision_config=vision))


SOURCES = {"qwen3_next": next_source, "qwen3_5": qwen35_source, "qwen3_5_moe": qwen35_moe_source}


def tokens(batch=2, length=T, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_parity_in_float32(name):
    source = SOURCES[name]()
    assert_parity(source, models.from_pretrained(source), tokens(), atol=1e-4)


def test_the_import_is_a_hybrid_with_sparse_layers_where_the_source_has_them():
    model = models.from_pretrained(next_source())
    assert model.cfg.mixers == ["gated_deltanet", "attention"] * 2
    assert model.cfg.moe["layers"] == [0, 2, 3] and type(model.blocks[1].mlp).__name__ == "MLP"
    gdn, attention = model.blocks[0].mixer, model.blocks[1].mixer
    assert (gdn.heads, gdn.v_heads, gdn.d_k, gdn.d_v) == (2, 4, 4, 6)
    assert (attention.n_heads, attention.n_kv, attention.d_head, attention.options["rotary_dim"]) == (4, 2, 8, 2)
    assert models.from_pretrained(qwen35_moe_source()).cfg.moe["layers"] is None  # every layer sparse
    assert models.from_pretrained(qwen35_source()).cfg.moe is None


@pytest.mark.parametrize("overrides", [
    dict(attention_bias=True, tie_word_embeddings=True),
    dict(norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[]),
    dict(num_experts=0),
    dict(linear_num_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 50.0,
                                                    "partial_rotary_factor": 0.5}),
])
def test_qwen3_next_variants(overrides):
    source = next_source(**overrides)
    assert_parity(source, models.from_pretrained(source), tokens(length=70), atol=1e-4)


def test_qwen3_5_multimodal_rotary_sections_are_plain_rope_for_text():
    rope = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5, "mrope_section": [1, 1, 0],
            "mrope_interleaved": True}
    source = qwen35_source(rope_parameters=rope)
    assert_parity(source, models.from_pretrained(source), tokens(length=70), atol=1e-4)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_greedy_tokens_equal_hf_generate_and_each_step_the_full_forward(name):
    source = SOURCES[name]()
    model = models.from_pretrained(source)
    prompt = tokens(3, 20)
    expected = hf_greedy(source, prompt, None)
    assert expected.shape == (3, 20 + NEW)
    assert torch.equal(model.generate(prompt, NEW), expected)
    eos = int(expected[1, 22])  # row 1 stops there
    assert torch.equal(model.generate(prompt, NEW, eos_token_id=eos), hf_greedy(source, prompt, eos))
    worst, _ = decode_and_compare(model, prompt, steps=8)
    assert worst < 1e-5, worst


def test_last_gdn_state_is_the_sources_cached_state_transposed():
    source = next_source()
    model = models.from_pretrained(source)
    toks = tokens(length=20)
    with torch.no_grad():
        _, cache = model.run_with_cache(toks, names=["blocks.2.mixer.hook_state"])
        out = source(toks, use_cache=True)
    theirs = out.cache.get_recurrent_state(2, state_idx=0)  # [B, HV, K, V]
    torch.testing.assert_close(cache["blocks.2.mixer.hook_state"][:, -1], theirs.transpose(-1, -2), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe"])
def test_causal_state_patch_equals_the_source_continued_from_the_patched_state(name):
    """The last layer's GDN state (after two attention layers) replaced after step t: ours continues
    from it as the source run token by token with its cached state replaced. Ours also reads the
    patch out at t itself, the source's step loop cannot (so the patched layer is the last: a later
    attention layer would see the difference at t), and the logits agree from t + 1 on."""
    layer_types = ["linear_attention", "full_attention", "full_attention", "linear_attention"]
    source = SOURCES[name](layer_types=layer_types)
    model = models.from_pretrained(source)
    clean, corrupt, t, hook = tokens(length=12, seed=1), tokens(length=12, seed=2), 5, "blocks.3.mixer.hook_state"
    with torch.no_grad():
        _, donor = model.run_with_cache(clean, names=[hook])
        state = donor[hook][:, t]  # [B, HV, V, K]

        def patch(states, hook):
            states[:, t] = state
            return states

        ours = model.run_with_hooks(corrupt, fwd_hooks=[(hook, patch)])
        unpatched = model(corrupt)
    reference = stepwise_logits(source, corrupt, {(3, t): state.transpose(-1, -2).clone()})  # theirs [HV, K, V]
    torch.testing.assert_close(ours[:, t + 1:], reference[:, t + 1:], atol=1e-4, rtol=0)
    assert torch.equal(ours[:, :t], unpatched[:, :t])
    assert (ours[:, t + 1:] - unpatched[:, t + 1:]).abs().max() > 1e-3
    assert_causal_state_patch(model, tokens(length=12), "blocks.0.mixer.hook_state", 6, (4, 6, 4))


def test_a_declared_state_patch_equals_the_same_patch_through_the_instrumented_path():
    """A StatePatch runs inside the fast kernels; the same change by a hook function on hook_state
    goes through the instrumented path: equal logits, while decoding too."""
    model = models.from_pretrained(next_source())
    toks, hook = tokens(length=T), "blocks.2.mixer.hook_state"
    deltas = torch.randn(2, 4, 6, 4, generator=torch.Generator().manual_seed(3))
    patch = StatePatch([0, 1], [10, 70], deltas=deltas)

    def by_hand(states, hook):
        states = states.clone()
        states[0, 10] += deltas[0]
        states[1, 70] += deltas[1]
        return states

    with torch.no_grad():
        declared = model.run_with_hooks(toks, fwd_hooks=[(hook, patch)])
        instrumented = model.run_with_hooks(toks, fwd_hooks=[(hook, by_hand)])
        clean = model(toks)
    torch.testing.assert_close(declared, instrumented, atol=1e-5, rtol=0)
    assert torch.equal(declared[0, :10], clean[0, :10]) and (declared[0, 10:] - clean[0, 10:]).abs().amax(-1).min() > 0
    generated = model.generate(toks[:, :8], 6, fwd_hooks=[(hook, StatePatch([0], [9], deltas=deltas[:1]))])
    with torch.no_grad():
        full = model.run_with_hooks(generated[:, :-1], fwd_hooks=[(hook, StatePatch([0], [9], deltas=deltas[:1]))])
    assert torch.equal(generated[:, 8:], full[:, 7:].argmax(-1))


def test_moe_hooks_read_the_sources_router_and_experts():
    """Per sparse layer: hook_router_logits, hook_expert_indices and hook_expert_weights equal the
    source router's (logits, top-k indices, scores); hook_expert_out's slots are the named experts
    applied with the source's weights."""
    source = next_source()
    model = models.from_pretrained(source)
    toks = tokens(length=10)
    routed, handles = {}, []
    for layer in (0, 2, 3):
        hook = lambda m, i, o, layer=layer: routed.__setitem__(layer, (*o, i[0]))  # noqa: E731
        handles.append(source.model.layers[layer].mlp.gate.register_forward_hook(hook))
    try:
        with torch.no_grad():
            source(toks)
            _, cache = model.run_with_cache(toks, names=lambda n: ".mlp.hook_" in n)
    finally:
        for handle in handles:
            handle.remove()
    for layer in (0, 2, 3):
        logits, scores, indices, x = routed[layer]  # [B T, E], [B T, k], [B T, k], [B T, D]
        ours = {n: cache[f"blocks.{layer}.mlp.hook_{n}"].flatten(0, 1)
                for n in ("router_logits", "expert_indices", "expert_weights", "expert_out")}
        torch.testing.assert_close(ours["router_logits"], logits, atol=1e-5, rtol=0)
        assert torch.equal(ours["expert_indices"], indices)
        torch.testing.assert_close(ours["expert_weights"], scores, atol=1e-6, rtol=0)
        experts = source.model.layers[layer].mlp.experts
        for token, slot in [(0, 0), (7, 1), (13, 0)]:
            e = int(indices[token, slot])
            gate, up = (experts.gate_up_proj[e] @ x[token]).chunk(2)
            torch.testing.assert_close(ours["expert_out"][token, slot],
                                       experts.down_proj[e] @ (torch.nn.functional.silu(gate) * up), atol=1e-5, rtol=0)
    assert "blocks.1.mlp.hook_router_logits" not in cache and "blocks.1.mlp.hook_post" in cache


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_round_trip_and_checkpoint_directory(name, tmp_path):
    source = SOURCES[name]()
    model = models.from_pretrained(source)
    assert_round_trip(model, tmp_path / "run", tokens())
    source.save_pretrained(tmp_path / "ckpt")
    loaded = models.from_pretrained(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens()), source(tokens()).logits, atol=1e-4, rtol=0)
    assert load_directory(tmp_path / "ckpt", None)[0].config.model_type == source.config.model_type


@pytest.mark.parametrize("moe", [False, True])
def test_multimodal_checkpoints_convert_their_language_model(moe, tmp_path):
    """The published Qwen3.5 checkpoints are multimodal: the language model converts (the vision
    tower is left out), in memory and from a checkpoint directory (which transformers loads as
    the text-only Qwen3_5(Moe)ForCausalLM)."""
    source = multimodal_source(moe)
    model = models.from_pretrained(source)
    assert model.cfg.moe is not None if moe else model.cfg.moe is None
    assert_parity(source, model, tokens(length=70), atol=1e-4)
    source.save_pretrained(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(models.from_pretrained(tmp_path / "ckpt")(tokens()), source(tokens()).logits,
                                   atol=1e-4, rtol=0)


@pytest.mark.parametrize("make, message", [
    (lambda: next_source(hidden_act="gelu"), "hidden_act='gelu'"),
    (lambda: next_source(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
     "rope_parameters=.*rope_type 'default'"),
    (lambda: next_source(shared_expert_intermediate_size=0), "shared_expert_intermediate_size=0"),
    (lambda: qwen35_source(layer_types=["linear_attention", "sliding_attention", "linear_attention",
                                        "full_attention"]), "layer_types="),
])
def test_config_we_cannot_represent_raises(make, message):
    with pytest.raises(UnsupportedConfig, match=message):
        models.from_pretrained(make())


def test_every_hook_while_decoding_equals_the_full_forward():
    """generate's Cache of every hook (GDN, gated attention, MoE routing included) over prompt +
    generated positions equals run_with_cache on the final sequence."""
    model = models.from_pretrained(next_source())
    out, cache = model.generate(tokens(2, 6), 5, cache_names=model.hook_names())
    _, full = model.run_with_cache(out[:, :-1])
    assert sorted(cache) == sorted(full) == sorted(model.hook_names())
    for hook in full:
        torch.testing.assert_close(cache[hook], full[hook], atol=1e-5, rtol=1e-5, msg=hook)


def test_interventions_and_ablations_resumed_equal_whole_passes():
    """The analyses resume patched runs from the patched block (GDN carry and conv window,
    attention over the cached prefix, MoE routing): equal to whole passes."""
    model = models.from_pretrained(next_source(vocab_size=TASK_VOCAB))
    clean = ar_batch(8, 4, seed=0)
    corrupt = corrupt_ar(clean, TASK, seed=1)
    sites = site_grid(model, ["blocks.{l}.hook_resid_pre"], ["key", "value"])
    sites += [Site(f"blocks.{l}.mlp.hook_expert_weights", role) for l in (0, 2, 3) for role in ("key", "value")]
    resumed, whole = (interchange(model, clean, corrupt, sites, min_effect=0.0, resume=r) for r in (True, False))
    torch.testing.assert_close(resumed.p_patched, whole.p_patched, atol=1e-6, rtol=0)
    assert (whole.p_patched - whole.p_corrupt).abs().max() > 1e-4
    ablation_sites = [Site(f"blocks.{l}.mixer.hook_{h}", "key") for l, h in ((0, "state"), (1, "out"), (2, "state"))]
    resumed, whole = (ablate(model, clean, ablation_sites, mode="zero", resume=r) for r in (True, False))
    torch.testing.assert_close(resumed.p_answer, whole.p_answer, atol=1e-6, rtol=0)
    assert (whole.p_answer - whole.baseline_p).abs().max() > 1e-4


def test_state_jacobians_of_an_imported_gdn_layer_structured_equal_autograd():
    model = models.from_pretrained(next_source())
    toks = tokens(2, 5)
    structured = dynamics.jacobians(model, toks, layer=2, method="structured")
    autograd = dynamics.jacobians(model, toks, layer=2, method="autograd", chunk_size=4)
    torch.testing.assert_close(structured.dense(), autograd.values, atol=1e-5, rtol=1e-5)


def test_gdn_head_options_equal_the_same_heads_set_globally():
    """gated_deltanet's num_heads / head_dim (for a hybrid whose attention heads differ) build the
    mixer cfg.n_heads / d_head would: the same parameters, the same outputs; bad values raise."""
    common = dict(vocab_size=VOCAB, d_model=16, n_layers=1, mixer_options={"num_v_heads": 4, "expand_v": 1.5})
    torch.manual_seed(0)
    plain = models.build("gated_deltanet", n_heads=2, d_head=4, **common)
    overridden = models.build("gated_deltanet", n_heads=4, d_head=8,
                              **{**common, "mixer_options": {**common["mixer_options"], "num_heads": 2, "head_dim": 4}})
    overridden.load_state_dict(plain.state_dict())
    with torch.no_grad():
        assert torch.equal(overridden(tokens(length=9)), plain(tokens(length=9)))
    for bad in ({"num_heads": 0}, {"head_dim": 2.5}, {"num_heads": 3}):
        with pytest.raises(ValueError, match="num_heads|head_dim|num_v_heads"):
            models.build("gated_deltanet", n_heads=4, **{**common, "mixer_options": {**common["mixer_options"], **bad}})
