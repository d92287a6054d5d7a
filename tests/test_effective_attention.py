"""Effective attention: M applied to the mixer's input reproduces its pre-gate output (1e-5 in
float64); a selection (channels / heads, output window, sources) equals the same slice of the full
computation for every covered mixer; the memory estimate refuses a budget below the result; the
heatmap as a reader sees it (titled axes and colour bar, the window's own positions, the layer and
the channel or head in the title, an empty window said in words; rendered in Chromium)."""

import numpy as np
import pytest
import torch

import models
from interp.analysis import effective_attention as ea
from interp.analysis.effective_attention import effective_attention, effective_attention_layers, mixer_output
from interp.report.effective_attention import effective_attention_heatmap
from interp.report.html import write_report
from models.memory import MemoryRefused
from tests.browser import assert_renders

NAMES = ["mamba", "negative_mamba", "mamba2", "aussm", "mamba3", "s4d", "h3", "deltanet", "deltanet_neg",
         "gated_deltanet", "kda", "based", "linear_rnn", "token_gated_rnn", "dense_ssm"]
DENSE = {"linear_rnn", "token_gated_rnn", "dense_ssm"}


def tiny(name: str, layers: int = 2):
    torch.manual_seed(0)
    return models.build(name, vocab_size=9, d_model=16, n_heads=2, d_state=4, n_layers=layers)


TOKENS = torch.randint(0, 9, (2, 10), generator=torch.Generator().manual_seed(1))


def applied(result, x: torch.Tensor) -> torch.Tensor:
    """y = M x for a result over every channel and position."""
    if result.blocks is not None:  # dense [B, T, T, n, n]
        return torch.einsum("btsij,bsj->bti", result.blocks, x.to(result.blocks.dtype))
    if x.dim() == 3:  # channels
        return torch.einsum("bcts,bsc->btc", result.matrix, x.to(result.matrix.dtype))
    return torch.einsum("bhts,bshd->bthd", result.matrix, x.to(result.matrix.dtype))  # heads [B, T, H, d]


@pytest.mark.parametrize("name", NAMES)
def test_effective_attention_reproduces_the_mixer_output(name, monkeypatch):
    monkeypatch.setattr(ea, "CHUNK", 3)  # several coefficient chunks and linear-attention row blocks
    model = tiny(name)
    for layer in range(2):
        result = effective_attention(model, TOKENS, layer, dtype=torch.float64)
        x, y = mixer_output(model, TOKENS, layer)
        M = result.matrix  # [B, C, T, T]
        assert M.shape[-2:] == (10, 10) and torch.equal(M.triu(1), torch.zeros_like(M))  # causal
        assert M.dtype == torch.float64 and y.dtype.is_floating_point  # real, as the outputs
        if result.blocks is not None:
            assert torch.equal(result.blocks.flatten(3).norm(dim=-1), M[:, 0])
        torch.testing.assert_close(applied(result, x), y.double(), atol=1e-5 * y.abs().max().item() + 1e-7, rtol=1e-5)
        single = effective_attention(model, TOKENS, layer)  # float32 by default: the same M to float32 rounding
        assert single.matrix.dtype == torch.float32
        torch.testing.assert_close(single.matrix.double(), M, atol=1e-5 * M.abs().max().item(), rtol=1e-4)
    figure = effective_attention_heatmap(result, example=0, index=min(1, result.matrix.shape[1] - 1), title=name)
    assert figure.data[0].z.shape == (10, 10)


SELECTIONS = [  # (index, window, sources)
    (None, (3, 8), None),
    (None, (6, 10), (0, 10)),
    ([1, 0], (2, 9), (4, 7)),
    (slice(1, None), None, (5, 10)),
    (0, (0, 4), (2, 3)),
    (None, (0, 3), (5, 9)),  # every source after every row: all zero
]


@pytest.mark.parametrize("name", NAMES)
def test_a_selection_is_the_slice_of_the_full_computation(name, monkeypatch):
    monkeypatch.setattr(ea, "CHUNK", 3)  # coefficient chunks and linear-attention row blocks cross the window
    model = tiny(name)
    layers = effective_attention_layers(model, TOKENS, [1, 0], dtype=torch.float64)
    for layer in (0, 1):
        full = effective_attention(model, TOKENS, layer, dtype=torch.float64)
        assert torch.equal(layers[layer].matrix, full.matrix)
        for index, window, sources in SELECTIONS:
            index = None if name in DENSE else index
            got = effective_attention(model, TOKENS, layer, index=index, window=window, sources=sources,
                                      dtype=torch.float64)
            t0, t1 = window or (0, 10)
            s0, s1 = sources or (t0, t1)
            chosen = list(range(full.matrix.shape[1]))[index] if isinstance(index, slice) else \
                [index] if isinstance(index, int) else index
            assert (got.start, got.source_start) == (t0, s0)
            assert got.index == (None if name in DENSE else tuple(chosen or range(full.matrix.shape[1])))
            want = full.matrix[:, chosen if chosen is not None else slice(None), t0:t1, s0:s1]
            tol = 1e-12 * full.matrix.abs().max().item()
            torch.testing.assert_close(got.matrix, want, atol=tol, rtol=1e-10)
            if name in DENSE:
                torch.testing.assert_close(got.blocks, full.blocks[:, t0:t1, s0:s1], atol=tol, rtol=1e-10)


