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

Several changes on one row apply in step order, each on the state the earlier ones left, in one
pass left to right, O(T): declared patches under grad by `plan_pins` (RecurrentMixer.pinned_forward),
hook functions by `causal_pins` (one round for hooks that set states, else `in_windows`: the hooks
called on windows of steps, each scanned from the state the earlier changes left). Hooks that do
not work on a window settle in rounds, a re-run a step (`MANY_ROUNDS` warns).
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
    scan_from: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run an instrumented scan through `hook_state` with causal state patches.

    run_scan(pins, shift) -> (outputs, states [B, T, *S]) must honour pins with `step_pins` (or
    the kernels' equivalent) and add shift [B, T, *S] (None: none) to the state after each step
    before the pin applies: h_t = pin_t or step(h_{t-1}) + shift_t. The scan runs once; if a
    patch changed any state it runs again with those states pinned, so the change propagates to
    every later step; where it changed some row at several steps the pins are found in step
    order (causal_pins, with step_at and scan_from where the mixer gives them). Readers see
    final states.

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
            pins, (outputs, states), found = causal_pins(hook, lambda p: run_scan(p, None), found, n_state_dims,
                                                         step_at, scan_from)
            settled = True
        patched = found.patched
        if torch.is_grad_enabled() and patched.requires_grad and (found.new_tensor or _forced_instrumented()):
            fixed = found.changed if pins is None else (pins[0] if found.changed is None else pins[0] | found.changed)
            if fixed is None or not bool(fixed.all()):  # (a shift zero at every step: none)
                shift = patched - states
            if fixed is not None and shift is not None:  # zero where pinned (or changed at a step the pins settled)
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
                step_at: Callable | None = None, scan_from: Callable | None = None):
    """The pins (mask [B, T], values [B, T, *S]) of hook functions that changed some row at
    several steps, in step order: a later change applies to the state as the earlier ones left
    it (the causal reading, as StatePlan and generate apply patches). Returns (pins, the last
    re-run's (outputs, states), the last HookPass); rescan(pins) -> (outputs, states [B, T, *S]).

    With step_at(states, rows, times) -> [U, *S] (one step of the recurrence to each (row,
    time) from the state before it in states [B, T, *S]), first one round: pin every changed
    step to the hooks' value, re-run, and call the hooks on the re-run states with each pinned
    step holding what the step before gives there (the state they would see had it not been
    pinned); settled when they give back the pinned values and change nothing else. Hooks that
    set states settle so.

    Else, with scan_from(lo, hi, h) -> the states [B, hi - lo, *S] of steps lo, ..., hi - 1 from
    the state h [B, *S] after step lo - 1 (None: the initial state), one pass left to right
    (`in_windows`): the hooks see the run in windows, each scanned from the state the earlier
    changes left, O(T) however many steps they change; confirmed by one call on every state.

    Where neither settles (the hooks do not work on a window: they index steps of the whole
    call, or read earlier steps than their window holds) the rounds go on, a step a round at
    least (a row's j-th pinned step is exact after j rounds: O(T^2) for a change at every step);
    without step_at each row's first changed step after those settled (`in_step_order`)."""
    pinned, values = found.changed, found.patched  # [B, T], [B, T, *S]
    if step_at is not None:
        settled, advance = settle_round(hook, rescan, pinned, values, n_state_dims, step_at)
        if settled is not None:
            return settled
    if scan_from is not None:
        settled = in_windows(hook, rescan, scan_from, found.changed, n_state_dims)
        if settled is not None:
            return settled
    if step_at is None:
        return in_step_order(hook, rescan, found, n_state_dims)
    for round_ in range(1, pinned.shape[1] + 1):  # at most one round per step and a last to confirm
        if round_ == MANY_ROUNDS:
            warn_many_rounds(hook)
        settled, advance = settle_round(hook, rescan, *advance(), n_state_dims, step_at)
        if settled is not None:
            return settled
    raise RuntimeError(f"the hook functions on {hook.name!r} did not settle: each step's change must depend on "
                       "the states up to that step only")


