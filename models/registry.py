"""build(name, **overrides), list_models(), load(run_dir)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from models.backbone import SequenceModel
from models.config import ModelConfig
from models.hooks import unknown_name_message
from models.mixers import PRESETS


# hybrid presets: model name -> (mixer pattern, config defaults); layer l gets pattern[l % len(pattern)]
HYBRIDS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "mamba_attention": (("mamba", "attention"), dict(n_layers=2, mlp=True, norm="rmsnorm")),
}


def list_models() -> list[str]:
    """Names accepted by `build`."""
    return sorted([*PRESETS, *HYBRIDS])


def build(name: str | ModelConfig, **overrides: Any) -> SequenceModel:
    """Build a model from a preset name (see `list_models()`) or a ModelConfig.

    `build("mamba", d_model=32, n_layers=2)`: overrides replace the preset's config fields.
    """
    if isinstance(name, ModelConfig):
        return SequenceModel(name.replace(**overrides))
    return SequenceModel(preset_config(name, **overrides))


def preset_config(name: str, **overrides: Any) -> ModelConfig:
    if not isinstance(name, str):
        raise TypeError(f"name must be a model name (str) or a ModelConfig; got {type(name).__name__}")
    if name not in PRESETS and name not in HYBRIDS:
        raise ValueError(unknown_name_message("model name", name, list_models()))
    unknown = set(overrides) - set(ModelConfig.field_names())
    if unknown:
        raise ValueError(f"unknown config overrides {sorted(unknown)}; valid: {ModelConfig.field_names()}")
    if name in HYBRIDS:
        pattern, defaults = HYBRIDS[name]
        n_layers = overrides.get("n_layers", defaults["n_layers"])
        mixer = [pattern[layer % len(pattern)] for layer in range(n_layers)] if isinstance(n_layers, int) else None
    else:
        mixer, defaults = PRESETS[name]
    return ModelConfig(**{**defaults, "mixer": mixer, **overrides})


def load(run_dir: str | Path, device: str = "cpu") -> SequenceModel:
    """Rebuild a model from a run directory (config.json with a "model" entry + model.safetensors)."""
    from safetensors.torch import load_model

    run_dir = Path(run_dir)
    config_path, weights_path = run_dir / "config.json", run_dir / "model.safetensors"
    for path in (config_path, weights_path):
        if not path.is_file():
            raise FileNotFoundError(f"run_dir {str(run_dir)!r} has no {path.name}")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_path} is not valid JSON (truncated?): {error}") from error
    if "model" not in config:
        raise ValueError(f"{config_path} has no 'model' entry; keys: {sorted(config)}")
    model = SequenceModel(ModelConfig.from_dict(config["model"]))
    try:
        missing, unexpected = load_model(model, str(weights_path), strict=False, device=device)
    except Exception as error:  # safetensors raises its own error types for corrupt files
        raise ValueError(f"{weights_path} could not be read (truncated or corrupt): {error}") from error
    if missing or unexpected:
        raise ValueError(
            f"{weights_path} does not match the config: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    return model.to(device)
