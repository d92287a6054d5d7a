"""transformers FalconH1ForCausalLM -> blocks with two mixers in parallel on one norm (Block's
"mixer + mixer2 + MLP" layout): x + mamba(n) + attention(n), n = input_layernorm(x), then a
SwiGLU MLP. Hook names: blocks.{l}.mixer.* is the Mamba-2 branch (hook_state, hook_dt, ...),
blocks.{l}.mixer2.* the attention branch (hook_q, hook_pattern, ...); their outputs (hook_out
each) sum into hook_resid_mid.

Falcon-H1's muP multipliers are folded into the weights (linear maps, so every hook holds what
the source computes there, the multipliers applied):

    embedding_multiplier e      embed = e * embed_tokens (hook_embed: the scaled embedding)
    ssm_in_multiplier           mamba in_proj's weight (not its bias)
    ssm_multipliers [z, x, B, C, dt]   in_proj's output rows (weight and bias): the mup vector
    ssm_out_multiplier          mamba out_proj (weight and bias)
    attention_in_multiplier     q/k/v_proj weights (not biases)
    key_multiplier              k_proj (weight and bias): hook_k holds the scaled keys
    attention_out_multiplier    o_proj (weight and bias)
    mlp_multipliers [g, d]      gate_proj (g) and down_proj (d), weights and biases
    lm_head_multiplier m        unembed = m * lm_head, or with tied embeddings the final norm's
                                weight times m / e (the unembedding is e * embed_tokens)

Mamba-2 (models.interop.mamba2.mixer_weights): heads mamba_n_heads x mamba_d_head (E =
mamba_d_ssm or mamba_expand * hidden_size), mamba_n_groups, mamba_conv_bias, the gated norm per
mamba_rms_norm / mamba_norm_before_gate (our gated_norm "none" / "norm_first" / "gate_first"),
its eps rms_norm_eps, time_step_limit -> dt_limit. Attention: Llama's with RoPE (rope_theta;
partial_rotary_factor where set), grouped-query heads, biases attention_bias.
pre_ff_layernorm -> norm_mlp, final_layernorm -> norm_final.

Refused (UnsupportedConfig): hidden_act other than silu, rope scaling, mamba_proj_bias !=
projectors_bias (our Mamba-2 has one bias flag for in_proj and out_proj), E != mamba_n_heads *
mamba_d_head, embedding_multiplier 0 with tied embeddings.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from models.config import ModelConfig
from models.interop import hybrid, mamba2 as mamba2_layout
from models.interop.bamba import mamba2_options, rotary_options
from models.interop.convert import SourceWeights, require, unsupported
from models.interop.llama import attention_weights, swiglu_weights


def gated_norm(config) -> str:
    if not config.mamba_rms_norm:
        return "none"
    return "norm_first" if config.mamba_norm_before_gate else "gate_first"


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    require(config, "hidden_act", "silu")
    if bool(config.mamba_proj_bias) != bool(config.projectors_bias):
        raise unsupported(config, "projectors_bias", config.projectors_bias,
                          f"the same as mamba_proj_bias={config.mamba_proj_bias}")
    inner = config.mamba_d_ssm if config.mamba_d_ssm is not None else int(config.mamba_expand * config.hidden_size)
    if inner != config.mamba_n_heads * config.mamba_d_head:
        raise unsupported(config, "mamba_d_ssm", config.mamba_d_ssm, "mamba_n_heads * mamba_d_head")
    tied, e = source.lm_head.weight is source.model.embed_tokens.weight, float(config.embedding_multiplier)
    if tied and e == 0:
        raise unsupported(config, "embedding_multiplier", e, "a nonzero multiplier with tied embeddings")
    eps = float(config.rms_norm_eps)
    cfg = ModelConfig(
        mixer="mamba2", mixer2="attention", vocab_size=config.vocab_size, d_model=config.hidden_size,
        n_layers=config.num_hidden_layers, n_heads=config.num_attention_heads,
        n_kv_heads=config.num_key_value_heads,
        d_head=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        attention_bias=bool(config.attention_bias), positional="rope", d_state=config.mamba_d_state,
        d_conv=config.mamba_d_conv, norm="rmsnorm", norm_eps=eps, mlp=True, d_mlp=config.intermediate_size,
        mlp_activation="swiglu", mlp_bias=bool(config.mlp_bias), tie_embeddings=tied,
        mixer_options={"mamba2": mamba2_options(config, eps) | {"gated_norm": gated_norm(config)},
                       "attention": rotary_options(config)},
    )
    weights = SourceWeights(source)  # (mup_vector is a non-persistent buffer: ssm_multipliers)
    m = float(config.lm_head_multiplier)
    ends = {"embed": lambda w: w * e, "norm_final": lambda w: w * (m / e) if tied else w,
            "unembed": lambda w: w * e if tied else w * m}
    return cfg, hybrid.stack_weights(weights, range(cfg.n_layers), partial(block_weights, weights, config, cfg),
                                     transforms=ends)


def block_weights(weights: SourceWeights, config, cfg: ModelConfig, layer: int, kind: int, theirs: str,
                  ours: str) -> dict:
    """Falcon-H1 layer `theirs` (the Mamba-2 and attention branches, the SwiGLU MLP with its
    multipliers, two norms) -> our block."""
    state = mamba_weights(weights, config, f"{theirs}.mamba", f"{ours}.mixer")
    state |= attention_branch(weights, config, cfg, f"{theirs}.self_attn", f"{ours}.mixer2")
    mlp = swiglu_weights(weights, f"{theirs}.feed_forward", f"{ours}.mlp", cfg.mlp_bias)
    gate, down = (float(m) for m in config.mlp_multipliers)
    state |= {name: value * (gate if ".mlp.gate." in name else down if ".mlp.down." in name else 1.0)
              for name, value in mlp.items()}
    return state | hybrid.block_norms(weights, theirs, ours)


def mup_vector(config, like: torch.Tensor) -> torch.Tensor:
    """in_proj's per-output multipliers [2 E + 2 G N + H]: ssm_multipliers over z, x, B, C, dt."""
    inner, gn = config.mamba_n_heads * config.mamba_d_head, config.mamba_n_groups * config.mamba_d_state
    sizes = [inner, inner, gn, gn, config.mamba_n_heads]
    return torch.cat([torch.full((n,), float(k), dtype=like.dtype) for n, k in zip(sizes, config.ssm_multipliers)])


