"""The machinery of causal state patches on a recurrent mixer's hook_state (models.hooks holds the
hook points and the run_with_cache / run_with_hooks interface; its docstring says what a state
patch means).

A mixer scans once and hands the states [B, T, *S] to hook_state; where a patch changed them
the (example, step) pairs are pinned (`state_pins`, `changed_steps`) and the recurrence re-run
from the pinned states (`scan_with_state_hook`: the kernels honour pins through `step_pins` /
`apply_step_pin` or their own equivalent). Declared patches (models.StatePatch) and hook
functions with nothing else on the hook and no gradient wanted run instead on the fast kernels
(`declared_state_patches`, `hook_functions_only`: RecurrentMixer.declared_forward /
hooked_forward). Gradients with respect to the states enter as a zero shift added after each
step (`state_probe`, `add_shift`, `step_shifts`, `only_probed`).
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from models.hooks import HookPoint, _forced_instrumented
from models.hooks.state_patch import StatePlan


def state_pins(
    before: torch.Tensor, after: torch.Tensor, n_state_dims: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Where a patch changed per-step states.

    before, after: [B, T, *state_shape]. Returns (mask [B, T] bool, values [B, T, *state_shape])
    or None when nothing changed. A mixer re-runs its recurrence so that state (b, t) equals
    values[b, t] wherever mask[b, t], continuing from it.
    """
    if after.shape != before.shape:
        raise ValueError(
            f"a hook_state patch must keep the shape {tuple(before.shape)}; got {tuple(after.shape)}"
        )
    if n_state_dims:  # per block of steps: a [B, t, *S] comparison at a time, not [B, T, *S]
        step_bytes = max(1, after[:, :1].numel())
        block = max(1, (1 << 24) // step_bytes)
        changed = torch.cat([(after[:, t:t + block] != before[:, t:t + block]).flatten(2).any(-1)
                             for t in range(0, after.shape[1], block)], dim=1)  # [B, T]
    else:
        changed = after != before
    if not bool(changed.any()):
        return None
    return changed, after


def step_pins(
    pins: tuple[torch.Tensor, torch.Tensor] | None, length: int
) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
    """pins (mask [B, T], values [B, T, *S]) or None -> T per-step pins (mask [B], values [B, *S])
    or T Nones. Split with unbind, whose backward is one stack."""
    if pins is None:
        return [None] * length
    return list(zip(pins[0].unbind(1), pins[1].unbind(1)))


def apply_step_pin(state: torch.Tensor, pin: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """Replace state [B, *S] by values [B, *S] where mask [B] is set (pin = (mask, values) or None)."""
    if pin is None:
        return state
    mask, values = pin
    return torch.where(mask.reshape(-1, *([1] * (state.dim() - 1))), values.to(state.dtype), state)


def declared_state_patches(hook: HookPoint, batch: int, length: int) -> StatePlan | None:
    """The StatePatches attached to hook, in order, as one StatePlan over states [batch, length,
    *S], when they are all that uses it: no other hook, no reader, no gradient probe, not forced
    instrumented; else None."""
    if not hook._forward_hooks or hook._forward_pre_hooks or hook._readers or hook._probes or _forced_instrumented():
        return None
    found = [getattr(h, "state_patch", None) for h in hook._forward_hooks.values()]
    return None if any(f is None for f in found) else StatePlan(found, batch, length)


def hook_functions_only(hook: HookPoint) -> bool:
    """Whether only hook functions (torch forward hooks: fwd_hooks, nnsight) use hook: no pre-hook,
    no reader, no gradient probe, not forced instrumented (RecurrentMixer.hooked_forward)."""
    return bool(hook._forward_hooks) and not (hook._forward_pre_hooks or hook._readers or hook._probes
                                              or _forced_instrumented())


def changed_steps(after: torch.Tensor, before_blocks, n_state_dims: int) -> torch.Tensor | None:
    """Where a patch changed per-step states, from the patched states after [B, T, *S] and the
    unpatched ones as (first step, [B, t, *S] block) pairs: mask [B, T] bool, or None when
    nothing changed (state_pins without the whole unpatched [B, T, *S] at once)."""
    changed = torch.zeros(after.shape[:2], dtype=torch.bool, device=after.device)
    for lo, before in before_blocks:
        hi = lo + before.shape[1]
        if after.shape[0] != before.shape[0] or after.shape[2:] != before.shape[2:] or hi > after.shape[1]:
            raise ValueError(f"a hook_state patch must keep the shape {(before.shape[0], None, *before.shape[2:])} "
                             f"of the states; got {tuple(after.shape)}")
        changed[:, lo:hi] = _differs(after[:, lo:hi], before, n_state_dims)
    return changed if bool(changed.any()) else None


def _differs(after: torch.Tensor, before: torch.Tensor, n_state_dims: int) -> torch.Tensor:
    """[B, t] bool: where after and before [B, t, *S] differ (NaN differs from itself). Large
    states one (example, step) at a time with torch.equal, which forms no [B, t, *S] bool
    tensor: 2x faster on Mamba-2's 786 kB states."""
    if not n_state_dims or after[0, 0].numel() * after.element_size() < 1 << 16:
        return (after != before).flatten(2).any(-1) if n_state_dims else after != before
    rows, steps = before.shape[:2]
    return torch.tensor([[not torch.equal(after[b, t], before[b, t]) for t in range(steps)] for b in range(rows)],
                        dtype=torch.bool, device=after.device).reshape(rows, steps)


def scan_with_state_hook(
    hook: HookPoint,
    run_scan: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    n_state_dims: int,
    step_at: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run an instrumented scan through `hook_state` with causal state patches.

    run_scan(pins, shift) -> (outputs, states [B, T, *S]) must honour pins with `step_pins` (or
    the kernels' equivalent) and add shift [B, T, *S] (None: none) to the state after each step
    before the pin applies: h_t = pin_t or step(h_{t-1}) + shift_t. The scan runs once; if a
    patch changed any state it runs again with those states pinned, so the change propagates to
    every later step; where it changed some row at several steps the pins are found in step
    order (causal_pins, with step_at where the mixer gives it). Readers see final states.

    Gradients (the module docstring): under grad mode, a hook that returned a new tensor makes
    the re-run take `patched - states` (zero where nothing changed) as shift at its unpinned
    steps, so d / d patched is the total derivative there (the hook's own dependence on its
    input cancels the minus); a gradient probe (run_with_cache(incl_bwd=True)) adds a zero leaf
    shift. Without patches the first scan then runs without a graph and only the probed one has one.
    """
    probing = bool(hook._probes) and torch.is_grad_enabled()
    torch_patches = bool(hook._forward_hooks) or bool(hook._forward_pre_hooks)
    with torch.no_grad() if probing and not torch_patches else contextlib.nullcontext():
        outputs, states = run_scan(None, None)
    pins = shift = None
    settled = False  # whether (outputs, states) already are the pinned run's
    if hook.has_patches:
        found = hook_pass(hook, states, n_state_dims)
        pins = None if found.changed is None else (found.changed, found.patched)
        if pins is not None and several_steps(found.changed):
            del outputs
            pins, (outputs, states), found = causal_pins(hook, lambda p: run_scan(p, None), found, n_state_dims, step_at)
            settled = True
        patched = found.patched
        if torch.is_grad_enabled() and patched.requires_grad and (found.new_tensor or _forced_instrumented()):
            shift = patched - states
            fixed = found.changed if pins is None else (pins[0] if found.changed is None else pins[0] | found.changed)
            if fixed is not None:  # zero where pinned (or changed at a step the causal pins settled)
                shift = torch.where(_expand(fixed, shift), torch.zeros_like(shift), shift)
    if probing:
        probe = state_probe(hook, states.shape, states)
        shift = probe if shift is None else shift + probe
    if shift is not None or (pins is not None and not settled):
        del outputs, states  # the unpatched run's; freed before the re-run forms its own
        outputs, states = run_scan(pins, shift)
    hook.emit(states)
    return outputs, states


class HookPass(NamedTuple):
    """One call of a hook_state's hook functions on a run's states [B, T, *S]."""

    patched: torch.Tensor  # what they returned [B, T, *S]
    new_tensor: bool  # whether that is a new tensor (not the copy of the states they were handed)
    changed: torch.Tensor | None  # [B, T] bool: where it differs from the states; None: nowhere


def hook_pass(hook: HookPoint, states: torch.Tensor, n_state_dims: int) -> HookPass:
    """The hook functions of hook on a copy of states [B, T, *S] (readers deferred)."""
    given = states.clone()
    patched = hook(given, defer_readers=True)
    found = state_pins(states, patched, n_state_dims)
    return HookPass(patched, patched is not given, None if found is None else found[0])


def several_steps(changed: torch.Tensor) -> bool:
    """Whether the mask changed [B, T] marks some row at more than one step."""
    return bool((changed.sum(1) > 1).any())


def causal_pins(hook: HookPoint, rescan: Callable, found: HookPass, n_state_dims: int,
                step_at: Callable | None = None):
    """The pins (mask [B, T], values [B, T, *S]) of hook functions that changed some row at
    several steps, in step order: a later change applies to the state as the earlier ones left
    it (the causal reading, as StatePlan and generate apply patches). Returns (pins, the last
    re-run's (outputs, states), the last HookPass); rescan(pins) -> (outputs, states [B, T, *S]).

    With step_at(states, rows, times) -> [U, *S] (one step of the recurrence to each (row,
    time) from the state before it in states [B, T, *S]), in rounds: pin every changed step to
    the hooks' value, re-run, and call the hooks on the re-run states with each pinned step
    holding what the step before gives there (the state they would see had it not been
    pinned); settled when they give back the pinned values and change nothing else. Hooks that
    set states settle in one round; a change relative to what a hook sees settles a step a
    round (a row's j-th pinned step is exact after j rounds). Without step_at, one step a round:
    each row's first changed step after those settled (`in_step_order`)."""
    if step_at is None:
        return in_step_order(hook, rescan, found, n_state_dims)
    pinned, values = found.changed, found.patched  # [B, T], [B, T, *S]
    for round_ in range(pinned.shape[1] + 1):  # at most one round per step and a last to confirm
        if round_ == MANY_ROUNDS:
            warn_many_rounds(hook)
        scanned = rescan((pinned, values))
        rows, times = pinned.nonzero(as_tuple=True)
        seen = scanned[1].clone()
        seen[rows, times] = step_at(scanned[1], rows, times).to(seen.dtype)
        found = hook_pass(hook, seen, n_state_dims)
        changed = torch.zeros_like(pinned) if found.changed is None else found.changed
        if not bool((changed & ~pinned).any()) and same_values(found.patched[rows, times], values[rows, times]):
            return (pinned, values), scanned, found
        pinned = pinned | changed  # a new tensor: the last re-run's graph holds the old one
        values = torch.where(_expand(pinned, values), found.patched.to(values.dtype), values)
    raise RuntimeError(f"the hook functions on {hook.name!r} did not settle: each step's change must depend on "
                       "the states up to that step only")


MANY_ROUNDS = 32   # re-runs of one call past which the cost is said (once per call)


def warn_many_rounds(hook: HookPoint) -> None:
    """Say once that a relative hook function is being settled a step a re-run, and the fast way."""
    warnings.warn(f"the hook functions on {hook.name!r} change the state relative to what they see at more than "
                  f"{MANY_ROUNDS} steps of a row: applied causally (each step on the state the earlier changes left) "
                  "that is one re-run of the layer per step, O(T^2) (benchmarks/hook_rounds.py: 14 s at T 256 for a "
                  "2-layer Mamba); StatePatch(rows, times, fn=...) applies the same change inside the scan in one "
                  "pass (docs/generation.md)", stacklevel=3)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b hold the same values, NaN where the other has NaN (a hook writing NaN
    under allow_nonfinite settles)."""
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def in_step_order(hook: HookPoint, rescan: Callable, found: HookPass, n_state_dims: int):
    """causal_pins one step a round: each row's first changed step is pinned, the recurrence
    re-run and the hooks called again on the re-run states; each row's first changed step after
    its last pinned one is pinned next, and so on until the hooks change nothing after the
    pinned steps: one more scan and hook call per further step."""
    changed, patched = found.changed, found.patched
    steps = torch.arange(changed.shape[1], device=changed.device)
    pinned = torch.zeros_like(changed)  # [B, T]
    values = torch.zeros_like(patched)  # [B, T, *S], valid where pinned
    settled = torch.full(changed.shape[:1], -1, dtype=torch.long, device=changed.device)  # each row's last pin
    for round_ in itertools.count():
        if round_ == MANY_ROUNDS:
            warn_many_rounds(hook)
        later = changed & (steps[None] > settled[:, None])  # [B, T]
        if not bool(later.any()):
            return (pinned, values), scanned, found
        first = later & (later.cumsum(1) == 1)  # each row's first such step
        pinned = pinned | first  # a new tensor: the last re-run's graph holds the old one
        values = torch.where(_expand(first, values), patched.to(values.dtype), values)
        settled = torch.where(first.any(1), first.int().argmax(1), settled)
        scanned = rescan((pinned, values))
        found = hook_pass(hook, scanned[1], n_state_dims)
        changed = torch.zeros_like(pinned) if found.changed is None else found.changed
        patched = found.patched


def only_probed(hook: HookPoint) -> bool:
    """Whether hook_state is probed for a gradient (run_with_cache(incl_bwd=True), grad mode on)
    and nothing may patch it: a mixer may then serve the probe from a kernel that takes the zero
    shift itself (state_probe) and returns the states beside the output, instead of
    scan_with_state_hook's two scans."""
    return bool(hook._probes) and torch.is_grad_enabled() and not hook.has_patches


def state_probe(hook: HookPoint, shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """A zero leaf shift of the states' shape [B, T, *S] and like's dtype and device (requires
    grad), handed to every gradient probe of hook: its gradient is d metric / d h_t (the module
    docstring)."""
    probe = torch.zeros(tuple(shape), dtype=like.dtype, device=like.device, requires_grad=True)
    for found in hook._probes:
        found.append(probe)
    return probe


def _expand(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """mask [B, T] -> [B, T, 1, ...] broadcasting against like [B, T, *S]."""
    return mask.reshape(*mask.shape, *([1] * (like.dim() - mask.dim())))


def add_shift(state: torch.Tensor, shift: list[torch.Tensor] | None, t: int) -> torch.Tensor:
    """state [B, *S] + shift[t] (shift: per-step tensors from `step_shifts`, or None)."""
    return state if shift is None else state + shift[t].to(state.dtype)


def step_shifts(shift: torch.Tensor | None) -> list[torch.Tensor] | None:
    """shift [B, T, *S] or None -> T tensors [B, *S] (unbind, whose backward is one stack)."""
    return None if shift is None else list(shift.unbind(1))
