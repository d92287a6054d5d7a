"""The native complex-transition scans (AUSSM's rotation_scan, Mamba-3's trapezoid_scan and their
every-state variants) against the unfused path: the mixers' own transition_terms materialising
a and b in torch, then diag_scan's naive loop; and the mixers' fast / instrumented paths on them."""

from types import SimpleNamespace

import pytest
import torch

import models
from models.kernels import diag_scan
from models.kernels.native import complex as native_complex
from models.kernels.native import library
from models.mixers.aussm import AUSSM
from models.mixers.mamba3 import Mamba3
from tests.test_kernels_diag import rel_err

needs_native = pytest.mark.skipif(
    not library.available(), reason=f"native scan unavailable: {library.unavailable_reason()}"
)

# per kernel: its inputs before C (the argument order), the functions, the mixer class
KERNELS = {
    "rotation": (("dt", "omega", "x", "Bm"), native_complex.rotation_scan, native_complex.rotation_states, AUSSM),
    "trapezoid": (("dt", "A", "theta", "lam", "x", "Bm", "x_prev", "B_prev"), native_complex.trapezoid_scan,
                  native_complex.trapezoid_states, Mamba3),
}


def problem(kind, batch, length, inner, n, seed, dtype=torch.float32, initial=True):
    """Inputs as the mixers make them: dt = softplus(...) in about (0.005, 3), omega [E, N] up to
    about 4 pi, A [E, N] negative, lam in (0, 1), theta, x, Bm, C (and x_prev, B_prev, drawn
    independently) standard normal; h0 complex [B, E, N] or None. -> {name: tensor} with "C", "h0"."""
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=dtype)  # noqa: E731
    per_channel, per_state = (batch, length, inner), (batch, length, n)
    out = {"dt": torch.nn.functional.softplus(randn(*per_channel) * 1.5 - 1.5)}
    if kind == "rotation":
        out["omega"] = torch.pi * torch.arange(1, n + 1, dtype=dtype) * (1 + 0.3 * randn(inner, n))
    else:
        out["A"] = -torch.arange(1, n + 1, dtype=dtype) * torch.exp(randn(inner, 1) * 0.5)
        out["theta"] = 2 * randn(*per_state)
        out["lam"] = torch.sigmoid(randn(*per_channel))
    out.update(x=randn(*per_channel), Bm=randn(*per_state), C=randn(*per_state))
    if kind == "trapezoid":
        out.update(x_prev=randn(*per_channel), B_prev=randn(*per_state))
    cdtype = native_complex.COMPLEX_OF[dtype]
    out["h0"] = torch.complex(randn(batch, inner, n), randn(batch, inner, n)).to(cdtype) if initial else None
    return out


def torch_terms(kind, inputs):
    """a and b [B, T, E, N] from the mixer's own transition_terms (the unfused path's code)."""
    if kind == "rotation":
        mixer_inputs = {"dt": inputs["dt"], "x": inputs["x"], "B": inputs["Bm"]}
        return AUSSM.transition_terms(SimpleNamespace(omega=inputs["omega"]), mixer_inputs)
    owner = SimpleNamespace(A=lambda: inputs["A"])
    mixer_inputs = {"dt": inputs["dt"], "theta": inputs["theta"], "lam": inputs["lam"], "x": inputs["x"],
                    "B": inputs["Bm"], "x_prev": inputs["x_prev"], "B_prev": inputs["B_prev"]}
    return Mamba3.transition_terms(owner, mixer_inputs)


def unfused_y(kind, inputs):
    """The definition: a and b materialised in torch, the naive scan with the read-out, Re."""
    return diag_scan(*torch_terms(kind, inputs), inputs["C"], initial_state=inputs["h0"], impl="naive").output.real


def unfused_states(kind, inputs, pins=None):
    return diag_scan(*torch_terms(kind, inputs), initial_state=inputs["h0"], pins=pins, impl="naive").output


def fused_y(kind, inputs, chunk_size=64):
    names, scan, _, _ = KERNELS[kind]
    return scan(*(inputs[name] for name in names), inputs["C"], initial_state=inputs["h0"], chunk_size=chunk_size)


