"""The source model run one token at a time through its own recurrent cache, with state patches:
the Python-loop way to patch a transformers SSM's state causally, and the oracle our hook_state
patches are tested (and benchmarked) against.

For transformers' recurrent models (Mamba, FalconMamba, Mamba-2, ...) whose cache keeps each
layer's recurrent state (DynamicCache.get_recurrent_state), in the layout of our hook_state at one
step ([B, E, N] for Mamba).
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def stepwise_logits(source: nn.Module, tokens: torch.Tensor,
                    patches: dict[tuple[int, int], torch.Tensor] | None = None, prefill: int = 1) -> torch.Tensor:
    """Logits [B, T, V] of `source` fed tokens [B, T] one step at a time after the first
    `prefill` tokens in one call; patches {(layer, t): state [B, *S]} replace that layer's
    recurrent state right after step t (t >= prefill - 1), so every later step continues from it
    (the causal state patch; the read-out at t itself is the unpatched one)."""
    patches = patches or {}
    if isinstance(prefill, bool) or not isinstance(prefill, int) or not 1 <= prefill <= tokens.shape[1]:
        raise ValueError(f"prefill must be an int in [1, T={tokens.shape[1]}]; got {prefill!r}")
    for (layer, t), state in patches.items():
        if not prefill - 1 <= t < tokens.shape[1]:
            raise ValueError(f"patch step t={t} outside [prefill - 1 = {prefill - 1}, T = {tokens.shape[1]})")
    cache, logits = None, []
    for start, stop in [(0, prefill), *((t, t + 1) for t in range(prefill, tokens.shape[1]))]:
        out = source(input_ids=tokens[:, start:stop], cache=cache, use_cache=True)
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        for (layer, step), state in patches.items():
            if step == stop - 1:
                current = cache.get_recurrent_state(layer, state_idx=0)
                if current.shape != state.shape:
                    raise ValueError(f"patch for layer {layer} has shape {tuple(state.shape)}; the source's "
                                     f"recurrent state has {tuple(current.shape)}")
                current.copy_(state)
        logits.append(out.logits)
    return torch.cat(logits, dim=1)
