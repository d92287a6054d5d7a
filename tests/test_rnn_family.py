"""RNN-family mixers: library agreement, the affine property, the chunked linear scan, gate patches."""

import pytest
import torch
from torch.func import jacrev

import models
from models.kernels.native import lstm as native_lstm
from models.mixers.linear_rnn import chunked_linear_scan

B, T, D = 2, 9, 8
AFFINE = ["linear_rnn", "token_gated_rnn", "dense_ssm"]
STATE_DEPENDENT = ["tanh_rnn", "state_gated_rnn", "lstm", "gru", "layernorm_rnn", "sphere_rnn"]


def mixer_of(name: str, **overrides):
    torch.manual_seed(0)
    model = models.build(name, vocab_size=5, d_model=D, **overrides)
    return model, model.blocks[0].mixer


def inputs_x(seed: int = 1, length: int = T) -> torch.Tensor:
    return torch.randn(B, length, D, generator=torch.Generator().manual_seed(seed), requires_grad=True)


def grads(output: torch.Tensor, leaves) -> list[torch.Tensor]:
    return torch.autograd.grad(output.square().sum(), leaves, retain_graph=True)


# ---- the instrumented loops equal torch.nn.LSTM / torch.nn.GRU ---------------------------------


@pytest.mark.parametrize("name, module", [("lstm", "lstm"), ("gru", "gru")])
def test_loop_equals_torch_module(name, module):
    _, mixer = mixer_of(name, d_hidden=6)
    x = inputs_x()
    leaves = [x, *getattr(mixer, module).parameters()]
    reference, final = getattr(mixer, module)(x)  # [B, T, H], final h (and c for the LSTM)
    states = mixer.scan(mixer.prepare(x))[1]
    h = states[:, :, 0] if name == "lstm" else states
    torch.testing.assert_close(h, reference, atol=1e-5, rtol=1e-5)
    if name == "lstm":
        torch.testing.assert_close(states[:, -1, 1], final[1][0], atol=1e-5, rtol=1e-5)  # c_T
    for got, want in zip(grads(h, leaves), grads(reference, leaves)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("read", ["all", "h"])
@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("name, native", [("lstm", True), ("lstm", False), ("gru", True)])
def test_unpinned_scan_equals_the_step_loop_with_gradients(name, native, initial, read, monkeypatch):
    """The instrumented path without patches (the LSTM's C recurrence, or without the native
    library / off the CPU nn.LSTM's h plus CellStates: gates from h_{t-1} at once, c by the
    diagonal scan; nn.GRU's states) against the step loop: gates, states and the gradients of a
    loss on both (read "all") or on h alone (the readout's case, where the LSTM's gate and c
    graph is skipped) in x, every weight and the initial state."""
    if not native:
        monkeypatch.setattr(native_lstm, "supported", lambda *tensors: False)
    _, mixer = mixer_of(name, d_hidden=6)
    x = inputs_x(length=37)
    h0 = torch.randn(B, *mixer.state_shape, requires_grad=True) if initial else None
    leaves = [x, *mixer.parameters()] + ([h0] if initial else [])
    gen = torch.Generator().manual_seed(2)
    results = []
    for fused in (True, False):
        inputs = mixer.prepare(x)
        gates, states = mixer.unpinned_scan(x, inputs, h0) if fused else mixer.scan(inputs, initial=h0)
        if fused:
            weights = [torch.randn(t.shape, generator=gen) for t in (gates, states)]
            if read == "h":
                weights[0].zero_()
                if name == "lstm":
                    weights[1][:, :, 1] = 0
        loss = (gates * weights[0]).sum() + (states * weights[1]).sum()
        results.append([gates, states, *torch.autograd.grad(loss, leaves, allow_unused=True)])
    for got, want in zip(*results):
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_cached_run_takes_no_step_loop_and_a_patch_resumes_it_from_the_patched_step(name, monkeypatch):
    model, mixer = mixer_of(name)
    hin, hgate, hstate = mixer_hooks(name)
    loop = type(mixer).scan
    starts = []
    monkeypatch.setattr(type(mixer), "scan", lambda self, inputs, *a, **k: starts.append(
        next(iter(inputs.values())).shape[1]) or loop(self, inputs, *a, **k))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens(), names=[hin, hgate, hstate])
        assert starts == []  # no step loop

        def patch(states, hook):
            states[:, 6] = 0.25
            return states

        _, pcache = model.run_with_cache(tokens(), names=[hstate], fwd_hooks=[(hstate, patch)])
    assert starts == [tokens().shape[1] - 6]  # the loop ran from the patched step on
    assert torch.equal(pcache[hstate][:, :6], cache[hstate][:, :6])
    assert (pcache[hstate][:, 7:] - cache[hstate][:, 7:]).abs().max() > 1e-4


