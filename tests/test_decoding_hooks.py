"""Hooks while decoding: every hook fires for every new token at its absolute position; the
Cache generate returns equals run_with_cache on the final sequence; hook functions and
StatePatches at prompt or generated positions change later tokens exactly as in a full forward."""

import pytest
import torch

import models
from models import StatePatch
from tests.test_decoding import NEW, SMALL, T, VOCAB, prompt, small_model

STATEFUL = [n for n in models.list_models() if any(n2.endswith("hook_state") for n2 in small_model(n).hook_names())]


@pytest.mark.parametrize("name", models.list_models())
def test_generate_cache_equals_run_with_cache_on_the_final_sequence(name):
    model = small_model(name)
    out, cache = model.generate(prompt(), NEW, cache_names=model.hook_names())
    _, full = model.run_with_cache(out[:, :-1])  # the last token is sampled, never run
    assert sorted(cache) == sorted(full)
    for hook in full:
        torch.testing.assert_close(cache[hook], full[hook], atol=1e-5, rtol=1e-5, msg=hook)


def test_hooks_see_one_new_position_at_a_time_with_its_position():
    model = small_model("mamba_attention")
    seen = []

    def record(x, hook):
        seen.append((hook.name, hook.position, x.shape[1] if not hook.name.endswith("pattern") else x.shape[2]))

    names = ["blocks.0.mixer.hook_state", "blocks.1.mixer.hook_pattern", "hook_logits", "blocks.0.mixer.hook_conv"]
    model.generate(prompt(), 3, fwd_hooks=[(n, record) for n in names])
    assert [s for s in seen if s[0] == "blocks.0.mixer.hook_state"] == [
        ("blocks.0.mixer.hook_state", 0, T), ("blocks.0.mixer.hook_state", T, 1), ("blocks.0.mixer.hook_state", T + 1, 1)]
    assert [s[1:] for s in seen if s[0] == "blocks.1.mixer.hook_pattern"] == [(0, T), (T, 1), (T + 1, 1)]
    assert [s[1:] for s in seen if s[0] == "hook_logits"] == [(0, T), (T, 1), (T + 1, 1)]
    assert [s[1:] for s in seen if s[0] == "blocks.0.mixer.hook_conv"] == [(0, T), (T, 1), (T + 1, 1)]
    assert not hasattr(model.hook_dict["hook_logits"], "position")  # removed after generate


def test_a_mixer_carrying_its_inputs_shows_prepare_hooks_the_window():
    """Mamba-3's prepare reads the previous step beyond its conv: its prepare hooks see the window."""
    model = small_model("mamba3")
    seen = []
    model.generate(prompt(), 2, fwd_hooks=[("blocks.0.mixer.hook_dt", lambda x, hook: seen.append((hook.position, x.shape[1])))])
    w = model.blocks[0].mixer.resume_context
    assert seen == [(0, T), (T - w, w + 1)]


def at_position(p, delta):
    """A hook function adding delta at absolute position p (hook.position: the first step it sees)."""
    def patch(x, hook):
        t = p - getattr(hook, "position", 0)
        if 0 <= t < x.shape[1]:
            x = x.clone()
            x[:, t] += delta.to(x.dtype)
            return x
        return None
    return patch


def assert_generate_matches_full(model, fwd_hooks, tokens=None):
    """generate under fwd_hooks: its tokens are the argmax of the patched full forward on the final
    sequence and its logits (cache) equal that forward's."""
    tokens = prompt() if tokens is None else tokens
    out, cache = model.generate(tokens, NEW, fwd_hooks=fwd_hooks, cache_names=["hook_logits"])
    full = model.run_with_hooks(out[:, :-1], fwd_hooks=fwd_hooks)
    torch.testing.assert_close(cache["hook_logits"], full, atol=1e-5, rtol=1e-5)
    assert torch.equal(full[:, T - 1:].argmax(-1), out[:, T:])
    return out, full


