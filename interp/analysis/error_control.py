"""Error-control analysis of a trained run (docs/drift.md).

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
    q_t(t)     the same sequences' spread around the time-indexed centroids c_g(t) relative to the
               separation M_ref at `reference_step` (probes.subspace, centroids="time");
    q_s(t)     the same spread relative to the separation M_t of the same step (centroids="same");
    A(t)       the nearest-centroid read-out of the same sequences on U at each step (probes.fisher
               .readout_curve) and the burn-in B it gives (probes.fisher.burn_in);
    tau_cal    the readability threshold of the model's own read-out (probes.readability): states
               of `n_calibrate` fresh in-distribution sequences moved by r * M along U (random unit
               directions, or `direction="nearest"`), replaced at `site` (every position at once)
               and read by the rest of the model; tau_cal the largest r up to which the prediction
               equals the target at >= `threshold` (0.9) of the loss positions;
    contraction  the largest singular value of Q^T J_t Q along `n_jac` in-distribution sequences
               (interp.analysis.dynamics; only when the site is a recurrent mixer's hook_state);
    accuracy   final-state accuracy at each length and mp (interp.training.evaluate).
    F(t)       the Fisher separation of the same drift sequences (probes.fisher: the smallest distance
               between the class centroids of step t in within-class-whitened U; it counts only the
               spread that confuses classes);
    readout    `centroid_readout` at the training length (n_fit fresh sequences): whether the class is
               read from U by nearest centroid where the model is right (every centroid drift presupposes
               it), and the isotropic spread over the separation there.

Definitions of Tcross (`crossings`, keyed "DRIFT/THRESHOLD"; `definition` and `tau` pick the headline
`tcross`): DRIFT is
    pooled     q(t) = R(t) / M, pooled centroids (the toolkit's first definition);
    excess     q(t) - mean q(1..train_length), the drift in excess of its in-distribution level
               (`excess_tcross`; our own variant);
    time       q_t(t) = R_t(t) / M_ref, time-indexed centroids (the paper's reading);
    same       q_s(t) = R_t(t) / M_t(t), time-indexed centroids and the separation of the same step
               (scale-invariant; our reading of the decoder's view);
and THRESHOLD is `fixed` (the number `tau`, 0.5 by default), `calibrated` (the displacement
D = tau_cal * M as a ratio to that drift's separation: tau_cal for pooled and excess, D / M_ref for
time and same, whose R is in units of M_ref) or `theory` (probes.readability.theory_threshold of U's
rank: the ratio at which the closest pair of isotropic Gaussian classes errs 10%). Calibrated
crossings exist only where the read-out fits (tau_cal is defined); a headline that does not exist is
NaN. FISHER ("fisher/fixed", our own) is the first step with F(t) below probes.fisher.FISHER_LEVEL
(2.563, where a linear read-out of two Gaussian classes errs 10%). READOUT ("readout/fixed", our
control) is the first step with A(t) below probes.fisher.READOUT_LEVEL (0.9): no drift at all, the
nearest-centroid accuracy on U itself; a reading whose Tcross correlates with mp no better than this
one says nothing beyond accuracy. A key ending in BURN_IN
("+burn-in") is the same reading with the first B steps not searched (probes.fisher.burn_in: before
the class is first read from U); it is undefined where the read-out never forms. READING_TESTS says
which of the seed's sentences each part tests (docs/drift.md).

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
from probes.fisher import burn_in, fisher_curve, fisher_tcross, readout_curve, readout_tcross, separation
from probes.readability import DIRECTIONS, Calibration, readability_threshold, theory_threshold
from probes.subspace import (CentroidAccumulator, DriftAccumulator, DriftResult, Subspace, Tcross,
                             state_subspace, tcross)

FIT_STREAM, DRIFT_STREAM = 2, 3
DEFAULT_LENGTHS = (60, 100, 200, 500, 1000)
DRIFTS = ("pooled", "excess", "time", "same")
THRESHOLDS = ("fixed", "calibrated", "theory")
FISHER = "fisher/fixed"   # F(t) below probes.fisher.FISHER_LEVEL (our own; no calibrated variant)
READOUT = "readout/fixed"   # A(t) below probes.fisher.READOUT_LEVEL: the control reading (accuracy on U, no drift)
BURN_IN = "+burn-in"      # suffix: the reading with the burn-in steps not searched (probes.fisher.burn_in)
BURNED = ("pooled", "time", "same")   # the drifts read from step 1 (excess starts at the training length)
DEFINITIONS = (tuple(f"{d}/{t}" for d in DRIFTS for t in THRESHOLDS) + (FISHER, READOUT)
               + tuple(f"{d}/{t}{BURN_IN}" for d in BURNED for t in THRESHOLDS) + (FISHER + BURN_IN, READOUT + BURN_IN))
SINGLE = ("fisher", "readout")   # readings with one threshold of their own (no fixed / calibrated / theory choice)
# What each part of a reading tests: the seed's sentence (000_0db3ca63d101e4d0.txt, arXiv 2605.07755) or ours.
READING_TESTS = {
    "pooled": "the S3 sentence's 'q(t) crosses the threshold' with centroids pooled over the training length "
              "(the toolkit's first reading; stationary centroids)",
    "excess": "ours: the pooled drift's growth past its in-distribution level",
    "time": "the abstract's 'within-class spread ... small relative to the initial between-class separation' "
            "(step-t centroids, separation at the start)",
    "same": "the abstract's 'distinguishability ratio crosses the readability threshold' as the decoder sees "
            "step t (spread and separation of the same step; scale-invariant)",
    "fisher": "ours: the class separation in within-class-whitened U (only spread that confuses classes)",
    "readout": "control (ours): the class read from U by the nearest centroid of step t at 90%; no drift, accuracy "
               "on U itself (a reading no better than this one restates accuracy)",
    "fixed": "the S3 sentence's 'threshold 0.5'",
    "calibrated": "'the readability threshold of the trained decoder' (its own read-out, 90%)",
    "theory": "the readability level of an ideal read-out of isotropic Gaussian classes in U's dimension (the "
              "closest pair errs 10%)",
    BURN_IN: "first crossing after the burn-in (steps before the class is first read from U at 90% not searched)",
}


# The same, in a few words (a table column)
READING_SHORT = {"pooled": "S3 sentence, pooled centroids", "excess": "ours: growth past training",
                 "time": "abstract: initial separation", "same": "abstract: decoder's view of step t",
                 "fisher": "ours: whitened separation", "readout": "control: nearest-centroid accuracy on U",
                 "fixed": "threshold 0.5", "calibrated": "trained decoder's threshold",
                 "theory": "isotropic-Gaussian readability", BURN_IN: "after burn-in"}


def reading_tests(key: str, short: bool = False) -> str:
    """What the reading `key` ("DRIFT/THRESHOLD[+burn-in]") tests, in the seed's words (READING_TESTS; short:
    READING_SHORT)."""
    words = READING_SHORT if short else READING_TESTS
    base, burned = (key[: -len(BURN_IN)], True) if key.endswith(BURN_IN) else (key, False)
    drift, threshold = base.split("/")
    parts = [words[drift]] + ([] if drift in SINGLE else [words[threshold]])
    return "; ".join(parts + ([words[BURN_IN]] if burned else []))


@dataclass
class ErrorControl:
    """The analysis of one model on one task (see the module docstring).

    site: the hook analysed; subspace: U (centroids, basis, M); drift: q(t) on the horizon (pooled
    centroids); drift_time: q_t(t) (time-indexed centroids, M_ref); calibration: tau_cal of the
    read-out (None when not calibrated); crossings: {"DRIFT/THRESHOLD": Tcross} for every defined
    definition (module docstring); definition: the headline's key; tcross: the headline Tcross
    (measured or estimated; NaN when its definition is undefined); tcross_excess: the excess-drift
    crossing at the fixed tau (None when the horizon is shorter than train_length + 2);
    contraction: None unless the site is a recurrent mixer's hook_state; evaluation: accuracy by
    length; snapshots: {step: (coords [N, k] on U, true states [N])} of the drift sequences at the
    training length and at the horizon.
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
    drift_time: DriftResult | None = None
    calibration: Calibration | None = None
    crossings: dict[str, Tcross] = field(default_factory=dict)
    definition: str = "pooled/fixed"
    fisher: np.ndarray | None = field(default=None, repr=False)   # F(t) [horizon], probes.fisher
    readout: dict[str, float] | None = None   # centroid_readout at the training length (probes.fisher.separation)
    drift_same: DriftResult | None = None      # q_s(t): time-indexed centroids, separation of the same step
    readout_steps: np.ndarray | None = field(default=None, repr=False)   # A(t) [horizon], probes.fisher.readout_curve
    burn_in: int | None = None                  # B (probes.fisher.burn_in); None: the read-out never forms

    @property
    def mp(self) -> int | None:
        return self.evaluation.mp

    def definition_rows(self) -> list[dict[str, Any]]:
        """One row per definition in DEFINITIONS: {"definition", "tau", "tcross", "tcross_estimated",
        "tests"} (tau and tcross NaN where the definition is undefined, e.g. no calibration; tests: the
        seed's sentence it reads, reading_tests)."""
        rows = []
        for key in DEFINITIONS:
            cross = self.crossings.get(key)
            rows.append({"definition": key, "tau": float("nan") if cross is None else cross.tau,
                         "tcross": float("nan") if cross is None else cross.value,
                         "tcross_estimated": None if cross is None else cross.estimated,
                         "tests": reading_tests(key)})
        return rows

    def summary(self) -> dict[str, Any]:
        """The headline numbers as a JSON-able dict (every definition's Tcross under
        "tcross_by_definition" / "tcross_estimated_by_definition")."""
        c, excess, cal, timed, same = (self.contraction, self.tcross_excess, self.calibration, self.drift_time,
                                       self.drift_same)
        at_train = min(self.train_length, len(self.drift.q)) - 1
        return {
            "name": self.name, "site": self.site, "train_length": self.train_length,
            "horizon": int(self.drift.steps[-1]), "rank_U": self.subspace.rank, "M": self.subspace.M,
            "definition": self.definition,
            "tau": self.tcross.tau, "tcross": self.tcross.value, "tcross_estimated": self.tcross.estimated,
            "eta": self.tcross.eta, "tcross_excess": None if excess is None else excess.value,
            "tcross_excess_estimated": None if excess is None else excess.estimated, "normalize": self.normalize,
            "q_train": float(self.drift.q[at_train]), "q_end": float(self.drift.q[-1]),
            "M_ref": None if timed is None else timed.M,
            "reference_step": None if timed is None else timed.reference_step,
            "q_time_train": None if timed is None else float(timed.q[at_train]),
            "q_time_end": None if timed is None else float(timed.q[-1]),
            "q_same_train": None if same is None else float(same.q[at_train]),
            "q_same_end": None if same is None else float(same.q[-1]),
            "tau_theory": theory_threshold(self.subspace.rank, statistic=self.drift.statistic),
            "burn_in": self.burn_in,
            "tau_calibrated": None if cal is None else cal.tau,
            "tau_calibrated_censored": None if cal is None else cal.censored,
            "fisher_train": None if self.fisher is None else float(self.fisher[at_train]),
            "centroid_readout_train": None if self.readout is None else self.readout["nearest_centroid_accuracy"],
            "spread_over_separation_train": None if self.readout is None else self.readout["spread_over_separation"],
            "fisher_end": None if self.fisher is None else float(self.fisher[-1]),
            "tcross_by_definition": {row["definition"]: row["tcross"] for row in self.definition_rows()},
            "tcross_estimated_by_definition": {row["definition"]: row["tcross_estimated"]
                                               for row in self.definition_rows()},
            "readings": self.definition_rows(),
            "mp": self.mp,
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


def _check_definition(definition: str, tau) -> tuple[str, str]:
    if definition not in DRIFTS:
        raise ValueError(f"definition must be one of {DRIFTS}; got {definition!r}")
    if tau in ("calibrated", "theory"):
        return definition, tau
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau > 0:
        raise ValueError(f"tau must be a positive number, 'calibrated' or 'theory'; got {tau!r}")
    return definition, "fixed"


def analyze(model, task, train_length: int = 60, lengths=DEFAULT_LENGTHS, *, site: str | None = None,
            n_fit: int = 256, n_drift: int = 64, n_eval: int = 256, n_jac: int = 4, tau: float | str = 0.5,
            statistic: str | float = "mean", estimator: str = "rate", fit_start: int = 1, seed: int = 0,
            threshold: float = 0.9, chunk: int = 32, normalize: bool = False, name: str = "model",
            definition: str = "pooled", reference_step: int | None = None, calibrate: bool = True,
            n_calibrate: int = 64, direction: str = "random", evaluation: LengthEval | None = None) -> ErrorControl:
    """U, q(t), q_t(t), tau_cal, every definition's Tcross, contraction and accuracy by length of
    `model` on `task` (module docstring).

    The horizon of q(t) is max(lengths); it must be at least train_length. tau: the fixed threshold
    (a number, 0.5) or "calibrated" for the headline; definition: the headline's drift ("pooled",
    "excess", "time"); reference_step: t_ref of M_ref (None: the first step with every class);
    calibrate: measure tau_cal (needed for tau="calibrated"; tau="theory" needs none) on n_calibrate sequences, with
    `threshold` as its accuracy level; normalize: divide every state by its norm first (the view of
    a scale-invariant read-out; our own option, off by default); evaluation: accuracy by length already
    measured on this model (e.g. at another site: it is the model's, not a site's), used instead of
    measuring it again; its lengths must be `lengths`.
    """
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool; got {normalize!r}")
    if not isinstance(calibrate, bool):
        raise TypeError(f"calibrate must be a bool; got {calibrate!r}")
    drift_name, threshold_name = _check_definition(definition, tau)
    if threshold_name == "calibrated" and not calibrate:
        raise ValueError("tau='calibrated' needs calibrate=True")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}; got {direction!r}")
    fixed_tau = float(tau) if threshold_name == "fixed" else 0.5
    train_length = _check_int("train_length", train_length)
    lengths = check_lengths(lengths)
    horizon = max(lengths)
    if horizon < train_length:
        raise ValueError(f"the longest length {horizon} must be >= train_length {train_length}")
    for key, value in (("n_fit", n_fit), ("n_drift", n_drift), ("n_eval", n_eval), ("chunk", chunk),
                       ("n_calibrate", n_calibrate)):
        _check_int(key, value)
    _check_int("n_jac", n_jac, 0)
    site = site or default_site(model)
    was_training = model.training
    model.eval()
    try:
        subspace = fit_subspace(model, task, train_length, site, n_fit, stream_seed(seed, FIT_STREAM, 0), chunk,
                                normalize=normalize)
        drifts = measure_drifts(
            model, task, subspace, horizon, site, n_drift, stream_seed(seed, DRIFT_STREAM, 0), chunk,
            fixed_tau, statistic, (train_length, horizon), normalize, reference_step)
        readout = centroid_readout(model, task, subspace, train_length, site, n_fit, stream_seed(seed, FIT_STREAM, 5),
                                   chunk, normalize)
        calibration = None
        if calibrate:
            calibration = calibrate_readout(model, task, subspace, train_length, site, n_calibrate,
                                            stream_seed(seed, FIT_STREAM, 4), chunk, threshold, normalize,
                                            direction, seed)
        layer = recurrent_layer(model, site)
        contraction = None
        if layer is not None and n_jac > 0:
            tokens = task.sample(n_jac, train_length, stream_seed(seed, FIT_STREAM, 1)).tokens
            contraction = dynamics.contraction(model, tokens, subspace.basis, layer)
        if evaluation is None:
            evaluation = evaluate_lengths(model, task, lengths, n=n_eval, seed=seed + 1, threshold=threshold)
        elif sorted(evaluation.final_accuracy) != lengths:
            raise ValueError(f"evaluation has lengths {sorted(evaluation.final_accuracy)}; analyze was given {lengths}")
    finally:
        model.train(was_training)
    start = burn_in(drifts.readout)
    crossings = definition_crossings(drifts.pooled, drifts.time, calibration, train_length, estimator, fit_start,
                                     drifts.fisher, drift_same=drifts.same, rank=subspace.rank,
                                     burn_in=start, readout=drifts.readout)
    key = f"{drift_name}/{threshold_name}"
    headline = crossings.get(key, Tcross(float("nan"), False, float("nan")))
    excess = crossings.get("excess/fixed")
    return ErrorControl(site, train_length, subspace, drifts.pooled, headline, excess,
                        contraction, evaluation, drifts.snapshots, name, normalize, drifts.time, calibration,
                        crossings, key, drifts.fisher, readout, drifts.same, drifts.readout, start)


