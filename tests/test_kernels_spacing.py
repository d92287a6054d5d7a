"""The checkpointed backwards' memory model (models/kernels/native/library.py): span_spacing
grows like sqrt(B T) for states too large for the cache-sized span, keeps that span for small
states, keeps the checkpoints under (sqrt(B T w threads) + B) states and their sum with the span
buffers near the minimum over all spacings; the kernels keep exactly those checkpoints, and any
spacing gives the same bits."""

import math

import pytest
import torch

from models.kernels import diag_scan
from models.kernels.native import complex as native_complex
from models.kernels.native import diag as native_diag
from models.kernels.native import library, selective
from models.kernels.native.library import SPAN_BYTES, span_spacing
from tests.test_kernels_native_complex import problem as complex_problem
from tests.test_kernels_native_selective import selective_problem

needs_native = pytest.mark.skipif(
    not library.available(), reason=f"native kernels unavailable: {library.unavailable_reason()}"
)

MAMBA2_STATE = 1536 * 128 * 4  # Mamba-2 130M's one-group state, float32 (768 KiB)
MAMBA_STATE = 1536 * 16 * 4    # Mamba-130m's (96 KiB)


def checkpoint_bytes(k, batch, length, step):
    return batch * -(-length // k) * step


def total_bytes(k, batch, length, step, factor, threads):
    """Checkpoints plus the span buffers (the model the spacing minimises)."""
    return checkpoint_bytes(k, batch, length, step) + threads * factor * k * step


def bound(batch, length, step, factor, threads):
    return (math.sqrt(batch * length * factor * threads) + batch) * step


@pytest.mark.parametrize("step", [MAMBA2_STATE, MAMBA_STATE, SPAN_BYTES])
@pytest.mark.parametrize("batch", [1, 8])
def test_spacing_grows_like_sqrt_of_the_length_for_large_states(step, batch):
    """Quadrupling T doubles the spacing (up to the ceiling), so the checkpoints grow like sqrt(T)
    too; the old cache-only rule gave spacing 1 here (every state kept)."""
    lengths = [256, 1024, 4096, 16384]
    spacing = [span_spacing(64, step, 2, batch, t) for t in lengths]
    assert SPAN_BYTES // (2 * step) <= 1  # the cache-sized span would be a single step
    for t, k in zip(lengths, spacing):
        assert k == math.ceil(math.sqrt(batch * t / 2))
    for k, k4 in zip(spacing, spacing[1:]):
        assert 2 * k - 1 <= k4 <= 2 * k
    counts = [-(-t // k) for t, k in zip(lengths, spacing)]  # checkpoints a row
    for t, count in zip(lengths, counts):
        assert count <= math.sqrt(2 * t / batch) + 1


@pytest.mark.parametrize("batch,length,step,factor,threads", [
    (1, 512, MAMBA2_STATE, 2, 1), (1, 2048, MAMBA2_STATE, 2, 1), (1, 2048, MAMBA_STATE, 2, 1),
    (4, 777, 3 << 20, 3, 2), (16, 100, MAMBA2_STATE, 2, 4), (1, 1, MAMBA2_STATE, 2, 1), (3, 5, 1 << 22, 2, 1),
])
def test_checkpoints_stay_under_the_bound_and_the_total_near_its_minimum(batch, length, step, factor, threads):
    """Checkpoint bytes <= (sqrt(B T w threads) + B) S; checkpoints plus span buffers within 1.1x
    of the best spacing in [1, T] (and far below keeping every state once T is long)."""
    k = span_spacing(64, step, factor, batch, length, threads)
    assert 1 <= k <= length
    assert checkpoint_bytes(k, batch, length, step) <= bound(batch, length, step, factor, threads)
    best = min(total_bytes(j, batch, length, step, factor, threads) for j in range(1, length + 1))
    assert total_bytes(k, batch, length, step, factor, threads) <= 1.1 * best + threads * factor * step


@pytest.mark.parametrize("step", [4 * 5 * 8, 1024, 16 << 10, 64 << 10])
def test_small_states_keep_the_cache_sized_span(step):
    """Where chunk steps of the span fit SPAN_BYTES, the spacing is the old one,
    min(chunk, SPAN_BYTES // (w S)), unless sqrt(B T / w) is larger still."""
    for chunk in (2, 64):
        cache = max(1, min(chunk, SPAN_BYTES // (2 * step)))
        assert span_spacing(chunk, step, 2, 2, 512) == max(cache, 23)  # ceil(sqrt(512))
        assert span_spacing(chunk, step, 2, 1, 8) == max(cache, 2)
    assert span_spacing(64, step, 2, 1, 0) == min(64, SPAN_BYTES // (2 * step))  # T = 0: no checkpoints anyway


def test_span_spacing_rejects_bad_arguments():
    for kwargs in ({"chunk": 0}, {"step_bytes": 0}, {"span_factor": 1.5}, {"batch": -1}, {"length": True},
                   {"threads": 0}):
        args = {"chunk": 64, "step_bytes": 8, "span_factor": 2, "batch": 1, "length": 4, "threads": 1, **kwargs}
        name = next(iter(kwargs))
        with pytest.raises(ValueError, match=name):
            span_spacing(**args)


def capture(monkeypatch, module, name):
    """Wrap module.name (a forward returning its checkpoints) to record the checkpoints it keeps."""
    kept, inner = [], getattr(module, name)

    def wrapped(*args, **kwargs):
        out = inner(*args, **kwargs)
        kept.append(out[-1] if name == "forward" else out[1])
        return out

    monkeypatch.setattr(module, name, wrapped)
    return kept


@needs_native
def test_selective_scan_keeps_sqrt_checkpoints_for_a_large_state(monkeypatch):
    """E N = 256 x 128 float32 (128 KiB, over the cache-sized span of 2 states): the forward keeps
    ceil(T / k) checkpoints a row with k = ceil(sqrt(B T / 2)), under the bound, not T."""
    kept = capture(monkeypatch, selective, "selective_forward")
    batch, length = 2, 50
    dt, A, x, Bm, C, h0 = (t.requires_grad_() for t in selective_problem(batch, length, 256, 128, seed=1))
    selective.selective_scan(dt, A, x, Bm, C, h0).sum().backward()
    step = A.numel() * A.element_size()
    (ckpt,) = kept
    assert tuple(ckpt.shape) == (batch, -(-length // 8), 128, 256)  # k = ceil(sqrt(50)) = 8
    assert ckpt.numel() * ckpt.element_size() <= bound(batch, length, step, 2, 1)


@needs_native
def test_complex_scan_keeps_sqrt_checkpoints_for_a_large_state(monkeypatch):
    kept = capture(monkeypatch, native_complex, "complex_forward")
    batch, length = 2, 50
    inputs = {k: None if v is None else v.requires_grad_() for k, v in
              complex_problem("rotation", batch, length, 128, 128, seed=2).items()}
    native_complex.rotation_scan(inputs["dt"], inputs["omega"], inputs["x"], inputs["Bm"], inputs["C"],
                                 initial_state=inputs["h0"]).sum().backward()
    (ckpt,) = kept
    assert tuple(ckpt.shape) == (batch, -(-length // 8), 2, 128, 128)
    assert ckpt.numel() * ckpt.element_size() <= bound(batch, length, 2 * 128 * 128 * 4, 2, 1)


@needs_native
def test_diag_scan_keeps_sqrt_checkpoints_for_a_large_state(monkeypatch):
    kept = capture(monkeypatch, native_diag, "forward")
    batch, length, state = 2, 40, (128, 256)
    gen = torch.Generator().manual_seed(3)
    a = torch.rand(batch, length, *state, generator=gen).requires_grad_()
    b = torch.randn(batch, length, *state, generator=gen).requires_grad_()
    c = torch.randn(batch, length, state[-1], generator=gen)
    diag_scan(a, b, c, impl="native").output.sum().backward()
    threads = native_diag._threads(None, a)
    k = math.ceil(math.sqrt(batch * length / (2 * threads)))
    (ckpt,) = kept
    assert tuple(ckpt.shape) == (batch, -(-length // k), *state)
    assert ckpt.numel() * ckpt.element_size() <= bound(batch, length, 128 * 256 * 4, 2, threads)


def grads_at(monkeypatch, module, name, k, fn, leaves):
    """fn()'s output and the gradients of leaves with module.name (the spacing) returning k."""
    monkeypatch.setattr(module, name, lambda *args, **kwargs: k)
    out = fn()
    return [out, *torch.autograd.grad(out, leaves, torch.ones_like(out))]


@needs_native
@pytest.mark.parametrize("k", [1, 3, 7, 23, 64])
def test_any_spacing_gives_the_same_bits(monkeypatch, k):
    """The backwards recompute the forward's states exactly: every spacing (1, ragged, one span,
    past T) gives the bits of spacing 5, for the selective, complex and diagonal kernels."""
    dt, A, x, Bm, C, h0 = (t.requires_grad_() for t in selective_problem(2, 23, 6, 5, seed=4))
    sel = lambda: selective.selective_scan(dt, A, x, Bm, C, h0, scale=2.0)  # noqa: E731
    cx = {key: None if v is None else v.requires_grad_() for key, v in complex_problem("trapezoid", 2, 23, 6, 5, 5).items()}
    names = ("dt", "A", "theta", "lam", "x", "Bm", "x_prev", "B_prev")
    trap = lambda: native_complex.trapezoid_scan(*(cx[n] for n in names), cx["C"], initial_state=cx["h0"])  # noqa: E731
    gen = torch.Generator().manual_seed(6)
    a, b, c, d0 = (torch.randn(*shape, generator=gen).requires_grad_() for shape in
                   ((2, 23, 3, 5), (2, 23, 3, 5), (2, 23, 5), (2, 3, 5)))
    diag = lambda: diag_scan(a * 0.9, b, c, initial_state=d0, impl="native").output  # noqa: E731
    cases = [(selective, "selective_spacing", sel, [dt, A, x, Bm, C, h0]),
             (native_complex, "complex_spacing", trap, [cx[n] for n in names] + [cx["C"], cx["h0"]]),
             (native_diag, "checkpoint_spacing", diag, [a, b, c, d0])]
    for module, name, fn, leaves in cases:
        ref = grads_at(monkeypatch, module, name, 5, fn, leaves)
        got = grads_at(monkeypatch, module, name, k, fn, leaves)
        for g, r in zip(got, ref):
            assert torch.equal(g, r), (name, k)
