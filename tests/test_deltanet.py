"""DeltaNet mixer: transition eigenvalues for beta scale 1 and 2, per-head beta clamps, affine form."""

import pytest
import torch

import models
from tests.conftest import triton_interpreter_available

VOCAB, B, T = 11, 3, 16


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def small(beta_scale, bias=(0.0, 0.0), **overrides):
    """A 1-layer, 2-head DeltaNet whose beta projection bias is set per head."""
    torch.manual_seed(0)
    config = dict(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=1, beta_scale=beta_scale)
    model = models.build("deltanet", **{**config, **overrides})
    with torch.no_grad():
        model.blocks[0].mixer.beta_proj.bias.copy_(torch.tensor(bias))
    return model


def transition_eigenvalues(model, toks) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues of I - beta_t k_t k_t^T from the cached activations: [B, T, H, d], and beta."""
    names = ["blocks.0.mixer.hook_k", "blocks.0.mixer.hook_beta"]
    _, cache = model.run_with_cache(toks, names=names)
    k, beta = cache[names[0]], cache[names[1]]
    eye = torch.eye(k.shape[-1])
    A = eye - beta[..., None, None] * k[..., :, None] * k[..., None, :]
    return torch.linalg.eigvalsh(A), beta


def test_beta_scale_2_reaches_negative_eigenvalues():
    model = small(2.0, bias=(3.0, 3.0))  # sigmoid near 1: beta near 2 for most tokens
    eig, beta = transition_eigenvalues(model, tokens())
    assert float(beta.max()) > 1.0 and float(beta.max()) <= 2.0
    assert float(eig.min()) < -0.5  # 1 - beta < 0: a reflection-like step
    assert float(eig.max()) <= 1.0 + 1e-5
    # the spectrum is {1 (d-1 times), 1 - beta}: the smallest eigenvalue is 1 - beta
    torch.testing.assert_close(eig[..., 0], 1 - beta, atol=1e-5, rtol=0)


@pytest.mark.parametrize("bias", [(3.0, -3.0), (0.0, 0.0)])
def test_beta_scale_1_keeps_eigenvalues_in_unit_interval(bias):
    model = small(1.0, bias=bias)
    eig, beta = transition_eigenvalues(model, tokens())
    assert float(beta.min()) >= 0.0 and float(beta.max()) <= 1.0
    assert float(eig.min()) >= -1e-6 and float(eig.max()) <= 1.0 + 1e-6


@pytest.mark.parametrize("path", ["fast", "instrumented"])
def test_clamping_a_head_with_beta_at_most_1_changes_nothing(path):
    model = small([1.0, 2.0], bias=(0.0, 3.0)).set_execution_path(path)
    _, beta = transition_eigenvalues(model, tokens())
    assert float(beta[..., 0].max()) <= 1.0 and float(beta[..., 1].max()) > 1.0
    mixer = model.blocks[0].mixer
    with torch.no_grad():
        clean = model(tokens())
        mixer.clamp_beta(0, 0.0, 1.0)
        clamped_0 = model(tokens())
        mixer.clear_beta_clamp()
        mixer.clamp_beta(1, 0.0, 1.0)
        clamped_1 = model(tokens())
        mixer.clear_beta_clamp()
        again = model(tokens())
    assert torch.equal(clamped_0, clean)
    assert (clamped_1 - clean).abs().max() > 1e-3
    assert torch.equal(again, clean)


def test_clamp_equals_clamping_the_beta_hook():
    """The kernel clamp is the same ablation as replacing hook_beta by its clamped value."""
    model = small([1.0, 2.0], bias=(0.0, 3.0))
    mixer = model.blocks[0].mixer

    def clamp_head_1(beta, hook):
        beta = beta.clone()
        beta[..., 1] = beta[..., 1].clamp(0.0, 1.0)
        return beta

    with torch.no_grad():
        by_hook = model.run_with_hooks(tokens(), fwd_hooks=[("blocks.0.mixer.hook_beta", clamp_head_1)])
        mixer.clamp_beta(1, 0.0, 1.0)
        by_clamp = model(tokens())
        with models.instrumented():
            by_clamp_instrumented = model(tokens())
    torch.testing.assert_close(by_clamp, by_hook, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(by_clamp_instrumented, by_hook, atol=1e-5, rtol=1e-5)


def test_step_and_transition_are_the_affine_recurrence():
    model = small(2.0, bias=(1.0, 2.0))
    mixer = model.blocks[0].mixer
    mixer.clamp_beta(1, 0.0, 1.5)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        inputs = mixer.prepare(x)
        states = mixer.scan(inputs)[1]  # [B, T, H, d, d]
    t = 3
    inputs_t = {name: value[:, t] for name, value in inputs.items()}
    h = states[:, t - 1]
    with torch.no_grad():
        stepped = mixer.step(inputs_t, h)
        offset = mixer.step(inputs_t, torch.zeros_like(h))
        M = mixer.transition(inputs_t)  # [B, n, n]
    torch.testing.assert_close(stepped, states[:, t], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close((M @ h.flatten(1)[..., None])[..., 0] + offset.flatten(1), stepped.flatten(1),
                               atol=1e-5, rtol=1e-5)
    jac = torch.autograd.functional.jacobian(lambda s: mixer.step(inputs_t, s[None])[0].flatten(), h[0])
    torch.testing.assert_close(jac.reshape(M.shape[1:]), M[0], atol=1e-5, rtol=1e-5)


def test_hooks_have_the_documented_content():
    model = small(2.0, bias=(0.0, 3.0), d_conv=3)
    _, cache = model.run_with_cache(tokens())
    d = 8
    q, k, v = (cache[f"blocks.0.mixer.hook_{n}"] for n in "qkv")
    assert q.shape == k.shape == v.shape == (B, T, 2, d)
    torch.testing.assert_close(k.norm(dim=-1), torch.ones(B, T, 2))
    torch.testing.assert_close(q.norm(dim=-1), torch.ones(B, T, 2))
    conv = cache["blocks.0.mixer.hook_conv"]
    assert conv.shape == (B, T, 3 * 2 * d)
    torch.testing.assert_close(conv[..., 2 * 2 * d :].reshape(B, T, 2, d), v)
    states = cache["blocks.0.mixer.hook_state"]
    assert states.shape == (B, T, 2, d, d)


def test_fast_and_instrumented_paths_agree_bit_for_bit():
    """Both read o_t from the chunked kernel, whose outputs do not depend on the export."""
    model = small(2.0, bias=(0.0, 3.0), n_layers=2)
    fast = model.set_execution_path("fast")(tokens())
    (grad_fast,) = torch.autograd.grad(fast.square().sum(), model.embed.weight)
    slow = model.set_execution_path("instrumented")(tokens())
    (grad_slow,) = torch.autograd.grad(slow.square().sum(), model.embed.weight)
    assert torch.equal(slow, fast) and torch.equal(grad_slow, grad_fast)


def test_gated_variant_fast_equals_instrumented():
    model = small(2.0, mixer_options={"gate": True})
    assert "blocks.0.mixer.hook_gate" in model.hook_names()
    fast = model.set_execution_path("fast")(tokens())
    slow = model.set_execution_path("instrumented")(tokens())
    torch.testing.assert_close(slow, fast, atol=1e-5, rtol=1e-5)


def test_presets_and_bad_options():
    assert models.build("deltanet").cfg.beta_scales == [1.0] * 4
    neg = models.build("deltanet_neg")
    assert neg.cfg.beta_scales == [2.0] * 4 and neg.cfg.n_layers == 2
    with pytest.raises(ValueError, match="mixer_options"):
        models.build("deltanet", mixer_options={"gates": True})
    with pytest.raises(ValueError, match="impl"):
        models.build("deltanet", mixer_options={"impl": "cuda"})
    mixer = small(1.0).blocks[0].mixer
    with pytest.raises(ValueError, match="head"):
        mixer.clamp_beta(2, 0.0, 1.0)
    with pytest.raises(ValueError, match="lo <= hi"):
        mixer.clamp_beta(0, 1.0, 0.0)
    mixer.beta_clamp = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="beta_clamp"):
        mixer(torch.randn(1, 4, 16))


@pytest.mark.triton
@pytest.mark.skipif(not triton_interpreter_available(), reason="triton not importable (or no GPU and no TRITON_INTERPRET)")
def test_triton_ablation_path_equals_chunked():
    toks = tokens()[:2, :6]
    results = {}
    for impl in ("chunked", "triton"):
        model = small([1.0, 2.0], bias=(0.0, 3.0), d_model=8, mixer_options={"impl": impl})
        model.blocks[0].mixer.clamp_beta(1, 0.0, 1.0)
        logits = model(toks)
        (grad,) = torch.autograd.grad(logits.square().sum(), model.embed.weight)
        with models.instrumented():
            instrumented = model(toks)
        results[impl] = (logits, grad, instrumented)
    for x, ref in zip(results["triton"], results["chunked"]):
        torch.testing.assert_close(x, ref, atol=1e-5, rtol=1e-4)
