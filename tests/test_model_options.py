"""ModelConfig options beyond the zoo's defaults: MLP activations and widths, norm eps,
grouped-query attention, biases, and hybrid stacks (one mixer per layer)."""

import math

import pytest
import torch
from torch.nn import functional as F

import models
from models import ModelConfig

VOCAB, B, T = 11, 2, 9


@pytest.fixture
def tokens():
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(0))


def transformer(**overrides):
    torch.manual_seed(0)
    return models.build("transformer", vocab_size=VOCAB, d_model=16, n_heads=4, n_layers=1, **overrides).double()


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "swiglu"])
def test_mlp_activations_match_their_formulas(activation):
    model = transformer(mlp_activation=activation, d_mlp=24, mlp_bias=activation != "swiglu")
    mlp = model.blocks[0].mlp
    x = torch.randn(B, T, 16, dtype=torch.float64)
    up = x @ mlp.up.weight.T + (0 if mlp.up.bias is None else mlp.up.bias)
    if activation == "gelu":
        hidden = 0.5 * up * (1 + torch.erf(up / math.sqrt(2)))
    elif activation == "gelu_tanh":  # GPT-2's gelu_new
        hidden = 0.5 * up * (1 + torch.tanh(math.sqrt(2 / math.pi) * (up + 0.044715 * up**3)))
    else:
        hidden = F.silu(x @ mlp.gate.weight.T) * up
    expected = hidden @ mlp.down.weight.T + (0 if mlp.down.bias is None else mlp.down.bias)
    torch.testing.assert_close(mlp(x), expected, atol=1e-12, rtol=1e-12)
    assert mlp.up.weight.shape == (24, 16)
    assert (mlp.up.bias is None) == (activation == "swiglu")


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_norm_eps_reaches_every_norm(norm):
    model = transformer(norm=norm, norm_eps=0.5)
    x = torch.randn(B, T, 16, dtype=torch.float64) * 0.3  # small: eps matters
    centred = x - x.mean(-1, keepdim=True) if norm == "layernorm" else x
    expected = centred / (centred.square().mean(-1, keepdim=True) + 0.5).sqrt()
    for module in (model.blocks[0].norm_mixer, model.blocks[0].norm_mlp, model.norm_final):
        torch.testing.assert_close(module(x), expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_grouped_query_attention_equals_attention_with_repeated_key_value_heads(positional, tokens):
    """n_kv_heads = 2 of 4: the same model as full attention whose key/value heads are copies
    (query head h reads key/value head h // 2), on both paths, with gradients."""
    gqa = transformer(n_kv_heads=2, positional=positional, attention_bias=False)
    full = transformer(positional=positional, attention_bias=False)
    state = gqa.state_dict()
    d = 4
    q, k, v = state["blocks.0.mixer.qkv.weight"].split([16, 2 * d, 2 * d])
    repeat = lambda w: w.view(2, d, 16).repeat_interleave(2, dim=0).reshape(4 * d, 16)  # noqa: E731
    state["blocks.0.mixer.qkv.weight"] = torch.cat([q, repeat(k), repeat(v)])
    full.load_state_dict(state)
    expected = full(tokens)
    for path in ("fast", "instrumented"):
        out = gqa.set_execution_path(path)(tokens)
        torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)
        (grad,) = torch.autograd.grad(out.square().sum(), gqa.embed.weight)
        (grad_full,) = torch.autograd.grad(full(tokens).square().sum(), full.embed.weight)
        torch.testing.assert_close(grad, grad_full, atol=1e-10, rtol=1e-10)
    _, cache = gqa.run_with_cache(tokens, names=["blocks.0.mixer.hook_q", "blocks.0.mixer.hook_k"])
    assert cache["blocks.0.mixer.hook_q"].shape == (B, T, 4, d)
    assert cache["blocks.0.mixer.hook_k"].shape == (B, T, 2, d)
    assert gqa.blocks[0].mixer.out_proj.bias is None


def test_hybrid_builds_one_mixer_per_layer_with_its_options(tokens):
    cfg = ModelConfig(mixer=["mamba", "mamba", "attention"], n_layers=3, vocab_size=VOCAB, d_model=16,
                      n_heads=2, d_state=4, mlp=True, mixer_options={"mamba": {"dt_rank": 3}})
    model = models.build(cfg)
    kinds = [type(block.mixer).__name__ for block in model.blocks]
    assert kinds == ["Mamba", "Mamba", "Attention"]
    assert model.blocks[0].mixer.dt_rank == model.blocks[1].mixer.dt_rank == 3
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    names = model.hook_names()
    assert "blocks.1.mixer.hook_state" in names and "blocks.2.mixer.hook_pattern" in names
    assert "blocks.2.mixer.hook_state" not in names
    assert model.resume_hooks()["carry"] == ["blocks.0.mixer.hook_state", "blocks.1.mixer.hook_state"]


