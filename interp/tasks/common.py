"""Argument checks and random generators shared by the task modules."""

from __future__ import annotations

import difflib

import numpy as np
import torch


def make_rng(seed) -> np.random.Generator:
    """A numpy Generator from an int seed (>= 0) or a Generator (used as is)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int or a numpy Generator; got {seed!r}")
    return np.random.default_rng(int(seed))


def check_count(name: str, value, minimum: int = 1) -> int:
    """`value` as an int >= minimum, else ValueError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return int(value)


def check_choice(name: str, value, allowed: tuple[str, ...]) -> str:
    """`value` if it is one of `allowed`, else ValueError with close matches."""
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=2)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}{hint}")
    return value


def check_options(task: str, options: dict, allowed: tuple[str, ...], hints: dict | None = None) -> None:
    """ValueError for option names `task` does not take, with close matches (or `hints[name]`)."""
    for key in options:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=2)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            if hints and key in hints:
                hint = f"; {hints[key]}"
            takes = ", ".join(allowed) if allowed else "no options"
            raise ValueError(f"task {task!r} has no option {key!r} (it takes: {takes}){hint}")


def roles_to_torch(roles: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Role positions as owned, writable int64 tensors (copies, so broadcast views are safe)."""
    return {name: torch.from_numpy(np.array(pos, dtype=np.int64)) for name, pos in roles.items()}
