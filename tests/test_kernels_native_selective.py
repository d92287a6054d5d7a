"""The native selective scan of Mamba and negative Mamba (selective_scan, selective_states)
against the unfused torch path, and the Mamba mixers' use of it."""

import pytest
import torch

from models.kernels import diag_scan
from models.kernels.native import library, selective
from tests.test_kernels_diag import rel_err

needs_native = pytest.mark.skipif(
    not library.available(), reason=f"native kernels unavailable: {library.unavailable_reason()}"
)


def selective_problem(batch, length, inner, n, seed, dtype=torch.float32, initial=True):
    """Mamba-like inputs: dt = softplus(...) in about (0.005, 3), A [E, N] negative (S4D-real
    -(n + 1) scaled per channel), x, Bm, C standard normal; h0 [B, E, N] or None."""
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)  # noqa: E731
    dt = torch.nn.functional.softplus(randn(batch, length, inner) * 1.5 - 1.5)
    A = -torch.arange(1, n + 1, dtype=dtype) * torch.exp(randn(inner, 1) * 0.5)
    h0 = randn(batch, inner, n) if initial else None
    return dt, A, randn(batch, length, inner), randn(batch, length, n), randn(batch, length, n), h0


def torch_terms(dt, A, x, Bm, scale=1.0):
    """a and b materialised in torch: Mamba.transition_terms (scale 1), NegativeMamba's
    2 exp(dt A) - 1 (scale 2), s exp(dt A) - (s - 1) for another s."""
    a = torch.exp(dt[..., None] * A)  # [B, T, E, N]
    if scale != 1:
        a = 2 * a - 1 if scale == 2 else scale * a - (scale - 1)
    b = (dt[..., None] * x[..., None]) * Bm[:, :, None, :]  # [B, T, E, N]
    return a, b


def unfused(dt, A, x, Bm, C, h0, scale=1.0):
    """The definition: a and b materialised in torch (torch_terms), then the naive scan."""
    return diag_scan(*torch_terms(dt, A, x, Bm, scale), C, initial_state=h0, impl="naive").output


def selective_run(fn, inputs, gy, **kwargs):
    """y and the gradients of every input (None for an absent initial state) for cotangent gy."""
    leaves = [None if x is None else x.clone().requires_grad_() for x in inputs]
    y = fn(*leaves, **kwargs)
    grads = torch.autograd.grad(y, [x for x in leaves if x is not None], gy)
    return y, list(grads)


SCALES = [1.0, 2.0]  # the native transitions: Mamba's exp(dt A), negative Mamba's 2 exp(dt A) - 1


@needs_native
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("batch,length,inner,n,chunk,initial", [
    (2, 1, 3, 4, 64, True),      # one step
    (3, 11, 5, 6, 4, True),      # T not a multiple of the checkpoint spacing
    (2, 11, 5, 6, 4, False),
    (1, 37, 8, 16, 64, False),   # one span
    (2, 64, 4, 16, 8, True),     # T a multiple of the spacing
    (2, 200, 8, 16, 64, True),   # Mamba's N = 16 over a longer sequence
])
def test_selective_scan_matches_the_unfused_path(batch, length, inner, n, chunk, initial, scale):
    inputs = selective_problem(batch, length, inner, n, seed=length + n, initial=initial)
    gy = torch.randn(batch, length, inner, generator=torch.Generator().manual_seed(2))
    y_ref, grads_ref = selective_run(unfused, inputs, gy, scale=scale)
    y, grads = selective_run(selective.selective_scan, inputs, gy, chunk_size=chunk, scale=scale)
    assert y.shape == (batch, length, inner) and y.dtype == torch.float32
    assert rel_err(y, y_ref) <= 1e-5
    assert len(grads) == len(grads_ref) == (6 if initial else 5)
    for name, got, ref in zip(["dt", "A", "x", "Bm", "C", "h0"], grads, grads_ref):
        assert got.shape == ref.shape, name
        assert rel_err(got, ref) <= 1e-5, name


