"""fla RWKV7ForCausalLM -> our stack of "rwkv7" (time mix) and "rwkv7_ffn" (channel mix) blocks:
source layer l is our blocks 2l and 2l + 1 (models/mixers/rwkv7.py has the math).

fla's block: x + attn(attn_norm(x)), then + ffn(ffn_norm(.)), LayerNorms (bias with norm_bias,
eps norm_eps); layer 0 first normalises the embedding (pre_norm, norm_first). Ours: block 2l =
attn_norm -> rwkv7 mixer -> residual, block 2l + 1 = ffn_norm -> rwkv7_ffn mixer -> residual,
no MLPs; pre_norm is folded into the embedding (pre_norm of each embedding row, exact: it acts on
each token's embedding alone), so hook_embed is the normalised embedding, blocks.0.hook_resid_pre
fla's layer 0 residual. model.norm -> norm_final, lm_head -> unembed. Without norm_bias our
LayerNorms get zero biases.

Mixer weights map by name (x_r ... x_g, k_k, k_a, r_k, r/k/v/o_proj, w/a/v/g_lora.lora.{0,2},
g_norm); ffn.x_k / key / value -> the channel mix's x_k / key / value. The state: fla's kernels
keep S [K, V] per head; ours is its transpose [V, K] (hook_state [B, T, H, V, K]).
fuse_norm chooses fla's fused Triton norms, whose L2 norm of the removal key is x / sqrt(|x|^2 +
1e-6) (our l2_eps 1e-6) instead of F.normalize's (l2_eps None); the rest is the same math.

Hook names: blocks.{2l}.mixer.hook_state etc. for layer l's time mix, blocks.{2l+1}.mixer.hook_*
(hook_state [B, T, D, 2] the token-shift window, hook_pre / hook_post the channel-mix neurons)
for its channel mix. source_blocks gives fla's layers, whose outputs are our
blocks.{2l+1}.hook_resid_post (the time mix's residual is the input of fla's ffn_norm).
Refused (UnsupportedConfig): attn (hybrid softmax-attention layers), a hidden_act other than
sqrelu, value_dim differing across layers, tie_word_embeddings with norm_first (the fold would
untie them).
"""

from __future__ import annotations

import fla.models  # noqa: F401  registers RWKV7 with transformers' Auto classes (checkpoint directories)
import torch
import torch.nn.functional as F
from torch import nn

from models.config import ModelConfig
from models.interop.convert import SourceWeights, require, unsupported

FFN = ("x_k", "key.weight", "value.weight")


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    check_config(config)
    layers = source.model.layers
    attn = layers[0].attn
    eps = float(config.norm_eps)
    options = {"value_dim": attn.value_dim, "decay_low_rank": attn.decay_low_rank_dim,
               "a_low_rank": attn.a_low_rank_dim, "v_low_rank": layers[-1].attn.v_low_rank_dim,
               "gate_low_rank": attn.gate_low_rank_dim, "norm_eps": eps,
               "l2_eps": 1e-6 if config.fuse_norm else None}
    cfg = ModelConfig(
        mixer=["rwkv7", "rwkv7_ffn"] * len(layers), vocab_size=config.vocab_size, d_model=config.hidden_size,
        n_layers=2 * len(layers), n_heads=attn.num_heads, d_head=attn.head_dim, norm="layernorm", norm_eps=eps,
        mlp=False, d_mlp=layers[0].ffn.intermediate_size, tie_embeddings=bool(config.tie_word_embeddings),
        mixer_options={"rwkv7": options},
    )
    weights = SourceWeights(source)
    state = {"embed.weight": embedding(weights, config)}
    for layer in range(len(layers)):
        theirs = f"model.layers.{layer}"
        state |= norm_weights(weights, f"{theirs}.attn_norm", f"blocks.{2 * layer}.norm_mixer", config.norm_bias)
        state |= mixer_weights(weights, f"{theirs}.attn", f"blocks.{2 * layer}.mixer")
        state |= norm_weights(weights, f"{theirs}.ffn_norm", f"blocks.{2 * layer + 1}.norm_mixer", config.norm_bias)
        state |= {f"blocks.{2 * layer + 1}.mixer.{n}": weights.take(f"{theirs}.ffn.{n}") for n in FFN}
    state |= norm_weights(weights, "model.norm", "norm_final", config.norm_bias)
    state["unembed.weight"] = weights.take("lm_head.weight")
    weights.check_all_taken()
    return cfg, state


def check_config(config) -> None:
    require(config, "attn", None)
    require(config, "hidden_act", "sqrelu")
    dims = set(config.value_dim) if isinstance(config.value_dim, (list, tuple)) else {config.value_dim}
    if len(dims) > 1:
        raise unsupported(config, "value_dim", config.value_dim, "one value_dim for every layer")
    if config.norm_first and config.tie_word_embeddings:
        raise unsupported(config, "tie_word_embeddings", True, "False with norm_first (pre_norm is folded into "
                          "the embedding)")


def embedding(weights: SourceWeights, config) -> torch.Tensor:
    """The embedding, each row through layer 0's pre_norm with norm_first."""
    if not config.norm_first:
        return weights.take("model.embeddings.weight")
    norm = "model.layers.0.pre_norm"
    weight, bias = weights.take(f"{norm}.weight"), weights.take(f"{norm}.bias") if config.norm_bias else None
    return weights.take("model.embeddings.weight",
                        lambda e: F.layer_norm(e, e.shape[-1:], weight, bias, float(config.norm_eps)))


def norm_weights(weights: SourceWeights, theirs: str, ours: str, bias: bool) -> dict[str, torch.Tensor]:
    """An fla LayerNorm -> ours (a zero bias where fla's has none)."""
    weight = weights.take(f"{theirs}.weight")
    return {f"{ours}.weight": weight,
            f"{ours}.bias": weights.take(f"{theirs}.bias") if bias else torch.zeros_like(weight)}


def mixer_weights(weights: SourceWeights, theirs: str, ours: str) -> dict[str, torch.Tensor]:
    """RWKV7Attention -> our rwkv7 mixer: every weight by name, the token-shift mixes [1, 1, D] -> [D]."""
    names = sorted(k[len(theirs) + 1:] for k in weights.tensors if k.startswith(f"{theirs}."))
    return {f"{ours}.{n}": weights.take(f"{theirs}.{n}", (lambda p: p.reshape(-1)) if n.startswith("x_") else None)
            for n in names}


def source_blocks(source: nn.Module) -> list[nn.Module]:
    """fla's layers; their outputs are our blocks.{2l+1}.hook_resid_post."""
    return list(source.model.layers)
