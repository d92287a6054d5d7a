"""RWKV-7: the kernel against fla's own reference recurrence, and from_pretrained(fla
RWKV7ForCausalLM) against fla's model on tiny random configs (every parameter jittered): logits,
every layer's output and the input gradients <= 1e-4, hook_state against fla's cached state, a
state patch against fla decoding from the patched state, decoding against the full forward and
fla's generate, round trip, refusals.

fla's RWKV-7 layer runs Triton kernels (token shift, the six mixes, the key update, the output
correction, the scan). `torch_fla` swaps in fla's own torch references for them (the scan:
fla.ops.generalized_delta_rule.dplr.naive.dplr_recurrence, the mixes / key update / correction:
fla's *_ref / torch_* functions) so that fla's model runs in float32 on the CPU with gradients;
test_fla_triton_layer checks the swap against fla's Triton kernels under TRITON_INTERPRET=1."""

import math

import pytest
import torch

import models
from models.interop import UnsupportedConfig
from models.kernels.native import library as native_library
from models.kernels.rwkv7 import rwkv7_scan
from tests.conftest import triton_interpreter_available
from tests.fla_interpreter import single_config_autotune
from tests.interop_parity import VOCAB, assert_causal_state_patch, assert_round_trip, embedding_leaf, jitter, our_run
from tests.test_interop_fla import with_config
from tests.test_interop_lfm2 import decoded_step_by_step

fla_models = pytest.importorskip("fla.models")
T = 20
IDS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)


def reference_scan(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None,
                   **_):
    """chunk_rwkv7's math by fla's naive DPLR loop (which scales q by K^-1/2: undone here)."""
    from fla.ops.generalized_delta_rule.dplr.naive import dplr_recurrence

    assert cu_seqlens is None
    q = r * (scale * r.shape[-1] ** 0.5)
    o, final = dplr_recurrence(*(x.transpose(1, 2) for x in (q, k, v, a, b, w)), initial_state=initial_state,
                               output_final_state=True)
    return o.transpose(1, 2), final if output_final_state else None


def reference_fused(r, w, k, v, kk, a, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None):
    return reference_scan(r, w, k, v, -kk, kk * a, scale, initial_state, output_final_state, cu_seqlens)


def reference_token_shift(x, cu_seqlens=None, cache=None, output_cache=False, **_):
    """fla's token shift: x_{t-1} - x_t (the cache [B, 1, D] or [B, D]: the last token before x)."""
    assert cu_seqlens is None
    before = x.new_zeros(x.shape[0], 1, x.shape[2]) if cache is None else cache.reshape(x.shape[0], 1, -1)
    delta = torch.cat([before, x[:, :-1]], dim=1) - x
    return (delta, x[:, -1:]) if output_cache else delta


@pytest.fixture
def torch_fla(monkeypatch):
    use_torch_references(monkeypatch)


def use_torch_references(monkeypatch) -> None:
    """fla's RWKV-7 layer and channel mix on fla's torch references instead of its Triton kernels."""
    import fla.layers.rwkv7 as layer
    import fla.models.rwkv7.modeling_rwkv7 as modeling
    from fla.ops.rwkv7.fused_addcmul import torch_addcmul_rwkv7
    from fla.ops.rwkv7.fused_k_update import k_update_ref
    from fla.ops.rwkv7.gate_output_correction import gate_output_correction_ref

    for module in (layer, modeling):
        monkeypatch.setattr(module, "token_shift", reference_token_shift)
    monkeypatch.setattr(layer, "fused_addcmul_rwkv7", torch_addcmul_rwkv7)
    monkeypatch.setattr(layer, "fused_k_rwkv7", lambda k, a, ka, **_: k_update_ref(k, a, ka))
    monkeypatch.setattr(layer, "gate_output_correction", gate_output_correction_ref)
    monkeypatch.setattr(layer, "chunk_rwkv7", reference_scan)
    monkeypatch.setattr(layer, "fused_mul_recurrent_rwkv7", reference_fused)


