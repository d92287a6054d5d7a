"""save(model, run_dir): a model as a directory `models.load` rebuilds bit for bit (config.json and
model.safetensors, each written atomically). Apart from models.registry so that a model's own
`save` method (models.backbone) and the registry, which builds models, need not import each other."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from models.config import ModelConfig
from models.paths import sha256_of

WEIGHTS_SHA256 = "weights_sha256"   # config.json entry of a model directory written by `save`


def save(model, run_dir: str | Path, overwrite: bool = False, **info: Any) -> Path:
    """Write `model` as a run directory that `load` rebuilds bit for bit: config.json
    ({"model": its ModelConfig, **info, "weights_sha256": the digest `load` checks}, info
    JSON-serialisable, e.g. where it came from) and model.safetensors (its weights in their
    dtype), each written atomically. An existing
    model.safetensors (a training run's, say) is replaced only with overwrite=True."""
    from safetensors.torch import save_model

    if not isinstance(model, torch.nn.Module) or not isinstance(getattr(model, "cfg", None), ModelConfig):
        raise TypeError(f"model must be a SequenceModel; got {type(model).__name__}")
    run_dir = Path(run_dir)
    if (run_dir / "model.safetensors").exists() and not overwrite:
        raise FileExistsError(f"{run_dir / 'model.safetensors'} exists; pass overwrite=True to replace it")
    run_dir.mkdir(parents=True, exist_ok=True)
    _atomic_write(run_dir / "model.safetensors", lambda tmp: save_model(model, tmp))
    record = {"model": model.cfg.to_dict(), **info, WEIGHTS_SHA256: sha256_of(run_dir / "model.safetensors")}
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    _atomic_write(run_dir / "config.json", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return run_dir


def _atomic_write(path: Path, write) -> None:
    """write(tmp) fills a temporary file next to `path`, then it replaces `path` in one rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
