"""The next token from the logits: greedy, or a sample with temperature, top_k and top_p."""

from __future__ import annotations

import torch

def next_tokens(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int | None,
                top_p: float | None, generator: torch.Generator | None) -> torch.Tensor:
    """The next token [B] from logits [B, V]: argmax, or a sample from softmax(logits /
    temperature) restricted to the top_k most likely tokens and then to the smallest set whose
    probability reaches top_p (the order of HF's warpers)."""
    if not do_sample:
        return logits.argmax(-1)
    scores = logits.float() / temperature
    if top_k is not None and top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, index = scores.sort(dim=-1, descending=False)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative <= 1 - top_p
        drop[:, -1] = False  # keep at least the most likely token
        scores = scores.masked_fill(drop.scatter(1, index, drop), float("-inf"))
    probs = scores.softmax(-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(logits.device)


def check_sampling(max_new_tokens, do_sample, temperature, top_k, top_p, seed) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0; got {max_new_tokens!r}")
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be a bool; got {do_sample!r}")
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature must be a float > 0; got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1; got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a float in (0, 1]; got {top_p!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be None or an int; got {seed!r}")