def fused_states(kind, inputs, pins=None):
    names, _, states, _ = KERNELS[kind]
    return states(*(inputs[name] for name in names), initial_state=inputs["h0"], pins=pins)


def run(fn, kind, inputs, gy, **kwargs):
    """y and {name: gradient} of every input (h0 included when given) for cotangent gy."""
    leaves = {k: None if v is None else v.clone().requires_grad_() for k, v in inputs.items()}
    y = fn(kind, leaves, **kwargs)
    names = [k for k, v in leaves.items() if v is not None]
    return y, dict(zip(names, torch.autograd.grad(y, [leaves[k] for k in names], gy)))


@needs_native
@pytest.mark.parametrize("kind", KERNELS)
@pytest.mark.parametrize("batch,length,inner,n,chunk,initial", [
    (2, 1, 3, 4, 64, True),      # one step
    (2, 1, 3, 4, 64, False),
    (3, 11, 5, 6, 4, True),      # ragged spans: T not a multiple of the checkpoint spacing
    (2, 11, 5, 6, 4, False),
    (2, 64, 4, 16, 8, True),     # T a multiple of the spacing
    (2, 150, 8, 16, 64, True),   # N = 16 over a longer sequence
])
def test_fused_scan_matches_the_unfused_path(kind, batch, length, inner, n, chunk, initial):
    inputs = problem(kind, batch, length, inner, n, seed=length + n, initial=initial)
    gy = torch.randn(batch, length, inner, generator=torch.Generator().manual_seed(2))
    y_ref, grads_ref = run(unfused_y, kind, inputs, gy)
    y, grads = run(fused_y, kind, inputs, gy, chunk_size=chunk)
    assert y.shape == (batch, length, inner) and y.dtype == torch.float32
    assert rel_err(y, y_ref) <= 1e-5
    expected = len(KERNELS[kind][0]) + 1 + initial  # the kernel's inputs, C, h0
    assert list(grads) == list(grads_ref) and len(grads) == expected
    for name, ref in grads_ref.items():
        assert grads[name].shape == ref.shape and grads[name].dtype == ref.dtype, name
        assert rel_err(grads[name], ref) <= 1e-5, name
    with torch.no_grad():  # the forward without checkpoints: the same y
        assert torch.equal(fused_y(kind, inputs, chunk_size=chunk), y)


@needs_native
@pytest.mark.parametrize("kind", KERNELS)
def test_fused_scan_gradcheck_float64(kind):
    inputs = problem(kind, 2, 7, 3, 4, seed=4, dtype=torch.float64)
    names = list(inputs)
    leaves = [inputs[k].clone().requires_grad_() for k in names]

    def fn(*args):  # spans 3, 3, 1
        return fused_y(kind, dict(zip(names, args)), chunk_size=3)

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7, rtol=1e-6)
    torch.testing.assert_close(fn(*leaves), unfused_y(kind, dict(zip(names, leaves))), rtol=1e-12, atol=1e-12)


@needs_native
@pytest.mark.parametrize("kind", KERNELS)
def test_checkpoint_spacing_changes_no_bits(kind):
    """The backward recomputes the forward's states exactly, so the spacing changes no bits."""
    inputs = problem(kind, 2, 21, 4, 5, seed=6)
    gy = torch.randn(2, 21, 4)
    y2, grads2 = run(fused_y, kind, inputs, gy, chunk_size=2)
    y64, grads64 = run(fused_y, kind, inputs, gy, chunk_size=64)
    assert torch.equal(y2, y64)
    for name in grads2:
        assert torch.equal(grads2[name], grads64[name]), name