def settle_round(hook: HookPoint, rescan: Callable, pinned: torch.Tensor, values: torch.Tensor, n_state_dims: int,
                 step_at: Callable):
    """One round of causal_pins with step_at from pins (pinned [B, T], values [B, T, *S]):
    (causal_pins' result, None) when the hooks gave back the pinned values where pinned and
    changed nothing else, else (None, a function giving the next round's pinned, values: the
    steps they changed pinned too, to what they gave)."""
    scanned = rescan((pinned, values))
    rows, times = pinned.nonzero(as_tuple=True)
    stepped = step_at(scanned[1], rows, times).to(scanned[1].dtype)  # [U, *S]
    if len(rows) == pinned.numel():  # every step pinned (rows, times in row-major order)
        seen = stepped.reshape(scanned[1].shape)
    else:
        seen = scanned[1].clone()
        seen[rows, times] = stepped
    given = seen.clone()
    patched = hook(given, defer_readers=True)
    if gives_back(patched, seen, pinned, values):
        return ((pinned, values), scanned, HookPass(patched, patched is not given, pinned)), None

    def advance() -> tuple[torch.Tensor, torch.Tensor]:
        found = state_pins(seen, patched, n_state_dims)
        now = pinned if found is None else pinned | found[0]  # a new tensor: the re-run's graph holds the old one
        return now, torch.where(_expand(now, values), patched.to(values.dtype), values)
    return None, advance


def in_windows(hook: HookPoint, rescan: Callable, scan_from: Callable, changed: torch.Tensor, n_state_dims: int):
    """causal_pins in one pass left to right, or None where the hooks do not settle so.

    The steps where the hooks changed the unpatched states (changed [B, T]) end windows: each
    window is scanned from the state the earlier changes left (scan_from), and the hooks are
    called on it alone, as a decoding call sees its steps (`hook.position`: its first step,
    counted as the call's; `hook.window`: (that step on the call's time axis, the call's
    length), read by StatePatch); the first step of the window where they change some row is
    pinned there (the rows they changed, to their value), and the next window starts after it.
    So each step's change acts on the state the earlier ones left, under autograd too: a
    window's scan starts from the pinned state's graph, O(T) in time and memory. Then one
    re-run with the pins, and the hooks are called on its states with each pinned step holding
    what they saw there (causal_pins' test): they must give back the pinned values and change
    nothing else, else None (a hook indexing steps of the whole call, or reading earlier steps
    than its window holds). An exception inside a window also gives None: causal_pins then
    goes on in rounds, where a genuine error raises again."""
    batch, length = changed.shape
    ends = changed.any(0).nonzero()[:, 0].tolist()  # [steps]: where windows end
    pins: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # step -> (rows [B], seen, value [B, *S])
    h, lo, k = None, 0, 0
    base = hook.__dict__.get("position", _UNSET)
    try:
        while lo < length:
            while k < len(ends) and ends[k] < lo:
                k += 1
            hi = ends[k] + 1 if k < len(ends) else length
            window = scan_from(lo, hi, h)  # [B, n, *S]
            hook.__dict__["position"] = (0 if base is _UNSET else base) + lo
            hook.__dict__["window"] = (lo, length)
            try:
                out = hook(window.clone(), defer_readers=True)
                differs = _differs(out, window, n_state_dims)  # [B, n]
            except Exception:  # noqa: BLE001 - not a window's hook: the rounds call it on whole runs
                return None
            if not bool(differs.any()):
                h, lo = window[:, -1], hi
                continue
            step = 0 if differs.shape[1] == 1 else int(differs.any(0).nonzero()[0])
            rows = differs[:, step]
            h = torch.where(_expand(rows, window[:, step]), out[:, step].to(window.dtype), window[:, step])
            pins[lo + step] = (rows, window[:, step], h)
            lo += step + 1
    finally:
        hook.__dict__.pop("window", None)
        if base is _UNSET:
            hook.__dict__.pop("position", None)
        else:
            hook.__dict__["position"] = base
    if not pins:
        return None
    pinned = torch.zeros_like(changed)
    for step, (rows, _, _) in pins.items():
        pinned[:, step] = rows
    values = _at_steps(pins, 2, length)
    scanned = rescan((pinned, values))
    seen = torch.where(_expand(pinned, scanned[1]), _at_steps(pins, 1, length).to(scanned[1].dtype), scanned[1])
    given = seen.clone()
    patched = hook(given, defer_readers=True)
    if not gives_back(patched, seen, pinned, values):
        return None
    return (pinned, values), scanned, HookPass(patched, patched is not given, pinned)


