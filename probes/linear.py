"""Linear read-outs of a latent state from hidden states: ridge (closed form) and logistic probes.

Shapes: hidden states [*P, *S] with targets indexed by the same prefix P (usually [N, T]):
    class labels       targets [*P] int          ridge regresses one-hot codes, decodes by argmax
    continuous targets targets [*P, k] float     e.g. beliefs; ridge only
The state axes S are flattened to n features.

    ridge       W, b = argmin ||X W + b - Y||^2 + alpha ||W||^2      (b not penalised)
                solved in closed form on centred data: (Xc^T Xc + alpha I) W = Xc^T Yc, in float64,
                accumulating Xc^T Xc over row chunks (two passes: means, then centred sums).
    logistic    multinomial; minimises mean cross-entropy + l2/2 ||W||^2 with torch L-BFGS
                (strong Wolfe line search) from zero weights on standardised features: deterministic.

Evaluation splits by sequence (`split_sequences(n, test_fraction, seed)`), never by position, and
reports the score at every position: accuracy for classes; for continuous targets
R^2(t) = 1 - sum_i ||y_hat[i, t] - y[i, t]||^2 / sum_i ||y[i, t] - y_bar||^2 with y_bar the mean over
all evaluated positions (pooled, so a position whose targets do not vary still has a finite score).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from probes._arrays import (
    as_tensor, check_float, check_int, check_nonnegative, check_positive_int, check_prefix, to_numpy,
)

ROW_CHUNK = 65536  # rows of X converted to float64 at a time


def split_sequences(n: int, test_fraction: float = 0.25, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A random split of n sequences: (train indices, test indices), both non-empty and sorted."""
    n = check_positive_int("n", n)
    if not isinstance(test_fraction, float) or not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be a float in (0, 1); got {test_fraction!r}")
    if n < 2:
        raise ValueError(f"a train/test split needs at least 2 sequences; got n={n}")
    order = np.random.default_rng(seed).permutation(n)
    n_test = min(max(1, int(round(test_fraction * n))), n - 1)
    return np.sort(order[n_test:]), np.sort(order[:n_test])


def _targets_kind(targets: torch.Tensor) -> str:
    if targets.dtype.is_floating_point:
        return "continuous"
    check_int("targets", targets)
    return "classes"


def _features(states, targets) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...], str]:
    """(X [m, n], targets [m] or [m, k], state shape S, kind)."""
    states, targets = as_tensor("states", states), as_tensor("targets", targets)
    check_float("states", states)
    kind = _targets_kind(targets)
    prefix = targets if kind == "classes" else targets[..., 0]
    if kind == "continuous" and targets.dim() < 2:
        raise ValueError(f"continuous targets must be [*P, k] (e.g. [N, T, k]); got {tuple(targets.shape)}")
    check_prefix(states, prefix, "targets")
    shape = tuple(states.shape[prefix.dim():])
    m = prefix.numel()
    flat_targets = targets.reshape(m) if kind == "classes" else targets.reshape(m, -1)
    return states.reshape(m, -1), flat_targets.to(states.device), shape, kind


