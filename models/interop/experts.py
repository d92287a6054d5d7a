"""transformers' sparse MoE experts (a router weight and experts stored as 3-D tensors, as in
Qwen3-Next / Qwen3.5-MoE / Jamba) -> models.moe.MoE's router and experts."""

from __future__ import annotations

from models.interop.convert import SourceWeights
from models.interop.llama import swiglu_weights


def experts_weights(weights: SourceWeights, router: str, experts: str, ours: str) -> dict:
    """router [E, D] -> ours.router.weight; experts.gate_up_proj [E, 2F, D] (the gate's F rows
    first) -> ours.experts.gate, ours.experts.up [E, F, D]; experts.down_proj [E, D, F] ->
    ours.experts.down."""
    gate, up = weights.take(f"{experts}.gate_up_proj").chunk(2, dim=1)
    return {f"{ours}.router.weight": weights.take(router), f"{ours}.experts.gate": gate, f"{ours}.experts.up": up,
            f"{ours}.experts.down": weights.take(f"{experts}.down_proj")}


def mlp_weights(weights: SourceWeights, theirs: str, ours: str, sparse: bool, router: str = "gate.weight") -> dict:
    """A layer's MLP under `theirs`: the sparse block's router (theirs.router) and experts
    (theirs.experts) when sparse, else a SwiGLU without biases (gate/up/down_proj)."""
    if sparse:
        return experts_weights(weights, f"{theirs}.{router}", f"{theirs}.experts", ours)
    return swiglu_weights(weights, theirs, ours, bias=False)
