"""Budget search: the cheapest training budget (depth, width, lr, warmup, steps) at which a model fits.

    candidates(base, grid) -> [Run]            one Run per grid entry (model and train overrides of `base`)
    cost(run) -> float                          steps x layers x width^2: the compute proxy runs are ordered by
    search(runs, obtain, log) -> dict           train the runs cheapest first until one fits

A claim whose model "did not fit" at a fixed budget says nothing about the claim; the search replaces
that fixed budget by an explicit, small grid. `search` orders the candidates by `cost` (the per-token
compute of a block at short lengths, ~ layers x width^2, times the steps; equal costs keep the grid's
order), obtains each (`obtain(run) -> engine.Outcome`: a committed run is loaded, a finished one
reused, an interrupted one resumed, so a rerun trains nothing that is done) and stops at the first
that fits in distribution (engine.FIT_THRESHOLD on the plan's fit metric). The result records every
candidate: the tried ones with their status, curriculum length reached, in-distribution accuracy,
steps trained and seconds; the ones after the chosen budget as "not tried (a cheaper budget fit)".
"chosen" is the label of the budget that fit, or None ("none fit": every candidate was tried).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from interp.reproduce.engine import Outcome, Run

MODEL_KEYS = ("n_layers", "d_model", "n_heads")
TRAIN_KEYS = ("lr", "warmup", "steps")
NOT_TRIED = "not tried (a cheaper budget fit)"
NOT_TRAINED = "not trained yet (train=False)"


def budget_label(entry: dict[str, Any]) -> str:
    """'L2-d64-h4-lr0.001-wu50-s3000' for a grid entry."""
    return (f"L{entry['n_layers']}-d{entry['d_model']}-h{entry['n_heads']}-lr{entry['lr']:g}-wu{entry['warmup']}"
            f"-s{entry['steps']}")


def check_grid(grid: Sequence[dict[str, Any]]) -> None:
    if not grid:
        raise ValueError("grid must name at least one budget; got an empty grid")
    for entry in grid:
        missing = [k for k in MODEL_KEYS + TRAIN_KEYS if k not in entry]
        extra = set(entry) - set(MODEL_KEYS + TRAIN_KEYS)
        if missing or extra:
            raise ValueError(f"grid entry {entry!r}: needs exactly {MODEL_KEYS + TRAIN_KEYS}; "
                             f"missing {missing}, unknown {sorted(extra)}")
        if not 0 <= entry["warmup"] < entry["steps"]:
            raise ValueError(f"grid entry {entry!r}: warmup must be in [0, steps)")
    labels = [budget_label(e) for e in grid]
    if len(set(labels)) != len(labels):
        raise ValueError(f"grid entries must differ; got the budgets {labels}")


def candidates(base: Run, grid: Sequence[dict[str, Any]], prefix: str = "") -> list[Run]:
    """One Run per grid entry: `base` with the entry's model (n_layers, d_model, n_heads) and train (lr,
    warmup, steps) fields, labelled prefix + budget_label(entry), info["budget"] = that label."""
    check_grid(grid)
    runs = []
    for entry in grid:
        label = budget_label(entry)
        runs.append(replace(base, label=prefix + label,
                            model={**base.model, **{k: entry[k] for k in MODEL_KEYS}},
                            train={**base.train, **{k: entry[k] for k in TRAIN_KEYS}},
                            info={**base.info, "budget": label}))
    return runs


def cost(run: Run) -> float:
    """steps x layers x width^2 (a block's per-token compute at short lengths, times the steps)."""
    return float(run.train["steps"] * run.model["n_layers"] * run.model["d_model"] ** 2)


def row(run: Run, outcome: Outcome | None, status: str = NOT_TRIED) -> dict[str, Any]:
    base = {"budget": run.info.get("budget", run.label), "layers": run.model["n_layers"], "width": run.model["d_model"],
            "heads": run.model["n_heads"], "lr": run.train["lr"], "warmup": run.train["warmup"],
            "steps": run.train["steps"], "cost (steps x layers x width^2)": f"{cost(run):.3g}"}
    if outcome is None:
        return {**base, "status": status, "length reached": None, "in-dist acc": None, "steps trained": None,
                "train s": None}
    return {**base, "status": outcome.status, "length reached": outcome.length_reached,
            "in-dist acc": None if outcome.in_distribution is None else round(outcome.in_distribution, 4),
            "steps trained": outcome.steps, "train s": None if outcome.seconds is None else round(outcome.seconds, 1)}


def search(runs: Sequence[Run], obtain: Callable[[Run], Outcome | None],
           log: Callable[[str], None] = print) -> dict[str, Any]:
    """Obtain `runs` cheapest first (`cost`, stable) until one fits; returns {"chosen": label or None,
    "rows": one row per run in the order tried, "outcomes": {label: Outcome} of the runs obtained}.
    obtain(run) -> None (a reproduction that may not train, and has no such run): the search stops there,
    that run's row and the later ones say NOT_TRAINED, and "chosen" is None."""
    if not runs:
        raise ValueError("runs must hold at least one candidate budget; got none")
    ordered = sorted(runs, key=cost)
    chosen, rows, outcomes, stopped = None, [], {}, False
    for index, run in enumerate(ordered, 1):
        if chosen is not None or stopped:
            rows.append(row(run, None, NOT_TRAINED if stopped else NOT_TRIED))
            continue
        log(f"budget search [{index}/{len(ordered)}] {run.label} (cost {cost(run):.3g})")
        outcome = obtain(run)
        if outcome is None:
            stopped = True
            rows.append(row(run, None, NOT_TRAINED))
            log(f"budget search [{index}/{len(ordered)}] {run.label}: {NOT_TRAINED}; the search stops here")
            continue
        outcomes[run.label] = outcome
        rows.append(row(run, outcome))
        log(f"budget search [{index}/{len(ordered)}] {run.label}: {outcome.status}, length {outcome.length_reached}/"
            f"{run.train['train_length']}, in-dist acc "
            f"{'-' if outcome.in_distribution is None else f'{outcome.in_distribution:.3f}'}")
        if outcome.fit:
            chosen = run.label
    return {"chosen": chosen, "rows": rows, "outcomes": outcomes}
