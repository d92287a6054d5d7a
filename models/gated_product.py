"""act(gate) * up, the gated MLP's neurons (SwiGLU: act SiLU; GeGLU: act erf GELU), keeping only
gate and up for the backward.

    gated_product(gate, up, activation) -> act(gate) * up     gate, up [..., F]

Autograd's own graph of `F.silu(gate) * up` keeps four [..., F] tensors per MLP for the backward:
gate (SiLU's input), silu(gate) and up (the product's factors) and the product (the down
projection's input). This function keeps gate and up and forms act(gate) again in the backward
(one elementwise pass), so a Llama's forward+backward holds one [B, T, F] tensor less per layer:
about a quarter of its MLP activations. The forward's value is bit-identical to the plain
expression; the backward uses the same derivative formulas as torch's SiLU / GELU backward and is
itself differentiable (higher derivatives are exact).

Used only while autograd records (torch.is_grad_enabled()); otherwise the plain expression runs.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

ACTIVATIONS = ("swiglu", "geglu")


def _act(gate: torch.Tensor, activation: str) -> torch.Tensor:
    return F.silu(gate) if activation == "swiglu" else F.gelu(gate)


def _product(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate) * up, the product formed in act(gate)'s own fresh buffer: three [..., F] tensors
    alive at its peak (gate, up, the result), as in `act(gate(x)) * up(x)` evaluated left to right."""
    return _act(gate, activation).mul_(up)


def _act_and_slope(gate: torch.Tensor, activation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """act(gate) and act'(gate), the formulas of torch's silu_backward / gelu_backward (erf)."""
    if activation == "swiglu":
        sigmoid = torch.sigmoid(gate)
        return gate * sigmoid, sigmoid * (1 + gate * (1 - sigmoid))
    cdf = 0.5 * (1 + torch.erf(gate * math.sqrt(0.5)))
    pdf = torch.exp(-0.5 * gate * gate) * (0.5 * math.sqrt(0.5) * 2 / math.sqrt(math.pi))
    return gate * cdf, cdf + gate * pdf


class _GatedProduct(torch.autograd.Function):
    @staticmethod
    def forward(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
        return _product(gate, up, activation)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        gate, up, activation = inputs
        ctx.save_for_backward(gate, up)
        ctx.activation = activation

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # grad [..., F]
        gate, up = ctx.saved_tensors
        activated, slope = _act_and_slope(gate, ctx.activation)
        grad_gate = grad * up * slope if ctx.needs_input_grad[0] else None
        grad_up = grad * activated if ctx.needs_input_grad[1] else None
        return grad_gate, grad_up, None


def gated_product(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate) * up [..., F] (activation "swiglu" or "geglu"); see the module docstring."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    if not torch.is_grad_enabled() or not (gate.requires_grad or up.requires_grad):
        return _product(gate, up, activation)
    return _GatedProduct.apply(gate, up, activation)
