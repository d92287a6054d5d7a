"""The paper's drift definitions: time-indexed centroids (probes.subspace, centroids="time") and the
readability threshold of a decoder (probes.readability)."""

import numpy as np
import pytest
import torch

from probes.readability import readability_threshold
from probes.subspace import (DriftAccumulator, centroids, drift, state_subspace, tcross,
                             time_indexed_centroids)

D = 6


def frame_and_means(seed=0, G=3):
    """G centroids on a circle of radius 1 in a 2-d plane of R^D (offset 5): M = 2 sin(pi / G)."""
    rng = np.random.default_rng(seed)
    frame = np.linalg.qr(rng.normal(size=(D, 2)))[0]                       # [D, 2]
    angles = 2 * np.pi * np.arange(G) / G
    means = np.stack([np.cos(angles), np.sin(angles)], 1) @ frame.T + 5.0   # [G, D]
    return frame, means


def affine_drift_system(eta, length, n_pairs=20, common=0.0, seed=1):
    """A hand-built affine recurrence that tracks C3 exactly up to a bias error: h_t = mu(s_t) + e_t with
    e_t = A e_{t-1} + b_i, A = I on U (Theorem 1: exact preservation forces the identity on U) and a
    per-sequence bias b_i of norm eta in U, plus a bias `common` shared by all sequences. Sequences
    come in pairs with the same states and opposite b_i, so each step's class means are mu_g + t *
    common exactly. Returns states [N, T, D], labels [N, T], U fitted on exact states, frame."""
    frame, means = frame_and_means()
    rng = np.random.default_rng(seed)
    labels = np.repeat(rng.integers(0, 3, size=(n_pairs, length)), 2, axis=0)    # [N, T]
    angle = rng.uniform(0, 2 * np.pi, size=n_pairs)
    own = np.stack([np.cos(angle), np.sin(angle)], 1) @ frame.T                   # [P, D] unit, in U
    bias = eta * np.repeat(own, 2, axis=0) * np.tile([1.0, -1.0], n_pairs)[:, None]   # [N, D]
    bias = bias + common * frame[:, 0]
    error = np.zeros((2 * n_pairs, D))
    states = np.empty((2 * n_pairs, length, D))
    for t in range(length):
        error = error + bias                                                       # A = I
        states[:, t] = means[labels[:, t]] + error
    sub = state_subspace(centroids(means[labels], labels))
    return states, labels, sub


def test_affine_system_with_known_drift_rate_gives_the_analytic_tcross():
    eta, M = 0.01, 2 * np.sin(np.pi / 3)
    states, labels, sub = affine_drift_system(eta, length=120, common=0.004)
    timed = drift(states, labels, sub, centroids="time", chunk_size=7)
    assert timed.centroids == "time" and timed.reference_step == 1
    assert timed.M == pytest.approx(M, rel=1e-9)                                 # initial separation = M
    np.testing.assert_allclose(timed.R, eta * timed.steps, rtol=1e-9)            # the common bias is absorbed
    found = tcross(timed)
    expected = int(np.floor(0.5 * M / eta)) + 1                                   # first t with eta t / M > 0.5
    assert not found.estimated and found.value == expected
    # the horizon ends first: the rate estimate tau M / eta is exact (R(0) = 0)
    short = drift(states[:, :30], labels[:, :30], sub, centroids="time")
    estimate = tcross(short)
    assert estimate.estimated and estimate.value == pytest.approx(0.5 * M / eta, rel=1e-9)
    # the pooled centroids see the common drift too, so their spread is larger and crosses earlier
    pooled = drift(states, labels, sub)
    assert np.all(pooled.R[1:] > timed.R[1:]) and tcross(pooled).value < expected


def test_contracting_system_never_crosses():
    frame, means = frame_and_means()
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 3, size=(40, 80))
    error = 0.3 * rng.normal(size=(40, 2)) @ frame.T                              # in U, q(1) ~ 0.2
    states = np.empty((40, 80, D))
    for t in range(80):
        error = 0.95 * error                                                       # A = 0.95 I: contracting
        states[:, t] = means[labels[:, t]] + error
    sub = state_subspace(centroids(means[labels], labels))
    for kind in ("pooled", "time"):
        result = drift(states, labels, sub, centroids=kind)
        assert np.all(result.q < 0.5) and result.R[-1] < 0.05 * result.R[0]
        found = tcross(result)
        assert found.estimated and found.eta < 0 and found.value == float("inf")