@needs_native
@pytest.mark.parametrize("kind", KERNELS)
def test_angles_beyond_the_polynomial_range_and_nan(kind):
    """Angles |dt omega| (|dt theta|) past 8192 are recomputed with libm: still the torch values;
    a NaN angle gives NaN states from that step on."""
    inputs = problem(kind, 2, 6, 3, 4, seed=30)
    key = "omega" if kind == "rotation" else "theta"
    inputs[key] = inputs[key] * 1e4  # angles up to about 1e5
    gy = torch.randn(2, 6, 3)
    y_ref, grads_ref = run(unfused_y, kind, inputs, gy)
    y, grads = run(fused_y, kind, inputs, gy)
    assert rel_err(y, y_ref) <= 1e-5
    for name in ("x", "Bm", "C", "h0"):  # the angles' own gradients scale with 1e4 dt: looser by nature
        assert rel_err(grads[name], grads_ref[name]) <= 1e-5, name
    with torch.no_grad():
        assert rel_err(fused_states(kind, inputs), unfused_states(kind, inputs)) <= 1e-5
        inputs["dt"][0, 3, 1] = float("nan")
        states = fused_states(kind, inputs)
    assert states[0, 3:, 1].isnan().all() and not states[0, :3].isnan().any() and not states[1].isnan().any()


@needs_native
def test_sincos_f32_is_within_an_ulp_or_so_of_one():
    """The float32 sin and cos of the fused scans (polynomials, vectorised) against float64:
    absolute error at most 1.5 2^-24 (an ulp and a half of 1: a unit-modulus transition's scale)
    for |x| <= 8192, and at most 1.5 ulp of the value for |x| <= pi."""
    x = torch.cat([torch.linspace(-8192, 8192, 1_000_001), torch.linspace(-4, 4, 200_001)])
    sin, cos = native_complex.sincos_f32(x)
    for got, exact in ((sin, torch.sin(x.double())), (cos, torch.cos(x.double()))):
        err = (got.double() - exact).abs()
        assert err.max() <= 1.5 * 2.0 ** -24
        rounded = exact.float().abs()
        ulp = (torch.nextafter(rounded, torch.tensor(float("inf"))) - rounded).double()
        small = x.abs() <= torch.pi
        assert (err / ulp)[small].max() <= 1.5


