"""Sample efficiency N* and the sharing coefficient kappa (docs/sample-efficiency.md).

    conditions(models, tasks, formats, max_length, ...) -> [condition]   lengths 2..L and "joint"
    find_n_star(conditions, configs, runner, n0=16, resolution=0.1) -> [NStar]
    kappa({n: N*_n}, N*_joint) -> float
    kappa_rows(n_stars) -> tidy rows: kappa and the joint model's OOD accuracy per model x format; which seeds
                           carry each N* (carried_by) and each seed's own kappa or its bounds (by_seed, seed_kappas)
    train_trial(params, run_dir) -> row    one finite-data training run (the sweep's trial function)

A condition is a JSON-able dict: model (a preset name), model_options (ModelConfig overrides, e.g.
{"n_layers": 6}), task (a group name: Z5, S5, A4xZ5, ...), format (outcome / cot / acot), length
(an int n, or "joint"), lengths (the training lengths: [n], or 2..L for joint), max_length L,
ood_lengths (joint only: L * ood_factors, default 2L and 4L) and the training options of
TRIAL_TRAIN_KEYS (steps, batch_size, val_size, val_threshold, ...). A trial is a condition plus
n (the training-set size), lr and seed.

N*: the smallest N at which at least one configuration of the grid `configs` (lr x seed) reaches
validation loss below val_threshold within the step budget. Search, per condition: geometric from
n0 (n0, 2 n0, 4 n0, ...) until some configuration converges, then binary search between the last
N at which none did (0 when n0 converges) and the first N at which one did, until
hi - lo <= max(1, resolution * hi); N* is hi. resolution=0 gives the exact smallest N (the search
assumes convergence is monotone in N, which the nested training sets of `interp.training.data`
make likely but do not guarantee). The search stops at n_max or at the condition's data capacity
(for small groups and short lengths the m^n sequences run out); a condition that never converges
gets N* = None. Every round submits one N per open condition (all its configurations) to the
runner at once, so the geometric phases of all conditions run side by side.

The runner is anything callable as runner([trial params]) -> [result rows] in the same order, each
row holding at least "converged" (bool); `interp.sweep` provides executors (local processes, Ray)
that are such callables, with resume and retries. This module never imports interp.sweep.

kappa = sum_{n=2..L} N*_n / N*_joint: > 1 a shared mechanism across lengths, ~1 isolated
per-length solutions, < 1 interference; NaN when any N* is missing, with the bounds that the
searches' limits still give in kappa_low / kappa_high (`kappa_bounds`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Runner = Callable[[list[dict]], list[dict]]

FORMATS = ("outcome", "cot", "acot")
STUDY_MODELS = ("transformer", "lstm", "dense_ssm", "mamba")
TRIAL_TRAIN_KEYS = ("steps", "batch_size", "val_size", "val_threshold", "eval_every", "warmup",
                    "weight_decay", "grad_clip", "data_seed", "max_epochs", "log_every", "checkpoint_every")
CONFIG_KEYS = ("lr", "seed")


def conditions(models: Sequence[str], tasks: Sequence[str], formats: Sequence[str], max_length: int, *,
               model_options: Mapping[str, Mapping[str, Any]] | None = None, min_length: int = 2,
               ood_factors: Sequence[int] = (2, 4), train: Mapping[str, Any] | None = None) -> list[dict]:
    """Every (model, task, format) at each length min_length..max_length and jointly over them."""
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < min_length:
        raise ValueError(f"max_length must be an int >= min_length ({min_length}); got {max_length!r}")
    for name, values in (("models", models), ("tasks", tasks), ("formats", formats)):
        if isinstance(values, str) or not values:
            raise ValueError(f"{name} must be a non-empty list; got {values!r}")
    for fmt in formats:
        if fmt not in FORMATS:
            raise ValueError(f"formats: unknown format {fmt!r}; allowed {', '.join(FORMATS)}")
    unknown = set(train or {}) - set(TRIAL_TRAIN_KEYS)
    if unknown:
        raise ValueError(f"train: unknown options {sorted(unknown)}; allowed {', '.join(TRIAL_TRAIN_KEYS)}")
    options = dict(model_options or {})
    lengths = list(range(min_length, max_length + 1))
    out = []
    for model, task, fmt in itertools.product(models, tasks, formats):
        base = {"model": model, "model_options": dict(options.get(model, {})), "task": task, "format": fmt,
                "max_length": max_length, **dict(train or {})}
        out += [{**base, "length": n, "lengths": [n], "ood_lengths": []} for n in lengths]
        out.append({**base, "length": "joint", "lengths": lengths,
                    "ood_lengths": [max_length * int(f) for f in ood_factors]})
    return out


def grid_configs(lrs: Sequence[float], seeds: Sequence[int]) -> list[dict]:
    """The configuration grid lr x seed as [{"lr", "seed"}]."""
    if not lrs or not seeds:
        raise ValueError(f"lrs and seeds must be non-empty; got lrs={list(lrs)!r}, seeds={list(seeds)!r}")
    return [{"lr": float(lr), "seed": int(seed)} for lr, seed in itertools.product(lrs, seeds)]


@dataclass
class NStarSearch:
    """The search state of one condition: lo fails for every configuration, hi converges for one."""

    n0: int
    resolution: float
    n_max: int
    lo: int = 0
    hi: int | None = None
    exhausted: bool = False

    def __post_init__(self) -> None:
        for name in ("n0", "n_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        if not isinstance(self.resolution, (int, float)) or not 0 <= self.resolution < 1:
            raise ValueError(f"resolution must be a number in [0, 1); got {self.resolution!r}")

    @property
    def done(self) -> bool:
        return self.exhausted or (self.hi is not None and self.hi - self.lo <= max(1, self.resolution * self.hi))

    def next_n(self) -> int | None:
        """The N to try next (None when the search is over)."""
        if self.done:
            return None
        if self.hi is None:
            return min(self.n0 if self.lo == 0 else 2 * self.lo, self.n_max)
        return (self.lo + self.hi) // 2

    def record(self, n: int, converged: bool) -> None:
        if converged:
            self.hi = n if self.hi is None else min(self.hi, n)
        else:
            self.lo = max(self.lo, n)
            if self.hi is None and n >= self.n_max:
                self.exhausted = True


@dataclass
class NStar:
    """The answer for one condition and every trial behind it (result rows, in submission order)."""

    condition: dict
    n_star: int | None
    lo: int
    n_max: int
    trials: list[dict] = field(default_factory=list)

    @property
    def label(self) -> str:
        c = self.condition
        return f"{c['model']}/{c['task']}/{c['format']}/{c['length']}"

    def seed_n_star(self) -> dict[int, tuple[int | None, int]]:
        """{seed: (the smallest N at which that seed converged, None if at no N tried; the largest N tried at
        which it did not, 0 if none)} over every lr. A seed's N is an upper bound on its own N*: the search
        narrows on the N where *some* seed converges, not on each seed's."""
        out: dict[int, tuple[int | None, int]] = {}
        for seed in sorted({int(t["seed"]) for t in self.trials if "seed" in t}):
            rows = [t for t in self.trials if t.get("seed") == seed and "n" in t]
            hit = [t["n"] for t in rows if t.get("converged")]
            miss = [t["n"] for t in rows if not t.get("converged")]
            out[seed] = (min(hit) if hit else None, max(miss, default=0))
        return out

    def carried_by(self) -> list[int]:
        """The seeds that converged at N* (those that carry it)."""
        return sorted({int(t["seed"]) for t in self.trials if t.get("converged") and t.get("n") == self.n_star
                       and "seed" in t}) if self.n_star is not None else []

    def row(self) -> dict:
        c = self.condition
        return {"model": c["model"], "task": c["task"], "format": c["format"], "length": c["length"],
                "max_length": c.get("max_length"), "n_star": self.n_star, "last_failure": self.lo,
                "n_max": self.n_max, "trials": len(self.trials), "carried_by": self.carried_by(),
                "seeds": sorted({int(t["seed"]) for t in self.trials if "seed" in t})}