def mamba_weights(weights: SourceWeights, config, theirs: str, ours: str) -> dict:
    """The Mamba-2 branch with ssm_in / ssm_multipliers / ssm_out folded in."""
    state = mamba2_layout.mixer_weights(weights, theirs, ours, config.mamba_conv_bias, config.mamba_proj_bias,
                                        norm=bool(config.mamba_rms_norm))
    rows = mup_vector(config, state[f"{ours}.in_proj.weight"])
    return folded(state, f"{ours}.in_proj", f"{ours}.out_proj", rows, float(config.ssm_in_multiplier),
                  float(config.ssm_out_multiplier), bool(config.mamba_proj_bias))


def attention_branch(weights: SourceWeights, config, cfg: ModelConfig, theirs: str, ours: str) -> dict:
    """The attention branch with attention_in / key / attention_out multipliers folded in."""
    state = attention_weights(weights, theirs, ours, cfg.attention_bias)
    queries, keys = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    rows = torch.ones(queries + 2 * keys, dtype=state[f"{ours}.qkv.weight"].dtype)
    rows[queries : queries + keys] = float(config.key_multiplier)
    return folded(state, f"{ours}.qkv", f"{ours}.out_proj", rows, float(config.attention_in_multiplier),
                  float(config.attention_out_multiplier), cfg.attention_bias)


def folded(state: dict, into: str, out: str, rows: torch.Tensor, scale_in: float, scale_out: float,
           bias: bool) -> dict:
    """A branch's weights with its multipliers folded in: the input map `into` times rows * scale_in
    per output row (its bias times rows), the output map `out` (weight and bias) times scale_out."""
    state[f"{into}.weight"] = state[f"{into}.weight"] * (rows[:, None] * scale_in)
    state[f"{out}.weight"] = state[f"{out}.weight"] * scale_out
    if bias:
        state[f"{into}.bias"] = state[f"{into}.bias"] * rows
        state[f"{out}.bias"] = state[f"{out}.bias"] * scale_out
    return state


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.model.layers)
