"""One command per seed claim: `interp reproduce NAME [--scale cpu|medium|paper]` (engine: `engine`).

    reproduce("parity", scale="cpu", out="runs/reproduce/parity-cpu") -> Path of report.html
    names() -> the reproductions

Runs committed under results/reproduce/NAME-SCALE (`results`) are loaded instead of trained, once
their files match their manifest (`manifest`; `python -m interp.reproduce check|write`).
Each reproduction is one module here (its plan of runs, measurements and verdicts); the engine
trains (reusing finished runs, resuming interrupted ones), measures, judges and writes the report.

May import: interp.report, interp.sweep, interp.analysis, interp.training, interp.tasks, models, probes.
Never interp.cli.
"""

from __future__ import annotations

import difflib
import importlib
from pathlib import Path

from interp.reproduce import engine

MODULES = {"error-control": "error_control", "retrieval": "retrieval", "deltanet-heads": "deltanet_heads",
           "parity": "parity", "reveal-gap": "reveal_gap", "selective-copy": "selective_copy",
           "sample-efficiency": "sample_efficiency", "pfsa": "pfsa"}


def names() -> tuple[str, ...]:
    return tuple(MODULES)


def claim_module(name: str):
    """The module of the reproduction `name`; ValueError listing the choices."""
    if name not in MODULES:
        close = difflib.get_close_matches(str(name), names(), n=2)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise ValueError(f"unknown reproduction {name!r}: choose from {', '.join(names())}{hint}")
    return importlib.import_module(f"interp.reproduce.{MODULES[name]}")


def reproduce(name: str, scale: str = "cpu", out: str | Path | None = None, device: str = "cpu",
              progress: bool = True, log=print, results: str | Path | None = None, train: bool = True,
              keep_unfinished: bool = False, executor=None) -> Path:
    """Run the reproduction `name` at `scale` ("quick", "cpu", "medium" where defined, "paper"), loading
    the runs committed under `results` (default results/reproduce/NAME-SCALE); train=False reports on
    the committed and finished runs only; keep_unfinished=True copies each unfinished run's checkpoint
    into `results` after every chunk, for another session to resume; executor (interp.sweep.executors.
    make_executor("local" | "ray", ...)): the runs to train are trained there first, one job per run,
    and the claims come out as in one process (engine's module docstring); see `engine.reproduce`."""
    module = claim_module(name)
    engine.check_scale(scale, module)
    return engine.reproduce(module, scale, out, device, progress, log, results, train, keep_unfinished, executor)


__all__ = ["reproduce", "names", "claim_module", "engine"]
