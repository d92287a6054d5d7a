"""Committed runs: the finished runs a reproduction needs, kept in the repository so that a later
session (or a user) continues instead of retraining.

    commit_run(outcome, results_dir, extra={"cpu_seconds": ...}) -> results_dir/<label>
    commit_finished(claim_module, scale, out, results_dir) -> [labels committed]
    committed_outcome(run, results_dir, out_dir, device) -> Outcome or None
    committed_directories(root) -> [Path]   every committed run, unfinished copy and sweep table (manifests)
    commit_unfinished(claim_module, scale, out, results_dir) -> [labels copied]
    keep_unfinished(run, run_dir, results_dir)     the same for one run (reproduce(keep_unfinished=True))
    resume_unfinished(run, results_dir, run_dir, device) -> True when run_dir was seeded from it

Layout: results/reproduce/<claim>-<scale>/<label>/ (`results_dir(name, scale)`), per run

    config.json        the run's config (model, task, train, seed, versions) + "weights_sha256"
    model.safetensors  the final weights (no optimizer state: a committed run is final)
    metrics.jsonl      the training and evaluation records
    outcome.json       status, lr, curriculum length reached, in-distribution accuracy, steps, retries,
                       wall seconds, and whatever `extra` the committer adds (CPU seconds, load)
    reproduce.json     the claim's measurement cache (interp.reproduce.engine.measured), when present
    early_stop.json, train_time.json   as in the training run directory, when present
    attempts/<dir>/    metrics.jsonl (and collapsed.json) of each attempt before the one committed: a run
                       that diverged or collapsed and finished in a retry at a lower lr keeps the record
    manifest.json      the sha256 of every other file (interp.reproduce.manifest), written last

`interp reproduce` looks here before training a run: a committed run whose config is the one the
plan would train (every field but the device) is loaded (`models.load`, sha256-checked) and not
retrained; a committed run with another config is ignored (reported) and the run trains as usual.
Before anything of it is read, its files are checked against its manifest: a file edited, missing or
added after the commit is refused (EditedResults, naming the file), and so is a config without the
weights' digest; only the measurement cache (reproduce.json), which the engine can derive again, is
measured again instead (said in the log). Unfinished copies and sweep tables carry manifests too.

Unfinished runs (medium profiles take CPU hours; a session can end, or a machine go, mid-run):
`commit_unfinished` copies the latest checkpoint of each started, unfinished run into
results/<claim>-<scale>/unfinished/<label>/ (config.json, checkpoint.json, the checkpoint it names:
weights, optimizer and RNG state, trainer_state.json; metrics.jsonl; collapsed.json when the run
collapsed), replacing an older copy; a retry at a lower lr is kept as unfinished/<label>-lr<lr>/.
Before training a run, `interp reproduce` seeds its run directory from there when that copy is of
the plan's config and further along than the run directory (`resume_unfinished`); the run then
resumes from that step bit for bit, as from its own checkpoint. A run committed as finished drops
its unfinished copy.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
from pathlib import Path
from typing import Any

import models
from interp.training import checkpoint as ckpt
from interp.training.train import field_defaults, task_record
from interp.reproduce.manifest import MANIFEST, EditedResults, check_manifest, write_manifest
from interp.reproduce.plan import COLLAPSE_FILE, Outcome, train_config
from interp.sweep.table import RESULTS as SWEEP_TABLE
from models.storage.paths import inside, sha256_of
from models.registry import WEIGHTS_SHA256, weights_file
from models.storage.writer import copy_file

RESULTS = Path(__file__).resolve().parents[2] / "results" / "reproduce"
UNFINISHED = "unfinished"       # results/<claim>-<scale>/unfinished/<label>/: an unfinished run's last checkpoint
OUTCOME = "outcome.json"
MEASURES = "reproduce.json"     # engine.CACHE
OPTIONAL = (MEASURES, "early_stop.json", "train_time.json")
ATTEMPTS = "attempts"   # the records of the attempts before the one committed (retries)
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
    copy_file(weights, target / "model.safetensors")
    config = ckpt.read_config(source)
    ckpt.write_json(target / ckpt.CONFIG, {**config, WEIGHTS_SHA256: sha256_of(target / "model.safetensors")})
    copy_file(source / ckpt.METRICS, target / ckpt.METRICS)
    for name in OPTIONAL:
        if (source / name).exists():
            copy_file(source / name, target / name)
    _keep_earlier_attempts(outcome.run, source, target / ATTEMPTS)
    row = outcome.row()
    ckpt.write_json(target / OUTCOME, {"status": outcome.status, "lr": outcome.lr,
                                       "length_reached": outcome.length_reached,
                                       "in_distribution": outcome.in_distribution, "steps": outcome.steps,
                                       "retries": outcome.retries, "seconds": outcome.seconds,
                                       "trained_in": source.name, "row": row, **(extra or {})})
    write_manifest(target)
    return target


def _keep_earlier_attempts(run, source: Path, into: Path) -> None:
    """The training record (metrics.jsonl, collapsed.json) of every attempt of `run` beside `source` (the
    attempt committed) into `into`/<attempt directory name>."""
    for attempt in attempt_dirs(run, source.parent):
        if attempt == source or not (attempt / ckpt.METRICS).is_file():
            continue
        for name in (ckpt.METRICS, COLLAPSE_FILE):
            if (attempt / name).is_file():
                (into / attempt.name).mkdir(parents=True, exist_ok=True)
                copy_file(attempt / name, into / attempt.name / name)


def finished(run, run_dir: Path) -> bool:
    """run_dir holds a run that trained all its steps or stopped early at fit."""
    if (run_dir / "early_stop.json").exists():
        return True
    pointer = ckpt.read_pointer(run_dir) if (run_dir / ckpt.POINTER).exists() else None
    return bool(pointer) and pointer["step"] >= run.train["steps"]


def attempt_dirs(run, root: Path) -> list[Path]:
    """root/<label> and the directories of its retries at a lower lr (root/<label>-lr<lr>, see
    engine.train_run) that exist."""
    retry = re.compile(re.escape(run.label) + r"-lr[0-9.e+-]+")
    root = Path(root)
    retries = sorted(p for p in root.glob(glob.escape(run.label) + "-lr*") if retry.fullmatch(p.name)) \
        if root.is_dir() else []
    return [root / run.label, *retries]


def any_attempt_finished(run, root: Path) -> bool:
    """The run finished under root, at its first lr or in a retry."""
    return any(finished(run, run_dir) for run_dir in attempt_dirs(run, root))


def commit_unfinished(claim, scale: str, out: str | Path, results: str | Path | None = None,
                      labels=None) -> list[str]:
    """Copy the latest checkpoint of every started, unfinished run of claim.plan(scale) under out/runs
    (those in `labels` only, when given; each retry at a lower lr too) into
    results/unfinished/<its directory's name>, replacing an older copy (see the module docstring);
    returns the directory names copied. Safe while the run trains."""
    kept = results_dir(claim.NAME, scale) if results is None else Path(results)
    return [run_dir.name for run in claim.plan(scale).runs if labels is None or run.label in labels
            for run_dir in attempt_dirs(run, Path(out) / "runs") if keep_unfinished(run, run_dir, kept)]


def keep_unfinished(run, run_dir: Path, results: str | Path) -> bool:
    """Copy run_dir's last checkpoint (and its collapse marker, if any) into
    results/unfinished/<run_dir's name> (the run's label, or label-lr<lr> for a retry) when the run
    has started and is not finished; returns whether it did."""
    if not (run_dir / ckpt.POINTER).is_file() or finished(run, run_dir):
        return False
    _snapshot(run_dir, Path(results) / UNFINISHED / run_dir.name)
    return True


def _snapshot(source: Path, target: Path, attempts: int = 3) -> None:
    """source's config, checkpoint pointer, the checkpoint it names and metrics into target, swapped
    in whole (a staging sibling renamed over it). A trainer that moves on to a newer checkpoint
    while the copy runs removes the old one: copy again (at most `attempts` times)."""
    staging = target.with_name(f".{target.name}.staging")
    for _ in range(attempts):
        pointer = ckpt.read_pointer(source)
        if staging.exists():
            shutil.rmtree(staging)
        try:
            shutil.copytree(inside(source, pointer["path"]), staging / pointer["path"], symlinks=True)
        except FileNotFoundError:
            continue
        for name in (ckpt.CONFIG, ckpt.METRICS):   # metrics.jsonl only grows; a resume truncates it to the step
            copy_file(inside(source, name), staging / name)
        if (source / COLLAPSE_FILE).is_file():
            copy_file(inside(source, COLLAPSE_FILE), staging / COLLAPSE_FILE)
        ckpt.write_json(staging / ckpt.POINTER, pointer)
        write_manifest(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        return
    raise ckpt.CheckpointError(f"{source} moved to a newer checkpoint during each of {attempts} copies; try again")


def resume_unfinished(run, results: str | Path, run_dir: Path, device: str = "cpu", log=print,
                      lr: float | None = None) -> bool:
    """Seed run_dir from results/unfinished/<run_dir's name> when that copy has the config the plan
    would train at `lr` (default: the run's first learning rate; a retry's directory is
    label-lr<lr>) and a later step than run_dir's own checkpoint (or run_dir has none); returns
    whether it did. run_dir's older progress is replaced."""
    source = Path(results) / UNFINISHED / run_dir.name
    if not (source / ckpt.POINTER).is_file():
        return False
    check_manifest(source)
    saved = ckpt.read_pointer(source)
    differences = [line for line in ckpt.config_differences(ckpt.read_config(source),
                                                            expected_config(run, float(run.train["lr"] if lr is None
                                                                                       else lr), device),
                                                            field_defaults())
                   if not line.startswith(IGNORED)]
    if differences:
        log(f"{run.label}: the unfinished run in {source} has another config ({'; '.join(differences[:3])}); not used")
        return False
    own = ckpt.read_pointer(run_dir) if (run_dir / ckpt.POINTER).is_file() else None
    if own is not None and own["step"] >= saved["step"]:
        return False
    if run_dir.is_dir() and not run_dir.is_symlink():
        shutil.rmtree(run_dir)
    shutil.copytree(source, run_dir, symlinks=True, ignore=shutil.ignore_patterns(MANIFEST))
    was = "" if own is None else f"; this run directory was at step {own['step']}"
    log(f"{run.label}: resuming from the unfinished run in {source} (step {saved['step']}{was})")
    return True


