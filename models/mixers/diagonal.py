"""DiagonalScanMixer: the scan plumbing of the selective diagonal mixers (models.mixers.mamba and
its variants, models.mixers.mamba2). They differ in their inputs and read-out and scan alike:

    h_t = a_t * h_{t-1} + b_t       (a, b) = transition_terms(inputs), each [B, T, *S]
    y_t = the read-out of h_t by C_t (readout_c: diag_scan's c), out = finish(y, inputs) [B, T, D]

No mixer is registered here (each mixer has its own file, its recurrence in its docstring). A
subclass defines transition_terms, readout_c, finish and readout, and where fused C kernels form
a and b in their loop (so nothing [B, T, *S] is built on the fast path):

    native_scan(inputs, initial, final)   -> (y, h_{T-1} or None), or None where it does not run
    native_states(inputs, pins, initial)  -> every state [B, T, *S], or None where it does not run
    native_states_supported(inputs, initial): whether native_states runs without pins
    native_shifted(inputs, shift, initial) -> (y [B, T, *lead], every state [B, T, *S]) of
        h_t = a_t h_{t-1} + b_t + shift_t, differentiable in shift (its gradient: the states'
        adjoint, from the kernel's backward), or None where it does not run
    native_shifted_supported(inputs, initial): whether native_shifted runs

Paths: fast (fast_scan: native_scan, else diag_scan with the read-out fused), instrumented (every
state through hook_state: native_states, else diag_scan over a and b formed once for the first
scan and the pinned re-run, models.hooks.state.scan_with_state_hook) and declared state patches
(fast_segment: fast_scan with the final state, RecurrentMixer.declared_forward). A gradient
probe of hook_state with nothing patching it (run_with_cache(incl_bwd=True)) runs native_shifted
once with the probe as its shift, read-out fused (no [B, T, *S] autograd graph in torch); a
shift without pins (a hook's `state + delta`) runs it too, its states read out in torch.
"""

from __future__ import annotations

import torch

from models.hooks.state import only_probed, scan_with_state_hook, state_probe
from models.kernels import diag_scan
from models.mixers.base import RecurrentMixer


