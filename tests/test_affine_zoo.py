"""The diagonal affine zoo built on diag_scan: negative Mamba, AUSSM, Mamba-3-style, S4D-LegS."""

import math

import pytest
import torch

import models
from models.mixers.s4d import legs_diagonal

VOCAB, B, T = 7, 2, 10
SMALL = dict(vocab_size=VOCAB, d_model=16, d_state=4, n_layers=1)
MIXER = "blocks.0.mixer."


def build(name, **overrides):
    torch.manual_seed(0)
    return models.build(name, **{**SMALL, **overrides})


@pytest.fixture
def tokens():
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))


def step_inputs(model, tokens, t):
    mixer = model.blocks[0].mixer
    _, cache = model.run_with_cache(tokens, names=[MIXER + "hook_in"])
    with torch.no_grad():
        inputs = mixer.prepare(cache[MIXER + "hook_in"])
    return mixer, inputs, {k: v[:, t] for k, v in inputs.items()}


def test_negative_mamba_is_two_exp_minus_one(tokens):
    mamba, _, inputs_t = step_inputs(build("mamba"), tokens, 3)
    negative, _, neg_inputs_t = step_inputs(build("negative_mamba"), tokens, 3)  # same seed, same weights
    torch.testing.assert_close(neg_inputs_t["dt"], inputs_t["dt"])
    torch.testing.assert_close(negative.transition(neg_inputs_t), 2 * mamba.transition(inputs_t) - 1)


def test_negative_mamba_reaches_negative_eigenvalues(tokens):
    model = build("negative_mamba")
    with torch.no_grad():
        model.blocks[0].mixer.dt_proj.bias.fill_(2.0)  # dt ~ 2: dt |A| > ln 2
    mixer, _, inputs_t = step_inputs(model, tokens, 5)
    a = mixer.transition(inputs_t)
    assert bool((a > -1).all() and (a < 1).all()) and bool((a < 0).any())


def test_aussm_transition_is_unit_modulus_and_input_dependent(tokens):
    mixer, inputs, inputs_t = step_inputs(build("aussm"), tokens, 4)
    a = mixer.transition(inputs_t)
    assert a.is_complex() and a.shape == (B, 32, 4)
    torch.testing.assert_close(a.abs(), torch.ones(a.shape))
    other = mixer.transition({k: v[:, 7] for k, v in inputs.items()})
    assert (a - other).abs().max() > 1e-4  # depends on the input through dt


def test_mamba3_states_match_the_trapezoidal_recurrence_by_hand(tokens):
    model = build("mamba3")
    mixer = model.blocks[0].mixer
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names=[MIXER + "hook_in", MIXER + "hook_state"])
        p = mixer.prepare(cache[MIXER + "hook_in"])
        A = -torch.exp(mixer.A_log)
        h = torch.zeros(B, 32, 4, dtype=torch.complex64)
        u_prev = torch.zeros(B, 32, 4)
        for t in range(T):
            dt, lam = p["dt"][:, t, :, None], p["lam"][:, t, :, None]
            alpha = torch.exp(dt * A) * torch.exp(1j * dt * p["theta"][:, t, None, :])
            u = p["x"][:, t, :, None] * p["B"][:, t, None, :]
            h = alpha * h + lam * dt * u + (1 - lam) * dt * alpha * u_prev
            u_prev = u
            torch.testing.assert_close(cache[MIXER + "hook_state"][:, t], h, rtol=1e-5, atol=1e-5)
        a = mixer.transition({k: v[:, 2] for k, v in p.items()})
        assert bool((a.abs() > 0).all() and (a.abs() < 1).all()) and a.imag.abs().max() > 0


def test_legs_diagonal_known_value_and_normal_part():
    eig, b = legs_diagonal(1)  # S = [[-1/2, -sqrt(3)/2], [sqrt(3)/2, -1/2]]: -1/2 +- i sqrt(3)/2
    torch.testing.assert_close(eig, torch.tensor([complex(-0.5, math.sqrt(3) / 2)], dtype=torch.complex128))
    eig, b = legs_diagonal(8)
    torch.testing.assert_close(eig.real, torch.full((8,), -0.5, dtype=torch.float64))
    assert bool((eig.imag > 0).all())
    # V^* B_legs preserves the norm of B_legs (V unitary): half of |B_legs|^2 sits in the upper modes
    torch.testing.assert_close(2 * b.abs().square().sum(), torch.tensor(float(sum(2 * n + 1 for n in range(16))), dtype=torch.float64))


def test_s4d_convolution_mode_equals_recurrence():
    model = build("s4d", mixer_options={"dt_max": 0.5})
    mixer = model.blocks[0].mixer
    x = torch.randn(B, 40, 16)
    with torch.no_grad():
        conv = mixer.convolve(x)
        states, _ = mixer.scan({"x": x})
        rec = 2 * (states * torch.view_as_complex(mixer.C)).sum(-1).real
        torch.testing.assert_close(conv, rec, rtol=1e-5, atol=1e-5)
        # the kernel is the impulse response of the recurrence
        impulse = torch.zeros(1, 40, 16)
        impulse[:, 0] = 1
        states, _ = mixer.scan({"x": impulse})
        response = 2 * (states * torch.view_as_complex(mixer.C)).sum(-1).real[0].T  # [D, T]
        torch.testing.assert_close(mixer.convolution_kernel(40).float(), response, rtol=1e-5, atol=1e-5)
    mixer.execution_path = "fast"
    fast = mixer(x)
    mixer.execution_path = "instrumented"
    torch.testing.assert_close(mixer(x), fast, rtol=1e-5, atol=1e-5)


def test_s4d_transition_is_time_invariant_and_contracting(tokens):
    mixer, inputs, inputs_t = step_inputs(build("s4d"), tokens, 0)
    a = mixer.transition(inputs_t)
    torch.testing.assert_close(a, mixer.transition({k: v[:, 9] for k, v in inputs.items()}))
    assert bool((a.abs() < 1).all() and (a.abs() > 0).all())


@pytest.mark.parametrize("name", ["negative_mamba", "aussm", "mamba3", "s4d"])
def test_state_patch_runs_on_from_the_new_state(name, tokens):
    model = build(name)
    mixer = model.blocks[0].mixer
    t_patch = 4
    shape = (B, *mixer.state_shape)
    new = torch.randn(shape, dtype=torch.complex64 if name != "negative_mamba" else torch.float32)

    def patch(state, hook):
        state[:, t_patch] = new
        return state

    with torch.no_grad():
        _, cache = model.run_with_cache(
            tokens, names=[MIXER + "hook_in", MIXER + "hook_out", MIXER + "hook_state"],
            fwd_hooks=[(MIXER + "hook_state", patch)],
        )
        inputs = mixer.prepare(cache[MIXER + "hook_in"])
        h, states = torch.zeros(shape, dtype=new.dtype), []
        for t in range(T):
            h = new if t == t_patch else mixer.step({k: v[:, t] for k, v in inputs.items()}, h)
            states.append(h)
        states = torch.stack(states, dim=1)
        expected = mixer.readout(cache[MIXER + "hook_in"], states, inputs)
    torch.testing.assert_close(cache[MIXER + "hook_state"], states, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache[MIXER + "hook_out"], expected, rtol=1e-5, atol=1e-5)
