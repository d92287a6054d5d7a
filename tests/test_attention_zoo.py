"""Attention and the retrieval zoo (Based, BaseConv, H3, Hyena) against hand-written references."""

import math

import pytest
import torch

import models
from models.kernels.fft_conv import fft_causal_conv
from models.mixers.base import RecurrentMixer
from models.mixers.attention import apply_rotary, rotary_tables
from models.mixers.based import taylor_features

B, T, D = 2, 10, 16
ZOO = ["transformer", "based", "baseconv", "h3", "hyena"]


def build(name, **overrides):
    torch.manual_seed(0)
    return models.build(name, **{"vocab_size": 11, "d_model": D, "n_heads": 2, "d_state": 4, **overrides})


def mixer_of(model, layer=0):
    return model.blocks[layer].mixer


def run_mixer(mixer, x, path):
    mixer.execution_path = path
    try:
        return mixer(x)
    finally:
        mixer.execution_path = "auto"


@pytest.fixture
def x():
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(3))


# --- attention -----------------------------------------------------------------------------

def reference_attention(mixer, x):
    """Causal softmax attention written out position by position."""
    h, dh = mixer.n_heads, mixer.d_head
    wq, wk, wv = mixer.qkv.weight.split(h * dh)
    bq, bk, bv = mixer.qkv.bias.split(h * dh)
    out = torch.zeros(B, T, h * dh)
    for b in range(B):
        for head in range(h):
            cols = slice(head * dh, (head + 1) * dh)
            q = x[b] @ wq[cols].T + bq[cols]
            k = x[b] @ wk[cols].T + bk[cols]
            v = x[b] @ wv[cols].T + bv[cols]
            for s in range(T):
                scores = torch.stack([q[s] @ k[t] for t in range(s + 1)]) / math.sqrt(dh)
                weights = torch.exp(scores - scores.max())
                weights = weights / weights.sum()
                out[b, s, cols] = sum(weights[t] * v[t] for t in range(s + 1))
    return mixer.out_proj(out)


