"""Effective attention: M applied to the mixer's input reproduces its pre-gate output (1e-5)."""

import pytest
import torch

import models
from interp.analysis.effective_attention import effective_attention, mixer_output
from interp.report.effective_attention import effective_attention_heatmap

NAMES = ["mamba", "negative_mamba", "mamba2", "aussm", "mamba3", "s4d", "h3", "deltanet", "deltanet_neg",
         "gated_deltanet", "based", "linear_rnn", "token_gated_rnn", "dense_ssm"]


@pytest.mark.parametrize("name", NAMES)
def test_effective_attention_reproduces_the_mixer_output(name):
    torch.manual_seed(0)
    model = models.build(name, vocab_size=9, d_model=16, n_heads=2, d_state=4, n_layers=2)
    tokens = torch.randint(0, 9, (2, 10), generator=torch.Generator().manual_seed(1))
    for layer in range(2):
        result = effective_attention(model, tokens, layer)
        x, y = mixer_output(model, tokens, layer)
        M = result.matrix  # [B, C, T, T]
        assert M.shape[-2:] == (10, 10) and torch.equal(M.triu(1), torch.zeros_like(M))  # causal
        assert M.dtype == torch.float64 and y.dtype.is_floating_point  # real, as the outputs
        if result.blocks is not None:  # dense [B, T, T, n, n]
            assert torch.equal(result.blocks.flatten(3).norm(dim=-1), M[:, 0])
            got = torch.einsum("btsij,bsj->bti", result.blocks, x.double())
        elif x.dim() == 3:  # channels
            got = torch.einsum("bcts,bsc->btc", M, x.double())
        else:  # heads [B, T, H, d]
            got = torch.einsum("bhts,bshd->bthd", M, x.double())
        torch.testing.assert_close(got, y.double(), atol=1e-5 * y.abs().max().item() + 1e-7, rtol=1e-5)
    figure = effective_attention_heatmap(result, example=0, index=min(1, result.matrix.shape[1] - 1), title=name)
    assert figure.data[0].z.shape == (10, 10)


def test_effective_attention_rejects_other_mixers():
    model = models.build("transformer", vocab_size=9, d_model=16, n_layers=1)
    with pytest.raises(ValueError, match="effective attention covers"):
        effective_attention(model, torch.zeros(1, 3, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="layer"):
        effective_attention(model, torch.zeros(1, 3, dtype=torch.long), 4)