def definition_crossings(drift: DriftResult, drift_time: DriftResult | None, calibration: Calibration | None,
                         train_length: int, estimator: str = "rate", fit_start: int = 1,
                         fisher: np.ndarray | None = None, *, drift_same: DriftResult | None = None,
                         rank: int | None = None, burn_in: int | None = None,
                         readout: np.ndarray | None = None) -> dict[str, Tcross]:
    """{"DRIFT/THRESHOLD[+burn-in]": Tcross} of every definition that is defined (module docstring): the
    excess drift needs a horizon of at least train_length + 2, the calibrated threshold a read-out
    that fits (tau_cal finite), the time and same drifts drift_time and drift_same, FISHER the curve F(t),
    READOUT the curve A(t), the theory threshold U's rank (None: no theory readings), the +burn-in readings
    a burn-in B (None: undefined)."""
    taus = {"fixed": drift.tau, **({"theory": theory_threshold(rank, statistic=drift.statistic)} if rank else {})}
    if calibration is not None and calibration.fits and calibration.tau > 0:
        taus["calibrated"] = calibration.tau
    out: dict[str, Tcross] = {}
    starts = {"": 0, **({BURN_IN: burn_in} if burn_in is not None else {})}
    for threshold_name, value in taus.items():
        if drift.q.shape[0] >= train_length + 2:
            out[f"excess/{threshold_name}"] = excess_tcross(drift, train_length, value)
        for suffix, start in starts.items():
            for name, result in (("pooled", drift), ("time", drift_time), ("same", drift_same)):
                if result is None:
                    continue
                tau = calibration.tau_for(result.M) if threshold_name == "calibrated" and name != "pooled" else value
                out[f"{name}/{threshold_name}{suffix}"] = tcross(result, tau, estimator=estimator,
                                                                 fit_start=fit_start, burn_in=start)
    if fisher is not None:
        for suffix, start in starts.items():
            out[FISHER + suffix] = fisher_tcross(fisher, burn_in=start)
    if readout is not None:
        for suffix, start in starts.items():
            out[READOUT + suffix] = readout_tcross(readout, burn_in=start)
    return {key: out[key] for key in DEFINITIONS if key in out}



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
        check_finite_states(states, site, length)
        acc.update(states, batch.states[start:start + chunk])
    return state_subspace(acc.result(), rtol)