def test_the_heatmap_of_a_window_labels_and_blanks_by_sequence_position():
    result = effective_attention(tiny("mamba"), TOKENS, 0, index=[3], window=(4, 7), sources=(2, 9))
    figure = effective_attention_heatmap(result, tokens=[f"w{i}" for i in range(10)])
    assert list(figure.data[0].y) == [4, 5, 6] and list(figure.layout.yaxis.ticktext) == ["4: w4", "5: w5", "6: w6"]
    assert figure.layout.xaxis.ticktext[0] == "2: w2"
    z = np.array(figure.data[0].z, dtype=float)  # rows t 4..6, columns s 2..8: blank exactly where s > t
    assert np.array_equal(np.isnan(z), np.arange(2, 9)[None, :] > np.arange(4, 7)[:, None])
    assert "channel 3" in figure.layout.title.text


def test_the_heatmap_titles_its_axes_and_ticks_the_window_in_sequence_positions(tmp_path):
    model = tiny("mamba")
    tokens = torch.randint(0, 9, (1, 80), generator=torch.Generator().manual_seed(3))
    result = effective_attention(model, tokens, 1, index=[3, 5], window=(20, 30), sources=(12, 30), progress=False)
    figure = effective_attention_heatmap(result, index=1)
    x, y = figure.layout.xaxis, figure.layout.yaxis
    assert x.title.text == "key position s (input x)" and y.title.text == "query position t (output C h)"
    assert figure.data[0].colorbar.title.text.startswith("M[t, s]")
    assert list(y.tickvals) == list(range(20, 30)) and list(x.tickvals) == list(range(12, 30))  # not 0..w
    assert list(y.ticktext) == [str(t) for t in range(20, 30)]
    assert tuple(x.range) == (11.5, 29.5) and tuple(y.range) == (29.5, 19.5)  # every cell, t downwards
    title = figure.layout.title.text
    assert "layer 1 (mamba), channel 5, example 0" in title and "selected channels 3, 5" in title
    long = effective_attention(model, tokens, 0, index=[0], window=(7, 80), progress=False)
    ticks = effective_attention_heatmap(long).layout.yaxis.tickvals
    assert len(ticks) <= 24 and ticks[0] == 7 and all(7 <= t < 80 for t in ticks)
    empty = effective_attention(model, tokens, 0, index=[0], window=(0, 4), sources=(10, 20), progress=False)
    blank = effective_attention_heatmap(empty)
    assert "no key s <= t" in blank.layout.annotations[0].text and list(blank.layout.xaxis.tickvals) == list(range(10, 20))
    heads = effective_attention(tiny("deltanet"), tokens[:, :12], 1, index=[1], progress=False)
    assert "layer 1 (deltanet), head 1, example 0" in effective_attention_heatmap(heads).layout.title.text
    path = write_report(tmp_path / "report.html", "Effective attention",
                        [figure, blank, effective_attention_heatmap(heads)])
    assert_renders(path)


def test_the_estimate_refuses_a_budget_below_the_result_and_admits_a_fair_one():
    model = tiny("mamba")
    tokens = torch.randint(0, 9, (2, 200), generator=torch.Generator().manual_seed(2))
    result_bytes = 2 * 4 * 200 * 200 * 4  # [B, 4 channels, T, T] float32
    with pytest.raises(MemoryRefused, match="effective attention of layers \\[0\\].*over the memory budget"):
        effective_attention(model, tokens, 0, index=[0, 1, 2, 3], max_memory=result_bytes)
    result = effective_attention(model, tokens, 0, index=[0, 1, 2, 3], max_memory=2 * result_bytes)
    assert result.matrix.shape == (2, 4, 200, 200)
    with pytest.raises(MemoryRefused, match="float64"):
        effective_attention(model, tokens, 0, index=[0, 1, 2, 3], dtype=torch.float64, max_memory=2 * result_bytes)


def test_effective_attention_rejects_other_mixers_and_bad_selections():
    model = models.build("transformer", vocab_size=9, d_model=16, n_layers=1)
    with pytest.raises(ValueError, match="effective attention covers"):
        effective_attention(model, torch.zeros(1, 3, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="layer"):
        effective_attention(model, torch.zeros(1, 3, dtype=torch.long), 4)
    mamba, dense = tiny("mamba"), tiny("linear_rnn")
    bad = [(mamba, dict(index=[0, 99]), "index must pick.*out of range"), (mamba, dict(index=1.5), "index must be"),
           (mamba, dict(window=(5, 5)), "window must be"), (mamba, dict(sources=(0, 11)), "sources must be"),
           (mamba, dict(dtype=torch.float16), "dtype must be"), (dense, dict(index=0), "index must be None")]
    for model, options, message in bad:
        with pytest.raises(ValueError, match=message):
            effective_attention(model, TOKENS, 0, **options)
    with pytest.raises(ValueError, match="layers must be"):
        effective_attention_layers(mamba, TOKENS, 0)
