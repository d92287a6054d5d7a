"""Log-log correlations across runs, and what carries them (issue 37; docs/drift.md).

    loglog_pearson(x, y) -> (r, n)                 Pearson r of log x and log y over the finite positive pairs
    bootstrap_interval(x, y) -> [low, high]        95% percentile interval of r, runs resampled with replacement
    permutation_p(x, y) -> p                       two-sided p of |r| with y permuted across runs
    within_groups_r(x, y, groups) -> (r, n)        r after removing each group's mean of log x and log y
    within_groups_interval(x, y, groups) -> [lo, hi]  its 95% interval, runs resampled within each group
    leave_one_group_out(x, y, groups) -> {g: r}    r over the runs of every other group
    correlation_summary(x, y, groups) -> dict      all of the above, the row of a table
    paired_difference(x, y, y_control) -> dict     r(x, y) - r(x, y_control) on the same runs, with its 95%
                                                   paired bootstrap interval (is a reading better than a control?)

A correlation across runs of several models can be carried by the models alone: if each model's runs
sit at their own (log mp, log Tcross) with no relation inside a model, r between runs is still high
when the models differ on both axes. r within groups (each model's mean removed) is then ~0, and
leaving a model out moves r a lot; both say how much of r relates run to run rather than model to
model. Groups with a single run carry nothing within (their residual is 0) and are left out of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

BOOTSTRAP = 2000      # resamples for the interval of r
PERMUTATIONS = 2000   # permutations for the p-value of r


def _logs(x: Sequence[float], y: Sequence[float], groups: Sequence | None = None):
    """(log x, log y, groups) over the pairs where both are finite and positive."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-D of the same length; got shapes {x.shape} and {y.shape}")
    if groups is not None and len(groups) != len(x):
        raise ValueError(f"groups must have one entry per run ({len(x)}); got {len(groups)}")
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    kept_groups = None if groups is None else np.asarray([str(g) for g in groups])[keep]
    return np.log(x[keep]), np.log(y[keep]), kept_groups


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    """r of a and b (NaN with fewer than 3 points or a constant side)."""
    if len(a) < 3 or a.std() == 0 or b.std() == 0:
        return math.nan
    return float(np.corrcoef(a, b)[0, 1])


def loglog_pearson(x: Sequence[float], y: Sequence[float]) -> tuple[float, int]:
    """(Pearson r of log x and log y, number of points) over the pairs where both are finite and
    positive; r is NaN with fewer than 3 such points or when either side is constant."""
    lx, ly, _ = _logs(x, y)
    return _pearson(lx, ly), len(lx)


def bootstrap_interval(x, y, resamples: int = BOOTSTRAP, seed: int = 0) -> list[float] | None:
    """2.5 / 97.5 percentiles of the log-log r over runs resampled with replacement (resamples where r
    is undefined are dropped); None with fewer than 4 runs placed."""
    lx, ly, _ = _logs(x, y)
    if len(lx) < 4:
        return None
    picks = np.random.default_rng(seed).integers(0, len(lx), size=(resamples, len(lx)))    # [B, n]
    rs = np.array([_pearson(lx[i], ly[i]) for i in picks])
    rs = rs[np.isfinite(rs)]
    return [float(v) for v in np.percentile(rs, [2.5, 97.5])] if len(rs) else None


def permutation_p(x, y, permutations: int = PERMUTATIONS, seed: int = 0) -> float:
    """Two-sided permutation p-value of the log-log r: (1 + #{|r(x, perm y)| >= |r|}) / (1 + permutations);
    NaN where r is undefined."""
    lx, ly, _ = _logs(x, y)
    observed = _pearson(lx, ly)
    if not math.isfinite(observed):
        return math.nan
    rng = np.random.default_rng(seed)
    shuffled = np.stack([rng.permutation(ly) for _ in range(permutations)])              # [P, n]
    a = (lx - lx.mean()) / lx.std()
    b = (shuffled - shuffled.mean(1, keepdims=True)) / shuffled.std(1, keepdims=True)
    rs = (b @ a) / len(lx)                                                               # [P]
    return float((1 + np.sum(np.abs(rs) >= abs(observed) - 1e-12)) / (1 + permutations))


