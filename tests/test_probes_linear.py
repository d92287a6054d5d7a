"""probes.linear: ridge and logistic probes, per-position scores, seeded splits."""

import numpy as np
import pytest
import torch

from probes.linear import (
    accuracy_per_position, fit_logistic, fit_ridge, probe_state, r2_per_position, split_sequences,
)

N, T, D, K = 40, 8, 6, 3


def test_ridge_recovers_a_planted_linear_map():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, T, 2, 3))                                # S = (2, 3), n = 6
    w, b = rng.normal(size=(D, K)), rng.normal(size=K)
    y = x.reshape(N, T, D) @ w + b
    probe = fit_ridge(x, y, alpha=0.0)
    np.testing.assert_allclose(probe.weight, w, atol=1e-10)
    np.testing.assert_allclose(probe.bias, b, atol=1e-10)
    np.testing.assert_allclose(probe.predict(x), y, atol=1e-10)
    np.testing.assert_allclose(r2_per_position(probe, x, y), np.ones(T), atol=1e-12)


def test_ridge_matches_the_closed_form_with_penalty():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, D)) + 3.0
    y = rng.normal(size=(50, 2))
    alpha = 2.5
    probe = fit_ridge(torch.tensor(x, dtype=torch.float32), torch.tensor(y), alpha=alpha)
    xf = torch.tensor(x, dtype=torch.float32).double().numpy()
    xc, yc = xf - xf.mean(0), y - y.mean(0)
    expected = np.linalg.solve(xc.T @ xc + alpha * np.eye(D), xc.T @ yc)
    np.testing.assert_allclose(probe.weight, expected, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(probe.bias, y.mean(0) - xf.mean(0) @ expected, rtol=1e-9, atol=1e-12)


def separable(seed=0, classes=(2, 5, 7)):
    """States whose class is linearly decodable: a class-dependent mean plus small noise."""
    rng = np.random.default_rng(seed)
    labels = rng.choice(classes, size=(N, T))
    centres = {c: rng.normal(size=D) * 3 for c in classes}
    states = np.stack([centres[c] for c in labels.reshape(-1)]).reshape(N, T, D)
    return (states + 0.1 * rng.normal(size=states.shape)).astype(np.float32), labels


@pytest.mark.parametrize("fit", [fit_ridge, fit_logistic])
def test_class_probes_decode_separable_states(fit):
    states, labels = separable()
    probe = fit(states, labels)
    assert probe.classes.tolist() == [2, 5, 7]
    np.testing.assert_array_equal(accuracy_per_position(probe, states, labels), np.ones(T))
    # shuffled labels carry no information: accuracy near chance
    shuffled = np.random.default_rng(9).permutation(labels.reshape(-1)).reshape(N, T)
    assert accuracy_per_position(probe, states, shuffled).mean() < 0.6


def test_accuracy_per_position_counts_each_position():
    states, labels = separable()
    probe = fit_ridge(states, labels)
    wrong = labels.copy()
    wrong[: N // 2, 3] = np.where(labels[: N // 2, 3] == 2, 5, 2)    # half the sequences wrong at t=3
    acc = accuracy_per_position(probe, states, wrong)
    assert acc[3] == pytest.approx(0.5) and np.all(np.delete(acc, 3) == 1.0)


def test_logistic_is_deterministic_and_matches_an_independent_fit():
    states, labels = separable(seed=3)
    a, b = fit_logistic(states, labels, l2=1e-2), fit_logistic(states, labels, l2=1e-2)
    assert np.array_equal(a.weight, b.weight) and np.array_equal(a.bias, b.bias)
    # at the optimum of the penalised objective the gradient (in standardised coordinates) vanishes
    x = torch.tensor(states.reshape(-1, D), dtype=torch.float64)
    mean, std = x.mean(0), x.std(0)
    w = (torch.tensor(a.weight) * std[:, None]).requires_grad_(True)
    bias = (torch.tensor(a.bias) + mean @ torch.tensor(a.weight)).requires_grad_(True)
    rows = torch.searchsorted(torch.tensor([2, 5, 7]), torch.tensor(labels.reshape(-1)))
    loss = torch.nn.functional.cross_entropy(((x - mean) / std) @ w + bias, rows) + 0.5e-2 * w.square().sum()
    grads = torch.autograd.grad(loss, [w, bias])
    assert max(float(g.abs().max()) for g in grads) < 1e-6


def test_split_is_seeded_and_by_sequence():
    train, test = split_sequences(20, 0.25, seed=4)
    again = split_sequences(20, 0.25, seed=4)
    assert np.array_equal(train, again[0]) and np.array_equal(test, again[1])
    assert len(test) == 5 and sorted(np.concatenate([train, test]).tolist()) == list(range(20))
    assert not np.array_equal(test, split_sequences(20, 0.25, seed=5)[1])


def test_probe_state_reports_per_position_on_test_sequences():
    states, labels = separable()
    report = probe_state(states, labels, kind="logistic", seed=1)
    assert report.metric == "accuracy" and report.per_position.shape == (T,)
    assert report.test_score == 1.0 and report.train_score == 1.0
    assert set(report.train_index).isdisjoint(report.test_index)
    rng = np.random.default_rng(2)
    beliefs = rng.dirichlet(np.ones(K), size=(N, T))
    x = np.concatenate([beliefs, rng.normal(size=(N, T, 2))], -1)    # beliefs are linear in x
    report = probe_state(x, beliefs, kind="ridge", alpha=1e-8, seed=1)
    assert report.metric == "r2" and report.test_score == pytest.approx(1.0, abs=1e-6)


def test_bad_inputs_raise_clear_errors():
    states, labels = separable()
    with pytest.raises(ValueError, match="single class"):
        fit_ridge(states, np.zeros_like(labels))
    with pytest.raises(ValueError, match="must start with the shape of targets"):
        fit_ridge(states[:, :-1], labels)
    with pytest.raises(TypeError, match="floating dtype"):
        fit_ridge(labels[..., None], labels)
    with pytest.raises(ValueError, match="alpha"):
        fit_ridge(states, labels, alpha=-1.0)
    with pytest.raises(TypeError, match="integer class labels"):
        fit_logistic(states, labels[..., None].astype(np.float32))
    with pytest.raises(ValueError, match="kind"):
        probe_state(states, labels, kind="svm")
    with pytest.raises(ValueError, match="test_fraction"):
        split_sequences(10, 1.5)
    probe = fit_ridge(states, labels)
    with pytest.raises(ValueError, match="state shape"):
        probe.predict(states[..., :3])
    with pytest.raises(ValueError, match="continuous probe"):
        r2_per_position(probe, states, np.zeros((N, T, K)))