def test_time_indexed_centroids_equal_pooled_ones_on_a_stationary_process():
    frame, means = frame_and_means()
    rng = np.random.default_rng(3)
    n, length, sigma = 3000, 8, 0.2
    labels = rng.integers(0, 3, size=(n, length))
    states = means[labels] + sigma * rng.normal(size=(n, length, D))              # law independent of t
    sub = state_subspace(centroids(states, labels))
    coords = states @ sub.basis                                                   # [N, T, k]
    classes, per_step, counts = time_indexed_centroids(coords, labels)
    pooled = sub.centroids.means @ sub.basis                                      # [G, k]
    assert classes.tolist() == [0, 1, 2] and counts.sum() == n * length
    bound = 5 * sigma / np.sqrt(counts.min())                                     # 5 standard errors
    assert np.abs(per_step - pooled[None]).max() < bound
    timed, plain = drift(states, labels, sub, centroids="time"), drift(states, labels, sub)
    assert timed.M == pytest.approx(plain.M, rel=0.05)
    np.testing.assert_allclose(timed.q, plain.q, rtol=0.02)


def test_time_indexed_drift_streams_and_checks_its_reference_step():
    states, labels, sub = affine_drift_system(0.02, length=20)
    acc = DriftAccumulator(sub, centroids="time", reference_step=5)
    for start in range(0, len(states), 6):
        acc.update(torch.tensor(states[start:start + 6], dtype=torch.float64), labels[start:start + 6])
    streamed, whole = acc.result(), drift(states, labels, sub, centroids="time", reference_step=5)
    np.testing.assert_allclose(streamed.q, whole.q, rtol=1e-12)
    assert whole.reference_step == 5
    with pytest.raises(ValueError, match="reference_step 21 is past the horizon 20"):
        drift(states, labels, sub, centroids="time", reference_step=21)
    with pytest.raises(ValueError, match="reference_step must be None"):
        drift(states, labels, sub, centroids="time", reference_step=0)
    with pytest.raises(ValueError, match="centroids must be one of"):
        drift(states, labels, sub, centroids="step")


def margin_decoder(boundary):
    """Two classes at -1 and +1 along e_0 of R^3 (M = 2); read class 1 where x_0 > boundary."""
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 2, size=(200, 10))
    states = np.zeros((200, 10, 3))
    states[..., 0] = 2.0 * labels - 1.0
    sub = state_subspace(centroids(states, labels))                               # U = e_0, M = 2
    states[..., 1:] = rng.normal(size=(200, 10, 2))                               # off U: ignored
    return states, labels, sub, lambda h: (h[..., 0] > boundary).long()


@pytest.mark.parametrize("direction", ["random", "nearest"])
def test_calibrated_tau_of_a_decoder_with_a_known_margin(direction):
    # class 1 is misread once moved by more than 1 - 0.3 = 0.7 = 0.35 M towards class 0 (class 0 only
    # past 0.65 M): a random direction moves half of class 1 that way, so accuracy falls to ~0.75 < 0.9
    states, labels, sub, decode = margin_decoder(0.3)
    assert sub.M == pytest.approx(2.0)
    cal = readability_threshold(decode, torch.tensor(states), labels, sub, direction=direction, refine=7)
    resolution = 0.1 / 2 ** 7
    assert cal.fits and not cal.censored and cal.base_accuracy == 1.0
    assert 0.35 - resolution <= cal.tau <= 0.35
    assert cal.displacement == pytest.approx(cal.tau * 2.0)
    assert cal.tau_for(1.0) == pytest.approx(cal.displacement)
    assert np.all(cal.accuracy[cal.ratios <= cal.tau] >= 0.9) and cal.accuracy[cal.ratios > cal.tau].max() < 0.9
    symmetric = readability_threshold(margin_decoder(0.0)[3], torch.tensor(states), labels, sub, refine=7)
    assert 0.5 - resolution <= symmetric.tau <= 0.5                               # nearest-centroid margin


def test_calibration_premise_and_bad_inputs():
    states, labels, sub, _ = margin_decoder(0.0)
    wrong = readability_threshold(lambda h: torch.zeros(h.shape[:2], dtype=torch.long), states, labels, sub)
    assert not wrong.fits and np.isnan(wrong.tau) and wrong.base_accuracy < 0.9
    robust = readability_threshold(lambda h: torch.as_tensor(labels), states, labels, sub)
    assert robust.censored and robust.tau == 2.0                                  # never fails: a lower bound
    with pytest.raises(ValueError, match="direction must be one of"):
        readability_threshold(lambda h: labels, states, labels, sub, direction="up")
    with pytest.raises(ValueError, match="ratios must be increasing, start at 0"):
        readability_threshold(lambda h: labels, states, labels, sub, ratios=[0.1, 0.2])
    with pytest.raises(ValueError, match=r"decode must return predictions \[N, T\]"):
        readability_threshold(lambda h: labels[:, :3], states, labels, sub)
    with pytest.raises(TypeError, match="decode must be a callable"):
        readability_threshold(None, states, labels, sub)
