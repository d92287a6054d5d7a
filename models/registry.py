"""build(name, **overrides), list_models(), load(run_dir), weights_file(run_dir); save(model, run_dir)
from models.storage.saving."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from models.backbone import SequenceModel
from models.config import ModelConfig
from models.devices import check_device
from models.hooks import all_finite, unknown_name_message
from models.mixers import PRESETS
from models.storage.paths import check_sha256, inside, read_regular, regular_file
from models.storage.saving import WEIGHTS_SHA256, load_weights, tied_groups
from models.size import check_fits


# hybrid presets: model name -> (mixer pattern, config defaults); layer l gets pattern[l % len(pattern)]
HYBRIDS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "mamba_attention": (("mamba", "attention"), dict(n_layers=2, mlp=True, norm="rmsnorm")),
    "rwkv7_stack": (("rwkv7", "rwkv7_ffn"), dict(n_layers=4, d_model=64, n_heads=4, mlp=False, norm="layernorm")),
}


def list_models() -> list[str]:
    """Names accepted by `build`."""
    return sorted([*PRESETS, *HYBRIDS])


def build(name: str | ModelConfig, **overrides: Any) -> SequenceModel:
    """Build a model from a preset name (see `list_models()`) or a ModelConfig.

    `build("mamba", d_model=32, n_layers=2)`: overrides replace the preset's config fields.
    A model that would not fit the memory available is refused before it is built
    (models.size.ModelTooLarge, a ValueError).
    """
    config = name.replace(**overrides) if isinstance(name, ModelConfig) else preset_config(name, **overrides)
    check_fits(config)
    return SequenceModel(config)


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


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def weights_file(run_dir: str | Path) -> Path:
    """model.safetensors of a run directory's current checkpoint (the one its checkpoint.json names,
    see `interp.training.checkpoint`), or of a plain model directory (config.json + model.safetensors).
    The pointer is confined to the run directory (`models.storage.paths.inside`): a path that is absolute,
    climbs with "..", or passes a symbolic link raises PathRefused (a ValueError), and the pointer
    itself is read only as a regular file, not through a link (`models.storage.paths.read_regular`)."""
    run_dir = Path(run_dir)
    pointer = inside(run_dir, "checkpoint.json")
    if not _is_run(run_dir):
        return run_dir / "model.safetensors"
    try:
        path = json.loads(read_regular(pointer))["path"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{pointer} is not a checkpoint pointer (corrupt?): {error}") from error
    if not isinstance(path, str) or not path:
        raise ValueError(f"{pointer} is not a checkpoint pointer: its path is {path!r}, not a directory name")
    return inside(run_dir, path, "model.safetensors", what=f"{pointer} path")


def _is_run(run_dir: Path) -> bool:
    """A run directory of interp.training (a checkpoint pointer; its files are confined, see
    models.storage.paths), not a model directory of `save` (whose files may be links, as in a model cache)."""
    return os.path.lexists(run_dir / "checkpoint.json")


def _recorded_digest(run_dir: Path, config: dict, weights_path: Path) -> tuple[str | None, str]:
    """(the sha256 recorded for weights_path, where): a checkpoint's trainer_state.json, or the
    "weights_sha256" of a model directory's config.json; None for directories written before."""
    state = weights_path.parent / "trainer_state.json"
    if weights_path.parent != run_dir and os.path.lexists(state):
        try:
            digests = json.loads(read_regular(state)).get("sha256", {})
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as error:
            raise ValueError(f"{state} is not a trainer state (truncated or corrupt?): {error}") from None
        return (digests.get("model.safetensors") if isinstance(digests, dict) else None), str(state)
    return config.get(WEIGHTS_SHA256), str(run_dir / "config.json")