# ---- affine mixers: dh_t/dh_{t-1} is A(x_t), whatever the state ------------------------------


def step_jacobian(mixer, inputs_t, h: torch.Tensor) -> torch.Tensor:
    """d step / d h for one example: h [1, *S] -> [n, n]."""
    jac = jacrev(lambda state: mixer.step(inputs_t, state))(h)
    n = h.numel()
    return jac.reshape(n, n)


def one_step_inputs(mixer, t: int = 4):
    with torch.no_grad():
        inputs = mixer.prepare(inputs_x())
    return {k: v[:1, t] for k, v in inputs.items()}


def two_states(mixer) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    return tuple(torch.randn(1, *mixer.state_shape, generator=gen) for _ in range(2))


@pytest.mark.parametrize("name", AFFINE)
def test_affine_jacobian_is_state_free_and_equals_transition(name):
    _, mixer = mixer_of(name)
    assert mixer.is_affine
    inputs_t = one_step_inputs(mixer)
    h1, h2 = two_states(mixer)
    jac1, jac2 = step_jacobian(mixer, inputs_t, h1), step_jacobian(mixer, inputs_t, 3 * h2)
    torch.testing.assert_close(jac1, jac2, atol=1e-6, rtol=1e-6)
    transition = mixer.transition(inputs_t)
    assert transition.shape == (1, D, D)
    torch.testing.assert_close(jac1, transition[0].detach(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", STATE_DEPENDENT)
def test_state_dependent_jacobian_changes_with_the_state(name):
    _, mixer = mixer_of(name)
    assert not mixer.is_affine
    inputs_t = one_step_inputs(mixer)
    h1, h2 = two_states(mixer)
    jac1, jac2 = step_jacobian(mixer, inputs_t, h1), step_jacobian(mixer, inputs_t, h2)
    assert (jac1 - jac2).abs().max() > 1e-2
    with pytest.raises(NotImplementedError, match="not affine"):
        mixer.transition(inputs_t)


def test_token_gated_transition_varies_with_the_token():
    _, mixer = mixer_of("token_gated_rnn")
    with torch.no_grad():
        inputs = mixer.prepare(inputs_x())
        first = mixer.transition({k: v[:, 0] for k, v in inputs.items()})
        second = mixer.transition({k: v[:, 1] for k, v in inputs.items()})
    assert (first - second).abs().max() > 1e-3


def test_affine_inits_contract():
    """The documented inits: ||A||, ||diag(a) A|| and ||A(x)|| stay below 1 on unit-variance inputs."""
    x = torch.randn(1, 64, 32, generator=torch.Generator().manual_seed(3))
    for name, bound in [("linear_rnn", 0.9 + 1e-5), ("token_gated_rnn", 1.0), ("dense_ssm", 1.0)]:
        torch.manual_seed(0)
        mixer = models.build(name, d_model=32, d_hidden=32).blocks[0].mixer
        with torch.no_grad():
            inputs = mixer.prepare(x)
            transitions = torch.stack([mixer.transition({k: v[:, t] for k, v in inputs.items()})
                                       for t in range(x.shape[1])])
        norms = torch.linalg.matrix_norm(transitions, ord=2)
        assert float(norms.max()) < bound, (name, float(norms.max()))
    torch.manual_seed(0)
    A = models.build("linear_rnn", d_model=32).blocks[0].mixer.A.detach()
    torch.testing.assert_close(torch.linalg.eigvals(A).abs(), torch.full((32,), 0.9), atol=1e-5, rtol=0)


# ---- whole-vector normalisations: states on the documented sphere, documented Jacobians -------


def normalised_states(name):
    model, mixer = mixer_of(name)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens(), names=["blocks.0.mixer.hook_state"])
    return mixer, cache["blocks.0.mixer.hook_state"]


def test_layernorm_rnn_states_are_centred_on_the_sqrt_n_sphere():
    _, states = normalised_states("layernorm_rnn")
    torch.testing.assert_close(states.mean(-1), torch.zeros(B, T), atol=1e-5, rtol=0)
    torch.testing.assert_close(states.norm(dim=-1), torch.full((B, T), D**0.5), atol=1e-3, rtol=0)


def test_sphere_rnn_states_lie_on_the_sqrt_n_sphere():
    _, states = normalised_states("sphere_rnn")
    torch.testing.assert_close(states.norm(dim=-1), torch.full((B, T), D**0.5), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["layernorm_rnn", "sphere_rnn"])
def test_normalised_rnn_jacobian_matches_the_documented_formula(name):
    _, mixer = mixer_of(name)
    inputs_t = one_step_inputs(mixer)
    h = two_states(mixer)[0]
    with torch.no_grad():
        v = h @ mixer.recurrent.T + inputs_t["drive"]
        h_next = mixer.step(inputs_t, h)[0]
    eye = torch.eye(D)
    if name == "layernorm_rnn":
        sigma = (v.var(unbiased=False) + 1e-5).sqrt()
        want = (eye - torch.ones(D, D) / D - torch.outer(h_next, h_next) / D) / sigma
    else:
        want = (eye - torch.outer(h_next, h_next) / D) * D**0.5 / v.norm()
    torch.testing.assert_close(step_jacobian(mixer, inputs_t, h), want @ mixer.recurrent.detach(),
                               atol=1e-4, rtol=1e-4)


# ---- the chunked linear scan equals the step loop -------------------------------------------


@pytest.mark.parametrize("length, chunk", [(1, None), (1, 4), (7, 3), (10, 4), (12, 4), (300, None), (300, 16)])
def test_linear_rnn_fast_path_equals_loop(length, chunk):
    options = {} if chunk is None else {"chunk": chunk}
    _, mixer = mixer_of("linear_rnn", mixer_options=options)
    x = inputs_x(length=length)
    leaves = [x, mixer.A, *mixer.in_proj.parameters()]
    inputs = mixer.prepare(x)
    fast = mixer.fast_states(inputs)
    loop = mixer.scan(inputs)[1]
    assert fast.shape == loop.shape == (B, length, D)
    torch.testing.assert_close(fast, loop, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads(fast, leaves), grads(loop, leaves)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_chunked_scan_on_a_known_recurrence():
    """A = 0.5 I, u = 1: h_t = 2 (1 - 0.5^t)."""
    A = 0.5 * torch.eye(3)
    u = torch.ones(1, 11, 3)
    t = torch.arange(1, 12, dtype=torch.float32)
    want = (2 * (1 - 0.5**t)).unsqueeze(-1).expand(1, 11, 3)
    for chunk in (1, 2, 3, 11, 20):
        torch.testing.assert_close(chunked_linear_scan(A, u, chunk), want)


# ---- gates: shapes, consistency with the states, patches that change the recurrence -----------


GATE_SHAPES = {"state_gated_rnn": (D,), "lstm": (4, D), "gru": (3, D), "token_gated_rnn": (D,)}


def tokens(length: int = T) -> torch.Tensor:
    return torch.randint(0, 5, (B, length), generator=torch.Generator().manual_seed(4))


def mixer_hooks(name):
    return [f"blocks.0.mixer.{h}" for h in ("hook_in", "hook_gate", "hook_state")]


@pytest.mark.parametrize("name", list(GATE_SHAPES))
def test_cached_gates_are_the_gates_of_the_cached_states(name):
    model, mixer = mixer_of(name)
    hin, hgate, hstate = mixer_hooks(name)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens(), names=[hin, hgate, hstate])
        inputs = mixer.prepare(cache[hin])
        gates, states = cache[hgate], cache[hstate]
        assert gates.shape == (B, T, *GATE_SHAPES[name])
        previous = torch.cat([mixer.initial_state(B, states)[:, None], states[:, :-1]], dim=1)
        for t in range(T):
            inputs_t = {k: v[:, t] for k, v in inputs.items()}
            if name == "token_gated_rnn":
                torch.testing.assert_close(gates[:, t], inputs_t["gate"])
            else:
                torch.testing.assert_close(gates[:, t], mixer.gate_step(inputs_t, previous[:, t])[0])


def patch_gate(name, t):
    """A gate patch at step t with a known effect on the state at t (checked by `expected`)."""

    def patch(gates, hook):
        if name == "lstm":
            gates[:, t, :2] = 0.0  # i = f = 0: c_t = 0, h_t = 0
        elif name == "gru":
            gates[:, t, 1] = 1.0  # z = 1: h_t = h_{t-1}
        else:
            gates[:, t] = 0.0  # state_gated: h_t = tanh(U x_t + b); token_gated: h_t = B x_t + b
        return gates

    return patch


def expected_state(name, mixer, x, states, t):
    inputs_t = {k: v[:, t] for k, v in mixer.prepare(x).items()}
    if name == "lstm":
        return torch.zeros_like(states[:, t])
    if name == "gru":
        return states[:, t - 1]
    if name == "state_gated_rnn":
        return torch.tanh(inputs_t["drive"])
    return inputs_t["u"]


@pytest.mark.parametrize("name", list(GATE_SHAPES))
def test_gate_patch_changes_the_recurrence_from_that_step(name):
    model, mixer = mixer_of(name)
    hin, hgate, hstate = mixer_hooks(name)
    t = 4
    with torch.no_grad():
        clean, cache = model.run_with_cache(tokens(), names=[hin, hgate, hstate])
        patched, pcache = model.run_with_cache(
            tokens(), names=[hin, hgate, hstate], fwd_hooks=[(hgate, patch_gate(name, t))]
        )
        want = expected_state(name, mixer, pcache[hin], pcache[hstate], t)
    torch.testing.assert_close(pcache[hstate][:, t], want, atol=1e-6, rtol=1e-6)
    assert torch.equal(patched[:, :t], clean[:, :t])
    assert torch.equal(pcache[hstate][:, :t], cache[hstate][:, :t])
    assert (pcache[hstate][:, t] - cache[hstate][:, t]).abs().max() > 1e-3
    assert (patched[:, t + 1:] - clean[:, t + 1:]).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["state_gated_rnn", "lstm", "gru"])
