"""probes.subspace: centroids, U, drift q(t), Tcross."""

import numpy as np
import pytest
import torch

from probes.subspace import (
    CentroidAccumulator, DriftAccumulator, centroids, drift, state_subspace, tcross,
)

G, N, T, D = 3, 12, 40, 6


def planted(seed=0):
    """Three centroids in a 2-d plane of R^6 (rank 2), random labels [N, T]."""
    rng = np.random.default_rng(seed)
    frame = np.linalg.qr(rng.normal(size=(D, 2)))[0]                    # [D, 2]
    angles = 2 * np.pi * np.arange(G) / G
    means = np.stack([np.cos(angles), np.sin(angles)], 1) @ frame.T + 5.0   # [G, D], offset 5
    labels = rng.integers(0, G, size=(N, T))
    return means, labels, frame


def test_centroids_are_class_means_and_chunking_does_not_matter():
    rng = np.random.default_rng(1)
    states = rng.normal(size=(N, T, 2, 3)).astype(np.float32)
    labels = rng.integers(2, 6, size=(N, T))
    whole = centroids(states, labels, chunk_size=N)
    chunked = centroids(torch.from_numpy(states), torch.from_numpy(labels), chunk_size=5)
    assert whole.classes.tolist() == [2, 3, 4, 5]
    assert whole.state_shape == (2, 3)
    for row, g in enumerate(whole.classes):
        expected = states.reshape(-1, 6)[labels.reshape(-1) == g].astype(np.float64).mean(0)
        np.testing.assert_allclose(whole.means[row], expected, rtol=1e-12, atol=1e-12)
        assert whole.counts[row] == (labels == g).sum()
    np.testing.assert_allclose(chunked.means, whole.means, rtol=1e-12, atol=1e-12)


def test_accumulator_grows_label_range_across_chunks():
    acc = CentroidAccumulator()
    acc.update(np.ones((1, 2, 3)), np.array([[5, 5]]))
    acc.update(np.zeros((1, 2, 3)), np.array([[1, 1]]))
    result = acc.result()
    assert result.classes.tolist() == [1, 5]
    np.testing.assert_array_equal(result.means, [[0, 0, 0], [1, 1, 1]])


def test_subspace_has_the_right_rank_and_is_orthonormal():
    means, labels, frame = planted()
    states = means[labels].astype(np.float32)
    sub = state_subspace(centroids(states, labels))
    assert sub.rank == 2
    np.testing.assert_allclose(sub.basis.T @ sub.basis, np.eye(2), atol=1e-12)
    # U is the plane of the planted frame: projecting the frame onto U keeps it
    np.testing.assert_allclose(sub.projector() @ frame, frame, atol=1e-6)
    # M: side of the equilateral triangle inscribed in the unit circle
    assert sub.M == pytest.approx(np.sqrt(3), rel=1e-6)
    # four classes on a line span a rank-1 U
    line = np.arange(4)[:, None] * np.ones((1, D))
    labels4 = np.random.default_rng(0).integers(0, 4, size=(N, T))
    assert state_subspace(centroids(line[labels4], labels4)).rank == 1


def test_states_exactly_at_centroids_have_zero_drift():
    means, labels, _ = planted()
    states = torch.tensor(means[labels], dtype=torch.float32)
    sub = state_subspace(centroids(states, labels))
    result = drift(states, labels, sub, chunk_size=5)
    assert np.all(result.distances == 0.0)
    assert np.all(result.q == 0.0) and np.all(result.R == 0.0)
    found = tcross(result)
    assert found.estimated and found.value == float("inf")


def linear_drift(rate, length):
    """States c_y + rate * t * u with u a unit vector in U, t = 1..length; also noise off U."""
    means, _, frame = planted()
    rng = np.random.default_rng(3)
    labels = rng.integers(0, G, size=(N, length))
    steps = np.arange(1, length + 1)
    off_u = np.linalg.qr(np.concatenate([frame, rng.normal(size=(D, 1))], 1))[0][:, 2]
    states = (means[labels] + rate * steps[None, :, None] * frame[:, 0]
              + rng.normal(size=(N, length, 1)) * off_u)           # drift off U must not count
    sub = state_subspace(centroids(means[labels], labels))
    return states, labels, sub


def test_known_linear_drift_crosses_at_the_known_step():
    rate = 0.01
    states, labels, sub = linear_drift(rate, length=200)
    result = drift(states, labels, sub)
    np.testing.assert_allclose(result.R, rate * result.steps, rtol=1e-9)
    found = tcross(result)
    expected = int(np.floor(0.5 * np.sqrt(3) / rate)) + 1        # first t with rate t / M > 0.5
    assert not found.estimated and found.value == expected and found.index == expected - 1
    assert tcross(result, tau=0.25).value == int(np.floor(0.25 * np.sqrt(3) / rate)) + 1