@needs_native
@pytest.mark.parametrize("kind", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("initial", [True, False])
def test_fused_states_with_pins_match_the_unfused_scan(kind, dtype, initial):
    """Every state in hook_state's layout (complex [B, T, E, N]); pins at the first and last steps,
    at one step in several rows and at different steps per row."""
    batch, length, inner, n = 4, 17, 5, 6
    inputs = problem(kind, batch, length, inner, n, seed=21, dtype=dtype, initial=initial)
    cdtype = native_complex.COMPLEX_OF[dtype]
    gen = torch.Generator().manual_seed(22)
    mask = torch.zeros(batch, length, dtype=torch.bool)
    for row, steps in enumerate([[0, 16], [5, 6], [5, 12], []]):
        mask[row, steps] = True
    values = torch.complex(*(torch.randn(batch, length, inner, n, generator=gen, dtype=dtype) for _ in "ri")).to(cdtype)
    got = fused_states(kind, inputs, (mask, values))
    assert got.shape == (batch, length, inner, n) and got.dtype == cdtype and got.is_contiguous()
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert rel_err(got, unfused_states(kind, inputs, (mask, values))) <= tol
    assert torch.equal(got[mask], values[mask])  # pinned states are the pin values exactly
    unpinned = fused_states(kind, inputs)
    assert rel_err(unpinned, unfused_states(kind, inputs)) <= tol
    assert torch.equal(got[3], unpinned[3])  # a row without pins is untouched by the others' pins
    assert torch.equal(got[1, :5], unpinned[1, :5])  # steps before a row's first pin keep their bits
    assert (got[1, 7:] - unpinned[1, 7:]).abs().max() > 1e-3  # and the pin propagates after it
    y = fused_y(kind, inputs)  # the states are the ones the scan reads out
    assert rel_err((unpinned.real * inputs["C"][:, :, None, :]).sum(-1), y) <= tol


@needs_native
@pytest.mark.parametrize("kind", KERNELS)
def test_empty_sequence_and_non_contiguous_inputs(kind):
    inputs = problem(kind, 2, 0, 3, 4, seed=9)
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    y = fused_y(kind, leaves)
    assert y.shape == (2, 0, 3)
    grads = torch.autograd.grad(y.sum(), list(leaves.values()))
    assert all(g.shape == t.shape and not g.abs().sum() for g, t in zip(grads, leaves.values()))
    assert fused_states(kind, inputs).shape == (2, 0, 3, 4)
    inputs = problem(kind, 3, 8, 5, 4, seed=27)
    strided = {k: v.transpose(0, 1).contiguous().transpose(0, 1) for k, v in inputs.items()}
    assert not strided["x"].is_contiguous()
    assert torch.equal(fused_y(kind, strided), fused_y(kind, inputs))
    assert torch.equal(fused_states(kind, strided), fused_states(kind, inputs))


@needs_native
@pytest.mark.parametrize("kind", KERNELS)
def test_bad_inputs_raise_and_states_refuse_gradients_with_pins(kind):
    names, scan, states, _ = KERNELS[kind]
    inputs = problem(kind, 2, 5, 3, 4, seed=8)
    args = [inputs[k] for k in names]
    C, h0, fn = inputs["C"], inputs["h0"], f"{kind}_scan"
    with pytest.raises(ValueError, match=rf"{fn}: Bm must have shape \(2, 5, 4\)"):
        scan(*[a[..., :3] if k == "Bm" else a for k, a in zip(names, args)], C)
    with pytest.raises(ValueError, match=rf"{fn}: initial_state must have shape \(2, 3, 4\)"):
        scan(*args, C, initial_state=h0[:1])
    with pytest.raises(ValueError, match=rf"{fn}: every input must be a CPU tensor.*initial_state is torch.float32"):
        scan(*args, C, initial_state=h0.real.contiguous())
    with pytest.raises(ValueError, match=rf"{fn}: every input must be a CPU tensor of dt's dtype.*C is torch.float64"):
        scan(*args, C.double())
    with pytest.raises(ValueError, match=rf"{fn} supports"):
        scan(*(a.bfloat16() for a in args), C.bfloat16())
    with pytest.raises(ValueError, match=rf"{fn}: dt must be \[B, T, E\]"):
        scan(args[0][0], *args[1:], C)
    with pytest.raises(TypeError, match=rf"{fn}: x must be a torch.Tensor; got list"):
        scan(*[a.tolist() if k == "x" else a for k, a in zip(names, args)], C)
    with pytest.raises(ValueError, match=rf"{fn}: chunk_size must be a positive int; got 0"):
        scan(*args, C, chunk_size=0)
    assert native_complex.complex_supported(*args, C, initial_state=h0)
    assert not native_complex.complex_supported(*args, C, initial_state=h0.real)
    assert not native_complex.complex_supported(*args, C.double())
    mask = torch.zeros(2, 5, dtype=torch.bool)
    values = torch.zeros(2, 5, 3, 4, dtype=torch.complex64)
    with pytest.raises(ValueError, match=rf"{kind}_states: pins values must be a \[B, T, E, N\]"):
        states(*args, pins=(mask, values.real))
    assert not native_complex.complex_states_supported(*args, pins=(mask, values.real))
    leaf = args[1].clone().requires_grad_()
    assert not native_complex.complex_states_supported(args[0], leaf, *args[2:], pins=(mask, values))
    with pytest.raises(ValueError, match=rf"{kind}_states has no backward with pins"):
        states(args[0], leaf, *args[2:], pins=(mask, values))
    assert native_complex.complex_states_supported(args[0], leaf, *args[2:])  # without pins: differentiable
    assert states(args[0], leaf, *args[2:]).requires_grad
    with torch.no_grad():
        assert native_complex.complex_states_supported(args[0], leaf, *args[2:], pins=(mask, values))
        assert torch.equal(states(args[0], leaf, *args[2:]), states(*args))


def states_run(fn, kind, inputs, G):
    """States and {name: gradient} of every input but C (h0 included when given) for the complex
    cotangent G [B, T, E, N]."""
    inputs = {k: v for k, v in inputs.items() if k != "C"}
    return run(fn, kind, inputs, G)


@needs_native
@pytest.mark.parametrize("kind", KERNELS)
@pytest.mark.parametrize("batch,length,inner,n,initial", [
    (2, 1, 3, 4, True),      # one step
    (2, 1, 3, 4, False),
    (3, 11, 5, 6, True),
    (2, 11, 5, 6, False),
    (2, 40, 8, 16, True),    # N = 16
])
def test_fused_states_gradients_match_the_unfused_scan(kind, batch, length, inner, n, initial):
    """Every input's gradient of every state (random complex cotangent) against the mixer's
    transition_terms + naive diag_scan; the forward under grad is the no-grad one bit for bit."""
    inputs = problem(kind, batch, length, inner, n, seed=length + n + 30, initial=initial)
    G = torch.randn(batch, length, inner, n, dtype=torch.complex64, generator=torch.Generator().manual_seed(31))
    states, grads = states_run(fused_states, kind, inputs, G)
    ref, ref_grads = states_run(unfused_states, kind, inputs, G)
    assert states.requires_grad and states.dtype == torch.complex64 and rel_err(states, ref) <= 1e-5
    with torch.no_grad():
        assert torch.equal(states, fused_states(kind, inputs))
    assert grads.keys() == ref_grads.keys() and ("h0" in grads) == initial
    for name, got in grads.items():
        assert got.shape == ref_grads[name].shape and got.dtype == ref_grads[name].dtype, name
        assert rel_err(got, ref_grads[name]) <= 1e-5, name


@needs_native
@pytest.mark.parametrize("kind", KERNELS)
@pytest.mark.parametrize("initial", [True, False])
def test_fused_states_gradcheck_float64(kind, initial):
    names = KERNELS[kind][0]
    inputs = problem(kind, 2, 4, 3, 4, seed=32, dtype=torch.float64, initial=initial)
    keys = [*names, "h0"] if initial else list(names)
    leaves = [inputs[k].clone().requires_grad_() for k in keys]

    def fn(*args):
        return fused_states(kind, {**inputs, **dict(zip(keys, args))})

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7, rtol=1e-6)


