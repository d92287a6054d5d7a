"""transformers MambaForCausalLM -> our "mamba" stack (norm -> mixer -> residual, no MLP).

The layout maps 1:1 (state [B, E, N] in both, no transposes): backbone.embeddings -> embed,
layers.{l}.norm (RMSNorm, eps config.layer_norm_epsilon) -> blocks.{l}.norm_mixer,
mixer.{in_proj [x | z], conv1d (depthwise [E, 1, K], bias), x_proj [dt_low | B | C], dt_proj
(with bias; softplus after), A_log (A = -exp(A_log)), D, out_proj} -> blocks.{l}.mixer.{in_proj,
conv, x_proj, dt_proj, A_log, D, out_proj}, norm_f -> norm_final, lm_head -> unembed (tied by
default). transformers' MambaRMSNorm and its scan compute in float32 even for a float64 model,
so float64 parity is float32-close only.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from models.config import ModelConfig
from models.interop.convert import SourceWeights, require, unsupported


def check_config(config) -> None:
    """Refuse what our Mamba mixer cannot represent."""
    require(config, "hidden_act", "silu")
    if config.intermediate_size % config.hidden_size:
        raise unsupported(config, "expand", config.expand, "an integer (intermediate_size a multiple of hidden_size)")


def model_config(config, **extra) -> ModelConfig:
    return ModelConfig(
        mixer="mamba", vocab_size=config.vocab_size, d_model=config.hidden_size,
        n_layers=config.num_hidden_layers, d_state=config.state_size,
        expand=config.intermediate_size // config.hidden_size, d_conv=config.conv_kernel, norm="rmsnorm",
        norm_eps=float(config.layer_norm_epsilon), tie_embeddings=bool(config.tie_word_embeddings),
        mixer_options={"dt_rank": int(config.time_step_rank), "conv_bias": bool(config.use_conv_bias),
                       "bias": bool(config.use_bias), **extra},
    )


def mixer_weights(weights: SourceWeights, source: str, ours: str, bias: bool, conv_bias: bool) -> dict:
    """One Mamba mixer's weights, source prefix -> our prefix (shared with the Mamba-family converters)."""
    names = {"in_proj.weight": "in_proj.weight", "conv1d.weight": "conv.weight", "x_proj.weight": "x_proj.weight",
             "dt_proj.weight": "dt_proj.weight", "dt_proj.bias": "dt_proj.bias", "A_log": "A_log", "D": "D",
             "out_proj.weight": "out_proj.weight"}
    if conv_bias:
        names["conv1d.bias"] = "conv.bias"
    if bias:
        names |= {"in_proj.bias": "in_proj.bias", "out_proj.bias": "out_proj.bias"}
    return {f"{ours}.{mine}": weights.take(f"{source}.{theirs}") for theirs, mine in names.items()}


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    check_config(source.config)
    return convert_stack(source, model_config(source.config))


def convert_stack(source: nn.Module, cfg: ModelConfig, extra: Callable[[str], dict] | None = None) -> tuple[ModelConfig, dict]:
    """A Mamba-layout stack's weights; extra(our mixer prefix) adds weights per layer (FalconMamba)."""
    config = source.config
    weights = SourceWeights(source)
    state = {"embed.weight": weights.take("backbone.embeddings.weight")}
    for layer in range(cfg.n_layers):
        prefix = f"backbone.layers.{layer}"
        state[f"blocks.{layer}.norm_mixer.weight"] = weights.take(f"{prefix}.norm.weight")
        state |= mixer_weights(weights, f"{prefix}.mixer", f"blocks.{layer}.mixer", config.use_bias, config.use_conv_bias)
        state |= extra(f"blocks.{layer}.mixer") if extra else {}
    state["norm_final.weight"] = weights.take("backbone.norm_f.weight")
    state["unembed.weight"] = weights.take("lm_head.weight")
    weights.check_all_taken()
    return cfg, state


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.backbone.layers)
