"""Run directories: everything needed to rebuild a model and to resume its training exactly.

    run_dir/
      config.json            {"model": ModelConfig dict, "task": {"name", "options"}, "train":
                              TrainConfig dict, "versions": {torch, numpy, python, package}, "seed",
                              "extensions": [{"at_step", "from_steps", "to_steps"}] (runs extended)}
      checkpoint.json        the pointer: {"step": s, "path": "checkpoints/step-000000s"}
      checkpoints/step-000000s/
        model.safetensors      the weights (`models.load(run_dir)` follows the pointer to them)
        optimizer.safetensors  optimizer tensors (AdamW moments, step counts) + the torch RNG state
        trainer_state.json     step, optimizer scalars (param groups), curriculum state, file sizes
                               and sha256 digests, and the length of metrics.jsonl at step s
                               (records and bytes)
      metrics.jsonl          one JSON record per line (training and evaluation), appended as made
      .interp.lock           the writer's lock (models.storage.paths.locked; holds the pid of the last writer)

No pickle anywhere: tensors go to safetensors, scalars to JSON.

Crash safety: a checkpoint becomes visible all at once. `save_checkpoint` first makes the metrics
records up to its step durable (fsync of metrics.jsonl), then writes the three files into a fresh
step directory, and only then switches the pointer. Every file is written by `models.storage.writer` (a
temporary file, fsync, os.replace over the target, fsync of the directory: atomic, and a link at
the target is replaced, never written through). The previous checkpoint stays intact until the switch and is
removed after it. A crash at any point therefore leaves the pointer naming a complete checkpoint
(or no pointer: no checkpoint yet). metrics.jsonl may hold records past the pointer's step (a run
in progress, or one that crashed); `open_metrics(..., keep=...)` on resume truncates it to the
checkpoint's length, so no record is lost or duplicated. Unreferenced step directories and
temporary files left by a crash are removed on resume. Each safetensors file carries its step in
its metadata and trainer_state.json the byte sizes and sha256 digests of both, so a file truncated,
replaced by hand or with a flipped bit is detected and rejected with a clear error rather than
loaded (by `load_checkpoint` and by `models.load`).

A closed world: the step directories, checkpoints/ and metrics.jsonl are reached through
`models.storage.paths.inside`, so a symbolic link below the run directory (checkpoints/ linked elsewhere,
metrics.jsonl linked to another file) or a pointer that climbs out of it is refused with one line
naming it before anything is written, truncated or deleted. Every file read here is a regular
file reached without a link (`read_json`, `read_metrics`, `load_checkpoint`: models.storage.paths.read_regular
and regular_file), so nothing outside the run is read as if it were part of it.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from models.storage.paths import check_sha256, in_place_file, inside, open_appending, read_regular, regular_file, sha256_of
from models.storage.saving import load_weights, save_weights
from models.storage import writer
from models.storage.writer import write_json

CONFIG = "config.json"
POINTER = "checkpoint.json"
CHECKPOINTS = "checkpoints"
MODEL = "model.safetensors"
OPTIMIZER = "optimizer.safetensors"
STATE = "trainer_state.json"
METRICS = "metrics.jsonl"


class CheckpointError(ValueError):
    """A run directory is truncated, corrupt, or does not match what was asked of it."""


def read_json(path: str | Path) -> Any:
    """The JSON in a file of a run directory, read without following a final symbolic link and only
    from a regular file (models.storage.paths.read_regular)."""
    path = Path(path)
    try:
        data = read_regular(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist") from None
    try:
        return json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
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
    path = inside(run_dir, CONFIG)
    config = read_json(path)
    missing = {"model", "task", "train", "seed"} - set(config) if isinstance(config, dict) else None
    if missing is None or missing:
        raise CheckpointError(f"{path} lacks the entries {sorted(missing or [])}; is it a run directory?")
    return config


def config_differences(old: dict, new: dict, defaults: dict[str, dict] | None = None) -> list[str]:
    """Entries (other than package versions) where two run configs differ, as readable lines.

    defaults: {section: {key: default}}; a key the old config lacks counts as equal where the new
    value is its default (a field added to ModelConfig / TrainConfig after the run was made, whose
    default is what the run had).
    """
    lines, defaults = [], defaults or {}
    for section in ("model", "task", "train", "seed"):
        a, b = old.get(section), new.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            known = defaults.get(section, {})
            for key in sorted(set(a) | set(b)):
                if key not in a and key in b and key in known and b[key] == known[key]:
                    continue
                if a.get(key, "<absent>") != b.get(key, "<absent>"):
                    lines.append(f"{section}.{key}: {a.get(key, '<absent>')!r} != {b.get(key, '<absent>')!r}")
        elif a != b:
            lines.append(f"{section}: {a!r} != {b!r}")
    return lines


# ----------------------------------------------------------------------------- checkpoints


def _step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


def read_pointer(run_dir: str | Path) -> dict[str, Any] | None:
    """checkpoint.json ({"step", "path"}) of a run directory; None when no checkpoint exists yet."""
    path = inside(run_dir, POINTER)
    if not path.exists():
        return None
    pointer = read_json(path)
    if (not isinstance(pointer, dict) or not isinstance(pointer.get("step"), int)
            or pointer.get("path") != f"{CHECKPOINTS}/{_step_dir_name(pointer['step'])}"):
        raise CheckpointError(f"{path} is not a checkpoint pointer: {pointer!r}")
    return pointer


def checkpoint_dir(run_dir: str | Path) -> Path:
    """The directory of the run's current checkpoint (the one checkpoint.json names)."""
    pointer = read_pointer(run_dir)
    if pointer is None:
        raise CheckpointError(f"run_dir {str(run_dir)!r} has no {POINTER}: no checkpoint was written yet")
    return inside(run_dir, pointer["path"], what=f"{POINTER} path")


