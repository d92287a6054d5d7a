"""The Mixer base class and the mixer registry.

A mixer maps [B, T, d_model] -> [B, T, d_model] causally. Subclasses implement `mix(x)`; the base
class wraps it in `hook_in` and `hook_out`. Recurrent mixers add `hook_state` ([B, T, *state_shape],
the state after each step) and honour state patches through `models.hooks.state.scan_with_state_hook`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from models.config import ModelConfig
from models.kernels import diag_scan, short_conv
from models.kernels.native.library import fresh
from models.hooks import HookPoint, only_read, selected_heads, selected_steps
from models.hooks.state import (HookPass, StatePlan, add_shift, apply_step_pin, causal_pins, changed_steps,
                                declared_state_patches, hook_functions_only, plan_pins, scan_with_state_hook,
                                several_steps, state_pins, step_pins, step_shifts)

# mixer name -> (class, default config overrides)
MIXERS: dict[str, tuple[type["Mixer"], dict[str, Any]]] = {}
# model preset name -> (mixer name, default config overrides)
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {}


def register_mixer(name: str, presets: dict[str, dict[str, Any]] | None = None, **defaults: Any):
    """Class decorator: register a mixer under `name` (also a model preset with `defaults`).

    presets: extra model names built on this mixer, each with its own config defaults.
    """

    def decorate(cls: type[Mixer]) -> type[Mixer]:
        if name in MIXERS:
            raise ValueError(f"mixer {name!r} is registered twice")
        MIXERS[name] = (cls, defaults)
        PRESETS[name] = (name, defaults)
        for preset, preset_defaults in (presets or {}).items():
            PRESETS[preset] = (name, preset_defaults)
        cls.mixer_name = name
        return cls

    return decorate


def mixer_options(cfg: ModelConfig, defaults: dict[str, Any]) -> dict[str, Any]:
    """cfg.mixer_options merged over `defaults` (a mixer's documented options).

    Unknown keys raise a ValueError naming them and the allowed ones; a mixer without options
    (`defaults` empty) rejects any.
    """
    options = cfg.mixer_options
    if not defaults and options:
        raise ValueError(f"{cfg.mixer} takes no mixer_options; got {options!r}")
    unknown = set(options) - set(defaults)
    if unknown:
        raise ValueError(
            f"{cfg.mixer} mixer_options: unknown keys {sorted(unknown)}; allowed: {sorted(defaults)}"
        )
    return {**defaults, **options}


FLOAT32_BYTES = 4   # buffers are built in the default dtype, float32


def linear_size(d_in: int, d_out: int, bias: bool = True) -> int:
    """Parameters of nn.Linear(d_in, d_out, bias=bias)."""
    return d_in * d_out + (d_out if bias else 0)


class Mixer(nn.Module):
    """Base sequence mixer: forward(x) = hook_out(mix(hook_in(x))).

    resume(x, before, carry) continues a run from a later position (see `Mixer.resume`);
    `resume_context` says how many input positions before the resume point it reads: None (the
    default: all of them, the mixer is recomputed over the whole prefix), 0 for a recurrent mixer
    whose prepare() is per position, d_conv - 1 for one with a short convolution in prepare().
    """

    mixer_name = "<base>"
    # "auto": fast path unless a hook needs per-step values; "fast" / "instrumented" force one.
    execution_path = "auto"
    resume_context: int | None = None
    rotary_positions = False  # whether positional="rope" means something to this mixer
    # models.decoding: whether prepare() reads earlier positions only through convolve(), so a
    # decoder carries the short-conv window (conv_carry) instead of earlier mixer inputs
    carries_conv = False
    conv_carry: dict[str, torch.Tensor] | None = None  # while decoding: {key: [B, C, W - 1] conv inputs}

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer_idx = layer_idx
        self.hook_in = HookPoint()
        self.hook_out = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hook_out(self.mix(self.hook_in(x)))

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        raise NotImplementedError

    @classmethod
    def element_counts(cls, cfg: ModelConfig, layer_idx: int) -> tuple[int, int]:
        """(parameters, buffer bytes) of cls(cfg, layer_idx), from the config alone: what the size
        gate (models.size) counts before anything is built. Each registered mixer class defines
        its own beside its __init__ (tests/test_size_count.py: equal to the built mixer's)."""
        raise NotImplementedError(
            f"mixer {cls.mixer_name!r} ({cls.__name__}) defines no element_counts(cfg, layer_idx): the size gate "
            f"(models.size) counts a model's parameters from each mixer's formula, beside its __init__, without "
            f"building it; add one")

    def reads_residual(self) -> bool:
        """Whether forward(x, residual=, norm=) wants the block's residual before its norm too
        (an attention mixer's per-head input hooks); False here."""
        return False

    def resume(self, x: torch.Tensor, before: torch.Tensor, carry: torch.Tensor | None = None) -> torch.Tensor:
        """forward() at positions start, ..., start + n - 1 only -> [B, n, D].

        x [B, n, D]: the input at those positions; before [B, w, D]: the input at the w positions
        just before them (w = resume_context, fewer at the start of the sequence; every earlier
        position when resume_context is None); carry [B, *S]: a recurrent mixer's state after
        step start - 1 (None: the initial state). This default recomputes the whole prefix.
        Hook tensors inside a resumed call cover the last positions only: one with m time steps
        holds positions start + n - m, ..., start + n - 1.
        """
        return self(torch.cat([before, x], dim=1))[:, before.shape[1] :]

    def convolve(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 key: str = "conv") -> torch.Tensor:
        """short_conv(x [B, T, C], weight [C, W], bias) -> [B, T, C]; while a decoder carries this
        mixer's conv windows (conv_carry a dict, models.decoding), continued from the window under
        `key` ([B, C, W - 1], the inputs before x; zeros when absent), which is then replaced by
        the window after x."""
        if self.conv_carry is None:
            return short_conv(x, weight, bias)
        window = self.conv_carry.get(key)
        if window is not None and x.shape[1] == 1:  # one token: the taps by hand, 3x faster than conv1d
            padded = torch.cat([window.to(x.dtype), x.transpose(1, 2)], dim=2)  # [B, C, W]
            y = (padded * weight).sum(-1)
            self.conv_carry[key] = padded[:, :, 1:]
            return (y if bias is None else y + bias)[:, None]
        y, self.conv_carry[key] = short_conv(x, weight, bias, window, output_final_state=True)
        return y

    def use_instrumented(self, *hooks: HookPoint) -> bool:
        """Whether to take the per-step path: forced, or any of these hook points is in use."""
        if self.execution_path == "instrumented":
            return True
        if self.execution_path == "fast":
            return False
        return any(h.is_active for h in hooks)


class RecurrentMixer(Mixer):
    """A mixer with a recurrent state h_t = step(inputs_t, h_{t-1}), h_0 = 0.

    Subclasses define:
      state_shape        per-example state shape S (a d-vector, a matrix per head, ...)
      prepare(x)         per-step inputs: dict of [B, T, ...] tensors computed in parallel
      step(inputs_t, h)  one step: dict of [B, ...] tensors, h [B, *S] -> h_t [B, *S]
      readout(x, states, inputs)   [B, T, *S] states -> [B, T, D] output
    and may override fast_states(inputs) (fused or chunked, no hooks), fast_forward(x) (the whole
    fast path, when a fused kernel makes prepare unnecessary), scan(inputs, pins) (kernels with
    state patches) and fast_segment(x, inputs, initial) (the fast path returning its final state:
    declared state patches, models.hooks.state_patch, run on it). Affine mixers also define transition(inputs_t) -> A_t, either
    [B, *S] (diagonal: h_t = A_t * h_{t-1} + b_t) or [B, n, n] with n = prod(S) (dense), which
    `interp.analysis.dynamics` uses for closed-form Jacobians; `is_affine` says which kind a mixer is.
    """

    is_affine = False
    state_shape: tuple[int, ...] = ()
    resume_context: int | None = 0
    # hook points written after the scan that must see every position in one call: while one is
    # in use, declared state patches run as hook functions (declared_plan)
    whole_sequence_hooks: tuple[str, ...] = ("hook_z", "hook_result")

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.hook_state = HookPoint()

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def readout(self, x: torch.Tensor, states: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def transition(self, inputs_t: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError(f"{self.mixer_name} is not affine; use autograd Jacobians")

    def initial_state(self, batch: int, like: torch.Tensor) -> torch.Tensor:
        return like.new_zeros(batch, *self.state_shape)

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        plan = self.declared_plan(x)
        if plan is not None:
            return self.declared_forward(x, self.prepare(x), plan)
        segments = self.segments_allowed(x)
        steps = selected_steps(self.hook_state) if segments else None
        heads = selected_heads(self.hook_state) if segments else None
        if heads is not None:
            inputs = self.prepare(x)
            states = self.head_states(inputs, heads)  # [B, T, k, ...] or None
            if states is not None:
                self.hook_state.emit(states if steps is None else states[:, steps], positions=steps, heads=heads)
                return self.fast_from(x, inputs)
            return self.selected_forward(x, inputs, steps) if steps is not None else self.instrumented_forward(x, inputs)
        if steps is not None:
            return self.selected_forward(x, self.prepare(x), steps)
        if not self.wants_instrumented():
            return self.fast_forward(x)
        inputs = self.prepare(x)
        hooked = self.hooked_forward(x, inputs)
        return self.instrumented_forward(x, inputs) if hooked is None else hooked

    def segments_allowed(self, x: torch.Tensor) -> bool:
        """Whether this call may run in fast_segment pieces (declared patches, selected steps): the
        path is "auto", no whole_sequence_hooks is in use, and no gradient is wanted (under grad
        the per-step path runs, which differentiates through the kernels)."""
        return self.plain_path() and not (
            torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters())))

    def plain_path(self) -> bool:
        """Whether the execution path is "auto" and no whole_sequence_hooks is in use."""
        return self.execution_path == "auto" and not any(
            getattr(self, n).is_active for n in self.whole_sequence_hooks if hasattr(self, n))

    def declared_plan(self, x: torch.Tensor):
        """The StatePatches on hook_state to run declared (declared_forward) as a StatePlan for the
        input x [B, T, D], or None: segments_allowed, and they are all that uses hook_state
        (models.hooks.state.declared_state_patches)."""
        if not self.segments_allowed(x):
            return None
        return declared_state_patches(self.hook_state, *x.shape[:2])

    # a hook function that changes states at more distinct steps than this runs the pinned re-run
    # (instrumented_forward) instead of stopping the fast kernels at each of them (hooked_forward)
    max_hooked_steps = 16

    def hooked_forward(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None) -> torch.Tensor | None:
        """The output [B, T, D] with hook functions on hook_state, no gradient wanted and nothing
        else on it (models.hooks.state.hook_functions_only), or None where that does not hold (the
        instrumented path runs). The states [B, T, *S] are scanned once and handed to the hooks;
        the (example, step) pairs they changed (compared with unpatched_blocks) become a
        StatePlan that declared_forward runs on the fast kernels. Only the hooks' [B, T, *S] is
        formed, not scan_with_state_hook's copy and pinned re-run; the result is the same up to
        float rounding. Changes at more than max_hooked_steps steps take the pinned re-run.
        Under grad, StatePatches all that uses hook_state run as pinned_forward."""
        if torch.is_grad_enabled():
            plan = declared_state_patches(self.hook_state, *x.shape[:2]) if self.plain_path() else None
            return None if plan is None else self.pinned_forward(x, inputs, plan, initial)
        if not self.segments_allowed(x) or not hook_functions_only(self.hook_state):
            return None
        scanned = self.unpatched_scan(x, inputs, initial)  # (outputs, states [B, T, *S])
        states = scanned[1]
        unpatched, version = self.unpatched_blocks(inputs, initial, states), states._version
        patched = self.hook_state(states, defer_readers=True)
        if patched is not states and states._version == version:  # a new tensor, the states left alone
            unpatched = lambda: iter([(0, states)])  # noqa: E731
        mask = changed_steps(patched, unpatched(), len(self.state_shape))  # [B, T] or None
        if mask is None:
            return self.scanned_output(x, scanned, inputs)
        if several_steps(mask):  # a row changed at several steps: pinned in step order (causal_pins)
            del scanned, states
            rescan = lambda pins: self.scan(inputs, pins, initial=initial)  # noqa: E731
            _, scanned, _ = causal_pins(self.hook_state, rescan, HookPass(patched, True, mask), len(self.state_shape),
                                        self.steps_at(inputs, initial), self.scans_from(inputs, initial))
            return self.scanned_output(x, scanned, inputs)
        if int(mask.any(0).sum()) > self.max_hooked_steps:
            del scanned, states
            return self.scanned_output(x, self.scan(inputs, (mask, patched), initial=initial), inputs)
        plan = StatePlan.from_pins(mask, patched)
        del scanned, states, patched, unpatched
        return self.declared_forward(x, inputs, plan, initial)

    def pinned_forward(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], plan, initial=None) -> torch.Tensor:
        """The output [B, T, D] with the declared state patches of plan (a StatePlan) under
        autograd: their pins found in one pass left to right, each patched step scanned from the
        state the earlier patches left (models.hooks.state.plan_pins over scans_from), then one
        scan with the pins, read out. O(T) in time and memory however many steps are patched; the
        same result as the patches run as hook functions (scan_with_state_hook, causal_pins)."""
        pins = plan_pins(plan, self.scans_from(inputs, initial), x.shape[1])
        return self.scanned_output(x, self.scan(inputs, pins, initial=initial), inputs)

    def unpatched_scan(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None) -> tuple:
        """scan's (outputs, every state [B, T, *S]) without pins (hooked_forward hands the states to
        the hooks)."""
        return self.scan(inputs, initial=initial)

    def scanned_output(self, x: torch.Tensor, scanned: tuple, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The output [B, T, D] from scan's (outputs, states): the read-out of the states."""
        return self.readout(x, scanned[1], inputs)

    def unpatched_blocks(self, inputs: dict[str, torch.Tensor], initial, states: torch.Tensor):
        """A function giving the unpatched states as (first step, [B, t, *S] block) pairs, called
        after the hooks ran on `states` and returned it (changed in place, maybe): this default
        keeps a copy; a mixer whose states scan resumes bit for bit from a state recomputes them
        instead. (A hook returning a new tensor, the states' version unchanged, is compared with
        the states themselves.)"""
        copy = states.clone()
        return lambda: iter([(0, copy)])

    def head_states(self, inputs: dict[str, torch.Tensor], heads: list[int]) -> torch.Tensor | None:
        """The states of the heads / channels `heads` of the state's head axis (models.cache.plan:
        axis 2 of hook_state) only, [B, T, k, ...], from the initial state, or None where this
        mixer forms them only with all the others (run_with_cache(heads=...) then indexes the
        whole states). Override where the heads' recurrences run apart (Mamba, Mamba-2)."""
        return None

    def selected_forward(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], steps: list[int]) -> torch.Tensor:
        """The output [B, T, D] with hook_state emitted at `steps` only (ascending; the readers of
        run_with_cache(positions=...), models.hooks.selected_steps): fast_segment up to each step,
        its final state kept, so the states [B, K, *S] are formed and no [B, T, *S]."""
        pieces = list(zip([0] + [t + 1 for t in steps], [t + 1 for t in steps] + [x.shape[1]]))
        outs, finals, h = [], [], None
        for lo, hi in pieces if pieces[-1][0] < pieces[-1][1] else pieces[:-1]:
            out, h = self.fast_segment(x[:, lo:hi], {k: v[:, lo:hi] for k, v in inputs.items()}, h)
            outs.append(out)
            finals.append(h)
        self.hook_state.emit(torch.stack(finals[: len(steps)], dim=1), positions=steps)
        return torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]

    def declared_forward(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], plan, initial=None) -> torch.Tensor:
        """declared_segment's output [B, T, D]."""
        return self.declared_segment(x, inputs, plan, initial)[0]

    def declared_segment(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], plan, initial=None):
        """(output [B, T, D], state after the last step [B, *S]) with the declared state patches of
        `plan` (models.hooks.state_patch.StatePlan): fast_segment up to each patched step, the state
        replaced there where the patches change it (each acting on the state the run reached,
        after the earlier steps' patches: StatePlan.at_step; the output at that step read out
        from the replaced state), fast_segment on from it. initial [B, *S]: the state before
        step 0. readout must act per position."""
        length = x.shape[1]

        def segment(lo: int, hi: int, h):  # steps [lo, hi) from h -> (output, state after hi - 1)
            return self.fast_segment(x[:, lo:hi], {k: v[:, lo:hi] for k, v in inputs.items()}, h)

        outs, h, lo = [], initial, 0
        for step in plan.steps:
            out, h = segment(lo, step + 1, h)
            rows, new = plan.at_step(step, h)  # [k], [k, *S]
            changed = (new != h[rows]).flatten(1).any(1)
            if bool(changed.any()):
                rows, new = rows[changed], new[changed]
                h = h.clone()
                h[rows] = new
                picked = {k: v[rows, step : step + 1] for k, v in inputs.items()}
                out = out.clone()
                out[rows, -1] = self.readout(x[rows, step : step + 1], new[:, None], picked)[:, 0]
            outs.append(out)
            lo = step + 1
        if lo < length:
            out, h = segment(lo, length, h)
            outs.append(out)
        return (torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]), h

    def fast_segment(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None):
        """(output [B, T, D], state after the last step [B, *S]) without per-step hooks from
        prepared inputs and `initial` [B, *S] (None: initial_state()). This default scans every
        state; override with a kernel that keeps only the last."""
        states = self.scan(inputs, initial=initial)[1]
        return self.readout(x, states, inputs), states[:, -1]

    def wants_instrumented(self) -> bool:
        """Whether this call needs the per-step path (forced, or a per-step hook is in use)."""
        return self.use_instrumented(self.hook_state)

    def resume(self, x: torch.Tensor, before: torch.Tensor, carry: torch.Tensor | None = None) -> torch.Tensor:
        """Mixer.resume from the carried state: prepare() over the resume_context positions
        before x and x (a short conv needs them), then the scan from `carry`."""
        if self.resume_context is None:
            return super().resume(x, before, carry)
        window = self.hook_in(torch.cat([before, x], dim=1))  # [B, w + n, D]
        skip = before.shape[1]
        x, inputs = window[:, skip:], {name: value[:, skip:] for name, value in self.prepare(window).items()}
        plan = self.declared_plan(x)
        if plan is not None:
            return self.hook_out(self.declared_forward(x, inputs, plan, carry))
        if self.wants_instrumented():
            hooked = self.hooked_forward(x, inputs, carry)
            return self.hook_out(self.instrumented_forward(x, inputs, carry) if hooked is None else hooked)
        return self.hook_out(self.fast_from(x, inputs, carry))

    def fast_from(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None) -> torch.Tensor:
        """The output without per-step hooks from prepared inputs and a state `initial` [B, *S]
        before the first step (None: initial_state()) -> [B, T, D]; override with a fused kernel."""
        return self.readout(x, self.scan(inputs, initial=initial)[1], inputs)

    def instrumented_forward(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None) -> torch.Tensor:
        """The instrumented path from prepared inputs: scan through hook_state (states patched
        there are pinned and the scan re-runs from them), then read out -> [B, T, D].
        initial [B, *S]: the state before the first step (None: initial_state())."""
        _, states = scan_with_state_hook(self.hook_state, lambda pins, shift: self.scan(inputs, pins, initial, shift),
                                         len(self.state_shape), self.steps_at(inputs, initial),
                                         self.scans_from(inputs, initial))
        return self.readout(x, states, inputs)

    def steps_at(self, inputs: dict[str, torch.Tensor], initial=None) -> Callable:
        """models.hooks.state.causal_pins' step_at for prepared inputs [B, T, ...]: (states
        [B, T, *S], rows, times [U]) -> [U, *S], one step to each (row, time) from the state
        before it (initial [B, *S], None: initial_state(), before step 0)."""
        def step_at(states: torch.Tensor, rows: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
            start = self.initial_state(states.shape[0], states) if initial is None else initial
            if len(rows) == states.shape[0] * states.shape[1]:  # every (row, time), in row-major order
                before = torch.cat([start[:, None].to(states.dtype), states[:, :-1]], dim=1).flatten(0, 1)
                return self.step({name: value.flatten(0, 1) for name, value in inputs.items()}, before)
            before = states[rows, (times - 1).clamp(min=0)]  # [U, *S]
            first = (times == 0).reshape(-1, *([1] * (before.dim() - 1)))
            before = torch.where(first, start[rows].to(before.dtype), before)
            return self.step({name: value[rows, times] for name, value in inputs.items()}, before)
        return step_at

    def scans_from(self, inputs: dict[str, torch.Tensor], initial=None, **pins) -> Callable:
        """models.hooks.state.causal_pins' scan_from for prepared inputs [B, T, ...]: (lo, hi, h)
        -> the states [B, hi - lo, *S] of steps lo, ..., hi - 1 from h [B, *S], the state after
        step lo - 1 (None: initial, before step 0): one step from a given h by step(), more by
        scan (under autograd: differentiable in h). The inputs are split into steps once
        (unbind, whose backward is one stack; slicing them a window at a time would form a
        [B, T, ...] gradient per window). pins: scan's other pins by keyword ([B, T] masks and
        [B, T, ...] values, or None), cut to the same steps (scan runs then, never step())."""
        steps: list[dict[str, torch.Tensor]] = []
        plain = all(p is None for p in pins.values())

        def scan_from(lo: int, hi: int, h: torch.Tensor | None) -> torch.Tensor:
            if not steps:
                steps.extend(per_step(inputs))
            if hi - lo == 1 and h is not None and plain:
                return self.step(steps[lo], h)[:, None]
            part = {name: torch.stack([s[name] for s in steps[lo:hi]], dim=1) for name in inputs}
            cut = {k: None if p is None else (p[0][:, lo:hi], p[1][:, lo:hi]) for k, p in pins.items()}
            return self.scan(part, initial=initial if h is None else h, **cut)[1]
        return scan_from

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The whole mixer without per-step hooks; override when a fused kernel skips prepare."""
        inputs = self.prepare(x)
        return self.readout(x, self.fast_states(inputs), inputs)

    def fast_states(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.scan(inputs, None)[1]

    def scan(self, inputs: dict[str, torch.Tensor], pins=None, initial=None, shift=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reference step loop honouring pins, from `initial` [B, *S] (None: initial_state()),
        shift [B, T, *S] (None: none) added to each step's state before its pin (the contract of
        models.hooks.state.scan_with_state_hook); returns (states, states) [B, T, *S]."""
        first = next(iter(inputs.values()))
        h = self.initial_state(first.shape[0], first) if initial is None else initial
        states, shifts = [], step_shifts(shift)
        for t, (inputs_t, pin) in enumerate(zip(per_step(inputs), step_pins(pins, first.shape[1]))):
            h = apply_step_pin(add_shift(self.step(inputs_t, h), shifts, t), pin)
            states.append(h)
        states = torch.stack(states, dim=1)
        return states, states


class GatedRecurrentMixer(RecurrentMixer):
    """A RecurrentMixer whose gates depend on h_{t-1}, exposed as hook_gate [B, T, *G].

    A patch on hook_gate replaces the gates used in the recurrence: the scan re-runs with the
    patched gates pinned (like a state patch), before hook_state patches apply.

    Subclasses define (besides prepare, readout, state_shape):
      gate_dims                          len(G), the number of gate axes after [B, T]
      gate_step(inputs_t, h)             -> (gates [B, *G], aux): aux is whatever the update
                                            reuses from the gate computation (e.g. W h_{t-1})
      state_step(inputs_t, gates, aux, h) -> h_t [B, *S]
    so that step(inputs_t, h) = state_step(inputs_t, *gate_step(inputs_t, h), h), and may define
    unpinned_scan(x, inputs, initial) for the instrumented path's scan without patches.
    The fast path (fast_states) is the step loop without hooks and without collecting gates.
    """

    gate_dims = 1
    whole_sequence_hooks = RecurrentMixer.whole_sequence_hooks + ("hook_gate",)

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.hook_gate = HookPoint()

    def gate_step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    def state_step(self, inputs_t: dict[str, torch.Tensor], gates: torch.Tensor, aux: Any, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        gates, aux = self.gate_step(inputs_t, h)
        return self.state_step(inputs_t, gates, aux, h)

    def fast_states(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return RecurrentMixer.scan(self, inputs)[1]  # [B, T, *S]

    def wants_instrumented(self) -> bool:
        return self.use_instrumented(self.hook_state, self.hook_gate)

    def instrumented_forward(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None) -> torch.Tensor:
        clean = self.unpinned_scan(x, inputs, initial)
        gate_pins = self.gate_pins(inputs, initial, clean)
        gates, states = scan_with_state_hook(
            self.hook_state, lambda pins, shift: self.resumed_scan(inputs, pins, gate_pins, initial, clean, shift),
            len(self.state_shape), self.steps_at(inputs, initial) if gate_pins is None else None,  # step: unpinned gates
            self.scans_from(inputs, initial, gate_pins=gate_pins),
        )
        self.hook_gate.emit(gates)
        return self.readout(x, states, inputs)

    def fast_segment(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None):
        """RecurrentMixer.fast_segment from unpinned_scan's states where it has them (a fused
        kernel), else from the step loop."""
        clean = self.unpinned_scan(x, inputs, initial)
        if clean is None:
            return super().fast_segment(x, inputs, initial)
        return self.readout(x, clean[1], inputs), clean[1][:, -1]

    def unpatched_scan(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None) -> tuple:
        """unpinned_scan's (gates, states) where a fused kernel gives them, else the step loop's."""
        clean = self.unpinned_scan(x, inputs, initial)
        return super().unpatched_scan(x, inputs, initial) if clean is None else clean

    def unpinned_scan(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None):
        """(gates [B, T, *G], states [B, T, *S]) of the scan without pins from the mixer input x,
        computed without the step loop, or None (the loop runs). Override where a fused kernel's
        states give every gate in parallel (LSTM, GRU)."""
        return None

    def gate_pins(self, inputs: dict[str, torch.Tensor], initial=None, clean=None):
        """Where patches on hook_gate changed the gates of an unpatched scan (None if nowhere);
        clean: that scan's (gates, states) when already run."""
        if not self.hook_gate.has_patches:
            return None
        gates, _ = self.scan(inputs, initial=initial) if clean is None else clean
        return state_pins(gates, self.hook_gate(gates.clone(), defer_readers=True), self.gate_dims)

    def resumed_scan(self, inputs, pins, gate_pins, initial, clean, shift=None):
        """scan honouring pins given the unpinned scan's (gates, states) `clean` (or None): the
        steps before the first pinned one are clean's, bit for bit, and the step loop resumes
        from clean's state there. With a shift (scan_with_state_hook's gradient contract) the
        loop runs from the start."""
        if clean is None or shift is not None:
            return self.scan(inputs, pins, gate_pins, initial, shift)
        masks = [p[0].any(0) for p in (pins, gate_pins) if p is not None]  # [T] each
        if not masks:
            return clean
        first = int(torch.nonzero(torch.stack(masks).any(0))[0])
        if first == 0:
            return self.scan(inputs, pins, gate_pins, initial)
        tail = {name: value[:, first:] for name, value in inputs.items()}
        cut = lambda p: None if p is None else (p[0][:, first:], p[1][:, first:])  # noqa: E731
        gates, states = self.scan(tail, cut(pins), cut(gate_pins), initial=clean[1][:, first - 1])
        return torch.cat([clean[0][:, :first], gates], dim=1), torch.cat([clean[1][:, :first], states], dim=1)

    def scan(self, inputs, pins=None, gate_pins=None, initial=None, shift=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Step loop honouring state and gate pins, from `initial` [B, *S] (None: initial_state()),
        with shift as in RecurrentMixer.scan; returns (gates [B, T, *G], states [B, T, *S])."""
        first = next(iter(inputs.values()))
        h = self.initial_state(first.shape[0], first) if initial is None else initial
        length = first.shape[1]
        gates, states, shifts = [], [], step_shifts(shift)
        steps = zip(per_step(inputs), step_pins(pins, length), step_pins(gate_pins, length))
        for t, (inputs_t, pin, gate_pin) in enumerate(steps):
            gate, aux = self.gate_step(inputs_t, h)
            gate = apply_step_pin(gate, gate_pin)
            h = apply_step_pin(add_shift(self.state_step(inputs_t, gate, aux, h), shifts, t), pin)
            gates.append(gate)
            states.append(h)
        return torch.stack(gates, dim=1), torch.stack(states, dim=1)


def head_outputs(z: torch.Tensor, proj: nn.Linear, hook_z: HookPoint, hook_result: HookPoint) -> torch.Tensor:
    """Per-head values z [B, T, H, d] through hook_z, then proj(concat_h z_h) [B, T, D]; while
    hook_result is patched or probed for a gradient, as the sum over heads of hook_result
    [B, T, H, D] (result_h = W[:, head h's columns] z_h) plus proj's bias. While it is only read,
    hook_result is formed for the readers without autograd and the output is proj's."""
    z = hook_z(z)
    if not hook_result.is_active:
        return proj(z.flatten(2))
    heads, d = z.shape[-2:]
    weight = proj.weight.view(proj.weight.shape[0], heads, d)  # [D, H, d]
    if only_read(hook_result):
        with torch.no_grad():  # for the readers: one bmm per head into a [H, B, T, D] buffer, seen as [B, T, H, D]
            batch, length = z.shape[:2]
            per_head = z.permute(2, 0, 1, 3).reshape(heads, batch * length, d)  # [H, B T, d]
            out = fresh((heads, batch * length, weight.shape[0]), z)
            torch.bmm(per_head, weight.permute(1, 2, 0), out=out)  # [H, B T, D]
            hook_result(out.view(heads, batch, length, -1).permute(1, 2, 0, 3))
        return proj(z.flatten(2))
    result = hook_result(torch.einsum("bthd,ehd->bthe", z, weight))  # [B, T, H, D]
    out = result.sum(2)
    return out if proj.bias is None else out + proj.bias


def per_step(inputs: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Split [B, T, ...] inputs into T dicts of [B, ...] tensors, one per step.

    Uses unbind: its backward is one stack, where indexing `v[:, t]` in a loop would build a
    full-size [B, T, ...] gradient at every step (quadratic in T; 30x slower at T = 128 for
    [B, T, n, n] inputs).
    """
    names = list(inputs)
    return [dict(zip(names, values)) for values in zip(*(inputs[k].unbind(1) for k in names))]
