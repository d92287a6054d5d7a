"""models.gated_product: act(gate) * up keeping only gate and up for the backward."""

import pytest
import torch
from torch.nn import functional as F

import models
from models.gated_product import gated_product

PLAIN = {"swiglu": F.silu, "geglu": F.gelu}


def _saved_bytes(fn) -> int:
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
def test_value_and_first_and_second_derivatives_equal_autograd_of_the_plain_expression(activation):
    torch.manual_seed(0)
    gate = (3 * torch.randn(4, 7, 16, dtype=torch.float64)).requires_grad_()
    up = torch.randn(4, 7, 16, dtype=torch.float64, requires_grad=True)
    ours = gated_product(gate, up, activation)
    plain = PLAIN[activation](gate) * up
    assert torch.equal(ours, plain)
    weight = torch.randn_like(plain)
    g_ours = torch.autograd.grad((ours * weight).sum(), (gate, up), create_graph=True)
    g_plain = torch.autograd.grad((plain * weight).sum(), (gate, up), create_graph=True)
    for a, b in zip(g_ours, g_plain):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
    second_ours = torch.autograd.grad(g_ours[0].square().sum(), (gate, up))
    second_plain = torch.autograd.grad(g_plain[0].square().sum(), (gate, up))
    for a, b in zip(second_ours, second_plain):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda g, u: gated_product(g, u, activation), (gate, up))


def test_keeps_two_tensors_where_autograd_keeps_three_and_refuses_unknown_activations():
    gate = torch.randn(64, 256, requires_grad=True)
    up = torch.randn(64, 256, requires_grad=True)
    one = 64 * 256 * 4
    assert _saved_bytes(lambda: gated_product(gate, up, "swiglu")) == 2 * one
    assert _saved_bytes(lambda: F.silu(gate) * up) == 3 * one
    with pytest.raises(ValueError, match="activation must be one of"):
        gated_product(gate, up, "relu")


def test_swiglu_model_parameter_gradients_equal_those_of_the_plain_expression():
    cfg = dict(vocab_size=32, d_model=16, n_layers=2, mlp_activation="swiglu", d_mlp=24, mlp=True)
    torch.manual_seed(0)
    model = models.build(models.preset_config("attention", **cfg)).double()
    tokens = torch.randint(0, 32, (2, 9))
    model(tokens).logsumexp(-1).sum().backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for mlp in [b.mlp for b in model.blocks]:
        mlp.forward = (lambda m: lambda x: m.hook_out(m.down(m.hook_post(
            F.silu(m.hook_pre(m.gate(x))) * m.up(x)))))(mlp)
    model(tokens).logsumexp(-1).sum().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(ours[name], param.grad, rtol=1e-12, atol=1e-12, msg=name)
