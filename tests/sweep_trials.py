"""Trial functions for the sweep tests (a module of their own so that spawned and Ray workers can
import them by name)."""

import os
from pathlib import Path


def count_call(run_dir):
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(run_dir) / "calls", "a") as handle:
        handle.write("x\n")


def square(params, run_dir):
    """Deterministic arithmetic; counts its calls in run_dir/calls (one line per call)."""
    count_call(run_dir)
    return {"value": params["x"] ** 2 + params.get("offset", 0), "converged": params["x"] >= params.get("n0", 0)}


def dies_once(params, run_dir):
    """Kills its own worker (os._exit) on its first attempt when params["die"]; fine afterwards."""
    marker = Path(run_dir) / "died"
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    if params.get("die") and not marker.exists():
        marker.write_text("1")
        os._exit(3)
    return square(params, run_dir)


def always_dies(params, run_dir):
    if params.get("die"):
        os._exit(4)
    return square(params, run_dir)


def raises(params, run_dir):
    if params.get("bad"):
        count_call(run_dir)
        raise RuntimeError(f"trial {params['x']} is broken on purpose")
    return square(params, run_dir)


def slow_square(params, run_dir):
    """square, after a pause (so that a test can kill the sweep midway)."""
    import time

    time.sleep(params.get("sleep", 0.3))
    return square(params, run_dir)