@pytest.mark.parametrize("position", [2, T + 1])  # a prompt and a generated position
@pytest.mark.parametrize("name", ["mamba", "transformer", "based", "gru"])
def test_a_residual_patch_at_a_position_matches_the_full_forward(name, position):
    model = small_model(name)
    delta = torch.randn(SMALL["d_model"], generator=torch.Generator().manual_seed(4)) * 3
    out, logits = assert_generate_matches_full(model, [("blocks.0.hook_resid_post", at_position(position, delta))])
    clean = model(out[:, :-1])
    assert (logits[:, position:] - clean[:, position:]).abs().amin() > 0  # the patch changed every later logit
    torch.testing.assert_close(logits[:, :position], clean[:, :position], atol=0, rtol=0)


def state_delta(model, layer):
    shape = model.blocks[layer].mixer.state_shape
    dtype = torch.complex64 if model.cfg.mixer in ("aussm", "mamba3") else torch.float32
    return (torch.randn(B_ROWS, *shape, generator=torch.Generator().manual_seed(7)) * 4).to(dtype)


B_ROWS = 3


@pytest.mark.parametrize("position", [1, T - 1, T + 2])
@pytest.mark.parametrize("name", STATEFUL)
def test_a_state_patch_while_decoding_equals_the_same_patch_in_a_full_forward(name, position):
    model = small_model(name)
    layer = 0
    patch = StatePatch([0, 2], [position, position], deltas=state_delta(model, layer)[[0, 2]])
    out, logits = assert_generate_matches_full(model, [(f"blocks.{layer}.mixer.hook_state", patch)])
    assert (logits[[0, 2], position:] - model(out[:, :-1])[[0, 2], position:]).abs().amax() > 1e-3
    clean = model.generate(prompt(), NEW)
    assert torch.equal(out[1], clean[1])  # row 1 is not patched
    assert torch.equal(out[:, : position + 1], clean[:, : position + 1])  # nothing before the patch changes


def test_state_patches_while_decoding_run_declared(monkeypatch):
    """A StatePatch at a prompt and at a generated step runs on the fast kernels (declared_segment),
    never the instrumented path that forms every state."""
    model = small_model("mamba2")
    mixer_cls = type(model.blocks[0].mixer)
    calls = []
    for method in ("declared_segment", "instrumented_forward"):
        original = getattr(mixer_cls, method)
        monkeypatch.setattr(mixer_cls, method, lambda self, *a, _o=original, _m=method, **k: calls.append(_m) or _o(self, *a, **k))
    patch = StatePatch([0, 1], [2, T + 1], deltas=state_delta(model, 0)[:2])
    model.generate(prompt(), NEW, fwd_hooks=[("blocks.0.mixer.hook_state", patch)])
    assert calls == ["declared_segment", "declared_segment"]  # the prompt, the call at position T + 1
    monkeypatch.undo()
    assert_generate_matches_full(model, [("blocks.0.mixer.hook_state", patch)])


@pytest.mark.parametrize("name", ["mamba", "deltanet", "based"])
def test_a_hook_function_on_hook_state_at_a_generated_position(name):
    model = small_model(name)
    delta = state_delta(model, 1)[0]
    assert_generate_matches_full(model, [("blocks.1.mixer.hook_state", at_position(T + 1, delta))])


def test_state_patch_errors_name_the_problem():
    model = small_model("mamba")
    with pytest.raises(ValueError, match="absolute steps"):
        model.generate(prompt(), 2, fwd_hooks=[("blocks.0.mixer.hook_state", StatePatch([0], [-1], deltas=torch.zeros(1, 32, 4)))])
    attention = small_model("transformer")
    with pytest.raises(ValueError, match="recurrent mixer's hook_state"):
        attention.generate(prompt(), 2, fwd_hooks=[("blocks.0.mixer.hook_z", StatePatch([0], [1], deltas=torch.zeros(1, 2)))])


def test_a_bare_pair_raises_as_in_run_with_hooks():
    model = small_model("mamba")
    with pytest.raises(TypeError, match="wrap it in a list"):
        model.generate(prompt(), 2, fwd_hooks=("hook_embed", lambda x, hook: None))
