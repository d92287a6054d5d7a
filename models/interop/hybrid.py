"""The skeleton the hybrid converters (Jamba, Bamba, GraniteMoeHybrid, NemotronH, LFM2, Falcon-H1,
Zamba2, Qwen3-Next / Qwen3.5) share: the layer kinds read from a config field, and the state dict
of a stack built as embed, then blocks.{l} one source layer at a time (the family's own mapping),
then the final norm and the unembedding, with every source weight taken (check_all_taken)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from models.interop.convert import SourceWeights, unsupported

# (layer index, its kind, the source layer's prefix, ours "blocks.{l}") -> our weights of that block
LayerWeights = Callable[[int, Any, str, str], dict]
Transform = Callable[[torch.Tensor], torch.Tensor]


def layer_kinds(config: Any, field: str, kinds: Mapping[str, Any], allowed: str) -> list:
    """Our mixer per layer: kinds[t] for each t in config.<field> (an unknown t raises, naming `allowed`)."""
    types = list(getattr(config, field))
    if any(kind not in kinds for kind in types):
        raise unsupported(config, field, types, allowed)
    return [kinds[kind] for kind in types]


def stack_weights(weights: SourceWeights, kinds: Sequence, layer_weights: LayerWeights, *, prefix: str = "model",
                  embed: str = "embed_tokens", norm_final: str = "final_layernorm",
                  transforms: Mapping[str, Transform] | None = None) -> dict:
    """Our state dict of a stack of len(kinds) blocks: embed <- {prefix}.{embed}, blocks.{l} <-
    layer_weights(l, kinds[l], "{prefix}.layers.{l}", "blocks.{l}"), norm_final <- {prefix}.{norm_final},
    unembed <- lm_head. transforms: maps of the "embed" / "norm_final" / "unembed" tensors by our
    name (multipliers folded in). Raises UnsupportedConfig where a source weight is left over."""
    transforms = transforms or {}
    state = {"embed.weight": weights.take(f"{prefix}.{embed}.weight", transforms.get("embed"))}
    for layer, kind in enumerate(kinds):
        state |= layer_weights(layer, kind, f"{prefix}.layers.{layer}", f"blocks.{layer}")
    state["norm_final.weight"] = weights.take(f"{prefix}.{norm_final}.weight", transforms.get("norm_final"))
    state["unembed.weight"] = weights.take("lm_head.weight", transforms.get("unembed"))
    weights.check_all_taken()
    return state


def block_norms(weights: SourceWeights, theirs: str, ours: str, mixer: str = "input_layernorm",
                mlp: str = "pre_ff_layernorm", transform: Transform | None = None) -> dict:
    """A block's two norms: {theirs}.{mixer} -> norm_mixer, {theirs}.{mlp} -> norm_mlp."""
    return {f"{ours}.norm_mixer.weight": weights.take(f"{theirs}.{mixer}.weight", transform),
            f"{ours}.norm_mlp.weight": weights.take(f"{theirs}.{mlp}.weight", transform)}
