"""TransformerLens' attn names on the mla mixer (Kimi Linear's attention layers, models.tl.names):
blocks.l.attn.hook_{q,k,v,attn_scores,pattern,z,result} are the mla mixer's own hooks, as on the
ordinary attention mixer, on a tiny Kimi-Linear-style stack (kda, mla, kda; NoPE)."""

import pytest
import torch

import models
from models.config import ModelConfig
from models.tl.names import NoCounterpart

NAMES = ("q", "k", "v", "attn_scores", "pattern", "z", "result")
MLA = 1  # the attention layer


@pytest.fixture(scope="module")
def kimi_style():
    torch.manual_seed(0)
    model = models.SequenceModel(ModelConfig(
        mixer=["kda", "mla", "kda"], n_layers=3, vocab_size=11, d_model=16, n_heads=2, mlp=True, positional="none",
        norm="rmsnorm", mixer_options={"kda": {"head_dim": 4},
                                       "mla": {"q_lora_rank": 6, "kv_lora_rank": 4, "qk_rope_head_dim": 2,
                                               "v_head_dim": 4}})).eval()
    return model, torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(1))


def test_tl_attn_names_are_the_mla_mixers_hooks(kimi_style):
    model, _ = kimi_style
    for name in NAMES:
        assert model.hook_point(f"blocks.{MLA}.attn.hook_{name}") is getattr(model.blocks[MLA].mixer, f"hook_{name}")
    assert model.hook_point(f"blocks.{MLA}.hook_attn_out") is model.blocks[MLA].mixer.hook_out
    with pytest.raises(NoCounterpart, match="rotate"):
        model.hook_point(f"blocks.{MLA}.attn.hook_rot_q")


def test_run_with_cache_under_tl_names_equals_our_names(kimi_style):
    model, ids = kimi_style
    tl = [f"blocks.{MLA}.attn.hook_{name}" for name in NAMES] + [f"blocks.{MLA}.hook_attn_out"]
    ours = [f"blocks.{MLA}.mixer.hook_{name}" for name in NAMES] + [f"blocks.{MLA}.mixer.hook_out"]
    with torch.no_grad():
        logits_tl, by_tl = model.run_with_cache(ids, names=tl)
        logits, by_ours = model.run_with_cache(ids, names=ours)
    assert torch.equal(logits_tl, logits) and sorted(by_tl.keys()) == sorted(ours)
    for theirs, mine in zip(tl, ours):
        assert torch.equal(by_tl[theirs], by_ours[mine]), theirs
    for name in NAMES:
        assert by_tl[name, MLA] is by_tl[f"blocks.{MLA}.mixer.hook_{name}"]
    # the values are attention's: causal rows summing to 1; the per-head results sum (with W_o's bias) to the output
    pattern = by_tl["pattern", MLA]  # [B, H, T, T]
    torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:-1]))
    assert torch.all(pattern.triu(1) == 0)
    result = by_tl["result", MLA].sum(2) + model.blocks[MLA].mixer.out_proj.bias  # [B, T, d_model]
    torch.testing.assert_close(result, by_tl[f"blocks.{MLA}.hook_attn_out"], atol=1e-5, rtol=0)


def test_patch_under_tl_name_equals_patch_under_ours(kimi_style):
    model, ids = kimi_style

    def drop_head_0(z, hook):  # z [B, T, H, d_v]
        z = z.clone()
        z[:, :, 0] = 0
        return z

    with torch.no_grad():
        clean = model(ids)
        tl = model.run_with_hooks(ids, fwd_hooks=[(f"blocks.{MLA}.attn.hook_z", drop_head_0)])
        ours = model.run_with_hooks(ids, fwd_hooks=[(f"blocks.{MLA}.mixer.hook_z", drop_head_0)])
    assert torch.equal(tl, ours) and not torch.allclose(tl, clean)
