"""Gradients through every hook: run_with_cache(incl_bwd=True), hook_state's total derivative
d metric / d h_t against autograd through the naive step loop, the `state + delta` idiom, nnsight."""

import pytest
import torch

import models
from models.mixers.base import GatedRecurrentMixer, RecurrentMixer

VOCAB, B, T = 7, 2, 9
SMALL = dict(vocab_size=VOCAB, d_model=16, n_heads=2, d_state=4, n_layers=2)
RECURRENT = [n for n in models.list_models() if "blocks.0.mixer.hook_state" in models.build(n, **SMALL).hook_names()]


def small_model(name: str) -> models.SequenceModel:
    torch.manual_seed(0)
    return models.build(name, **SMALL).double()


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 3].sum() - logits[:, 4, 1].sum() + 0.1 * logits.square().mean()


@pytest.fixture
def tokens():
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))


def naive_state_grads(model, tokens, layer: int, dtype: torch.dtype) -> torch.Tensor:
    """d metric / d h_t of block `layer` by autograd through the step loop: h_t = step(h_{t-1}) + e_t."""
    mixer = model.blocks[layer].mixer
    found = {}

    def mix(x):
        inputs = mixer.prepare(x)
        e = torch.zeros(x.shape[0], x.shape[1], *mixer.state_shape, dtype=dtype, requires_grad=True)
        found["e"] = e
        if isinstance(mixer, GatedRecurrentMixer):
            states = GatedRecurrentMixer.scan(mixer, inputs, shift=e)[1]
        else:
            states = RecurrentMixer.scan(mixer, inputs, shift=e)[1]
        return mixer.readout(x, states, inputs)

    mixer.mix = mix
    try:
        value = metric(model(tokens))
    finally:
        del mixer.mix
    return torch.autograd.grad(value, found["e"])[0]


@pytest.mark.parametrize("name", RECURRENT)
def test_hook_state_gradient_is_the_total_derivative_through_the_recurrence(name, tokens):
    model = small_model(name)  # complex states (AUSSM, Mamba-3, S4D): torch's d/dRe + i d/dIm on both sides
    layers = [l for l in (0, 1) if f"blocks.{l}.mixer.hook_state" in model.hook_names()]  # hybrids: some
    names = [f"blocks.{l}.mixer.hook_state" for l in layers] + ["blocks.0.hook_resid_pre"]
    logits, cache = model.run_with_cache(tokens, names=names, incl_bwd=True, metric=metric)
    for layer in layers:
        expected = naive_state_grads(model, tokens, layer, cache[f"blocks.{layer}.mixer.hook_state"].dtype)
        got = cache[f"blocks.{layer}.mixer.hook_state_grad"]
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, atol=1e-5 * expected.abs().max().item() + 1e-9, rtol=1e-5)
    assert expected.abs().max() > 0
    # an ordinary hook's gradient equals autograd's on its activation
    torch.testing.assert_close(logits, model(tokens).detach())


@pytest.mark.parametrize("name", ["mamba", "negative_mamba", "deltanet", "mamba2", "tanh_rnn", "lstm", "s4d"])
def test_a_zero_delta_on_hook_state_gets_the_state_gradient(name, tokens):
    """The torch idiom: a hook returning state + delta, delta a zero leaf, gives delta.grad = d metric / d h_t."""
    model = small_model(name)
    hook = "blocks.0.mixer.hook_state"
    _, cache = model.run_with_cache(tokens, names=[hook], incl_bwd=True, metric=metric)
    deltas = []

    def add_delta(state, point):
        delta = torch.zeros_like(state, requires_grad=True)
        deltas.append(delta)
        return state + delta

    logits = model.run_with_hooks(tokens, fwd_hooks=[(hook, add_delta)])
    metric(logits).backward()
    torch.testing.assert_close(deltas[0].grad, cache[hook + "_grad"], atol=1e-9, rtol=1e-7)
    assert deltas[0].grad.abs().max() > 0


def test_incl_bwd_gradients_equal_autograd_on_the_activations(tokens):
    model = small_model("transformer")
    names = ["blocks.0.hook_resid_pre", "blocks.1.mixer.hook_pattern", "blocks.0.mlp.hook_post", "hook_final"]
    _, cache = model.run_with_cache(tokens, names=names, incl_bwd=True, metric=metric)
    live = {}

    def keep(x, hook):
        x.retain_grad()
        live[hook.name] = x

    logits = model.run_with_hooks(tokens, fwd_hooks=[(n, keep) for n in names])
    metric(logits).backward()
    for name in names:
        torch.testing.assert_close(cache[name + "_grad"], live[name].grad, atol=1e-12, rtol=1e-9)
    assert all(p.grad is not None for p in model.parameters())  # (this backward's, not run_with_cache's)
    model.zero_grad(set_to_none=True)
    model.run_with_cache(tokens, names=names, incl_bwd=True, metric=metric)
    assert all(p.grad is None for p in model.parameters())  # run_with_cache leaves .grad alone