def load(run_dir: str | Path, device: str = "cpu") -> SequenceModel:
    """Rebuild a model from a run directory (config.json with a "model" entry + the weights of its
    current checkpoint) or a model directory (config.json + model.safetensors), in the dtype its
    weights were saved in. The weights' sha256 is checked against the digest recorded when they
    were written (ValueError naming the file on a mismatch: a flipped bit, a file replaced). A
    directory holding tokenizer files (`save` of a model with a tokenizer) gives the model that
    tokenizer (model.tokenizer; `attach_tokenizer`)."""
    from safetensors import safe_open

    device = str(check_device(device))
    run_dir = Path(run_dir)
    run, weights_path = _is_run(run_dir), weights_file(run_dir)
    config_path = inside(run_dir, "config.json") if run else run_dir / "config.json"
    for path in (config_path, weights_path):
        if not (os.path.lexists(path) if run else path.is_file()):
            raise FileNotFoundError(f"run_dir {str(run_dir)!r} has no {path.relative_to(run_dir)}")
        if run:
            regular_file(path)   # inside a run directory: no link to follow, no FIFO or device to read
    try:
        config = json.loads(read_regular(config_path) if run else config_path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{config_path} is not valid JSON (truncated?): {error}") from error
    if not isinstance(config, dict) or "model" not in config:
        raise ValueError(f"{config_path} has no 'model' entry; is it a run directory?")
    try:
        model_config = ModelConfig.from_dict(config["model"])
    except (ValueError, TypeError) as error:
        raise type(error)(f"{config_path}: the 'model' entry is not a valid ModelConfig: {error}") from None
    check_fits(model_config, device, _size(weights_path), what=f"the model of {config_path}")
    model = SequenceModel(model_config)
    try:
        with safe_open(str(weights_path), framework="pt") as handle:
            shapes = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
            dtypes = {_SAFETENSORS_DTYPES.get(handle.get_slice(key).get_dtype()) for key in handle.keys()}
    except Exception as error:  # safetensors raises its own error types for corrupt files
        raise ValueError(f"{weights_path} could not be read (truncated or corrupt): {error}") from error
    if len(dtypes) == 1 and None not in dtypes:  # one floating dtype: build the model in it
        model = model.to(dtypes.pop())
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    for names in tied_groups(model):  # the file keeps one name of each tied group (embed / unembed, shared blocks)
        if any(name in shapes for name in names):
            for name in set(names) - set(shapes):
                expected.pop(name)
    wrong = [f"{key} {shapes[key]} (the config makes {expected[key]})"
             for key in expected if key in shapes and shapes[key] != expected[key]]
    if wrong or set(shapes) != set(expected):
        raise ValueError(
            f"{config_path} does not match the weights in {weights_path}: shapes differ for "
            f"{wrong[:3]}, missing {sorted(set(expected) - set(shapes))[:5]}, unexpected "
            f"{sorted(set(shapes) - set(expected))[:5]}; was config.json edited, or the weights replaced?"
        )
    check_sha256(weights_path, *_recorded_digest(run_dir, config, weights_path))
    try:
        missing, unexpected = load_weights(model, weights_path, device)
    except Exception as error:  # safetensors raises its own error types for corrupt files
        raise ValueError(f"{weights_path} could not be read (truncated or corrupt): {error}") from error
    if missing or unexpected:
        raise ValueError(f"{weights_path} does not fill the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    check_finite(model, weights_path)
    attach_tokenizer(model, run_dir, run)
    return model.to(device)


def attach_tokenizer(model: SequenceModel, run_dir: Path, run: bool) -> None:
    """model.set_tokenizer(the tokenizer saved in run_dir) when it holds tokenizer files
    (models.tl.surface.directory_tokenizer: local files, no remote code); in a run directory each
    must be a regular file (a link is refused, not read through). Nothing when it holds none."""
    from models.tl.surface import TOKENIZER_FILES, directory_tokenizer

    present = [run_dir / name for name in TOKENIZER_FILES if os.path.lexists(run_dir / name)]
    if not present:
        return
    if run:
        for path in present:
            regular_file(path)
    tokenizer = directory_tokenizer(run_dir)
    if tokenizer is not None:
        model.set_tokenizer(tokenizer)


def _size(path: Path) -> int:
    """Bytes of the weights file (0 when it cannot be stat'ed: the reading below names why)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def check_finite(model: torch.nn.Module, weights_path: Path) -> None:
    """ValueError naming the first parameter holding NaN or Inf (a diverged run's weights): every
    analysis of such a model is NaN, or ends in a linear-algebra error far from the cause."""
    for name, parameter in model.named_parameters():
        if not all_finite(parameter.detach()):
            bad = int((~torch.isfinite(parameter.detach())).sum())
            raise ValueError(f"{weights_path}: parameter {name} holds {bad:,} NaN / Inf values of "
                             f"{parameter.numel():,}; the weights are not finite (a diverged run?), so no analysis "
                             "of them would mean anything")
