"""check_device(device): a torch device that exists here, or one line naming those that do."""

from __future__ import annotations

import torch


def available_devices() -> list[str]:
    """Devices this torch build and machine can run on: cpu, cuda:0.. (and mps where present)."""
    names = ["cpu"]
    if torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        names.append("mps")
    return names


def check_device(device: str | torch.device, argument: str = "device") -> torch.device:
    """torch.device(device) if it can be used here; else ValueError naming `argument`, the value and
    the available devices (TypeError for a value that is no device string)."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{argument} must be a device string such as 'cpu' or 'cuda:0'; got {device!r}")
    available = available_devices()
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"{argument} {device!r} is not a torch device; available: {', '.join(available)}") from None
    if parsed.type == "cpu":
        return parsed
    name = f"{parsed.type}:{parsed.index if parsed.index is not None else 0}" if parsed.type == "cuda" else parsed.type
    if name not in available:
        why = (f"this torch {torch.__version__} was built without CUDA" if parsed.type == "cuda"
               and not torch.backends.cuda.is_built() else "it is not present on this machine")
        raise ValueError(f"{argument} {str(device)!r} is not available ({why}); available: {', '.join(available)}")
    return parsed
