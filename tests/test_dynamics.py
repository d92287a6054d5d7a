"""interp.analysis.dynamics: per-step Jacobians (autograd vs structured), spectra, restriction to U, Theorem 1."""

import math

import numpy as np
import pytest
import torch

import models
from interp.analysis.dynamics import (
    Jacobians, centroid_return_error, contraction, contraction_summary, jacobians, restricted_jacobians, spectra,
    step_jacobians, theorem1_check, trace, word_jacobian,
)
from models.config import ModelConfig
from models.mixers.base import RecurrentMixer
from probes.subspace import centroids, state_subspace

CFG = ModelConfig(d_model=3, vocab_size=3, n_heads=1)


class DenseAffine(RecurrentMixer):
    """h_t = A(x_t) h_{t-1} + u(x_t) with a dense, input-dependent A(x_t)."""

    is_affine = True

    def __init__(self, n: int = 5) -> None:
        super().__init__(CFG, 0)
        self.state_shape = (n,)
        self.proj_a = torch.nn.Linear(3, n * n)
        self.proj_u = torch.nn.Linear(3, n)

    def prepare(self, x):
        return {"A": 0.5 * torch.tanh(self.proj_a(x)).unflatten(-1, self.state_shape * 2), "u": self.proj_u(x)}

    def step(self, inputs_t, h):
        return torch.einsum("bij,bj->bi", inputs_t["A"], h) + inputs_t["u"]

    def transition(self, inputs_t):
        return inputs_t["A"]


class DiagonalAffine(RecurrentMixer):
    """h_t = a(x_t) * h_{t-1} + u(x_t) with a matrix-shaped state S = (2, 3)."""

    is_affine = True

    def __init__(self) -> None:
        super().__init__(CFG, 0)
        self.state_shape = (2, 3)
        self.proj = torch.nn.Linear(3, 12)

    def prepare(self, x):
        a, u = self.proj(x).unflatten(-1, (2, 2, 3)).unbind(-3)
        return {"a": torch.sigmoid(a), "u": u}

    def step(self, inputs_t, h):
        return inputs_t["a"] * h + inputs_t["u"]

    def transition(self, inputs_t):
        return inputs_t["a"]


def c3_centroids() -> torch.Tensor:
    """c_s = (cos 2 pi s/3, sin 2 pi s/3, 1, 1): three states in the plane U = span(e0, e1)."""
    angle = 2 * math.pi * torch.arange(3) / 3
    return torch.stack([angle.cos(), angle.sin(), torch.ones(3), torch.ones(3)], 1)


class C3Rotation(RecurrentMixer):
    """Affine C3 tracker: rotate U by 2 pi g / 3 for token g, contract the rest towards (1, 1).
    Maps centroid c_s to c_{s+g}, so along any word of product 0 it returns every centroid."""

    is_affine = True

    def __init__(self) -> None:
        super().__init__(CFG, 0)
        self.state_shape = (4,)

    def prepare(self, x):                    # x: one-hot group elements [B, T, 3]
        angle = 2 * math.pi * x.argmax(-1).to(x.dtype) / 3
        return {"cos": angle.cos(), "sin": angle.sin()}

    def transition(self, inputs_t):
        c, s = inputs_t["cos"], inputs_t["sin"]
        zero, half = torch.zeros_like(c), torch.full_like(c, 0.5)
        rows = [[c, -s, zero, zero], [s, c, zero, zero], [zero, zero, half, zero], [zero, zero, zero, half]]
        return torch.stack([torch.stack(r, -1) for r in rows], -2)               # [B, 4, 4]

    def step(self, inputs_t, h):
        return torch.einsum("bij,bj->bi", self.transition(inputs_t), h) + torch.tensor([0, 0, 0.5, 0.5])

    def initial_state(self, batch, like):
        return c3_centroids()[0].expand(batch, 4).to(like)


class C3Snap(C3Rotation):
    """State-dependent contrast: the same rotation, then a pull towards the three centroids
    (angle theta -> theta - sin(3 theta) / 6, radius r -> 1 + (r - 1) / 2). The centroids are
    fixed points, but the Jacobian there is 0.5 * rotation on U: drift along U is corrected."""

    is_affine = False

    def step(self, inputs_t, h):
        rotated = torch.einsum("bij,bj->bi", self.transition(inputs_t), h) + torch.tensor([0, 0, 0.5, 0.5])
        radius = torch.linalg.vector_norm(rotated[:, :2], dim=-1)
        theta = torch.atan2(rotated[:, 1], rotated[:, 0])
        theta = theta - torch.sin(3 * theta) / 6
        radius = 1 + (radius - 1) / 2
        return torch.stack([radius * theta.cos(), radius * theta.sin(), rotated[:, 2], rotated[:, 3]], -1)


