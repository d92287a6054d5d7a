"""transformers Qwen3NextForCausalLM -> a hybrid of our "gated_deltanet" and "attention" mixers
(config.layer_types: linear_attention / full_attention), each followed by a SwiGLU MLP or the
sparse MoE MLP (models.moe), RMSNorm everywhere. models.interop.qwen3_5 converts Qwen3.5 (dense
and MoE) with the same functions; only its GDN input projections are laid out differently.

Norms. Qwen's block norms (input_layernorm, post_attention_layernorm, model.norm) and the
attention's q_norm / k_norm are zero-centred, x / rms(x) * (1 + w): our RMSNorm weights are 1 + w.
The GDN output norm (linear_attn.norm, RMSNorm(o) * w * silu(z)) has a plain weight.

Gated DeltaNet (linear_attn): the recurrence of our gated_deltanet mixer with beta = sigmoid(b)
(beta_scale 1), g = -exp(A_log) softplus(a + dt_bias), q and k l2-normed (eps 1e-6) and q scaled
by K^-1/2 in the kernel, grouped value heads (value head i reads key head i // (HV / H)), a
SiLU'd depthwise conv over [q | k | v] without bias, and the output gate silu(z) after the
per-head RMSNorm (eps rms_norm_eps): mixer_options num_heads / head_dim (linear_num_key_heads /
linear_key_head_dim), num_v_heads, expand_v = V / K. Qwen3-Next packs in_proj_qkvz [per key head:
q (K) | k (K) | v (HV/H V) | z (HV/H V)] and in_proj_ba [per key head: b (HV/H) | a (HV/H)]; the
rows are regrouped into q_proj, k_proj, v_proj, g_proj (z), b_proj, a_proj. conv1d.weight
[C, 1, W] -> conv_weight [C, W]; dt_bias, A_log by name; norm -> o_norm; out_proj -> o_proj.
transformers' recurrent state is [HV, K, V]; ours is [HV, V, K] (hook_state).

Attention (self_attn): q_proj emits [per head: query (d) | gate (d)]: the query rows go into our
qkv with k_proj and v_proj, the gate rows into gate_proj (mixer_options output_gate: the output
is multiplied by sigmoid(gate) before o_proj); qk_norm; RoPE on the first partial_rotary_factor
of each head (rope_parameters, the default rope type only). Qwen3.5's multimodal rotary sections
(mrope_section) coincide with plain RoPE for text, whose three position rows are equal.

MLP: mlp.{gate,up,down}_proj -> mlp.{gate,up,down}; a sparse block (Qwen3-Next: num_experts > 0,
layers not in mlp_only_layers, every decoder_sparse_step-th) -> models.moe.MoE: gate.weight ->
router, experts.gate_up_proj [E, 2F, D] -> experts.gate (first F rows) and experts.up,
experts.down_proj -> experts.down,
shared_expert -> shared_expert, shared_expert_gate -> shared_gate; softmax routing, top-k and
norm_topk_prob as the source's router. embed_tokens -> embed, lm_head -> unembed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from models.config import ModelConfig
from models.interop import hybrid
from models.interop.convert import SourceWeights, require, rope_base, unsupported
from models.interop.experts import experts_weights
from models.interop.llama import swiglu_weights

KINDS = {"linear_attention": "gated_deltanet", "full_attention": "attention"}
Projections = Callable[[SourceWeights, str, object], dict]


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    return convert_stack(source, source.config, "model", next_projections)


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.model.layers)


def next_projections(weights: SourceWeights, theirs: str, config) -> dict:
    """Qwen3-Next's in_proj_qkvz / in_proj_ba, grouped per key head -> our q/k/v/g/b/a_proj weights."""
    heads, group = config.linear_num_key_heads, config.linear_num_value_heads // config.linear_num_key_heads
    d_k, d_v = config.linear_key_head_dim, config.linear_value_head_dim
    qkvz = weights.take(f"{theirs}.in_proj_qkvz.weight")  # [H (2K + 2 HV/H V), D]
    q, k, v, z = qkvz.view(heads, -1, qkvz.shape[-1]).split([d_k, d_k, group * d_v, group * d_v], dim=1)
    b, a = weights.take(f"{theirs}.in_proj_ba.weight").view(heads, 2 * group, -1).split([group, group], dim=1)
    grouped = {"q_proj": q, "k_proj": k, "v_proj": v, "g_proj": z, "b_proj": b, "a_proj": a}
    return {f"{name}.weight": w.reshape(-1, w.shape[-1]) for name, w in grouped.items()}