def find_n_star(conditions: Sequence[Mapping[str, Any]], configs: Sequence[Mapping[str, Any]], runner: Runner, *,
                n0: int = 16, resolution: float = 0.1, n_max: int = 1 << 16,
                capacity: Callable[[Mapping[str, Any]], int | None] | None = None,
                on_round: Callable[[int, int], None] | None = None) -> list[NStar]:
    """N* of every condition (module docstring); `capacity(condition)` bounds a condition's N
    (default: the data capacity of `interp.training.data`); on_round(round, trials) is called
    before each round is run."""
    if not conditions:
        raise ValueError("conditions must be non-empty")
    if not configs:
        raise ValueError("configs must be non-empty (a grid of lr x seed)")
    for index, config in enumerate(configs):
        missing = [k for k in CONFIG_KEYS if k not in config]
        if missing:
            raise ValueError(f"configs[{index}] lacks {missing}; each configuration needs lr and seed")
    capacity = capacity or data_capacity
    searches = []
    for condition in conditions:
        cap = capacity(condition)
        searches.append(NStarSearch(n0, resolution, n_max if cap is None else max(1, min(n_max, cap))))
    trials: list[list[dict]] = [[] for _ in conditions]
    round_index = 0
    while True:
        batch, owners = [], []
        for index, (condition, search) in enumerate(zip(conditions, searches)):
            n = search.next_n()
            if n is not None:
                batch += [{**condition, **config, "n": n} for config in configs]
                owners += [(index, n)] * len(configs)
        if not batch:
            break
        if on_round is not None:
            on_round(round_index, len(batch))
        rows = runner(batch)
        if len(rows) != len(batch):
            raise RuntimeError(f"the runner returned {len(rows)} rows for {len(batch)} trials")
        outcome: dict[tuple[int, int], bool] = {}
        for (index, n), row in zip(owners, rows):
            trials[index].append(row)
            outcome[(index, n)] = outcome.get((index, n), False) or bool(row.get("converged"))
        for (index, n), converged in outcome.items():
            searches[index].record(n, converged)
        round_index += 1
    return [NStar(dict(c), s.hi, s.lo, s.n_max, t) for c, s, t in zip(conditions, searches, trials)]


