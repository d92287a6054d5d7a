"""The native LSTM recurrence (models.kernels.native.lstm.lstm_scan: C forward and backward with
every gate and state) against a torch step loop of the same equations, and the LSTM mixer's use
of it."""

import pytest
import torch

import models
from models.kernels.native import library
from models.kernels.native import lstm as native_lstm

needs_native = pytest.mark.skipif(
    not library.available(), reason=f"native kernels unavailable: {library.unavailable_reason()}"
)


def lstm_problem(batch, length, hidden, seed, dtype, scale=1.0):
    """drive [B, T, 4H] (scaled by `scale`), h0, c0 [B, H], w_hh [4H, H], all requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)
    tensors = (randn(batch, length, 4 * hidden) * scale, torch.tanh(randn(batch, hidden)), randn(batch, hidden),
               randn(4 * hidden, hidden) / hidden**0.5)
    return [t.requires_grad_() for t in tensors]


def reference(drive, h0, c0, w_hh):
    """The recurrence step by step in torch -> (gates [B, T, 4, H], states [B, T, 2, H])."""
    h, c, gates, states = h0, c0, [], []
    for t in range(drive.shape[1]):
        i, f, g, o = (drive[:, t] + h @ w_hh.T).chunk(4, dim=-1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c = f * c + i * g
        h = o * torch.tanh(c)
        gates.append(torch.stack([i, f, g, o], dim=1))
        states.append(torch.stack([h, c], dim=1))
    return torch.stack(gates, dim=1), torch.stack(states, dim=1)


SHAPES = [(6, 33, 37), (2, 1, 8), (5, 17, 130)]  # rows in a block of 4 and alone, odd T, T = 1, H past 64


@needs_native
@pytest.mark.parametrize("read", ["h", "all"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("batch, length, hidden", SHAPES)
def test_lstm_scan_equals_the_step_loop(batch, length, hidden, dtype, tol, read):
    """Gates, states and the gradients of drive, h0, c0 and W_hh within tol (relative) of the torch
    loop, for a loss on h alone (the readout's case: the C backward without the gates' and c's
    cotangents) or on every gate and state."""
    leaves = lstm_problem(batch, length, hidden, 0, dtype)
    got, want = native_lstm.lstm_scan(*leaves), reference(*leaves)
    gen = torch.Generator().manual_seed(1)
    weights = [torch.randn(t.shape, generator=gen, dtype=dtype) for t in want]
    if read == "h":
        weights[0].zero_()
        weights[1][:, :, 1] = 0
    results = []
    for outputs in (got, want):
        loss = sum((o * w).sum() for o, w in zip(outputs, weights))
        results.append([*outputs, *torch.autograd.grad(loss, leaves)])
    for g, w in zip(*results):
        assert g.shape == w.shape and g.dtype == dtype
        torch.testing.assert_close(g, w, atol=tol * max(1.0, float(w.detach().abs().max())), rtol=tol)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lstm_scan_rows_do_not_depend_on_their_batch(dtype):
    """The C code advances rows in blocks of 4 (one mat-vec shares each load of W_hh), the rest
    one at a time; each output adds its products in the same order either way, so every gate,
    state and gradient of a row is bit-equal whether it ran in a block of 7 rows or alone."""
    leaves = lstm_problem(7, 19, 37, 4, dtype)
    got = native_lstm.lstm_scan(*leaves)
    grads = torch.autograd.grad(got[1][:, :, 0].square().sum() + got[0].sum(), leaves)
    for row in (0, 5):
        alone = [t[row:row + 1].detach().requires_grad_() for t in leaves[:3]] + [leaves[3]]
        one = native_lstm.lstm_scan(*alone)
        one_grads = torch.autograd.grad(one[1][:, :, 0].square().sum() + one[0].sum(), alone[:3])
        for a, b in zip([*one, *one_grads], [*got, *grads[:3]]):
            assert torch.equal(a[0], b[row])


@needs_native
def test_lstm_scan_gradcheck():
    leaves = lstm_problem(2, 5, 3, 2, torch.float64)
    assert torch.autograd.gradcheck(native_lstm.lstm_scan, leaves)


@needs_native
def test_lstm_scan_saturates_without_nan():
    """Pre-activations of |z| up to 1e4 (float32 exp overflows beyond 89): gates at 0 or 1, tanh
    at -1 or 1, finite states and gradients, equal to the torch loop's."""
    leaves = lstm_problem(2, 9, 16, 3, torch.float32, scale=1e4)
    got, want = native_lstm.lstm_scan(*leaves), reference(*leaves)
    assert all(bool(t.isfinite().all()) for t in got)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(got[1][:, :, 0].sum(), leaves)
    assert all(bool(g.isfinite().all()) for g in grads)


@needs_native
def test_mixer_takes_the_native_recurrence_on_the_cpu(monkeypatch):
    """The LSTM's cached run calls lstm_scan once per layer (no nn.LSTM call) and gives the step
    loop's gates and states (the model-level gradient checks are in tests/test_rnn_family.py)."""
    torch.manual_seed(0)
    model = models.build("lstm", vocab_size=5, d_model=24, d_hidden=70)
    mixer = model.blocks[0].mixer
    calls = []
    real = native_lstm.lstm_scan
    monkeypatch.setattr(native_lstm, "lstm_scan", lambda *a: calls.append(a[0].shape) or real(*a))
    monkeypatch.setattr(type(mixer.lstm), "forward", lambda *a, **k: pytest.fail("nn.LSTM called"))
    tokens = torch.randint(0, 5, (3, 21), generator=torch.Generator().manual_seed(1))
    names = ["blocks.0.mixer.hook_in", "blocks.0.mixer.hook_gate", "blocks.0.mixer.hook_state"]
    _, cache = model.run_with_cache(tokens, names=names)
    assert [shape for shape in calls if shape[1] > 3] == [torch.Size([3, 21, 280])]  # not the cache planner's dry runs
    with torch.no_grad():
        gates, states = mixer.scan(mixer.prepare(cache[names[0]]))
    torch.testing.assert_close(cache[names[1]], gates, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache[names[2]], states, atol=1e-5, rtol=1e-5)