def within_groups_r(x, y, groups) -> tuple[float, int]:
    """(r of log x and log y with each group's mean removed, runs in groups of >= 2); NaN with fewer than 3."""
    lx, ly, kept = _logs(x, y, groups)
    names, index, counts = np.unique(kept, return_inverse=True, return_counts=True)
    shared = counts[index] >= 2
    if shared.sum() < 3:
        return math.nan, int(shared.sum())
    mean_x = np.bincount(index, lx) / counts
    mean_y = np.bincount(index, ly) / counts
    rx, ry = (lx - mean_x[index])[shared], (ly - mean_y[index])[shared]
    return _pearson(rx, ry), int(shared.sum())


def within_groups_interval(x, y, groups, resamples: int = BOOTSTRAP, seed: int = 0) -> list[float] | None:
    """2.5 / 97.5 percentiles of `within_groups_r` over stratified resamples: each group's runs resampled with
    replacement inside the group (a group keeps its size, so the model means stay the models'); None with
    fewer than 4 runs in groups of >= 2."""
    lx, ly, kept = _logs(x, y, groups)
    members = [np.nonzero(kept == g)[0] for g in np.unique(kept)]
    members = [m for m in members if len(m) >= 2]
    if sum(len(m) for m in members) < 4:
        return None
    rng = np.random.default_rng(seed)
    rs = []
    for _ in range(resamples):
        picks = [rng.choice(m, size=len(m)) for m in members]
        rx = np.concatenate([lx[p] - lx[p].mean() for p in picks])
        ry = np.concatenate([ly[p] - ly[p].mean() for p in picks])
        rs.append(_pearson(rx, ry))
    rs = np.array(rs)
    rs = rs[np.isfinite(rs)]
    return [float(v) for v in np.percentile(rs, [2.5, 97.5])] if len(rs) else None


def leave_one_group_out(x, y, groups) -> dict[str, float]:
    """{group: log-log r over the runs of every other group} for each group present among the runs placed."""
    lx, ly, kept = _logs(x, y, groups)
    return {str(g): _pearson(lx[kept != g], ly[kept != g]) for g in np.unique(kept)}


def correlation_summary(x, y, groups, seed: int = 0) -> dict:
    """The correlation of log x and log y across runs and what carries it: r, runs placed, the 95% bootstrap
    interval, the permutation p, r within groups (its runs and its stratified 95% interval), the
    leave-one-group-out range [min, max]."""
    r, n = loglog_pearson(x, y)
    within, n_within = within_groups_r(x, y, groups)
    left_out = [v for v in leave_one_group_out(x, y, groups).values() if math.isfinite(v)]
    return {"r": r, "runs": n, "interval": bootstrap_interval(x, y, seed=seed), "p": permutation_p(x, y, seed=seed),
            "r_within": within, "runs_within": n_within,
            "within_interval": within_groups_interval(x, y, groups, seed=seed),
            "leave_one_out": [min(left_out), max(left_out)] if left_out else None,
            "groups": len(set(_logs(x, y, groups)[2]))}


def paired_difference(x, y, y_control, resamples: int = BOOTSTRAP, seed: int = 0) -> dict:
    """How much better log y tracks log x than log y_control does, on the same runs (the pairs where all
    three are finite and positive): {"difference": r(x, y) - r(x, y_control), "interval": its 2.5 / 97.5
    percentiles over runs resampled with replacement, the same resample for both (None with fewer than 4
    runs), "runs"}. An interval that holds 0 says the reading is no better than the control."""
    x, y, y_control = (np.asarray(v, dtype=float) for v in (x, y, y_control))
    if not x.shape == y.shape == y_control.shape or x.ndim != 1:
        raise ValueError(f"x, y and y_control must be 1-D of one length; got {x.shape}, {y.shape}, {y_control.shape}")
    keep = np.isfinite(x) & np.isfinite(y) & np.isfinite(y_control) & (x > 0) & (y > 0) & (y_control > 0)
    lx, ly, lc = np.log(x[keep]), np.log(y[keep]), np.log(y_control[keep])
    difference = _pearson(lx, ly) - _pearson(lx, lc)
    if len(lx) < 4 or not math.isfinite(difference):
        return {"difference": difference, "interval": None, "runs": len(lx)}
    picks = np.random.default_rng(seed).integers(0, len(lx), size=(resamples, len(lx)))    # [B, n]
    ds = np.array([_pearson(lx[i], ly[i]) - _pearson(lx[i], lc[i]) for i in picks])
    ds = ds[np.isfinite(ds)]
    interval = [float(v) for v in np.percentile(ds, [2.5, 97.5])] if len(ds) else None
    return {"difference": difference, "interval": interval, "runs": len(lx)}
