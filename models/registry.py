"""build(name, **overrides), list_models(), load(run_dir), weights_file(run_dir)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from models.backbone import SequenceModel
from models.config import ModelConfig
from models.devices import check_device
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


def weights_file(run_dir: str | Path) -> Path:
    """model.safetensors of a run directory's current checkpoint (the one its checkpoint.json names,
    see `interp.training.checkpoint`), or of a plain model directory (config.json + model.safetensors)."""
    run_dir = Path(run_dir)
    pointer = run_dir / "checkpoint.json"
    if not pointer.is_file():
        return run_dir / "model.safetensors"
    try:
        path = json.loads(pointer.read_text())["path"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{pointer} is not a checkpoint pointer (corrupt?): {error}") from error
    return run_dir / path / "model.safetensors"


def load(run_dir: str | Path, device: str = "cpu") -> SequenceModel:
    """Rebuild a model from a run directory (config.json with a "model" entry + the weights of its
    current checkpoint) or a model directory (config.json + model.safetensors)."""
    from safetensors import safe_open
    from safetensors.torch import load_model

    device = str(check_device(device))
    run_dir = Path(run_dir)
    config_path, weights_path = run_dir / "config.json", weights_file(run_dir)
    for path in (config_path, weights_path):
        if not path.is_file():
            raise FileNotFoundError(f"run_dir {str(run_dir)!r} has no {path.relative_to(run_dir)}")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_path} is not valid JSON (truncated?): {error}") from error
    if not isinstance(config, dict) or "model" not in config:
        raise ValueError(f"{config_path} has no 'model' entry; is it a run directory?")
    try:
        model = SequenceModel(ModelConfig.from_dict(config["model"]))
    except (ValueError, TypeError) as error:
        raise type(error)(f"{config_path}: the 'model' entry is not a valid ModelConfig: {error}") from None
    try:
        with safe_open(str(weights_path), framework="pt") as handle:
            shapes = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
    except Exception as error:  # safetensors raises its own error types for corrupt files
        raise ValueError(f"{weights_path} could not be read (truncated or corrupt): {error}") from error
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    wrong = [f"{key} {shapes[key]} (the config makes {expected[key]})"
             for key in expected if key in shapes and shapes[key] != expected[key]]
    if wrong or set(shapes) != set(expected):
        raise ValueError(
            f"{config_path} does not match the weights in {weights_path}: shapes differ for "
            f"{wrong[:3]}, missing {sorted(set(expected) - set(shapes))[:5]}, unexpected "
            f"{sorted(set(shapes) - set(expected))[:5]}; was config.json edited, or the weights replaced?"
        )
    try:
        load_model(model, str(weights_path), strict=True, device=device)
    except Exception as error:  # safetensors raises its own error types for corrupt files
        raise ValueError(f"{weights_path} could not be read (truncated or corrupt): {error}") from error
    return model.to(device)
