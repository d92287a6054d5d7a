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

and may import an optional library at the top (fla): `from_pretrained` imports the module before
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
}


def supported_architectures() -> list[str]:
    """The source classes `from_pretrained` converts."""
    return sorted(name for _, classes in CONVERTERS.values() for name in classes)


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

