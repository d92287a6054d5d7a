"""What Based, Hyena and BaseConv carry while decoding: Based its linear-attention state, short
conv window and sliding window's keys and values (constant memory, one row per projection a
token), Hyena / BaseConv their long convolution's inputs (no projection re-run on the prefix);
the logits of every step equal the full forward, also once the sliding window has rolled."""

import pytest
import torch

import models
from models.decoding.step import advance, mixer_kind
from tests.test_decoding import B, SMALL, T, VOCAB, decode_and_compare, prompt, small_model
from tests.test_decoding_hooks import assert_generate_matches_full, at_position

WINDOW = 3  # shorter than the prompt: the carried window rolls


def based(window=WINDOW):
    torch.manual_seed(0)
    return models.build("based", **SMALL, mixer_options={"window": window}).eval()


def rows_through(module, monkeypatch) -> list[int]:
    """The time lengths of module's inputs, call by call (filled as the model runs)."""
    rows = []
    monkeypatch.setattr(module, "forward", lambda x, _f=module.forward: rows.append(x.shape[1]) or _f(x))
    return rows


@pytest.mark.parametrize("window", [0, 1, WINDOW])
def test_based_steps_equal_the_full_forward_as_the_window_rolls(window):
    worst, _ = decode_and_compare(based(window), prompt(), steps=8)
    assert worst < 1e-5, worst


@pytest.mark.parametrize("path", ["fast", "instrumented"])
def test_based_carries_constant_memory_and_runs_one_row_a_token(path, monkeypatch):
    model = based().set_execution_path(path)
    assert {mixer_kind(b.mixer) for b in model.blocks} == {"recurrent"}
    rows = rows_through(model.blocks[0].mixer.swa_qkv, monkeypatch)
    with torch.no_grad():
        _, state = advance(model, prompt())
        size = state.nbytes
        windows = state.layers[0]["swa_keys"].shape
        for _ in range(4):
            _, state = advance(model, torch.ones(B, 1, dtype=torch.long), state)
            assert state.nbytes == size
    assert windows == (B, SMALL["n_heads"], WINDOW - 1, model.cfg.head_dim)
    assert rows == [T, 1, 1, 1, 1]


def test_based_pattern_while_decoding_is_the_full_forwards():
    """hook_pattern of a new token is [B, H, 1, t + 1] over absolute key positions (zero outside the
    window): generate's Cache equals run_with_cache, and a hook writing outside the band changes
    nothing, in decoding as in the full forward."""
    model = based()
    name = "blocks.1.mixer.hook_pattern"
    out, cache = model.generate(prompt(), 6, cache_names=[name])
    _, full = model.run_with_cache(out[:, :-1], names=[name])
    torch.testing.assert_close(cache[name], full[name], atol=1e-6, rtol=0)
    assert bool((full[name][:, :, -1, : out.shape[1] - 1 - WINDOW] == 0).all())

    def outside(x, hook):  # weight on key 0 for every query: outside the window from WINDOW on
        x = x.clone()
        x[..., 0] += 5.0
        return x

    hooked, logits = assert_generate_matches_full(model, [(name, outside)])
    clean = model(hooked[:, :-1])
    assert (logits[:, :WINDOW] - clean[:, :WINDOW]).abs().amax() > 1e-3  # key 0 is in the first windows
    torch.testing.assert_close(logits[:, WINDOW:], clean[:, WINDOW:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["hyena", "baseconv"])
def test_long_convolutions_run_one_row_of_each_projection_a_token(name, monkeypatch):
    model = small_model(name)
    assert {mixer_kind(b.mixer) for b in model.blocks} == {"history"}
    rows = rows_through(model.blocks[1].mixer.in_proj, monkeypatch)
    with torch.no_grad():
        _, state = advance(model, prompt())
        for _ in range(3):
            _, state = advance(model, torch.ones(B, 1, dtype=torch.long), state)
    assert rows == [T, 1, 1, 1]
    history = state.trimmed()[1]["history"]
    assert history.shape == (B, T + 3, model.cfg.d_model)


def test_hyena_taps_follow_the_filter_parameters():
    """The kept filter taps are recomputed once a filter parameter changes in place."""
    model = small_model("hyena")
    tokens = prompt()
    worst, _ = decode_and_compare(model, tokens)
    assert worst < 1e-5, worst
    with torch.no_grad():
        for block in model.blocks:
            block.mixer.filter.mlp[0].weight.mul_(1.5)
    worst, _ = decode_and_compare(model, tokens)
    assert worst < 1e-5, worst
    with torch.no_grad():
        taps = model.blocks[0].mixer.taps(T)
    torch.testing.assert_close(taps, model.blocks[0].mixer.filter(T), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["hyena", "baseconv"])
def test_long_convolutions_refuse_positions_past_max_len(name):
    model = models.build(name, **{**SMALL, "vocab_size": VOCAB}, max_len=T + 2).eval()
    with torch.no_grad(), pytest.raises(ValueError, match=f"max_len={T + 2}"):
        model.generate(prompt(), 4)


@pytest.mark.parametrize("position", [2, T + 1])  # a prompt and a generated position
@pytest.mark.parametrize("name", ["hyena", "baseconv"])
def test_a_hook_on_the_short_conv_while_decoding_equals_the_full_forward(name, position):
    """A hook function on hook_conv at one absolute position: generate's tokens and logits are the
    hooked full forward's; earlier logits are the clean ones (to FFT rounding, which mixes
    positions), later ones change."""
    model = small_model(name)
    width = model.cfg.d_model * (3 if name == "hyena" else 1)  # hyena's short conv runs on W_in x [3D]
    delta = torch.randn(width, generator=torch.Generator().manual_seed(4)) * 3
    out, logits = assert_generate_matches_full(model, [("blocks.0.mixer.hook_conv", at_position(position, delta))])
    clean = model(out[:, :-1])
    torch.testing.assert_close(logits[:, :position], clean[:, :position], atol=1e-6, rtol=0)
    assert (logits[:, position:] - clean[:, position:]).abs().amax(-1).min() > 1e-4