@needs_native
@pytest.mark.parametrize("scale", [*SCALES, 1.5])
def test_selective_scan_gradcheck_float64(scale):
    dt, A, x, Bm, C, h0 = selective_problem(2, 7, 3, 4, seed=4, dtype=torch.float64)
    inputs = [t.clone().requires_grad_() for t in (dt, A, x, Bm, C, h0)]
    fn = lambda *args: selective.selective_scan(*args, chunk_size=3, scale=scale)  # noqa: E731 (spans 3, 3, 1)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-6)
    ref = unfused(*inputs, scale=scale)
    torch.testing.assert_close(fn(*inputs), ref, rtol=1e-12, atol=1e-12)


@needs_native
@pytest.mark.parametrize("scale", SCALES)
def test_selective_scan_checkpoint_spacing_changes_no_bits(scale):
    """The backward recomputes the forward's states exactly, so the spacing changes no bits; the
    forward without checkpoints (no gradient wanted) gives the same y."""
    inputs = selective_problem(2, 21, 4, 5, seed=6)
    gy = torch.randn(2, 21, 4)
    y2, grads2 = selective_run(selective.selective_scan, inputs, gy, chunk_size=2, scale=scale)
    y64, grads64 = selective_run(selective.selective_scan, inputs, gy, chunk_size=64, scale=scale)
    for got, ref in zip([y2, *grads2], [y64, *grads64]):
        assert torch.equal(got, ref)
    with torch.no_grad():
        assert torch.equal(selective.selective_scan(*inputs, scale=scale), y2)


@needs_native
def test_selective_scale_one_is_the_default_and_two_differs():
    """scale=1 (int or float) is the default's arithmetic bit for bit; scale=2 is another
    transition (the states flip sign where dt |A| > ln 2)."""
    inputs = selective_problem(2, 9, 4, 5, seed=12)
    dt, A, x, Bm, C, h0 = inputs
    y = selective.selective_scan(*inputs)
    states = selective.selective_states(dt, A, x, Bm, initial_state=h0)
    for one in (1, 1.0):
        assert torch.equal(selective.selective_scan(*inputs, scale=one), y)
        assert torch.equal(selective.selective_states(dt, A, x, Bm, initial_state=h0, scale=one), states)
    assert (selective.selective_scan(*inputs, scale=2) - y).abs().max() > 1e-2


@needs_native
def test_selective_scan_second_derivatives_raise():
    dt, A, x, Bm, C, _ = selective_problem(1, 3, 2, 2, seed=10, initial=False)
    x.requires_grad_()
    (grad_x,) = torch.autograd.grad(selective.selective_scan(dt, A, x, Bm, C).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad_x.sum().backward()


@needs_native
def test_selective_scan_empty_sequence():
    inputs = [t.clone().requires_grad_() for t in selective_problem(2, 0, 3, 4, seed=9)]
    y = selective.selective_scan(*inputs)
    assert y.shape == (2, 0, 3)
    grads = torch.autograd.grad(y.sum(), inputs)
    assert all(g.shape == t.shape and not g.abs().sum() for g, t in zip(grads, inputs))


@needs_native
def test_selective_scan_gradients_only_where_asked():
    dt, A, x, Bm, C, _ = selective_problem(2, 5, 3, 4, seed=7, initial=False)
    A.requires_grad_()
    y = selective.selective_scan(dt, A, x, Bm, C)
    (grad_A,) = torch.autograd.grad(y.sum(), A)
    (grad_A_ref,) = torch.autograd.grad(unfused(dt, A, x, Bm, C, None).sum(), A)
    assert rel_err(grad_A, grad_A_ref) <= 1e-5


@needs_native
def test_selective_exp_f32_is_within_an_ulp_or_so():
    """The float32 exponential of the fused scan (a polynomial, vectorised) against exp in float64:
    at most 1.5 ulp over the float range (torch's float32 exp: 0.6), zero and inf where torch's
    are, NaN for NaN."""
    x = torch.cat([torch.linspace(-110, 90, 400_001), -torch.rand(100_000, generator=torch.Generator().manual_seed(0))])
    got, exact, torch_f32 = selective.exp_f32(x), torch.exp(x.double()), torch.exp(x)
    finite = torch.isfinite(torch_f32)
    rounded = exact.float()
    ulp = (torch.nextafter(rounded, torch.tensor(float("inf"))) - rounded).double()
    ulp = torch.where(rounded == 0, 2.0 ** -149, ulp)
    assert ((got.double() - exact).abs() / ulp)[finite].max() <= 1.5
    assert torch.equal(got == 0, torch_f32 == 0) and torch.equal(torch.isinf(got), torch.isinf(torch_f32))
    special = selective.exp_f32(torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0]))
    assert special[0].isnan() and special[1] == float("inf") and special[2] == 0 and special[3] == 1


