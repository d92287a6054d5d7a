"""Unit functions for the grid-engine tests (a module of their own so that spawned processes and
Ray actors import them by name)."""

import os
from pathlib import Path

import torch

CALLS: list[str] = []   # specs computed in this process (in-process runs only)


def linear_unit(model, inputs, spec):
    """Rows [a, b) of inputs["x"] through the model; dies (os._exit) on its first attempt at the
    unit inputs["die_at"] when inputs["marker"] names a file that does not exist yet."""
    a, b = spec["rows"]
    if inputs.get("die_at") == a and not Path(inputs["marker"]).exists():
        Path(inputs["marker"]).write_text("died once")
        os._exit(3)
    CALLS.append(f"{a}-{b}")
    return {"y": model(inputs["x"][a:b]), "rows": torch.tensor([a, b])}


def raising_unit(model, inputs, spec):
    raise ArithmeticError(f"unit {spec['rows']} cannot be computed")


def slow_unit(model, inputs, spec):
    """A unit that takes inputs["seconds"]: long enough for every worker of a cluster to start."""
    import time

    time.sleep(inputs["seconds"])
    return linear_unit(model, inputs, spec)
