"""The native causal scores + softmax pass (models.kernels.native.softmax.causal_softmax_) against
torch's scale, mask and softmax, and the attention readers' use of it."""

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
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-13)])
@pytest.mark.parametrize("n_queries, n_keys", [(37, 37), (5, 37), (1, 1), (1, 9), (130, 130)])
def test_causal_softmax_equals_torch(n_queries, n_keys, dtype, tol):
    """Scores (scaled, -inf after the query) and pattern (zero after the query, rows summing to 1)
    within tol of torch's; queries the last Tq of Tk positions, odd sizes, a single key."""
    gen = torch.Generator().manual_seed(0)
    product = torch.randn(2, 3, n_queries, n_keys, generator=gen, dtype=dtype) * 8
    allowed = causal_mask(n_queries, n_keys, "cpu")
    want_scores = (product / 16**0.5).masked_fill(~allowed, float("-inf"))
    want = want_scores.softmax(-1)
    scores = product.clone()
    got = native_softmax.causal_softmax_(scores, 16)
    torch.testing.assert_close(scores, want_scores, atol=0, rtol=tol)
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    assert bool((got[..., ~allowed] == 0).all()) and bool(torch.isinf(scores[..., ~allowed]).all())


@needs_native
def test_attention_readers_take_the_native_pass(monkeypatch):
    """An every-hook cache with a backward forms scores and pattern by causal_softmax_ (once per
    layer) and reports torch's values for them."""
    torch.manual_seed(0)
    model = models.build("transformer", vocab_size=7, d_model=16, n_layers=2)
    calls = []
    real = native_softmax.causal_softmax_
    monkeypatch.setattr(native_softmax, "causal_softmax_", lambda *a: calls.append(a[0].shape) or real(*a))
    tokens = torch.randint(0, 7, (2, 11), generator=torch.Generator().manual_seed(1))
    logits, cache = model.run_with_cache(tokens)
    logits.sum().backward()
    assert len(calls) == 2
    for layer in range(2):
        q, k = (cache[f"blocks.{layer}.mixer.hook_{x}"].transpose(1, 2) for x in "qk")
        scores = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~causal_mask(11, 11, "cpu"), float("-inf"))
        torch.testing.assert_close(cache["attn_scores", layer], scores, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(cache["pattern", layer], scores.softmax(-1), atol=1e-6, rtol=1e-6)