def check_finite_states(states: torch.Tensor, site: str, length: int) -> None:
    """ValueError naming the hook and the first position where states [B, T, ...] hold NaN / Inf
    (U's SVD would fail on them with a LinAlgError far from the cause)."""
    bad = ~torch.isfinite(states.reshape(*states.shape[:2], -1)).all(-1).all(0)   # [T]
    if bool(bad.any()):
        raise ValueError(f"hook {site} holds NaN / Inf states from position {int(bad.nonzero()[0, 0])} of the "
                         f"in-distribution sequences of length {length}; the model's states overflow, so U cannot "
                         "be fitted")


@dataclass
class Drifts:
    """measure_drifts' results on the same sequences: q(t) pooled, q_t(t) time, q_s(t) same [horizon] each,
    snapshots {step: (coords [N, k], classes [N])}, F(t) fisher [horizon], A(t) readout [horizon]."""

    pooled: DriftResult
    time: DriftResult
    same: DriftResult
    snapshots: dict[int, tuple[np.ndarray, np.ndarray]]
    fisher: np.ndarray
    readout: np.ndarray


def measure_drifts(model, task, subspace: Subspace, horizon: int, site: str, n: int, data_seed: int,
                   chunk: int = 32, tau: float = 0.5, statistic: str | float = "mean", snapshot_steps=(),
                   normalize: bool = False, reference_step: int | None = None) -> Drifts:
    """q(t) (pooled centroids), q_t(t) and q_s(t) (time-indexed centroids against the initial and the same
    step's separation), F(t) and the read-out A(t) (probes.fisher) of the same n fresh sequences of length
    `horizon`, and the states on U at `snapshot_steps`."""
    batch = task.sample(n, horizon, data_seed)
    pooled = DriftAccumulator(subspace, statistic, tau)
    timed = DriftAccumulator(subspace, statistic, tau, centroids="time", reference_step=reference_step)
    same = DriftAccumulator(subspace, statistic, tau, centroids="same", reference_step=reference_step)
    steps = sorted({int(s) for s in snapshot_steps if 1 <= s <= horizon})
    chunks = []                                                                           # [c, T, k] each
    for start in range(0, n, chunk):
        states = site_states(model, batch.tokens[start:start + chunk], site, normalize)   # [c, T, ...]
        labels = batch.states[start:start + chunk]
        pooled.update(states, labels)
        timed.update(states, labels)
        same.update(states, labels)
        chunks.append(subspace.coords(states))
    on_u = np.concatenate(chunks)                                                         # [n, T, k]
    snapshots = {s: (on_u[:, s - 1].copy(), batch.states[:, s - 1].numpy().copy()) for s in steps}
    labels = batch.states.numpy()
    return Drifts(pooled.result(), timed.result(), same.result(), snapshots, fisher_curve(on_u, labels),
                  readout_curve(on_u, labels))