def expected_config(run, lr: float, device: str) -> dict[str, Any]:
    """The config.json entries the engine would write for `run` at learning rate `lr`."""
    task = run.task_object()
    model = models.preset_config(run.preset, vocab_size=task.vocab_size, **run.model)
    cfg = train_config(run, lr, device)
    return {"model": model.to_dict(), "task": task_record(task), "train": cfg.to_dict(), "seed": cfg.seed}


def committed_outcome(run, results: str | Path, out_dir: Path, device: str = "cpu", log=print):
    """The engine.Outcome of `run` from results/<label> when it is committed with the config the plan
    would train; None when it is not committed or its config differs (said in `log`)."""

    source = Path(results) / run.label
    if not os.path.lexists(source / OUTCOME) and not os.path.lexists(source / MANIFEST):
        return None       # not committed (a manifest without its outcome.json is a removed file: refused below)
    cache_edited = bool(check_manifest(source, allowed=(MEASURES,)))
    saved = ckpt.read_json(source / OUTCOME)
    differences = [line for line in ckpt.config_differences(ckpt.read_config(source),
                                                            expected_config(run, saved["lr"], device), field_defaults())
                   if not line.startswith(IGNORED)]
    if differences:
        log(f"{run.label}: the committed run in {source} has another config ({'; '.join(differences[:3])}); training")
        return None
    if not ckpt.read_config(source).get(WEIGHTS_SHA256):
        raise EditedResults(f"{source / ckpt.CONFIG} records no {WEIGHTS_SHA256}: a committed run's weights must "
                            "carry their digest")
    if cache_edited:
        log(f"{run.label}: the committed {source / MEASURES} does not match the run's manifest; measuring again")
    task = run.task_object()
    return Outcome(run, saved["status"], out_dir / run.label, saved["lr"], saved["length_reached"],
                   saved["in_distribution"], list(saved["retries"]), saved["seconds"], saved["steps"],
                   models.load(source, device).eval(), task, ckpt.read_metrics(source), committed=source,
                   committed_cache_edited=cache_edited)


def committed_directories(root: str | Path) -> list[Path]:
    """Every directory under root (results/reproduce) that carries a manifest: each committed run
    (<claim>-<scale>/<label>, with outcome.json), each unfinished copy (<claim>-<scale>/unfinished/<label>,
    with checkpoint.json) and each sweep table (<claim>-<scale>/<sweep>, with results.jsonl)."""
    found = []
    for claim in sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.is_symlink()):
        for entry in sorted(p for p in claim.iterdir() if p.is_dir() and not p.is_symlink()):
            if entry.name == UNFINISHED:
                found += sorted(p for p in entry.iterdir() if (p / ckpt.POINTER).is_file())
            elif (entry / OUTCOME).is_file() or (entry / SWEEP_TABLE).is_file():
                found.append(entry)
    return found