def test_hybrid_trains(tokens):
    """Every parameter of every layer kind gets a gradient and a few steps lower the loss."""
    torch.manual_seed(0)
    model = models.build("mamba_attention", vocab_size=VOCAB, d_model=16, n_heads=2, d_state=4, n_layers=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        if not losses:
            silent = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().max() > 0]
            assert not silent, silent
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_hybrid_preset_repeats_its_pattern():
    model = models.build("mamba_attention", n_layers=3, d_model=16, n_heads=2)
    assert [type(b.mixer).__name__ for b in model.blocks] == ["Mamba", "Attention", "Mamba"]
    assert models.build("mamba_attention", mixer=["attention", "attention"]).cfg.mixers == ["attention"] * 2


@pytest.mark.parametrize("overrides, error, message", [
    (dict(mlp_activation="relu"), ValueError, "mlp_activation must be one of"),
    (dict(d_mlp=0), ValueError, "d_mlp must be None or a positive int"),
    (dict(mlp_bias=1), TypeError, "mlp_bias must be a bool"),
    (dict(attention_bias="no"), TypeError, "attention_bias must be a bool"),
    (dict(n_heads=4, n_kv_heads=3), ValueError, r"n_kv_heads \(3\) must divide n_heads \(4\)"),
    (dict(n_kv_heads=0), ValueError, "n_kv_heads must be None or a positive int"),
    (dict(norm_eps=0.0), ValueError, "norm_eps must be None or a positive float; got 0.0"),
    (dict(norm_eps=True), ValueError, "norm_eps must be None or a positive float"),
    (dict(norm="none", norm_eps=1e-5), ValueError, "norm_eps=1e-05 needs norm"),
    (dict(mixer=["mamba", "attention"], n_layers=3), ValueError, "mixer lists 2 mixers"),
    (dict(mixer=[], n_layers=1), TypeError, "non-empty list"),
    (dict(mixer=["mamba", 3], n_layers=2), TypeError, "non-empty list of names"),
    (dict(mixer=7), TypeError, "mixer must be a name"),
    (dict(mixer=["mamba", "attention"], n_layers=2, mixer_options={"gru": {}}), ValueError,
     "mixer_options of a hybrid map mixer names"),
    (dict(mixer=["mamba", "attention"], n_layers=2, mixer_options={"mamba": 3}), ValueError,
     "mixer_options of a hybrid map mixer names"),
])
def test_bad_options_raise(overrides, error, message):
    with pytest.raises(error, match=message):
        ModelConfig(**overrides)


def test_mamba_dt_bc_norms_normalise_dt_low_b_and_c():
    torch.manual_seed(0)
    model = models.build("mamba", vocab_size=VOCAB, d_model=16, d_state=4, n_layers=1,
                         mixer_options={"dt_bc_norm_eps": 0.5}).double()
    mixer = model.blocks[0].mixer
    x = torch.randn(B, T, 16, dtype=torch.float64)
    inputs = mixer.prepare(x)
    conv = inputs["x"]
    dt_low, b, c = mixer.x_proj(conv).split([mixer.dt_rank, 4, 4], dim=-1)
    rms = lambda v, w: v / (v.square().mean(-1, keepdim=True) + 0.5).sqrt() * w  # noqa: E731
    torch.testing.assert_close(inputs["B"], rms(b, mixer.B_norm.weight), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(inputs["C"], rms(c, mixer.C_norm.weight), atol=1e-12, rtol=1e-12)
    dt = torch.nn.functional.softplus(mixer.dt_proj(rms(dt_low, mixer.dt_norm.weight)))
    torch.testing.assert_close(inputs["dt"], dt, atol=1e-12, rtol=1e-12)
    with pytest.raises(ValueError, match="dt_bc_norm_eps must be None or a positive float; got 0"):
        models.build("mamba", mixer_options={"dt_bc_norm_eps": 0})


def test_hybrid_with_an_unknown_mixer_or_a_misplaced_option_raises():
    with pytest.raises(ValueError, match="mixer 'mamab'.*mamba"):
        models.build(ModelConfig(mixer=["mamab", "attention"], n_layers=2))
    with pytest.raises(ValueError, match="unknown keys"):
        models.build(ModelConfig(mixer=["mamba", "attention"], n_layers=2, mixer_options={"attention": {"dt_rank": 2}}))
