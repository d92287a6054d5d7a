"""Instrumented sequence models: build(name), list_models(), load(run_dir), from_pretrained(source), hook interface."""

from models.backbone import SequenceModel
from models.config import ModelConfig
from models.cache import Cache
from models.hooks import HookPoint, StatePatch, instrumented
from models.interop import from_pretrained, supported_architectures
from models.registry import build, list_models, load, preset_config
from models.saving import save

__all__ = [
    "Cache", "HookPoint", "ModelConfig", "SequenceModel", "StatePatch", "build", "from_pretrained", "instrumented",
    "list_models", "load", "preset_config", "save", "supported_architectures",
]
