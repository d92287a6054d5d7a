"""from_pretrained on the Mamba-2 hybrids (tiny random transformers configs, every parameter
jittered): logits, every layer's output and input gradients against the source (<= 1e-4 float32,
fast and instrumented paths), every hook firing, causal state patches (against the source run
step by step from the patched state), decoding against the full forward and against HF generate,
resumed interventions, round trips, checkpoint directories, and refused configs."""

import pytest
import torch

import models
from interp.analysis.circuits.graph import build_graph
from interp.analysis.effective_attention import effective_attention
from interp.analysis.interventions import Site, ablate, attribute, corrupt_ar, interchange, site_grid
from models import StatePatch
from models.decoding.step import advance
from models.interop import UnsupportedConfig
from models.interop.reference import stepwise_logits
from tests.test_interventions import TASK, ar_batch
from tests.test_interventions import VOCAB as AR_VOCAB
from tests.interop_parity import VOCAB, assert_causal_state_patch, assert_parity, assert_round_trip, jitter

tf = pytest.importorskip("transformers")
T = 40  # > the sources' scan chunk 16
IDS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)


def tokens(batch=2, length=T, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def nemotron_h_source(**overrides):
    """mamba2, mlp, attention, mlp, mamba2: single-sublayer blocks."""
    torch.manual_seed(0)
    fields = dict(vocab_size=VOCAB, hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  layers_block_type=["linear_attention", "mlp", "full_attention", "mlp", "linear_attention"],
                  intermediate_size=24, ssm_state_size=4, mamba_num_heads=4, mamba_head_dim=6, n_groups=2,
                  conv_kernel=3, chunk_size=16, **IDS)
    return jitter(tf.NemotronHForCausalLM(tf.NemotronHConfig(**{**fields, **overrides})))


def bamba_source(**overrides):
    """attention (partial RoPE), mamba2, attention, mamba2, each with a SwiGLU MLP."""
    torch.manual_seed(0)
    fields = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=4, attn_layer_indices=[0, 2],
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=24, mamba_n_heads=4,
                  mamba_d_state=4, mamba_n_groups=2, mamba_d_conv=3, mamba_chunk_size=16, **IDS)
    return jitter(tf.BambaForCausalLM(tf.BambaConfig(**{**fields, **overrides})))


def granite_source(**overrides):
    """attention (RoPE), mamba2, attention, mamba2, each with a dense SwiGLU MLP, every Granite
    multiplier away from 1."""
    torch.manual_seed(0)
    fields = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=4,
                  layer_types=["full_attention", "linear_attention", "full_attention", "linear_attention"],
                  num_attention_heads=4, num_key_value_heads=2, num_local_experts=0, shared_intermediate_size=24,
                  mamba_n_heads=4, mamba_d_state=4, mamba_n_groups=2, mamba_d_conv=3, mamba_chunk_size=16,
                  position_embedding_type="rope", embedding_multiplier=3.0, residual_multiplier=0.6,
                  attention_multiplier=0.2, logits_scaling=2.5, **IDS)
    return jitter(tf.GraniteMoeHybridForCausalLM(tf.GraniteMoeHybridConfig(**{**fields, **overrides})))


def falcon_h1_source(**overrides):
    """Mamba-2 and attention in parallel in each of 2 layers, every muP multiplier away from 1."""
    torch.manual_seed(0)
    fields = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=24, mamba_d_ssm=24, mamba_n_heads=4, mamba_d_state=4, mamba_n_groups=2,
                  mamba_d_conv=3, mamba_chunk_size=16, mamba_rms_norm=True, mamba_norm_before_gate=False,
                  embedding_multiplier=2.0, lm_head_multiplier=0.7, mlp_multipliers=[1.5, 0.5], key_multiplier=1.3,
                  attention_in_multiplier=0.8, attention_out_multiplier=1.2, ssm_multipliers=[0.5, 1.5, 0.8, 1.3, 0.6],
                  ssm_in_multiplier=1.4, ssm_out_multiplier=0.9, **IDS)
    return jitter(tf.FalconH1ForCausalLM(tf.FalconH1Config(**{**fields, **overrides})))


