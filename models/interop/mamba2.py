"""transformers Mamba2ForCausalLM -> our "mamba2" stack (norm -> mixer -> residual, no MLP).

The layout maps 1:1 (state [B, H, P, N] in both, no transposes): backbone.embeddings -> embed,
layers.{l}.norm (RMSNorm, eps config.layer_norm_epsilon) -> blocks.{l}.norm_mixer,
mixer.{in_proj [z | xBC | dt], conv1d (depthwise over xBC = [x | B | C], bias), dt_bias, A_log
(A = -exp(A_log), one per head), D (per head), norm (the gated group RMSNorm's weight [E], the
same eps), out_proj} -> blocks.{l}.mixer.{in_proj, conv, dt_bias, A_log, D, norm_weight,
out_proj}, norm_f -> norm_final, lm_head -> unembed. config.time_step_limit (the clamp of dt)
-> mixer_options dt_limit (None for the default (0, inf)); config.chunk_size only sets how
transformers' scan is cut, not its results. transformers computes its norms in float32 and keeps
the residual stream in float32 (residual_in_fp32), so float64 parity is float32-close only.
"""

from __future__ import annotations

import math

from torch import nn

from models.config import ModelConfig
from models.interop.convert import SourceWeights, require, unsupported
from models.interop.mamba import source_blocks  # the same backbone.layers

__all__ = ["convert", "dt_limit", "mixer_weights", "source_blocks"]


def dt_limit(config) -> list[float] | None:
    """Our mixer_options dt_limit from config.time_step_limit, the clamp transformers' Mamba-2
    scans apply (Mamba2, Bamba, FalconH1, GraniteMoeHybrid, NemotronH): None for (0, inf)."""
    limit = tuple(float(v) for v in config.time_step_limit)
    return None if limit == (0.0, math.inf) else list(limit)


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    require(config, "hidden_act", "silu")
    expand = config.expand
    if int(expand) != expand or int(config.expand * config.hidden_size) != config.num_heads * config.head_dim:
        raise unsupported(config, "expand", expand, "an integer with expand * hidden_size = num_heads * head_dim")
    eps = float(config.layer_norm_epsilon)
    cfg = ModelConfig(
        mixer="mamba2", vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=config.num_hidden_layers,
        n_heads=config.num_heads, d_state=config.state_size, expand=int(expand), d_conv=config.conv_kernel,
        norm="rmsnorm", norm_eps=eps, tie_embeddings=bool(config.tie_word_embeddings),
        mixer_options={"n_groups": config.n_groups, "conv_bias": bool(config.use_conv_bias),
                       "bias": bool(config.use_bias), "norm_eps": eps,
                       "dt_limit": dt_limit(config)},
    )
    weights = SourceWeights(source)
    state = {"embed.weight": weights.take("backbone.embeddings.weight")}
    for layer in range(cfg.n_layers):
        theirs, ours = f"backbone.layers.{layer}", f"blocks.{layer}"
        state[f"{ours}.norm_mixer.weight"] = weights.take(f"{theirs}.norm.weight")
        state |= mixer_weights(weights, f"{theirs}.mixer", f"{ours}.mixer", config.use_conv_bias, config.use_bias)
    state["norm_final.weight"] = weights.take("backbone.norm_f.weight")
    state["unembed.weight"] = weights.take("lm_head.weight")
    weights.check_all_taken()
    return cfg, state



def mixer_weights(weights: SourceWeights, theirs: str, ours: str, conv_bias: bool, bias: bool,
                  norm: bool = True) -> dict:
    """A transformers Mamba-2 mixer's weights (Mamba2Mixer and the hybrids' copies of it) -> our
    mamba2 mixer's (norm: the gated norm's weight, absent for gated_norm "none")."""
    names = {"in_proj.weight": "in_proj.weight", "conv1d.weight": "conv.weight", "dt_bias": "dt_bias",
             "A_log": "A_log", "D": "D", "out_proj.weight": "out_proj.weight"}
    if norm:
        names["norm.weight"] = "norm_weight"
    if conv_bias:
        names["conv1d.bias"] = "conv.bias"
    if bias:
        names |= {"in_proj.bias": "in_proj.bias", "out_proj.bias": "out_proj.bias"}
    return {f"{ours}.{mine}": weights.take(f"{theirs}.{name}") for name, mine in names.items()}
