"""Instrumented sequence kernels.

short_conv(x [B,T,C], weight [C,W], bias [C] | None, initial_state [B,C,W-1] | None = None,
           output_final_state=False, impl="auto") -> y [B,T,C] (or (y, final_state [B,C,W-1]))
    causal depthwise convolution with a carried state (models/kernels/short_conv.py).
"""

from models.kernels.short_conv import short_conv

__all__ = ["short_conv"]
