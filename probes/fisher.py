"""Class separability on U in within-class-whitened coordinates: a drift definition that sees the
spread the way a linear read-out does (our own; docs/drift.md defines q(t) with isotropic spread).

    separation(coords [N, k], labels [N]) -> {"nearest_centroid_accuracy", "spread_over_separation",
                                               "fisher_separation", "classes"}
    fisher_curve(coords [N, T, k], labels [N, T]) -> F [T]
    fisher_tcross(F, level=FISHER_LEVEL) -> Tcross     first step t with F(t) < level (inf when none)
    readout_curve(coords [N, T, k], labels [N, T]) -> A [T]; burn_in(A) -> B   (the burn-in rule below)
    readout_tcross(A, level=READOUT_LEVEL) -> Tcross    first step t with A(t) < level (the control reading)

Definitions, on states projected on U (probes.subspace.Subspace.coords) with their classes:

    c_g(t)   the mean of the states of class g at step t (time-indexed centroids)
    W(t)     the pooled within-class covariance at step t: sum_g sum_{i in g} (x_i - c_g)(x_i - c_g)^T
             / (N - classes present)
    F(t)     min over class pairs g != g' present at t of sqrt((c_g - c_g')^T W(t)^+ (c_g - c_g')),
             the smallest centroid distance in whitened coordinates (Mahalanobis)

Why: the drift ratio q(t) = R(t) / M measures the spread isotropically. Where the within-class spread
lies along directions that separate no classes, q exceeds 0.5 while every state is still read right
(the medium error-control runs: the token-gated RNN at its training length has mean spread 0.48-0.78 of
the smallest separation, yet a nearest-centroid read-out on U is exact and F is 6.6-9.9). F counts
only the spread that confuses classes. For two Gaussian classes with a shared covariance the best
linear read-out errs with probability Phi(-F / 2), so it reads 90% right (mp's threshold) while
F > 2 Phi^-1(0.9) = FISHER_LEVEL; Tcross under this definition is the first step where F falls below
it. Steps count tokens read: index i is step i + 1, as in probes.subspace.

The burn-in rule (`burn_in`) for first-crossing readings of a drift: at step 1 every class is a single
history, so any drift is 0 and any read-out exact; over the next few steps a model may not yet have
formed the class structure on U (its states of one class do not yet gather around a centroid), and a
ratio of spread to separation there measures no misread of a class the model holds. The burn-in is
the steps before the first step t >= 2 at which the class is read from U by the nearest centroid of
its own step at >= READOUT_LEVEL (`readout_curve`); a crossing inside it is not counted. A run whose
read-out never reaches the level has no burn-in end (None): nothing after it can be a misread either.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from probes.subspace import Tcross

READOUT_LEVEL = 0.9   # the read-out accuracy the burn-in ends at (mp's threshold)
FISHER_LEVEL = 2.0 * NormalDist().inv_cdf(0.9)   # 2.563: a shared-covariance Gaussian pair is read 90% right above it


def _check(coords: np.ndarray, labels: np.ndarray, time_axis: bool) -> tuple[np.ndarray, np.ndarray]:
    coords, labels = np.asarray(coords, dtype=np.float64), np.asarray(labels)
    want = 3 if time_axis else 2
    if coords.ndim != want or labels.shape != coords.shape[:-1]:
        raise ValueError(f"coords must be [N{', T' if time_axis else ''}, k] and labels {coords.shape[:-1]}; got "
                         f"coords {coords.shape} and labels {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer) or (labels.size and labels.min() < 0):
        raise ValueError(f"labels must be non-negative integer classes; got dtype {labels.dtype}")
    return coords, labels


def fisher_curve(coords, labels) -> np.ndarray:
    """F(t) [T] from states on U [N, T, k] and their classes [N, T] (NaN at a step with fewer than two
    classes present, or without within-class spread: at step 1 each class is one history). One step at a
    time: memory O(N k + G^2 + k^2), so S5's 120 classes on a 1000-step horizon stay small."""
    coords, labels = _check(coords, labels, time_axis=True)
    return np.array([_fisher_at(coords[:, t], labels[:, t]) for t in range(coords.shape[1])])