def rwkv7_source(**overrides):
    torch.manual_seed(0)
    fields = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=3, head_dim=8, decay_low_rank_dim=4,
                  gate_low_rank_dim=6, a_low_rank_dim=4, v_low_rank_dim=5, intermediate_size=24, fuse_norm=False,
                  fuse_cross_entropy=False, tie_word_embeddings=False, **IDS)
    return jitter(fla_models.RWKV7ForCausalLM(fla_models.RWKV7Config(**{**fields, **overrides})))


def tokens(batch=2, length=T, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- the kernel


def test_kernel_equals_flas_reference_recurrence():
    """Outputs and final state of rwkv7_scan (from an initial state) against fla's dplr_recurrence
    (state [K, V]: ours transposed), float32; a pin equals a fresh scan from the pinned state."""
    gen = torch.Generator().manual_seed(0)
    B, L, H, K, V = 2, 9, 2, 4, 3
    r, k, kk_raw, a = (torch.randn(B, L, H, K, generator=gen) for _ in range(4))
    v = torch.randn(B, L, H, V, generator=gen)
    w = -0.6 * torch.rand(B, L, H, K, generator=gen)
    kk, alpha = torch.nn.functional.normalize(kk_raw, dim=-1), torch.sigmoid(a)
    h0 = torch.randn(B, H, V, K, generator=gen)
    ours = rwkv7_scan(r, w, k, v, -kk, kk * alpha, initial_state=h0, output_final_state=True, export_at="all",
                      impl="naive")
    o, final = reference_scan(r, w, k, v, -kk, kk * alpha, initial_state=h0.transpose(-1, -2), output_final_state=True)
    torch.testing.assert_close(ours.output, o, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.final_state, final.transpose(-1, -2), atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.states_at[:, -1], ours.final_state, atol=0, rtol=0)
    mask = torch.zeros(B, L, dtype=torch.bool)
    mask[1, 4] = True
    pinned = torch.randn(B, L, H, V, K, generator=gen)
    patched = rwkv7_scan(r, w, k, v, -kk, kk * alpha, export_at="all", pins=(mask, pinned), impl="naive")
    tail = rwkv7_scan(*(x[1:, 5:] for x in (r, w, k, v, -kk, kk * alpha)), initial_state=pinned[1:, 4], impl="naive")
    torch.testing.assert_close(patched.output[1:, 5:], tail.output, atol=1e-6, rtol=0)
    torch.testing.assert_close(patched.states_at[1, 4], pinned[1, 4], atol=0, rtol=0)
    assert torch.equal(patched.output[0], rwkv7_scan(r, w, k, v, -kk, kk * alpha, impl="naive").output[0])
    with pytest.raises(ValueError, match="v must be"):
        rwkv7_scan(r, w, k, v[:, :, :1, :].expand(B, L, 1, V), -kk, kk)


def scan_inputs(dtype, B=2, L=11, H=3, K=8, V=5, seed=0):
    """r, w, k, v, a, b as RWKV-7 forms them (a = -kappa, b = kappa * alpha) and an initial state."""
    gen = torch.Generator().manual_seed(seed)
    r, k, kk_raw, alpha = (torch.randn(B, L, H, K, generator=gen, dtype=dtype) for _ in range(4))
    v = torch.randn(B, L, H, V, generator=gen, dtype=dtype)
    w = -0.6 * torch.rand(B, L, H, K, generator=gen, dtype=dtype)
    kk = torch.nn.functional.normalize(kk_raw, dim=-1)
    return (r, w, k, v, -kk, kk * torch.sigmoid(alpha)), torch.randn(B, H, V, K, generator=gen, dtype=dtype)


native_built = pytest.mark.skipif(not native_library.available(), reason="the native CPU library did not build")


@native_built
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_native_kernel_equals_the_naive_loop(dtype, tol):
    """impl="native" (plain C) against the definition: outputs, final state and every state from an
    initial state, with pins and a shift; "auto" takes it wherever no gradient is wanted."""
    args, h0 = scan_inputs(dtype)
    gen = torch.Generator().manual_seed(5)
    mask = torch.zeros(2, 11, dtype=torch.bool)
    mask[1, 4] = mask[0, 9] = True
    pins = (mask, torch.randn(2, 11, 3, 5, 8, generator=gen, dtype=dtype))
    shift = 0.1 * torch.randn(2, 11, 3, 5, 8, generator=gen, dtype=dtype)
    for extra in ({}, {"pins": pins}, {"shift": shift, "pins": pins}):
        options = dict(initial_state=h0, output_final_state=True, export_at="all", **extra)
        naive, native = (rwkv7_scan(*args, **options, impl=impl) for impl in ("naive", "native"))
        for name in ("output", "final_state", "states_at"):
            torch.testing.assert_close(getattr(native, name), getattr(naive, name), atol=tol, rtol=tol,
                                       msg=f"{name} {sorted(extra)}")
        assert native.output.dtype == naive.output.dtype and native.final_state.dtype == naive.final_state.dtype
        assert torch.equal(rwkv7_scan(*args, **options).output, native.output)  # auto, no gradient: native
    plain = rwkv7_scan(*args, impl="native")
    assert plain.final_state is None and plain.states_at is None


@native_built
def test_native_runs_agree_bit_for_bit_up_to_a_pin():
    """Without a gradient every run is the one C loop: a pinned run equals the plain one before its
    pin, a zero shift changes no bit, and two halves from the first's final state equal one run."""
    args, _ = scan_inputs(torch.float32)
    plain = rwkv7_scan(*args).output
    mask = torch.zeros(2, 11, dtype=torch.bool)
    mask[1, 4] = True
    pinned = rwkv7_scan(*args, pins=(mask, torch.randn(2, 11, 3, 5, 8))).output
    assert torch.equal(pinned[0], plain[0]) and torch.equal(pinned[1, :4], plain[1, :4])
    assert not torch.equal(pinned[1, 4:], plain[1, 4:])
    assert torch.equal(rwkv7_scan(*args, shift=torch.zeros(2, 11, 3, 5, 8)).output, plain)
    first = rwkv7_scan(*(x[:, :6] for x in args), output_final_state=True)
    second = rwkv7_scan(*(x[:, 6:] for x in args), initial_state=first.final_state)
    assert torch.equal(torch.cat([first.output, second.output], dim=1), plain)
    graded = rwkv7_scan(args[0].clone().requires_grad_(), *args[1:], pins=(mask, torch.randn(2, 11, 3, 5, 8)))
    assert graded.output.requires_grad and torch.equal(graded.output[1, :4], plain[1, :4])  # the same loop


@native_built
def test_auto_under_a_gradient_is_the_native_backward():
    """With a gradient wanted "auto" on the CPU runs the native loops with their backward: gradcheck
    in float64 on a tiny shape (inputs, initial state), its outputs equal the no-gradient native
    run bit for bit and the naive loop to rounding."""
    args, h0 = scan_inputs(torch.float64, B=1, L=4, H=2, K=3, V=2, seed=3)
    leaves = [x.clone().requires_grad_() for x in (*args, h0)]
    run = lambda *x: rwkv7_scan(*x[:6], initial_state=x[6], output_final_state=True)[:2]  # noqa: E731
    assert torch.autograd.gradcheck(run, leaves)
    assert run(*leaves)[0].grad_fn.name() == "RWKV7ScanBackward"
    assert torch.equal(run(*leaves)[0], rwkv7_scan(*args, initial_state=h0, impl="native").output)
    torch.testing.assert_close(run(*leaves)[0], rwkv7_scan(*args, initial_state=h0, impl="naive").output,
                               atol=1e-13, rtol=0)


# ----------------------------------------------------------------------------- the import


@pytest.mark.triton
@pytest.mark.skipif(not triton_interpreter_available(),
                    reason="triton not importable (or no GPU and no TRITON_INTERPRET)")
@pytest.mark.parametrize("fuse_norm", [False, True])
def test_flas_triton_layers(monkeypatch, fuse_norm):
    """fla's model on its own Triton kernels (the interpreter; T < 64: its fused recurrent scan,
    with fuse_norm also its fused LayerNorm / GroupNorm / L2 norm) gives our import's logits;
    the torch references `torch_fla` swaps in give fla's logits too."""
    single_config_autotune(monkeypatch)
    source = rwkv7_source(num_hidden_layers=2, fuse_norm=fuse_norm)
    model = models.from_pretrained(source)
    assert model.cfg.mixer_options["rwkv7"]["l2_eps"] == (1e-6 if fuse_norm else None)
    toks = tokens(batch=1, length=6)
    with torch.no_grad():
        triton_logits = source(toks).logits
        torch.testing.assert_close(model(toks), triton_logits, atol=1e-4, rtol=0)
        if not fuse_norm:
            use_torch_references(monkeypatch)
            torch.testing.assert_close(source(toks).logits, triton_logits, atol=1e-5, rtol=0)


def source_run(source, toks, weights):
    """fla's logits, each time mix's residual (the input of ffn_norm) and each layer's output, and
    d(sum(logits * weights)) / d(blocks.0.hook_resid_pre) (layer 0's pre_norm output)."""
    outputs, store = [], {}
    handles = []
    for layer in source.model.layers:
        handles.append(layer.ffn_norm.register_forward_pre_hook(lambda m, args: outputs.append(args[0].detach())))
        handles.append(layer.register_forward_hook(lambda m, i, o: outputs.append(o[0].detach())))
    first = getattr(source.model.layers[0], "pre_norm", source.model.embeddings)  # without norm_first: none
    handles.append(embedding_leaf(first, store))
    try:
        logits = source(toks).logits
        (grad,) = torch.autograd.grad((logits * weights).sum(), store["e"])
    finally:
        for h in handles:
            h.remove()
    return logits.detach(), outputs, grad


@pytest.mark.parametrize("overrides", [
    {},
    dict(norm_bias=False, norm_eps=1e-3, num_hidden_layers=2),  # (fla cannot build value_dim != hidden_size)
    dict(norm_first=False, tie_word_embeddings=True),
])
def test_parity(torch_fla, overrides):
    """Logits, the residual after each time mix and each channel mix, and the gradient at layer 0's
    residual input (fla's pre_norm output; our embedding output, the fold), on our fast and
    instrumented paths."""
    source = rwkv7_source(**overrides)
    model = models.from_pretrained(source)
    assert model.cfg.mixers == ["rwkv7", "rwkv7_ffn"] * source.config.num_hidden_layers
    toks = tokens()
    weights = torch.randn(*toks.shape, VOCAB, generator=torch.Generator().manual_seed(5))
    logits, blocks, grad = source_run(source, toks, weights)
    for path in ("fast", "instrumented"):
        ours, our_blocks, our_grad = our_run(model, toks, weights, path)
        torch.testing.assert_close(ours, logits, atol=1e-4, rtol=0, msg=f"{path} logits")
        for l, (a, b) in enumerate(zip(our_blocks, blocks, strict=True)):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0, msg=f"{path} block {l}")
        scale = grad.abs().max()
        torch.testing.assert_close(our_grad / scale, grad / scale, atol=1e-4, rtol=0, msg=f"{path} gradient")


