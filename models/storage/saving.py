"""save(model, run_dir): a model as a directory `models.load` rebuilds bit for bit (config.json and
model.safetensors, each written atomically), with its tokenizer's files when it has one. Apart from models.registry so that a model's own
`save` method (models.backbone) and the registry, which builds models, need not import each other.

    save_weights(model, path, metadata=None)     its state dict as one safetensors file
    save_tokenizer(tokenizer, run_dir)            a transformers tokenizer's files (save_pretrained's)
    load_weights(model, path, device="cpu") -> (missing, unexpected) names

The file format is safetensors.torch.save_model's: one name per tied group (the first in sorted
order; the others recorded in the metadata as dropped for it) and every tensor contiguous. It is
written here rather than by save_model / load_model because those locate tied tensors through
`tensor.view(-1)`, which input-major weights (models.layout) refuse."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from models.storage import writer
from models.config import ModelConfig
from models.storage.paths import sha256_of

WEIGHTS_SHA256 = "weights_sha256"   # config.json entry of a model directory written by `save`


def save(model, run_dir: str | Path, overwrite: bool = False, **info: Any) -> Path:
    """Write `model` as a run directory that `load` rebuilds bit for bit: config.json
    ({"model": its ModelConfig, **info, "weights_sha256": the digest `load` checks}, info
    JSON-serialisable, e.g. where it came from) and model.safetensors (its weights in their
    dtype), each written atomically; a model with a tokenizer (model.tokenizer: models.from_pretrained
    of a checkpoint with tokenizer files, or set_tokenizer) also its tokenizer's files
    (`save_tokenizer`), which `models.load` attaches again and `interp patch / circuit --prompts`
    read. An existing model.safetensors (a training run's, say) is replaced only with overwrite=True."""
    if not isinstance(model, torch.nn.Module) or not isinstance(getattr(model, "cfg", None), ModelConfig):
        raise TypeError(f"model must be a SequenceModel; got {type(model).__name__}")
    run_dir = Path(run_dir)
    if (run_dir / "model.safetensors").exists() and not overwrite:
        raise FileExistsError(f"{run_dir / 'model.safetensors'} exists; pass overwrite=True to replace it")
    run_dir.mkdir(parents=True, exist_ok=True)
    save_weights(model, run_dir / "model.safetensors")
    if getattr(model, "tokenizer", None) is not None:
        save_tokenizer(model.tokenizer, run_dir)
    record = {"model": model.cfg.to_dict(), **info, WEIGHTS_SHA256: sha256_of(run_dir / "model.safetensors")}
    writer.write_json(run_dir / "config.json", record)
    return run_dir


def save_tokenizer(tokenizer, run_dir: str | Path) -> list[Path]:
    """The files of a transformers tokenizer (its save_pretrained's: tokenizer.json,
    tokenizer_config.json, ...) written into run_dir through models.storage.writer.write_files:
    each a regular file renamed into place (a link there replaced, never followed; a link or a
    directory save_pretrained made refused). Returns their paths."""
    if not callable(getattr(tokenizer, "save_pretrained", None)):
        raise TypeError(f"model.tokenizer must be a transformers tokenizer (with save_pretrained) to be saved with the "
                        f"model; got {type(tokenizer).__name__}")
    return writer.write_files(run_dir, lambda tmp: tokenizer.save_pretrained(tmp), "tokenizer")


def tied_groups(model: torch.nn.Module) -> list[list[str]]:
    """The state-dict names that hold one tensor (sorted), per tensor held under more than one name."""
    groups: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), []).append(name)
    return [sorted(names) for names in groups.values() if len(names) > 1]


def save_weights(model: torch.nn.Module, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """model's state dict into the safetensors file `path` (the module docstring's format), written
    atomically (models.storage.writer)."""
    from safetensors.torch import save_file

    state = model.state_dict()
    metadata = dict(metadata or {})
    for kept, *dropped in tied_groups(model):
        for name in dropped:
            metadata.setdefault(name, kept)
            del state[name]
    tensors = {name: tensor.contiguous() for name, tensor in state.items()}
    writer.write_file(path, lambda tmp: save_file(tensors, tmp, metadata=metadata or None))


def load_weights(model: torch.nn.Module, path: str | os.PathLike, device: str = "cpu") -> tuple[list[str], list[str]]:
    """Fill model from the safetensors file `path` in place (each parameter keeps its layout; a
    tied group from whichever of its names the file holds); returns the names of the model the
    file did not fill and the file's names the model does not have."""
    from safetensors.torch import load_file

    state = load_file(str(path), device=device)
    missing, unexpected = model.load_state_dict(state, strict=False)
    filled = {name for group in tied_groups(model) if set(group) & set(state) for name in group}
    return sorted(set(missing) - filled), sorted(unexpected)

