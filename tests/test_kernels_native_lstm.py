"""The native LSTM cell loop (models.kernels.native.lstm.lstm_cells) against the torch definition
(models.mixers.lstm.cell_states), and the LSTM mixer's use of it."""

import pytest
import torch

import models
from models.kernels.native import library
from models.kernels.native import lstm as native_lstm
from models.mixers.lstm import CellStates, cell_states

needs_native = pytest.mark.skipif(
    not library.available(), reason=f"native kernels unavailable: {library.unavailable_reason()}"
)


def lstm_problem(batch, length, hidden, seed, dtype, scale=1.0):
    """h [B, T, H] in (-1, 1), h0, c0 [B, H], drive [B, T, 4H] (scaled by `scale`), w_hh [4H, H]."""
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)  # noqa: E731
    return (torch.tanh(randn(batch, length, hidden)), torch.tanh(randn(batch, hidden)), randn(batch, hidden),
            randn(batch, length, 4 * hidden) * scale, randn(4 * hidden, hidden) / hidden**0.5)


@needs_native
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("batch, length, hidden", [(3, 33, 37), (2, 1, 8), (2, 17, 130)])
def test_lstm_cells_equal_the_torch_definition(batch, length, hidden, dtype, tol):
    """Gates and (h, c) states within tol of torch's sigmoid / tanh and diag_scan, at hidden sizes
    that are not a multiple of the vector width, odd T and T = 1."""
    h, h0, c0, drive, w_hh = lstm_problem(batch, length, hidden, 0, dtype)
    want = cell_states(h, h0, c0, drive, w_hh)
    time_major = h.transpose(0, 1).contiguous().transpose(0, 1)  # nn.LSTM's batch_first layout
    strided = torch.cat([h, h], dim=-1)[..., :hidden]  # neither: copied first
    for layout in (h, time_major, strided):
        got = native_lstm.lstm_cells(drive, layout, h0, c0, w_hh)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == dtype and g.is_contiguous()
            torch.testing.assert_close(g, w, atol=tol, rtol=tol)
        assert torch.equal(got[1][:, :, 0], h)  # h is copied, not recomputed


@needs_native
def test_lstm_cells_saturate_without_nan():
    """Pre-activations of |z| up to 1e4 (exp overflows in float32 beyond 89): gates at exactly 0
    or 1 (tanh at -1 or 1), finite cells, equal to torch's."""
    h, h0, c0, drive, w_hh = lstm_problem(2, 9, 16, 1, torch.float32, scale=1e4)
    got, want = native_lstm.lstm_cells(drive, h, h0, c0, w_hh), cell_states(h, h0, c0, drive, w_hh)
    assert all(bool(t.isfinite().all()) for t in got)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


@needs_native
def test_mixer_takes_the_native_loop_on_the_cpu(monkeypatch):
    """The LSTM's cached run calls lstm_cells once per layer and gives the step loop's gates and
    states (the gradient paths are in tests/test_rnn_family.py)."""
    torch.manual_seed(0)
    model = models.build("lstm", vocab_size=5, d_model=24, d_hidden=70)
    calls = []
    real = native_lstm.lstm_cells
    monkeypatch.setattr(native_lstm, "lstm_cells", lambda *a: calls.append(a[1].shape) or real(*a))
    tokens = torch.randint(0, 5, (3, 21), generator=torch.Generator().manual_seed(1))
    names = ["blocks.0.mixer.hook_gate", "blocks.0.mixer.hook_state"]
    _, cache = model.run_with_cache(tokens, names=names)
    assert calls == [torch.Size([3, 21, 70])]
    mixer = model.blocks[0].mixer
    with torch.no_grad():
        x = model.run_with_cache(tokens, names=["blocks.0.mixer.hook_in"])[1]["blocks.0.mixer.hook_in"]
        gates, states = mixer.scan(mixer.prepare(x))
    torch.testing.assert_close(cache[names[0]], gates, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache[names[1]], states, atol=1e-5, rtol=1e-5)


def test_cell_states_function_passes_h_cotangent_through_untouched():
    """When only h is read (the readout), CellStates' backward hands the states' h cotangent to h
    as it is and gives the weights no gradient from the gates' graph."""
    h, h0, c0, drive, w_hh = lstm_problem(2, 7, 6, 2, torch.float64)
    x = torch.randn(2, 7, 5, dtype=torch.float64)
    w_ih = torch.randn(24, 5, dtype=torch.float64, requires_grad=True)
    w_hh.requires_grad_(True)
    h = h.requires_grad_(True)
    gates, states = CellStates.apply(x, h, h0, c0, drive, w_ih, w_hh, torch.zeros(24, dtype=torch.float64))
    weight = torch.randn(states[:, :, 0].shape, dtype=torch.float64)
    grads = torch.autograd.grad((states[:, :, 0] * weight).sum(), [h, w_hh, w_ih], allow_unused=True)
    assert torch.equal(grads[0], weight)
    assert grads[1] is None and grads[2] is None