@needs_native
def test_selective_scan_bad_inputs_raise():
    dt, A, x, Bm, C, h0 = selective_problem(2, 5, 3, 4, seed=8)
    with pytest.raises(ValueError, match=r"Bm must have shape \(2, 5, 4\)"):
        selective.selective_scan(dt, A, x, Bm[:, :, :3], C)
    with pytest.raises(ValueError, match=r"initial_state must have shape \(2, 3, 4\)"):
        selective.selective_scan(dt, A, x, Bm, C, initial_state=h0[:1])
    with pytest.raises(ValueError, match="C is torch.float64"):
        selective.selective_scan(dt, A, x, Bm, C.double())
    with pytest.raises(ValueError, match="supports"):
        selective.selective_scan(*(t.bfloat16() for t in (dt, A, x, Bm, C)))
    with pytest.raises(ValueError, match=r"dt must be \[B, T, E\] with a nonempty last dim; got shape \(5, 3\)"):
        selective.selective_scan(dt[0], A, x, Bm, C)
    with pytest.raises(ValueError, match=r"A must be \[E, N\] with a nonempty last dim; got shape \(3, 0\)"):
        selective.selective_scan(dt, A[:, :0], x, Bm[..., :0], C[..., :0])
    with pytest.raises(ValueError, match="exp_f32 takes a float32 CPU tensor; got torch.float64"):
        selective.exp_f32(dt.double())
    with pytest.raises(TypeError, match="x must be a torch.Tensor; got list"):
        selective.selective_scan(dt, A, x.tolist(), Bm, C)
    with pytest.raises(ValueError, match="chunk_size must be a positive int; got 0"):
        selective.selective_scan(dt, A, x, Bm, C, chunk_size=0)
    for scale in (0, -1.0, 2.5, float("nan"), float("inf"), True, "2", None):
        with pytest.raises(ValueError, match=rf"selective_scan: scale must be a real number in \(0, 2\].*got {scale!r}"):
            selective.selective_scan(dt, A, x, Bm, C, scale=scale)
    assert not selective.selective_supported(dt, A, x.double(), Bm, C)
    assert not selective.selective_supported(dt.bfloat16(), A.bfloat16())


def mamba_fast_and_instrumented(name: str, tokens):
    """Outputs and parameter gradients of a small model on both paths."""
    import models

    torch.manual_seed(0)
    model = models.build(name, vocab_size=7, d_model=16, d_state=4, n_layers=2)
    results = []
    for path in ("fast", "instrumented"):
        out = model.set_execution_path(path)(tokens)
        results.append([out, *torch.autograd.grad(out.square().sum(), list(model.parameters()))])
    return results


@needs_native
@pytest.mark.parametrize("name,scale", [("mamba", 1.0), ("negative_mamba", 2.0)])
def test_mamba_fast_path_runs_the_fused_scan_and_matches_instrumented(monkeypatch, name, scale):
    """The fast path runs the fused scan with the model's scale; the instrumented path (a gradient
    wanted) runs the unfused one over transition_terms, and the two agree."""
    calls = []
    fused = selective.selective_scan
    monkeypatch.setattr(selective, "selective_scan", lambda *a, **k: calls.append(k["scale"]) or fused(*a, **k))
    tokens = torch.randint(0, 7, (3, 13), generator=torch.Generator().manual_seed(1))
    fast, slow = mamba_fast_and_instrumented(name, tokens)
    assert calls == [scale, scale]  # one per layer, on the fast path only
    for got, ref in zip(fast, slow):  # every parameter's gradient, A_log and D included
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    for variant in ("aussm", "mamba3"):  # no native scale: their own complex kernels, not selective_scan
        mamba_fast_and_instrumented(variant, tokens)
    assert len(calls) == 2