def test_incl_bwd_checks_its_metric(tokens):
    model = small_model("tanh_rnn")
    with pytest.raises(TypeError, match="metric"):
        model.run_with_cache(tokens, incl_bwd=True)
    with pytest.raises(ValueError, match="scalar"):
        model.run_with_cache(tokens, incl_bwd=True, metric=lambda logits: logits[:, -1])


def test_a_real_state_patch_still_pins_and_its_gradient_follows_the_pinned_value(tokens):
    """A patch that changes a state keeps the causal-patch semantics under grad mode; the
    unpatched steps still carry the total derivative."""
    model = small_model("mamba")
    hook = "blocks.0.mixer.hook_state"
    deltas = []

    def patch(state, point):
        delta = torch.zeros_like(state, requires_grad=True)
        deltas.append(delta)
        changed = state.clone()
        changed[:, 3] = 0.5 * state[:, 3]
        return changed + delta

    logits = model.run_with_hooks(tokens, fwd_hooks=[(hook, patch)])
    with torch.no_grad():
        expected = model.run_with_hooks(tokens, fwd_hooks=[(hook, lambda s, p: torch.cat([s[:, :3], 0.5 * s[:, 3:4], s[:, 4:]], 1))])
    torch.testing.assert_close(logits.detach(), expected)
    metric(logits).backward()
    grad = deltas[0].grad
    assert grad[:, 4:].abs().max() > 0 and grad[:, 3].abs().max() > 0


def test_nnsight_grad_on_hook_state(tokens):
    from interp.nnsight import wrap

    model = small_model("mamba")
    hook = "blocks.0.mixer.hook_state"
    _, cache = model.run_with_cache(tokens, names=[hook], incl_bwd=True, metric=metric)
    nn_model = wrap(model)
    with nn_model.trace(tokens):
        state = nn_model.blocks[0].mixer.hook_state.output
        with metric(nn_model.output).backward():
            grad = state.grad.save()
    torch.testing.assert_close(grad, cache[hook + "_grad"], atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("name,options", [("mamba", {}), ("negative_mamba", {}), ("mamba2", {}),
                                          ("mamba2", {"n_groups": 2})])
def test_selective_hook_state_gradient_runs_one_fused_kernel(monkeypatch, name, options, dtype, tol):
    """The Mamba family's hook_state gradient comes from selective_states_shifted (the probe as its
    shift, the adjoint from its C backward), once per layer and no diag_scan, and equals autograd
    through the naive step loop at an odd T past the chunk size with Mamba's N = 16."""
    from models.kernels.native import library, selective
    from models.mixers import diagonal

    if not library.available():
        pytest.skip(f"native kernels unavailable: {library.unavailable_reason()}")
    torch.manual_seed(0)
    model = models.build(name, **{**SMALL, "d_state": 16, "n_heads": 4}, mixer_options=options).to(dtype)
    tokens = torch.randint(0, VOCAB, (2, 67), generator=torch.Generator().manual_seed(2))
    calls = []
    shifted = selective.selective_states_shifted
    monkeypatch.setattr(selective, "selective_states_shifted", lambda *a, **k: calls.append(1) or shifted(*a, **k))
    monkeypatch.setattr(diagonal, "diag_scan", lambda *a, **k: pytest.fail("diag_scan ran"))
    names = [f"blocks.{l}.mixer.hook_state" for l in (0, 1)]
    _, cache = model.run_with_cache(tokens, names=names, incl_bwd=True, metric=metric)
    assert len(calls) == 2 * (options.get("n_groups", 1))
    monkeypatch.undo()
    for layer in (0, 1):
        expected = naive_state_grads(model, tokens, layer, dtype)
        got = cache[f"blocks.{layer}.mixer.hook_state_grad"]
        assert got.dtype == dtype and expected.abs().max() > 0
        torch.testing.assert_close(got, expected, atol=tol * expected.abs().max().item(), rtol=tol)
    with torch.no_grad():  # the states it reports are the scan's
        states = model.run_with_cache(tokens, names=names)[1]
    for n in names:
        torch.testing.assert_close(cache[n], states[n], atol=tol * states[n].abs().max().item(), rtol=tol)