def save_checkpoint(run_dir: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    step: int, extra: dict[str, Any] | None = None,
                    metrics: "MetricsLog | None" = None) -> Path:
    """Write the checkpoint of `step` into a fresh step directory, then point checkpoint.json at it.

    extra: JSON-serialisable trainer state to restore on resume (curriculum, ...).
    metrics: the run's open metrics log; its records so far are made durable first and their count
    and byte length recorded, so a resume truncates metrics.jsonl to exactly this step.
    Returns the new step directory. The previous checkpoint is removed after the switch.
    """
    run_dir = Path(run_dir)
    previous = read_pointer(run_dir)
    if previous is not None and previous["step"] >= step:
        raise CheckpointError(f"run_dir {str(run_dir)!r} already has a checkpoint of step {previous['step']}; "
                              f"cannot write step {step} over it")
    length = metrics.sync() if metrics is not None else {"records": 0, "bytes": 0}
    target = inside(run_dir, CHECKPOINTS, _step_dir_name(step))
    if target.exists():  # an unreferenced leftover of a crash at this very step
        shutil.rmtree(target)
    target.mkdir(parents=True)
    meta = {"step": str(step)}
    tensors, scalars = flatten_optimizer(optimizer)
    tensors["rng.torch"] = torch.get_rng_state()
    writer.write_file(target / OPTIMIZER, lambda tmp: save_file(tensors, tmp, metadata=meta))
    save_weights(model, target / MODEL, metadata=meta)
    state = {
        "step": step,
        "optimizer": scalars,
        "extra": extra or {},
        "files": {name: (target / name).stat().st_size for name in (MODEL, OPTIMIZER)},
        "sha256": {name: sha256_of(target / name) for name in (MODEL, OPTIMIZER)},
        "metrics": length,
    }
    write_json(target / STATE, state)
    writer.fsync_directory(target.parent)
    write_json(run_dir / POINTER, {"step": step, "path": f"{CHECKPOINTS}/{target.name}"})  # the switch
    remove_stale(run_dir)
    return target


def remove_stale(run_dir: str | Path) -> None:
    """Delete step directories other than the current checkpoint's and temporary files of
    interrupted atomic writes (what a crash can leave behind)."""
    run_dir = Path(run_dir)
    pointer = read_pointer(run_dir)
    current = pointer["path"].split("/", 1)[1] if pointer else None
    checkpoints = inside(run_dir, CHECKPOINTS)
    if checkpoints.is_dir():
        for entry in sorted(checkpoints.iterdir()):
            if entry.name != current:   # a link is removed itself, never what it points to
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    for name in (CONFIG, POINTER):
        writer.remove_leftovers(run_dir, name)


