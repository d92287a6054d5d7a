"""TransformerLens' names on sparse (MoE) MLPs and parallel mixers (models.tl.names): TL's router
logits (mlp.gate.hook_out), hook_expert_indices and hook_expert_weights against TL 4.3's
TransformerBridge on the same Qwen3-MoE weights (float64; skipped without TL), and TL's attn
names reaching a parallel mixer2 (Falcon-H1's layout)."""

import pytest
import torch

import models
from models.config import ModelConfig
from tests.test_interop_qwen3 import qwen3_moe_source
from tests.tl_oracle import lens


def test_tl_attn_names_reach_a_parallel_attention_mixer2():
    torch.manual_seed(0)
    model = models.SequenceModel(ModelConfig(
        mixer=["mamba2", "attention"], mixer2=["attention", None], mlp=True, n_layers=2, vocab_size=11, d_model=16,
        n_heads=2, d_state=4, mixer_options={"mamba2": {"n_heads": 2, "head_dim": 8}})).eval()
    assert model.hook_point("blocks.0.attn.hook_pattern").name == "blocks.0.mixer2.hook_pattern"
    assert model.hook_point("blocks.1.attn.hook_pattern").name == "blocks.1.mixer.hook_pattern"
    ids = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=["blocks.0.attn.hook_pattern", "blocks.1.mixer.hook_pattern"])
    assert set(cache.keys()) == {"blocks.0.mixer2.hook_pattern", "blocks.1.mixer.hook_pattern"}
    assert cache["pattern", 0] is cache["blocks.0.mixer2.hook_pattern"]
    assert cache["blocks.0.attn.hook_pattern"] is cache["blocks.0.mixer2.hook_pattern"]


def test_tl_router_gate_name_reads_router_logits_on_sparse_layers_and_hook_pre_on_dense():
    model = models.from_pretrained(qwen3_moe_source())  # sparse layers 0 and 2, dense 1
    assert model.hook_point("blocks.0.mlp.gate.hook_out").name == "blocks.0.mlp.hook_router_logits"
    assert model.hook_point("blocks.1.mlp.gate.hook_out").name == "blocks.1.mlp.hook_pre"


def test_moe_routing_hooks_equal_transformer_lens():
    source = qwen3_moe_source().double().eval()
    bridge = lens(source)
    ours = models.from_pretrained(source)
    ids = torch.randint(0, source.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, theirs = bridge.run_with_cache(ids)
        _, mine = ours.run_with_cache(ids)
    # 1e-6: transformers' Qwen3-MoE RMSNorm computes in float32 even in a float64 model (its own
    # logits are 1.3e-7 from ours and from the bridge's), so the routers' inputs differ by that much
    for layer in (0, 2):
        logits = mine[f"blocks.{layer}.mlp.gate.hook_out"]  # [B, T, E] (TL's name)
        torch.testing.assert_close(logits.flatten(0, 1), theirs[f"blocks.{layer}.mlp.gate.hook_out"],
                                   atol=1e-6, rtol=0)
        index = mine[f"blocks.{layer}.mlp.hook_expert_indices"]  # [B, T, k]
        assert torch.equal(index.flatten(0, 1), theirs[f"blocks.{layer}.mlp.hook_expert_indices"].long())
        weights = mine[f"blocks.{layer}.mlp.hook_expert_weights"]  # [B, T, k]
        scattered = torch.zeros_like(logits).scatter(-1, index, weights)  # TL's [B T, E] layout
        torch.testing.assert_close(scattered.flatten(0, 1), theirs[f"blocks.{layer}.mlp.hook_expert_weights"],
                                   atol=1e-6, rtol=0)
