"""The native selective scan with a shift (selective_states_shifted: every state and the read-out
of h_t = a_t h_{t-1} + b_t + shift_t, the forward of a hook_state gradient probe) against the
unfused torch path: values, every gradient for either or both cotangents, shift's gradient the
state adjoint."""

import pytest
import torch

from models.kernels import diag_scan
from models.kernels.native import library, selective
from tests.test_kernels_native_selective import selective_problem, torch_terms

pytestmark = pytest.mark.skipif(
    not library.available(), reason=f"native kernels unavailable: {library.unavailable_reason()}"
)


def unfused_shifted(dt, A, x, Bm, C, shift, h0, scale):
    """The definition: a and b in torch, b + shift, the naive scan, the read-out in torch."""
    a, b = torch_terms(dt, A, x, Bm, scale)
    states = diag_scan(a, b + shift, initial_state=h0, impl="naive").output  # [B, T, E, N]
    return (states @ C[..., None])[..., 0], states


@pytest.mark.parametrize("scale", [1.0, 2.0])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("batch,length,inner,n,initial", [
    (2, 1, 3, 4, True),      # one step
    (3, 67, 5, 16, True),    # odd T past the chunk size, Mamba's N = 16 (its own compiled branch)
    (2, 37, 9, 6, False),
])
@pytest.mark.parametrize("used", ["y", "states", "both"])  # one unused: its cotangent is NULL in C
def test_selective_states_shifted_matches_the_unfused_scan(scale, dtype, tol, batch, length, inner, n, initial, used):
    dt, A, x, Bm, C, h0 = selective_problem(batch, length, inner, n, seed=length + n, dtype=dtype, initial=initial)
    gen = torch.Generator().manual_seed(3)
    shift = 0.1 * torch.randn(batch, length, inner, n, generator=gen, dtype=dtype)
    gy, G = torch.randn(batch, length, inner, generator=gen, dtype=dtype), torch.randn(shift.shape, generator=gen, dtype=dtype)
    results = []
    for fn in (lambda *a: selective.selective_states_shifted(*a[:6], initial_state=a[6], scale=scale),
               lambda *a: unfused_shifted(*a, scale=scale)):
        leaves = [None if t is None else t.clone().requires_grad_() for t in (dt, A, x, Bm, C, shift, h0)]
        y, states = fn(*leaves)
        loss = (y * gy).sum() * (used != "states") + (states * G).sum() * (used != "y")
        grads = torch.autograd.grad(loss, [t for t in leaves if t is not None])
        results.append([y.detach(), states.detach(), *grads])
    for got, expected in zip(*results):
        torch.testing.assert_close(got, expected, atol=tol * expected.abs().max().item(), rtol=tol)
    assert results[1][7].abs().max() > 0  # shift's gradient: the states' adjoint


def test_selective_states_shifted_gradcheck_float64_and_its_states_are_selective_states():
    dt, A, x, Bm, C, h0 = selective_problem(2, 5, 3, 4, seed=5, dtype=torch.float64)
    shift = 0.1 * torch.randn(2, 5, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    inputs = [t.clone().requires_grad_() for t in (dt, A, x, Bm, C, shift, h0)]
    for scale in (1.0, 2.0):
        fn = lambda *a: selective.selective_states_shifted(*a[:6], initial_state=a[6], scale=scale)  # noqa: E731
        assert torch.autograd.gradcheck(fn, inputs)
        y, states = selective.selective_states_shifted(dt, A, x, Bm, C, torch.zeros_like(shift), initial_state=h0,
                                                       scale=scale)
        assert torch.equal(states, selective.selective_states(dt, A, x, Bm, initial_state=h0, scale=scale))
        torch.testing.assert_close(y, selective.selective_scan(dt, A, x, Bm, C, initial_state=h0, scale=scale),
                                   atol=1e-12, rtol=1e-12)


def test_selective_states_shifted_empty_sequence_and_bad_inputs():
    dt, A, x, Bm, C, _ = selective_problem(2, 0, 3, 4, seed=9, initial=False)
    shift = torch.zeros(2, 0, 3, 4, requires_grad=True)
    y, states = selective.selective_states_shifted(dt, A, x, Bm, C, shift)
    assert y.shape == (2, 0, 3) and states.shape == (2, 0, 3, 4)
    assert not torch.autograd.grad(y.sum() + states.sum(), shift)[0].numel()
    dt, A, x, Bm, C, h0 = selective_problem(2, 5, 3, 4, seed=8)
    shift = torch.zeros(2, 5, 3, 4)
    with pytest.raises(ValueError, match=r"shift must have shape \(2, 5, 3, 4\)"):
        selective.selective_states_shifted(dt, A, x, Bm, C, shift[:, :4])
    with pytest.raises(ValueError, match="shift is torch.float64"):
        selective.selective_states_shifted(dt, A, x, Bm, C, shift.double())
    with pytest.raises(TypeError, match="shift must be a torch.Tensor; got NoneType"):
        selective.selective_states_shifted(dt, A, x, Bm, C, None)
    with pytest.raises(ValueError, match=r"scale must be a real number in \(0, 2\]"):
        selective.selective_states_shifted(dt, A, x, Bm, C, shift, scale=3)
