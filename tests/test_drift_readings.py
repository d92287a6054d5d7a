"""Issue 37's drift readings and correlations: the same-step ratio (probes.subspace, centroids="same"), the
theory threshold (probes.readability.theory_threshold), the burn-in rule (probes.fisher.burn_in) and what
carries a correlation across runs (interp.analysis.correlation)."""

import math
from statistics import NormalDist

import numpy as np
import pytest

from interp.analysis import correlation as cr
from interp.analysis import error_control as ec
from probes.fisher import burn_in, readout_curve
from probes.readability import chi_quantile, theory_threshold
from probes.subspace import DriftResult, centroids, drift, state_subspace, tcross

G, K = 3, 2


def growing_states(n=60, length=30, seed=0):
    """Three classes on a triangle in R^2 with isotropic noise; states [n, T, 2], labels [n, T]."""
    rng = np.random.default_rng(seed)
    corners = np.array([[1.0, 0.0], [-0.5, 0.8660254], [-0.5, -0.8660254]])
    labels = rng.integers(0, G, size=(n, length))
    labels[:G, :] = np.arange(G)[:, None]                        # every class present at every step
    noise = rng.normal(scale=0.15, size=(n, length, K)) * np.sqrt(np.arange(1, length + 1))[None, :, None] / 4
    return corners[labels] + noise, labels


def test_same_step_q_is_invariant_to_a_per_step_rescaling_and_step_one_q_is_not():
    states, labels = growing_states()
    subspace = state_subspace(centroids(states, labels))
    scale = np.exp(np.linspace(0.0, 2.0, states.shape[1]))[None, :, None]       # the states grow 7.4x
    same = drift(states, labels, subspace, centroids="same")
    same_scaled = drift(states * scale, labels, subspace, centroids="same")
    np.testing.assert_allclose(same_scaled.q, same.q, rtol=1e-9, atol=1e-12)
    timed = drift(states, labels, subspace, centroids="time", reference_step=1)
    timed_scaled = drift(states * scale, labels, subspace, centroids="time", reference_step=1)
    np.testing.assert_allclose(timed_scaled.q, timed.q * scale.ravel(), rtol=1e-9)   # grows with the scale
    # q_s(t) is the spread of step t over the separation of step t, computed by hand
    t = 17
    x, y = states[:, t], labels[:, t]
    means = np.stack([x[y == g].mean(0) for g in range(G)])
    spread = np.linalg.norm(x - means[y], axis=1).mean()
    gap = min(np.linalg.norm(means[a] - means[b]) for a in range(G) for b in range(a))
    assert same.q[t] == pytest.approx(spread / gap, rel=1e-9)
    assert same.separation[t] == pytest.approx(gap, rel=1e-9)
    assert same.q[0] == pytest.approx(timed.q[0] * timed.M / same.separation[0])


def test_theory_threshold_is_the_closed_form_and_misreads_ten_percent_by_monte_carlo():
    z = NormalDist().inv_cdf(0.9)
    assert theory_threshold(1) == pytest.approx(math.sqrt(2 / math.pi) / (2 * z))          # E|N(0,1)|
    assert theory_threshold(2) == pytest.approx(math.sqrt(math.pi / 2) / (2 * z))          # Rayleigh mean
    assert theory_threshold(5) == pytest.approx(0.8301, abs=1e-4)
    assert chi_quantile(1, 0.5) == pytest.approx(NormalDist().inv_cdf(0.75), abs=1e-9)       # |N| median
    assert theory_threshold(3, statistic=50.0) == pytest.approx(chi_quantile(3, 0.5) / (2 * z))
    rng = np.random.default_rng(0)
    for k in (1, 5, 12):
        tau = theory_threshold(k)
        M, n = 1.0, 200_000
        sigma = M / (2 * z)
        a = rng.normal(scale=sigma, size=(n, k))                                  # class 0 at the origin
        ratio = np.linalg.norm(a, axis=1).mean() / M                              # what q reads
        misread = np.mean(a[:, 0] > M / 2)                                        # nearer to class 1 at (M, 0..)
        assert ratio == pytest.approx(tau, rel=0.01)
        assert misread == pytest.approx(0.1, abs=0.003)
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        theory_threshold(0)
    with pytest.raises(ValueError, match="error must be a number in"):
        theory_threshold(3, error=0.7)


