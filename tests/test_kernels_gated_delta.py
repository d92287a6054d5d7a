"""The gated delta rule (delta_rule with g, alpha_t = exp(g_t)): every impl against the definition,
gradcheck, patches, and fla's gated_delta_rule as an oracle; the shared tests also run with a
channel-wise decay g [B, T, H, K] (Kimi Delta Attention; its own tests: test_kda_kernels.py)."""

import pytest
import torch

from models.kernels import delta_rule
from models.kernels.native import library
from tests.conftest import triton_interpreter_available
from tests.test_kernels_delta import make_problem, rel_err

needs_native = pytest.mark.skipif(
    not library.available(), reason=f"native kernels unavailable: {library.unavailable_reason()}"
)
needs_triton = pytest.mark.skipif(
    not triton_interpreter_available(), reason="triton not importable (or no GPU and no TRITON_INTERPRET)"
)


def gated_problem(batch, length, heads, d_k, d_v, seed, dtype=torch.float32, channels=False, strength=1.5):
    """make_problem's (q, k, v, beta, s0, pin values) plus a log decay g in [-strength, 0], [B, T, H]
    or with channels [B, T, H, K]."""
    q, k, v, beta, s0, values = make_problem(batch, length, heads, d_k, d_v, seed, dtype)
    shape = (batch, length, heads, d_k) if channels else (batch, length, heads)
    g = -strength * torch.rand(shape, generator=torch.Generator().manual_seed(seed + 1), dtype=dtype)
    return [q, k, v, beta, g.requires_grad_(), s0, values]


DECAYS = pytest.mark.parametrize("channels", [False, True], ids=["head", "channel"])


def run(impl, problem, export_at=None, mask=None, chunk_size=4):
    """Forward and the gradients of a random linear function of every output."""
    q, k, v, beta, g, s0, values = problem
    result = delta_rule(q, k, v, beta, g=g, initial_state=s0, output_final_state=True, export_at=export_at,
                        pins=None if mask is None else (mask, values), chunk_size=chunk_size, impl=impl)
    outs = [x for x in result if x is not None]
    gen = torch.Generator().manual_seed(123)
    loss = sum((x * torch.randn(x.shape, generator=gen, dtype=x.dtype)).sum() for x in outs)
    grads = torch.autograd.grad(loss, problem, allow_unused=True)
    return [x.detach() for x in outs], [torch.zeros_like(p) if d is None else d for p, d in zip(problem, grads)]


NAMES = ("q", "k", "v", "beta", "g", "initial_state", "pin values")