def zamba2_source(**overrides):
    """mamba2, hybrid, mamba2, hybrid, hybrid: two shared transformers used in turn (A, B, A),
    per-depth LoRA adapters, RoPE."""
    torch.manual_seed(0)
    fields = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=5, mamba_d_state=4, mamba_d_conv=3,
                  layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid", "hybrid"],
                  n_mamba_heads=4, mamba_ngroups=2, num_attention_heads=4, num_key_value_heads=4, intermediate_size=24,
                  num_mem_blocks=2, use_shared_attention_adapter=True, adapter_rank=3, use_mem_rope=True,
                  chunk_size=16, **IDS)
    return jitter(tf.Zamba2ForCausalLM(tf.Zamba2Config(**{**fields, **overrides})))


def granite_moe_source(**overrides):
    """granite_source with a sparse MoE MLP (4 experts, top 2) beside the shared MLP in each layer."""
    return granite_source(**{"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 12, **overrides})


# family -> (source, its last layer: a Mamba-2 one, its state shape [H, P, N]); the last, because
# ours reads a state patched at t out at t too, which the source stepped from a patched cache
# cannot: with a later attention layer that read-out would reach every later position's keys.
FAMILIES = {"nemotron_h": (nemotron_h_source, 4, (4, 6, 4)), "bamba": (bamba_source, 3, (4, 8, 4)),
            "granitemoehybrid": (granite_source, 3, (4, 8, 4)), "granite_moe": (granite_moe_source, 3, (4, 8, 4)), "falcon_h1": (falcon_h1_source, 1, (4, 6, 4)),
            "zamba2": (zamba2_source, 4, (4, 8, 4))}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def imported(request):
    make, layer, shape = FAMILIES[request.param]
    source = make()
    return request.param, source, models.from_pretrained(source), layer, shape


def test_parity_in_float32(imported):
    _, source, model, _, _ = imported
    scale = getattr(source.config, "embedding_multiplier", 1.0)  # folded into our embedding
    assert_parity(source, model, tokens(), atol=1e-4, embed_scale=scale)


def test_every_hook_fires_and_states_are_the_source_cache(imported):
    _, source, model, layer, _ = imported
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens())
        out = source(tokens(), use_cache=True)
    assert set(cache) == set(model.hook_names())
    torch.testing.assert_close(cache[f"blocks.{layer}.mixer.hook_state"][:, -1],
                               out.cache.get_recurrent_state(layer, state_idx=0), atol=1e-5, rtol=0)


class Positioned:
    """The source called with the absolute position_ids of the tokens it is fed (Bamba's forward
    numbers a call's tokens from 0 when it is not told; HF generate tells it)."""

    def __init__(self, source) -> None:
        self.source, self.seen = source, 0

    def __call__(self, input_ids, cache=None, use_cache=True):
        self.seen = 0 if cache is None else self.seen
        positions = torch.arange(self.seen, self.seen + input_ids.shape[1])[None]
        self.seen += input_ids.shape[1]
        return self.source(input_ids=input_ids, cache=cache, use_cache=use_cache, position_ids=positions)


def test_causal_state_patch_equals_the_source_continued_from_it(imported):
    _, source, model, layer, shape = imported
    t, hook = 9, f"blocks.{layer}.mixer.hook_state"
    assert_causal_state_patch(model, tokens(length=t + 6), hook, t, shape)  # (exp(dt A) ~ e^-5 a step here)
    donor = torch.randn(2, *shape, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model.run_with_hooks(tokens(), fwd_hooks=[(hook, StatePatch([0, 1], [t, t], values=donor))])
    reference = stepwise_logits(Positioned(source), tokens(), {(layer, t): donor.clone()}, prefill=t + 1)
    torch.testing.assert_close(ours[:, t + 1:], reference[:, t + 1:], atol=1e-4, rtol=0)


def test_the_residual_decomposes_into_its_sublayers(imported):
    """decompose_resid: the embedding and every block's mixer outputs (none in an MLP-only block,
    two in a parallel one; not a shared branch's, which feeds the mixer input) and MLP outputs sum
    to the final residual; so do the full decompositions (every head of both parallel mixers,
    every neuron) with unique labels."""
    _, _, model, _, _ = imported
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens())
    parts, labels = cache.decompose_resid(return_labels=True)
    torch.testing.assert_close(parts.sum(0), cache[f"blocks.{len(model.blocks) - 1}.hook_resid_post"],
                               atol=1e-5, rtol=0)
    assert len(labels) == len(set(labels)) == 1 + sum(len(b.mixers) + hasattr(b, "mlp") for b in model.blocks)
    final = cache[f"blocks.{len(model.blocks) - 1}.hook_resid_post"]
    for layout in ("tl", "ours"):  # (a sparse MLP's neurons: per routed slot and the shared expert's)
        full, names = cache.get_full_resid_decomposition(layout=layout, return_labels=True)
        torch.testing.assert_close(full.sum(0), final, atol=1e-5, rtol=0)
        assert len(names) == len(set(names))


def test_each_decoding_step_equals_the_full_forward(imported):
    _, _, model, _, _ = imported
    prompt = tokens(length=18)
    with torch.no_grad():
        logits, state = advance(model, prompt, all_logits=True)
        torch.testing.assert_close(logits, model(prompt), atol=1e-5, rtol=0)
        seq = prompt
        for _ in range(6):
            new = logits[:, -1].argmax(-1)[:, None] if logits.dim() == 3 else logits.argmax(-1)[:, None]
            seq = torch.cat([seq, new], dim=1)
            logits, state = advance(model, new, state)
            torch.testing.assert_close(logits, model(seq)[:, -1], atol=1e-5, rtol=0)


def test_greedy_tokens_equal_hf_generate(imported):
    _, source, model, _, _ = imported
    prompt = tokens(batch=3, length=20)[:, :] % (VOCAB - 1) + 1
    with torch.no_grad():
        expected = source.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
                                   eos_token_id=None, pad_token_id=0, min_new_tokens=0)
    assert torch.equal(model.generate(prompt, 20, progress=False), expected)


