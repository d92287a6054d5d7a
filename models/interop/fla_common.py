"""What fla's DeltaNetForCausalLM and GatedDeltaNetForCausalLM share: the block around the layer
(model.layers.{l}: attn_norm -> attn -> residual -> mlp_norm -> GatedMLP -> residual, RMSNorms
with config.norm_eps; model.norm, lm_head) and the short convolutions.

fla's GatedMLP is down(swish(gate x) * up x) without biases: our "swiglu" MLP with mlp_bias False
(mlp.gate_proj / up_proj / down_proj -> mlp.gate / up / down), its width the layer's
intermediate_size (fla rounds 2/3 hidden_ratio hidden_size up to a multiple of 256 when the config
leaves it None). fuse_norm / fuse_swiglu / fuse_cross_entropy choose kernels, not math.
Importing this module imports fla.models, which registers fla's configs with transformers' Auto
classes (so from_pretrained loads fla checkpoint directories).
"""

from __future__ import annotations

import fla.models  # noqa: F401  registers DeltaNet / GatedDeltaNet with transformers' Auto classes
import torch
from torch import nn

from models.interop.convert import SourceWeights, require


def check_config(config) -> None:
    """Refuse the fla features our blocks cannot represent."""
    require(config, "attn", None)  # hybrid softmax-attention layers
    require(config, "attnres_block_size", None)  # attention residuals across layers
    require(config, "hidden_act", "swish")


def block_config(source: nn.Module) -> dict:
    """The ModelConfig fields of the stack around fla's layers."""
    config = source.config
    return dict(vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=config.num_hidden_layers,
                norm="rmsnorm", norm_eps=float(config.norm_eps), mlp=True, mlp_activation="swiglu", mlp_bias=False,
                d_mlp=source.model.layers[0].mlp.intermediate_size, tie_embeddings=bool(config.tie_word_embeddings),
                d_conv=config.conv_size if config.use_short_conv else 1)


def conv_weight(weights: SourceWeights, attn: str, use_short_conv: bool, channels: int) -> torch.Tensor:
    """The depthwise conv weights of q, k, v (fla's ShortConvolution [C, 1, W] each) concatenated
    into our [q | k | v] [C, W]; without short convs (fla: SiLU of the projection alone) a width-1
    identity conv."""
    if not use_short_conv:
        return torch.ones(channels, 1)
    return torch.cat([weights.take(f"{attn}.{name}_conv1d.weight")[:, 0] for name in ("q", "k", "v")])


def stack_weights(weights: SourceWeights, n_layers: int, mixer_weights) -> dict:
    """Our state dict: embeddings, per layer the norms, mixer_weights(layer prefix) and the MLP,
    the final norm and the head."""
    take = weights.take
    state = {"embed.weight": take("model.embeddings.weight")}
    for layer in range(n_layers):
        theirs, ours = f"model.layers.{layer}", f"blocks.{layer}"
        state[f"{ours}.norm_mixer.weight"] = take(f"{theirs}.attn_norm.weight")
        state[f"{ours}.norm_mlp.weight"] = take(f"{theirs}.mlp_norm.weight")
        state |= {f"{ours}.mlp.{mine}.weight": take(f"{theirs}.mlp.{name}_proj.weight")
                  for name, mine in (("gate", "gate"), ("up", "up"), ("down", "down"))}
        state |= {f"{ours}.mixer.{k}": v for k, v in mixer_weights(f"{theirs}.attn").items()}
    state["norm_final.weight"] = take("model.norm.weight")
    state["unembed.weight"] = take("lm_head.weight")
    weights.check_all_taken()
    return state


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.model.layers)
