"""Instrumented sequence models: build(name), list_models(), load(run_dir), hook interface."""

from models.backbone import SequenceModel
from models.config import ModelConfig
from models.hooks import Cache, HookPoint, instrumented
from models.registry import build, list_models, load, preset_config

__all__ = [
    "Cache", "HookPoint", "ModelConfig", "SequenceModel", "build", "instrumented", "list_models",
    "load", "preset_config",
]