@pytest.mark.parametrize("path", ["fast", "instrumented"])
def test_attention_matches_reference(path, x):
    mixer = mixer_of(build("transformer", positional="none"))
    with torch.no_grad():
        torch.testing.assert_close(run_mixer(mixer, x, path), reference_attention(mixer, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional", ["none", "learned", "rope"])
def test_attention_fast_equals_explicit_with_grads(positional, x):
    mixer = mixer_of(build("transformer", positional=positional))
    outs, grads = [], []
    for path in ("fast", "instrumented"):
        xi = x.clone().requires_grad_(True)
        y = run_mixer(mixer, xi, path)
        outs.append(y)
        grads.append(torch.autograd.grad(y.square().sum(), [xi, mixer.qkv.weight]))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    for fast, slow in zip(*grads):
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


def test_attention_pattern_is_causal_softmax():
    model = build("transformer")
    tokens = torch.randint(0, 11, (B, T), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens, names=["blocks.0.mixer.hook_pattern"])
    pattern = cache["blocks.0.mixer.hook_pattern"]
    assert pattern.shape == (B, 2, T, T)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(B, 2, T))
    assert torch.all(pattern.triu(1) == 0)


def test_rope_scores_depend_only_on_offset():
    gen = torch.Generator().manual_seed(0)
    d_head, length = 8, 40
    q_vec, k_vec = torch.randn(d_head, generator=gen), torch.randn(d_head, generator=gen)
    cos, sin = rotary_tables(length, d_head, 10000.0, q_vec)

    def score(s, t):  # q placed at position s, k at position t
        q = apply_rotary(q_vec.expand(1, length, 1, d_head), cos, sin)[0, s, 0]
        k = apply_rotary(k_vec.expand(1, length, 1, d_head), cos, sin)[0, t, 0]
        return q @ k

    for s, t in [(5, 2), (9, 9), (3, 0)]:
        for shift in (1, 7, 30):
            torch.testing.assert_close(score(s + shift, t + shift), score(s, t), atol=1e-5, rtol=1e-5)
    assert abs(score(5, 2) - score(5, 4)) > 1e-3  # positions do matter
    rotated = apply_rotary(q_vec.expand(1, length, 1, d_head), cos, sin)
    torch.testing.assert_close(rotated.norm(dim=-1), q_vec.norm().expand(1, length, 1))


def rotate_by_hand(vec, position, base=10000.0):
    """Rotate each pair (i, i + d/2) of vec [d] by the angle position * base^(-2i/d)."""
    half = vec.shape[0] // 2
    out = vec.clone()
    for i in range(half):
        angle = position * base ** (-2 * i / vec.shape[0])
        c, s_ = math.cos(angle), math.sin(angle)
        out[i] = c * vec[i] - s_ * vec[i + half]
        out[i + half] = s_ * vec[i] + c * vec[i + half]
    return out


def test_rope_attention_matches_reference_with_rotated_queries_and_keys(x):
    mixer = mixer_of(build("transformer", positional="rope"))
    h, dh = mixer.n_heads, mixer.d_head
    wq, wk, wv = mixer.qkv.weight.split(h * dh)
    bq, bk, bv = mixer.qkv.bias.split(h * dh)
    out = torch.zeros(B, T, h * dh)
    with torch.no_grad():
        for b in range(B):
            for head in range(h):
                cols = slice(head * dh, (head + 1) * dh)
                q = torch.stack([rotate_by_hand(x[b, t] @ wq[cols].T + bq[cols], t) for t in range(T)])
                k = torch.stack([rotate_by_hand(x[b, t] @ wk[cols].T + bk[cols], t) for t in range(T)])
                v = x[b] @ wv[cols].T + bv[cols]
                for s in range(T):
                    weights = torch.softmax(q[s] @ k[: s + 1].T / math.sqrt(dh), dim=0)
                    out[b, s, cols] = weights @ v[: s + 1]
        expected = mixer.out_proj(out)
        for path in ("fast", "instrumented"):
            torch.testing.assert_close(run_mixer(mixer, x, path), expected, atol=1e-5, rtol=1e-5)


def test_rope_needs_even_head_dim():
    with pytest.raises(ValueError, match="even d_head"):
        build("transformer", positional="rope", n_heads=1, d_head=5)


# --- Based ---------------------------------------------------------------------------------

def test_taylor_feature_map_is_second_order_exp():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(6, 16, generator=gen), torch.randn(6, 16, generator=gen)
    s = (q * k).sum(-1) / 4.0  # q . k / sqrt(f), f = 16
    torch.testing.assert_close((taylor_features(q) * taylor_features(k)).sum(-1), 1 + s + s**2 / 2)
    assert taylor_features(q).shape == (6, 1 + 16 + 256)


def test_based_parallel_form_equals_recurrence(x):
    mixer = mixer_of(build("based", mixer_options={"feature_dim": 4, "window": 3}))
    with torch.no_grad():
        inputs = mixer.prepare(x)
        states, _ = mixer.scan(inputs)
        torch.testing.assert_close(mixer.parallel(inputs), mixer.read_states(states, inputs["q"]), atol=1e-5, rtol=1e-5)
        # the recurrence by hand: S_t = sum_{s <= t} phi(k_s) [v_s; 1]^T
        phi_k = taylor_features(inputs["k"])
        v1 = torch.cat([inputs["v"], torch.ones_like(inputs["v"][..., :1])], dim=-1)
        by_hand = torch.einsum("bthf,bthe->bthfe", phi_k, v1).cumsum(dim=1)
        torch.testing.assert_close(states, by_hand, atol=1e-5, rtol=1e-5)


def test_based_state_patch_continues_from_patched_state(x):
    mixer = mixer_of(build("based", mixer_options={"feature_dim": 4, "window": 0}))
    t = 4
    with torch.no_grad():
        inputs = mixer.prepare(x)
        clean_states, _ = mixer.scan(inputs)
        new_state = clean_states[:, t] * 0.5 + 1.0
        with mixer.hook_state.register_forward_hook(
            lambda m, i, s: torch.cat([s[:, :t], new_state[:, None], s[:, t + 1:]], dim=1)
        ):
            patched = run_mixer(mixer, x, "instrumented")
        phi_k = taylor_features(inputs["k"])
        v1 = torch.cat([inputs["v"], torch.ones_like(inputs["v"][..., :1])], dim=-1)
        increments = torch.einsum("bthf,bthe->bthfe", phi_k, v1)
        expected_states = clean_states.clone()
        expected_states[:, t:] = new_state[:, None] + torch.cat(
            [torch.zeros_like(increments[:, :1]), increments[:, t + 1:].cumsum(dim=1)], dim=1
        )
        expected = mixer.readout(x, expected_states, inputs)
    torch.testing.assert_close(patched, expected, atol=1e-5, rtol=1e-5)
    assert (patched[:, t:] - run_mixer(mixer, x, "fast")[:, t:]).abs().max() > 1e-3


def test_based_sliding_window_is_local_and_paths_agree(x):
    window = 3
    mixer = mixer_of(build("based", mixer_options={"feature_dim": 4, "window": window}))
    with torch.no_grad():
        mixer.execution_path = "fast"
        fast = mixer.sliding_window(x)
        mixer.execution_path = "instrumented"
        slow = mixer.sliding_window(x)
        mixer.execution_path = "auto"
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
        far = x.clone()
        far[:, :2] += 5.0  # positions 0, 1 are outside the window of every t >= 2 + window - 1 = 4
        changed = mixer.sliding_window(far)
    torch.testing.assert_close(changed[:, 4:], fast[:, 4:])
    assert (changed[:, 2:4] - fast[:, 2:4]).abs().max() > 1e-3
    model = build("based", mixer_options={"feature_dim": 4, "window": window})
    tokens = torch.randint(0, 11, (B, T), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens, names=["blocks.0.mixer.hook_pattern"])
    pattern = cache["blocks.0.mixer.hook_pattern"]
    band = torch.ones(T, T).tril() - torch.ones(T, T).tril(-window)
    assert torch.all(pattern[..., band == 0] == 0)
    torch.testing.assert_close(pattern.sum(-1), torch.ones(B, 2, T))


@pytest.mark.parametrize(
    "options, message",
    [({"feature_dim": 0}, "feature_dim"), ({"window": -1}, "window"), ({"windw": 3}, "unknown keys")],
)
def test_based_bad_options_raise(options, message):
    with pytest.raises(ValueError, match=message):
        build("based", mixer_options=options)


# --- H3 ------------------------------------------------------------------------------------

def test_h3_fft_path_equals_recurrence():
    mixer = mixer_of(build("h3", d_state=8))
    x = torch.randn(B, 64, D, generator=torch.Generator().manual_seed(5))
    outs, grads = [], []
    for path in ("fast", "instrumented"):
        xi = x.clone().requires_grad_(True)
        y = run_mixer(mixer, xi, path)
        outs.append(y)
        grads.append(torch.autograd.grad(y.square().sum(), [xi, mixer.log_dt, mixer.c]))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    for fast, slow in zip(*grads):
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-4)


