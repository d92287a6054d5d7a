"""Instrumented sequence models: build(name), list_models(), load(run_dir), from_pretrained(source), hook interface.

The rooms: config, backbone (SequenceModel), registry (build, load), mixers/ (one file per sequence
mixer), kernels/ (one module per scan op), hooks/ (hook points and the hook grammar; state: hook
functions on hook_state; state_patch: declared state patches), cache/ (Cache; plan: its bytes before
a run; store: on disk; analyses: TransformerLens' cache analyses), decoding/ (DecodingState in
__init__; step: one decoding call, advance; readers: what hook readers are handed while decoding;
sampling: the next token; generation: generate), tl/ (TransformerLens names, run arguments and
attributes), storage/ (paths, the atomic writer, saving), interop/ (from_pretrained: one converter
per public architecture); beside them devices, layout, memory, size, moe, gated_product."""

from models.backbone import SequenceModel
from models.config import ModelConfig
from models.cache import Cache
from models.hooks import HookPoint, StatePatch, instrumented
from models.interop import from_pretrained, supported_architectures
from models.registry import build, list_models, load, preset_config
from models.storage.saving import save

__all__ = [
    "Cache", "HookPoint", "ModelConfig", "SequenceModel", "StatePatch", "build", "from_pretrained", "instrumented",
    "list_models", "load", "preset_config", "save", "supported_architectures",
]