def _curve(q):
    q = np.asarray(q, dtype=float)
    steps = np.arange(1, len(q) + 1)
    return DriftResult(q, q, 1.0, 0.5, "mean", steps, np.zeros((1, len(q))))


def test_burn_in_ignores_a_rise_before_it():
    q = [0.0, 0.6, 0.62, 0.55, 0.3, 0.3, 0.35, 0.4, 0.45, 0.52, 0.7]
    assert tcross(_curve(q)).value == 2                                  # the early rise trips the first crossing
    assert tcross(_curve(q), burn_in=4).value == 10                      # after the burn-in: the real one
    assert tcross(_curve(q), burn_in=10).value == 11
    with pytest.raises(ValueError, match="burn_in must be an int >= 0"):
        tcross(_curve(q), burn_in=-1)
    # the rule: the burn-in ends at the first step t >= 2 where the class is read at >= 90%
    assert burn_in([1.0, 0.3, 0.5, 0.95, 0.2, 1.0]) == 3                 # step 1 (one history per class) not counted
    assert burn_in([1.0, 0.95, 0.99]) == 1
    assert burn_in([1.0, 0.3, 0.4]) is None


def test_readout_curve_sees_class_structure_form():
    rng = np.random.default_rng(3)
    labels = np.tile(np.arange(G), 20)[:, None].repeat(8, 1)                    # [60, 8]
    corners = np.array([[1.0, 0.0], [-0.5, 0.87], [-0.5, -0.87]])
    noise_scale = np.array([0, 3, 3, 3, 0.05, 0.05, 0.05, 0.05])[None, :, None]  # no structure at steps 2-4
    coords = corners[labels] * (noise_scale < 1) + rng.normal(size=(60, 8, 2)) * noise_scale
    readout = readout_curve(coords, labels)
    assert readout[0] == 1.0 and np.all(readout[1:4] < 0.8) and np.all(readout[4:] == 1.0)
    assert burn_in(readout) == 4


def test_definition_crossings_hold_every_reading_and_burn_in_only_where_it_ends():
    states, labels = growing_states(length=40)
    subspace = state_subspace(centroids(states[:, :20], labels[:, :20]))
    pooled = drift(states, labels, subspace)
    timed = drift(states, labels, subspace, centroids="time")
    same = drift(states, labels, subspace, centroids="same")
    crossings = ec.definition_crossings(pooled, timed, None, 20, drift_same=same, rank=subspace.rank, burn_in=3)
    expected = [d for d in ec.DEFINITIONS if "calibrated" not in d and not d.startswith(ec.SINGLE)]
    assert list(crossings) == expected
    assert crossings["same/theory"].tau == pytest.approx(theory_threshold(subspace.rank))
    assert crossings["same/fixed"].value == tcross(same, 0.5).value
    assert crossings["time/fixed+burn-in"].value == tcross(timed, 0.5, burn_in=3).value
    assert not any(k.endswith(ec.BURN_IN) for k in ec.definition_crossings(pooled, timed, None, 20, drift_same=same))
    assert "isotropic Gaussian" in ec.reading_tests("same/theory+burn-in")
    assert "initial between-class separation" in ec.reading_tests("time/fixed")
    assert "burn-in" in ec.reading_tests("time/fixed+burn-in")


