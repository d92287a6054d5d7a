"""Helpers every converter uses: config checks that refuse what we cannot represent, and the
source's weights taken one by one with nothing left over (from the source in memory, or from a
checkpoint's files inside `reading`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn


_CHECKPOINT: ContextVar[Any] = ContextVar("checkpoint", default=None)


@contextmanager
def reading(checkpoint) -> Iterator[None]:
    """SourceWeights made inside read their tensors from `checkpoint` (models.interop.checkpoint)."""
    token = _CHECKPOINT.set(checkpoint)
    try:
        yield
    finally:
        _CHECKPOINT.reset(token)


class UnsupportedConfig(ValueError):
    """A source config field holds a value our models cannot represent."""


def unsupported(config: Any, field: str, value: Any, allowed: str) -> UnsupportedConfig:
    return UnsupportedConfig(f"{type(config).__name__}.{field}={value!r} cannot be represented by an "
                             f"instrumented SequenceModel; supported: {allowed}")


def require(config: Any, field: str, *allowed: Any) -> Any:
    """config.field, which must be one of `allowed` (a missing field reads as None)."""
    value = getattr(config, field, None)
    if not any(type(value) is type(a) and value == a for a in allowed):
        raise unsupported(config, field, value, " or ".join(repr(a) for a in allowed))
    return value


def rope_base(config: Any, partial: bool = False) -> float:
    """The rotary base of a transformers config with plain RoPE (rope_parameters of type "default";
    any scaling raises; a partial_rotary_factor other than 1 too unless `partial`: the caller reads it)."""
    params = getattr(config, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        raise unsupported(config, "rope_parameters", params, "rope_type 'default' (no scaling)")
    if not partial and params.get("partial_rotary_factor", 1.0) != 1.0:
        raise unsupported(config, "rope_parameters", params, "partial_rotary_factor 1.0")
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


class SourceWeights:
    """The source model's state dict, taken tensor by tensor (`take`); `check_all_taken` raises
    when a weight was left over (a part of the source our model would silently drop).
    ignore: regular expressions for non-weight buffers (rotary tables, masks).
    `take` returns the source's tensor itself (or the transform of it), never a copy: from_pretrained
    copies what may share the source's memory as it fills our model. Inside `reading(checkpoint)`
    (a source built on the meta device from a checkpoint directory) the tensors are read from the
    checkpoint's files as they are taken."""

    def __init__(self, source: nn.Module, ignore: Iterable[str] = ()) -> None:
        patterns = [re.compile(p) for p in ignore]
        self.tensors = {k: v.detach() for k, v in source.state_dict().items()
                        if not any(p.fullmatch(k) for p in patterns)}
        self.taken: set[str] = set()
        self.source = type(source).__name__
        self.checkpoint = _CHECKPOINT.get()

    def take(self, name: str, transform: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        if name not in self.tensors:
            raise ValueError(f"{self.source} has no weight {name!r} (a converter / source layout mismatch); "
                             f"it has {sorted(self.tensors)[:8]} ...")
        self.taken.add(name)
        tensor = self.checkpoint.read(name) if self.checkpoint is not None else self.tensors[name]
        return transform(tensor) if transform else tensor

    def has(self, name: str) -> bool:
        return name in self.tensors

    def check_all_taken(self) -> None:
        left = sorted(set(self.tensors) - self.taken)
        if left:
            raise UnsupportedConfig(f"{self.source} has weights the conversion would drop: {listed(left)}")


def listed(names: list[str], few: int = 5) -> str:
    """names for a one-line message: the first `few`, then how many in all."""
    shown = ", ".join(repr(n) for n in names[:few])
    return f"[{shown}{f', ... ({len(names)} in all)' if len(names) > few else ''}]" if names else "[]"


def layer_output(output: Any) -> torch.Tensor:
    """A source layer's hidden-state output (transformers layers return a tensor or a tuple)."""
    return output[0] if isinstance(output, (tuple, list)) else output