@torch.no_grad()
def centroid_readout(model, task, subspace: Subspace, length: int, site: str, n: int, data_seed: int,
                     chunk: int = 32, normalize: bool = False) -> dict[str, float]:
    """Whether U carries the state the way the drift ratio assumes, at step `length` of n fresh in-distribution
    sequences (where a fitted run is right): "nearest_centroid_accuracy" (each state on U read as the class of
    the nearest step-`length` centroid; chance is 1 / classes: the class is then not in U's centroid geometry),
    "spread_over_separation" (mean distance to the own centroid / smallest centroid distance: the isotropic
    view q takes) and "fisher_separation" (the smallest centroid distance in within-class-whitened U
    coordinates, pooled covariance: where it is large while the isotropic ratio is too, the spread lies
    along directions that do not separate classes and q overstates the confusion)."""
    batch = task.sample(n, length, data_seed)
    coords = np.concatenate([subspace.coords(site_states(model, batch.tokens[i:i + chunk], site, normalize)[:, -1])
                             for i in range(0, n, chunk)])                                            # [n, k]
    return separation(coords, batch.states[:, length - 1].numpy())


@torch.no_grad()
def calibrate_readout(model, task, subspace: Subspace, length: int, site: str, n: int, data_seed: int,
                      chunk: int = 32, threshold: float = 0.9, normalize: bool = False,
                      direction: str = "random", seed: int = 0, **options) -> Calibration:
    """tau_cal of the model's read-out from `site` (probes.readability.readability_threshold) on n
    fresh in-distribution sequences of `length`: the moved states replace the site's activations at
    every position (mapped back to the model's coordinates: times the state norm with normalize,
    complex again for complex states), and a position reads correctly when the argmax of the logits
    equals the target; loss positions are counted. options go to readability_threshold (ratios,
    refine)."""
    batch = task.sample(n, length, data_seed)
    _, cache = model.run_with_cache(batch.tokens, names=[site])
    if site not in cache:
        raise ValueError(f"site {site!r} was not cached; valid names: {sorted(model.hook_dict)[:40]}")
    raw = cache[site]
    real = real_states(raw).float()                                                    # [N, T, ...]
    norms = torch.linalg.vector_norm(real.reshape(*real.shape[:2], -1), dim=-1).clamp_min(1e-30)   # [N, T]
    norms = norms.reshape(*norms.shape, *([1] * (real.dim() - 2)))
    states = real / norms if normalize else real

    def decode(moved: torch.Tensor) -> torch.Tensor:
        values = moved * norms if normalize else moved
        if raw.is_complex():
            values = torch.view_as_complex(values.contiguous())
        values = values.to(raw.dtype)
        predictions = []
        for start in range(0, n, chunk):
            replacement = values[start:start + chunk]
            logits = model.run_with_hooks(batch.tokens[start:start + chunk],
                                          fwd_hooks=[(site, lambda x, hook, r=replacement: r)])
            predictions.append(logits.argmax(-1))
        return torch.cat(predictions)

    return readability_threshold(decode, states, batch.states, subspace, targets=batch.targets,
                                 mask=batch.loss_mask, threshold=threshold, direction=direction, seed=seed,
                                 **options)


