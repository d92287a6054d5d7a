"""Mamba: an independent reference forward, the affine transition, and state patches."""

import pytest
import torch
import torch.nn.functional as F

import models
from models.mixers.mamba import Mamba

VOCAB, B, T = 7, 2, 11
SMALL = dict(vocab_size=VOCAB, d_model=16, d_state=4, n_layers=1)
MIXER = "blocks.0.mixer."


def build(**overrides):
    torch.manual_seed(0)
    return models.build("mamba", **{**SMALL, **overrides})


@pytest.fixture
def tokens():
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))


def reference_mamba(mixer: Mamba, u: torch.Tensor) -> torch.Tensor:
    """mamba_simple.py's forward with selective_scan_ref, written out: nn.Conv1d, a step loop."""
    d_conv = mixer.conv.kernel_size[0]
    x, z = mixer.in_proj(u).transpose(1, 2).chunk(2, dim=1)  # [B, E, T]
    x = F.silu(F.conv1d(x, mixer.conv.weight, mixer.conv.bias, padding=d_conv - 1, groups=mixer.d_inner)[..., : u.shape[1]])
    x_dbl = mixer.x_proj(x.transpose(1, 2))  # [B, T, R + 2N]
    dt, Bm, Cm = torch.split(x_dbl, [mixer.dt_rank, mixer.d_state, mixer.d_state], dim=-1)
    delta = F.softplus(dt @ mixer.dt_proj.weight.T + mixer.dt_proj.bias).transpose(1, 2)  # [B, E, T]
    A = -torch.exp(mixer.A_log.float())
    h = u.new_zeros(u.shape[0], mixer.d_inner, mixer.d_state)
    ys = []
    for t in range(u.shape[1]):
        dA = torch.exp(delta[:, :, t, None] * A)
        dBx = delta[:, :, t, None] * Bm[:, None, t] * x[:, :, t, None]
        h = dA * h + dBx
        ys.append(torch.einsum("bdn,bn->bd", h, Cm[:, t]))
    y = torch.stack(ys, dim=2) + x * mixer.D[:, None]  # [B, E, T]
    y = y * F.silu(z)
    return mixer.out_proj(y.transpose(1, 2))


@pytest.mark.parametrize("path", ["fast", "instrumented"])
def test_matches_reference_forward(path):
    model = build(d_conv=3, mixer_options={"chunk_size": 4})
    mixer = model.blocks[0].mixer
    mixer.execution_path = path
    u = torch.randn(B, T, 16)
    torch.testing.assert_close(mixer(u), reference_mamba(mixer, u), rtol=1e-5, atol=1e-5)


def test_fast_equals_instrumented_with_gradients(tokens):
    model = build(n_layers=2, mixer_options={"chunk_size": 4})
    outs, grads = [], []
    for path in ("fast", "instrumented"):
        out = model.set_execution_path(path)(tokens)
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), list(model.parameters())))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    for g_inst, g_fast in zip(grads[1], grads[0]):
        torch.testing.assert_close(g_inst, g_fast, rtol=1e-5, atol=1e-5)


def test_hook_shapes(tokens):
    model = build()
    _, cache = model.run_with_cache(tokens)
    E, N = 32, 4
    assert cache[MIXER + "hook_state"].shape == (B, T, E, N)
    for name in ("hook_conv", "hook_dt", "hook_gate"):
        assert cache[MIXER + name].shape == (B, T, E)
    assert bool((cache[MIXER + "hook_dt"] > 0).all())


def test_transition_is_exp_dt_a_in_unit_interval_and_the_jacobian(tokens):
    model = build()
    mixer = model.blocks[0].mixer
    _, cache = model.run_with_cache(tokens, names=[MIXER + "hook_in"])
    with torch.no_grad():
        inputs = mixer.prepare(cache[MIXER + "hook_in"])
    for t in (0, 5, T - 1):
        inputs_t = {k: v[:, t] for k, v in inputs.items()}
        a = mixer.transition(inputs_t)  # [B, E, N]
        assert a.shape == (B, 32, 4)
        assert bool((a > 0).all() and (a < 1).all())
        for h in (torch.zeros(B, 32, 4), torch.randn(B, 32, 4) * 5):  # affine: same Jacobian anywhere
            jac = torch.autograd.functional.jacobian(lambda s: mixer.step(inputs_t, s)[0], h)[:, :, 0]
            torch.testing.assert_close(jac, _diag(a[0]))