def data_capacity(condition: Mapping[str, Any]) -> int | None:
    from interp.tasks import make_task
    from interp.training.data import capacity
    from interp.training.train import TrainConfig

    task = make_task(condition["task"], format=condition["format"])
    return capacity(task, condition["lengths"], int(condition.get("val_size", TrainConfig.val_size)))


def kappa(n_star_by_length: Mapping[int, float | None], n_star_joint: float | None) -> float:
    """sum_n N*_n / N*_joint; NaN when any N* is None (not found within the search's bound)."""
    if not n_star_by_length:
        raise ValueError("n_star_by_length must hold at least one length")
    values = list(n_star_by_length.values()) + [n_star_joint]
    if any(v is None for v in values):
        return math.nan
    if any(v <= 0 for v in values):
        raise ValueError(f"N* values must be positive; got {dict(n_star_by_length)!r} and joint {n_star_joint!r}")
    return sum(n_star_by_length.values()) / n_star_joint


def kappa_bounds(per_length: Sequence[NStar], joint: NStar) -> tuple[float, float]:
    """(low, high) bounds on kappa when some N* was not found: a search that failed up to its
    bound b has N* > b (>= b + 1, infinite when the data ran out). Joint found, lengths missing:
    kappa >= (found + sum (b_n + 1)) / N*_joint. Lengths found, joint missing: kappa <=
    sum N*_n / (b_joint + 1). Both found: low = high = kappa; neither: NaN, NaN."""
    found = [r.n_star for r in per_length if r.n_star is not None]
    if not per_length:
        return math.nan, math.nan
    if joint.n_star is not None:
        value = (sum(found) + sum(r.n_max + 1 for r in per_length if r.n_star is None)) / joint.n_star
        return value, (value if len(found) == len(per_length) else math.inf)
    if len(found) == len(per_length):
        return 0.0, sum(found) / (joint.n_max + 1)
    return math.nan, math.nan


def seed_kappas(per_length: Sequence[NStar], joint: NStar) -> dict[str, dict]:
    """Per seed, kappa from that seed's own smallest converging N per condition (`NStar.seed_n_star`), or
    its bounds where a condition never converged for it (as `kappa_bounds`, the largest N it failed at + 1
    standing for the search's bound): {seed: {"kappa", "low", "high"}}; JSON-able keys."""
    seeds = sorted(set(joint.seed_n_star()).union(*(r.seed_n_star() for r in per_length)))
    out = {}
    for seed in seeds:
        hits = [r.seed_n_star().get(seed, (None, 0)) for r in per_length]
        hit_joint, miss_joint = joint.seed_n_star().get(seed, (None, 0))
        found = [h for h, _ in hits if h is not None]
        if hit_joint is not None and len(found) == len(hits):
            value = sum(found) / hit_joint
            low = high = value
        elif hit_joint is not None:
            value, low, high = math.nan, (sum(found) + sum(m + 1 for h, m in hits if h is None)) / hit_joint, math.inf
        elif len(found) == len(hits):
            value, low, high = math.nan, 0.0, sum(found) / (miss_joint + 1)
        else:
            value = low = high = math.nan
        out[str(seed)] = {"kappa": value, "low": low, "high": high}
    return out