def test_naive_is_the_recurrence_written_out():
    q, k, v, beta, g, s0, _ = [x.detach() for x in gated_problem(1, 4, 1, 3, 2, seed=5)]
    S = s0[0, 0]
    outs = []
    for t in range(4):
        kt, b = k[0, t, 0], beta[0, t, 0]
        S = torch.exp(g[0, t, 0]) * S @ (torch.eye(3) - b * torch.outer(kt, kt)) + b * torch.outer(v[0, t, 0], kt)
        outs.append(S @ q[0, t, 0])
    result = delta_rule(q, k, v, beta, g=g, initial_state=s0, output_final_state=True, impl="naive")
    torch.testing.assert_close(result.output[0, :, 0], torch.stack(outs), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(result.final_state[0, 0], S, rtol=1e-6, atol=1e-6)


def assert_agree(impl, problem, export_at, mask, chunk_size=4):
    ref_out, ref_grads = run("naive", problem, export_at, mask)
    out, grads = run(impl, problem, export_at, mask, chunk_size=chunk_size)
    for name, x, ref in zip(("output", "final_state", "states_at"), out, ref_out):
        assert rel_err(x, ref) <= 1e-5, name
    for name, d, ref in zip(NAMES, grads, ref_grads):
        if ref.abs().max() > 0:
            assert rel_err(d, ref) <= 1e-5, (name, export_at, mask is not None)


def some_pins(length: int) -> torch.Tensor:
    mask = torch.zeros(2, length, dtype=torch.bool)
    mask[0, length // 2] = mask[1, length - 1] = True
    if length > 4:
        mask[1, 3] = True
    return mask


@DECAYS
@pytest.mark.parametrize("length,chunk", [(1, 4), (7, 4), (19, 5), (33, 16)])  # 16: > 8 states in a chunk
def test_chunked_matches_naive_with_pins_and_exports(length, chunk, channels):
    problem = gated_problem(2, length, 2, 8, 5, seed=length, channels=channels)
    for export_at in ([0, length - 1, length // 2, -1, length // 3], "all"):
        for mask in (None, some_pins(length)):
            assert_agree("chunked", problem, export_at, mask, chunk)


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("length,d_k,d_v,pinned", [(9, 5, 40, True), (1, 4, 4, False)])
def test_triton_matches_naive(length, d_k, d_v, pinned):
    # d_v = 40: two value blocks of 32 rows, whose partial dg recurrences are summed
    problem = gated_problem(2, length, 2, d_k, d_v, seed=length)
    assert_agree("triton", problem, [0, length - 1, length // 2], some_pins(length) if pinned else None)


@DECAYS
@pytest.mark.parametrize("impl", ["naive", "chunked"])
def test_gradcheck_float64(impl, channels):
    q, k, v, beta, g, s0, values = gated_problem(1, 6, 1, 3, 2, seed=7, dtype=torch.float64, channels=channels)
    mask = torch.zeros(1, 6, dtype=torch.bool)
    mask[0, 2] = True

    def fn(q, k, v, beta, g, s0, values):
        result = delta_rule(q, k, v, beta, g=g, initial_state=s0, output_final_state=True,
                            export_at=[1, 4], pins=(mask, values), chunk_size=2, impl=impl)
        return result.output, result.final_state, result.states_at

    assert torch.autograd.gradcheck(fn, (q, k, v, beta, g, s0, values), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("impl", ["naive", "chunked", pytest.param("native", marks=needs_native)])
def test_zero_decay_is_the_plain_delta_rule(impl):
    q, k, v, beta, g, s0, _ = [x.detach() for x in gated_problem(2, 9, 2, 4, 3, seed=3)]
    plain = delta_rule(q, k, v, beta, initial_state=s0, export_at="all", chunk_size=4, impl=impl)
    zero = delta_rule(q, k, v, beta, g=torch.zeros_like(g), initial_state=s0, export_at="all", chunk_size=4,
                      impl=impl)
    assert rel_err(zero.output, plain.output) <= 1e-6 and rel_err(zero.states_at, plain.states_at) <= 1e-6
    decayed = delta_rule(q, k, v, beta, g=g, initial_state=s0, chunk_size=4, impl=impl)
    assert (decayed.output - plain.output).abs().max() > 1e-2


@needs_native
@DECAYS
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("length,d_k,d_v", [(1, 4, 3), (19, 8, 5), (33, 6, 9)])  # d_k 6: the 4-row loop and its tail
def test_native_forward_matches_naive(length, d_k, d_v, dtype, channels):
    problem = gated_problem(2, length, 2, d_k, d_v, seed=length, dtype=dtype, channels=channels)
    q, k, v, beta, g, s0, values = [x.detach() for x in problem]
    mask = some_pins(length)
    for pins in (None, (mask, values)):
        args = dict(g=g, initial_state=s0, output_final_state=True, export_at=[0, length // 2, -1], pins=pins)
        got = delta_rule(q, k, v, beta, impl="native", **args)
        ref = delta_rule(q, k, v, beta, impl="naive", **args)
        for x, r in zip(got, ref):
            assert rel_err(x, r) <= (1e-5 if dtype == torch.float32 else 1e-12)


@DECAYS
@pytest.mark.parametrize("impl", ["naive", "chunked", pytest.param("native", marks=needs_native)])
@pytest.mark.parametrize("t", [0, 6, 11])
def test_patch_equals_run_replace_run_on(impl, t, channels):
    length = 12
    q, k, v, beta, g, s0, _ = [x.detach() for x in gated_problem(2, length, 2, 5, 4, seed=11, channels=channels)]
    new_state = torch.randn(2, 2, 4, 5, generator=torch.Generator().manual_seed(1))
    head = delta_rule(q[:, : t + 1], k[:, : t + 1], v[:, : t + 1], beta[:, : t + 1], g=g[:, : t + 1],
                      initial_state=s0, impl="naive")
    pieces = [head.output[:, :-1], torch.einsum("bhvk,bhk->bhv", new_state, q[:, t])[:, None]]
    if t + 1 < length:
        tail = delta_rule(q[:, t + 1 :], k[:, t + 1 :], v[:, t + 1 :], beta[:, t + 1 :], g=g[:, t + 1 :],
                          initial_state=new_state, impl="naive")
        pieces.append(tail.output)
    patched = delta_rule(q, k, v, beta, g=g, initial_state=s0, patches={t: new_state}, chunk_size=4, impl=impl)
    assert rel_err(patched.output, torch.cat(pieces, dim=1)) <= 1e-5
    clean = delta_rule(q, k, v, beta, g=g, initial_state=s0, chunk_size=4, impl=impl)
    assert torch.equal(patched.output[:, :t], clean.output[:, :t])  # before t nothing changes


def test_bad_decay_raises():
    q, k, v, beta, g, _, _ = [x.detach() for x in gated_problem(1, 3, 2, 4, 4, seed=1)]
    with pytest.raises(ValueError, match=r"g must have shape \(1, 3, 2\)"):
        delta_rule(q, k, v, beta, g=g[:, :, :1])
    with pytest.raises(TypeError, match="g must have a floating dtype"):
        delta_rule(q, k, v, beta, g=torch.zeros(1, 3, 2, dtype=torch.long))


# ----------------------------------------------------------------------------- fla oracle


@pytest.mark.triton
@needs_triton
def test_fla_gated_delta_rule_agrees():
    """fla's fused recurrent kernel (forward; state values x keys with state_v_first=True, no
    query scale with scale=1) and fla's torch reference (forward and gradients; keys x values)."""
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule
    except ImportError as error:
        pytest.skip(f"fla (pip package fla-core) is not importable: {error}")
    q, k, v, beta, g, s0, _ = gated_problem(2, 9, 2, 8, 4, seed=21)
    ours = delta_rule(q, k, v, beta, g=g, initial_state=s0, output_final_state=True, impl="naive")
    with torch.no_grad():
        o_fla, s_fla = fused_recurrent_gated_delta_rule(
            q, k, v, g=g, beta=beta, scale=1.0, initial_state=s0.contiguous(), output_final_state=True,
            state_v_first=True,
        )
    assert rel_err(o_fla, ours.output) <= 1e-5
    assert rel_err(s_fla, ours.final_state) <= 1e-5
    o_ref, s_ref = naive_recurrent_gated_delta_rule(
        q, k, v, beta, g, scale=1.0, initial_state=s0.transpose(-1, -2), output_final_state=True
    )
    inputs = (q, k, v, beta, g, s0)
    g_ref = torch.autograd.grad(o_ref.square().sum() + s_ref.sum(), inputs)
    g_ours = torch.autograd.grad(ours.output.square().sum() + ours.final_state.sum(), inputs)
    for name, a, b in zip(NAMES, g_ours, g_ref):
        assert rel_err(a, b) <= 1e-5, name