MP_FACTORS = (0.75, 0.85, 0.95, 1.0, 1.05, 1.15, 1.3, 1.5)   # lengths around mp evaluated for its interval
MP_N = 1024   # sequences per length for mp's interval (issue 37: n >= 1024 near the 90% threshold)


def wilson_interval(accuracy: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion `accuracy` over n trials."""
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(centre - half), float(centre + half)


def mp_interval(model, task, mp: int, n: int = MP_N, seed: int = 0, threshold: float = 0.9,
                factors=MP_FACTORS) -> dict[str, Any]:
    """mp with a 95% interval: final-state accuracy at n fresh sequences per length at mp x factors; "low" the
    longest evaluated length up to which every evaluated length passes surely (the Wilson interval's lower
    end >= threshold), "high" the shortest that fails surely (upper end < threshold), "mp" the longest
    passing length at this n; None where no evaluated length qualifies. "accuracy": {length: accuracy}."""
    mp = _check_int("mp", mp)
    lengths = sorted({max(1, round(mp * f)) for f in factors})
    accuracy = evaluate_lengths(model, task, lengths, n=n, seed=seed, threshold=threshold).final_accuracy
    bounds = {length: wilson_interval(accuracy[length], n) for length in lengths}
    low = None
    for length in lengths:
        if bounds[length][0] < threshold:
            break
        low = length
    high = next((length for length in lengths if bounds[length][1] < threshold), None)
    passing = [length for length in lengths if accuracy[length] >= threshold]
    return {"mp": max(passing) if passing else None, "low": low, "high": high, "n": n,
            "accuracy": {str(k): float(v) for k, v in sorted(accuracy.items())}}


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

