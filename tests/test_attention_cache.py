"""The Transformer's every-hook cache under grad mode: pattern and scores formed for the readers,
the output from SDPA; the same logits, gradients and cached pattern as the explicit path."""

import torch

import models
from models.mixers.attention import causal_pattern


def test_cached_run_with_a_backward_equals_the_explicit_path():
    torch.manual_seed(0)
    model = models.build("transformer", vocab_size=11, d_model=32, n_layers=2)
    tokens = torch.randint(0, 11, (3, 17), generator=torch.Generator().manual_seed(1))
    results = []
    for path in ("auto", "instrumented"):  # instrumented: the output from the materialised pattern
        model.set_execution_path(path)
        model.zero_grad(set_to_none=True)
        logits, cache = model.run_with_cache(tokens)
        logits.square().mean().backward()
        results.append((logits.detach(), cache, [p.grad.clone() for p in model.parameters()]))
    model.set_execution_path("auto")
    (logits, cache, grads), (ref_logits, ref_cache, ref_grads) = results
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for layer in range(2):
        name = f"blocks.{layer}.mixer.hook_"
        torch.testing.assert_close(cache[name + "pattern"], ref_cache[name + "pattern"], atol=1e-6, rtol=0)
        q, k = (cache[name + x].transpose(1, 2) for x in "qk")  # learned positions: no rotary
        torch.testing.assert_close(cache[name + "pattern"], causal_pattern(q, k), atol=1e-6, rtol=0)
