"""Error-control analysis of a trained run (shared/SCIENCE.md section 1).

    analyze(model, task, train_length=60, lengths=(60, 100, 200, 500, 1000)) -> ErrorControl
    analyze_run(run_dir, ...) -> ErrorControl            (model and task from the run directory)
    (the report: interp.report.dynamics.write_drift_report; the command: `interp drift`)

What it computes, on the cache of one site (`site`; default: the last block's `mixer.hook_state`
when that mixer is recurrent, else the last block's `hook_resid_post`):

    U          centroids and the state-distinguishing subspace from `n_fit` in-distribution
               sequences of the training length (every position), probes.subspace;
    q(t)       the drift ratio on `n_drift` fresh sequences of the longest evaluated length
               (the horizon), measured against those centroids; Tcross its first crossing of tau,
               or the drift-rate estimate when the horizon ends first (`estimator`, `fit_start`);
    contraction  the largest singular value of Q^T J_t Q along `n_jac` in-distribution sequences
               (interp.analysis.dynamics; only when the site is a recurrent mixer's hook_state);
    accuracy   final-state accuracy at each length and mp (interp.training.evaluate).

Complex states (S4D, AUSSM, Mamba-3) are seen as real vectors view_as_real(h).flatten(), the
coordinates interp.analysis.dynamics uses for complex states. Data streams: the fit and drift sequences come
from seeds derived from `seed` on streams 2 and 3 (training uses stream 0, evaluation stream 1).
The model runs in chunks of `chunk` sequences, and the drift is accumulated chunk by chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from interp.analysis import dynamics
from interp.training.evaluate import LengthEval, check_lengths, evaluate_lengths, stream_seed
from probes.subspace import (CentroidAccumulator, DriftAccumulator, DriftResult, Subspace, Tcross,
                             state_subspace, tcross)

FIT_STREAM, DRIFT_STREAM = 2, 3
DEFAULT_LENGTHS = (60, 100, 200, 500, 1000)


@dataclass
class ErrorControl:
    """The analysis of one model on one task (see the module docstring).

    site: the hook analysed; subspace: U (centroids, basis, M); drift: q(t) on the horizon;
    tcross: Tcross (measured or estimated); tcross_excess: the crossing of the drift in excess of the
    in-distribution level (`excess_tcross`; None when the horizon is shorter than train_length + 2); contraction: None unless the site is a recurrent
    mixer's hook_state; evaluation: accuracy by length; snapshots: {step: (coords [N, k] on U,
    true states [N])} of the drift sequences at the training length and at the horizon.
    """

    site: str
    train_length: int
    subspace: Subspace
    drift: DriftResult
    tcross: Tcross
    tcross_excess: Tcross | None
    contraction: dynamics.ContractionSummary | None
    evaluation: LengthEval
    snapshots: dict[int, tuple[np.ndarray, np.ndarray]] = field(repr=False)
    name: str = "model"
    normalize: bool = False

    @property
    def mp(self) -> int | None:
        return self.evaluation.mp

    def summary(self) -> dict[str, Any]:
        """The headline numbers as a JSON-able dict."""
        c, excess = self.contraction, self.tcross_excess
        return {
            "name": self.name, "site": self.site, "train_length": self.train_length,
            "horizon": int(self.drift.steps[-1]), "rank_U": self.subspace.rank, "M": self.subspace.M,
            "tau": self.tcross.tau, "tcross": self.tcross.value, "tcross_estimated": self.tcross.estimated,
            "eta": self.tcross.eta, "tcross_excess": None if excess is None else excess.value,
            "tcross_excess_estimated": None if excess is None else excess.estimated, "normalize": self.normalize, "q_train": float(self.drift.q[min(self.train_length, len(self.drift.q)) - 1]),
            "q_end": float(self.drift.q[-1]), "mp": self.mp,
            "accuracy": {str(k): v for k, v in sorted(self.evaluation.final_accuracy.items())},
            "contraction_max": None if c is None else c.max, "contraction_mean": None if c is None else c.mean,
            "expanding_fraction": None if c is None else c.expanding,
        }


def default_site(model) -> str:
    """The last block's mixer.hook_state when that mixer is recurrent, else its hook_resid_post."""
    from models.mixers.base import RecurrentMixer

    last = len(model.blocks) - 1
    if isinstance(model.blocks[last].mixer, RecurrentMixer):
        return f"blocks.{last}.mixer.hook_state"
    return f"blocks.{last}.hook_resid_post"


