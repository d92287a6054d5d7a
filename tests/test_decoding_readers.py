"""hook_state readers during generate that select steps (`positions`, absolute) or heads
(`heads`) stream: each call forms the selected states only (no instrumented [B, n, *S] pass),
and what they read equals the full forward's hook_state at those steps; the tokens are
generate's own."""

import pytest
import torch

import models
from models.mixers.base import RecurrentMixer
from tests.test_decoding import small_model

STATEFUL = [n for n in models.list_models() if any(h.endswith("hook_state") for h in small_model(n).hook_names())]
T, NEW = 12, 6
READ = [0, 3, T - 1, T + 2, T + NEW - 2]  # prompt steps, generated steps (the last token is never run)


def prompt(batch=2, seed=1):
    return torch.randint(0, 7, (batch, T), generator=torch.Generator().manual_seed(seed))


def selecting_reader(found: dict, name: str, positions=None, heads=None):
    """A reader keeping {absolute step: state} (hook.position + the emitted step), uncopied: what
    it is handed must not change later (a view of a carried state that a later step reuses)."""
    def read(x, hook):
        steps = hook.emitted_positions or range(x.shape[1])
        for i, t in enumerate(steps):
            found.setdefault(name, {})[hook.position + t] = (x[:, i], hook.emitted_heads)
    read.positions, read.heads = positions, heads
    return read


def no_full_pass(model, monkeypatch):
    """The instrumented path (which forms every state of a call) raises in model's mixers."""
    def refuse(self, *args, **kwargs):
        raise AssertionError(f"{type(self).__name__}: the instrumented path ran")
    for mixer in model.modules():
        if isinstance(mixer, RecurrentMixer):
            monkeypatch.setattr(type(mixer), "instrumented_forward", refuse)


def state_names(model):
    return [n for n in model.hook_names() if n.endswith("hook_state")]


@pytest.mark.parametrize("name", STATEFUL)
def test_selected_steps_stream_and_equal_the_full_forward(name, monkeypatch):
    model = small_model(name)
    plain = model.generate(prompt(), NEW, progress=False)
    _, full = model.run_with_cache(plain[:, :-1], names=state_names(model))
    found: dict = {}
    readers = [(n, selecting_reader(found, n, positions=READ)) for n in state_names(model)]
    no_full_pass(model, monkeypatch)
    with model.hooks(readers=readers):
        out = model.generate(prompt(), NEW, progress=False)
    assert torch.equal(out, plain)
    for n in state_names(model):
        assert sorted(found[n]) == READ, n
        for t in READ:
            state, heads = found[n][t]
            assert heads is None
            torch.testing.assert_close(state, full[n][:, t], atol=1e-5, rtol=1e-5, msg=f"{n} step {t}")


@pytest.mark.parametrize("name", ["mamba2", "mamba"])
def test_selected_heads_stream_with_or_without_steps(name, monkeypatch):
    """heads with positions: those heads at those steps; heads alone: every step of those heads
    only (the prompt's from Mixer.head_states, each new token's from its step)."""
    model = small_model(name)
    hook = "blocks.1.mixer.hook_state"
    _, full = model.run_with_cache(model.generate(prompt(), NEW, progress=False)[:, :-1], names=[hook])
    found: dict = {}
    with model.hooks(readers=[(hook, selecting_reader(found, "both", positions=READ, heads=[1]))]):
        model.generate(prompt(), NEW, progress=False)
    for t in READ:
        state, heads = found["both"][t]
        assert heads == [1]
        torch.testing.assert_close(state, full[hook][:, t, [1]], atol=1e-5, rtol=1e-5)
    found = {}
    no_full_pass(model, monkeypatch)
    with model.hooks(readers=[(hook, selecting_reader(found, "heads", heads=[0]))]):
        model.generate(prompt(), NEW, progress=False)
    assert sorted(found["heads"]) == list(range(T + NEW - 1))
    for t, (state, heads) in found["heads"].items():
        assert heads == [0]
        expected = full[hook][:, t, heads]
        torch.testing.assert_close(state, expected, atol=1e-5, rtol=1e-5)