# ----------------------------------------------------------------------------- the mixers


def small(name, n_layers=2):
    torch.manual_seed(0)
    return models.build(name, vocab_size=7, d_model=16, d_state=4, n_layers=n_layers)


def count_calls(monkeypatch, name):
    """Wrap native_complex.<name> to record each call over more than 3 steps (not the cache
    planner's dry runs, models.cache.plan, of length <= 3); -> the list of calls."""
    calls = []
    fn = getattr(native_complex, name)

    def wrapped(*args, **kwargs):
        if args[0].shape[1] > 3:
            calls.append(1)
        return fn(*args, **kwargs)

    monkeypatch.setattr(native_complex, name, wrapped)
    return calls


MODELS = [("aussm", "rotation"), ("mamba3", "trapezoid")]


@needs_native
@pytest.mark.parametrize("name,kind", MODELS)
def test_fast_path_runs_the_fused_scan_and_matches_instrumented(monkeypatch, name, kind):
    scans, states = count_calls(monkeypatch, f"{kind}_scan"), count_calls(monkeypatch, f"{kind}_states")
    model = small(name)
    tokens = torch.randint(0, 7, (3, 13), generator=torch.Generator().manual_seed(1))
    results = []
    for path in ("fast", "instrumented"):
        out = model.set_execution_path(path)(tokens)
        results.append([out, *torch.autograd.grad(out.square().sum(), list(model.parameters()))])
    assert len(scans) == 2 and len(states) == 2  # one per layer on each path (every state, with its backward)
    for got, ref in zip(*results):  # every parameter's gradient, omega / A_log / rot_proj / lam_proj included
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