def test_a_state_patch_while_decoding_equals_the_full_forward(imported):
    _, _, model, layer, shape = imported
    prompt = tokens(batch=3, length=12)
    patch = StatePatch([0, 2], [14, 14], deltas=torch.randn(2, *shape, generator=torch.Generator().manual_seed(7)) * 4)
    fwd_hooks = [(f"blocks.{layer}.mixer.hook_state", patch)]
    out, cache = model.generate(prompt, 8, fwd_hooks=fwd_hooks, cache_names=["hook_logits"], progress=False)
    full = model.run_with_hooks(out[:, :-1], fwd_hooks=fwd_hooks)
    torch.testing.assert_close(cache["hook_logits"], full, atol=1e-5, rtol=1e-5)
    assert (full[[0, 2], 14:] - model(out[:, :-1])[[0, 2], 14:]).abs().amax() > 1e-3


def test_interventions_resumed_equal_whole_passes(imported):
    """Interchange at every block's residuals and a Mamba-2 layer's state, and ablations of that
    state: resumed from the site's block (MLP-only, parallel and shared blocks on the way) as in
    whole passes."""
    name, _, _, layer, _ = imported
    model = models.from_pretrained(FAMILIES[name][0](vocab_size=AR_VOCAB))
    clean = ar_batch(8, 4, seed=0)
    corrupt = corrupt_ar(clean, TASK, seed=1)
    state = f"blocks.{layer}.mixer.hook_state"
    sites = site_grid(model, ["blocks.{l}.hook_resid_pre", "blocks.{l}.hook_resid_mid", state], ["key", "value"])
    resumed, whole = (interchange(model, clean, corrupt, sites, min_effect=0.0, resume=r) for r in (True, False))
    torch.testing.assert_close(resumed.p_patched, whole.p_patched, atol=1e-6, rtol=0)
    assert (whole.p_patched - whole.p_corrupt).abs().max() > 1e-4
    estimate = attribute(model, clean, corrupt, sites, min_effect=0.0, progress=False)  # states recomputed per block
    torch.testing.assert_close(estimate.p_corrupt, whole.p_corrupt, atol=1e-6, rtol=0)
    assert torch.isfinite(estimate.p_patched).all() and (estimate.p_patched - estimate.p_corrupt).abs().max() > 1e-4
    ablated = [Site(state, role) for role in ("key", "query")]
    resumed, whole = (ablate(model, clean, ablated, mode="mean", resume=r) for r in (True, False))
    torch.testing.assert_close(resumed.p_answer, whole.p_answer, atol=1e-6, rtol=0)