def joint_model_row(result: NStar) -> dict | None:
    """The converged trial at N*_joint with the lowest validation loss (None when none converged)."""
    rows = [r for r in result.trials if r.get("converged") and r.get("n") == result.n_star]
    return min(rows, key=lambda r: r.get("val_loss", math.inf)) if rows else None


def kappa_rows(results: Sequence[NStar]) -> list[dict]:
    """One row per (model, task, format, L): kappa, the N*s, and the joint model's OOD accuracy."""
    groups: dict[tuple, dict[Any, NStar]] = {}
    for result in results:
        c = result.condition
        key = (c["model"], c["task"], c["format"], c.get("max_length"))
        groups.setdefault(key, {})[c["length"]] = result
    rows = []
    for (model, task, fmt, max_length), by_length in groups.items():
        if "joint" not in by_length:
            continue
        per_length = {n: r.n_star for n, r in by_length.items() if n != "joint"}
        joint = by_length["joint"]
        low, high = kappa_bounds([r for n, r in by_length.items() if n != "joint"], joint)
        row = {"model": model, "task": task, "format": fmt, "max_length": max_length,
               "kappa": kappa(per_length, joint.n_star) if per_length else math.nan,
               "kappa_low": low, "kappa_high": high, "n_star_joint": joint.n_star,
               "sum_n_star": sum(per_length.values()) if None not in per_length.values() else None,
               "carried_by": {str(n): r.carried_by() for n, r in by_length.items()},
               "by_seed": seed_kappas([r for n, r in by_length.items() if n != "joint"], joint)}
        best = joint_model_row(joint)
        for length in joint.condition.get("ood_lengths", []):
            row[f"ood_acc_{length}"] = best.get(f"ood_acc_{length}", math.nan) if best else math.nan
        rows.append(row)
    return rows


def train_trial(params: Mapping[str, Any], run_dir: str | Path) -> dict:
    """Train one trial (a condition + n, lr, seed) on its finite data set into `run_dir` (resuming
    a run left there); the row: the params plus converged, converged_step, val_loss, val_accuracy,
    n_train, steps_run, seconds and, for joint trials, ood_acc_<length> (final-state accuracy on
    256 fresh sequences of each ood length)."""
    import models
    from interp.tasks import make_task
    from interp.training.evaluate import evaluate_lengths
    from interp.training.train import TrainConfig, train

    task = make_task(params["task"], format=params["format"])
    lengths = [int(n) for n in params["lengths"]]
    options = {k: params[k] for k in TRIAL_TRAIN_KEYS if k in params}
    options.setdefault("warmup", min(TrainConfig.warmup, options.get("steps", TrainConfig.steps) // 10))
    cfg = TrainConfig(dataset_size=int(params["n"]), lengths=lengths, train_length=max(lengths),
                      lr=float(params["lr"]), seed=int(params["seed"]), **options)
    model_config = models.preset_config(params["model"], vocab_size=task.vocab_size,
                                        **dict(params.get("model_options") or {}))
    result = train(model_config, task, cfg, run_dir, resume=True, progress=False)
    val = [r for r in result.metrics if r["kind"] == "val"]
    row = {**params, "converged": result.extra["converged_step"] is not None,
           "converged_step": result.extra["converged_step"],
           "val_loss": val[-1]["loss"] if val else math.nan,
           "val_accuracy": val[-1]["accuracy"] if val else math.nan,
           "n_train": result.extra["n_train"], "steps_run": result.step, "seconds": result.seconds}
    ood = [int(n) for n in params.get("ood_lengths") or []]
    if ood:
        accuracy = evaluate_lengths(result.model, task, ood, n=256, seed=int(params["seed"])).final_accuracy
        row.update({f"ood_acc_{n}": accuracy[n] for n in ood})
    return row
