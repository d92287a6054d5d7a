"""The converters from public architectures, one module each, by the source's config.model_type.

A converter module (models/interop/<name>.py) defines

    convert(source) -> (ModelConfig, {our parameter name: tensor})
        the config that reproduces the source's math and our state dict built from the source's
        weights (models.interop.convert.SourceWeights takes them one by one and proves none is
        left over); every source config field that changes the math is checked with
        convert.require / convert.unsupported, so a checkpoint we cannot represent raises.
    source_blocks(source) -> [nn.Module]
        the source's layer modules, in order, whose outputs are our blocks.{l}.hook_resid_post
        (the per-block parity tests hook them).

and may define KNOWN_DROPS, regular expressions of stored checkpoint names that carry no weight
(from_pretrained refuses any other stored tensor the source has no weight for), and may import an
optional library at the top (fla): `from_pretrained` imports the module before
it loads a directory, so whatever the import registers with transformers' Auto classes is there.
Adding an architecture is one line here plus its module.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# config.model_type -> (converter module, the source classes it converts)
CONVERTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpt2": ("models.interop.gpt2", ("GPT2LMHeadModel",)),
    "llama": ("models.interop.llama", ("LlamaForCausalLM",)),
    "mamba": ("models.interop.mamba", ("MambaForCausalLM",)),
    "mamba2": ("models.interop.mamba2", ("Mamba2ForCausalLM",)),
    "delta_net": ("models.interop.deltanet", ("DeltaNetForCausalLM",)),
    "gated_deltanet": ("models.interop.gated_deltanet", ("GatedDeltaNetForCausalLM",)),
    "falcon_mamba": ("models.interop.falcon_mamba", ("FalconMambaForCausalLM",)),
    "jamba": ("models.interop.jamba", ("JambaForCausalLM",)),
    "bamba": ("models.interop.bamba", ("BambaForCausalLM",)),
    "falcon_h1": ("models.interop.falcon_h1", ("FalconH1ForCausalLM",)),
    "granitemoehybrid": ("models.interop.granitemoehybrid", ("GraniteMoeHybridForCausalLM",)),
    "nemotron_h": ("models.interop.nemotron_h", ("NemotronHForCausalLM",)),
    "zamba2": ("models.interop.zamba2", ("Zamba2ForCausalLM",)),
    "lfm2": ("models.interop.lfm2", ("Lfm2ForCausalLM",)),
    "qwen3": ("models.interop.qwen3", ("Qwen3ForCausalLM",)),
    "qwen3_moe": ("models.interop.qwen3", ("Qwen3MoeForCausalLM",)),
    "qwen3_next": ("models.interop.qwen3_next", ("Qwen3NextForCausalLM",)),
    "qwen3_5_text": ("models.interop.qwen3_5", ("Qwen3_5ForCausalLM",)),
    "qwen3_5": ("models.interop.qwen3_5", ("Qwen3_5ForConditionalGeneration",)),
    "qwen3_5_moe_text": ("models.interop.qwen3_5", ("Qwen3_5MoeForCausalLM",)),
    "qwen3_5_moe": ("models.interop.qwen3_5", ("Qwen3_5MoeForConditionalGeneration",)),
    "rwkv7": ("models.interop.rwkv7", ("RWKV7ForCausalLM",)),
    "kimi_linear": ("models.interop.kimi_linear", ("KimiLinearForCausalLM",)),
}


ROPE = "RoPE scaling (rope types other than 'default')"
# config.model_type -> (what the converter maps, what it refuses with UnsupportedConfig); every
# converter also refuses a weight it would drop and, where it reads one, a hidden_act other than
# its family's. The module docstrings have the layouts.
NOTES: dict[str, tuple[str, str]] = {
    "gpt2": ("learned positions, LayerNorm, tanh-GELU MLP, tied or untied unembedding",
             "other activations, scale_attn_by_inverse_layer_idx, unscaled attention, cross-attention"),
    "llama": ("RoPE, RMSNorm, SwiGLU, grouped-query attention, attention bias", f"{ROPE}, pretraining_tp > 1"),
    "mamba": ("the selective scan, its short conv, tied or untied unembedding",
              "an intermediate_size that is not an integer multiple of hidden_size"),
    "mamba2": ("heads, groups, the gated norm, the dt clamp", "num_heads * head_dim != expand * hidden_size"),
    "delta_net": ("silu short convs, l2-normed q / k, beta in [0, 1] or [0, 2], output gate",
                  "other qk activations or norms, use_beta False, expand_v != expand_k, fla attention layers"),
    "gated_deltanet": ("grouped value heads, expand_v, output gate, beta in [0, 1] or [0, 2]",
                       "fla attention layers, attention residuals, hidden_act other than swish"),
    "falcon_mamba": ("Mamba with FalconMamba's unweighted dt / B / C norms", "as mamba"),
    "jamba": ("Mamba-1 and attention layers, SwiGLU or mixture-of-experts MLPs", "hidden_act other than silu"),
    "bamba": ("Mamba-2 and half-rotary grouped-query attention layers, SwiGLU MLPs",
              f"{ROPE}, layer kinds other than Mamba-2 / attention"),
    "falcon_h1": ("Mamba-2 and attention in parallel in one block (blocks.{l}.mixer / mixer2), muP multipliers "
                  "folded into the weights", f"{ROPE}, mamba_proj_bias != projectors_bias, mamba_d_ssm != heads x "
                  "head_dim, a zero embedding_multiplier with tied embeddings"),
    "granitemoehybrid": ("Bamba's layout with dense or mixture-of-experts MLPs (shared expert), Granite's "
                         "multipliers folded into the weights", f"{ROPE}, a zero embedding_multiplier with tied "
                         "embeddings"),
    "nemotron_h": ("single-sublayer Mamba-2 / attention (no positions) / relu2-MLP / mixture-of-experts layers "
                   "(sigmoid grouped routing, relu2 experts, shared expert)",
                   "the MoE latent projection, multi-token-prediction layers"),
    "zamba2": ("Mamba-2 layers with the shared transformer block at hybrid depths (blocks.{l}.shared.*), "
               "per-depth LoRA adapters", f"{ROPE}, grouped-query heads with adapters, layer kinds other than "
               "Mamba-2 / hybrid"),
    "lfm2": ("gated short-conv layers (the conv window as hook_state) and qk-normed attention, SwiGLU",
             f"{ROPE}, layer kinds other than conv / full_attention"),
    "qwen3": ("qk-normed grouped-query attention, SwiGLU", f"{ROPE}, sliding-window attention"),
    "qwen3_moe": ("as qwen3, with sparse mixture-of-experts MLPs", f"{ROPE}, sliding-window attention"),
    "qwen3_next": ("Gated DeltaNet and gated, qk-normed, partial-rotary attention; sparse MoE MLPs with a gated "
                   "shared expert", f"{ROPE}, layer kinds other than linear / full attention, a shared expert of "
                   "width 0"),
    "qwen3_5_text": ("as qwen3_next (dense MLPs)", "as qwen3_next"),
    "qwen3_5": ("the language model of the multimodal checkpoint (the vision tower is left out)", "as qwen3_next"),
    "qwen3_5_moe_text": ("as qwen3_next (MoE MLPs)", "as qwen3_next"),
    "qwen3_5_moe": ("the language model of the multimodal checkpoint (the vision tower is left out)",
                    "as qwen3_next"),
    "kimi_linear": ("Kimi Delta Attention (channel-wise gated delta rule) and NoPE multi-head latent attention, "
                    "dense or DeepSeek-style MoE MLPs (sigmoid grouped routing, shared experts)",
                    "num_key_value_heads != num_attention_heads, n_shared_experts 0, hidden_act other than silu"),
    "rwkv7": ("time mix and channel mix as two blocks per layer, fused or plain norms",
              "fla attention layers, hidden_act other than sqrelu, value_dim varying by layer, tied embeddings "
              "with norm_first"),
}


def supported_architectures(details: bool = False) -> list[str] | dict[str, dict[str, str]]:
    """The source classes `from_pretrained` converts, sorted; details=True: {class: {"model_type",
    "supports", "refuses"}} (what the converter maps and what it refuses with UnsupportedConfig)."""
    if not isinstance(details, bool):
        raise TypeError(f"details must be a bool; got {details!r}")
    names = sorted(name for _, classes in CONVERTERS.values() for name in classes)
    if not details:
        return names
    found = {name: model_type for model_type, (_, classes) in CONVERTERS.items() for name in classes}
    return {name: {"model_type": found[name], "supports": NOTES[found[name]][0], "refuses": NOTES[found[name]][1]}
            for name in names}


def _supported_text() -> str:
    return ", ".join(f"{name} ({model_type})" for model_type, (_, classes) in sorted(CONVERTERS.items())
                     for name in classes)


def converter_for(class_name: str, model_type: str | None) -> ModuleType:
    """The converter module for a source class (config.model_type picks it; the class must be one
    that module converts); a clear ValueError listing the supported ones otherwise."""
    entry = CONVERTERS.get(model_type) if model_type is not None else None
    if entry is None:
        entry = next((e for e in CONVERTERS.values() if class_name in e[1]), None)
    if entry is None or class_name not in entry[1]:
        hint = f"; for model_type {model_type!r} convert {list(entry[1])}" if entry else ""
        raise ValueError(f"source architecture {class_name} (model_type {model_type!r}) is not supported{hint}; "
                         f"supported: {_supported_text()}")
    return importlib.import_module(entry[0])