class DiagonalScanMixer(RecurrentMixer):
    is_affine = True
    chunk_size = 64
    unpatched_block_bytes = 1 << 24  # unpatched_blocks' block size

    def transition_terms(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, b) of h_t = a_t * h_{t-1} + b_t, both [B, (T,) *S], from [B, (T,) ...] inputs."""
        raise NotImplementedError

    def readout_c(self, inputs: dict[str, torch.Tensor], b: torch.Tensor) -> torch.Tensor:
        """diag_scan's read-out c for these inputs: [B, T, N] (shared by the lead dims) or b's shape."""
        raise NotImplementedError

    def finish(self, y: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The read-out y [B, T, *lead] -> the mixer output [B, T, d_model]."""
        raise NotImplementedError

    def native_scan(self, inputs, initial=None, final: bool = False):
        return None

    def native_states(self, inputs, pins=None, initial=None) -> torch.Tensor | None:
        return None

    def native_states_supported(self, inputs, initial=None) -> bool:
        return False

    def transition(self, inputs_t: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.transition_terms(inputs_t)[0]  # [B, *S]

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        a, b = self.transition_terms(inputs_t)
        return a * h + b  # [B, *S]

    def native_shifted(self, inputs, shift, initial=None):
        return None

    def native_shifted_supported(self, inputs, initial=None) -> bool:
        return False

    def scan(self, inputs, pins=None, initial=None, shift=None):
        """The states [B, T, *S] (twice: the scan contract): the pins' values where every state is
        pinned, native_states where it runs and there is no shift, native_shifted where there is
        a shift and no pins, else scan_terms over transition_terms."""
        if shift is None and pins is not None and bool(pins[0].all()):  # every state pinned: the pins' values
            return pins[1], pins[1]  # (hook_state pins hold the states' dtype: hook functions must keep it)
        if shift is None:
            states = self.native_states(inputs, pins, initial)
        else:
            states = None if pins is not None else self.native_shifted(inputs, shift, initial)
            states = None if states is None else states[1]
        if states is not None:
            return states, states
        return self.scan_terms(*self.transition_terms(inputs), pins, initial, shift)

    def scan_terms(self, a, b, pins=None, initial=None, shift=None):
        """The states [B, T, *S] of h_t = a_t h_{t-1} + b_t (+ shift_t) (twice: the scan contract)."""
        b = b if shift is None else b + shift
        states = diag_scan(a, b, pins=pins, initial_state=initial, chunk_size=self.chunk_size).output
        return states, states

    def instrumented_forward(self, u, inputs, initial=None) -> torch.Tensor:
        """Both scans of a state patch (the first and the pinned re-run) through scan when the
        first runs natively (a re-run with pins while a gradient is wanted then forms a and b in
        torch), else a and b formed once for both. A gradient probe with nothing patching
        hook_state runs native_shifted once with the probe as shift (the module docstring)."""
        if only_probed(self.hook_state) and self.native_shifted_supported(inputs, initial):
            dt = inputs["dt"]  # [B, T, ...]: the states' batch, length and dtype
            probe = state_probe(self.hook_state, (*dt.shape[:2], *self.state_shape), dt)
            y, states = self.native_shifted(inputs, probe, initial)
            self.hook_state.emit(states)
            return self.finish(y, inputs)
        if self.native_states_supported(inputs, initial):
            run = lambda pins, shift: self.scan(inputs, pins, initial, shift)  # noqa: E731
        else:
            a, b = self.transition_terms(inputs)  # [B, T, *S] each
            run = lambda pins, shift: self.scan_terms(a, b, pins, initial, shift)  # noqa: E731
        _, states = scan_with_state_hook(self.hook_state, run, len(self.state_shape), self.steps_at(inputs, initial),
                                         self.scans_from(inputs, initial))
        return self.readout(u, states, inputs)

    def scans_from(self, inputs, initial=None, **pins):
        """RecurrentMixer.scans_from with a window of one step a_t h + b_t, a and b formed once
        for every step (transition_terms, then unbind) where the first such window asks: the
        same arithmetic as step(), a few vectorised ops instead of a few per step."""
        windows, terms = super().scans_from(inputs, initial, **pins), []

        def scan_from(lo: int, hi: int, h):
            if hi - lo != 1 or h is None:
                return windows(lo, hi, h)
            if not terms:
                terms.extend(zip(*(term.unbind(1) for term in self.transition_terms(inputs))))
            a, b = terms[lo]
            return (a * h + b)[:, None]
        return scan_from

    def unpatched_blocks(self, inputs, initial, states):
        """RecurrentMixer.unpatched_blocks recomputed where native_states runs (it resumes bit for
        bit from a block's last state): blocks of about unpatched_block_bytes, no [B, T, *S] copy."""
        if not self.native_states_supported(inputs, initial):
            return super().unpatched_blocks(inputs, initial, states)
        length, step_bytes = states.shape[1], states[:, :1].numel() * states.element_size()
        span = max(1, self.unpatched_block_bytes // step_bytes)

        def blocks():
            h = initial
            for lo in range(0, length, span):
                block = self.native_states({k: v[:, lo:lo + span] for k, v in inputs.items()}, None, h)
                yield lo, block
                h = block[:, -1]

        return blocks

    def fast_scan(self, inputs, initial=None, final: bool = False):
        """(y [B, T, *lead], h_{T-1} [B, *S] when final else None), no per-step states: native_scan,
        else diag_scan over transition_terms with the read-out fused."""
        native = self.native_scan(inputs, initial, final)
        if native is not None:
            return native
        a, b = self.transition_terms(inputs)
        out = diag_scan(a, b, self.readout_c(inputs, b), initial_state=initial, output_final_state=final,
                        chunk_size=self.chunk_size)
        return out.output, out.final_state

    def fast_forward(self, u: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        return self.fast_from(u, self.prepare(u))

    def fast_from(self, u, inputs, initial=None) -> torch.Tensor:
        return self.finish(self.fast_scan(inputs, initial)[0], inputs)

    def fast_segment(self, u, inputs, initial=None):
        y, final = self.fast_scan(inputs, initial, final=True)
        return self.finish(y, inputs), final
