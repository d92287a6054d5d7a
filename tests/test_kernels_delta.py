"""Delta-rule kernels: chunked and Triton against the definition (naive), and fla as an oracle."""

import pytest
import torch
import torch.nn.functional as F

from models.kernels import delta_rule
from models.kernels.native import library
from tests.conftest import triton_interpreter_available

needs_native = pytest.mark.skipif(
    not library.available(), reason=f"native kernels unavailable: {library.unavailable_reason()}"
)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach(), ref.detach()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def make_problem(batch, length, heads, d_k, d_v, seed, dtype=torch.float32, beta_max=2.0):
    """Unit keys, beta in [0, beta_max], an initial state, pin values; all requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, length, heads, d_k, generator=gen, dtype=dtype)
    k = F.normalize(torch.randn(batch, length, heads, d_k, generator=gen, dtype=dtype), dim=-1)
    v = torch.randn(batch, length, heads, d_v, generator=gen, dtype=dtype)
    beta = beta_max * torch.rand(batch, length, heads, generator=gen, dtype=dtype)
    s0 = torch.randn(batch, heads, d_v, d_k, generator=gen, dtype=dtype)
    values = torch.randn(batch, length, heads, d_v, d_k, generator=gen, dtype=dtype)
    return [x.requires_grad_() for x in (q, k, v, beta, s0, values)]


def run(impl, problem, export_at=None, mask=None, chunk_size=64, beta_clamp=None):
    """Forward and the gradients of a random linear function of every output."""
    q, k, v, beta, s0, values = problem
    pins = None if mask is None else (mask, values)
    result = delta_rule(q, k, v, beta, initial_state=s0, output_final_state=True,
                        export_at=export_at, pins=pins, chunk_size=chunk_size, impl=impl,
                        beta_clamp=beta_clamp)
    outs = [x for x in result if x is not None]
    gen = torch.Generator().manual_seed(123)
    loss = sum((x * torch.randn(x.shape, generator=gen, dtype=x.dtype)).sum() for x in outs)
    grads = torch.autograd.grad(loss, problem, allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for p, g in zip(problem, grads)]
    return [x.detach() for x in outs], grads


CASES = [  # batch, length, heads, d_k, d_v, chunk
    (2, 1, 2, 4, 3, 4),
    (2, 7, 2, 8, 5, 4),  # T not a multiple of the chunk
    (1, 33, 3, 8, 8, 8),
    (2, 70, 2, 16, 8, 16),
    (1, 40, 1, 6, 4, 64),  # one partial chunk
]


@pytest.mark.parametrize("batch,length,heads,d_k,d_v,chunk", CASES)
def test_chunked_matches_naive(batch, length, heads, d_k, d_v, chunk):
    problem = make_problem(batch, length, heads, d_k, d_v, seed=length)
    export_at = [0, length - 1, length // 2, -1, length // 3]
    ref_out, ref_grads = run("naive", problem, export_at)
    out, grads = run("chunked", problem, export_at, chunk_size=chunk)
    assert len(out) == 3
    for name, x, ref in zip(("output", "final_state", "states_at"), out, ref_out):
        assert rel_err(x, ref) <= 1e-5, name
    for name, g, ref in zip(("q", "k", "v", "beta", "initial_state"), grads, ref_grads):
        assert rel_err(g, ref) <= 1e-5, name


@pytest.mark.parametrize("chunk", [4, 5, 16])  # 16: more than 8 states inside a chunk
def test_chunked_pins_and_chunk_exports_match_naive(chunk):
    length = 19
    problem = make_problem(2, length, 2, 8, 6, seed=3)
    mask = torch.zeros(2, length, dtype=torch.bool)
    mask[0, 3] = mask[1, 3] = True  # a chunk boundary for chunk=4
    mask[1, 10] = True
    mask[0, length - 1] = True
    for export_at in ("all", "chunks", [3, 10, 11]):
        ref_out, ref_grads = run("naive", problem, export_at if export_at != "chunks" else
                                 list(range(chunk - 1, length, chunk)), mask=mask)
        out, grads = run("chunked", problem, export_at, mask=mask, chunk_size=chunk)
        for x, ref in zip(out, ref_out):
            assert rel_err(x, ref) <= 1e-5, export_at
        for name, g, ref in zip(("q", "k", "v", "beta", "initial_state", "pin values"), grads, ref_grads):
            assert rel_err(g, ref) <= 1e-5, (export_at, name)


def test_naive_is_the_recurrence_written_out():
    q, k, v, beta, s0, _ = [x.detach() for x in make_problem(1, 4, 1, 3, 2, seed=5)]
    S = s0[0, 0]
    outs = []
    for t in range(4):
        kt = k[0, t, 0]
        S = S @ (torch.eye(3) - beta[0, t, 0] * torch.outer(kt, kt)) + beta[0, t, 0] * torch.outer(v[0, t, 0], kt)
        outs.append(S @ q[0, t, 0])
    result = delta_rule(q, k, v, beta, initial_state=s0, output_final_state=True, impl="naive")
    torch.testing.assert_close(result.output[0, :, 0], torch.stack(outs), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(result.final_state[0, 0], S, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("impl", ["naive", "chunked"])
def test_gradcheck_float64(impl):
    q, k, v, beta, s0, values = make_problem(1, 5, 1, 3, 2, seed=7, dtype=torch.float64)
    mask = torch.zeros(1, 5, dtype=torch.bool)
    mask[0, 2] = True

    def fn(q, k, v, beta, s0, values):
        result = delta_rule(q, k, v, beta, initial_state=s0, output_final_state=True,
                            export_at=[1, 3], pins=(mask, values), chunk_size=2, impl=impl)
        return result.output, result.final_state, result.states_at

    assert torch.autograd.gradcheck(fn, (q, k, v, beta, s0, values), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("impl", ["naive", "chunked", pytest.param("native", marks=needs_native)])
@pytest.mark.parametrize("t", [0, 6, 11])
def test_patch_equals_run_replace_run_on(impl, t):
    length = 12
    q, k, v, beta, s0, _ = [x.detach() for x in make_problem(2, length, 2, 5, 4, seed=11)]
    new_state = torch.randn(2, 2, 4, 5, generator=torch.Generator().manual_seed(1))
    head = delta_rule(q[:, : t + 1], k[:, : t + 1], v[:, : t + 1], beta[:, : t + 1],
                      initial_state=s0, impl="naive")
    o_t = torch.einsum("bhvk,bhk->bhv", new_state, q[:, t])
    pieces = [head.output[:, :-1], o_t[:, None]]
    final = new_state
    if t + 1 < length:
        tail = delta_rule(q[:, t + 1 :], k[:, t + 1 :], v[:, t + 1 :], beta[:, t + 1 :],
                          initial_state=new_state, output_final_state=True, impl="naive")
        pieces.append(tail.output)
        final = tail.final_state
    expected = torch.cat(pieces, dim=1)
    patched = delta_rule(q, k, v, beta, initial_state=s0, output_final_state=True,
                         export_at=[t], patches={t: new_state}, chunk_size=4, impl=impl)
    assert rel_err(patched.output, expected) <= 1e-5
    assert rel_err(patched.final_state, final) <= 1e-5
    torch.testing.assert_close(patched.states_at[:, 0], new_state)
    # before t nothing changes, bit for bit
    clean = delta_rule(q, k, v, beta, initial_state=s0, chunk_size=4, impl=impl)
    assert torch.equal(patched.output[:, :t], clean.output[:, :t])


@pytest.mark.parametrize("impl", ["naive", "chunked", pytest.param("native", marks=needs_native)])
def test_beta_clamp_equals_clamping_beta_first(impl):
    q, k, v, beta, s0, _ = [x.detach() for x in make_problem(2, 9, 3, 4, 4, seed=2)]
    clamp = torch.tensor([[0.0, 1.0], [-float("inf"), float("inf")], [0.5, 0.7]])
    clamped = torch.stack([beta[..., 0].clamp(0, 1), beta[..., 1], beta[..., 2].clamp(0.5, 0.7)], -1)
    got = delta_rule(q, k, v, beta, initial_state=s0, beta_clamp=clamp, chunk_size=4, impl=impl)
    ref = delta_rule(q, k, v, clamped, initial_state=s0, impl="naive")
    assert rel_err(got.output, ref.output) <= 1e-5
    assert (got.output - delta_rule(q, k, v, beta, initial_state=s0, impl=impl).output).abs().max() > 1e-3


def test_auto_dispatch_agrees_with_naive():
    problem = [x.detach() for x in make_problem(2, 10, 2, 4, 4, seed=4)]
    q, k, v, beta, s0, _ = problem
    for export_at in (None, "all", [2]):
        got = delta_rule(q, k, v, beta, initial_state=s0, export_at=export_at, chunk_size=4)
        ref = delta_rule(q, k, v, beta, initial_state=s0, export_at=export_at, impl="naive")
        assert rel_err(got.output, ref.output) <= 1e-5
        if export_at is not None:
            assert rel_err(got.states_at, ref.states_at) <= 1e-5
    assert got.final_state is None


# ----------------------------------------------------------------------------- native (forward only)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch,length,heads,d_k,d_v,chunk", CASES)
def test_native_forward_matches_naive(batch, length, heads, d_k, d_v, chunk, dtype):
    q, k, v, beta, s0, values = [x.detach() for x in make_problem(batch, length, heads, d_k, d_v, seed=length,
                                                                  dtype=dtype)]
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[0, length // 2] = mask[-1, 0] = True
    for export_at, initial, pins in (([length - 1, 0, length // 2, length // 2], s0, (mask, values)),
                                     ("all", None, None)):
        got = delta_rule(q, k, v, beta, initial_state=initial, output_final_state=True, export_at=export_at,
                         pins=pins, impl="native")
        ref = delta_rule(q, k, v, beta, initial_state=initial, output_final_state=True, export_at=export_at,
                         pins=pins, impl="naive")
        for name, x, r in zip(("output", "final_state", "states_at"), got, ref):
            assert x.dtype == r.dtype and x.shape == r.shape, name
            assert rel_err(x, r) <= (1e-5 if dtype == torch.float32 else 1e-12), name


@needs_native
def test_native_is_forward_only_and_auto_picks_it_without_gradients():
    problem = make_problem(2, 9, 2, 8, 4, seed=5)
    q, k, v, beta, s0, _ = problem
    with pytest.raises(ValueError, match="no backward"):
        delta_rule(q, k, v, beta, initial_state=s0, impl="native")
    ref_out, ref_grads = run("naive", problem)  # auto with gradients: the chunked form
    out, grads = run("auto", problem, chunk_size=4)
    for x, r in zip(out + grads, ref_out + ref_grads):
        assert rel_err(x, r) <= 1e-5
    with torch.no_grad():
        auto = delta_rule(q, k, v, beta, initial_state=s0, impl="auto", export_at="all")
        native = delta_rule(q, k, v, beta, initial_state=s0, impl="native", export_at="all")
    assert torch.equal(auto.output, native.output) and torch.equal(auto.states_at, native.states_at)
    detached = [x.detach() for x in (q, k, v, beta, s0)]  # grad mode on, nothing requires grad
    torch.testing.assert_close(delta_rule(*detached[:4], initial_state=detached[4], impl="native").output,
                               native.output, rtol=0, atol=0)


def test_bad_input_raises():
    q, k, v, beta, s0, values = [x.detach() for x in make_problem(2, 5, 2, 4, 3, seed=0)]
    with pytest.raises(ValueError, match="beta"):
        delta_rule(q, k, v, beta[:, :, :1])
    with pytest.raises(ValueError, match="v must have shape"):
        delta_rule(q, k, v[:, :4], beta)
    with pytest.raises(TypeError, match="k must"):
        delta_rule(q, k.long(), v, beta)
    with pytest.raises(ValueError, match="impl"):
        delta_rule(q, k, v, beta, impl="fast")
    with pytest.raises(ValueError, match="export_at"):
        delta_rule(q, k, v, beta, export_at=[5])
    with pytest.raises(ValueError, match="export_at"):
        delta_rule(q, k, v, beta, export_at="every")
    with pytest.raises(ValueError, match="initial_state"):
        delta_rule(q, k, v, beta, initial_state=s0[..., :2])
    with pytest.raises(ValueError, match="pins values"):
        delta_rule(q, k, v, beta, pins=(torch.zeros(2, 5, dtype=torch.bool), values[:, :, :1]))
    with pytest.raises(ValueError, match="pins mask"):
        delta_rule(q, k, v, beta, pins=(torch.zeros(2, 5), values))
    with pytest.raises(ValueError, match="patches"):
        delta_rule(q, k, v, beta, patches={7: s0})
    with pytest.raises(ValueError, match="patches"):
        delta_rule(q, k, v, beta, patches={1: s0[:, :1]})
    with pytest.raises(ValueError, match="not both"):
        delta_rule(q, k, v, beta, patches={1: s0}, pins=(torch.zeros(2, 5, dtype=torch.bool), values))
    with pytest.raises(ValueError, match="beta_clamp"):
        delta_rule(q, k, v, beta, beta_clamp=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="min <= max"):
        delta_rule(q, k, v, beta, beta_clamp=torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="chunk_size"):
        delta_rule(q, k, v, beta, chunk_size=0)


# ----------------------------------------------------------------------------- triton


@pytest.mark.triton
@pytest.mark.skipif(not triton_interpreter_available(), reason="triton not importable (or no GPU and no TRITON_INTERPRET)")
@pytest.mark.parametrize("length,d_k,d_v,pinned", [(7, 5, 40, True), (1, 4, 4, False)])
def test_triton_matches_naive(length, d_k, d_v, pinned):
    # d_v = 40 runs two value blocks of 32 rows; d_k = 5 exercises the key mask
    problem = make_problem(2, length, 2, d_k, d_v, seed=length)
    mask = None
    if pinned:
        mask = torch.zeros(2, length, dtype=torch.bool)
        mask[0, 2] = mask[1, length - 1] = mask[1, 4] = True
    export_at = [0, length - 1, length // 2]
    ref_out, ref_grads = run("naive", problem, export_at, mask=mask)
    out, grads = run("triton", problem, export_at, mask=mask)
    for name, x, ref in zip(("output", "final_state", "states_at"), out, ref_out):
        assert rel_err(x, ref) <= 1e-4, name
    for name, g, ref in zip(("q", "k", "v", "beta", "initial_state", "pin values"), grads, ref_grads):
        if ref.abs().max() > 0:
            assert rel_err(g, ref) <= 1e-4, name


@pytest.mark.triton
@pytest.mark.skipif(not triton_interpreter_available(), reason="triton not importable (or no GPU and no TRITON_INTERPRET)")
def test_triton_beta_clamp_and_no_initial_state():
    q, k, v, beta, _, _ = [x.detach().requires_grad_() for x in make_problem(1, 6, 2, 4, 4, seed=8)]
    clamp = torch.tensor([[0.0, 1.0], [-float("inf"), float("inf")]])
    results = {}
    for impl in ("naive", "triton"):
        out = delta_rule(q, k, v, beta, beta_clamp=clamp, export_at="all", impl=impl)
        grads = torch.autograd.grad((out.output.sum() + out.states_at.square().sum()), (q, k, v, beta))
        results[impl] = (out.output, out.states_at, *grads)
    for x, ref in zip(results["triton"], results["naive"]):
        assert rel_err(x, ref) <= 1e-4


# ----------------------------------------------------------------------------- fla oracle


@pytest.mark.triton
def test_fla_fused_recurrent_agrees():
    if not triton_interpreter_available():
        pytest.skip("triton not importable (or no GPU and no TRITON_INTERPRET)")
    try:
        from fla.ops.delta_rule import fused_recurrent_delta_rule
    except ImportError as error:
        pytest.skip(f"fla (pip package fla-core) is not importable: {error}")
    problem = make_problem(2, 6, 2, 8, 4, seed=21)
    q, k, v, beta, s0, _ = problem
    # fla keeps the state as keys x values: transpose ours. scale=1 because o_t = S_t q_t has no
    # query scale; keys are normalised here (fla's in-kernel l2norm autotunes, which the CPU
    # interpreter cannot), so use_qk_l2norm_in_kernel stays False.
    o_fla, s_fla = fused_recurrent_delta_rule(
        q, k, v, beta, scale=1.0, initial_state=s0.transpose(-1, -2).contiguous(),
        output_final_state=True, use_qk_l2norm_in_kernel=False,
    )
    ours = delta_rule(q, k, v, beta, initial_state=s0, output_final_state=True, impl="naive")
    assert rel_err(o_fla, ours.output) <= 1e-4
    assert rel_err(s_fla.transpose(-1, -2), ours.final_state) <= 1e-4
    inputs = (q, k, v, beta, s0)
    g_fla = torch.autograd.grad(o_fla.square().sum() + s_fla.sum(), inputs)
    g_ours = torch.autograd.grad(ours.output.square().sum() + ours.final_state.sum(), inputs)
    for name, a, b in zip(("q", "k", "v", "beta", "initial_state"), g_fla, g_ours):
        assert rel_err(a, b) <= 1e-4, name