def gives_back(patched: torch.Tensor, seen: torch.Tensor, pinned: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether hooks that returned patched [B, T, *S] on the states seen settled the pins (pinned
    [B, T], values [B, T, *S]): the pinned values back where pinned, nothing changed elsewhere."""
    if patched.shape != seen.shape:
        return False
    if bool(pinned.all()):
        return same_values(patched, values.to(patched.dtype))
    if bool(((patched != seen).flatten(2).any(-1) & ~pinned).any()):
        return False
    rows, times = pinned.nonzero(as_tuple=True)
    return same_values(patched[rows, times], values[rows, times].to(patched.dtype))


_UNSET = object()


def plan_pins(plan: StatePlan, scan_from: Callable, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pins (mask [B, T], values [B, T, *S]) of a StatePlan over `length` steps applied
    causally in one pass left to right: the state at each patched step scanned (scan_from, as
    in_windows) from the state the earlier patches left and patched there (StatePlan.at_step),
    under autograd too: O(T) in time and memory."""
    pins: dict[int, tuple[torch.Tensor, None, torch.Tensor]] = {}  # step -> (rows [B], -, state after it [B, *S])
    h, lo = None, 0
    for step in plan.steps:
        reached = scan_from(lo, step + 1, h)[:, -1]  # [B, *S]
        rows, new = plan.at_step(step, reached)
        mask = torch.zeros(reached.shape[0], dtype=torch.bool, device=reached.device)
        mask[rows] = True
        h = reached.clone()
        h[rows] = new.to(h.dtype)
        pins[step], lo = (mask, None, h), step + 1
    return torch.stack([pins[t][0] if t in pins else torch.zeros_like(mask) for t in range(length)], 1), \
        _at_steps(pins, 2, length)


def _at_steps(pins: dict, item: int, length: int) -> torch.Tensor:
    """[B, T, *S]: pins[t][item] at each pinned step t, zeros elsewhere (one stack: its backward
    is one unbind, where writing the steps into a tensor one by one would copy it each time)."""
    some = next(iter(pins.values()))[item]
    zero = torch.zeros_like(some)
    return torch.stack([pins[t][item] if t in pins else zero for t in range(length)], dim=1)


MANY_ROUNDS = 32   # re-runs of one call past which the cost is said (once per call)


def warn_many_rounds(hook: HookPoint) -> None:
    """Say once that hook functions are being settled a step a re-run, why, and the fast ways."""
    warnings.warn(f"the hook functions on {hook.name!r} change the state relative to what they see at more than "
                  f"{MANY_ROUNDS} steps of a row and do not work on a window of the call's steps (they index steps "
                  "of the whole call, or read earlier steps): applied causally (each step on the state the earlier "
                  "changes left) that is one re-run of the layer per step, O(T^2). A hook that indexes steps by "
                  "hook.position + its own axis settles in one pass, as does StatePatch(rows, times, fn=...) "
                  "(docs/generation.md)", stacklevel=3)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b hold the same values, NaN where the other has NaN (a hook writing NaN
    under allow_nonfinite settles). torch.equal first: one pass, no [*a.shape] bool tensors."""
    return torch.equal(a, b) or bool(((a == b) | (a.isnan() & b.isnan())).all())


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