def convert_stack(source: nn.Module, config, prefix: str, projections: Projections,
                  ignore: tuple[str, ...] = ()) -> tuple[ModelConfig, dict]:
    """The conversion of a Qwen3-Next-style stack of `config` (the text config) under `prefix`
    ("model", or "model.language_model"); projections(weights, linear_attn prefix, config) -> the
    GDN input maps as our q/k/v/g/b/a_proj weights; ignore: source weights left out (patterns)."""
    layers = source.get_submodule(prefix).layers
    kinds = hybrid.layer_kinds(config, "layer_types", KINDS, f"entries in {sorted(KINDS)}")
    sparse = [i for i, layer in enumerate(layers) if hasattr(layer.mlp, "experts")]
    cfg = ModelConfig(
        mixer=kinds, vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=config.num_hidden_layers,
        n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads, d_head=config.head_dim,
        attention_bias=bool(config.attention_bias), positional="rope", d_conv=config.linear_conv_kernel_dim,
        norm="rmsnorm", norm_eps=float(config.rms_norm_eps), mlp=True, mlp_activation="swiglu", mlp_bias=False,
        d_mlp=None if len(sparse) == len(layers) else config.intermediate_size,
        tie_embeddings=source.get_output_embeddings().weight is source.get_input_embeddings().weight, mixer_options=mixer_options(config, kinds),
        moe=moe_config(config, sparse, len(layers)),
    )
    weights = SourceWeights(source, ignore)
    layers = partial(block_weights, weights, config, sparse, projections)
    return cfg, hybrid.stack_weights(weights, kinds, layers, prefix=prefix, norm_final="norm",
                                     transforms={"norm_final": one_plus})


def block_weights(weights: SourceWeights, config, sparse: list[int], projections: Projections, layer: int,
                  kind: str, theirs: str, ours: str) -> dict:
    """Qwen3-Next layer `theirs` (Gated DeltaNet or gated attention, SwiGLU MLP or MoE, two
    zero-centred norms) -> our block."""
    if kind == "attention":
        state = attention_weights(weights, f"{theirs}.self_attn", f"{ours}.mixer", config)
    else:
        state = gdn_weights(weights, f"{theirs}.linear_attn", f"{ours}.mixer", config, projections)
    if layer in sparse:
        state |= moe_weights(weights, f"{theirs}.mlp", f"{ours}.mlp")
    else:
        state |= swiglu_weights(weights, f"{theirs}.mlp", f"{ours}.mlp", bias=False)
    return state | hybrid.block_norms(weights, theirs, ours, mlp="post_attention_layernorm", transform=one_plus)


