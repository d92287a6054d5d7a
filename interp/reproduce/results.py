"""Committed runs: the finished runs a reproduction needs, kept in the repository so that a later
session (or a user) continues instead of retraining.

    commit_run(outcome, results_dir, extra={"cpu_seconds": ...}) -> results_dir/<label>
    commit_finished(claim_module, scale, out, results_dir) -> [labels committed]
    committed_outcome(run, results_dir, out_dir, device) -> Outcome or None

Layout: results/reproduce/<claim>-<scale>/<label>/ (`results_dir(name, scale)`), per run

    config.json        the run's config (model, task, train, seed, versions) + "weights_sha256"
    model.safetensors  the final weights (no optimizer state: a committed run is final)
    metrics.jsonl      the training and evaluation records
    outcome.json       status, lr, curriculum length reached, in-distribution accuracy, steps, retries,
                       wall seconds, and whatever `extra` the committer adds (CPU seconds, load)
    reproduce.json     the claim's measurement cache (interp.reproduce.engine.measured), when present
    early_stop.json, train_time.json   as in the training run directory, when present

`interp reproduce` looks here before training a run: a committed run whose config is the one the
plan would train (every field but the device) is loaded (`models.load`, sha256-checked) and not
retrained; a committed run with another config is ignored (reported) and the run trains as usual.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import models
from interp.training import checkpoint as ckpt
from interp.training.train import field_defaults, task_record
from models.paths import sha256_of
from models.registry import WEIGHTS_SHA256, weights_file

RESULTS = Path(__file__).resolve().parents[2] / "results" / "reproduce"
OUTCOME = "outcome.json"
MEASURES = "reproduce.json"     # engine.CACHE
OPTIONAL = (MEASURES, "early_stop.json", "train_time.json")
IGNORED = ("train.device",)     # a run trained on the CPU is the same run on a GPU


def results_dir(name: str, scale: str, root: str | Path | None = None) -> Path:
    return Path(root or RESULTS) / f"{name}-{scale}"


def commit_run(outcome, results: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """Copy the finished run behind `outcome` (an engine.Outcome that fit or did not fit) into
    results/<label>; returns that directory. A diverged run has no weights to keep: ValueError."""
    if outcome.status not in ("fit", "did not fit") or outcome.run_dir is None:
        raise ValueError(f"only a trained run can be committed; {outcome.run.label} is {outcome.status!r}")
    source, target = Path(outcome.run_dir), Path(results) / outcome.run.label
    target.mkdir(parents=True, exist_ok=True)
    weights = weights_file(source)
    shutil.copyfile(weights, target / "model.safetensors")
    config = ckpt.read_config(source)
    ckpt.write_json(target / ckpt.CONFIG, {**config, WEIGHTS_SHA256: sha256_of(target / "model.safetensors")})
    shutil.copyfile(source / ckpt.METRICS, target / ckpt.METRICS)
    for name in OPTIONAL:
        if (source / name).exists():
            shutil.copyfile(source / name, target / name)
    row = outcome.row()
    ckpt.write_json(target / OUTCOME, {"status": outcome.status, "lr": outcome.lr,
                                       "length_reached": outcome.length_reached,
                                       "in_distribution": outcome.in_distribution, "steps": outcome.steps,
                                       "retries": outcome.retries, "seconds": outcome.seconds,
                                       "trained_in": source.name, "row": row, **(extra or {})})
    return target


def finished(run, run_dir: Path) -> bool:
    """run_dir holds a run that trained all its steps or stopped early at fit."""
    if (run_dir / "early_stop.json").exists():
        return True
    pointer = ckpt.read_pointer(run_dir) if (run_dir / ckpt.POINTER).exists() else None
    return bool(pointer) and pointer["step"] >= run.train["steps"]


def commit_finished(claim, scale: str, out: str | Path, results: str | Path | None = None,
                    labels=None, device: str = "cpu", extra: dict[str, dict] | None = None) -> list[str]:
    """Commit every finished run of claim.plan(scale) under out/runs (those in `labels` only, when
    given) with its measurement cache; extra: {label: fields for outcome.json}. Unfinished runs are
    left alone; returns the labels committed."""
    from interp.reproduce.engine import measured, train_run

    plan, done = claim.plan(scale), []
    target = results_dir(claim.NAME, scale) if results is None else Path(results)
    for run in plan.runs:
        if (labels is not None and run.label not in labels) or not finished(run, Path(out) / "runs" / run.label):
            continue
        outcome = train_run(run, Path(out) / "runs", device, False, plan.fit_metric, plan.fit_n, plan.early_stop)
        outcome.measures = measured(outcome, claim, plan, claim.NAME)
        commit_run(outcome, target, (extra or {}).get(run.label))
        done.append(run.label)
    return done


def expected_config(run, lr: float, device: str) -> dict[str, Any]:
    """The config.json entries the engine would write for `run` at learning rate `lr`."""
    from interp.reproduce.engine import train_config

    task = run.task_object()
    model = models.preset_config(run.preset, vocab_size=task.vocab_size, **run.model)
    cfg = train_config(run, lr, device)
    return {"model": model.to_dict(), "task": task_record(task), "train": cfg.to_dict(), "seed": cfg.seed}


def committed_outcome(run, results: str | Path, out_dir: Path, device: str = "cpu", log=print):
    """The engine.Outcome of `run` from results/<label> when it is committed with the config the plan
    would train; None when it is not committed or its config differs (said in `log`)."""
    from interp.reproduce.engine import Outcome

    source = Path(results) / run.label
    if not (source / OUTCOME).is_file():
        return None
    saved = ckpt.read_json(source / OUTCOME)
    differences = [line for line in ckpt.config_differences(ckpt.read_config(source),
                                                            expected_config(run, saved["lr"], device), field_defaults())
                   if not line.startswith(IGNORED)]
    if differences:
        log(f"{run.label}: the committed run in {source} has another config ({'; '.join(differences[:3])}); training")
        return None
    task = run.task_object()
    return Outcome(run, saved["status"], out_dir / run.label, saved["lr"], saved["length_reached"],
                   saved["in_distribution"], list(saved["retries"]), saved["seconds"], saved["steps"],
                   models.load(source, device).eval(), task, ckpt.read_metrics(source), committed=source)