def _diag(a):  # [E, N] -> the Jacobian of s -> a * s for the first example, [E, N, E, N]
    return torch.diag(a.flatten()).reshape(*a.shape, *a.shape)


def test_state_patch_runs_on_from_the_new_state(tokens):
    """A hook_state patch at t equals the step loop by hand: to t, replace, run on."""
    model = build(mixer_options={"chunk_size": 4})
    mixer = model.blocks[0].mixer
    t_patch = 4
    new = torch.randn(B, 32, 4)

    def patch(state, hook):
        state[:, t_patch] = new
        return state

    with torch.no_grad():
        _, cache = model.run_with_cache(
            tokens, names=[MIXER + "hook_in", MIXER + "hook_out", MIXER + "hook_state"],
            fwd_hooks=[(MIXER + "hook_state", patch)],
        )
        inputs = mixer.prepare(cache[MIXER + "hook_in"])
        h, states = torch.zeros(B, 32, 4), []
        for t in range(T):
            h = new if t == t_patch else mixer.step({k: v[:, t] for k, v in inputs.items()}, h)
            states.append(h)
        states = torch.stack(states, dim=1)
        expected = mixer.readout(cache[MIXER + "hook_in"], states, inputs)
    torch.testing.assert_close(cache[MIXER + "hook_state"], states, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache[MIXER + "hook_out"], expected, rtol=1e-5, atol=1e-5)


def test_state_patch_goes_through_the_kernel_pins(tokens, monkeypatch):
    import models.mixers.diagonal as diagonal_module  # Mamba's scan plumbing

    seen = []
    real = diagonal_module.diag_scan

    def spy(*args, **kwargs):
        seen.append(kwargs.get("pins"))
        return real(*args, **kwargs)

    monkeypatch.setattr(diagonal_module, "diag_scan", spy)
    model = build()

    def at_three(s, hook):
        s = s.clone()
        s[:, 3] *= 0.5
        return s

    model.run_with_hooks(tokens, fwd_hooks=[(MIXER + "hook_state", at_three)])  # under grad
    pins = [p for p in seen if p is not None]
    assert len(pins) == 1 and torch.equal(pins[0][0], torch.zeros_like(pins[0][0]).index_fill_(1, torch.tensor([3]), True))
    # relative at every step: applied causally in one pass (a window a step, models.hooks.state.
    # in_windows), not a pinned re-run a step: the pinned scans do not grow with T
    seen.clear()
    model.run_with_hooks(tokens, fwd_hooks=[(MIXER + "hook_state", lambda s, hook: s * 0.5)])
    assert len([p for p in seen if p is not None]) <= 2


def test_bad_options_raise():
    with pytest.raises(ValueError, match="unknown"):
        build(mixer_options={"dt_rnak": 2})
    with pytest.raises(ValueError, match="dt_min"):
        build(mixer_options={"dt_min": 0.5, "dt_max": 0.1})


def test_a_relative_hook_at_many_steps_says_its_cost_and_equals_the_declared_patch():
    """A hook function scaling the state at each of 40 steps runs in one pass (a window a step):
    no warning, the states StatePatch(fn=...) gives. One that scales steps 1, ... of the whole
    call by slicing them (not a window's hook: on a one-step window it changes nothing) settles
    one step a re-run (39 scans): it warns once, naming hook.position and StatePatch(fn=...), and
    equals the declared patch at those steps."""
    import warnings

    from models.hooks.state_patch import StatePatch

    model = build().double()
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(3))
    rows, times = torch.arange(2).repeat_interleave(40), torch.arange(40).repeat(2)

    def after_first(s, hook):
        s = s.clone()
        s[:, 1:] *= 0.5
        return s

    for hook, warned in ((lambda s, hook: s * 0.5, False), (after_first, True)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            by_hook = model.run_with_hooks(tokens, fwd_hooks=[(MIXER + "hook_state", hook)])
        said = [str(w.message) for w in caught if "re-run of the layer per step" in str(w.message)]
        assert len(said) == int(warned)
        assert not warned or ("StatePatch(rows, times, fn=...)" in said[0] and "hook.position" in said[0])
        at = times >= int(warned)
        declared = model.run_with_hooks(tokens, fwd_hooks=[(MIXER + "hook_state",
                                                            StatePatch(rows[at], times[at], fn=lambda c: c * 0.5))])
        torch.testing.assert_close(by_hook, declared, atol=1e-12, rtol=0)
