"""Attention's Qwen options (models/mixers/attention.py): qk_norm, output_gate and
partial_rotary_factor against a direct re-computation from the weights, decoding from the KV
cache, and the gate's hook."""

import math

import pytest
import torch

import models
from models.mixers.attention import apply_rotary
from tests.test_decoding import decode_and_compare

OPTIONS = {"qk_norm": True, "output_gate": True, "partial_rotary_factor": 0.5, "rope_base": 50.0}


def gated_model(**options):
    torch.manual_seed(0)
    model = models.build("attention", vocab_size=7, d_model=16, n_heads=4, n_kv_heads=2, d_head=8, n_layers=2,
                         positional="rope", norm="rmsnorm", norm_eps=1e-6, mlp_activation="swiglu",
                         mixer_options={**OPTIONS, **options}).eval()
    with torch.no_grad():  # move the norm weights off their init
        for name, p in model.named_parameters():
            if "_norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model


def reference(mixer, x):
    """The documented math, term by term: x [B, T, D] -> [B, T, D]."""
    B, T, _ = x.shape
    H, G, d = mixer.n_heads, mixer.n_kv, mixer.d_head
    q, k, v = mixer.qkv(x).split([H * d, G * d, G * d], dim=-1)
    q, k, v = q.view(B, T, H, d), k.view(B, T, G, d), v.view(B, T, G, d)

    def rms(u, weight):
        return u / torch.sqrt(u.square().mean(-1, keepdim=True) + 1e-6) * weight

    q, k = rms(q, mixer.q_norm.weight), rms(k, mixer.k_norm.weight)
    r = d // 2
    angle = torch.arange(T)[:, None] * 50.0 ** (-torch.arange(0, r, 2) / r)  # [T, r/2]

    def rotate(u):  # pairs (i, i + r/2) of the first r dims
        a, b, rest = u[..., : r // 2], u[..., r // 2 : r], u[..., r:]
        c, s = angle.cos()[:, None], angle.sin()[:, None]
        return torch.cat([a * c - b * s, b * c + a * s, rest], dim=-1)

    q, k = rotate(q), rotate(k)
    k, v = k.repeat_interleave(H // G, dim=2), v.repeat_interleave(H // G, dim=2)
    scores = torch.einsum("bshd,bthd->bhst", q, k) / math.sqrt(d)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    z = torch.einsum("bhst,bthd->bshd", scores.softmax(-1), v)
    gate = torch.sigmoid(mixer.gate_proj(x)).view(B, T, H, d)
    return mixer.out_proj((z * gate).flatten(2))


@pytest.mark.parametrize("path", ["fast", "instrumented"])
def test_qk_norm_gate_and_partial_rotary_follow_the_documented_math(path):
    mixer = gated_model().set_execution_path(path).blocks[0].mixer
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(mixer(x), reference(mixer, x), atol=1e-5, rtol=0)


def test_partial_rotary_leaves_the_other_dims_alone():
    x = torch.randn(1, 5, 2, 8)
    cos, sin = torch.rand(5, 4), torch.rand(5, 4)
    out = apply_rotary(x, cos, sin)
    assert torch.equal(out[..., 4:], x[..., 4:])
    torch.testing.assert_close(out[..., :4], apply_rotary(x[..., :4], cos, sin))


def test_decoding_from_the_kv_cache_equals_the_full_forward():
    model = gated_model()
    tokens = torch.randint(0, 7, (3, 6), generator=torch.Generator().manual_seed(1))
    worst, _ = decode_and_compare(model, tokens)
    assert worst < 1e-5, worst


def test_hook_gate_is_the_sigmoid_gate_and_scales_hook_z():
    model = gated_model()
    tokens = torch.randint(0, 7, (2, 6), generator=torch.Generator().manual_seed(1))
    names = ["blocks.0.mixer.hook_gate", "blocks.0.mixer.hook_z", "blocks.0.mixer.hook_in"]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names=names)
        mixer = model.blocks[0].mixer
        gate = torch.sigmoid(mixer.gate_proj(cache["blocks.0.mixer.hook_in"])).view(2, 6, 4, 8)
        torch.testing.assert_close(cache["blocks.0.mixer.hook_gate"], gate)
        _, patched = model.run_with_cache(tokens, names=["blocks.0.mixer.hook_z", "blocks.0.mixer.hook_out"],
                                          fwd_hooks=[("blocks.0.mixer.hook_gate", lambda g, hook: g * 0)])
    assert cache["blocks.0.mixer.hook_z"].abs().max() > 0
    assert torch.equal(patched["blocks.0.mixer.hook_z"], torch.zeros_like(patched["blocks.0.mixer.hook_z"]))
    torch.testing.assert_close(patched["blocks.0.mixer.hook_out"],
                               mixer.out_proj.bias.expand(2, 6, 16), atol=0, rtol=0)


@pytest.mark.parametrize("options, error, message", [
    ({"qk_norm": 1}, TypeError, "qk_norm"),
    ({"output_gate": "yes"}, TypeError, "output_gate"),
    ({"partial_rotary_factor": 0.0}, ValueError, "partial_rotary_factor"),
    ({"partial_rotary_factor": 1.5}, ValueError, "partial_rotary_factor"),
    ({"partial_rotary_factor": 0.1}, ValueError, "r = 0"),
    ({"partial_rotary_factor": 0.375}, ValueError, "r = 3"),
])
def test_bad_options_raise_naming_them(options, error, message):
    with pytest.raises(error, match=message):
        gated_model(**options)
