"""Checks before a training run creates anything: sizes within sanity bounds, a memory estimate
that fits, an output directory that can be written.

    preflight(model_config, cfg, out)      raises Refused (a ValueError) naming the field; the CLI
                                           turns the field into its flag (--batch-size, --n-layers)

Sanity bounds (`BOUNDS`) are far beyond any model this toolkit trains (GPT-3 has 96 layers and
d_model 12288); a value past one is a typo (an extra zero, a 1e8) and would otherwise hang while
the layers are built or end in numpy's MemoryError halfway through a run.

The memory estimate is a lower bound of what one training step holds, so it refuses only runs
that cannot fit: 16 bytes per parameter (float32 weights, gradients and AdamW's two moments),
the activations the backward pass keeps (at least the residual stream in and the mixer output of
every layer, float32, per token), the logits with their softmax and gradient (3 floats per
vocabulary entry per token), and the batch's token, target, mask and state arrays (4 int64 per
token); with finite data also the data set (4 int64 per token of every sequence). It is compared
with the memory available now on the CPU (MemAvailable) or free on the GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from models.config import FIELD_BOUNDS, ModelConfig
from models.memory import available_bytes, format_bytes
from models.size import parameter_count

BOUNDS = {  # field -> largest value a run may ask for (the model's: models.config.FIELD_BOUNDS)
    **{f"model.{name}": bound for name, bound in FIELD_BOUNDS.items()},
    "train.batch_size": 1 << 20, "train.train_length": 1 << 24, "train.eval_size": 1 << 24,
    "train.val_size": 1 << 24, "train.dataset_size": 1 << 30,
}


class Refused(ValueError):
    """A run refused before it starts; `field` names the setting ("train.batch_size", "model.n_layers")."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def preflight(model_config: ModelConfig, cfg, out: str | Path | None) -> None:
    """Refuse (Refused) a run whose sizes are past BOUNDS, whose estimated memory exceeds what is
    available, or whose output directory cannot be created or written (see the module docstring)."""
    check_bounds(model_config, cfg)
    check_memory(model_config, cfg)
    if out is not None:
        check_output_dir(Path(out))


def check_bounds(model_config: ModelConfig, cfg) -> None:
    sections = {"model": model_config, "train": cfg}
    for key, bound in BOUNDS.items():
        section, name = key.split(".")
        _check_bound(key, getattr(sections[section], name))
    if cfg.lengths is not None and max(cfg.lengths) > BOUNDS["train.train_length"]:
        raise Refused("train.lengths", f"lengths {max(cfg.lengths)} is past the sanity bound "
                                       f"{BOUNDS['train.train_length']} (a typo?)")


def check_override_bounds(overrides) -> None:
    """Refused("model.<field>") for a ModelConfig override past BOUNDS, checked before a config is
    built with it (n_layers 2**66 would fail inside ModelConfig with an OverflowError)."""
    for name, value in overrides.items():
        if isinstance(value, int) and not isinstance(value, bool):
            _check_bound(f"model.{name}", value)


def _check_bound(key: str, value) -> None:
    bound, name = BOUNDS.get(key), key.split(".")[1]
    if bound is not None and value is not None and value > bound:
        raise Refused(key, f"{name} {value} is past the sanity bound {bound} (a typo?); a run that large "
                           "would exhaust memory or hang while it is built")


def check_memory(model_config: ModelConfig, cfg) -> None:
    """Refused naming the larger part (the model's size or the batch's) when the lower-bound
    estimate of one training step exceeds the memory available."""
    parameters = parameter_count(model_config)
    weights = 16 * parameters
    length = max(cfg.lengths or [cfg.train_length])
    tokens = cfg.batch_size * length
    per_token = 4 * 2 * model_config.d_model * model_config.n_layers + 4 * 3 * model_config.vocab_size + 8 * 4
    batch = tokens * per_token
    data = 8 * 4 * length * (cfg.dataset_size + cfg.val_size) if cfg.dataset_size is not None else 0
    available = _available(cfg.device)
    estimate = weights + batch + data
    if estimate <= available:
        return
    parts = {"model.d_model": weights, "train.batch_size": batch, "train.dataset_size": data}
    field = max(parts, key=parts.get)
    hint = {"model.d_model": "lower d_model / n_layers", "train.batch_size": "lower batch_size or train_length",
            "train.dataset_size": "lower dataset_size"}[field]
    raise Refused(field, f"training needs at least {format_bytes(estimate)} ({format_bytes(weights)} for the "
                         f"weights, gradients and AdamW moments of {parameters:,} parameters, "
                         f"{format_bytes(batch)} for a batch of {cfg.batch_size} x {length} tokens"
                         + (f", {format_bytes(data)} for the data set" if data else "")
                         + f"), more than the {format_bytes(available)} of memory available on {cfg.device}; {hint}")


def _available(device: str) -> int:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.mem_get_info(torch.device(device))[0]
    return available_bytes()


def check_output_file(out: Path) -> None:
    """Refused("out") unless `out` can be written as a file: not a directory, names the file system
    accepts, in a directory that is (or can be made) writable."""
    _check_names(out)   # before the file system sees them
    check_output_dir(out.parent)
    if out.is_dir():
        raise Refused("out", f"out {str(out)!r} is a directory; name the file to write")


def check_output_dir(out: Path) -> None:
    """Refused("out") unless `out` is a non-empty path with names the file system accepts, and is
    (or can be made) a writable directory."""
    _check_names(out)
    text = str(out)
    existing = out
    try:
        while not existing.exists():
            if existing.is_symlink():
                raise Refused("out", f"out {text!r}: {existing} is a dangling symbolic link")
            existing = existing.parent
    except OSError as error:   # a link loop, a component that is a FIFO's child...
        raise Refused("out", f"out {text[:80]!r}: {error.strerror} ({str(existing)[:80]!r})") from None
    if not existing.is_dir():
        what = "is" if existing == out else f"lies under {str(existing)!r}, which is"
        raise Refused("out", f"out {text!r} {what} a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise Refused("out", f"out {text!r}: {str(existing)!r} is not writable by this user")


def _check_names(out: Path) -> None:
    """Refused("out") for an empty path or a name longer than the file system allows."""
    text = str(out)
    if not text:
        raise Refused("out", f"out must name a directory; got {text!r}")
    max_name = os.pathconf("/", "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
    max_path = os.pathconf("/", "PC_PATH_MAX") if hasattr(os, "pathconf") else 4096
    if len(os.fsencode(os.path.abspath(out))) >= max_path:
        raise Refused("out", f"out {text[:60]!r}... is {len(os.fsencode(os.path.abspath(out)))} bytes long as an "
                             f"absolute path, longer than the {max_path} the file system allows")
    long = [part for part in out.parts if len(os.fsencode(part)) > max_name]
    if long:
        raise Refused("out", f"out {text[:60]!r}...: the name {long[0][:40]!r}... is {len(os.fsencode(long[0]))} "
                             f"bytes, longer than the {max_name} the file system allows")