@needs_native
@pytest.mark.parametrize("name,kind", MODELS)
def test_no_grad_instrumented_runs_the_fused_states(monkeypatch, name, kind):
    """Without gradients the instrumented path takes hook_state from the every-state kernel:
    complex64 [B, T, E, N] as the unfused path's, and a state patch propagates as there."""
    model = small(name).set_execution_path("instrumented")
    tokens = torch.randint(0, 7, (2, 11), generator=torch.Generator().manual_seed(3))

    def patch(states, hook):
        states = states.clone()
        states[:, 4] = states[:, 4] * 0.5 + 0.25j
        return states

    def forward():  # logits and every activation, after patching hook_state in both layers
        hooks = [(f"blocks.{i}.mixer.hook_state", patch) for i in range(2)]
        with torch.no_grad():
            return model.run_with_cache(tokens, fwd_hooks=hooks)

    calls = count_calls(monkeypatch, f"{kind}_states")
    fused_out, fused_cache = forward()
    assert calls  # the fused kernel ran
    monkeypatch.setattr(native_complex, "complex_states_supported", lambda *a, **k: False)
    ref_out, ref_cache = forward()
    with torch.no_grad():
        assert (model(tokens) - ref_out).abs().max() > 1e-4  # the patch changed the output
    assert rel_err(fused_out, ref_out) <= 1e-5
    assert sum(key.endswith("hook_state") for key in ref_cache) == 2
    for key, ref in ref_cache.items():
        if key.endswith("hook_state"):
            assert fused_cache[key].dtype == ref.dtype == torch.complex64 and fused_cache[key].shape == ref.shape
        assert rel_err(fused_cache[key], ref) <= 1e-5, key


@needs_native
@pytest.mark.parametrize("name,kind", MODELS)
def test_fast_from_an_initial_state_fused_equals_unfused(monkeypatch, name, kind):
    """fast_from with a carried complex state (the resume path; Mamba-3's x_prev / B_prev come from
    the prepared inputs): the fused scan against the unfused one, with gradients."""
    mixer = small(name, n_layers=1).blocks[0].mixer
    u = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(5))
    inputs = mixer.prepare(u)
    inputs = {k: v[:, 3:] for k, v in inputs.items()}  # a later start: x_prev / B_prev nonzero at its first step
    initial = torch.randn(2, *mixer.state_shape, dtype=torch.complex64, requires_grad=True)
    calls = count_calls(monkeypatch, f"{kind}_scan")
    params = list(mixer.parameters())
    results = []
    for supported in (True, False):
        if not supported:
            monkeypatch.setattr(native_complex, "complex_supported", lambda *a, **k: False)
        out = mixer.fast_from(u[:, 3:], inputs, initial)
        results.append([out, *torch.autograd.grad(out.square().sum(), [initial, *params], retain_graph=True)])
    assert len(calls) == 1
    for got, ref in zip(*results):
        assert rel_err(got, ref) <= 1e-5


@needs_native
@pytest.mark.parametrize("name,kind", MODELS)
def test_cached_backward_runs_the_fused_states_and_matches_unfused(monkeypatch, name, kind):
    """A gradient wanted: run_with_cache of hook_state + backward runs each layer's first scan in
    the differentiable <kind>_states (a patched re-run, with pins, in diag_scan) and gives the
    unfused path's logits, cached states and parameter gradients, patched or not."""
    model = small(name)
    tokens = torch.randint(0, 7, (3, 13), generator=torch.Generator().manual_seed(6))

    def patch(states, hook):
        states = states.clone()
        states[:, 4] = states[:, 4] * 0.5 + 0.25j
        return states

    def forward(patched):
        model.zero_grad()
        hooks = [(f"blocks.{i}.mixer.hook_state", patch) for i in range(2)] if patched else []
        logits, cache = model.run_with_cache(tokens, names=lambda n: n.endswith("hook_state"), fwd_hooks=hooks)
        logits.square().mean().backward()
        return [logits.detach(), *cache.values(), *(p.grad.clone() for p in model.parameters())]

    for patched in (False, True):
        calls = count_calls(monkeypatch, f"{kind}_states")
        got = forward(patched)
        assert len(calls) == 2  # the first scan of each layer
        with monkeypatch.context() as off:
            off.setattr(native_complex, "complex_states_supported", lambda *a, **k: False)
            want = forward(patched)
        assert len(calls) == 2 and len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert rel_err(g, w) <= 1e-5, (patched, i)
        monkeypatch.undo()
