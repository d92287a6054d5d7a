"""Per-head statistics of delta-rule (DeltaNet) heads from cached activations.

Inputs are arrays (numpy or torch), typically from `run_with_cache`:
    beta    [B, T, H]          hook_beta: the step size of each head at each token
    states  [B, T, H, V, K]    hook_state: the state matrix S_t of each head after step t

With unit-norm keys k_t, the transition I - beta_t k_t k_t^T has eigenvalues 1 (K-1 times) and
1 - beta_t (docs/deltanet-heads.md). So, per head:
    fraction_above(beta, 1)           the fraction of steps with beta > 1, i.e. with a negative
                                      transition eigenvalue 1 - beta < 0
    min_transition_eigenvalue(beta)   min over steps of 1 - beta_t = 1 - max beta
    beta_histogram(beta, bins, range) histogram counts per head (for bar charts)

Effective rank of a matrix M with singular values s_1 >= s_2 >= ... >= 0 (`effective_rank`):
    method="entropy"   exp(-sum_i p_i log p_i), p_i = s_i / sum_j s_j (Roy & Vetterli 2007): a
                       continuous rank; equals r for r equal non-zero singular values, and lies in
                       [1, rank M]; 0 for M = 0.
    method="count"     #{i : s_i > rtol * s_1}: the numerical rank at relative tolerance `rtol`.
Two uses over a trace:
    state_rank(states)        the effective rank of each S_t [V, K]: [B, T, H]
    trajectory_rank(states)   the effective rank of the centred trajectory matrix of one head,
                              rows vec(S_t) over all (b, t): the dimension of the subspace the
                              head's state moves in ([H]).
`head_statistics(beta, states)` bundles the per-head summaries as a `HeadStats`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from probes._arrays import as_tensor, check_float, check_nonnegative, check_positive_int, to_numpy

METHODS = ("entropy", "count")


def _beta(beta) -> torch.Tensor:
    beta = as_tensor("beta", beta)
    check_float("beta", beta)
    if beta.dim() < 2:
        raise ValueError(f"beta must be [B, T, H] (or any [..., H]); got shape {tuple(beta.shape)}")
    if beta.numel() == 0:
        raise ValueError(f"beta must not be empty; got shape {tuple(beta.shape)}")
    return beta


def _states(states) -> torch.Tensor:
    states = as_tensor("states", states)
    check_float("states", states)
    if states.dim() != 5:
        raise ValueError(f"states must be [B, T, H, V, K] (hook_state of a delta-rule mixer); "
                         f"got shape {tuple(states.shape)}")
    return states


def _method(method: str, rtol: float) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    if not 0.0 <= check_nonnegative("rtol", rtol) < 1.0:
        raise ValueError(f"rtol must be in [0, 1); got {rtol!r}")


def fraction_above(beta, threshold: float = 1.0) -> np.ndarray:
    """Fraction of steps with beta > threshold, per head: beta [..., H] -> [H]."""
    beta = _beta(beta)
    return to_numpy((beta > float(threshold)).flatten(0, -2).double().mean(0))


def min_transition_eigenvalue(beta) -> np.ndarray:
    """min_t (1 - beta_t) = 1 - max beta per head (unit-norm keys): beta [..., H] -> [H]."""
    beta = _beta(beta)
    return to_numpy(1.0 - beta.flatten(0, -2).double().max(0).values)


def beta_histogram(beta, bins: int = 40, range: tuple[float, float] = (0.0, 2.0)) -> tuple[np.ndarray, np.ndarray]:
    """(edges [bins + 1], counts [H, bins]) of beta per head; values outside `range` are not counted."""
    beta = to_numpy(_beta(beta).flatten(0, -2).double())                     # [M, H]
    bins = check_positive_int("bins", bins)
    lo, hi = (float(x) for x in range)
    if not lo < hi:
        raise ValueError(f"range must be (lo, hi) with lo < hi; got {range!r}")
    edges = np.linspace(lo, hi, bins + 1)
    counts = np.stack([np.histogram(beta[:, h], bins=edges)[0] for h in np.arange(beta.shape[1])])
    return edges, counts


def effective_rank(singular_values, method: str = "entropy", rtol: float = 1e-3) -> np.ndarray:
    """Effective rank from singular values [..., r] (any order, >= 0) -> [...]; see the module docstring."""
    _method(method, rtol)
    s = as_tensor("singular_values", singular_values).double()
    if s.dim() < 1 or s.shape[-1] == 0:
        raise ValueError(f"singular_values must be [..., r] with r >= 1; got shape {tuple(s.shape)}")
    if bool((s < 0).any()):
        raise ValueError("singular_values must be non-negative")
    top = s.max(-1, keepdim=True).values
    if method == "count":
        return to_numpy(((s > rtol * top) & (s > 0)).sum(-1))
    total = s.sum(-1, keepdim=True)
    p = torch.where(total > 0, s / total.clamp_min(torch.finfo(s.dtype).tiny), torch.zeros_like(s))
    entropy = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(-1)
    return to_numpy(torch.where(total[..., 0] > 0, entropy.exp(), torch.zeros_like(entropy)))


def state_rank(states, method: str = "entropy", rtol: float = 1e-3) -> np.ndarray:
    """Effective rank of every state matrix S_t: states [B, T, H, V, K] -> [B, T, H]."""
    _method(method, rtol)
    s = torch.linalg.svdvals(_states(states).double())                         # [B, T, H, min(V, K)]
    return effective_rank(s, method, rtol)


def trajectory_rank(states, method: str = "entropy", rtol: float = 1e-3, max_rows: int = 20000,
                    seed: int = 0) -> np.ndarray:
    """Dimension of the subspace each head's state moves in: [B, T, H, V, K] -> [H].

    Per head, the rows vec(S_t) over all (b, t), centred by their mean, form a matrix whose
    effective rank is returned. At most `max_rows` rows are used (a seeded random subset).
    """
    _method(method, rtol)
    states = _states(states)
    rows = states.flatten(0, 1).flatten(2)                                      # [M, H, V K]
    max_rows = check_positive_int("max_rows", max_rows)
    if rows.shape[0] > max_rows:
        keep = np.sort(np.random.default_rng(seed).choice(rows.shape[0], max_rows, replace=False))
        rows = rows[torch.from_numpy(keep)]
    rows = rows.double()
    centred = (rows - rows.mean(0)).transpose(0, 1)                             # [H, M, V K]
    return effective_rank(torch.linalg.svdvals(centred), method, rtol)


@dataclass
class HeadStats:
    """Per-head summaries ([H] arrays) of one layer; `rows()` gives one dict per head.

    beta_mean, beta_max, frac_above_1 (beta > 1), min_eigenvalue (1 - max beta),
    state_rank (mean effective rank of S_t over all b, t), trajectory_rank (of the centred
    trajectory), state_norm (mean Frobenius norm of S_t).
    """

    beta_mean: np.ndarray
    beta_max: np.ndarray
    frac_above_1: np.ndarray
    min_eigenvalue: np.ndarray
    state_rank: np.ndarray
    trajectory_rank: np.ndarray
    state_norm: np.ndarray

    def rows(self, layer: int | None = None) -> list[dict]:
        rows = []
        for h in range(len(self.beta_mean)):
            row = {} if layer is None else {"layer": layer}
            row.update({"head": h, "beta_mean": float(self.beta_mean[h]), "beta_max": float(self.beta_max[h]),
                        "frac_beta>1": float(self.frac_above_1[h]), "min_eig": float(self.min_eigenvalue[h]),
                        "state_rank": float(self.state_rank[h]), "traj_rank": float(self.trajectory_rank[h]),
                        "state_norm": float(self.state_norm[h])})
            rows.append(row)
        return rows


def head_statistics(beta, states, method: str = "entropy", rtol: float = 1e-3) -> HeadStats:
    """Per-head summaries from beta [B, T, H] and states [B, T, H, V, K] of the same layer."""
    beta, states = _beta(beta), _states(states)
    if beta.dim() != 3 or tuple(beta.shape) != tuple(states.shape[:3]):
        raise ValueError(f"beta [B, T, H] must match states [B, T, H, V, K]; got beta {tuple(beta.shape)} "
                         f"and states {tuple(states.shape)}")
    flat = beta.flatten(0, 1).double()                                           # [M, H]
    return HeadStats(
        beta_mean=to_numpy(flat.mean(0)),
        beta_max=to_numpy(flat.max(0).values),
        frac_above_1=fraction_above(beta, 1.0),
        min_eigenvalue=min_transition_eigenvalue(beta),
        state_rank=state_rank(states, method, rtol).reshape(-1, beta.shape[-1]).mean(0),
        trajectory_rank=trajectory_rank(states, method, rtol),
        state_norm=to_numpy(torch.linalg.matrix_norm(states.double()).flatten(0, 1).mean(0)),
    )
