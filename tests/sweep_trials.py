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


def n_star_fake(params, run_dir):
    """Converges iff n >= 10 * length (joint: 15); the joint model's OOD accuracy falls with its seed."""
    target = 15 if params["length"] == "joint" else 10 * params["length"]
    row = {"converged": params["n"] >= target, "val_loss": 0.001 * (1 + params["seed"])}
    row.update({f"ood_acc_{n}": 0.9 - 0.1 * params["seed"] for n in params["ood_lengths"]})
    return row
