"""The Mixer base class and the mixer registry.

A mixer maps [B, T, d_model] -> [B, T, d_model] causally. Subclasses implement `mix(x)`; the base
class wraps it in `hook_in` and `hook_out`. Recurrent mixers add `hook_state` ([B, T, *state_shape],
the state after each step) and honour state patches through `models.hooks.scan_with_state_hook`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from models.config import ModelConfig
from models.hooks import HookPoint

# mixer name -> (class, default config overrides)
MIXERS: dict[str, tuple[type["Mixer"], dict[str, Any]]] = {}
# model preset name -> (mixer name, default config overrides)
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {}


def register_mixer(name: str, presets: dict[str, dict[str, Any]] | None = None, **defaults: Any):
    """Class decorator: register a mixer under `name` (also a model preset with `defaults`).

    presets: extra model names built on this mixer, each with its own config defaults.
    """

    def decorate(cls: type[Mixer]) -> type[Mixer]:
        if name in MIXERS:
            raise ValueError(f"mixer {name!r} is registered twice")
        MIXERS[name] = (cls, defaults)
        PRESETS[name] = (name, defaults)
        for preset, preset_defaults in (presets or {}).items():
            PRESETS[preset] = (name, preset_defaults)
        cls.mixer_name = name
        return cls

    return decorate


class Mixer(nn.Module):
    """Base sequence mixer: forward(x) = hook_out(mix(hook_in(x)))."""

    mixer_name = "<base>"
    # "auto": fast path unless a hook needs per-step values; "fast" / "instrumented" force one.
    execution_path = "auto"

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer_idx = layer_idx
        self.hook_in = HookPoint()
        self.hook_out = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hook_out(self.mix(self.hook_in(x)))

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        raise NotImplementedError

    def use_instrumented(self, *hooks: HookPoint) -> bool:
        """Whether to take the per-step path: forced, or any of these hook points is in use."""
        if self.execution_path == "instrumented":
            return True
        if self.execution_path == "fast":
            return False
        return any(h.is_active for h in hooks)
