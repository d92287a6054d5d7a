"""What the short-convolution mixers without another state (lfm2_conv, rwkv7_ffn) share: the
convolution's window is their recurrent state.

C channels, W taps; from the conv inputs v_t [C] (prepare's "v"):

    h_t = (v_{t-W+1}, ..., v_{t-1}, v_t)        [C, W]  the window, oldest first (v_s = 0, s < 0)
        = shift(h_{t-1}) with v_t appended      (h_{-1} = 0)
    y_t = sum_k w[:, k] h_t[:, k] (+ bias)      [C]     the causal depthwise conv (w[:, -1] meets v_t)
    o_t = output(y_t, inputs_t)                 [D]     the subclass's read-out of the conv output

hook_state [B, T, C, W] is h_t: a patch at step t replaces the conv inputs that the outputs at
t, ..., t + W - 1 read (the window forgets after W - 1 steps); nothing before t changes.
hook_conv [B, T, C] is y_t. Decoding (models.decoding) carries h as the recurrent state.

A subclass sets `width`, `state_shape = (C, W)` and hook_conv, and defines prepare(x) ->
{"v": [B, T, C], ...}, conv_params() -> (weight [C, W], bias [C] | None) and output(y, inputs).
Paths: fast = models.kernels.short_conv over v (no window formed); instrumented = every window
[B, T, C, W] (one unfold; the step loop where states are pinned or shifted), y read out from them.
Both sum the taps in the same order (short_conv's "naive" tap loop), so without patches they
agree bit for bit.
"""

from __future__ import annotations

import torch

from models.kernels import short_conv
from models.mixers.base import RecurrentMixer


class ConvWindowMixer(RecurrentMixer):
    width = 1
    # hook_conv is formed where the output is read out, once per segment on the segment paths
    whole_sequence_hooks = RecurrentMixer.whole_sequence_hooks + ("hook_conv",)

    def conv_params(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError

    def output(self, y: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:  # y [B, T, C] -> [B, T, D]
        raise NotImplementedError

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:  # h [B, C, W]
        return torch.cat([h[..., 1:], inputs_t["v"][..., None].to(h.dtype)], dim=-1)

    def padded(self, v: torch.Tensor, initial: torch.Tensor | None) -> torch.Tensor:
        """The conv inputs v [B, T, C] after the window `initial` [B, C, W] (zeros when None) ->
        [B, C, W + T]."""
        if initial is None:
            initial = v.new_zeros(v.shape[0], v.shape[2], self.width)
        return torch.cat([initial.to(v.dtype), v.transpose(1, 2)], dim=2)

    def scan(self, inputs, pins=None, initial=None, shift=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(states, states) [B, T, C, W]: every window at once, or the step loop with pins / a shift."""
        if pins is not None or shift is not None:
            return super().scan(inputs, pins, initial, shift)
        windows = self.padded(inputs["v"], initial)[..., 1:].unfold(2, self.width, 1)  # [B, C, T, W] (a view)
        states = windows.permute(0, 2, 1, 3).contiguous()  # own memory: hooks may write into it
        return states, states

    def readout(self, x: torch.Tensor, states: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        weight, bias = self.conv_params()
        weight = weight.to(states.dtype)
        y = sum(states[..., k] * weight[:, k] for k in range(self.width))  # [B, T, C], short_conv_naive's order
        return self.output(y if bias is None else y + bias, inputs)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fast_from(x, self.prepare(x))

    def fast_from(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None) -> torch.Tensor:
        window = None if initial is None else initial[..., 1:]
        return self.output(short_conv(inputs["v"], *self.conv_params(), window, impl="naive"), inputs)

    def fast_segment(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None):
        """fast_from and the window after the last step [B, C, W]; one step (decoding) from the
        window itself, its taps summed in short_conv_naive's order."""
        final = self.padded(inputs["v"], initial)[..., -self.width:].contiguous()
        if inputs["v"].shape[1] > 1:
            return self.fast_from(x, inputs, initial), final
        weight, bias = self.conv_params()
        y = sum(weight[:, k] * final[..., k] for k in range(self.width))  # [B, C]
        return self.output((y if bias is None else y + bias)[:, None], inputs), final