def run_mixer(mixer, x):
    """(inputs, states, previous) along x [B, T, d] with the mixer's reference scan."""
    with torch.no_grad():
        inputs = mixer.prepare(x)
        states = mixer.scan(inputs)[1]
        first = mixer.initial_state(states.shape[0], states)
    return inputs, states, torch.cat([first[:, None], states[:, :-1]], 1)


def reference_jacobian(mixer, inputs, previous, b, t):
    """torch.autograd.functional.jacobian of one step; complex states: d h_t / d Re h_{t-1}."""
    n = math.prod(mixer.state_shape)
    inputs_t = {k: v[b : b + 1, t] for k, v in inputs.items()}
    h = previous[b, t].reshape(n)
    if not h.is_complex():
        step = lambda x: mixer.step(inputs_t, x.reshape(1, *mixer.state_shape)).reshape(n)  # noqa: E731
        return torch.autograd.functional.jacobian(step, h)

    def real_step(re):                                                   # Im h held fixed
        out = mixer.step(inputs_t, torch.complex(re, h.imag).reshape(1, *mixer.state_shape)).reshape(n)
        return torch.cat([out.real, out.imag])

    jac = torch.autograd.functional.jacobian(real_step, h.real)         # [2n, n]
    return torch.complex(jac[:n], jac[n:])


