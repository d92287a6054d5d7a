"""The native causal scores + softmax pass (models.kernels.native.softmax) against torch's
product, scale, mask and softmax, and the attention readers' use of it."""

import pytest
import torch

import models
from models.kernels.native import library
from models.kernels.native import softmax as native_softmax
from models.mixers.attention import causal_mask

needs_native = pytest.mark.skipif(
    not library.available(), reason=f"native kernels unavailable: {library.unavailable_reason()}"
)


@needs_native
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("n_queries, n_keys, d_head", [(37, 37, 16), (5, 37, 8), (1, 1, 4), (1, 9, 3), (130, 130, 7)])
def test_causal_scores_and_pattern_equal_torch(n_queries, n_keys, d_head, dtype, tol):
    """Scores (q k^T / sqrt(d), -inf after the query) and pattern (zero after the query, rows
    summing to 1) within tol of torch's; queries the last Tq of Tk positions, transposed (not
    contiguous) q and k as the mixer passes them, key counts past the 64-wide block, odd sizes."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, n_queries, 3, d_head, generator=gen, dtype=dtype).transpose(1, 2) * 2
    k = torch.randn(2, n_keys, 3, d_head, generator=gen, dtype=dtype).transpose(1, 2)
    allowed = causal_mask(n_queries, n_keys, "cpu")
    want_scores = (q @ k.transpose(-1, -2) / d_head**0.5).masked_fill(~allowed, float("-inf"))
    scores, pattern = native_softmax.causal_scores_and_pattern(q, k)
    torch.testing.assert_close(scores, want_scores, atol=tol, rtol=tol)
    torch.testing.assert_close(pattern, want_scores.softmax(-1), atol=tol, rtol=tol)
    assert bool((pattern[..., ~allowed] == 0).all()) and bool(torch.isinf(scores[..., ~allowed]).all())


@needs_native
def test_attention_readers_take_the_native_pass(monkeypatch):
    """An every-hook cache with a backward forms scores and pattern by causal_scores_and_pattern
    (once per layer) and reports torch's values for them, and hook_result's per-head outputs
    sum to hook_out."""
    torch.manual_seed(0)
    model = models.build("transformer", vocab_size=7, d_model=16, n_layers=2)
    calls = []
    real = native_softmax.causal_scores_and_pattern
    monkeypatch.setattr(native_softmax, "causal_scores_and_pattern", lambda *a: calls.append(a[0].shape) or real(*a))
    tokens = torch.randint(0, 7, (2, 11), generator=torch.Generator().manual_seed(1))
    logits, cache = model.run_with_cache(tokens)
    logits.sum().backward()
    assert len(calls) == 2
    for layer in range(2):
        q, k = (cache[f"blocks.{layer}.mixer.hook_{x}"].transpose(1, 2) for x in "qk")
        scores = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~causal_mask(11, 11, "cpu"), float("-inf"))
        torch.testing.assert_close(cache["attn_scores", layer], scores, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(cache["pattern", layer], scores.softmax(-1), atol=1e-6, rtol=1e-6)
        bias = model.blocks[layer].mixer.out_proj.bias
        torch.testing.assert_close(cache["result", layer].sum(2) + bias, cache[f"blocks.{layer}.mixer.hook_out"],
                                   atol=1e-6, rtol=1e-5)