def test_h3_kernel_scan_with_pins_equals_step_loop(x):
    mixer = mixer_of(build("h3", d_state=8))
    with torch.no_grad():
        inputs = mixer.prepare(x)
        mask = torch.zeros(B, T, dtype=torch.bool)
        mask[0, 3], mask[1, 6] = True, True
        values = torch.randn(B, T, *mixer.state_shape, generator=torch.Generator().manual_seed(2))
        kernel_states, _ = mixer.scan(inputs, (mask, values))
        loop_states, _ = RecurrentMixer.scan(mixer, inputs, (mask, values))  # step() one at a time
    torch.testing.assert_close(kernel_states, loop_states, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kernel_states[0, 3], values[0, 3])


def test_h3_kernel_is_impulse_response_of_the_recurrence():
    mixer = mixer_of(build("h3", d_state=8))
    channels = mixer.state_shape[0]
    impulse = torch.zeros(1, 20, channels)
    impulse[:, 0] = 1.0
    with torch.no_grad():
        states, _ = mixer.scan({"u": impulse, "q": impulse})
        response = (states * mixer.c).sum(-1)[0].T  # [C, T]
        torch.testing.assert_close(mixer.kernel(20), response, atol=1e-6, rtol=1e-5)
        # a zero-order-hold SSM with A < 0 is stable: |Abar| < 1
        _, abar, _ = mixer.discretised()
        assert torch.all((abar > 0) & (abar < 1))


# --- Hyena and BaseConv --------------------------------------------------------------------

def direct_causal_conv(u, k):
    """y[b, t, c] = sum_{s <= t} k[c, t - s] u[b, s, c], written as a loop."""
    y = torch.zeros_like(u)
    for t in range(u.shape[1]):
        for s in range(t + 1):
            y[:, t] += k[:, t - s] * u[:, s]
    return y


