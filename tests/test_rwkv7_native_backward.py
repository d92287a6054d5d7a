"""The native RWKV-7 backward (models/kernels/native/rwkv7.py, rwkv7_body.h) against autograd
through the definition (rwkv7_scan impl="naive"): every gradient (r, w, k, v, a, b, the initial
state, the shift and the pin values, from cotangents of the output, the final state and every
exported state) in float64 to 1e-10 on several shapes (T = 1, T not a multiple of the spacing)
with checkpoint spacings from 1 (a small budget: every step recomputed from its own checkpoint)
to past T (one span); any spacing and thread count gives the same bits; gradcheck; float32 close
to float64; the forward keeps only its checkpoints for the backward; an imported fla RWKV-7
trains a step, and gives hook_state gradients and a patched state's gradient, with impl
"native" as with "naive"."""

import dataclasses
import math

import pytest
import torch

import models
from models.kernels.native import library
from models.kernels.native import rwkv7 as native
from models.kernels.rwkv7 import rwkv7_scan
from tests.test_rwkv7 import rwkv7_source, scan_inputs, tokens

pytestmark = pytest.mark.skipif(not library.available(), reason="the native CPU library did not build")


def problem(dtype, B, T, H, K, V, seed=0):
    """RWKV-7-formed inputs, an initial state, a shift, pins at two steps and the cotangents of the
    output, the final state and the exported states."""
    args, h0 = scan_inputs(dtype, B=B, L=T, H=H, K=K, V=V, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    state = (B, T, H, V, K)
    shift = 0.1 * torch.randn(state, generator=gen, dtype=dtype)
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[B - 1, T // 2] = True  # a pin in the middle; T = 1: at the only step
    if T > 3:
        mask[0, T - 2] = True
    values = torch.randn(state, generator=gen, dtype=dtype)
    cotangents = (torch.randn(B, T, H, V, generator=gen, dtype=dtype), torch.randn(B, H, V, K, generator=gen, dtype=dtype),
                  torch.randn(state, generator=gen, dtype=dtype))
    return args, h0, shift, (mask, values), cotangents


def run(impl, args, h0, shift, pins, cotangents, patched=True):
    """The outputs and the gradients of every input (None where it does not take part)."""
    leaves = [x.clone().requires_grad_() for x in (*args, h0)]
    extra = {}
    if patched:
        extra_leaves = [shift.clone().requires_grad_(), pins[1].clone().requires_grad_()]
        extra = dict(shift=extra_leaves[0], pins=(pins[0], extra_leaves[1]))
        leaves += extra_leaves
    out = rwkv7_scan(*leaves[:6], initial_state=leaves[6], output_final_state=True, export_at="all", impl=impl,
                     **extra)
    loss = sum((o * c).sum() for o, c in zip(out, cotangents))
    return [o.detach() for o in out], torch.autograd.grad(loss, leaves)


NAMES = ("r", "w", "k", "v", "a", "b", "initial_state", "shift", "pin values")
SHAPES = [(2, 11, 3, 8, 5), (1, 1, 2, 4, 3), (3, 23, 2, 6, 7), (1, 40, 1, 16, 16)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("spacing", [1, 3, None])  # 1 and 3: recomputation between checkpoints; None: the model's
@pytest.mark.parametrize("patched", [True, False])
def test_gradients_equal_autograd_through_the_definition(monkeypatch, shape, spacing, patched):
    """float64: outputs and every gradient equal autograd through impl="naive" to 1e-10, with
    pins and a shift or without, for a small and the model's checkpoint spacing."""
    if spacing is not None:
        monkeypatch.setattr(native, "rwkv7_spacing", lambda *a: spacing)
    inputs = problem(torch.float64, *shape, seed=sum(shape))
    ref_out, ref_grads = run("naive", *inputs, patched=patched)
    out, grads = run("native", *inputs, patched=patched)
    for name, got, want in zip(("output", "final", "states"), out, ref_out):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12, msg=name)
    assert len(grads) == len(ref_grads) == (9 if patched else 7)
    for name, got, want in zip(NAMES, grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10, msg=f"grad {name}")
    if patched:  # a pinned step passes nothing back: its shift and inputs get zero, its pin value G_t
        mask = inputs[3][0]
        assert torch.all(grads[7][mask] == 0) and torch.all(grads[3][mask] == 0)
        assert torch.all(grads[8][~mask] == 0) and grads[8][mask].abs().min() > 0


@pytest.mark.parametrize("spacing", [1, 2, 5, 23, 1000])
def test_any_spacing_and_thread_count_gives_the_same_bits(monkeypatch, spacing):
    """The backward recomputes the forward's states exactly and each (batch row, head) pair's
    arithmetic is the same in any split: every spacing (ragged, one span, past T) and 1 or 3
    threads give the bits of spacing 4 on one thread; the output equals the no-gradient run."""
    inputs = problem(torch.float32, 3, 23, 2, 6, 7, seed=9)
    monkeypatch.setattr(native, "rwkv7_spacing", lambda *a: 4)
    monkeypatch.setattr(native, "rwkv7_threads", lambda *a: 1)
    ref_out, ref_grads = run("native", *inputs)
    monkeypatch.setattr(native, "rwkv7_spacing", lambda *a: spacing)
    for threads in (1, 3):
        monkeypatch.setattr(native, "rwkv7_threads", lambda *a, n=threads: n)
        out, grads = run("native", *inputs)
        for got, want in zip([*out, *grads], [*ref_out, *ref_grads]):
            assert torch.equal(got, want), (spacing, threads)
    args, h0, shift, pins, _ = inputs
    plain = rwkv7_scan(*args, initial_state=h0, shift=shift, pins=pins, export_at="all", impl="native")
    assert torch.equal(plain.output, ref_out[0]) and torch.equal(plain.states_at, ref_out[2])


def test_gradcheck(monkeypatch):
    """torch.autograd.gradcheck on a tiny float64 case with pins, a shift, an initial state and
    every output, spacing 2 (T = 5: spans 2, 2, 1)."""
    monkeypatch.setattr(native, "rwkv7_spacing", lambda *a: 2)
    args, h0, shift, (mask, values), _ = problem(torch.float64, 2, 5, 2, 3, 2, seed=4)
    leaves = [x.clone().requires_grad_() for x in (*args, h0, shift, values)]

    def fn(*x):
        out = rwkv7_scan(*x[:6], initial_state=x[6], shift=x[7], pins=(mask, x[8]), output_final_state=True,
                         export_at="all", impl="native")
        return tuple(out)

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-8, rtol=1e-7)


def test_float32_is_close_to_float64():
    """float32 gradients (native) against float64 (naive) within 1e-4 of each gradient's scale,
    at a longer T where rounding accumulates; the naive float32 loop is within the same bound."""
    inputs64 = problem(torch.float64, 2, 96, 2, 16, 16, seed=2)
    _, ref = run("naive", *inputs64)
    as32 = lambda x: x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x  # noqa: E731
    inputs32 = [[as32(a) for a in inputs64[0]], *(as32(x) for x in inputs64[1:3]),
                tuple(as32(x) for x in inputs64[3]), tuple(as32(x) for x in inputs64[4])]
    for impl in ("native", "naive"):
        _, grads = run(impl, *inputs32)
        for name, got, want in zip(NAMES, grads, ref):
            assert got.dtype == torch.float32
            scale = want.abs().max()
            assert (got.double() - want).abs().max() <= 1e-4 * scale, (impl, name)


def test_the_forward_keeps_only_checkpoints(monkeypatch):
    """K = V = 64 float32 (16 KiB a head, 17 of them over SPAN_BYTES): what autograd saves from
    the forward is the inputs and B H ceil(T / k) checkpoints, k = ceil(sqrt(B H T)) on one
    thread, within library.py's bound (sqrt(B H T) + B H) states, not the B H T states the naive
    loop keeps."""
    monkeypatch.setattr(native, "rwkv7_threads", lambda *a: 1)
    B, T, H, K, V = 1, 300, 2, 64, 64
    args, h0 = scan_inputs(torch.float32, B=B, L=T, H=H, K=K, V=V, seed=1)
    leaves = [x.clone().requires_grad_() for x in args]
    saved = []

    def pack(x):
        saved.append(x.numel() * x.element_size())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = rwkv7_scan(*leaves, impl="native").output
    k = math.ceil(math.sqrt(B * H * T))
    assert native.rwkv7_spacing(B, T, H, K, V, 4, 1) == k
    state = K * V * 4
    inputs = sum(x.numel() * 4 for x in args)
    assert sum(saved) == inputs + B * H * -(-T // k) * state
    assert B * H * -(-T // k) * state <= (math.sqrt(B * H * T) + B * H) * state
    out.sum().backward()
    assert all(x.grad is not None for x in leaves)


def with_impl(model, impl):
    """A copy of model (float64) whose rwkv7 mixers run impl."""
    options = {**model.cfg.mixer_options, "rwkv7": {**model.cfg.mixer_options["rwkv7"], "impl": impl}}
    other = models.SequenceModel(dataclasses.replace(model.cfg, mixer_options=options)).double()
    other.load_state_dict(model.state_dict())
    return other


@pytest.fixture(scope="module")
def imported():
    return models.from_pretrained(rwkv7_source()).double()


@pytest.mark.parametrize("path", ["fast", "instrumented"])
def test_an_imported_model_trains_a_step_alike(imported, path):
    """The imported fla RWKV-7 (float64): one SGD step on the next-token loss gives the same
    parameter gradients (1e-10 of each one's scale) and parameters with impl "native" as with
    "naive", on the fast and the instrumented path; the native one's graph holds RWKV7Scan."""
    toks = tokens(batch=2, length=13, seed=3)
    results = {}
    for impl in ("naive", "native"):
        model = with_impl(imported, impl).set_execution_path(path)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        logits = model(toks)
        native_nodes = [node for node in graph_nodes(logits.grad_fn) if node.name() == "RWKV7ScanBackward"]
        assert len(native_nodes) == (3 if impl == "native" else 0)  # one a time mix
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), toks[:, 1:].flatten())
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        results[impl] = (loss.detach(), grads, {n: p.detach().clone() for n, p in model.named_parameters()})
    (loss_n, grads_n, params_n), (loss_c, grads_c, params_c) = results["naive"], results["native"]
    torch.testing.assert_close(loss_c, loss_n, atol=1e-12, rtol=0)
    assert grads_n.keys() == grads_c.keys() and any("r_proj" in n for n in grads_n)
    for name in grads_n:
        scale = grads_n[name].abs().max().clamp_min(1e-30)
        torch.testing.assert_close(grads_c[name] / scale, grads_n[name] / scale, atol=1e-10, rtol=0, msg=name)
    for name in params_n:
        torch.testing.assert_close(params_c[name], params_n[name], atol=1e-12, rtol=0, msg=name)


def graph_nodes(fn, seen=None):
    """Every node of the autograd graph under fn."""
    seen = set() if seen is None else seen
    stack = [fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return seen


def test_state_gradients_and_a_patched_state_alike(imported):
    """Attribution through the kernel: run_with_cache(incl_bwd=True) gives the same hook_state
    gradients d metric / d S_t (the shift probe's gradient) and a state patch with a leaf gives
    the same gradient of the patched value (the pin value's gradient) with "native" as "naive"."""
    toks = tokens(batch=2, length=11, seed=4)
    names = ["blocks.0.mixer.hook_state", "blocks.2.mixer.hook_state", "blocks.2.mixer.hook_q"]
    metric = lambda logits: logits[:, -1, :3].sum()  # noqa: E731
    caches, patch_grads = {}, {}
    for impl in ("naive", "native"):
        model = with_impl(imported, impl)
        _, caches[impl] = model.run_with_cache(toks, names, incl_bwd=True, metric=metric)
        leaf = caches[impl]["blocks.2.mixer.hook_state"][:, 5].clone().requires_grad_()

        def patch(states, hook, leaf=leaf):
            states = states.clone()
            states[:, 5] = leaf
            return states

        logits = model.run_with_hooks(toks, fwd_hooks=[("blocks.2.mixer.hook_state", patch)])
        (patch_grads[impl],) = torch.autograd.grad(metric(logits), leaf)
    for name in names:
        for key in (name, name + "_grad"):
            want = caches["naive"][key]
            torch.testing.assert_close(caches["native"][key], want, atol=1e-10 * want.abs().max(), rtol=0, msg=key)
    assert caches["native"]["blocks.0.mixer.hook_state_grad"].abs().max() > 0
    want = patch_grads["naive"]
    assert want.abs().max() > 0
    torch.testing.assert_close(patch_grads["native"], want, atol=1e-10 * want.abs().max(), rtol=0)