def mixer_options(config, kinds: list[str]) -> dict:
    """Our mixer_options of the kinds present (checking the fields that change the math)."""
    require(config, "hidden_act", "silu")
    factor = float((getattr(config, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0))
    d_k, d_v = config.linear_key_head_dim, config.linear_value_head_dim
    options = {
        "attention": {"rope_base": rope_base(config, partial=True), "partial_rotary_factor": factor,
                      "qk_norm": True, "output_gate": True},
        "gated_deltanet": {"num_heads": config.linear_num_key_heads, "head_dim": d_k,
                           "num_v_heads": config.linear_num_value_heads, "expand_v": d_v / d_k, "gate": True,
                           "gate_activation": "silu", "conv_bias": False, "norm_eps": float(config.rms_norm_eps)},
    }
    return {kind: opts for kind, opts in options.items() if kind in kinds}


def moe_config(config, sparse: list[int], n_layers: int) -> dict | None:
    """ModelConfig.moe for the sparse layers `sparse` (None when every MLP is dense)."""
    if not sparse:
        return None
    if not config.shared_expert_intermediate_size:
        raise unsupported(config, "shared_expert_intermediate_size", config.shared_expert_intermediate_size,
                          "a positive width (the sparse block adds its gated shared expert)")
    return {"experts": config.num_experts, "top_k": config.num_experts_per_tok,
            "d_expert": config.moe_intermediate_size, "norm_topk_prob": bool(getattr(config, "norm_topk_prob", True)),
            "d_shared": config.shared_expert_intermediate_size, "shared_gate": True,
            "layers": None if len(sparse) == n_layers else sparse}


def one_plus(w: torch.Tensor) -> torch.Tensor:
    """A zero-centred RMSNorm weight w (x / rms(x) * (1 + w)) as our RMSNorm weight 1 + w."""
    return w + 1


def zero_centred(weights: SourceWeights, name: str) -> torch.Tensor:
    """The zero-centred RMSNorm weight `name` as ours (one_plus)."""
    return weights.take(name, one_plus)


def attention_weights(weights: SourceWeights, theirs: str, ours: str, config) -> dict:
    """q_proj [per head: query | gate] -> our qkv (with k_proj, v_proj) and gate_proj; q_norm,
    k_norm (zero-centred); o_proj -> out_proj."""
    heads, d = config.num_attention_heads, config.head_dim
    state = {}
    for p in ("weight", "bias") if config.attention_bias else ("weight",):
        q_proj = weights.take(f"{theirs}.q_proj.{p}")  # [H 2d(, D)]
        query, gate = q_proj.view(heads, 2, d, *q_proj.shape[1:]).unbind(1)  # [H, d(, D)] each
        rows = (heads * d, *q_proj.shape[1:])
        state[f"{ours}.qkv.{p}"] = torch.cat([query.reshape(rows), weights.take(f"{theirs}.k_proj.{p}"),
                                              weights.take(f"{theirs}.v_proj.{p}")])
        state[f"{ours}.gate_proj.{p}"] = gate.reshape(rows)
        state[f"{ours}.out_proj.{p}"] = weights.take(f"{theirs}.o_proj.{p}")
    state[f"{ours}.q_norm.weight"] = zero_centred(weights, f"{theirs}.q_norm.weight")
    state[f"{ours}.k_norm.weight"] = zero_centred(weights, f"{theirs}.k_norm.weight")
    return state


def gdn_weights(weights: SourceWeights, theirs: str, ours: str, config, projections: Projections) -> dict:
    """linear_attn -> our gated_deltanet mixer (module docstring)."""
    state = projections(weights, theirs, config)
    state["conv_weight"] = weights.take(f"{theirs}.conv1d.weight")[:, 0]  # [C, W]
    state |= {name: weights.take(f"{theirs}.{name}") for name in ("A_log", "dt_bias")}
    state["o_norm.weight"] = weights.take(f"{theirs}.norm.weight")
    state["o_proj.weight"] = weights.take(f"{theirs}.out_proj.weight")
    return {f"{ours}.{name}": tensor for name, tensor in state.items()}


def moe_weights(weights: SourceWeights, theirs: str, ours: str) -> dict:
    """A sparse block -> models.moe.MoE (module docstring)."""
    return {**experts_weights(weights, f"{theirs}.gate.weight", f"{theirs}.experts", ours),
            f"{ours}.shared_gate.weight": weights.take(f"{theirs}.shared_expert_gate.weight"),
            **swiglu_weights(weights, f"{theirs}.shared_expert", f"{ours}.shared_expert", bias=False)}
