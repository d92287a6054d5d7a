"""The kda and mla mixers on their own: float64 gradchecks of both paths, every delta-rule impl
inside the kda mixer, and MLA's KV cache carrying patched keys / latents into later tokens (the
same as a full forward with the same hook). Parity with transformers: test_interop_kimi.py."""

import pytest
import torch

import models
from tests.conftest import triton_interpreter_available

IMPLS = ["naive", "chunked", "native", pytest.param("triton", marks=[
    pytest.mark.triton, pytest.mark.skipif(not triton_interpreter_available(), reason="no triton interpreter")])]


def tiny(name, **options):
    torch.manual_seed(0)
    return models.build(name, vocab_size=7, d_model=8, n_heads=2, n_layers=1, d_mlp=8,
                        mixer_options=options).double()


@pytest.mark.parametrize("name, options", [("kda", dict(head_dim=3, chunk_size=2)),
                                           ("mla", dict(kv_lora_rank=3, qk_rope_head_dim=2, v_head_dim=3))])
@pytest.mark.parametrize("path", ["fast", "instrumented"])
def test_gradcheck_float64(name, options, path):
    mixer = tiny(name, **options).blocks[0].mixer
    mixer.execution_path = path
    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(mixer, (x,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_every_kernel_impl_gives_the_same_model(impl):
    tokens = torch.randint(0, 7, (2, 21), generator=torch.Generator().manual_seed(1))
    reference = tiny("kda", head_dim=4, impl="naive").float()
    model = tiny("kda", head_dim=4, impl=impl, chunk_size=8).float()
    with torch.no_grad():
        expected, cache = reference.run_with_cache(tokens, names=["blocks.0.mixer.hook_state"])
        got, ours = model.run_with_cache(tokens, names=["blocks.0.mixer.hook_state"])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours["blocks.0.mixer.hook_state"], cache["blocks.0.mixer.hook_state"],
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("hook", ["hook_k", "hook_v", "hook_latent"])
def test_mla_cache_keeps_a_patch_for_later_tokens(hook):
    """A hook function that changes position 3 while generating (a generated position): every
    later token reads the patched key / value / latent from the cache, as a full forward does."""
    model = models.build("mla", vocab_size=7).eval()

    def shift(x, point):
        start = getattr(point, "position", 0)
        if start <= 3 < start + x.shape[1]:
            x = x.clone()
            x[:, 3 - start] += 1.0
        return x

    fwd_hooks = [(f"blocks.0.mixer.{hook}", shift)]
    prompt = torch.randint(0, 7, (2, 2), generator=torch.Generator().manual_seed(2))
    out, cache = model.generate(prompt, 8, fwd_hooks=fwd_hooks, cache_names=["hook_logits"], progress=False)
    with torch.no_grad():
        full = model.run_with_hooks(out[:, :-1], fwd_hooks=fwd_hooks)
        clean = model(out[:, :-1])
    torch.testing.assert_close(cache["hook_logits"], full, atol=1e-5, rtol=0)
    assert (full[:, 4:] - clean[:, 4:]).abs().amax() > 1e-3 and torch.equal(full[:, :3], clean[:, :3])


@pytest.mark.parametrize("name", ["kda", "mla"])
def test_heads_equal_indexing_the_full_cache(name):
    """run_with_cache(heads=...) keeps heads of hook_q / k / v / z / result / beta, the pattern and
    (kda) hook_state [B, T, H, V, K] on axis 2, as indexing the full cache does."""
    model = models.build(name, vocab_size=7)
    tokens = torch.randint(0, 7, (2, 9), generator=torch.Generator().manual_seed(3))
    plan = model.cache_plan(tokens)
    axes = {n: layout.head_axis for n, layout in plan.layouts.items() if layout.head_axis is not None}
    assert ("blocks.0.mixer.hook_state" in axes) == (name == "kda") and "blocks.0.mixer.hook_z" in axes
    with torch.no_grad():
        _, full = model.run_with_cache(tokens)
        _, kept = model.run_with_cache(tokens, heads=[-1, 1])
    for hook, value in full.items():
        expected = value.index_select(axes[hook], torch.tensor([3, 1])) if hook in axes else value
        assert torch.equal(kept[hook], expected), hook


def test_bad_options_raise():
    with pytest.raises(ValueError, match="the 'mla' mixer has none"):
        models.build("mla", positional="rope")
    with pytest.raises(ValueError, match=r"mixer_options\['kv_lora_rank'\] must be an int >= 1; got 0"):
        models.build("mla", mixer_options={"kv_lora_rank": 0})
    with pytest.raises(ValueError, match="got n_kv_heads=2 with n_heads=4"):
        models.build("mla", n_kv_heads=2)
    with pytest.raises(ValueError, match=r"kda mixer_options\['impl'\] must be one of"):
        models.build("kda", mixer_options={"impl": "cuda"})
    with pytest.raises(ValueError, match=r"kda mixer_options: unknown keys \['gate'\]"):
        models.build("kda", mixer_options={"gate": True})