def test_within_model_r_is_zero_for_a_pure_between_model_effect():
    rng = np.random.default_rng(0)
    model_means = {"a": (4.5, 3.0), "b": (5.6, 4.8)}                              # log mp, log Tcross per model
    groups = [g for g in model_means for _ in range(200)]
    log_mp = np.array([model_means[g][0] for g in groups]) + rng.normal(scale=0.1, size=len(groups))
    log_tc = np.array([model_means[g][1] for g in groups]) + rng.normal(scale=0.1, size=len(groups))
    summary = cr.correlation_summary(np.exp(log_mp), np.exp(log_tc), groups)
    assert summary["r"] > 0.95 and abs(summary["r_within"]) < 0.15
    assert summary["runs_within"] == 400 and summary["groups"] == 2
    # a run-to-run relation inside each model: r within is high too
    log_tc = log_mp + rng.normal(scale=0.05, size=len(groups))
    assert cr.within_groups_r(np.exp(log_mp), np.exp(log_tc), groups)[0] > 0.8
    # leaving a model out leaves the other model's runs only
    left = cr.leave_one_group_out(np.exp(log_mp), np.exp(log_tc), groups)
    mine = np.array(groups) == "b"
    assert left["a"] == pytest.approx(np.corrcoef(log_mp[mine], log_tc[mine])[0, 1])
    # a model with one run carries nothing within
    assert cr.within_groups_r([1, 2, 3, 4], [1, 2, 3, 5], ["a", "b", "c", "d"]) == (pytest.approx(math.nan, nan_ok=True), 0)


def test_bootstrap_interval_covers_the_true_r_in_a_simulation():
    rng = np.random.default_rng(1)
    rho, n, trials, covered = 0.6, 40, 120, 0
    cov = [[1.0, rho], [rho, 1.0]]
    for trial in range(trials):
        x, y = np.exp(rng.multivariate_normal([0, 0], cov, size=n)).T
        low, high = cr.bootstrap_interval(x, y, resamples=400, seed=trial)
        covered += low <= rho <= high
    assert covered / trials >= 0.88          # nominal 95%; percentile intervals undercover a little at n = 40
    assert cr.bootstrap_interval([1, 2, 3], [1, 2, 3]) is None


def test_permutation_p_is_uniform_under_the_null_and_small_under_a_relation():
    rng = np.random.default_rng(2)
    ps = np.array([cr.permutation_p(np.exp(rng.normal(size=10)), np.exp(rng.normal(size=10)), permutations=199,
                                    seed=i) for i in range(300)])
    for level in (0.1, 0.25, 0.5, 0.75):
        assert np.mean(ps <= level) == pytest.approx(level, abs=0.06)
    x = np.exp(rng.normal(size=12))
    assert cr.permutation_p(x, x ** 2 * np.exp(rng.normal(scale=0.05, size=12))) < 0.01
    assert math.isnan(cr.permutation_p([1, 2], [3, 4]))


def test_wilson_interval_and_mp_interval_bounds():
    low, high = ec.wilson_interval(0.9, 1024)
    assert low < 0.9 < high and high - low == pytest.approx(2 * 1.96 * math.sqrt(0.09 / 1024), rel=0.02)
    assert ec.wilson_interval(1.0, 100)[1] == pytest.approx(1.0)


def test_reading_verdict_says_when_r_is_carried_by_the_models_alone():
    from interp.reproduce import error_control as rc

    rng = np.random.default_rng(4)

    def points(within):
        out = []
        for model, (mp, tc) in {"a": (100.0, 90.0), "b": (280.0, 250.0)}.items():
            for seed in range(6):
                noise = rng.normal(scale=0.05)
                out.append({"model": model, "seed": seed, "mp": mp * math.exp(noise),
                            "tcross": tc * math.exp(noise if within else rng.normal(scale=0.05)),
                            "tcross_estimated": False, "readable": True})
        return out

    clusters = rc.reading_row("same/theory", points(within=False), 12, 12)
    assert clusters["r between runs"] > 0.95 and abs(clusters["r within models"]) < rc.CARRIED
    assert clusters["verdict"] == "reproduces between models only"
    assert rc.claim_verdict(clusters["verdict"]) == "partly reproduces"
    related = rc.reading_row("same/theory", points(within=True), 12, 12)
    assert related["verdict"] == "reproduces" and related["r within models"] > 0.9
    assert related["tests"] == ec.reading_tests("same/theory", short=True)


