"""from_pretrained of transformers' Qwen3 and Qwen3-MoE (attention with qk norm; sparse MoE
layers without a shared expert) on tiny random configs, every parameter jittered: parity of
logits, blocks and input gradients on both paths, the MoE router's outputs, greedy tokens equal
to transformers' generate, save -> load, and the sliding window refused."""

import pytest
import torch

import models
from models.interop import UnsupportedConfig
from tests.interop_parity import VOCAB, assert_parity, assert_round_trip, jitter
from tests.test_decoding_hf import hf_greedy
from tests.test_interop import IDS, tokens

tf = pytest.importorskip("transformers")
COMMON = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5, **IDS)


def qwen3_source(**overrides):
    torch.manual_seed(0)
    return jitter(tf.Qwen3ForCausalLM(tf.Qwen3Config(**{**COMMON, **overrides})))


def qwen3_moe_source(**overrides):
    """Sparse MLPs (4 experts, top 2) in layers 0 and 2, dense in layer 1 (mlp_only_layers)."""
    config = tf.Qwen3MoeConfig(**{**COMMON, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 10,
                                  "mlp_only_layers": [1], **overrides})
    config._experts_implementation = "eager"  # the grouped-matmul experts need 16-byte strides
    torch.manual_seed(0)
    return jitter(tf.Qwen3MoeForCausalLM(config))


SOURCES = {"qwen3": qwen3_source, "qwen3_moe": qwen3_moe_source}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_parity_generate_and_round_trip(name, tmp_path):
    source = SOURCES[name]()
    model = models.from_pretrained(source)
    assert model.cfg.mixer_options["qk_norm"] is True
    assert_parity(source, model, tokens(), atol=1e-4)
    prompt = tokens(3, 20)
    assert torch.equal(model.generate(prompt, 24), hf_greedy(source, prompt, None))
    assert_round_trip(model, tmp_path / "run", tokens())


@pytest.mark.parametrize("overrides", [dict(norm_topk_prob=True, attention_bias=True, tie_word_embeddings=True),
                                       dict(decoder_sparse_step=2, mlp_only_layers=[])])
def test_qwen3_moe_variants_and_router_outputs(overrides):
    source = qwen3_moe_source(**overrides)
    model = models.from_pretrained(source)
    sparse = [i for i, layer in enumerate(source.model.layers) if hasattr(layer.mlp, "experts")]
    assert model.cfg.moe["layers"] == sparse and model.cfg.moe["norm_topk_prob"] == source.config.norm_topk_prob
    assert_parity(source, model, tokens(), atol=1e-4)
    layer = sparse[-1]
    routed = {}
    handle = source.model.layers[layer].mlp.gate.register_forward_hook(lambda m, i, o: routed.update(out=o))
    try:
        with torch.no_grad():
            source(tokens())
    finally:
        handle.remove()
    _, cache = model.run_with_cache(tokens(), names=lambda n: n.startswith(f"blocks.{layer}.mlp.hook_"))
    logits, weights, index = routed["out"]  # [B T, E], [B T, k], [B T, k]
    torch.testing.assert_close(cache[f"blocks.{layer}.mlp.hook_router_logits"].flatten(0, 1), logits, atol=1e-5, rtol=0)
    assert torch.equal(cache[f"blocks.{layer}.mlp.hook_expert_indices"].flatten(0, 1), index)
    torch.testing.assert_close(cache[f"blocks.{layer}.mlp.hook_expert_weights"].flatten(0, 1), weights, atol=1e-6,
                               rtol=0)


@pytest.mark.parametrize("make, message", [
    (lambda: qwen3_source(use_sliding_window=True, sliding_window=8, max_window_layers=1), "sliding_window=8"),
    (lambda: qwen3_moe_source(use_sliding_window=True, sliding_window=8), "sliding_window=8"),
    (lambda: qwen3_source(hidden_act="gelu"), "hidden_act='gelu'"),
    (lambda: qwen3_moe_source(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
     "rope_type 'default'"),
])
def test_config_we_cannot_represent_raises(make, message):
    with pytest.raises(UnsupportedConfig, match=message):
        models.from_pretrained(make())
