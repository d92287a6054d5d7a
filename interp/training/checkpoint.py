"""Run directories: everything needed to rebuild a model and to resume its training exactly.

    run_dir/
      config.json          {"model": ModelConfig dict, "task": {"name", "options"}, "train": TrainConfig
                            dict, "versions": {torch, numpy, python, package}, "seed"}
      model.safetensors    the weights (`models.load(run_dir)` rebuilds the model from these two)
      optimizer.safetensors  optimizer tensors (AdamW moments, step counts) + the torch RNG state
      trainer_state.json   step, optimizer scalars (param groups), curriculum state, file checks
      metrics.jsonl        one JSON record per line (training and evaluation metrics)

No pickle anywhere: tensors go to safetensors, scalars to JSON. Every write is atomic (a temporary
file in the same directory, fsync, os.replace), so a crash leaves either the old or the new file.
A checkpoint is a set of three files written in order optimizer -> model -> trainer_state; each
safetensors file carries the step in its metadata and trainer_state.json records the step and the
byte size of both, so a set mixed from two steps or a truncated file is detected and rejected
with a clear error rather than loaded.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file, save_model

CONFIG = "config.json"
MODEL = "model.safetensors"
OPTIMIZER = "optimizer.safetensors"
STATE = "trainer_state.json"
METRICS = "metrics.jsonl"


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


class CheckpointError(ValueError):
    """A run directory is truncated, corrupt, or does not match what was asked of it."""


# ----------------------------------------------------------------------------- atomic writes


def atomic_write(path: str | Path, write) -> None:
    """Write `path` atomically: `write(tmp_path)` fills a temporary file next to it, then rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; give the usual permissions
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)

    atomic_write(path, write)


def write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path} is not valid JSON (truncated or corrupt?): {error}") from error


# ----------------------------------------------------------------------------- config.json


def versions() -> dict[str, str]:
    """Versions of what produced a run (recorded in config.json)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        package = version("interp-seq")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        package = "unknown"
    return {"torch": torch.__version__, "numpy": np.__version__,
            "python": platform.python_version(), "package": package}


def make_config(model: dict, task: dict, train: dict, seed: int) -> dict[str, Any]:
    return {"model": model, "task": task, "train": train, "versions": versions(), "seed": seed}


def read_config(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / CONFIG
    config = read_json(path)
    missing = {"model", "task", "train", "seed"} - set(config) if isinstance(config, dict) else None
    if missing is None or missing:
        raise CheckpointError(f"{path} lacks the entries {sorted(missing or [])}; is it a run directory?")
    return config


def config_differences(old: dict, new: dict) -> list[str]:
    """Entries (other than package versions) where two run configs differ, as readable lines."""
    lines = []
    for section in ("model", "task", "train", "seed"):
        a, b = old.get(section), new.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if a.get(key, "<absent>") != b.get(key, "<absent>"):
                    lines.append(f"{section}.{key}: {a.get(key, '<absent>')!r} != {b.get(key, '<absent>')!r}")
        elif a != b:
            lines.append(f"{section}: {a!r} != {b!r}")
    return lines


# ----------------------------------------------------------------------------- checkpoints


def save_checkpoint(run_dir: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    step: int, extra: dict[str, Any] | None = None) -> None:
    """Write optimizer, model and trainer state for `step` (in that order, each atomically).

    extra: JSON-serialisable trainer state to restore on resume (curriculum, ...).
    """
    run_dir = Path(run_dir)
    meta = {"step": str(step)}
    tensors, scalars = flatten_optimizer(optimizer)
    tensors["rng.torch"] = torch.get_rng_state()
    atomic_write(run_dir / OPTIMIZER, lambda tmp: save_file(tensors, tmp, metadata=meta))
    atomic_write(run_dir / MODEL, lambda tmp: save_model(model, tmp, metadata=meta))
    state = {
        "step": step,
        "optimizer": scalars,
        "extra": extra or {},
        "files": {name: (run_dir / name).stat().st_size for name in (MODEL, OPTIMIZER)},
    }
    write_json(run_dir / STATE, state)


def load_checkpoint(run_dir: str | Path, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore model weights, optimizer and torch RNG state in place; returns trainer_state.json.

    Raises CheckpointError when a file is missing, truncated, or from another step.
    """
    run_dir = Path(run_dir)
    for name in (STATE, MODEL, OPTIMIZER):
        if not (run_dir / name).is_file():
            raise CheckpointError(f"run_dir {str(run_dir)!r} has no {name}: the checkpoint is incomplete")
    state = read_json(run_dir / STATE)
    if not isinstance(state, dict) or not {"step", "optimizer", "files"} <= set(state):
        raise CheckpointError(f"{run_dir / STATE} is not a trainer state (keys {sorted(state)})")
    for name, size in state["files"].items():
        actual = (run_dir / name).stat().st_size
        if actual != size:
            raise CheckpointError(
                f"{run_dir / name} has {actual} bytes but the checkpoint of step {state['step']} "
                f"wrote {size}: truncated or from another checkpoint"
            )
    for name in (MODEL, OPTIMIZER):
        step = read_step(run_dir / name)
        if step != state["step"]:
            raise CheckpointError(
                f"{run_dir / name} is from step {step} but {STATE} is from step {state['step']}: "
                "the checkpoint was interrupted while being written"
            )
    _load_model_weights(model, run_dir / MODEL)
    tensors = _load_tensors(run_dir / OPTIMIZER)
    rng = tensors.pop("rng.torch", None)
    unflatten_optimizer(optimizer, tensors, state["optimizer"])
    if rng is not None:
        torch.set_rng_state(rng)
    return state


def read_step(path: Path) -> int | None:
    """The step stored in a safetensors file's metadata (None when absent)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{path} could not be read (truncated or corrupt): {error}") from error
    return int(meta["step"]) if "step" in meta else None


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{path} could not be read (truncated or corrupt): {error}") from error


def _load_model_weights(model: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import load_model

    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except (SafetensorError, OSError, RuntimeError) as error:
        raise CheckpointError(f"{path} does not fit the model: {error}") from error
    if missing or unexpected:
        raise CheckpointError(
            f"{path} does not match the model: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )


# ----------------------------------------------------------------------------- optimizer state


def flatten_optimizer(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """optimizer.state_dict() split into safetensors tensors ("state.{i}.{key}") and JSON scalars."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalar_state: dict[str, dict[str, Any]] = {}
    for index, entries in sd["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{key}"] = value.detach().clone().contiguous()
            else:
                scalar_state.setdefault(str(index), {})[key] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalar_state": scalar_state}


def unflatten_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                        scalars: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = value
    for index, entries in scalars.get("scalar_state", {}).items():
        state.setdefault(int(index), {}).update(entries)
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in scalars["param_groups"]]
    try:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError) as error:
        raise CheckpointError(f"the saved optimizer state does not fit this model: {error}") from error


# ----------------------------------------------------------------------------- metrics.jsonl


def write_metrics(run_dir: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Rewrite metrics.jsonl atomically with `records` (one JSON object per line)."""
    atomic_write_text(Path(run_dir) / METRICS, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of metrics.jsonl ([] when the file does not exist yet)."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        return []
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise CheckpointError(f"{path} line {number} is not valid JSON: {error}") from error
    return records
