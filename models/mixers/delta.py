"""What the delta-rule mixers (deltanet, gated_deltanet) share: the kernel on both paths, the
read-out o_t = S_t q_t and the output head.

    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T    S_t [H, V (values), K (keys)]
    o_t = S_t q_t                                                      [H, V]
    y_t = W_out concat_h( RMSNorm(o_t,h) [* gate_t,h] )                (alpha = 1 without a decay)

A subclass defines prepare(x) -> {q, k, v, beta [, g: log alpha] [, gate]} ([B, T, H, .]),
`kernel(inputs, initial, **kwargs)` (models.kernels.delta_rule with its options), `o_norm`,
`output_projection()` (W_out, an nn.Linear) and the hook points hook_z / hook_result:
  hook_z      [B, T, H, V]        each head's RMSNorm(o_t) [* gate], what W_out reads
  hook_result [B, T, H, d_model]  each head's share of the output (sum over heads = hook_out)
Paths: fast = the kernel returning outputs only; instrumented = the same kernel with every step's
state exported and hook_state pins honoured (a shift, scan_with_state_hook's gradient contract,
through the same kernel: shifted_delta_inputs); declared state patches (models.StatePatch) run
the fast kernel up to each patched step, its final state replaced, and on from there.
"""

from __future__ import annotations

import torch
from torch import nn

from models.hooks.state import scan_with_state_hook
from models.kernels import diag_scan
from models.mixers.base import RecurrentMixer, head_outputs


class DeltaRuleMixer(RecurrentMixer):
    is_affine = True

    def kernel(self, inputs: dict[str, torch.Tensor], initial=None, **kwargs):
        """models.kernels.delta_rule on the prepared inputs (a DeltaRuleResult)."""
        raise NotImplementedError

    def output_projection(self) -> nn.Linear:
        raise NotImplementedError

    def scan(self, inputs, pins=None, initial=None, shift=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(o [B, T, H, V], states [B, T, H, V, K]) from the kernel, every state exported, pins
        honoured; a shift [B, T, H, V, K] runs through the same kernel (shifted_delta_inputs)."""
        if shift is None:
            result = self.kernel(inputs, initial, export_at="all", pins=pins)
            return result.output, result.states_at
        v, pins, total = shifted_delta_inputs(shift, inputs["k"], inputs["v"], pins, inputs.get("g"))
        result = self.kernel({**inputs, "v": v}, initial, export_at="all", pins=pins)
        return shifted_delta_outputs(result.output, result.states_at, total, inputs["q"])

    def instrumented_forward(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None) -> torch.Tensor:
        o, _ = scan_with_state_hook(self.hook_state, lambda pins, shift: self.scan(inputs, pins, initial, shift), 3,
                                    self.steps_at(inputs, initial), self.scans_from(inputs, initial))
        return self.output(o, inputs)

    def scanned_output(self, x, scanned, inputs) -> torch.Tensor:
        return self.output(scanned[0], inputs)  # the kernel's o [B, T, H, V], as instrumented_forward

    def readout(self, x, states, inputs) -> torch.Tensor:
        o = torch.einsum("bthvk,bthk->bthv", states, inputs["q"].to(states.dtype))
        return self.output(o.to(x.dtype), inputs)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fast_from(x, self.prepare(x))

    def fast_from(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None) -> torch.Tensor:
        return self.output(self.kernel(inputs, initial).output, inputs)  # o [B, T, H, V]

    def fast_segment(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None):
        """fast_from and the final state [B, H, V, K] (declared state patches)."""
        result = self.kernel(inputs, initial, output_final_state=True)
        return self.output(result.output, inputs), result.final_state

    def output(self, o: torch.Tensor, inputs) -> torch.Tensor:  # o [B, T, H, V] -> [B, T, D]
        o = self.o_norm(o)
        if "gate" in inputs:
            o = o * inputs["gate"]
        return head_outputs(o, self.output_projection(), self.hook_z, self.hook_result)


def shifted_delta_inputs(shift, k, v, pins, log_decay=None):
    """A state shift (scan_with_state_hook's contract) for the delta rule, through the kernel:
    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T + shift_t (alpha = exp(log_decay),
    1 without a decay). With P_t = alpha_t P_{t-1} + shift_t (a diagonal scan; a cumulative sum for
    alpha = 1), R_t = S_t - P_t is the plain (gated) delta rule with values v_t - alpha_t P_{t-1} k_t
    = v_t - (P_t - shift_t) k_t, and pinned R = pinned S - P. shift [B, T, H, V, K], k [B, T, H, K],
    v [B, T, H, V], log_decay [B, T, H] or channel-wise [B, T, H, K] (P_t = P_{t-1} Diag(alpha_t)
    + shift_t, the same values) -> (values, pins, P); `shifted_delta_outputs` undoes it."""
    if log_decay is None:
        total = shift.cumsum(1)  # P [B, T, H, V, K]
    else:
        alpha = torch.exp(log_decay).to(shift.dtype)
        alpha = (alpha[..., None, :] if log_decay.dim() == 4 else alpha[..., None, None]).expand_as(shift)
        total = diag_scan(alpha, shift).output
    v = v - torch.einsum("bthvk,bthk->bthv", total - shift, k.to(total.dtype)).to(v.dtype)
    return v, pins if pins is None else (pins[0], pins[1] - total), total


def shifted_delta_outputs(o, states, total, q):
    """(o + P_t q_t, R + P): the outputs [B, T, H, V] and states [B, T, H, V, K] of the shifted
    delta rule from the plain one's (see shifted_delta_inputs)."""
    return o + torch.einsum("bthvk,bthk->bthv", total, q.to(total.dtype)).to(o.dtype), states + total