def load_checkpoint(run_dir: str | Path, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore model weights, optimizer and torch RNG state of the current checkpoint in place;
    returns its trainer_state.json.

    Raises CheckpointError when there is no checkpoint, or a file is missing, truncated, or from
    another step.
    """
    run_dir = Path(run_dir)
    if read_pointer(run_dir) is None and (run_dir / STATE).is_file():
        raise CheckpointError(
            f"run_dir {str(run_dir)!r} has {STATE} but no {POINTER}: it was written by an older version "
            "(checkpoint files directly in the run directory) and cannot be resumed; start a new run")
    directory = checkpoint_dir(run_dir)
    for name in (STATE, MODEL, OPTIMIZER):
        try:
            regular_file(directory / name)
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {str(directory)!r} has no {name}: the checkpoint is incomplete") from None
    state = read_json(directory / STATE)
    if not isinstance(state, dict) or not {"step", "optimizer", "files", "metrics"} <= set(state):
        raise CheckpointError(f"{directory / STATE} is not a trainer state (keys {sorted(state)})")
    for name, size in state["files"].items():
        actual = (directory / name).stat().st_size
        if actual != size:
            raise CheckpointError(
                f"{directory / name} has {actual} bytes but the checkpoint of step {state['step']} "
                f"wrote {size}: truncated or from another checkpoint"
            )
    for name in (MODEL, OPTIMIZER):
        step = read_step(directory / name)
        if step != state["step"]:
            raise CheckpointError(
                f"{directory / name} is from step {step} but {STATE} is from step {state['step']}: "
                "the checkpoint was modified after it was written"
            )
    digests = state.get("sha256") if isinstance(state.get("sha256"), dict) else {}   # absent: written before
    for name in (MODEL, OPTIMIZER):
        try:
            check_sha256(directory / name, digests.get(name), str(directory / STATE))
        except ValueError as error:
            raise CheckpointError(str(error)) from None
    _load_model_weights(model, directory / MODEL)
    tensors = _load_tensors(directory / OPTIMIZER)
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
    try:
        missing, unexpected = load_weights(model, path)
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


class MetricsLog:
    """metrics.jsonl opened for appending: `append(record)` writes one line and flushes (a live log
    to watch); `sync()` makes everything appended durable and returns its length for a checkpoint."""

    def __init__(self, path: Path, records: int) -> None:
        self.path, self.records = path, records
        self._handle = open_appending(path, "a")

    def append(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps(record, sort_keys=True) + "\n")
        self._handle.flush()
        self.records += 1

    def sync(self) -> dict[str, int]:
        self._handle.flush()
        os.fsync(self._handle.fileno())
        return {"records": self.records, "bytes": self._handle.tell()}

    def close(self) -> None:
        self._handle.close()


def open_metrics(run_dir: str | Path, keep: dict[str, int] | None = None) -> tuple[MetricsLog, list[dict[str, Any]]]:
    """Open metrics.jsonl for appending after truncating it to `keep` (a checkpoint's
    {"records", "bytes"}; None: empty). Returns the log and the records kept."""
    path = in_place_file(run_dir, METRICS)
    keep = keep or {"records": 0, "bytes": 0}
    size = path.stat().st_size if path.exists() else 0
    if size < keep["bytes"]:
        raise CheckpointError(f"{path} has {size} bytes but the checkpoint recorded {keep['bytes']}: "
                              "records up to the checkpoint are missing (truncated by hand?)")
    with open_appending(path, "a+b") as handle:
        handle.truncate(keep["bytes"])
        handle.flush()
        os.fsync(handle.fileno())
    records = read_metrics(run_dir)
    if len(records) != keep["records"]:
        raise CheckpointError(f"{path} holds {len(records)} records up to the checkpoint, which recorded "
                              f"{keep['records']}: the file was modified")
    return MetricsLog(path, len(records)), records


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of metrics.jsonl ([] when the file does not exist yet). A last line without its
    newline (a record being written right now, or cut by a crash) is not a record yet."""
    path = inside(run_dir, METRICS)
    if not os.path.lexists(path):
        return []
    records = []
    try:
        text = read_regular(path).decode("utf-8")
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{path} is not UTF-8 text (corrupt?): {error}") from None
    for number, line in enumerate(text.split("\n")[:-1], start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise CheckpointError(f"{path} line {number} is not valid JSON: {error}") from error
    return records
