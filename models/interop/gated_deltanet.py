"""fla GatedDeltaNetForCausalLM -> our "gated_deltanet" stack (fla_common: the blocks, GatedMLP,
norms). The mixer is laid out as fla's GatedDeltaNet layer (models/mixers/gated_deltanet.py has
the math), so its weights map by name: q_proj, k_proj, v_proj, a_proj, b_proj, A_log, dt_bias,
o_norm, g_proj (use_gate), o_proj; the three ShortConvolutions (no bias: fla's block does not pass
conv_bias) are concatenated into our [q | k | v] conv. num_v_heads (GVA), expand_v, use_gate and
output_gate_activation become mixer_options, allow_neg_eigval beta_scale 2, norm_eps the output
norm's eps as well as the blocks'. fla's layer runs its kernels with state_v_first=True, so its
state is [HV, V, K], the same layout as ours (hook_state [B, T, HV, V, K]), no transpose.
"""

from __future__ import annotations

from torch import nn

from models.config import ModelConfig
from models.interop import fla_common
from models.interop.convert import SourceWeights
from models.interop.fla_common import source_blocks

__all__ = ["convert", "source_blocks"]

NAMES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "a_proj.weight", "b_proj.weight", "A_log", "dt_bias",
         "o_norm.weight", "o_proj.weight")


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    fla_common.check_config(config)
    layer = source.model.layers[0].attn
    cfg = ModelConfig(
        mixer="gated_deltanet", n_heads=config.num_heads, d_head=config.head_dim,
        beta_scale=2.0 if config.allow_neg_eigval else 1.0,
        mixer_options={"expand_v": float(config.expand_v), "num_v_heads": layer.num_v_heads,
                       "gate": bool(config.use_gate), "gate_activation": config.output_gate_activation,
                       "conv_bias": False, "norm_eps": float(config.norm_eps)},
        **fla_common.block_config(source),
    )
    weights = SourceWeights(source)
    channels = 2 * layer.key_dim + layer.value_dim

    def mixer(attn: str) -> dict:
        state = {name: weights.take(f"{attn}.{name}") for name in NAMES}
        state["conv_weight"] = fla_common.conv_weight(weights, attn, config.use_short_conv, channels)
        if config.use_gate:
            state["g_proj.weight"] = weights.take(f"{attn}.g_proj.weight")
        return state

    return cfg, fla_common.stack_weights(weights, cfg.n_layers, mixer)
