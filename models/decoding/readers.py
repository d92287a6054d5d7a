"""What hook readers are handed while decoding.

A reader on a recurrent mixer's hook_state (model.hooks(readers=...), run_with_cache's
kind: fn(x, hook), nothing returned) is handed each call's states [B, n, *S] unless it selects:
with a `positions` attribute (absolute steps) on every reader of the hook, each call runs its
fast segments up to the selected steps it holds and hands over those states only ([B, K, *S];
hook.emitted_positions: the steps on the call's time axis, hook.position + each is absolute), a
call holding none runs plain; with `heads` (indices of the state's head axis) the states are
narrowed to them (hook.emitted_heads), and with heads alone only those heads' states are formed
on the prompt where the mixer can (Mixer.head_states), a new token's state as the step's last
(emitted_positions [0]). So a reader on every layer need not build the prompt's [B, T, *S]
(benchmarks/RESULTS.md: readers during generate).

Recorder: the readers generate installs for its cache_names, each call's new positions joined
into one Cache at the end.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from models.cache import Cache
from models.hooks import HookPoint, selected_heads, selected_steps

# hooks whose time axis is 2 (the query axis) and whose axis 3 grows with the keys
QUERY_AXIS_HOOKS = ("hook_attn_scores", "hook_pattern")


def read_steps(hook: HookPoint, start: int, n: int) -> list[int] | None:
    """The steps of a call at positions [start, start + n) that hook's readers keep, on the call's
    time axis: every reader has `positions` (absolute steps, as StatePatch times in generate;
    models.hooks.selected_steps) and nothing patches or probes the hook. Else None."""
    wanted = selected_steps(hook)
    return None if wanted is None else [p - start for p in wanted if start <= p < start + n]


def streamed_segment(mixer, u: torch.Tensor, inputs: dict[str, torch.Tensor], initial, start: int):
    """scan_from's (output, last state) with readers alone on hook_state selecting steps and / or
    heads (the module docstring) and no other per-step hook in use; None where that does not hold."""
    hook, gate = mixer.hook_state, getattr(mixer, "hook_gate", None)
    if not mixer.segments_allowed(u) or (gate is not None and gate.is_active):
        return None
    steps, heads = read_steps(hook, start, u.shape[1]), selected_heads(hook)
    if steps is None and heads is not None and u.shape[1] == 1:
        steps = [0]  # heads alone, one new token: its state is the segment's last
    if steps is None:
        states = mixer.head_states(inputs, heads) if heads is not None and initial is None else None
        if states is None:
            return None
        hook.emit(states, heads=heads)
        return mixer.fast_segment(u, inputs, initial)
    bounds = [0, *(t + 1 for t in steps)]
    bounds += [u.shape[1]] if bounds[-1] < u.shape[1] else []
    outs, finals, state = [], [], initial
    for lo, hi in zip(bounds, bounds[1:]):
        out, state = mixer.fast_segment(u[:, lo:hi], {k: v[:, lo:hi] for k, v in inputs.items()}, state)
        outs.append(out)
        finals.append(state)
    if steps:
        kept = finals[: len(steps)]  # one step: a view, not a fresh [B, 1, *S] (a page-faulting copy)
        states = kept[0].unsqueeze(1) if len(kept) == 1 else torch.stack(kept, dim=1)  # [B, K, *S]
        hook.emit(states if heads is None else states[:, :, heads], positions=steps, heads=heads)
    return torch.cat(outs, dim=1) if len(outs) > 1 else outs[0], state


class Recorder:
    """Readers for generate's cache: each call's new positions of every named hook, joined along
    the time axis at the end (the key axis of scores / pattern padded to the final length)."""

    def __init__(self, names: list[str]) -> None:
        self.chunks: dict[str, list[torch.Tensor]] = {n: [] for n in names}
        self.call_start = 0

    def readers(self) -> list[tuple[str, Callable]]:
        return [(name, self.reader(name)) for name in self.chunks]

    def reader(self, name: str):
        axis = 2 if name.endswith(QUERY_AXIS_HOOKS) else 1

        def store(x: torch.Tensor, hook: HookPoint) -> None:
            skip = self.call_start - getattr(hook, "position", 0)
            self.chunks[name].append(x.detach().narrow(axis, skip, x.shape[axis] - skip))

        return store

    def cache(self, model, length: int) -> Cache:
        cache = Cache(model=model)
        for name, chunks in self.chunks.items():
            if name.endswith(QUERY_AXIS_HOOKS):
                fill = float("-inf") if name.endswith("hook_attn_scores") else 0.0
                chunks = [torch.nn.functional.pad(c, (0, length - c.shape[-1]), value=fill) for c in chunks]
                cache[name] = torch.cat(chunks, dim=2)
            elif chunks:
                cache[name] = torch.cat(chunks, dim=1)
        return cache