def test_native_scale_follows_the_class_defining_transition_terms():
    """native_scale is declared beside transition_terms: inherited with it, dropped when a
    subclass overrides transition_terms without declaring one."""
    import models
    from models.mixers.negative_mamba import NegativeMamba

    def scale(name):
        return models.build(name, vocab_size=7, d_model=16, d_state=4, n_layers=1).blocks[0].mixer.native_scale()

    assert [scale(name) for name in ("mamba", "negative_mamba", "aussm", "mamba3")] == [1.0, 2.0, None, None]
    mixer = models.build("negative_mamba", vocab_size=7, d_model=16, d_state=4, n_layers=1).blocks[0].mixer

    class Inherits(NegativeMamba):
        pass

    class Overrides(NegativeMamba):
        def transition_terms(self, inputs):
            a, b = super().transition_terms(inputs)
            return a.square(), b

    mixer.__class__ = Inherits
    assert mixer.native_scale() == 2.0
    mixer.__class__ = Overrides
    assert mixer.native_scale() is None


@needs_native
@pytest.mark.parametrize("name", ["mamba", "negative_mamba"])
def test_mamba_fast_from_an_initial_state_fused_equals_unfused(monkeypatch, name):
    """fast_from with a carried state (the resume path): the fused scan against the unfused one."""
    import models

    torch.manual_seed(0)
    mixer = models.build(name, vocab_size=7, d_model=16, d_state=4, n_layers=1).blocks[0].mixer
    u = torch.randn(2, 9, 16)
    initial = torch.randn(2, *mixer.state_shape, requires_grad=True)
    results = []
    for supported in (True, False):
        if not supported:
            monkeypatch.setattr(selective, "selective_supported", lambda *tensors: False)
        out = mixer.fast_from(u, mixer.prepare(u), initial)
        results.append([out, *torch.autograd.grad(out.square().sum(), [initial, mixer.A_log, mixer.dt_proj.weight])])
    for got, ref in zip(*results):
        assert rel_err(got, ref) <= 1e-5


# ----------------------------------------------------------------------------- selective states


def torch_states(dt, A, x, Bm, h0, pins=None, scale=1.0):
    """The definition: a and b materialised in torch (torch_terms), every state from the naive scan."""
    return diag_scan(*torch_terms(dt, A, x, Bm, scale), initial_state=h0, pins=pins, impl="naive").output