def test_premise_reads_each_readings_own_threshold():
    from interp.reproduce import error_control as rc

    measures = {"q_time_train": 0.58, "q_same_train": 0.21, "q_train": 0.7, "tau": 0.5, "tau_calibrated": 0.56,
                "tau_theory": 0.83, "M": 36.0, "M_ref": 20.0}
    # time/calibrated crosses at D / M_ref = 0.56 * 36 / 20 = 1.008: 0.58 is below it
    assert rc.readable_in_distribution(measures, "time/calibrated") is True
    assert rc.readable_in_distribution(measures, "time/fixed") is False
    assert rc.readable_in_distribution(measures, "same/fixed") is True
    assert rc.readable_in_distribution(measures, "pooled/theory+burn-in") is True
    assert rc.readable_in_distribution(measures | {"q_same_train": 0.9}, "same/theory") is False


def test_paired_difference_is_zero_against_itself_and_positive_for_a_better_reading():
    rng = np.random.default_rng(0)
    mp = np.exp(rng.normal(5.0, 0.5, size=40))
    tracking = mp * np.exp(rng.normal(0, 0.1, size=40))      # log-linear in mp: r near 1
    noise = np.exp(rng.normal(5.0, 0.5, size=40))             # unrelated: r near 0
    same = cr.paired_difference(mp, tracking, tracking)
    assert same["difference"] == 0 and same["interval"] == [0.0, 0.0] and same["runs"] == 40
    better = cr.paired_difference(mp, tracking, noise)
    assert better["difference"] > 0.7 and better["interval"][0] > 0.4
    worse = cr.paired_difference(mp, noise, tracking)
    assert worse["interval"][1] < -0.4
    # a run missing from either reading is left out of both (the comparison is on the same runs)
    holed = tracking.copy(); holed[:5] = np.inf
    assert cr.paired_difference(mp, holed, noise)["runs"] == 35
    assert cr.paired_difference(mp[:3], tracking[:3], noise[:3])["interval"] is None
    with pytest.raises(ValueError, match="y_control"):
        cr.paired_difference(mp, tracking, noise[:5])


def test_the_control_reading_is_computed_from_the_readout_curve():
    states, labels = growing_states(length=40)
    subspace = state_subspace(centroids(states[:, :20], labels[:, :20]))
    pooled = drift(states, labels, subspace)
    readout = np.r_[1.0, 0.5, np.ones(30), 0.8, np.ones(7)]                    # [40]
    crossings = ec.definition_crossings(pooled, None, None, 20, burn_in=2, readout=readout)
    assert crossings[ec.READOUT].value == 2 and crossings[ec.READOUT + ec.BURN_IN].value == 33
    assert "control" in ec.reading_tests(ec.READOUT) and "threshold 0.5" not in ec.reading_tests(ec.READOUT)


def test_within_model_interval_covers_zero_without_a_relation_and_not_with_one():
    rng = np.random.default_rng(1)
    groups = [g for g in ("a", "b", "c") for _ in range(8)]
    shift = {"a": 0.0, "b": 1.5, "c": 3.0}                                        # model means far apart
    log_mp = np.array([shift[g] for g in groups]) + rng.normal(scale=0.3, size=24)
    unrelated = np.array([shift[g] for g in groups]) + rng.normal(scale=0.3, size=24)
    related = log_mp + rng.normal(scale=0.05, size=24)                            # tracks mp inside each model too
    low, high = cr.within_groups_interval(np.exp(log_mp), np.exp(unrelated), groups)
    assert low < 0 < high
    low, high = cr.within_groups_interval(np.exp(log_mp), np.exp(related), groups)
    assert low > 0.8
    # a model with one run carries nothing within; fewer than 4 runs in shared models: no interval
    assert cr.within_groups_interval([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 5.0], ["a", "a", "b", "c"]) is None
    assert cr.correlation_summary(np.exp(log_mp), np.exp(related), groups)["within_interval"][0] > 0.8