def recurrent_layer(model, site: str) -> int | None:
    """The layer whose recurrent state `site` is (blocks.{l}.mixer.hook_state), else None."""
    from models.mixers.base import RecurrentMixer

    parts = site.split(".")
    if len(parts) == 4 and parts[0] == "blocks" and parts[1].isdigit() and parts[2:] == ["mixer", "hook_state"]:
        layer = int(parts[1])
        if layer < len(model.blocks) and isinstance(model.blocks[layer].mixer, RecurrentMixer):
            return layer
    return None


def real_states(states: torch.Tensor) -> torch.Tensor:
    """[B, T, *S] -> real [B, T, *S] (or [B, T, *S, 2] = view_as_real for complex states)."""
    return torch.view_as_real(states) if states.is_complex() else states


@torch.no_grad()
def site_states(model, tokens: torch.Tensor, site: str, normalize: bool = False) -> torch.Tensor:
    """The (real) cache of `site` on tokens [B, T]: [B, T, ...]; with normalize, every state is
    divided by its norm (over all its features)."""
    _, cache = model.run_with_cache(tokens, names=[site])
    if site not in cache:
        raise ValueError(f"site {site!r} was not cached; valid names: {sorted(model.hook_dict)[:40]}")
    states = real_states(cache[site]).float()
    if normalize:
        norms = torch.linalg.vector_norm(states.reshape(*states.shape[:2], -1), dim=-1)     # [B, T]
        states = states / norms.clamp_min(1e-30).reshape(*norms.shape, *([1] * (states.dim() - 2)))
    return states