@pytest.mark.parametrize("mixer_cls", [DenseAffine, DiagonalAffine, C3Rotation])
def test_structured_jacobians_equal_autograd_on_constructed_mixers(mixer_cls):
    mixer = mixer_cls()
    x = torch.nn.functional.one_hot(torch.randint(0, 3, (2, 7)), 3).float()
    inputs, _, previous = run_mixer(mixer, x + 0.1 * torch.randn(2, 7, 3))
    structured = step_jacobians(mixer, inputs, previous, "structured", chunk_size=4)
    autograd = step_jacobians(mixer, inputs, previous, "autograd", chunk_size=4)
    assert structured.diagonal == (mixer_cls is DiagonalAffine) and not autograd.diagonal
    torch.testing.assert_close(structured.dense(), autograd.values, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(autograd.values[1, 3], reference_jacobian(mixer, inputs, previous, 1, 3))


RECURRENT = []
for _name in models.list_models():
    _cls = models.mixers.MIXERS[models.preset_config(_name).mixers[-1]][0]
    if issubclass(_cls, RecurrentMixer):
        RECURRENT.append(_name)

SMALL = dict(vocab_size=5, d_model=8, n_heads=2, d_state=2, n_layers=2)
OVERRIDES = {"based": dict(mixer_options={"feature_dim": 2})}   # keep the state (and J) small


@pytest.mark.parametrize("name", RECURRENT)
def test_autograd_jacobians_of_every_recurrent_model(name):
    torch.manual_seed(0)
    model = models.build(name, **{**SMALL, **OVERRIDES.get(name, {})})
    tokens = torch.randint(0, 5, (2, 4), generator=torch.Generator().manual_seed(1))
    t = trace(model, tokens, layer=-1)
    autograd = step_jacobians(t.mixer, t.inputs, t.previous, "autograd")
    n = math.prod(t.mixer.state_shape)
    assert autograd.values.shape == (2, 4, n, n)
    assert not autograd.values.requires_grad                   # no graph back to the parameters
    for b, step in [(0, 0), (1, 3)]:
        torch.testing.assert_close(autograd.values[b, step], reference_jacobian(t.mixer, t.inputs, t.previous, b, step),
                                   atol=1e-5, rtol=1e-5)
    # the traced states are the states the step function produces
    torch.testing.assert_close(t.mixer.step({k: v[:, 2] for k, v in t.inputs.items()}, t.previous[:, 2]),
                               t.states[:, 2], atol=1e-5, rtol=1e-5)
    if t.mixer.is_affine:
        structured = step_jacobians(t.mixer, t.inputs, t.previous, "structured")
        assert not structured.values.requires_grad
        torch.testing.assert_close(structured.dense(), autograd.values, atol=1e-5, rtol=1e-5)
        assert jacobians(model, tokens, layer=1).method == "structured"


def test_tanh_rnn_jacobian_is_diag_one_minus_h_squared_times_w_hh():
    model = models.build("tanh_rnn", vocab_size=5, d_model=8, d_hidden=7)
    tokens = torch.randint(0, 5, (3, 9))
    t = trace(model, tokens)
    jac = jacobians(model, tokens)
    assert jac.method == "autograd"
    w_hh = model.blocks[0].mixer.rnn.weight_hh_l0.detach()
    expected = (1 - t.states.square())[..., :, None] * w_hh                       # diag(1 - h_t^2) W_hh
    torch.testing.assert_close(jac.values, expected, atol=1e-6, rtol=1e-6)


def test_restricted_jacobians_by_jvp_equal_the_restricted_full_jacobians():
    q = torch.linalg.qr(torch.randn(7, 3))[0]
    model = models.build("tanh_rnn", vocab_size=5, d_model=8, d_hidden=7)
    t = trace(model, torch.randint(0, 5, (2, 6)))
    full = step_jacobians(t.mixer, t.inputs, t.previous).restrict(q)
    torch.testing.assert_close(full, q.T @ step_jacobians(t.mixer, t.inputs, t.previous).values @ q)
    torch.testing.assert_close(restricted_jacobians(t.mixer, t.inputs, t.previous, q.numpy(), chunk_size=5), full,
                               atol=1e-6, rtol=1e-6)
    mixer = DiagonalAffine()
    inputs, _, previous = run_mixer(mixer, torch.randn(2, 5, 3))
    q6 = torch.linalg.qr(torch.randn(6, 2))[0]
    expected = step_jacobians(mixer, inputs, previous, "autograd").restrict(q6)
    for method in ("structured", "autograd"):
        torch.testing.assert_close(restricted_jacobians(mixer, inputs, previous, q6, method), expected,
                                   atol=1e-6, rtol=1e-6)


def test_spectra_dense_diagonal_and_time_invariant():
    mixer = DenseAffine()
    inputs, _, previous = run_mixer(mixer, torch.randn(2, 6, 3))
    jac = step_jacobians(mixer, inputs, previous)
    spec = spectra(jac)
    matrix = jac.values[1, 4].double().numpy()
    eig = np.linalg.eigvals(matrix)
    np.testing.assert_allclose(spec.eigenvalues[1, 4].numpy(), eig[np.argsort(-np.abs(eig), kind="stable")], atol=1e-5)
    np.testing.assert_allclose(spec.singular_values[1, 4].numpy(), np.linalg.svd(matrix, compute_uv=False), atol=1e-5)
    assert spec.spectral_radius[1, 4] == pytest.approx(np.abs(eig).max(), abs=1e-5)
    assert spec.max_singular_value[1, 4] == pytest.approx(np.linalg.norm(matrix, 2), abs=1e-5)

    diag = step_jacobians(DiagonalAffine(), *run_mixer(DiagonalAffine(), torch.randn(2, 6, 3))[::2])
    diag_spec = spectra(diag)
    dense_spec = spectra(diag.dense())
    torch.testing.assert_close(diag_spec.singular_values, dense_spec.singular_values, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(diag_spec.eigenvalues.abs(), dense_spec.eigenvalues.abs(), atol=1e-6, rtol=1e-6)

    model = models.build("linear_rnn", vocab_size=5, d_model=8, d_hidden=5)
    lti = jacobians(model, torch.randint(0, 5, (2, 7)))
    lti_spec = spectra(lti)
    torch.testing.assert_close(lti_spec.singular_values, torch.linalg.svdvals(lti.values))
    torch.testing.assert_close(lti_spec.spectral_radius, torch.linalg.eigvals(lti.values).abs().amax(-1))


def c3_run(tokens):
    x = torch.nn.functional.one_hot(tokens, 3).float()
    labels = torch.cumsum(tokens, 1) % 3                                          # running product in C3
    return x, labels


def test_theorem1_holds_for_a_centroid_preserving_affine_model_and_fails_for_state_dependent():
    tokens = torch.randint(0, 3, (4, 12))
    tokens[:, 4:7] = 1                                                             # the word 1 1 1 = identity
    x, labels = c3_run(tokens)
    rotation = C3Rotation()
    inputs, states, previous = run_mixer(rotation, x)
    torch.testing.assert_close(states, c3_centroids()[labels])                     # states sit on the centroids
    sub = state_subspace(centroids(states, labels))
    assert sub.rank == 2
    jac = step_jacobians(rotation, inputs, previous)
    word = word_jacobian(jac, 4, 7)
    check = theorem1_check(word, sub)
    assert bool(check.holds.all()) and float(check.deviation.max()) < 1e-5
    assert float(centroid_return_error(rotation, inputs, 4, 7, sub.centroids.means).max()) < 1e-5
    # the autograd path gives the same word Jacobian
    torch.testing.assert_close(word_jacobian(step_jacobians(rotation, inputs, previous, "autograd"), 4, 7).values,
                               word.values, atol=1e-6, rtol=1e-6)
    # a word that does not return (the single element 1) rotates U by 120 degrees: not ~ I
    single = theorem1_check(word_jacobian(jac, 4, 5), sub)
    assert not bool(single.holds.any()) and float(single.deviation.min()) == pytest.approx(math.sqrt(3), rel=1e-5)

    snap = C3Snap()
    inputs, states, previous = run_mixer(snap, x)
    torch.testing.assert_close(states, c3_centroids()[labels], atol=1e-5, rtol=1e-5)   # same centroids
    assert float(centroid_return_error(snap, inputs, 4, 7, sub.centroids.means).max()) < 1e-5
    snap_check = theorem1_check(word_jacobian(step_jacobians(snap, inputs, previous), 4, 7), sub)
    # the state-dependent pull contracts U by 0.5 per step: 0.125 I after three steps
    torch.testing.assert_close(snap_check.restricted, 0.125 * torch.eye(2).expand(4, 2, 2), atol=1e-5, rtol=1e-5)
    assert not bool(snap_check.holds.any())

    summary = contraction_summary(jac.restrict(sub))
    assert summary.max == pytest.approx(1.0, abs=1e-6) and summary.median == pytest.approx(1.0, abs=1e-6)
    snap_summary = contraction_summary(restricted_jacobians(snap, inputs, previous, sub))
    assert snap_summary.max == pytest.approx(0.5, abs=1e-5) and snap_summary.expanding == 0.0


def test_word_jacobian_is_the_ordered_product():
    mixer = DenseAffine()
    inputs, _, previous = run_mixer(mixer, torch.randn(2, 6, 3))
    jac = step_jacobians(mixer, inputs, previous)
    word = word_jacobian(jac, 1, 4).values[:, 0]
    torch.testing.assert_close(word, jac.values[:, 3] @ jac.values[:, 2] @ jac.values[:, 1])
    diag = step_jacobians(DiagonalAffine(), *run_mixer(DiagonalAffine(), torch.randn(2, 6, 3))[::2])
    dense = diag.dense()
    expected = dense[:, 5] @ dense[:, 4] @ dense[:, 3] @ dense[:, 2] @ dense[:, 1] @ dense[:, 0]
    torch.testing.assert_close(word_jacobian(diag, 0, 6).dense()[:, 0], expected)
    torch.testing.assert_close(word_jacobian(diag, 0, 6).values[:, 0], diag.values.prod(1))


def test_bad_inputs_raise_clear_errors():
    model = models.build("tanh_rnn", vocab_size=5, d_model=8)
    tokens = torch.randint(0, 5, (2, 4))
    with pytest.raises(ValueError, match="not affine|state-dependent"):
        jacobians(model, tokens, method="structured")
    with pytest.raises(ValueError, match="method"):
        jacobians(model, tokens, method="symbolic")
    with pytest.raises(ValueError, match="layer"):
        jacobians(model, tokens, layer=3)
    with pytest.raises(ValueError, match="not a RecurrentMixer"):
        jacobians(models.build("attention", vocab_size=5, d_model=8, n_heads=2), tokens)
    jac = jacobians(model, tokens)
    with pytest.raises(ValueError, match="basis must be"):
        jac.restrict(np.eye(3))
    with pytest.raises(ValueError, match="start"):
        word_jacobian(jac, 3, 2)
    with pytest.raises(ValueError, match="word_jacobian"):
        theorem1_check(jac, np.eye(64)[:, :2])
    t = trace(model, tokens)
    with pytest.raises(ValueError, match="previous must be"):
        step_jacobians(t.mixer, t.inputs, t.previous[..., :3])

    class Broken(DenseAffine):
        def transition(self, inputs_t):
            return inputs_t["A"][:, :2]

    mixer = Broken()
    inputs, _, previous = run_mixer(mixer, torch.randn(1, 3, 3))
    with pytest.raises(ValueError, match="transition returned shape"):
        step_jacobians(mixer, inputs, previous)
    assert isinstance(jac, Jacobians)


class ConjugatingAffine(DiagonalAffine):
    """h_t = a_t * conj(h_{t-1}) + u_t: real-affine but not complex-differentiable."""

    def step(self, inputs_t, h):
        return inputs_t["a"] * torch.complex(h.real, -h.imag) + inputs_t["u"]


def test_complex_states_use_realified_coordinates():
    torch.manual_seed(0)
    model = models.build("aussm", vocab_size=5, d_model=4, d_state=2, expand=1)
    t = trace(model, torch.randint(0, 5, (2, 5)))
    assert t.states.is_complex()
    jac = step_jacobians(t.mixer, t.inputs, t.previous)
    assert jac.diagonal and jac.is_complex
    n = jac.n
    dh = torch.randn(n, dtype=torch.complex64)
    real = jac.realified()                                                      # [B, T, 2n, 2n]
    torch.testing.assert_close(real[1, 2] @ torch.view_as_real(dh).flatten(),
                               torch.view_as_real(jac.dense()[1, 2] @ dh).flatten())
    q = torch.linalg.qr(torch.randn(2 * n, 3))[0]
    expected = q.T @ real @ q
    torch.testing.assert_close(jac.restrict(q), expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(restricted_jacobians(t.mixer, t.inputs, t.previous, q, "autograd"), expected,
                               atol=1e-6, rtol=1e-6)
    # the premise check runs complex states given in realified coordinates: F(h_2) = h_3
    start = torch.view_as_real(t.states[0, 2]).reshape(1, -1)
    error = centroid_return_error(t.mixer, t.inputs, 3, 4, start.numpy())
    assert float(error[0]) == pytest.approx(float((t.states[0, 3] - t.states[0, 2]).abs().square().sum().sqrt()),
                                            rel=1e-5)

    mixer = ConjugatingAffine()
    inputs = mixer.prepare(torch.randn(1, 3, 3))
    previous = torch.randn(1, 3, 2, 3, dtype=torch.complex64)
    with pytest.raises(ValueError, match="Cauchy-Riemann"):
        step_jacobians(mixer, inputs, previous, "autograd")
    assert restricted_jacobians(mixer, inputs, previous, torch.eye(12)[:, :2], "autograd").shape == (1, 3, 2, 2)


def test_probes_run_on_any_cached_site_of_a_real_model():
    from interp.tasks import make_task
    from probes.subspace import drift, tcross

    task = make_task("S3", format="acot")
    batch = task.sample(6, 10, seed=0)
    model = models.build("mamba", vocab_size=task.vocab_size, d_model=8, d_state=2, n_layers=2)
    names = ["blocks.1.mixer.hook_state", "blocks.0.hook_resid_post"]
    _, cache = model.run_with_cache(batch.tokens, names=names)
    for name in names:
        sub = state_subspace(centroids(cache[name], batch.states))
        result = drift(cache[name], batch.states, sub, chunk_size=4)
        assert result.q.shape == (10,) and np.all(np.isfinite(result.q)) and sub.rank <= 5
        assert tcross(result).value > 0
    with pytest.raises(ValueError, match="chunk_size"):
        jacobians(model, batch.tokens, layer=1, chunk_size=0)
    # the contraction summary on U of the model's own state subspace, both paths
    _, cache = model.run_with_cache(batch.tokens, names=["blocks.1.mixer.hook_state"])
    sub = state_subspace(centroids(cache["blocks.1.mixer.hook_state"], batch.states))
    structured = contraction(model, batch.tokens, sub, layer=1)
    autograd = contraction(model, batch.tokens, sub, layer=1, method="autograd")
    torch.testing.assert_close(structured.per_step, autograd.per_step, atol=1e-5, rtol=1e-5)
    assert structured.per_step.shape == (6, 10) and structured.max == pytest.approx(float(structured.per_step.max()))
