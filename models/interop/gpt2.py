"""transformers GPT2LMHeadModel -> our "transformer" (learned positions, pre-LayerNorm blocks of
attention and a GELU MLP, all with biases).

Layout: transformers' Conv1D stores weight [in, out] (y = x W + b), our nn.Linear [out, in]: every
Conv1D weight is transposed. attn.c_attn's output is [q | k | v], heads contiguous inside each,
which is our fused qkv's order, so it maps without a split. wte -> embed, wpe -> pos_embed,
h.{l}.ln_1 / ln_2 -> blocks.{l}.norm_mixer / norm_mlp, attn.c_proj -> mixer.out_proj,
mlp.c_fc / c_proj -> mlp.up / down, ln_f -> norm_final, lm_head -> unembed (tied by default).
activation_function gelu_new (the tanh approximation) -> mlp_activation "gelu_tanh".
"""

from __future__ import annotations

from torch import nn

from models.config import ModelConfig
from models.interop.convert import SourceWeights, require, unsupported

# stored names no weight of ours comes from: the causal-mask buffers older GPT-2 checkpoints hold
KNOWN_DROPS = (r"(transformer\.)?h\.\d+\.attn\.(masked_)?bias",)
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    if config.activation_function not in ACTIVATIONS:
        raise unsupported(config, "activation_function", config.activation_function, " or ".join(ACTIVATIONS))
    require(config, "scale_attn_weights", True)
    require(config, "scale_attn_by_inverse_layer_idx", False)
    require(config, "add_cross_attention", False)
    cfg = ModelConfig(
        mixer="attention", vocab_size=config.vocab_size, d_model=config.n_embd, n_layers=config.n_layer,
        n_heads=config.n_head, positional="learned", max_len=config.n_positions, norm="layernorm",
        norm_eps=float(config.layer_norm_epsilon), mlp=True, d_mlp=config.n_inner or 4 * config.n_embd,
        mlp_activation=ACTIVATIONS[config.activation_function], tie_embeddings=bool(config.tie_word_embeddings),
    )
    weights = SourceWeights(source)
    take = weights.take
    state = {"embed.weight": take("transformer.wte.weight"), "pos_embed.weight": take("transformer.wpe.weight")}
    transposed = lambda w: w.T  # noqa: E731  Conv1D [in, out] -> Linear [out, in]
    for layer in range(cfg.n_layers):
        theirs, ours = f"transformer.h.{layer}", f"blocks.{layer}"
        for src, dst in [("ln_1", "norm_mixer"), ("ln_2", "norm_mlp")]:
            state |= {f"{ours}.{dst}.{p}": take(f"{theirs}.{src}.{p}") for p in ("weight", "bias")}
        for src, dst in [("attn.c_attn", "mixer.qkv"), ("attn.c_proj", "mixer.out_proj"),
                         ("mlp.c_fc", "mlp.up"), ("mlp.c_proj", "mlp.down")]:
            state[f"{ours}.{dst}.weight"] = take(f"{theirs}.{src}.weight", transposed)
            state[f"{ours}.{dst}.bias"] = take(f"{theirs}.{src}.bias")
    state |= {f"norm_final.{p}": take(f"transformer.ln_f.{p}") for p in ("weight", "bias")}
    state["unembed.weight"] = take("lm_head.weight")
    weights.check_all_taken()
    return cfg, state


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.transformer.h)