def _check_int(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
    return int(value)


def analyze(model, task, train_length: int = 60, lengths=DEFAULT_LENGTHS, *, site: str | None = None,
            n_fit: int = 256, n_drift: int = 64, n_eval: int = 256, n_jac: int = 4, tau: float = 0.5,
            statistic: str | float = "mean", estimator: str = "rate", fit_start: int = 1, seed: int = 0,
            threshold: float = 0.9, chunk: int = 32, normalize: bool = False, name: str = "model") -> ErrorControl:
    """U, q(t), Tcross, contraction and accuracy by length of `model` on `task` (module docstring).

    The horizon of q(t) is max(lengths); it must be at least train_length. normalize: divide every
    state by its norm first (the view of a scale-invariant read-out; our own option, off by default).
    """
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool; got {normalize!r}")
    train_length = _check_int("train_length", train_length)
    lengths = check_lengths(lengths)
    horizon = max(lengths)
    if horizon < train_length:
        raise ValueError(f"the longest length {horizon} must be >= train_length {train_length}")
    for key, value in (("n_fit", n_fit), ("n_drift", n_drift), ("n_eval", n_eval), ("chunk", chunk)):
        _check_int(key, value)
    _check_int("n_jac", n_jac, 0)
    site = site or default_site(model)
    was_training = model.training
    model.eval()
    try:
        subspace = fit_subspace(model, task, train_length, site, n_fit, stream_seed(seed, FIT_STREAM, 0), chunk,
                                normalize=normalize)
        drift, snapshots = measure_drift(model, task, subspace, horizon, site, n_drift,
                                         stream_seed(seed, DRIFT_STREAM, 0), chunk, tau, statistic,
                                         (train_length, horizon), normalize)
        crossing = tcross(drift, estimator=estimator, fit_start=fit_start)
        layer = recurrent_layer(model, site)
        contraction = None
        if layer is not None and n_jac > 0:
            tokens = task.sample(n_jac, train_length, stream_seed(seed, FIT_STREAM, 1)).tokens
            contraction = dynamics.contraction(model, tokens, subspace.basis, layer)
        evaluation = evaluate_lengths(model, task, lengths, n=n_eval, seed=seed + 1, threshold=threshold)
    finally:
        model.train(was_training)
    excess = excess_tcross(drift, train_length) if horizon >= train_length + 2 else None
    return ErrorControl(site, train_length, subspace, drift, crossing, excess,
                        contraction, evaluation, snapshots, name, normalize)


def excess_tcross(drift: DriftResult, train_length: int, tau: float | None = None) -> Tcross:
    """Tcross of the drift in excess of its in-distribution level (our own variant, reported next to
    Tcross): q_ex(t) = q(t) - mean(q(1..train_length)); the first t with q_ex(t) > tau, else the
    fitted line a + eta t of R_ex over t >= train_length extrapolated to tau * M ('line').

    Why: a trained model's within-class spread can exceed tau * M at every step (the state carries
    more than the group element, e.g. the last token) while the model reads out perfectly; then
    Tcross = 1 says nothing, and the growth past the training length is what matters.
    """
    if drift.q.shape[0] < train_length + 2:
        raise ValueError(f"the drift horizon {drift.q.shape[0]} must exceed train_length {train_length}")
    base = float(drift.q[:train_length].mean())
    shifted = DriftResult(drift.q - base, drift.R - base * drift.M, drift.M, drift.tau, drift.statistic,
                          drift.steps, drift.distances)
    return tcross(shifted, tau, estimator="line", fit_start=train_length)


def fit_subspace(model, task, length: int, site: str, n: int, data_seed: int, chunk: int = 32,
                 rtol: float = 1e-6, normalize: bool = False) -> Subspace:
    """Centroids and U from n in-distribution sequences of `length` (every position)."""
    batch = task.sample(n, length, data_seed)
    acc = CentroidAccumulator()
    for start in range(0, n, chunk):
        states = site_states(model, batch.tokens[start:start + chunk], site, normalize)
        acc.update(states, batch.states[start:start + chunk])
    return state_subspace(acc.result(), rtol)


def measure_drift(model, task, subspace: Subspace, horizon: int, site: str, n: int, data_seed: int,
                  chunk: int = 32, tau: float = 0.5, statistic: str | float = "mean",
                  snapshot_steps=(), normalize: bool = False) -> tuple[DriftResult, dict[int, tuple[np.ndarray, np.ndarray]]]:
    """q(t) of n fresh sequences of length `horizon`, and the states on U at `snapshot_steps`."""
    batch = task.sample(n, horizon, data_seed)
    acc = DriftAccumulator(subspace, statistic, tau)
    steps = sorted({int(s) for s in snapshot_steps if 1 <= s <= horizon})
    coords: dict[int, list[np.ndarray]] = {s: [] for s in steps}
    for start in range(0, n, chunk):
        states = site_states(model, batch.tokens[start:start + chunk], site, normalize)   # [c, T, ...]
        labels = batch.states[start:start + chunk]
        acc.update(states, labels)
        for s in steps:
            coords[s].append(subspace.coords(states[:, s - 1]))
    snapshots = {s: (np.concatenate(coords[s]), batch.states[:, s - 1].numpy().copy()) for s in steps}
    return acc.result(), snapshots


def load_run(run_dir: str | Path, device: str = "cpu"):
    """(model, task, config) of a run directory written by interp.training.train."""
    import models
    from interp.training import checkpoint as ckpt
    from interp.tasks import make_task

    config = ckpt.read_config(run_dir)
    task = make_task(config["task"]["name"], **config["task"].get("options", {}))
    return models.load(run_dir, device=device), task, config


def analyze_run(run_dir: str | Path, lengths=DEFAULT_LENGTHS, device: str = "cpu", **options) -> ErrorControl:
    """`analyze` of a run directory (its task, training length and seed unless given)."""
    model, task, config = load_run(run_dir, device)
    options.setdefault("name", config["model"]["mixer"])
    options.setdefault("seed", int(config.get("seed", 0)))
    return analyze(model, task, config["train"]["train_length"], lengths, **options)


def theorem1_on_run(model, task, subspace: Subspace, layer: int, length: int = 60, seed: int = 0,
                    min_word: int = 2, max_word: int = 12) -> dict[str, float]:
    """Theorem 1 along a real word: the shortest stretch (min_word..max_word steps) of a sequence
    whose true state returns to where it was, so that the word's product is the identity.

    Returns ||Q^T J_word Q - I||_2, the premise ||F_word(c_g) - c_g|| (max over g, relative to M)
    and the word length. The site of `subspace` must be blocks.{layer}.mixer.hook_state.
    """
    batch = task.sample(8, length, stream_seed(seed, FIT_STREAM, 2))
    states = batch.states                                                           # [B, T]
    best = None
    for b in range(states.shape[0]):
        for start in range(1, length):
            stops = [stop for stop in range(start + min_word, min(length, start + max_word) + 1)
                     if int(states[b, stop - 1]) == int(states[b, start - 1])]
            if stops and (best is None or stops[0] - start < best[2] - best[1]):
                best = (b, start, stops[0])
    if best is None:
        raise ValueError(f"no returning word of at most {max_word} steps in 8 sequences of length {length}")
    b, start, stop = best
    t = dynamics.trace(model, batch.tokens[b:b + 1], layer)
    jac = dynamics.step_jacobians(t.mixer, t.inputs, t.previous)
    check = dynamics.theorem1_check(dynamics.word_jacobian(jac, start, stop), subspace.basis)
    premise = dynamics.centroid_return_error(t.mixer, t.inputs, start, stop, subspace.centroids.means)
    return {"word_length": stop - start, "deviation": float(check.deviation[0]),
            "premise_max_over_M": float(premise.max()) / subspace.M,
            "rank_U": subspace.rank, "affine": bool(t.mixer.is_affine)}

