"""Diagonal affine scan and short conv kernels: every implementation against the definition."""

import pytest
import torch
from torch import nn

from models.kernels import diag_scan, short_conv
from tests.conftest import triton_interpreter_available


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach(), ref.detach()
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def make_a(kind: str, shape, gen: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    """Transitions of the kinds the mixers use."""
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    if kind == "decay":  # Mamba: exp(dt A) in (0, 1)
        a = torch.exp(-3 * u)
    elif kind == "negative":  # negative Mamba: 2 exp(dt A) - 1 in (-1, 1)
        a = 2 * torch.exp(-3 * u) - 1
    elif kind == "near_zero":  # |a| down to 1e-30, exact zeros at some steps
        a = torch.exp(-70 * u) * (u > 0.1)
    elif kind == "complex":  # |a| < 1 with any phase
        a = torch.polar(torch.exp(-u), 2 * torch.pi * torch.rand(shape, generator=gen, dtype=torch.float64))
        return a.to(torch.complex128 if dtype == torch.float64 else torch.complex64)
    elif kind == "unit":  # AUSSM-style unit modulus
        a = torch.polar(torch.ones_like(u), 2 * torch.pi * u)
        return a.to(torch.complex128 if dtype == torch.float64 else torch.complex64)
    else:
        raise AssertionError(kind)
    return a.to(dtype)


def make_problem(kind, batch, length, state, seed, readout, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    a = make_a(kind, (batch, length, *state), gen, dtype)
    b = torch.randn(batch, length, *state, generator=gen, dtype=a.dtype)
    h0 = torch.randn(batch, *state, generator=gen, dtype=a.dtype)
    c = None
    if readout == "shared":
        c = torch.randn(batch, length, state[-1], generator=gen, dtype=dtype)
    elif readout == "full":
        c = torch.randn(batch, length, *state, generator=gen, dtype=dtype)
    return a, b, c, h0


def run(impl, a, b, c, h0, export_at, chunk=4, pins=None, patches=None):
    """Outputs and the gradients of a loss touching every output, for one implementation."""
    leaves = [x.clone().requires_grad_() for x in (a, b, h0)]
    cl = None if c is None else c.clone().requires_grad_()
    res = diag_scan(
        leaves[0], leaves[1], cl, initial_state=leaves[2], output_final_state=True,
        export_at=export_at, pins=pins, patches=patches, impl=impl, chunk_size=chunk,
    )
    loss = sum((torch.sin(x.real) * torch.arange(x.numel()).reshape(x.shape).cos()).sum()
               + (x.imag.square().sum() if x.is_complex() else 0) for x in res if x is not None)
    grads = torch.autograd.grad(loss, leaves + ([cl] if cl is not None else []))
    return list(res), list(grads)


CASES = [  # kind, B, T, S, readout, chunk
    ("decay", 2, 1, (3, 4), "shared", 4),
    ("decay", 2, 37, (3, 4), "shared", 4),  # T not a multiple of the chunk, two recursion levels
    ("decay", 1, 70, (5,), None, 4),  # T > chunk^2: three levels
    ("negative", 2, 29, (2, 3), "full", 8),
    ("near_zero", 2, 33, (3, 2), "shared", 4),
    ("complex", 2, 23, (2, 3), "shared", 4),
    ("unit", 1, 41, (4,), None, 8),
    ("decay", 3, 64, (2, 8), "shared", 16),  # exact multiple
]


@pytest.mark.parametrize("kind,batch,length,state,readout,chunk", CASES)
def test_chunked_matches_naive(kind, batch, length, state, readout, chunk):
    a, b, c, h0 = make_problem(kind, batch, length, state, seed=length, readout=readout)
    export_at = [0, length - 1, length // 2, length // 2, -1] + list(range(chunk - 1, length, chunk))
    naive_out, naive_grads = run("naive", a, b, c, h0, export_at)
    chunk_out, chunk_grads = run("chunked", a, b, c, h0, export_at, chunk=chunk)
    for got, ref in zip(chunk_out + chunk_grads, naive_out + naive_grads):
        assert got.shape == ref.shape and got.dtype == ref.dtype
        assert rel_err(got, ref) <= 1e-5


def test_naive_is_the_recurrence():
    a, b, c, h0 = make_problem("negative", 2, 9, (3, 2), seed=0, readout="shared")
    out = diag_scan(a, b, c, initial_state=h0, impl="naive").output
    h = h0
    for t in range(9):
        h = a[:, t] * h + b[:, t]
        expected = torch.einsum("ben,bn->be", h, c[:, t])
        torch.testing.assert_close(out[:, t], expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind,readout", [("negative", "shared"), ("complex", "shared"), ("near_zero", None)])
def test_chunked_gradcheck_float64(kind, readout):
    a, b, c, h0 = make_problem(kind, 2, 8, (2, 2), seed=3, readout=readout, dtype=torch.float64)
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[1, 5] = True
    values = torch.randn(2, 8, 2, 2, dtype=a.dtype)
    inputs = [x.clone().requires_grad_() for x in (a, b, h0, values)] + ([] if c is None else [c.clone().requires_grad_()])

    def fn(a, b, h0, values, *c):
        res = diag_scan(a, b, c[0] if c else None, initial_state=h0, output_final_state=True,
                        export_at=[2, 4, 4, 7], pins=(mask, values), impl="chunked", chunk_size=2)
        return tuple(res)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("impl", ["naive", "chunked"])
def test_patch_equals_replacing_state_and_running_on(impl):
    a, b, c, h0 = make_problem("decay", 2, 30, (3, 4), seed=5, readout="shared")
    t_patch = 13
    new_state = torch.randn(2, 3, 4)
    res = diag_scan(a, b, c, initial_state=h0, patches={t_patch: new_state}, output_final_state=True,
                    export_at=[t_patch, 20], impl=impl, chunk_size=4)
    # by hand: naive to t, replace, run on from the new state
    before = diag_scan(a[:, :t_patch], b[:, :t_patch], c[:, :t_patch], initial_state=h0, impl="naive").output
    head = torch.einsum("ben,bn->be", new_state, c[:, t_patch])[:, None]
    after = diag_scan(a[:, t_patch + 1:], b[:, t_patch + 1:], c[:, t_patch + 1:], initial_state=new_state,
                      output_final_state=True, export_at=[20 - t_patch - 1], impl="naive")
    torch.testing.assert_close(res.output, torch.cat([before, head, after.output], 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(res.final_state, after.final_state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(res.states_at[:, 0], new_state)
    torch.testing.assert_close(res.states_at[:, 1], after.states_at[:, 0], rtol=1e-5, atol=1e-5)


def test_pins_apply_per_batch_row_and_match_naive():
    a, b, c, h0 = make_problem("complex", 3, 26, (2, 3), seed=6, readout=None)
    mask = torch.zeros(3, 26, dtype=torch.bool)
    mask[0, 3] = mask[2, 3] = mask[1, 17] = mask[0, 25] = True
    values = torch.randn(3, 26, 2, 3, dtype=a.dtype)
    ref = diag_scan(a, b, pins=(mask, values), impl="naive").output
    got = diag_scan(a, b, pins=(mask, values), impl="chunked", chunk_size=4).output
    assert rel_err(got, ref) <= 1e-5
    assert torch.equal(got[mask], values[mask])
    unpinned = diag_scan(a, b, impl="naive").output
    torch.testing.assert_close(got[1, :17], unpinned[1, :17], rtol=1e-5, atol=1e-5)  # nothing before the pin
    assert (got[1, 18:] - unpinned[1, 18:]).abs().max() > 1e-3  # changed after it


def test_patches_equal_pins_on_every_row():
    a, b, _, h0 = make_problem("decay", 2, 12, (3,), seed=7, readout=None)
    new = torch.randn(2, 3)
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[:, 5] = True
    values = torch.zeros(2, 12, 3)
    values[:, 5] = new
    by_patch = diag_scan(a, b, patches={5: new}).output
    by_pins = diag_scan(a, b, pins=(mask, values)).output
    assert torch.equal(by_patch, by_pins)
    shared = torch.randn(3)  # an unbatched [*S] patch is every row's (as in delta_rule)
    assert torch.equal(diag_scan(a, b, patches={5: shared}).output,
                       diag_scan(a, b, patches={5: shared.expand(2, 3)}).output)
    with pytest.raises(ValueError, match=r"patches\[5\] must be a \[B, \*S\]"):
        diag_scan(a, b, patches={5: torch.randn(4)})


def test_export_all_and_chunks():
    a, b, _, h0 = make_problem("decay", 2, 10, (3,), seed=8, readout=None)
    states = diag_scan(a, b, initial_state=h0, impl="naive").output
    assert torch.equal(diag_scan(a, b, initial_state=h0, export_at="all", chunk_size=4).states_at,
                       diag_scan(a, b, initial_state=h0, chunk_size=4).output)
    chunks = diag_scan(a, b, initial_state=h0, export_at="chunks", chunk_size=4).states_at
    torch.testing.assert_close(chunks, states[:, [3, 7]])


@pytest.mark.parametrize("impl", ["naive", "chunked", "native"])
def test_export_chunks_shorter_than_a_chunk_is_empty(impl):
    """T < chunk_size has no chunk end: an empty [B, 0, *S] export (it raised before)."""
    a, b, c, h0 = make_problem("decay", 2, 3, (3, 2), seed=9, readout="shared")
    res = diag_scan(a, b, c, initial_state=h0, export_at="chunks", chunk_size=4, impl=impl)
    assert res.states_at.shape == (2, 0, 3, 2)
    torch.testing.assert_close(res.output, diag_scan(a, b, c, initial_state=h0, impl="naive").output)


def test_auto_on_cpu_is_native_else_chunked_and_complex_promotes():
    from models.kernels.native import library

    a, b, c, _ = make_problem("decay", 2, 10, (3,), seed=8, readout=None)
    expected = "native" if library.available() else "chunked"
    assert torch.equal(diag_scan(a, b).output, diag_scan(a, b, impl=expected).output)
    out = diag_scan(a, b.to(torch.complex64)).output
    assert out.dtype == torch.complex64
    torch.testing.assert_close(out.real, diag_scan(a, b).output)


def test_triton_without_a_device_or_interpreter_raises(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        diag_scan(torch.rand(1, 3, 2), torch.rand(1, 3, 2), impl="triton")
    with pytest.raises(ValueError, match="real dtypes"):
        diag_scan(torch.rand(1, 3, 2), torch.rand(1, 3, 2, dtype=torch.complex64), impl="triton")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(b=torch.zeros(2, 5, 4)), "b must be"),
        (dict(c=torch.zeros(2, 5, 2)), "c must be"),
        (dict(initial_state=torch.zeros(2, 4, 3)), "initial_state"),
        (dict(impl="fast"), "impl must be one of"),
        (dict(chunk_size=1), "chunk_size"),
        (dict(export_at=[5]), "export_at"),
        (dict(export_at=[0.5]), "export_at"),
        (dict(export_at="every"), "export_at"),
        (dict(patches={7: torch.zeros(2, 5, 3)}), "patches keys"),
        (dict(patches={1: torch.zeros(2, 3)}), r"patches\[1\]"),
        (dict(pins=(torch.zeros(2, 5), torch.zeros(2, 5, 5, 3))), "pins mask"),
        (dict(pins=(torch.zeros(2, 5, dtype=torch.bool), torch.zeros(2, 5, 3))), "pins values"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    args = dict(a=torch.rand(2, 5, 5, 3), b=torch.zeros(2, 5, 5, 3))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        diag_scan(args.pop("a"), args.pop("b"), **args)
    with pytest.raises(ValueError, match="a must be"):
        diag_scan(torch.zeros(2, 5), torch.zeros(2, 5))


# ----------------------------------------------------------------------------- triton


@pytest.mark.triton
@pytest.mark.skipif(not triton_interpreter_available(), reason="triton not importable (or no GPU and no TRITON_INTERPRET)")
@pytest.mark.parametrize(
    "readout,length,state,export",
    [("shared", 13, (3, 4), True), ("shared", 7, (3, 5), False), (None, 9, (3, 4), True),
     ("full", 1, (3, 4), True), ("shared", 3, (9, 1024), False)],  # last: several tiles
)
def test_triton_matches_naive(readout, length, state, export):
    a, b, c, h0 = make_problem("negative", 2, length, state, seed=9, readout=readout)
    mask = torch.zeros(2, length, dtype=torch.bool)
    mask[1, length // 2] = True
    pins = (mask, torch.randn(2, length, *state))
    export_at = [0, length // 2, length - 1] if export else None
    ref_out, ref_grads = run("naive", a, b, c, h0, export_at, pins=pins)
    got_out, got_grads = run("triton", a, b, c, h0, export_at, pins=pins)
    assert (got_out[2] is None) == (not export)
    for got, ref in zip(got_out + got_grads, ref_out + ref_grads):
        if ref is not None:
            assert rel_err(got, ref) <= 1e-4


@pytest.mark.parametrize("impl", [
    "chunked",
    pytest.param("triton", marks=[pytest.mark.triton, pytest.mark.skipif(
        not triton_interpreter_available(), reason="triton not importable (or no GPU and no TRITON_INTERPRET)")]),
])
def test_non_contiguous_inputs_match_naive(impl):
    """Permuted (dense, non-contiguous) a, b, c, h0: outputs and gradients equal the loop's."""
    a, b, c, h0 = make_problem("negative", 2, 9, (3, 4), seed=5, readout="full")
    permuted = lambda x: x.movedim(1, -1).contiguous().movedim(-1, 1)  # noqa: E731 same values, time stride 1
    a, b, c = permuted(a), permuted(b), permuted(c)
    h0 = h0.transpose(0, 1).contiguous().transpose(0, 1)
    assert not any(x.is_contiguous() for x in (a, b, c, h0))
    ref_out, ref_grads = run("naive", a, b, c, h0, [0, 4, 8])
    got_out, got_grads = run(impl, a, b, c, h0, [0, 4, 8])
    for got, ref in zip(got_out + got_grads, ref_out + ref_grads):
        assert rel_err(got, ref) <= 1e-4


# ----------------------------------------------------------------------------- short conv


def conv1d_reference(x, weight, bias):
    channels, width = weight.shape
    conv = nn.Conv1d(channels, channels, width, groups=channels, padding=width - 1)
    with torch.no_grad():
        conv.weight.copy_(weight[:, None])
        conv.bias.copy_(bias)
    return conv(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)


@pytest.mark.parametrize("length,width", [(1, 4), (3, 4), (17, 4), (9, 1), (6, 2)])
def test_short_conv_matches_conv1d(length, width):
    x, weight, bias = torch.randn(2, length, 5), torch.randn(5, width), torch.randn(5)
    ref = conv1d_reference(x, weight, bias)
    for impl in ("naive", "torch", "auto"):
        torch.testing.assert_close(short_conv(x, weight, bias, impl=impl), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(short_conv(x, weight), ref - bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["naive", "torch"])
@pytest.mark.parametrize("split", [1, 2, 7])
def test_short_conv_state_carry(impl, split):
    x, weight, bias = torch.randn(2, 11, 3), torch.randn(3, 4), torch.randn(3)
    whole, final = short_conv(x, weight, bias, output_final_state=True, impl=impl)
    first, state = short_conv(x[:, :split], weight, bias, output_final_state=True, impl=impl)
    second, final2 = short_conv(x[:, split:], weight, bias, state, output_final_state=True, impl=impl)
    torch.testing.assert_close(torch.cat([first, second], 1), whole)
    torch.testing.assert_close(final2, final)
    torch.testing.assert_close(final, x[:, -3:].transpose(1, 2))


def test_short_conv_gradients_agree():
    x, weight, bias = (torch.randn(2, 8, 3, requires_grad=True), torch.randn(3, 4, requires_grad=True),
                       torch.randn(3, requires_grad=True))
    state = torch.randn(2, 3, 3, requires_grad=True)
    grads = []
    for impl in ("naive", "torch"):
        y, s = short_conv(x, weight, bias, state, output_final_state=True, impl=impl)
        grads.append(torch.autograd.grad((y.sin().sum() + s.square().sum()), (x, weight, bias, state)))
    for g_naive, g_torch in zip(*grads):
        torch.testing.assert_close(g_torch, g_naive, rtol=1e-5, atol=1e-5)


def test_short_conv_bad_arguments():
    x = torch.randn(2, 5, 3)
    with pytest.raises(ValueError, match="x must be"):
        short_conv(x[0], torch.randn(3, 4))
    with pytest.raises(ValueError, match="weight must be"):
        short_conv(x, torch.randn(4, 4))
    with pytest.raises(ValueError, match="bias must be"):
        short_conv(x, torch.randn(3, 4), torch.randn(4))
    with pytest.raises(ValueError, match="initial_state"):
        short_conv(x, torch.randn(3, 4), None, torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="impl must be"):
        short_conv(x, torch.randn(3, 4), impl="cuda")
