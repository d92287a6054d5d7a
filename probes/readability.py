"""The readability threshold of a trained decoder: tau calibrated from its own read-out.

The paper (arXiv 2605.07755, abstract): tracking collapses "when the distinguishability ratio
crosses the readability threshold of the trained decoder". Definitions (docs/drift.md;
U with orthonormal basis Q [n, k], the centroids c_g and their smallest distance M are those of
probes.subspace). In-distribution states h [N, T, *S] with true classes y [N, T], targets z [N, T]
(what a correct read-out predicts) and a mask of counted positions are moved along U,

    h_r[i, t]     = h[i, t] + r * M * Q u[i, t],    u[i, t] a unit vector of R^k,

    direction="random"   u uniform on the unit sphere of R^k, drawn once (seed) and kept for every r
    direction="nearest"  u = Q^T (c_g' - c_g) / || . ||, g = y[i, t] and g' its nearest other centroid
                         (the worst case for a nearest-centroid read-out)

and read by the decoder: accuracy(r) = the fraction of counted positions where decode(h_r) = z. The
calibrated threshold is

    tau_cal       = sup { r : accuracy(r') >= threshold for every r' in [0, r] }       (threshold 0.9)

found on a grid of ratios (`ratios`, increasing, starting at 0) up to its first failing ratio, then
refined by `refine` bisections between the last passing and the first failing ratio. tau_cal is a
ratio to M; the displacement D = tau_cal * M is what carries to another definition (tau = D / M_ref
for the time-indexed drift). It is NaN when accuracy(0) < threshold (the decoder does not read the
unmoved states: there is nothing to calibrate) and `censored` (a lower bound) when no grid ratio fails.
The decoder moves every position at once; for the last layer's state or residual stream the
read-out at t depends on the state at t only, so this is each state's own read-out.

A threshold from theory beside it (theory_threshold): the readability level of an ideal read-out of
isotropic Gaussian classes in U's dimension k. Two classes N(c, s^2 I_k), N(c', s^2 I_k) with
|c - c'| = M are told apart by the nearest centroid (the Bayes rule) with error Phi(-M / (2 s)); the
mean distance of a state to its own centroid is s * E[chi_k] = s * sqrt(2) Gamma((k + 1) / 2) /
Gamma(k / 2). The pair errs at rate e where M / (2 s) = z = Phi^-1(1 - e), i.e. at the drift ratio

    tau_theory(k) = E[chi_k] / (2 z)          (statistic "mean"; e = 0.1: z = 1.2816, k = 5: 0.830)

and, for a percentile statistic p, the p-th percentile of chi_k over 2 z. It needs no trained decoder:
it is the threshold the seed's 0.5 would be if the spread were isotropic and the read-out ideal.

Inputs may be numpy arrays or torch tensors; results are numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import math
from statistics import NormalDist

import numpy as np
import torch

from probes._arrays import as_tensor, check_float, check_int, check_positive_int, check_prefix
from probes.subspace import Subspace

DIRECTIONS = ("random", "nearest")
DEFAULT_RATIOS = tuple(np.round(np.arange(0.0, 2.0001, 0.1), 10))


@dataclass
class Calibration:
    """The readability threshold of a decoder (module docstring).

    tau: tau_cal as a ratio to M (NaN when the unmoved states are not read at `threshold`);
    displacement: tau * M, in state units; ratios / accuracy: every ratio evaluated (sorted) and the
    decoder's accuracy there; base_accuracy: accuracy(0); censored: no evaluated ratio failed, so
    tau is only a lower bound (the grid's end).
    """

    tau: float
    displacement: float
    M: float
    ratios: np.ndarray
    accuracy: np.ndarray
    base_accuracy: float
    threshold: float
    direction: str
    censored: bool

    @property
    def fits(self) -> bool:
        """The decoder reads the unmoved states at the threshold (the premise of tau_cal)."""
        return bool(np.isfinite(self.tau))

    def tau_for(self, separation: float) -> float:
        """The same displacement as a ratio to another separation (e.g. M_ref): D / separation."""
        return self.displacement / float(separation)


def _directions(subspace: Subspace, labels: torch.Tensor, direction: str, seed: int) -> torch.Tensor:
    """Unit vectors u [N, T, k] on U (float64) for each position (module docstring)."""
    k = subspace.rank
    if direction == "random":
        gen = torch.Generator().manual_seed(int(seed))
        u = torch.randn(*labels.shape, k, generator=gen, dtype=torch.float64)
        return u / torch.linalg.vector_norm(u, dim=-1, keepdim=True).clamp_min(1e-300)
    cents = subspace.centroids
    coords = torch.from_numpy(cents.means) @ torch.from_numpy(subspace.basis)       # [G, k]
    gaps = torch.cdist(coords, coords)
    gaps.fill_diagonal_(float("inf"))
    toward = coords[gaps.argmin(1)] - coords                                         # [G, k]
    toward = toward / torch.linalg.vector_norm(toward, dim=-1, keepdim=True)
    classes = torch.from_numpy(cents.classes)
    rows = torch.searchsorted(classes, labels).clamp(max=len(classes) - 1)
    if bool((classes[rows] != labels).any()):
        bad = torch.unique(labels[classes[rows] != labels])[:10].tolist()
        raise ValueError(f"labels contain classes {bad} that have no centroid; centroid classes: "
                         f"{cents.classes.tolist()[:20]}")
    return toward[rows]


def readability_threshold(decode, states, labels, subspace: Subspace, targets=None, mask=None,
                          ratios=DEFAULT_RATIOS, threshold: float = 0.9, direction: str = "random",
                          refine: int = 6, seed: int = 0) -> Calibration:
    """tau_cal of a decoder: the largest ratio r (to M) such that states moved by r * M along U are
    still decoded correctly at >= threshold for every ratio up to r (module docstring).

    decode: callable(states [N, T, *S] float tensor) -> predictions [N, T] (anything torch.as_tensor
    takes); states [N, T, *S]; labels [N, T] their true classes (which centroid each state belongs
    to); targets [N, T] what a correct read-out predicts (default: labels); mask [N, T] bool, the
    positions counted (default: all). ratios: increasing, first 0. refine: bisection steps.
    """
    if not callable(decode):
        raise TypeError(f"decode must be a callable states -> predictions; got {type(decode).__name__}")
    if not isinstance(subspace, Subspace):
        raise TypeError(f"subspace must be a Subspace (state_subspace(...)); got {type(subspace).__name__}")
    states, labels = as_tensor("states", states), as_tensor("labels", labels)
    check_float("states", states)
    check_int("labels", labels)
    check_prefix(states, labels)
    targets = labels if targets is None else as_tensor("targets", targets)
    mask = torch.ones(labels.shape, dtype=torch.bool) if mask is None else as_tensor("mask", mask)
    for name, value in (("targets", targets), ("mask", mask)):
        if tuple(value.shape) != tuple(labels.shape):
            raise ValueError(f"{name} must have the shape of labels {tuple(labels.shape)}; got {tuple(value.shape)}")
    if mask.dtype != torch.bool or not bool(mask.any()):
        raise ValueError("mask must be a bool tensor with at least one True position")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}; got {direction!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
        raise ValueError(f"threshold must be a number in (0, 1]; got {threshold!r}")
    grid = np.asarray(ratios, dtype=np.float64)
    if grid.ndim != 1 or grid.size < 2 or grid[0] != 0 or np.any(np.diff(grid) <= 0):
        raise ValueError(f"ratios must be increasing, start at 0 and hold at least two values; got {ratios!r}")
    refine = check_positive_int("refine", refine) if refine != 0 else 0
    M = subspace.M
    basis = torch.from_numpy(subspace.basis)                                          # [n, k]
    steps = (_directions(subspace, labels.cpu().to(torch.int64), direction, seed) @ basis.T)   # [N, T, n]
    steps = steps.reshape(states.shape).to(states.device)
    targets, mask = targets.to(states.device), mask.to(states.device)
    evaluated: dict[float, float] = {}

    def accuracy(ratio: float) -> float:
        moved = (states.to(torch.float64) + ratio * M * steps).to(states.dtype)
        predictions = torch.as_tensor(decode(moved), device=states.device)
        if tuple(predictions.shape) != tuple(labels.shape):
            raise ValueError(f"decode must return predictions [N, T] = {tuple(labels.shape)}; "
                             f"got {tuple(predictions.shape)}")
        value = float((predictions == targets)[mask].double().mean())
        evaluated[ratio] = value
        return value

    base = accuracy(0.0)
    tau, failed = float("nan"), None
    if base >= threshold:
        tau = 0.0
        for ratio in grid[1:]:
            if accuracy(float(ratio)) < threshold:
                failed = float(ratio)
                break
            tau = float(ratio)
        if failed is not None:
            low, high = tau, failed
            for _ in range(refine):
                middle = (low + high) / 2
                low, high = (middle, high) if accuracy(middle) >= threshold else (low, middle)
            tau = low
    order = sorted(evaluated)
    return Calibration(tau, tau * M, M, np.array(order), np.array([evaluated[r] for r in order]), base,
                       float(threshold), direction, bool(np.isfinite(tau) and failed is None))


def theory_threshold(k: int, error: float = 0.1, statistic: str | float = "mean") -> float:
    """tau_theory: the drift ratio at which the closest pair of two isotropic Gaussian classes in k
    dimensions is misread at rate `error` by the nearest centroid (module docstring). statistic: 'mean'
    (E[chi_k]) or a percentile in [0, 100] of chi_k, the spread statistic R(t) uses."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an int >= 1 (the dimension of U); got {k!r}")
    if isinstance(error, bool) or not isinstance(error, (int, float)) or not 0 < error < 0.5:
        raise ValueError(f"error must be a number in (0, 0.5); got {error!r}")
    z = NormalDist().inv_cdf(1.0 - error)
    if statistic == "mean":
        radius = math.sqrt(2.0) * math.exp(math.lgamma((k + 1) / 2) - math.lgamma(k / 2))
    elif isinstance(statistic, (int, float)) and not isinstance(statistic, bool) and 0 <= statistic <= 100:
        radius = chi_quantile(int(k), statistic / 100.0)
    else:
        raise ValueError(f"statistic must be 'mean' or a percentile in [0, 100]; got {statistic!r}")
    return radius / (2.0 * z)


def chi_quantile(k: int, p: float) -> float:
    """The p-quantile of the chi distribution with k degrees of freedom: CDF(r) = P(k / 2, r^2 / 2)
    (the regularised lower incomplete gamma function), inverted by bisection."""
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return math.inf
    half = torch.tensor(k / 2.0, dtype=torch.float64)
    low, high = 0.0, math.sqrt(k) + 40.0
    for _ in range(200):
        middle = (low + high) / 2
        below = float(torch.special.gammainc(half, torch.tensor(middle * middle / 2, dtype=torch.float64))) < p
        low, high = (middle, high) if below else (low, middle)
    return (low + high) / 2
