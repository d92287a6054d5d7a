"""fla DeltaNetForCausalLM -> our "deltanet" stack (fla_common: the blocks, GatedMLP, norms).

fla's DeltaNet layer: q, k, v = SiLU(ShortConv(proj x)) (separate convs, no bias; concatenated
into our [q | k | v] conv), l2norm of q and k (x / sqrt(|x|^2 + 1e-6): mixer_options l2_eps),
q scaled by d_head^-1/2 (q_scale), beta = sigmoid(b_proj x) without a bias (beta_bias False;
allow_neg_eigval doubles it: beta_scale 2), the output RMSNorm with config.norm_eps (norm_eps),
gated by swish(g_proj x) with use_gate. q_proj / k_proj / v_proj -> mixer.qkv_proj (rows
concatenated), b_proj -> mixer.beta_proj, g_proj -> mixer.gate_proj, o_norm -> mixer.o_norm,
o_proj -> mixer.out_proj.

State layout: fla's DeltaNet kernels keep S [K, V] (keys x values); ours is its transpose
[V, K] (values x keys; hook_state [B, T, H, V, K]): fla's state S_fla = ours.transpose(-1, -2).
Representable: qk_activation "silu", qk_norm "l2", use_beta True, head_k_dim == head_v_dim
(expand_k == expand_v); everything else raises UnsupportedConfig. (config.use_output_norm is not
read by fla's layer, which always normalises.)
"""

from __future__ import annotations

import torch
from torch import nn

from models.config import ModelConfig
from models.interop import fla_common
from models.interop.convert import SourceWeights, require, unsupported
from models.interop.fla_common import source_blocks

__all__ = ["convert", "source_blocks"]


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    fla_common.check_config(config)
    require(config, "qk_activation", "silu")
    require(config, "qk_norm", "l2")
    require(config, "use_beta", True)
    layer = source.model.layers[0].attn
    if layer.head_k_dim != layer.head_v_dim:
        raise unsupported(config, "expand_v", config.expand_v, f"expand_k={config.expand_k} (one head width for "
                          f"keys and values)")
    d = layer.head_k_dim
    cfg = ModelConfig(
        mixer="deltanet", n_heads=config.num_heads, d_head=d, beta_scale=2.0 if config.allow_neg_eigval else 1.0,
        mixer_options={"gate": bool(config.use_gate), "q_scale": d**-0.5, "beta_bias": False,
                       "norm_eps": float(config.norm_eps), "l2_eps": 1e-6},
        **fla_common.block_config(source),
    )
    weights = SourceWeights(source)
    take = weights.take

    def mixer(attn: str) -> dict:
        state = {"qkv_proj.weight": torch.cat([take(f"{attn}.{n}_proj.weight") for n in ("q", "k", "v")]),
                 "conv_weight": fla_common.conv_weight(weights, attn, config.use_short_conv, 3 * config.num_heads * d),
                 "beta_proj.weight": take(f"{attn}.b_proj.weight"), "o_norm.weight": take(f"{attn}.o_norm.weight"),
                 "out_proj.weight": take(f"{attn}.o_proj.weight")}
        if config.use_gate:
            state["gate_proj.weight"] = take(f"{attn}.g_proj.weight")
        return state

    return cfg, fla_common.stack_weights(weights, cfg.n_layers, mixer)
