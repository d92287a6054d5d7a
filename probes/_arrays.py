"""Argument checks and array conversions shared by the probes (numpy arrays or torch tensors in)."""

from __future__ import annotations

import numpy as np
import torch


def as_tensor(name: str, value) -> torch.Tensor:
    """A torch view of a numpy array or tensor (no copy where possible); TypeError otherwise."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    raise TypeError(f"{name} must be a numpy array or a torch tensor; got {type(value).__name__}")


def check_float(name: str, tensor: torch.Tensor) -> None:
    if not tensor.dtype.is_floating_point:
        hint = " (complex states: pass torch.view_as_real(states))" if tensor.dtype.is_complex else ""
        raise TypeError(f"{name} must have a floating dtype; got {tensor.dtype}{hint}")


def check_int(name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer class labels; got dtype {tensor.dtype}")


def check_prefix(states: torch.Tensor, labels: torch.Tensor, labels_name: str = "labels") -> None:
    """labels [N, T] (or any prefix shape P) must index the leading axes of states [*P, *S]."""
    prefix = tuple(labels.shape)
    if states.dim() <= len(prefix) or tuple(states.shape[: len(prefix)]) != prefix:
        raise ValueError(
            f"states {tuple(states.shape)} must start with the shape of {labels_name} {prefix} "
            "and have at least one feature axis after it ([N, T, *S] with labels [N, T])"
        )


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")
    return int(value)


def check_nonnegative(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or not value >= 0:
        raise ValueError(f"{name} must be a non-negative number; got {value!r}")
    return float(value)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()