def pins_at(batch, length, inner, n, steps, seed, dtype):
    """(mask [B, T], values [B, T, E, N]) pinning batch row r at steps[r] (a list of steps)."""
    mask = torch.zeros(batch, length, dtype=torch.bool)
    for row, row_steps in enumerate(steps):
        mask[row, row_steps] = True
    values = torch.randn(batch, length, inner, n, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return mask, values


STATES_TOL = {torch.float32: 1e-5, torch.float64: 1e-12}
STATE_SHAPES = [  # (batch, length, inner, n, initial state given)
    (2, 1, 3, 4, True),       # one step
    (2, 1, 3, 4, False),
    (3, 13, 5, 6, True),
    (3, 13, 5, 6, False),
    (2, 70, 8, 16, True),     # Mamba's N = 16
]


@needs_native
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch,length,inner,n,initial", STATE_SHAPES)
def test_selective_states_match_the_unfused_scan(dtype, batch, length, inner, n, initial, scale):
    dt, A, x, Bm, _, h0 = selective_problem(batch, length, inner, n, seed=length + n, dtype=dtype, initial=initial)
    got = selective.selective_states(dt, A, x, Bm, initial_state=h0, scale=scale)
    assert got.shape == (batch, length, inner, n) and got.dtype == dtype and got.is_contiguous()
    assert rel_err(got, torch_states(dt, A, x, Bm, h0, scale=scale)) <= STATES_TOL[dtype]


@needs_native
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("initial", [True, False])
def test_selective_states_with_pins_match_the_unfused_scan(dtype, initial, scale):
    """Pins at the first and last steps, at one step in several rows, and at different steps per row."""
    batch, length, inner, n = 4, 17, 5, 6
    dt, A, x, Bm, _, h0 = selective_problem(batch, length, inner, n, seed=21, dtype=dtype, initial=initial)
    pins = pins_at(batch, length, inner, n, [[0, 16], [5, 6], [5, 12], []], seed=22, dtype=dtype)
    got = selective.selective_states(dt, A, x, Bm, initial_state=h0, pins=pins, scale=scale)
    ref = torch_states(dt, A, x, Bm, h0, pins, scale=scale)
    assert rel_err(got, ref) <= STATES_TOL[dtype]
    assert torch.equal(got[pins[0]], pins[1][pins[0]])  # pinned states are the pin values exactly
    unpinned = selective.selective_states(dt, A, x, Bm, initial_state=h0, scale=scale)
    assert torch.equal(got[3], unpinned[3])  # a row without pins is untouched by the others' pins
    assert torch.equal(got[1, :5], unpinned[1, :5])  # steps before a row's first pin keep their bits
    assert (got[1, 7:] - unpinned[1, 7:]).abs().max() > 1e-3  # and the pin propagates after it


@needs_native
def test_selective_states_pin_at_every_step_and_at_t0_only():
    dt, A, x, Bm, _, h0 = selective_problem(2, 6, 3, 4, seed=23, dtype=torch.float64)
    for steps in ([list(range(6)), [0]], [[0], []]):
        pins = pins_at(2, 6, 3, 4, steps, seed=24, dtype=torch.float64)
        got = selective.selective_states(dt, A, x, Bm, initial_state=h0, pins=pins)
        assert rel_err(got, torch_states(dt, A, x, Bm, h0, pins)) <= 1e-12


@needs_native
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_selective_states_are_the_states_selective_scan_reads_out(scale, dtype):
    """The read-out of every state is the fused scan's y, and the fused forward's final state is
    the last of them bit for bit (the same products, contracted alike into fused multiply-adds;
    37 channels and 16 states: vector bodies and remainders in both kernels' inner loops)."""
    dt, A, x, Bm, C, h0 = selective_problem(2, 9, 37, 16, seed=25, dtype=dtype)
    states = selective.selective_states(dt, A, x, Bm, initial_state=h0, scale=scale)
    y = selective.selective_scan(dt, A, x, Bm, C, initial_state=h0, scale=scale)
    assert rel_err((states * C[:, :, None, :]).sum(-1), y) <= (1e-6 if dtype == torch.float32 else 1e-13)
    _, _, final = selective.selective_forward(dt, A, x, Bm, C, h0, 4, False, scale)
    assert torch.equal(final, states[:, -1])


@needs_native
def test_selective_states_empty_sequence_and_non_contiguous_inputs():
    dt, A, x, Bm, _, h0 = selective_problem(2, 0, 3, 4, seed=26)
    assert selective.selective_states(dt, A, x, Bm, initial_state=h0).shape == (2, 0, 3, 4)
    dt, A, x, Bm, _, h0 = selective_problem(3, 8, 5, 4, seed=27)
    strided = [t.transpose(0, 1).contiguous().transpose(0, 1) for t in (dt, x, Bm)]
    got = selective.selective_states(strided[0], A.t().contiguous().t(), strided[1], strided[2],
                                       initial_state=h0.transpose(1, 2).contiguous().transpose(1, 2))
    assert torch.equal(got, selective.selective_states(dt, A, x, Bm, initial_state=h0))


@needs_native
def test_selective_states_refuse_gradients_with_pins_and_bad_inputs():
    dt, A, x, Bm, _, h0 = selective_problem(2, 5, 3, 4, seed=28)
    mask, values = pins_at(2, 5, 3, 4, [[1], []], seed=29, dtype=torch.float32)
    for name, args in (("A", (dt, A.clone().requires_grad_(), x, Bm, h0, (mask, values))),
                       ("h0", (dt, A, x, Bm, h0.clone().requires_grad_(), (mask, values))),
                       ("pins", (dt, A, x, Bm, h0, (mask, values.clone().requires_grad_())))):
        assert not selective.selective_states_supported(*args), name
        with pytest.raises(ValueError, match="selective_states has no backward with pins"):
            selective.selective_states(*args)
        with torch.no_grad():  # no gradient wanted: runs
            assert selective.selective_states_supported(*args), name
            assert rel_err(selective.selective_states(*args), torch_states(*args[:5], args[5])) <= 1e-5
        if name != "pins":  # without pins a gradient is fine
            assert selective.selective_states_supported(*args[:5]), name
            assert selective.selective_states(*args[:5]).requires_grad, name
    with pytest.raises(ValueError, match=r"selective_states: Bm must have shape \(2, 5, 4\)"):
        selective.selective_states(dt, A, x, Bm[:, :, :3])
    with pytest.raises(ValueError, match="selective_states: every input must be a CPU tensor of dt's dtype"):
        selective.selective_states(dt, A, x, Bm, initial_state=h0.double())
    with pytest.raises(TypeError, match="selective_states: x must be a torch.Tensor; got list"):
        selective.selective_states(dt, A, x.tolist(), Bm)
    with pytest.raises(ValueError, match=r"pins mask must be a bool \[B, T\]=\(2, 5\) tensor"):
        selective.selective_states(dt, A, x, Bm, pins=(mask.float(), values))
    with pytest.raises(ValueError, match=r"pins values must be a \[B, T, E, N\]=\(2, 5, 3, 4\) CPU tensor"):
        selective.selective_states(dt, A, x, Bm, pins=(mask, values[..., :3]))
    with pytest.raises(ValueError, match="pins must be a"):
        selective.selective_states(dt, A, x, Bm, pins=mask)
    with pytest.raises(ValueError, match=r"selective_states: scale must be a real number in \(0, 2\].*got 3"):
        selective.selective_states(dt, A, x, Bm, scale=3)
    assert not selective.selective_states_supported(dt.double(), A, x, Bm)


def counting(calls, fn, entry):
    """fn wrapped to append entry(kwargs) to calls for each call over more than 3 steps (not the
    cache planner's dry runs, models.cache.plan, of length <= 3)."""
    def wrapped(*args, **kwargs):
        if args[0].shape[1] > 3:
            calls.append(entry(kwargs))
        return fn(*args, **kwargs)
    return wrapped


def mamba_patched_run(model, tokens):
    """logits and every hook_state (cached after the patches) with states patched in both layers."""
    def patch(step, scale):
        def fn(states, hook):
            states = states.clone()
            states[:, step] = states[:, step] * scale + 0.5
            return states
        return fn

    hooks = [("blocks.0.mixer.hook_state", patch(4, -2.0)), ("blocks.1.mixer.hook_state", patch(9, 3.0))]
    return model.run_with_cache(tokens, names=lambda n: n.endswith("hook_state"), fwd_hooks=hooks)


@needs_native
@pytest.mark.parametrize("name,scale", [("mamba", 1.0), ("negative_mamba", 2.0)])
def test_mamba_instrumented_path_under_no_grad_uses_selective_states(monkeypatch, name, scale):
    """No gradient wanted: both scans of the instrumented path (the patched re-run too) and the
    resume path run selective_states with the model's scale and agree with the unfused path
    (native states disabled); with a gradient wanted only the first scans (no pins) do."""
    import models

    torch.manual_seed(0)
    model = models.build(name, vocab_size=7, d_model=16, d_state=4, n_layers=2)
    mixer = model.blocks[0].mixer
    tokens = torch.randint(0, 7, (3, 13), generator=torch.Generator().manual_seed(1))
    u, initial = torch.randn(3, 6, 16), torch.randn(3, *mixer.state_shape)
    calls = []
    native = selective.selective_states
    monkeypatch.setattr(selective, "selective_states", counting(calls, native, lambda k: k["scale"]))
    results = []
    for supported in (True, False):
        if not supported:
            monkeypatch.setattr(selective, "selective_states_supported", lambda *args: False)
        with torch.no_grad():
            logits, cache = mamba_patched_run(model, tokens)
            resumed = mixer.instrumented_forward(u, mixer.prepare(u), initial)
        results.append([logits, cache["blocks.0.mixer.hook_state"], cache["blocks.1.mixer.hook_state"], resumed])
        assert calls == [scale] * 5  # 2 layers x (first scan + patched re-run) + the resumed scan
    for got, ref in zip(*results):
        assert rel_err(got, ref) <= 1e-5
    with torch.no_grad():  # the patch took effect: the cached state is the patched one
        _, clean = model.run_with_cache(tokens, names="blocks.0.mixer.hook_state")
    torch.testing.assert_close(results[0][1][:, 4], clean["blocks.0.mixer.hook_state"][:, 4] * -2.0 + 0.5)
    monkeypatch.undo()
    monkeypatch.setattr(selective, "selective_states", counting(calls, native, lambda k: 1))
    logits, _ = mamba_patched_run(model, tokens)  # grad mode on, parameters require grad
    assert len(calls) == 5 + 2 and logits.requires_grad  # the first scans only (the re-runs have pins)
    assert rel_err(logits, results[0][0]) <= 1e-5


def states_grads(fn, inputs, G):
    """The states and the gradients of (dt, A, x, Bm, h0 where given) for the cotangent G."""
    leaves = [None if t is None else t.clone().requires_grad_() for t in inputs]
    states = fn(*leaves)
    return states, torch.autograd.grad(states, [t for t in leaves if t is not None], G)


@needs_native
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("batch,length,inner,n,initial", STATE_SHAPES)
def test_selective_states_gradients_match_the_unfused_scan(batch, length, inner, n, initial, scale):
    """Gradients of every state (random cotangent) against a and b formed in torch + the naive
    scan, for dt, A, x, Bm and the initial state."""
    dt, A, x, Bm, _, h0 = selective_problem(batch, length, inner, n, seed=length + n + 40, initial=initial)
    G = torch.randn(batch, length, inner, n, generator=torch.Generator().manual_seed(41))
    native = lambda dt, A, x, Bm, h0: selective.selective_states(dt, A, x, Bm, h0, scale=scale)  # noqa: E731
    ref = lambda dt, A, x, Bm, h0: torch_states(dt, A, x, Bm, h0, scale=scale)  # noqa: E731
    states, grads = states_grads(native, (dt, A, x, Bm, h0), G)
    states_ref, grads_ref = states_grads(ref, (dt, A, x, Bm, h0), G)
    assert states.requires_grad and rel_err(states, states_ref) <= 1e-5
    with torch.no_grad():  # the forward is the no-grad forward bit for bit
        assert torch.equal(states, selective.selective_states(dt, A, x, Bm, h0, scale=scale))
    assert len(grads) == len(grads_ref) == (5 if initial else 4)
    for name, got, ref in zip(["dt", "A", "x", "Bm", "h0"], grads, grads_ref):
        assert got.shape == ref.shape, name
        assert rel_err(got, ref) <= 1e-5, name
    if length > 1 or initial:  # grad A is nonzero once some h_{t-1} is (else both are exactly 0)
        assert grads[1].abs().max() > 0


@needs_native
@pytest.mark.parametrize("scale", [*SCALES, 1.5])
@pytest.mark.parametrize("initial", [True, False])
@pytest.mark.parametrize("n", [4, 16])  # N = 16: the C backward's constant-N branch
def test_selective_states_gradcheck_float64(scale, initial, n):
    inputs = selective_problem(2, 5, 3, n, seed=42, dtype=torch.float64, initial=initial)
    dt, A, x, Bm, _, h0 = [None if t is None else t.clone().requires_grad_() for t in inputs]
    fn = lambda *args: selective.selective_states(*args, scale=scale)  # noqa: E731
    args = (dt, A, x, Bm) + ((h0,) if initial else ())
    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-7, rtol=1e-6)