def test_round_trip_and_checkpoint_directory(imported, tmp_path):
    name, source, model, _, _ = imported
    assert_round_trip(model, tmp_path / "run", tokens())
    source.save_pretrained(tmp_path / "ckpt")
    loaded = models.from_pretrained(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens()), source(tokens()).logits, atol=1e-4, rtol=0)


def test_nemotron_h_layout_and_hook_names():
    model = models.from_pretrained(nemotron_h_source())
    assert model.cfg.mixers == ["mamba2", None, "attention", None, "mamba2"]
    assert model.cfg.mlps == [False, True, False, True, False]
    assert model.cfg.mixer_options["mamba2"]["dt_limit"] is None  # time_step_limit (0, inf), as transformers reads it
    names = set(model.hook_names())
    assert "blocks.1.mlp.hook_post" in names and "blocks.1.norm_mlp.hook_scale" in names
    assert not any(n.startswith(("blocks.1.mixer", "blocks.0.mlp", "blocks.2.mlp")) for n in names)
    assert {"blocks.1.hook_resid_pre", "blocks.1.hook_resid_mid", "blocks.1.hook_resid_post"} <= names
    _, cache = model.run_with_cache(tokens(), names=["blocks.1.hook_resid_pre", "blocks.1.hook_resid_mid",
                                                     "blocks.1.mlp.hook_pre", "blocks.1.mlp.hook_post"])
    assert torch.equal(cache["blocks.1.hook_resid_mid"], cache["blocks.1.hook_resid_pre"])
    torch.testing.assert_close(cache["blocks.1.mlp.hook_post"], cache["blocks.1.mlp.hook_pre"].relu().square())
    assert model.resume_hooks(0)["carry"] == ["blocks.0.mixer.hook_state", "blocks.4.mixer.hook_state"]
    with pytest.raises(ValueError, match="block 1 has 'no mixer'"):
        effective_attention(model, tokens(batch=1, length=8), layer=1, progress=False)


@pytest.mark.parametrize("make", [
    lambda: nemotron_h_source(mlp_bias=True, use_bias=True, use_conv_bias=False, tie_word_embeddings=True),
    lambda: bamba_source(time_step_limit=(0.05, 0.6), mamba_proj_bias=True, attention_bias=True, mlp_bias=True),
    lambda: granite_source(tie_word_embeddings=True, position_embedding_type="nope", mamba_conv_bias=False),
    lambda: falcon_h1_source(mamba_rms_norm=False, tie_word_embeddings=True),
    lambda: falcon_h1_source(mamba_norm_before_gate=True, mamba_proj_bias=True, projectors_bias=True,
                             attention_bias=True, mlp_bias=True),
    lambda: zamba2_source(use_shared_attention_adapter=False, num_mem_blocks=1, use_mem_rope=False, hidden_act="silu",
                          add_bias_linear=True, num_key_value_heads=2),
])
def test_variants_parity(make):
    source = make()
    model = models.from_pretrained(source)
    assert_parity(source, model, tokens(length=24), atol=1e-4,
                  embed_scale=getattr(source.config, "embedding_multiplier", 1.0))


def test_falcon_h1_names_both_branches():
    model = models.from_pretrained(falcon_h1_source(mamba_rms_norm=False))
    assert model.cfg.mixer == "mamba2" and model.cfg.mixer2 == "attention"
    assert model.cfg.mixer_options["mamba2"]["gated_norm"] == "none"
    assert not hasattr(model.blocks[0].mixer, "norm_weight")
    _, cache = model.run_with_cache(tokens(), names=lambda n: n.startswith("blocks.1."))
    assert {"blocks.1.mixer.hook_state", "blocks.1.mixer2.hook_pattern"} <= set(cache)
    torch.testing.assert_close(cache["blocks.1.hook_resid_mid"], cache["blocks.1.hook_resid_pre"]
                               + cache["blocks.1.mixer.hook_out"] + cache["blocks.1.mixer2.hook_out"])
    _, labels = model.run_with_cache(tokens())[1].stack_head_results(return_labels=True)
    assert labels == [f"L{l}{b}H{h}" for l in range(2) for b in ("", "b") for h in range(4)]  # Mamba-2, attention


