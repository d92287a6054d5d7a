"""Class centroids, the state-distinguishing subspace U, the drift ratio q(t) and Tcross.

Definitions (docs/drift.md). Hidden states h [N, T, *S] (any `hook_state` or
residual-stream cache, any layer; the trailing axes are flattened to n = prod(S) features) come
with ground-truth integer states y [N, T] (the group element after step t).

    centroid      c_g = mean of h[i, t] over every (i, t) with y[i, t] = g      (in-distribution data)
    U             span{c_g - c_g'} = span{c_g - c_bar}, c_bar the mean of the centroids.
                  Orthonormal basis Q [n, k]: right singular vectors of the centred centroid matrix
                  [G, n] whose singular values exceed `rtol` * (the largest); k <= G - 1.
    M             the smallest distance between two centroids (= their distance within U).
    distance      d[i, t] = || Q^T (h[i, t] - c_{y[i, t]}) ||, the drift off the own-class centroid
                  measured within U.
    R(t)          spread of d[:, t] over the N sequences: its mean (statistic="mean") or a
                  percentile (statistic=90.0 for the 90th percentile).
    q(t)          R(t) / M.  A nearest-centroid read-out misreads a state once its drift passes half
                  the separation, hence the threshold tau = 0.5 (a parameter).
    Tcross        the first step t with q(t) > tau. Steps count tokens read: the state at position
                  index i (0-based) is the state after step t = i + 1.
                  When q stays below tau up to the horizon, Tcross is estimated from the drift rate
                  and flagged `estimated`: eta = least-squares slope of R(t) against t (over steps
                  >= fit_start), and
                      estimator="rate"   Tcross ~ tau * M / eta            (docs/drift.md; R(0) = 0)
                      estimator="line"   Tcross ~ (tau * M - a) / eta      (the fitted line a + eta t
                                                                            reaches tau * M)
                  A slope eta <= 0 (no growth of the spread) gives Tcross = inf.

Time-indexed centroids (centroids="time"; the paper's reading, arXiv 2605.07755's abstract: tracking
"remains readable only while the accumulating within-class spread remains small relative to the
initial between-class separation"). On the N drift sequences themselves, within U:

    c_g(t)        = mean of Q^T h[i, t] over the sequences i with y[i, t] = g     (one centroid per
                    class and step; a class absent at step t has none)
    d_t[i, t]     = || Q^T h[i, t] - c_{y[i, t]}(t) ||, the spread around the class centroid of step t
                    (around the sample mean: with n_g(t) members it is biased low by a factor of
                    about sqrt((n_g(t) - 1) / n_g(t)); a class with one member at t has d_t = 0)
    M_ref         = min over g != g' present at t_ref of || c_g(t_ref) - c_g'(t_ref) ||, the
                    between-class separation at the reference step t_ref (`reference_step`; default
                    "the start": the first step at which the most classes are present, i.e. every
                    class of the data when there are enough sequences)
    R_t(t), q_t(t) = the statistic of d_t[:, t] (as for R), and R_t(t) / M_ref.
    Tcross        as above, on q_t and M_ref.

Separation at the same step (centroids="same"; a scale-invariant reading, ours): the spread of step t
relative to the separation of the class centroids of that same step,

    M_t(t)        = min over g != g' present at t of || c_g(t) - c_g'(t) ||    (NaN with < 2 classes)
    q_s(t)        = R_t(t) / M_t(t)

It is unchanged when every state of step t is multiplied by a number a_t (a model whose states grow
or shrink uniformly), where q_t (against M_ref) is not. Its DriftResult keeps M = M_ref and
R(t) = q_s(t) * M_ref (the spread in units of the reference separation) so that q = R / M and the
drift-rate estimate of Tcross apply unchanged; `separation` holds M_t(t).

Burn-in (tcross(burn_in=B)): the first B steps are not searched for a crossing (probes.fisher.burn_in
states the rule the error-control analysis uses: until the class is first read from U).

At t = 1 every class has a single history, so the spread starts at 0 and accumulates; with pooled
centroids it starts at whatever the state encodes beyond the class (position, last token). On a
stationary process (the law of h[i, t] given y[i, t] does not depend on t) both centroids estimate
the same means, so the two definitions agree up to sampling noise.

The readability threshold of a trained decoder (tau calibrated from its read-out): probes.readability.

Memory: everything streams over chunks of sequences. Centroid sums accumulate in float64 [G, n];
drift keeps only the per-sequence distances [N, T] (float64; with time-indexed centroids the
coordinates on U [N, T, k], k <= G - 1); a chunk is converted to float64 at a
time (chunk_size sequences), never the whole [N, T, n]. `CentroidAccumulator` and
`DriftAccumulator` take chunks one at a time, so data produced in pieces (a model run batch by
batch) never needs to be held at once.

Inputs may be numpy arrays or torch tensors (any device; the computation runs on their device).
Results are numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from probes._arrays import as_tensor, check_float, check_int, check_positive_int, check_prefix, to_numpy

STATISTICS_HELP = "'mean' or a percentile in [0, 100] (e.g. 90.0)"


@dataclass
class Centroids:
    """classes [G] int64 (sorted), means [G, n] float64, counts [G] int64, state_shape S."""

    classes: np.ndarray
    means: np.ndarray
    counts: np.ndarray
    state_shape: tuple[int, ...]

    def min_separation(self) -> float:
        """M: the smallest distance between two distinct centroids."""
        means = torch.from_numpy(self.means)
        dist = torch.cdist(means, means)
        dist.fill_diagonal_(float("inf"))
        return float(dist.min())


class CentroidAccumulator:
    """Streams chunks (states [n_i, T, *S], labels [n_i, T]) into per-class float64 sums."""

    def __init__(self) -> None:
        self._sums: torch.Tensor | None = None      # [C, n] float64, C = label range seen so far
        self._counts: torch.Tensor | None = None    # [C] int64
        self._offset = 0                             # label value of row 0
        self._state_shape: tuple[int, ...] | None = None

    def update(self, states, labels) -> "CentroidAccumulator":
        states, labels = as_tensor("states", states), as_tensor("labels", labels)
        check_float("states", states)
        check_int("labels", labels)
        check_prefix(states, labels)
        shape = tuple(states.shape[labels.dim():])
        if self._state_shape is not None and shape != self._state_shape:
            raise ValueError(f"states have state shape {shape}; earlier chunks had {self._state_shape}")
        self._state_shape = shape
        flat = states.reshape(labels.numel(), -1)            # [m, n]
        flat_labels = labels.reshape(-1).to(flat.device)      # [m]
        if flat_labels.numel() == 0:
            return self
        self._grow(int(flat_labels.min()), int(flat_labels.max()), flat)
        rows = flat_labels - self._offset
        self._sums.index_add_(0, rows, flat.to(torch.float64))
        self._counts.index_add_(0, rows, torch.ones_like(rows))
        return self

    def _grow(self, low: int, high: int, like: torch.Tensor) -> None:
        """Make the sum table cover labels low..high."""
        n = like.shape[1]
        if self._sums is None:
            self._offset = low
            self._sums = torch.zeros(high - low + 1, n, dtype=torch.float64, device=like.device)
            self._counts = torch.zeros(high - low + 1, dtype=torch.int64, device=like.device)
            return
        new_low, new_high = min(low, self._offset), max(high, self._offset + len(self._counts) - 1)
        if (new_low, new_high) == (self._offset, self._offset + len(self._counts) - 1):
            return
        sums = torch.zeros(new_high - new_low + 1, n, dtype=torch.float64, device=like.device)
        counts = torch.zeros(new_high - new_low + 1, dtype=torch.int64, device=like.device)
        start = self._offset - new_low
        sums[start : start + len(self._counts)] = self._sums
        counts[start : start + len(self._counts)] = self._counts
        self._sums, self._counts, self._offset = sums, counts, new_low

    def result(self) -> Centroids:
        if self._counts is None:
            raise ValueError("no states were given: call update(states, labels) with at least one position")
        present = self._counts > 0
        classes = torch.nonzero(present).flatten() + self._offset
        counts = self._counts[present]
        means = self._sums[present] / counts[:, None].to(torch.float64)
        return Centroids(to_numpy(classes).astype(np.int64), to_numpy(means), to_numpy(counts),
                         self._state_shape)


def centroids(states, labels, chunk_size: int = 64) -> Centroids:
    """Mean hidden state per ground-truth state. states [N, T, *S], labels [N, T] int."""
    chunk_size = check_positive_int("chunk_size", chunk_size)
    states, labels = as_tensor("states", states), as_tensor("labels", labels)
    check_prefix(states, labels)
    acc = CentroidAccumulator()
    for start in range(0, max(states.shape[0], 1), chunk_size):
        acc.update(states[start : start + chunk_size], labels[start : start + chunk_size])
    return acc.result()


@dataclass
class Subspace:
    """The state-distinguishing subspace U.

    basis [n, k] float64 orthonormal columns; singular_values [min(G, n)] of the centred centroid
    matrix (all of them, so the rank decision can be inspected); rtol the relative cut; M the
    smallest distance between two centroids.
    """

    basis: np.ndarray
    centroids: Centroids
    singular_values: np.ndarray
    rtol: float
    M: float

    @property
    def rank(self) -> int:
        return self.basis.shape[1]

    def projector(self) -> np.ndarray:
        """P_U = Q Q^T  [n, n]."""
        return self.basis @ self.basis.T

    def coords(self, states) -> np.ndarray:
        """Coordinates of states [..., *S] on U (relative to the mean centroid) -> [..., k] float64."""
        states = as_tensor("states", states)
        check_float("states", states)
        shape = self.centroids.state_shape
        if tuple(states.shape[states.dim() - len(shape):]) != shape:
            raise ValueError(f"states {tuple(states.shape)} must end with the state shape {shape}")
        flat = states.reshape(*states.shape[: states.dim() - len(shape)], -1).to(torch.float64)
        centre = torch.from_numpy(self.centroids.means.mean(0)).to(flat.device)
        return to_numpy((flat - centre) @ torch.from_numpy(self.basis).to(flat.device))


def state_subspace(cents: Centroids, rtol: float = 1e-6) -> Subspace:
    """U = span{c_g - c_g'}: orthonormal basis by SVD, keeping singular values > rtol * largest.

    rtol: relative rank tolerance. Centroids are float64 means of (usually float32) states, whose
    rounding is ~1e-7 relative; 1e-6 keeps every direction a float32 model can actually resolve.
    The sign of each basis vector is fixed (its largest-magnitude entry is positive).
    """
    if not isinstance(cents, Centroids):
        raise TypeError(f"cents must be a Centroids (from probes.subspace.centroids); got {type(cents).__name__}")
    if not (isinstance(rtol, float) and 0.0 < rtol < 1.0):
        raise ValueError(f"rtol must be a float in (0, 1); got {rtol!r}")
    if len(cents.classes) < 2:
        raise ValueError(
            f"U needs at least two classes; labels have a single class {cents.classes.tolist()}"
        )
    means = torch.from_numpy(cents.means)
    if not bool(torch.isfinite(means).all()):
        raise ValueError(f"the centroids of classes {cents.classes[~np.isfinite(cents.means).all(1)].tolist()[:5]} "
                         "hold NaN / Inf (non-finite states): U cannot be fitted")
    centred = means - means.mean(0)
    _, sv, vh = torch.linalg.svd(centred, full_matrices=False)   # vh [min(G, n), n]
    if float(sv[0]) == 0.0:
        raise ValueError("all centroids coincide: U = {0}; the states do not distinguish the classes")
    keep = sv > rtol * sv[0]
    basis = vh[keep].T.contiguous()                               # [n, k]
    pivot = basis.abs().argmax(0)
    basis = basis * torch.sign(basis[pivot, torch.arange(basis.shape[1])])
    return Subspace(to_numpy(basis), cents, to_numpy(sv), rtol, cents.min_separation())


CENTROIDS = ("pooled", "time", "same")


@dataclass
class DriftResult:
    """q [T] = R / M, R [T], M, steps [T] (= 1..T), distances [N, T] float64 (per sequence).

    centroids: 'pooled' (M the smallest centroid distance), 'time' (time-indexed centroids; M the
    separation M_ref at reference_step) or 'same' (time-indexed centroids, q = R_t / M_t; M = M_ref and
    separation [T] the per-step M_t); see the module docstring.
    """

    q: np.ndarray
    R: np.ndarray
    M: float
    tau: float
    statistic: str | float
    steps: np.ndarray
    distances: np.ndarray = field(repr=False)
    centroids: str = "pooled"
    reference_step: int | None = None
    separation: np.ndarray | None = field(default=None, repr=False)


def _check_statistic(statistic) -> str | float:
    if statistic == "mean":
        return "mean"
    if isinstance(statistic, bool) or not isinstance(statistic, (int, float)) or not 0 <= statistic <= 100:
        raise ValueError(f"statistic must be {STATISTICS_HELP}; got {statistic!r}")
    return float(statistic)


def _check_tau(tau) -> float:
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau > 0:
        raise ValueError(f"tau must be a positive number; got {tau!r}")
    return float(tau)


def _check_reference_step(reference_step) -> int | None:
    if reference_step is None:
        return None
    if isinstance(reference_step, bool) or not isinstance(reference_step, (int, np.integer)) or reference_step < 1:
        raise ValueError(f"reference_step must be None (the start) or an int step >= 1; got {reference_step!r}")
    return int(reference_step)


class DriftAccumulator:
    """Streams chunks (states [n_i, T, *S], labels [n_i, T]) into distances d [N, T] on U.

    centroids='pooled': distances to the subspace's (pooled) centroids, kept per chunk.
    centroids='time' or 'same': the chunks' coordinates on U [n_i, T, k] are kept, and the time-indexed
    centroids, distances, M_ref and M_t are formed in result() (module docstring).
    """

    def __init__(self, subspace: Subspace, statistic="mean", tau: float = 0.5, centroids: str = "pooled",
                 reference_step: int | None = None) -> None:
        if not isinstance(subspace, Subspace):
            raise TypeError(f"subspace must be a Subspace (state_subspace(...)); got {type(subspace).__name__}")
        if centroids not in CENTROIDS:
            raise ValueError(f"centroids must be one of {CENTROIDS}; got {centroids!r}")
        self.subspace = subspace
        self.statistic = _check_statistic(statistic)
        self.tau = _check_tau(tau)
        self.centroids = centroids
        self.reference_step = _check_reference_step(reference_step)
        self._chunks: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        self._length: int | None = None

    def update(self, states, labels) -> "DriftAccumulator":
        states, labels = as_tensor("states", states), as_tensor("labels", labels)
        check_float("states", states)
        check_int("labels", labels)
        if labels.dim() != 2:
            raise ValueError(f"labels must be [N, T]; got shape {tuple(labels.shape)}")
        check_prefix(states, labels)
        cents = self.subspace.centroids
        if tuple(states.shape[2:]) != cents.state_shape:
            raise ValueError(
                f"states have state shape {tuple(states.shape[2:])}; the centroids were computed on "
                f"{cents.state_shape}"
            )
        if self._length is not None and labels.shape[1] != self._length:
            raise ValueError(f"every chunk must have the same T; got {labels.shape[1]} after {self._length}")
        self._length = labels.shape[1]
        if self.centroids == "pooled":
            self._chunks.append(self._distances(states, labels))
        else:
            self._chunks.append(self._coords(states))
            self._labels.append(to_numpy(labels).astype(np.int64))
        return self

    def _coords(self, states: torch.Tensor) -> np.ndarray:
        """Coordinates on U [c, T, k] float64 (relative to the origin; only differences are used)."""
        basis = torch.from_numpy(self.subspace.basis).to(states.device)              # [n, k]
        return to_numpy(states.reshape(*states.shape[:2], -1).to(torch.float64) @ basis)

    def _distances(self, states: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
        device = states.device
        cents = self.subspace.centroids
        classes = torch.from_numpy(cents.classes).to(device)
        labels = labels.to(device=device, dtype=torch.int64)
        rows = torch.searchsorted(classes, labels).clamp(max=len(classes) - 1)   # [c, T]
        unknown = classes[rows] != labels
        if bool(unknown.any()):
            bad = torch.unique(labels[unknown])[:10].tolist()
            raise ValueError(
                f"labels contain classes {bad} that have no centroid; centroid classes: "
                f"{cents.classes.tolist()[:20]}"
            )
        means = torch.from_numpy(cents.means).to(device)                          # [G, n]
        basis = torch.from_numpy(self.subspace.basis).to(device)                  # [n, k]
        flat = states.reshape(*labels.shape, -1).to(torch.float64)               # [c, T, n]
        offsets = (flat - means[rows]) @ basis                                    # [c, T, k]
        return to_numpy(torch.linalg.vector_norm(offsets, dim=-1))

    def result(self) -> DriftResult:
        if not self._chunks:
            raise ValueError("no states were given: call update(states, labels) first")
        reference, per_step = None, None
        if self.centroids == "pooled":
            distances, M = np.concatenate(self._chunks, axis=0), self.subspace.M     # [N, T]
        else:
            distances, M, reference, per_step = time_indexed_distances(
                np.concatenate(self._chunks, axis=0), np.concatenate(self._labels, axis=0), self.reference_step)
        if self.statistic == "mean":
            spread = distances.mean(0)
        else:
            spread = np.percentile(distances, self.statistic, axis=0)
        if self.centroids == "same":   # R_t / M_t, kept as R = q_s * M_ref so that q = R / M
            with np.errstate(invalid="ignore", divide="ignore"):
                spread = spread * M / per_step
        steps = np.arange(1, distances.shape[1] + 1)
        return DriftResult(spread / M, spread, M, self.tau, self.statistic, steps, distances,
                           self.centroids, reference, per_step if self.centroids == "same" else None)


def time_indexed_centroids(coords: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(classes [G], c_g(t) [T, G, k] (NaN where class g is absent at step t), counts [T, G]) of
    coordinates on U [N, T, k] with labels [N, T]."""
    n, length, k = coords.shape
    classes, rows = np.unique(labels, return_inverse=True)
    G = len(classes)
    cell = (np.arange(length)[None, :] * G + rows.reshape(n, length)).ravel()       # [N*T] (t, g) cell
    counts = np.bincount(cell, minlength=length * G).reshape(length, G)             # [T, G]
    sums = np.zeros((length * G, k))
    np.add.at(sums, cell, coords.reshape(-1, k))
    with np.errstate(invalid="ignore", divide="ignore"):
        means = sums.reshape(length, G, k) / counts[..., None]
    return classes, means, counts


def step_separations(means: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """M_t [T]: the smallest distance between the centroids of two classes present at each step, from
    time-indexed centroids [T, G, k] and counts [T, G] (NaN at a step with fewer than two classes)."""
    means = np.where(counts[..., None] > 0, means, 0.0)                             # absent: NaN -> 0
    gram = np.einsum("tgk,thk->tgh", means, means)                                   # [T, G, G]
    norms = np.einsum("tgg->tg", gram)
    gaps = np.sqrt(np.maximum(norms[:, :, None] + norms[:, None, :] - 2 * gram, 0.0))
    absent = counts == 0
    gaps[absent[:, :, None] | absent[:, None, :]] = np.inf
    gaps[:, np.arange(gaps.shape[1]), np.arange(gaps.shape[1])] = np.inf
    smallest = gaps.min(axis=(1, 2))
    return np.where(np.isfinite(smallest), smallest, np.nan)


def time_indexed_distances(coords: np.ndarray, labels: np.ndarray, reference_step: int | None = None
                           ) -> tuple[np.ndarray, float, int, np.ndarray]:
    """(d_t [N, T], M_ref, t_ref, M_t [T]) from coordinates on U [N, T, k] and labels [N, T] (module
    docstring)."""
    length = coords.shape[1]
    classes, means, counts = time_indexed_centroids(coords, labels)
    rows = np.searchsorted(classes, labels)                                         # [N, T] class rows
    own = means[np.arange(length)[None, :], rows]                                   # [N, T, k]
    distances = np.linalg.norm(coords - own, axis=-1)                               # [N, T]
    present = counts > 0                                                            # [T, G]
    if reference_step is None:
        reference_step = int(np.argmax(present.sum(1))) + 1     # first step with the most classes
    if reference_step > length:
        raise ValueError(f"reference_step {reference_step} is past the horizon {length}")
    if present[reference_step - 1].sum() < 2:
        raise ValueError(f"reference_step {reference_step} has {int(present[reference_step - 1].sum())} class "
                         "present; the separation needs at least two")
    per_step = step_separations(means, counts)                                      # [T]
    separation = float(per_step[reference_step - 1])
    if separation == 0.0:
        raise ValueError(f"two classes have the same centroid at reference_step {reference_step}: M_ref = 0")
    return distances, separation, reference_step, per_step


def drift(states, labels, subspace: Subspace, statistic="mean", tau: float = 0.5,
          chunk_size: int = 32, centroids: str = "pooled", reference_step: int | None = None) -> DriftResult:
    """q(t), R(t), M of states [N, T, *S] with true states labels [N, T] (see the module docstring).

    statistic: 'mean' or a percentile in [0, 100] of the per-sequence distances at each step.
    centroids: 'pooled' (the subspace's centroids, M), 'time' (time-indexed centroids c_g(t) of
    these sequences, M_ref at reference_step; None = the first step with the most classes present) or
    'same' (time-indexed centroids, the separation M_t of the same step).
    chunk_size: sequences converted to float64 at a time (memory ~ 3 * chunk_size * T * n * 8 B).
    """
    chunk_size = check_positive_int("chunk_size", chunk_size)
    states, labels = as_tensor("states", states), as_tensor("labels", labels)
    acc = DriftAccumulator(subspace, statistic, tau, centroids, reference_step)
    check_prefix(states, labels)
    for start in range(0, states.shape[0], chunk_size):
        acc.update(states[start : start + chunk_size], labels[start : start + chunk_size])
    return acc.result()


@dataclass
class Tcross:
    """value: Tcross in steps (inf when no crossing is predicted); estimated: True when the
    horizon ended first and value comes from the drift rate eta (then also intercept a, the fit
    window start fit_start); index: 0-based position of the first crossing (None if estimated)."""

    value: float
    estimated: bool
    tau: float
    index: int | None = None
    eta: float | None = None
    intercept: float | None = None
    estimator: str | None = None
    fit_start: int | None = None


ESTIMATORS = ("rate", "line")


def tcross(result: DriftResult, tau: float | None = None, estimator: str = "rate",
           fit_start: int = 1, burn_in: int = 0) -> Tcross:
    """First step t > burn_in with q(t) > tau, or the drift-rate estimate when the horizon ends first.

    tau: defaults to the threshold the drift was computed with (0.5 unless changed).
    estimator: 'rate' (tau * M / eta, docs/drift.md) or 'line' ((tau * M - a) / eta); see the module
    docstring. fit_start: the first step (1-based, like `result.steps`) used for the slope fit.
    burn_in: the number of first steps not searched for a crossing (0: none).
    """
    if not isinstance(result, DriftResult):
        raise TypeError(f"result must be a DriftResult (from drift(...)); got {type(result).__name__}")
    tau = result.tau if tau is None else _check_tau(tau)
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}; got {estimator!r}")
    if isinstance(burn_in, bool) or not isinstance(burn_in, (int, np.integer)) or burn_in < 0:
        raise ValueError(f"burn_in must be an int >= 0 (steps not searched); got {burn_in!r}")
    above = np.flatnonzero((result.q > tau) & (result.steps > burn_in))
    if above.size:
        index = int(above[0])
        return Tcross(float(result.steps[index]), False, tau, index=index)
    steps, spread = result.steps, result.R
    valid = not isinstance(fit_start, bool) and isinstance(fit_start, (int, np.integer))
    window = steps >= fit_start if valid else None
    if not valid or window.sum() < 2:
        raise ValueError(
            f"fit_start must be an int step leaving at least two steps to fit (steps run "
            f"{int(steps[0])}..{int(steps[-1])}); got {fit_start!r}"
        )
    eta, intercept = np.polyfit(steps[window].astype(np.float64), spread[window], 1)
    target = tau * result.M if estimator == "rate" else tau * result.M - intercept
    value = float(target / eta) if eta > 0 else float("inf")
    return Tcross(value, True, tau, eta=float(eta), intercept=float(intercept),
                  estimator=estimator, fit_start=int(fit_start))

