"""What a reproduction trains (Run, Plan), what a trained or committed run is (Outcome), and the
TrainConfig a run trains with: the types that the engine (interp.reproduce.engine: training and
measuring) and the committed results (interp.reproduce.results: copying runs in and out of
results/) share, so that neither imports the other."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interp.tasks import make_task
from interp.training.train import TrainConfig

COLLAPSE_FILE = "collapsed.json"   # in a run directory: the run collapsed (engine.collapse), retried at a lower lr


@dataclass
class Run:
    """One training run: a model preset with overrides on a task, and its TrainConfig fields.

    label: unique within the plan (the run directory's name); info: the claim's own tags
    (model label, group, seed, ...) carried into tables.
    """

    label: str
    preset: str
    task: str
    task_options: dict[str, Any]
    model: dict[str, Any]
    train: dict[str, Any]
    info: dict[str, Any] = field(default_factory=dict)

    def task_object(self):
        return make_task(self.task, **self.task_options)


@dataclass
class Plan:
    """What a reproduction trains and measures at one scale.

    sizes: rows {"setting", "value", "source"}: every number, where it comes from ("our choice"
    when no source gives it). settings: measurement settings read by the claim's measure/judge.
    fit_metric(model, task, run, device) -> in-distribution accuracy (default: final-state accuracy
    at the training length on `fit_n` fresh sequences). early_stop: None (train every step) or
    {"accuracy": a, "evals": k} (see the module docstring).
    """

    scale: str
    runs: list[Run]
    sizes: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    fit_metric: Callable | None = None
    fit_n: int = 256
    early_stop: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        rule = self.early_stop
        if rule is not None and (not isinstance(rule, dict) or set(rule) != {"accuracy", "evals"}
                                 or not 0 < rule["accuracy"] <= 1 or not isinstance(rule["evals"], int)
                                 or rule["evals"] < 1):
            raise ValueError(f"Plan.early_stop must be None or {{'accuracy': a in (0, 1], 'evals': k >= 1}}; "
                             f"got {rule!r}")

    def digest(self) -> str:
        text = json.dumps(self.settings, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass
class Outcome:
    """A trained (or failed) run. status: "fit", "did not fit" or "diverged"."""

    run: Run
    status: str
    run_dir: Path | None
    lr: float
    length_reached: int
    in_distribution: float | None
    retries: list[str]
    seconds: float | None                   # wall-clock training seconds, every process that trained it
    steps: int = 0                          # steps trained (fewer than run.train["steps"] after an early stop)
    model: Any = None
    task: Any = None
    metrics: list[dict] = field(default_factory=list)
    measures: dict[str, Any] = field(default_factory=dict)
    committed: Path | None = None           # results/<claim>-<scale>/<label> when loaded from there (not trained)
    committed_cache_edited: bool = False    # its reproduce.json differs from its manifest: measured again

    @property
    def fit(self) -> bool:
        return self.status == "fit"

    def row(self) -> dict[str, Any]:
        return {"run": self.run.label, **self.run.info, "status": self.status, "length reached": self.length_reached,
                "train length": self.run.train["train_length"], "in-dist acc": self.in_distribution,
                "steps": self.steps, "lr": self.lr, "retries": "; ".join(self.retries) or "none",
                "train s": None if self.seconds is None else round(self.seconds, 1)}


def train_config(run: Run, lr: float, device: str) -> TrainConfig:
    fields = dict(run.train, lr=lr, device=device)
    steps = fields["steps"]
    fields.setdefault("warmup", min(50, steps // 10))
    fields.setdefault("checkpoint_every", max(1, steps // 5))   # an interrupted run loses at most a fifth
    fields.setdefault("log_every", max(1, min(10, steps // 10)))
    return TrainConfig(**fields)