def test_zamba2_names_the_shared_block_at_each_depth():
    model = models.from_pretrained(zamba2_source())
    assert model.cfg.shared_blocks == [None, 0, None, 1, 0] and model.cfg.mlp_activation == "geglu"
    first, other, again = (model.blocks[l].shared for l in (1, 3, 4))
    assert first.attn.qkv.weight is again.attn.qkv.weight and first.mlp.down.weight is again.mlp.down.weight
    assert first.attn.qkv.weight is not other.attn.qkv.weight  # the second shared block
    assert first.attn.qkv.lora_a is not again.attn.qkv.lora_a and first.proj.weight is not again.proj.weight
    names = set(model.hook_names())
    for layer in (1, 3, 4):
        assert {f"blocks.{layer}.shared.attn.hook_pattern", f"blocks.{layer}.shared.mlp.hook_post",
                f"blocks.{layer}.shared.hook_out", f"blocks.{layer}.mixer.hook_state"} <= names
    assert not any(n.startswith(("blocks.0.shared", "blocks.2.shared")) for n in names)
    graph = build_graph(model)  # circuits model each depth's shared block as its own node (tests/test_circuits.py)
    assert {"z1", "z3", "z4"} <= {node.name for node in graph.senders}
    _, cache = model.run_with_cache(tokens(), names=["hook_embed", "blocks.1.hook_resid_pre",
                                                     "blocks.1.shared.attn.hook_in"])
    normed = torch.cat([cache["blocks.1.hook_resid_pre"], cache["hook_embed"]], -1)  # the attention reads [x | e]
    scale = normed.square().mean(-1, keepdim=True).add(1e-5).rsqrt()
    torch.testing.assert_close(cache["blocks.1.shared.attn.hook_in"],
                               normed * scale * model.blocks[1].shared.norm_attn.weight, atol=1e-5, rtol=0)


def test_granite_moe_routes_as_the_source():
    source = granite_moe_source()
    model = models.from_pretrained(source)
    assert model.cfg.moe["experts"] == 4 and not model.cfg.moe["shared_gate"]
    seen = []
    handle = source.model.layers[1].block_sparse_moe.router.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        with torch.no_grad():
            source(tokens())
    finally:
        handle.remove()
    logits, weights, index = seen[0]  # [N, E], [N, k], [N, k]
    _, cache = model.run_with_cache(tokens(), names=["blocks.1.mlp.hook_router_logits", "blocks.1.mlp.hook_expert_indices",
                                                     "blocks.1.mlp.hook_expert_weights"])
    torch.testing.assert_close(cache["blocks.1.mlp.hook_router_logits"].flatten(0, 1), logits, atol=1e-5, rtol=0)
    assert torch.equal(cache["blocks.1.mlp.hook_expert_indices"].flatten(0, 1), index)
    torch.testing.assert_close(cache["blocks.1.mlp.hook_expert_weights"].flatten(0, 1), weights, atol=1e-6, rtol=0)


def test_bamba_and_granite_layouts():
    bamba = models.from_pretrained(bamba_source())
    assert bamba.cfg.mixers == ["attention", "mamba2"] * 2 and bamba.cfg.positional == "rope"
    assert bamba.cfg.mixer_options["attention"]["partial_rotary_factor"] == 0.5
    granite = models.from_pretrained(granite_source(position_embedding_type=None))
    assert granite.cfg.positional == "none" and "attention" not in granite.cfg.mixer_options


@pytest.mark.parametrize("make, message", [
    (lambda: bamba_source(hidden_act="gelu"), "hidden_act='gelu'"),
    (lambda: bamba_source(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
     "rope_type 'default'"),
    (lambda: falcon_h1_source(projectors_bias=True), "projectors_bias=True.*mamba_proj_bias=False"),
    (lambda: zamba2_source(hidden_act="relu"), "hidden_act='relu'"),
    (lambda: nemotron_h_source(layers_block_type=["linear_attention", "moe"], moe_latent_size=8), "moe_latent_size=8"),
    (lambda: nemotron_h_source(mlp_hidden_act="gelu"), "mlp_hidden_act='gelu'"),
])
def test_config_we_cannot_represent_raises(make, message):
    with pytest.raises(UnsupportedConfig, match=message):
        models.from_pretrained(make())