def test_gate_and_state_patches_combine(name):
    """A state patch applies after a gate patch; both are honoured and readers see the result."""
    model, mixer = mixer_of(name)
    hin, hgate, hstate = mixer_hooks(name)
    t_gate, t_state = 2, 6

    def set_state(states, hook):
        states[:, t_state] = 0.5
        return states

    with torch.no_grad():
        _, pcache = model.run_with_cache(
            tokens(), names=[hin, hgate, hstate],
            fwd_hooks=[(hgate, patch_gate(name, t_gate)), (hstate, set_state)],
        )
        want = expected_state(name, mixer, pcache[hin], pcache[hstate], t_gate)
    torch.testing.assert_close(pcache[hstate][:, t_gate], want, atol=1e-6, rtol=1e-6)
    assert torch.all(pcache[hstate][:, t_state] == 0.5)
    # the gates reported at t_state + 1 are those computed from the pinned state
    inputs_t = {k: v[:, t_state + 1] for k, v in mixer.prepare(pcache[hin]).items()}
    with torch.no_grad():
        gate = mixer.gate_step(inputs_t, pcache[hstate][:, t_state])[0]
    torch.testing.assert_close(pcache[hgate][:, t_state + 1], gate)


@pytest.mark.parametrize("name", ["state_gated_rnn", "lstm", "gru"])
def test_gate_patch_with_own_value_is_a_no_op(name):
    model, _ = mixer_of(name)
    hgate = f"blocks.0.mixer.hook_gate"
    with torch.no_grad():
        clean, cache = model.run_with_cache(tokens(), names=[hgate])
        patched = model.run_with_hooks(tokens(), fwd_hooks=[(hgate, lambda g, hook: cache[hgate].clone())])
    assert torch.equal(patched, clean)


# ---- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [0, -2, 2.5, "4", True])
def test_linear_rnn_rejects_a_bad_chunk(chunk):
    with pytest.raises(ValueError, match=rf"chunk must be None or an int >= 1; got {chunk!r}"):
        models.build("linear_rnn", mixer_options={"chunk": chunk})


def test_linear_rnn_rejects_unknown_options():
    with pytest.raises(ValueError, match=r"unknown \['chunks'\]; allowed: \['chunk'\]"):
        models.build("linear_rnn", mixer_options={"chunks": 4})


@pytest.mark.parametrize(
    "name", ["tanh_rnn", "state_gated_rnn", "lstm", "gru", "token_gated_rnn", "dense_ssm", "layernorm_rnn",
             "sphere_rnn", "h3", "baseconv"]
)
def test_mixers_without_options_reject_options(name):
    with pytest.raises(ValueError, match=rf"{name} takes no mixer_options; got \{{'chunk': 4\}}"):
        models.build(name, mixer_options={"chunk": 4})


def test_bad_d_hidden_names_the_field():
    with pytest.raises(ValueError, match="d_hidden must be None or a positive int; got 0"):
        models.build("lstm", d_hidden=0)