def fla_stepwise(source, toks, patches=None):
    """fla's model fed one token at a time through its own cache -> logits [B, T, V];
    patches {(layer, t): state [B, H, V, K] (ours)} replace that layer's recurrent state right
    after step t (fla's layout: the transpose)."""
    cache, logits = None, []
    with torch.no_grad():
        for s in range(toks.shape[1]):
            out = source(input_ids=toks[:, s : s + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            for (layer, step), state in (patches or {}).items():
                if step == s:
                    cache[layer]["recurrent_state"].copy_(state.transpose(-1, -2))
            logits.append(out.logits)
    return torch.cat(logits, dim=1)


def test_hook_state_is_flas_state_and_a_patch_continues_like_fla(torch_fla):
    """hook_state at the last step is fla's cached recurrent state (transposed); a patch at step t
    on layer 1's time mix (our block 2) gives fla's logits decoding from the same state after t.
    fla reads out step t before its cache is patched and ours from the patched state, and the
    token shifts carry step t's outputs on, so the patch adds u p^T per head with p orthogonal to
    r_t: the read-out at t is the same in both, every later step changes."""
    source = rwkv7_source()
    model = models.from_pretrained(source)
    toks, t, name = tokens(), 6, "blocks.2.mixer.hook_state"
    with torch.no_grad():
        out = source(toks, use_cache=True)
        clean, cache = model.run_with_cache(toks, names=[name, "blocks.2.mixer.hook_q"])
    torch.testing.assert_close(cache[name][:, -1], out.past_key_values[1]["recurrent_state"].transpose(-1, -2),
                               atol=1e-5, rtol=0)
    gen = torch.Generator().manual_seed(3)
    r = cache["blocks.2.mixer.hook_q"][:, t]  # [B, H, K]
    p = torch.randn(r.shape, generator=gen)
    p = p - (p * r).sum(-1, keepdim=True) / r.square().sum(-1, keepdim=True) * r
    state = cache[name][:, t] + torch.randn(2, 2, 8, 1, generator=gen) * p[:, :, None, :]  # [B, H, V, K]

    def patch(states, hook):
        states[:, t] = state
        return states

    with torch.no_grad():
        ours = model.run_with_hooks(toks, fwd_hooks=[(name, patch)])
    expected = fla_stepwise(source, toks, {(1, t): state})
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    assert torch.equal(ours[:, :t], clean[:, :t])
    assert (ours[:, t + 1:] - clean[:, t + 1:]).abs().amax(-1).min() > 1e-4
    assert_causal_state_patch(model, toks, "blocks.0.mixer.hook_state", 9, (2, 8, 8))
    assert_causal_state_patch(model, toks, "blocks.3.mixer.hook_state", 9, (16, 2))  # the channel mix's window


def test_decoding_equals_the_full_forward_and_flas_cached_decoding(torch_fla):
    """Each decoding step's logits equal the full forward on the generated prefix (1e-5), and the
    greedy tokens equal fla's greedy decoding through its own cache. (fla's `generate` under this
    transformers passes `cache=`, which fla's RWKV-7 forward ignores: it decodes without its cache,
    so it is no reference.)"""
    source = rwkv7_source()
    model = models.from_pretrained(source)
    prompt, new = tokens(batch=3, length=8), 12
    generated = model.generate(prompt, new, progress=False)
    with torch.no_grad():
        out = source(prompt, use_cache=True)
        cache, seq, token = out.past_key_values, prompt, out.logits[:, -1].argmax(-1)
        for _ in range(new):
            seq = torch.cat([seq, token[:, None]], dim=1)
            out = source(input_ids=token[:, None], past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1].argmax(-1)
    assert torch.equal(generated, seq)
    state = decoded_step_by_step(model, generated, 8)
    assert state.layers[0]["state"].shape == (3, 2, 8, 8) and state.layers[0]["conv"].shape == (3, 16, 1)
    assert state.layers[1]["state"].shape == (3, 16, 2)


def test_every_hook_is_reachable():
    model = models.from_pretrained(rwkv7_source())
    with torch.no_grad():
        plain = model(tokens())
        logits, cache = model.run_with_cache(tokens())
    torch.testing.assert_close(logits, plain, atol=1e-6, rtol=0)
    assert set(cache) == set(model.hook_names())
    assert cache["blocks.2.mixer.hook_w"].shape == (2, T, 2, 8)
    assert cache["blocks.3.mixer.hook_post"].shape == (2, T, 24)
    w = cache["blocks.2.mixer.hook_w"]
    assert bool((w < 0).all()) and bool((w >= -math.exp(-0.5)).all())  # the decay exp(w) in [exp(-e^-1/2), 1)


def test_analyses_run_on_the_import():
    """Interchange and ablations resumed from their sites (a later time mix resumes from block 0,
    where v_first comes from) equal whole passes; the structured Jacobians of the time mix
    (`transition`) equal autograd's."""
    from interp.analysis import dynamics
    from interp.analysis.interventions import Site, ablate, corrupt_ar, interchange, site_grid
    from tests.test_interventions import TASK, ar_batch
    from tests.test_interventions import VOCAB as TASK_VOCAB

    model = models.from_pretrained(rwkv7_source(vocab_size=TASK_VOCAB))
    assert model.resume_start(3) == 0 and model.resume_start(1) == 0 and model.resume_start(0) == 0
    clean = ar_batch(12, 4, seed=0)
    corrupt = corrupt_ar(clean, TASK, seed=1)
    sites = site_grid(model, ["blocks.{l}.hook_resid_pre", "blocks.{l}.mixer.hook_out"], ["key", "value"])
    resumed, whole = (interchange(model, clean, corrupt, sites, min_effect=0.0, resume=r) for r in (True, False))
    torch.testing.assert_close(resumed.p_patched, whole.p_patched, atol=1e-6, rtol=0)
    assert (whole.p_patched - whole.p_corrupt).abs().max() > 1e-4
    hooks = [h for h in model.hook_names() if h.endswith(("mixer.hook_out", "mixer.hook_state"))]
    sites = [Site(h, "key") for h in hooks]
    resumed, whole = (ablate(model, clean, sites, mode="zero", resume=r) for r in (True, False))
    torch.testing.assert_close(resumed.p_answer, whole.p_answer, atol=1e-6, rtol=0)
    toks = clean.tokens[:2]
    structured = dynamics.jacobians(model, toks, layer=2, method="structured")
    autograd = dynamics.jacobians(model, toks, layer=2, method="autograd", chunk_size=4)
    torch.testing.assert_close(structured.dense(), autograd.values, atol=1e-5, rtol=1e-5)


def test_round_trip_is_bit_identical(tmp_path):
    assert_round_trip(models.from_pretrained(rwkv7_source()), tmp_path / "run", tokens())


def test_from_a_checkpoint_directory(torch_fla, tmp_path):
    source = rwkv7_source()
    source.save_pretrained(tmp_path / "ckpt")
    model = models.from_pretrained(tmp_path / "ckpt")
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()), source(tokens()).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("make, message", [
    (lambda: with_config(rwkv7_source(), attn={"layers": [1], "num_heads": 2}), "attn="),
    (lambda: with_config(rwkv7_source(), hidden_act="swish"), "hidden_act='swish'"),
    (lambda: with_config(rwkv7_source(), value_dim=[16, 32, 16]), "value_dim="),
    (lambda: with_config(rwkv7_source(), tie_word_embeddings=True), "tie_word_embeddings=True"),
])
def test_config_we_cannot_represent_raises(make, message):
    with pytest.raises(UnsupportedConfig, match=message):
        models.from_pretrained(make())


def test_a_later_time_mix_needs_layer_0s_values():
    model = models.from_pretrained(rwkv7_source())
    with torch.no_grad():
        model(tokens())
        with pytest.raises(ValueError, match="reads layer 0's values v_first"):
            model.blocks[2].mixer(torch.randn(1, 5, 16))  # other positions than the last forward's


def test_selected_heads_form_their_states_only(monkeypatch):
    """run_with_cache(heads=[1]) scans head 1 alone (head_states) and gives the full cache's head 1."""
    model = models.from_pretrained(rwkv7_source())
    name = "blocks.2.mixer.hook_state"
    with torch.no_grad():
        _, full = model.run_with_cache(tokens(), names=[name])
        scanned = []
        kernel = model.blocks[2].mixer.kernel
        monkeypatch.setattr(model.blocks[2].mixer, "kernel",
                            lambda inputs, *a, **k: scanned.append((inputs["q"].shape[2], k.get("export_at")))
                            or kernel(inputs, *a, **k))
        _, kept = model.run_with_cache(tokens(), names=[name], heads=[1])
    assert scanned == [(1, "all"), (2, None)]  # head 1's states, then the output without states
    torch.testing.assert_close(kept[name], full[name][:, :, [1]], atol=1e-6, rtol=0)


def test_a_later_time_mix_needs_an_rwkv7_layer_0():
    with pytest.raises(ValueError, match="layer 0 is a Mamba, not rwkv7"):
        models.build(models.ModelConfig(mixer=["mamba", "rwkv7"], n_layers=2, d_model=16, n_heads=2))
