"""models.layout: widening linear maps keep W [out, in] as a view of a contiguous [in, out] tensor."""

import torch
from torch import nn

import models
from models.layout import input_major_, is_input_major, widening


def _gpt2_like():
    torch.manual_seed(0)
    return models.build("transformer", vocab_size=97, d_model=16, n_layers=2, n_heads=2, mlp=True,
                        tie_embeddings=True).double()


def test_widening_maps_are_input_major_narrowing_ones_row_major_and_ties_kept():
    model = _gpt2_like()
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert any(widening(m) for m in linears) and any(not widening(m) for m in linears)
    for module in linears:
        assert is_input_major(module.weight) == widening(module)
        assert module.weight.is_contiguous() != widening(module)
    assert model.unembed.weight is model.embed.weight and is_input_major(model.embed.weight)


def test_values_and_gradients_equal_those_of_row_major_weights():
    model = _gpt2_like()
    plain = _gpt2_like()
    for param in plain.parameters():
        param.data = param.data.contiguous()
    tokens = torch.randint(0, 97, (3, 11))
    torch.testing.assert_close(model(tokens), plain(tokens), rtol=1e-13, atol=1e-13)
    model(tokens).logsumexp(-1).sum().backward()
    plain(tokens).logsumexp(-1).sum().backward()
    for (name, a), (_, b) in zip(model.named_parameters(), plain.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12, msg=name)
        assert a.grad.stride() == a.stride(), name   # gradients laid out as their parameters


def test_save_load_and_dtype_moves_keep_values_and_layout(tmp_path):
    model = _gpt2_like()
    models.save(model, tmp_path / "run")
    loaded = models.load(tmp_path / "run")
    for (name, a), (_, b) in zip(model.named_parameters(), loaded.named_parameters()):
        assert torch.equal(a, b) and a.stride() == b.stride(), name
    single = loaded.float()
    assert is_input_major(single.unembed.weight) and single.unembed.weight is single.embed.weight
    assert input_major_(single) is single and is_input_major(single.unembed.weight)   # idempotent