def _fisher_at(x: np.ndarray, y: np.ndarray) -> float:
    """F at one step: states [N, k], classes [N]."""
    classes, index = np.unique(y, return_inverse=True)
    if len(classes) < 2:
        return math.nan
    counts = np.bincount(index)
    means = np.zeros((len(classes), x.shape[1]))
    np.add.at(means, index, x)
    means /= counts[:, None]                                                      # [G, k]
    residual = x - means[index]                                                   # [N, k]
    gram = means @ means.T                                                        # [G, G]
    squared_gaps = np.diag(gram)[:, None] + np.diag(gram)[None, :] - 2 * gram
    np.fill_diagonal(squared_gaps, 0.0)
    spread = float(np.einsum("nk,nk->", residual, residual))
    if spread <= 1e-12 * float(squared_gaps.max()) * len(y):   # no spread: each class one history
        return math.nan
    whiten = np.linalg.pinv(residual.T @ residual / max(1, len(y) - len(classes)))   # [k, k]
    projected = means @ whiten @ means.T                                          # [G, G]
    whitened = np.diag(projected)[:, None] + np.diag(projected)[None, :] - 2 * projected
    np.fill_diagonal(whitened, np.inf)
    return float(np.sqrt(max(float(whitened.min()), 0.0)))


def readout_curve(coords, labels) -> np.ndarray:
    """A [T]: at each step, the fraction of states on U [N, T, k] (classes [N, T]) read as their own class
    by the nearest centroid of that step (centroids of the same states, so in-sample; chance 1 / classes)."""
    coords, labels = _check(coords, labels, time_axis=True)
    return np.array([_nearest_centroid_accuracy(coords[:, t], labels[:, t]) for t in range(coords.shape[1])])


def _nearest_centroid_accuracy(x: np.ndarray, y: np.ndarray) -> float:
    """States [N, k] with classes [N]: the fraction read as their class by the nearest class mean."""
    classes, index = np.unique(y, return_inverse=True)
    means = np.zeros((len(classes), x.shape[1]))
    np.add.at(means, index, x)
    means /= np.bincount(index)[:, None]                                             # [G, k]
    nearest = np.argmin(((x[:, None] - means[None]) ** 2).sum(-1), axis=1)            # [N]
    return float(np.mean(nearest == index))


def burn_in(readout, level: float = READOUT_LEVEL) -> int | None:
    """The burn-in length B (module docstring): the first step t >= 2 with readout(t) >= level, minus 1;
    None when no such step exists. A crossing counts from step B + 1 on."""
    readout = np.asarray(readout, dtype=np.float64)
    formed = np.nonzero(readout[1:] >= level)[0]
    return None if not formed.size else int(formed[0]) + 1


def separation(coords, labels) -> dict[str, float]:
    """At one step: nearest-centroid accuracy (each state read as the class of the nearest centroid of its
    step; chance 1 / classes), the isotropic ratio mean distance to the own centroid / smallest centroid
    distance (what q(t) sees) and F (fisher_curve's) of states on U [N, k] with classes [N]."""
    coords, labels = _check(coords, labels, time_axis=False)
    classes = np.unique(labels)
    centroids = np.stack([coords[labels == g].mean(0) for g in classes])                  # [G, k]
    residual = coords - centroids[np.searchsorted(classes, labels)]
    gaps = [float(np.linalg.norm(centroids[a] - centroids[b])) for a in range(len(classes)) for b in range(a)]
    return {"nearest_centroid_accuracy": _nearest_centroid_accuracy(coords, labels), "classes": int(len(classes)),
            "spread_over_separation": float(np.linalg.norm(residual, axis=1).mean() / min(gaps, default=math.nan)),
            "fisher_separation": _fisher_at(coords, labels)}


def fisher_tcross(curve, level: float = FISHER_LEVEL, burn_in: int = 0) -> Tcross:
    """The first step t (1-based) after the first `burn_in` steps with F(t) < level; inf (never, within
    the curve's horizon) otherwise."""
    return _first_below(curve, level, burn_in)


def readout_tcross(curve, level: float = READOUT_LEVEL, burn_in: int = 0) -> Tcross:
    """The control reading: the first step t (1-based) after the first `burn_in` steps at which the
    nearest-centroid read-out A(t) (`readout_curve`) falls below `level`; inf otherwise. It restates
    accuracy on U: a drift reading that correlates with mp no better than this one adds nothing to it."""
    return _first_below(curve, level, burn_in)


def _first_below(curve, level: float, burn_in: int) -> Tcross:
    curve = np.asarray(curve, dtype=np.float64)
    below = np.nonzero((curve < level) & (np.arange(1, len(curve) + 1) > burn_in))[0]
    if not below.size:
        return Tcross(math.inf, False, level)
    return Tcross(float(below[0] + 1), False, level, index=int(below[0]))