@needs_native
def test_selective_states_gradients_only_where_asked_empty_and_once_differentiable():
    dt, A, x, Bm, _, h0 = selective_problem(2, 6, 3, 4, seed=43)
    A = A.clone().requires_grad_()
    states = selective.selective_states(dt, A, x, Bm, h0)
    (grad_A,) = torch.autograd.grad(states.square().sum(), A, create_graph=True)
    ref_A = A.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad(torch_states(dt, ref_A, x, Bm, h0).square().sum(), ref_A)
    assert rel_err(grad_A, want) <= 1e-5
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad_A.sum().backward()
    dt0, A0, x0, Bm0, _, h00 = [t.clone().requires_grad_() for t in selective_problem(2, 0, 3, 4, seed=44)]
    states = selective.selective_states(dt0, A0, x0, Bm0, h00)
    assert states.shape == (2, 0, 3, 4)
    grads = torch.autograd.grad(states.sum(), [A0, h00], allow_unused=True)
    assert all(g is None or torch.equal(g, torch.zeros_like(g)) for g in grads)


def mamba_param_grads(model, tokens, patched: bool):
    """run_with_cache of every hook_state (patched in both layers, or not) and the gradients of
    a loss on the logits and the cached states' sum with respect to every parameter."""
    model.zero_grad()
    if patched:
        logits, cache = mamba_patched_run(model, tokens)
    else:
        logits, cache = model.run_with_cache(tokens, names=lambda n: n.endswith("hook_state"))
    logits.square().mean().backward()
    return [logits.detach(), *cache.values(), *(p.grad.clone() for p in model.parameters())]


