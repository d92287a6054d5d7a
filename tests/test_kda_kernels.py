"""The channel-wise gated delta rule (delta_rule with g [B, T, H, K], Kimi Delta Attention): every
impl against the definition and against fla's naive KDA (outputs and gradients), Triton's
checkpointed backward, stability under strong decay, and the scalar decay as its special case.
The tests shared with the scalar decay (chunked and native against naive with pins and exports,
gradcheck in float64, patches) run in test_kernels_gated_delta.py for both decays."""

import pytest
import torch

from models.kernels import delta_rule
from models.kernels.native import library
from tests.conftest import triton_interpreter_available
from tests.test_kernels_delta import rel_err
from tests.test_kernels_gated_delta import NAMES, assert_agree, gated_problem, some_pins

needs_native = pytest.mark.skipif(
    not library.available(), reason=f"native kernels unavailable: {library.unavailable_reason()}"
)
needs_triton = pytest.mark.skipif(
    not triton_interpreter_available(), reason="triton not importable (or no GPU and no TRITON_INTERPRET)"
)


def kda_problem(batch, length, heads, d_k, d_v, seed, dtype=torch.float32, strength=1.5):
    """gated_problem with a log decay g [B, T, H, K] in [-strength, 0]."""
    return gated_problem(batch, length, heads, d_k, d_v, seed, dtype, channels=True, strength=strength)


def test_naive_is_the_recurrence_written_out():
    """S_t = S_{t-1} Diag(alpha_t) (I - beta k k^T) + beta v k^T, o_t = S_t q_t, one head by hand."""
    q, k, v, beta, g, s0, _ = [x.detach() for x in kda_problem(1, 4, 1, 3, 2, seed=5)]
    S = s0[0, 0]
    outs = []
    for t in range(4):
        kt, b = k[0, t, 0], beta[0, t, 0]
        S = S @ torch.diag(torch.exp(g[0, t, 0])) @ (torch.eye(3) - b * torch.outer(kt, kt)) + b * torch.outer(v[0, t, 0], kt)
        outs.append(S @ q[0, t, 0])
    result = delta_rule(q, k, v, beta, g=g, initial_state=s0, output_final_state=True, impl="naive")
    torch.testing.assert_close(result.output[0, :, 0], torch.stack(outs), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(result.final_state[0, 0], S, rtol=1e-6, atol=1e-6)


def fla_reference(problem):
    """fla's naive_recurrent_kda (keys x values state, float32 inside) on the same inputs."""
    naive = pytest.importorskip("fla.ops.kda.naive")
    q, k, v, beta, g, s0, _ = problem
    o, S = naive.naive_recurrent_kda(q, k, v, g, beta, scale=1.0, initial_state=s0.transpose(-1, -2),
                                     output_final_state=True)
    return o, S.transpose(-1, -2)


IMPLS = ["naive", "chunked", pytest.param("native", marks=needs_native),
         pytest.param("triton", marks=[needs_triton, pytest.mark.triton])]


@pytest.mark.parametrize("impl", IMPLS)
def test_every_impl_matches_fla_naive_kda(impl):
    problem = [x.detach() for x in kda_problem(2, 19, 2, 6, 5, seed=13, strength=4.0)]
    o_ref, s_ref = fla_reference(problem)
    q, k, v, beta, g, s0, _ = problem
    ours = delta_rule(q, k, v, beta, g=g, initial_state=s0, output_final_state=True, chunk_size=8, impl=impl)
    assert rel_err(ours.output, o_ref) <= 1e-5
    assert rel_err(ours.final_state, s_ref) <= 1e-5


def test_fla_naive_kda_gradients_agree():
    problem = kda_problem(2, 9, 2, 5, 4, seed=21)
    q, k, v, beta, g, s0, _ = problem
    o_ref, s_ref = fla_reference(problem)
    ours = delta_rule(q, k, v, beta, g=g, initial_state=s0, output_final_state=True, impl="chunked", chunk_size=4)
    inputs = (q, k, v, beta, g, s0)
    g_ref = torch.autograd.grad(o_ref.square().sum() + s_ref.sum(), inputs)
    g_ours = torch.autograd.grad(ours.output.square().sum() + ours.final_state.sum(), inputs)
    for name, a, b in zip(NAMES, g_ours, g_ref):
        assert rel_err(a, b) <= 1e-5, name


def test_chunked_is_stable_under_strong_decay():
    """g = -30 a step in some channels: the chunk's decay factors never exceed 1 (no exp(-G))."""
    problem = [x.detach() for x in kda_problem(1, 40, 1, 4, 3, seed=2, dtype=torch.float64, strength=30.0)]
    q, k, v, beta, g, s0, _ = problem
    ref = delta_rule(q, k, v, beta, g=g, initial_state=s0, impl="naive")
    got = delta_rule(q, k, v, beta, g=g, initial_state=s0, impl="chunked", chunk_size=40)
    assert torch.isfinite(got.output).all() and rel_err(got.output, ref.output) <= 1e-12


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("length,d_k,d_v,pinned", [(21, 5, 40, True), (1, 4, 4, False), (16, 3, 2, True)])
def test_triton_matches_naive(length, d_k, d_v, pinned):
    # d_v = 40: two value blocks; length 21, 16: checkpoint blocks of 16 steps, partial and whole
    problem = kda_problem(2, length, 2, d_k, d_v, seed=length)
    assert_agree("triton", problem, [0, length - 1, length // 2], some_pins(length) if pinned else None)


@pytest.mark.parametrize("impl", ["naive", "chunked", pytest.param("native", marks=needs_native)])
def test_equal_channels_are_the_scalar_decay(impl):
    q, k, v, beta, g, s0, _ = [x.detach() for x in kda_problem(2, 9, 2, 4, 3, seed=3)]
    scalar = g[..., 0]
    per_head = delta_rule(q, k, v, beta, g=scalar, initial_state=s0, export_at="all", chunk_size=4, impl=impl)
    channels = delta_rule(q, k, v, beta, g=scalar[..., None].expand_as(g).contiguous(), initial_state=s0,
                          export_at="all", chunk_size=4, impl=impl)
    assert rel_err(channels.output, per_head.output) <= 1e-6
    assert rel_err(channels.states_at, per_head.states_at) <= 1e-6
    varied = delta_rule(q, k, v, beta, g=g, initial_state=s0, chunk_size=4, impl=impl)
    assert (varied.output - per_head.output).abs().max() > 1e-2


def test_bad_channel_decay_raises():
    q, k, v, beta, g, _, _ = [x.detach() for x in kda_problem(1, 3, 2, 4, 4, seed=1)]
    with pytest.raises(ValueError, match=r"g must have shape \(1, 3, 2, 4\)"):
        delta_rule(q, k, v, beta, g=g[..., :3])
    with pytest.raises(ValueError, match="g must have rank 3 or 4"):
        delta_rule(q, k, v, beta, g=g[..., None])