def _one_hot(labels: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    rows = torch.searchsorted(classes, labels).clamp(max=len(classes) - 1)
    if bool((classes[rows] != labels).any()):
        bad = torch.unique(labels[classes[rows] != labels])[:10].tolist()
        raise ValueError(f"targets contain classes {bad} the probe was not trained on ({classes.tolist()[:20]})")
    return torch.nn.functional.one_hot(rows, len(classes)).to(torch.float64)


def _classes(labels: torch.Tensor) -> torch.Tensor:
    classes = torch.unique(labels.to(torch.int64))
    if len(classes) < 2:
        raise ValueError(f"targets must hold at least two classes to probe; got a single class {classes.tolist()}")
    return classes


@dataclass
class LinearProbe:
    """scores = X W + b. weight [n, k] float64, bias [k]; classes [k] int64 when it decodes classes
    (then decode = classes[argmax scores]), None for continuous targets."""

    weight: np.ndarray
    bias: np.ndarray
    state_shape: tuple[int, ...]
    classes: np.ndarray | None
    kind: str                         # "ridge" | "logistic"

    def scores(self, states) -> torch.Tensor:
        """states [*P, *S] -> [*P, k] float64 (on the states' device)."""
        states = as_tensor("states", states)
        check_float("states", states)
        nd = len(self.state_shape)
        if tuple(states.shape[states.dim() - nd:]) != self.state_shape or states.dim() <= nd:
            raise ValueError(f"states {tuple(states.shape)} must end with the probe's state shape {self.state_shape}")
        prefix = states.shape[: states.dim() - nd]
        flat = states.reshape(-1, int(np.prod(self.state_shape))).to(torch.float64)
        weight = torch.from_numpy(self.weight).to(flat.device)
        out = flat @ weight + torch.from_numpy(self.bias).to(flat.device)
        return out.reshape(*prefix, -1)

    def predict(self, states) -> np.ndarray:
        """Class labels [*P] (class probe) or continuous targets [*P, k]."""
        scores = self.scores(states)
        if self.classes is None:
            return to_numpy(scores)
        return self.classes[to_numpy(scores.argmax(-1))]


def fit_ridge(states, targets, alpha: float = 1.0) -> LinearProbe:
    """Ridge probe from states [*P, *S] to class labels [*P] (one-hot) or targets [*P, k]."""
    alpha = check_nonnegative("alpha", alpha)
    x, y, shape, kind = _features(states, targets)
    classes = None
    if kind == "classes":
        classes = _classes(y)
    m, n = x.shape
    if m < 2:
        raise ValueError(f"ridge needs at least two rows; got {m}")

    def target_rows(start: int) -> torch.Tensor:
        rows = y[start : start + ROW_CHUNK]
        return _one_hot(rows.to(torch.int64), classes) if classes is not None else rows.to(torch.float64)

    x_mean = sum(x[s : s + ROW_CHUNK].to(torch.float64).sum(0) for s in range(0, m, ROW_CHUNK)) / m
    y_mean = sum(target_rows(s).sum(0) for s in range(0, m, ROW_CHUNK)) / m
    gram = torch.zeros(n, n, dtype=torch.float64, device=x.device)
    cross = torch.zeros(n, len(y_mean), dtype=torch.float64, device=x.device)
    for start in range(0, m, ROW_CHUNK):
        xc = x[start : start + ROW_CHUNK].to(torch.float64) - x_mean     # [rows, n]
        gram += xc.T @ xc
        cross += xc.T @ (target_rows(start) - y_mean)
    gram.diagonal().add_(alpha)
    try:
        weight = torch.linalg.solve(gram, cross)                            # [n, k]
    except torch.linalg.LinAlgError as error:
        raise ValueError(f"X^T X + alpha I is singular (alpha={alpha}); use alpha > 0") from error
    bias = y_mean - x_mean @ weight
    return LinearProbe(to_numpy(weight), to_numpy(bias), shape,
                       None if classes is None else to_numpy(classes), "ridge")


def fit_logistic(states, labels, l2: float = 1e-3, max_iter: int = 500, tol: float = 1e-9) -> LinearProbe:
    """Multinomial logistic probe from states [*P, *S] to labels [*P] int (L-BFGS, deterministic).

    Stops after max_iter iterations, when the largest gradient entry is below tol, or when the
    loss changes by less than 1e-14 (float64 noise).
    """
    l2 = check_nonnegative("l2", l2)
    max_iter = check_positive_int("max_iter", max_iter)
    x, y, shape, kind = _features(states, labels)
    if kind != "classes":
        raise TypeError(f"the logistic probe decodes integer class labels; got labels of dtype {y.dtype}")
    classes = _classes(y)
    rows = torch.searchsorted(classes, y.to(torch.int64))
    x = x.to(torch.float64)
    mean, std = x.mean(0), x.std(0)
    std = torch.where(std > 0, std, torch.ones_like(std))
    z = (x - mean) / std                                                     # [m, n]
    weight = torch.zeros(x.shape[1], len(classes), dtype=torch.float64, device=x.device, requires_grad=True)
    bias = torch.zeros(len(classes), dtype=torch.float64, device=x.device, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=max_iter, tolerance_grad=tol,
                                  tolerance_change=1e-14, line_search_fn="strong_wolfe", history_size=20)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(z @ weight + bias, rows) + 0.5 * l2 * weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        raw_weight = weight / std[:, None]                                   # undo the standardisation
        raw_bias = bias - mean @ raw_weight
    return LinearProbe(to_numpy(raw_weight), to_numpy(raw_bias), shape, to_numpy(classes), "logistic")


def accuracy_per_position(probe: LinearProbe, states, labels) -> np.ndarray:
    """Fraction decoded correctly at each position: states [N, T, *S], labels [N, T] -> [T]."""
    labels = as_tensor("labels", labels)
    check_int("labels", labels)
    if probe.classes is None:
        raise ValueError("accuracy needs a class probe; this probe regresses continuous targets (use r2_per_position)")
    if labels.dim() != 2:
        raise ValueError(f"labels must be [N, T]; got shape {tuple(labels.shape)}")
    check_prefix(as_tensor("states", states), labels)
    predicted = probe.predict(states)
    return (predicted == to_numpy(labels)).mean(0)


def r2_per_position(probe: LinearProbe, states, targets) -> np.ndarray:
    """R^2 at each position (pooled y_bar, see the module docstring): targets [N, T, k] -> [T]."""
    targets = as_tensor("targets", targets)
    check_float("targets", targets)
    if probe.classes is not None:
        raise ValueError("r2 needs a continuous probe; this probe decodes classes (use accuracy_per_position)")
    if targets.dim() != 3:
        raise ValueError(f"targets must be [N, T, k]; got shape {tuple(targets.shape)}")
    check_prefix(as_tensor("states", states), targets[..., 0], "targets")
    y = to_numpy(targets).astype(np.float64)
    residual = ((probe.predict(states) - y) ** 2).sum((0, 2))
    total = ((y - y.reshape(-1, y.shape[-1]).mean(0)) ** 2).sum((0, 2))
    return 1.0 - residual / total


@dataclass
class ProbeReport:
    """probe, metric ('accuracy' or 'r2'), train/test scores pooled over positions, per_position [T]
    on the test sequences, and the split indices."""

    probe: LinearProbe
    metric: str
    train_score: float
    test_score: float
    per_position: np.ndarray
    train_index: np.ndarray
    test_index: np.ndarray


KINDS = ("ridge", "logistic")


def probe_state(states, targets, kind: str = "ridge", alpha: float = 1.0, l2: float = 1e-3,
                test_fraction: float = 0.25, seed: int = 0) -> ProbeReport:
    """Fit a probe on a seeded split of sequences and score it per position.

    states [N, T, *S]; targets [N, T] int (classes) or [N, T, k] float (ridge only).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    states, targets = as_tensor("states", states), as_tensor("targets", targets)
    train, test = split_sequences(states.shape[0], test_fraction, seed)
    train_t, test_t = torch.from_numpy(train), torch.from_numpy(test)
    x_train, y_train = states[train_t], targets[train_t]
    x_test, y_test = states[test_t], targets[test_t]
    probe = fit_ridge(x_train, y_train, alpha) if kind == "ridge" else fit_logistic(x_train, y_train, l2)
    if probe.classes is not None:
        metric = "accuracy"
        train_score = float(accuracy_per_position(probe, x_train, y_train).mean())
        per_position = accuracy_per_position(probe, x_test, y_test)
        test_score = float(per_position.mean())
    else:
        metric = "r2"
        train_score = _pooled_r2(probe, x_train, y_train)
        per_position = r2_per_position(probe, x_test, y_test)
        test_score = _pooled_r2(probe, x_test, y_test)
    return ProbeReport(probe, metric, train_score, test_score, per_position, train, test)


def _pooled_r2(probe: LinearProbe, states, targets) -> float:
    y = to_numpy(targets).astype(np.float64).reshape(-1, targets.shape[-1])
    predicted = probe.predict(states).reshape(-1, y.shape[-1])
    return float(1.0 - ((predicted - y) ** 2).sum() / ((y - y.mean(0)) ** 2).sum())