def test_fft_causal_conv_equals_direct_convolution():
    gen = torch.Generator().manual_seed(0)
    u, k = torch.randn(2, 13, 5, generator=gen), torch.randn(5, 20, generator=gen)
    torch.testing.assert_close(fft_causal_conv(u, k), direct_causal_conv(u, k[:, :13]), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="L>=13"):
        fft_causal_conv(u, k[:, :12])


def test_hyena_long_conv_equals_direct_convolution(x):
    mixer = mixer_of(build("hyena"))
    with torch.no_grad():
        h = mixer.filter(T)
        expected = direct_causal_conv(x, h) + mixer.filter_bias * x
        torch.testing.assert_close(mixer.long_conv(x), expected, atol=1e-5, rtol=1e-5)
        # the filter of a short sequence is the start of the long one (no dependence on T)
        torch.testing.assert_close(mixer.filter(50)[:, :T], h)


def test_hyena_matches_hand_written_operator(x):
    mixer = mixer_of(build("hyena"))
    with torch.no_grad():
        z = torch.nn.functional.conv1d(
            torch.nn.functional.pad(mixer.in_proj(x).transpose(1, 2), (mixer.conv_weight.shape[1] - 1, 0)),
            mixer.conv_weight[:, None], mixer.conv_bias, groups=3 * D,
        ).transpose(1, 2)
        x0, x1, v = z.split(D, dim=-1)
        v = x1 * v
        v = direct_causal_conv(v, mixer.filter(T)) + mixer.filter_bias * v
        torch.testing.assert_close(mixer(x), mixer.out_proj(x0 * v), atol=1e-5, rtol=1e-5)
    assert not any(n.endswith("hook_state") for n in build("hyena").hook_names())


def test_baseconv_matches_hand_written_operator(x):
    mixer = mixer_of(build("baseconv"))
    with torch.no_grad():
        u = mixer.in_proj(x)
        width = mixer.conv_weight.shape[1]
        c = mixer.conv_bias + sum(
            mixer.conv_weight[:, width - 1 - j] * torch.nn.functional.pad(u, (0, 0, j, 0))[:, :T]
            for j in range(width)
        )
        expected = mixer.out_proj(mixer.gate_proj(x) * direct_causal_conv(c, mixer.long_filter[:, :T]))
        torch.testing.assert_close(mixer(x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["hyena", "baseconv"])
def test_long_conv_models_reject_sequences_beyond_max_len(name):
    model = build(name, max_len=8)
    with pytest.raises(ValueError, match="max_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


# --- every zoo model -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ZOO)
def test_zoo_mixers_are_causal(name, x):
    mixer = mixer_of(build(name))
    changed = x.clone()
    changed[:, 6:] = torch.randn(B, T - 6, D, generator=torch.Generator().manual_seed(9))
    for path in ("fast", "instrumented"):
        with torch.no_grad():
            before, after = run_mixer(mixer, x, path), run_mixer(mixer, changed, path)
        torch.testing.assert_close(after[:, :6], before[:, :6], atol=1e-6, rtol=1e-6)
        assert (after[:, 6:] - before[:, 6:]).abs().max() > 1e-4


@pytest.mark.parametrize("name", ZOO)
def test_zoo_presets_and_hooks(name):
    model = build(name)
    assert model.cfg.n_layers == 2 and model.cfg.mlp
    tokens = torch.randint(0, 11, (B, T), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    expected = {
        "transformer": ["hook_q", "hook_k", "hook_v", "hook_pattern"],
        "based": ["hook_conv", "hook_q", "hook_k", "hook_v", "hook_state", "hook_pattern"],
        "baseconv": ["hook_conv", "hook_gate"],
        "h3": ["hook_q", "hook_k", "hook_v", "hook_conv", "hook_state"],
        "hyena": ["hook_conv", "hook_gate"],
    }[name]
    for hook in expected:
        assert f"blocks.1.mixer.{hook}" in cache, hook


@pytest.mark.parametrize("name", ["transformer", "hyena", "based"])
def test_unknown_mixer_options_raise(name):
    with pytest.raises(ValueError, match="unknown keys"):
        build(name, mixer_options={"nonsense": 1})


def test_rope_on_a_mixer_without_attention_raises():
    with pytest.raises(ValueError, match="positional='rope'.*'mamba' mixer"):
        build("mamba", positional="rope")
    build("mamba", positional="learned")  # learned positions live in the backbone: any mixer
