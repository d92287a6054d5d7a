"""The Task protocol and the Batch it returns.

    Task.sample(n, length, seed) -> Batch

Batch fields (torch tensors, batch-first):
    tokens     [N, T] int64      model input
    targets    [N, T] int64      next-token / label targets, aligned with tokens (target at t is
                                  what the model should output at position t)
    loss_mask  [N, T] bool       where the loss (and accuracy) is computed
    states     [N, T, ...]       ground-truth latent state at every position (group element id,
                                  belief vector, ...)
    roles      dict[str, [N] or [N, k] int64]   named positions per example (`key`, `value`,
                                  `query`, `answer`, `reveal`, ...)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch


@dataclass
class Batch:
    tokens: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    states: torch.Tensor
    roles: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n, t = self.tokens.shape
        for name in ("targets", "loss_mask"):
            shape = tuple(getattr(self, name).shape)
            if shape != (n, t):
                raise ValueError(f"Batch.{name} must have shape {(n, t)} like tokens; got {shape}")
        if tuple(self.states.shape[:2]) != (n, t):
            raise ValueError(f"Batch.states must start with {(n, t)}; got {tuple(self.states.shape)}")

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def select(self, index: torch.Tensor | slice) -> "Batch":
        """The examples at `index` (a slice, an index tensor or a bool mask)."""
        return Batch(
            self.tokens[index], self.targets[index], self.loss_mask[index], self.states[index],
            {name: positions[index] for name, positions in self.roles.items()},
        )

    def to(self, device: str | torch.device) -> "Batch":
        return Batch(
            self.tokens.to(device), self.targets.to(device), self.loss_mask.to(device),
            self.states.to(device), {k: v.to(device) for k, v in self.roles.items()},
        )


@runtime_checkable
class Task(Protocol):
    name: str
    vocab_size: int

    def sample(self, n: int, length: int, seed: int) -> Batch: ...