def test_known_linear_drift_estimates_tcross_past_the_horizon():
    rate = 0.01
    states, labels, sub = linear_drift(rate, length=30)
    result = drift(states, labels, sub, statistic=90.0)
    found = tcross(result)
    assert found.estimated
    assert found.eta == pytest.approx(rate, rel=1e-9)
    assert found.value == pytest.approx(0.5 * np.sqrt(3) / rate, rel=1e-9)
    assert tcross(result, estimator="line").value == pytest.approx(0.5 * np.sqrt(3) / rate, rel=1e-6)


def test_line_estimator_accounts_for_an_initial_offset():
    rate, offset = 0.01, 0.2
    states, labels, sub = linear_drift(rate, length=30)
    means = sub.centroids.means
    # push every state further along its own drift direction (in U): R(t) = offset + rate t
    direction = sub.basis @ (sub.basis.T @ (states[0, 0] - means[labels[0, 0]]))
    direction /= np.linalg.norm(direction)
    shifted = states + offset * direction
    result = drift(shifted, labels, sub)
    np.testing.assert_allclose(result.R, offset + rate * result.steps, rtol=1e-9)
    line = tcross(result, estimator="line")
    assert line.value == pytest.approx((0.5 * np.sqrt(3) - offset) / rate, rel=1e-6)
    assert tcross(result, estimator="rate").value == pytest.approx(0.5 * np.sqrt(3) / rate, rel=1e-6)


def test_percentile_statistic():
    means, labels, _ = planted()
    rng = np.random.default_rng(4)
    sub = state_subspace(centroids(means[labels], labels))
    states = means[labels] + rng.normal(size=(N, T, D))
    mean_result = drift(states, labels, sub)
    p90 = drift(states, labels, sub, statistic=90)
    np.testing.assert_allclose(p90.R, np.percentile(mean_result.distances, 90, axis=0))
    np.testing.assert_allclose(mean_result.R, mean_result.distances.mean(0))
    np.testing.assert_allclose(mean_result.q, mean_result.R / sub.M)
    # distance is measured within U: the norm of the projected offset
    offsets = (states - means[labels]) @ sub.basis
    np.testing.assert_allclose(mean_result.distances, np.linalg.norm(offsets, axis=-1), rtol=1e-10)


def test_streamed_drift_equals_one_shot():
    means, labels, _ = planted()
    states = means[labels] + np.random.default_rng(5).normal(size=(N, T, D))
    sub = state_subspace(centroids(states, labels))
    acc = DriftAccumulator(sub, statistic=75.0)
    for start in range(0, N, 5):
        acc.update(states[start:start + 5].astype(np.float32), labels[start:start + 5])
    one_shot = drift(states.astype(np.float32), labels, sub, statistic=75.0, chunk_size=N)
    np.testing.assert_allclose(acc.result().R, one_shot.R, rtol=1e-12)


def test_bad_inputs_raise_clear_errors():
    means, labels, _ = planted()
    states = means[labels]
    with pytest.raises(ValueError, match="single class"):
        state_subspace(centroids(states, np.zeros_like(labels)))
    with pytest.raises(ValueError, match=r"must start with the shape of labels"):
        centroids(states[:, :-1], labels)
    with pytest.raises(TypeError, match="integer class labels"):
        centroids(states, labels.astype(np.float64))
    with pytest.raises(TypeError, match="floating dtype"):
        centroids(labels[..., None], labels)
    with pytest.raises(TypeError, match="numpy array or a torch tensor"):
        centroids(states.tolist(), labels)
    sub = state_subspace(centroids(states, labels))
    with pytest.raises(ValueError, match="no centroid"):
        drift(states, labels + 7, sub)
    with pytest.raises(ValueError, match="statistic"):
        drift(states, labels, sub, statistic="median")
    with pytest.raises(ValueError, match="tau"):
        drift(states, labels, sub, tau=0)
    with pytest.raises(ValueError, match="state shape"):
        drift(states[..., :3], labels, sub)
    with pytest.raises(ValueError, match="rtol"):
        state_subspace(sub.centroids, rtol=2.0)
    with pytest.raises(ValueError, match="estimator"):
        tcross(drift(states, labels, sub), estimator="linear")
    with pytest.raises(ValueError, match="fit_start"):
        tcross(drift(states, labels, sub), fit_start=T)