@needs_native
@pytest.mark.parametrize("name,scale", [("mamba", 1.0), ("negative_mamba", 2.0)])
def test_mamba_cached_backward_runs_selective_states_and_matches_the_unfused_path(monkeypatch, name, scale):
    """A gradient wanted: run_with_cache of hook_state + backward runs the first scans in the
    differentiable selective_states (the patched re-runs, with pins, in torch a, b + diag_scan)
    and gives the unfused path's logits, cached states and parameter gradients."""
    import models

    torch.manual_seed(3)
    model = models.build(name, vocab_size=7, d_model=16, d_state=4, n_layers=2)
    tokens = torch.randint(0, 7, (3, 13), generator=torch.Generator().manual_seed(4))
    native = selective.selective_states
    for patched in (False, True):
        calls = []
        monkeypatch.setattr(selective, "selective_states", counting(calls, native, lambda k: k["scale"]))
        got = mamba_param_grads(model, tokens, patched)
        assert calls == [scale] * 2  # the first scan of each layer
        with monkeypatch.context() as off:
            off.setattr(selective, "selective_states_supported", lambda *args: False)
            want = mamba_param_grads(model, tokens, patched)
        assert len(calls) == 2 and len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert rel_err(g, w) <= 1e-5, (patched, i)


@needs_native
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_decay_per_channel_gives_the_bits_of_the_general_loop(monkeypatch, scale, dtype):
    """A with equal columns (Mamba-2's per-head decay expanded over N) runs the shared-decay C
    loops (exp(dt A) once per channel and step): y and every gradient, grad A [E, N] included, are
    the general loop's bit for bit, for several checkpoint spacings."""
    dt, A, x, Bm, C, h0 = selective_problem(2, 19, 6, 5, seed=21, dtype=dtype)
    A = A[:, :1].expand(6, 5).contiguous()
    assert selective.shared_decay(A) and not selective.shared_decay(selective_problem(1, 1, 6, 5, seed=0)[1])
    gy = torch.randn(2, 19, 6, dtype=dtype)
    for chunk in (1, 4, 64):
        monkeypatch.setattr(selective, "selective_spacing", lambda *args, k=chunk: k)
        shared = selective_run(selective.selective_scan, (dt, A, x, Bm, C, h0), gy, scale=scale)
        monkeypatch.setattr(selective, "shared_decay", lambda A: False)
        general = selective_run(selective.selective_scan, (dt, A, x, Bm, C, h0), gy, scale=scale)
        monkeypatch.undo()
        for got, ref in zip([shared[0], *shared[1]], [general[0], *general[1]]):
            assert torch.equal(got, ref), chunk
    ref = unfused(dt, A, x, Bm, C, h0, scale=scale)
    torch.testing.assert_close(shared[0], ref, **({"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}))
