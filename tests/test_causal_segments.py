"""Changes relative to the state at every step, applied causally in one pass (issue 39).

A StatePatch(fn=...) under grad runs as RecurrentMixer.pinned_forward (models.hooks.state.plan_pins:
each patched step scanned from the state the earlier patches left, fn called once a step), and a
hook function that does not settle in one round is called window by window
(models.hooks.state.in_windows). Both must equal the re-run settle they replace (causal_pins'
rounds, a re-run of the layer a step: reached here by turning the one-pass paths off), forward
and gradients with respect to the parameters and the patch's own inputs, in float64 at 1e-10,
on every family of recurrent mixer that exposes hook_state.
"""

import contextlib

import pytest
import torch

import models
import models.hooks.state as state_module
import models.mixers.base as base_module
from models import StatePatch

SMALL = dict(vocab_size=7, d_model=16, n_heads=2, d_state=4, n_layers=2)
TOL = dict(atol=1e-10, rtol=1e-10)
SITE = "blocks.0.mixer.hook_state"
# selective / diagonal scans (Mamba, Mamba-2, Mamba-3 complex, negative Mamba, AUSSM, S4D, H3, a
# linear RNN), nonlinear RNNs (GRU, LSTM, tanh), delta rules (DeltaNet, Gated DeltaNet, KDA),
# RWKV-7, a short-conv window as the state (LFM2), Based (linear attention)
FAMILIES = ["mamba", "mamba2", "mamba3", "negative_mamba", "aussm", "s4d", "h3", "linear_rnn", "gru", "lstm",
            "tanh_rnn", "deltanet", "gated_deltanet", "kda", "rwkv7", "lfm2_conv", "based"]


def model64(name: str) -> models.SequenceModel:
    torch.manual_seed(0)
    return models.build(name, **SMALL).eval().double()


def tokens(batch: int = 3, length: int = 6) -> torch.Tensor:
    return torch.randint(0, SMALL["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(1))


def leaves(model, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, d) [*S] float64 leaves of the relative change c -> c * w + d."""
    shape, generator = model.blocks[0].mixer.state_shape, torch.Generator().manual_seed(seed)
    w = 0.8 + 0.1 * torch.randn(shape, generator=generator, dtype=torch.float64)
    d = 0.05 * torch.randn(shape, generator=generator, dtype=torch.float64)
    return w.requires_grad_(True), d.requires_grad_(True)


def every_step(batch: int, length: int) -> tuple[list[int], list[int]]:
    return [b for b in range(batch) for _ in range(length)], [t for _ in range(batch) for t in range(length)]


@contextlib.contextmanager
def rerun_settle(monkeypatch):
    """The re-run settle only: no window pass, and StatePatches run as hook functions (no plan)."""
    with monkeypatch.context() as patch:
        patch.setattr(state_module, "in_windows", lambda *args, **kwargs: None)
        patch.setattr(base_module, "declared_state_patches", lambda *args, **kwargs: None)
        yield


def forward_and_grads(model, ids, hook, w, d):
    """(logits, d loss / d (w, d, every parameter)) of a run with hook on SITE, grad on."""
    logits = model.run_with_hooks(ids, fwd_hooks=[(SITE, hook)])
    grads = torch.autograd.grad(logits.pow(2).sum(), [w, d, *model.parameters()], allow_unused=True)
    return logits.detach(), grads


def assert_same(first, second) -> None:
    torch.testing.assert_close(first[0], second[0], **TOL)
    for one, other in zip(first[1], second[1]):
        assert (one is None) == (other is None)
        if one is not None:
            torch.testing.assert_close(one, other, **TOL)


@pytest.mark.parametrize("name", FAMILIES)
def test_statepatch_fn_at_every_step_under_grad_is_one_pass_equal_to_the_reruns(name, monkeypatch):
    """StatePatch(fn) over every (row, step) with a gradient: fn is called once a step (one pass,
    where the re-run settle calls it again every round), and the logits and the gradients with
    respect to fn's inputs and every parameter equal the re-run settle's."""
    model, ids = model64(name), tokens()
    w, d = leaves(model)
    calls = []

    def fn(current):
        calls.append(len(current))
        return current * w.to(current.dtype) + d.to(current.dtype)

    patch = StatePatch(*every_step(*ids.shape), fn=fn)
    one_pass = forward_and_grads(model, ids, patch, w, d)
    # each step's entries once, in step order; Based runs StatePatches as hook functions (its own
    # mix): the whole run twice (the first call, one round), each step's window, the confirming call
    assert calls == [ids.shape[0]] * ids.shape[1] * (4 if name == "based" else 1)
    calls.clear()
    with rerun_settle(monkeypatch):
        settled = forward_and_grads(model, ids, patch, w, d)
    assert len(calls) > 2 * ids.shape[1]  # the rounds: the reference is the other path
    assert_same(one_pass, settled)
    assert w.grad is None and float(one_pass[1][0].abs().sum()) > 0  # the patch's inputs get a gradient


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("name", FAMILIES)
def test_a_relative_hook_at_every_step_equals_statepatch_fn_and_the_reruns(name, grad, monkeypatch):
    """A hook function c -> c * w + d on every state (relative: it does not settle in one round)
    runs in windows of one step (in_windows), with and without a gradient: the logits (and
    the gradients) equal StatePatch(fn) over every (row, step) and the re-run settle."""
    model, ids = model64(name), tokens()
    w, d = leaves(model)
    relative = lambda current: current * w.to(current.dtype) + d.to(current.dtype)  # noqa: E731
    windows = []

    def hook(states, hook_point):
        windows.append((states.shape[1], getattr(hook_point, "position", 0)))
        return relative(states)

    patch = StatePatch(*every_step(*ids.shape), fn=relative)
    length = ids.shape[1]
    if grad:
        hooked = forward_and_grads(model, ids, hook, w, d)
        declared = forward_and_grads(model, ids, patch, w, d)
        with rerun_settle(monkeypatch):
            before = len(windows)
            settled = forward_and_grads(model, ids, hook, w, d)
            assert len(windows) - before >= 2 and set(windows[before:]) == {(length, 0)}  # rounds, no window
        assert_same(hooked, declared)
        assert_same(hooked, settled)
    else:
        with torch.no_grad():
            hooked = model.run_with_hooks(ids, fwd_hooks=[(SITE, hook)])
            declared = model.run_with_hooks(ids, fwd_hooks=[(SITE, patch)])
            with rerun_settle(monkeypatch):
                settled = model.run_with_hooks(ids, fwd_hooks=[(SITE, hook)])
        torch.testing.assert_close(hooked, declared, **TOL)
        torch.testing.assert_close(hooked, settled, **TOL)
    # the one pass: the unpatched states, one round, each step alone (its position), a confirming call
    assert windows[:length + 3] == [(length, 0)] * 2 + [(1, t) for t in range(length)] + [(length, 0)]
    assert (hooked[0] if grad else hooked).sub(model(ids)).abs().amax() > 1e-3  # the change acts


@pytest.mark.parametrize("name", ["mamba", "deltanet", "gru"])
def test_a_hook_that_indexes_the_whole_call_falls_back_to_the_reruns(name, monkeypatch):
    """A relative hook written for the whole call (states[:, 2:] scaled: on a window of one step
    at step 3 it changes nothing) fails the window pass's confirming call, so the rounds settle
    it: the same logits as StatePatch(fn) at those steps, and the re-run settle's."""
    model, ids = model64(name), tokens()
    length = ids.shape[1]

    def later_halved(states, hook):
        states = states.clone()
        states[:, 2:] = 0.5 * states[:, 2:]
        return states

    rows = [b for b in range(ids.shape[0]) for _ in range(2, length)]
    times = [t for _ in range(ids.shape[0]) for t in range(2, length)]
    with torch.no_grad():
        hooked = model.run_with_hooks(ids, fwd_hooks=[(SITE, later_halved)])
        declared = model.run_with_hooks(ids, fwd_hooks=[(SITE, StatePatch(rows, times, fn=lambda c: 0.5 * c))])
        with rerun_settle(monkeypatch):
            settled = model.run_with_hooks(ids, fwd_hooks=[(SITE, later_halved)])
    torch.testing.assert_close(hooked, declared, **TOL)
    torch.testing.assert_close(hooked, settled, **TOL)


def test_windows_follow_changes_the_unpatched_run_did_not_show():
    """A hook adding at steps 1 and 4 and flipping the state at step 2 where it is large, which
    only step 1's change makes it: the unpatched states show no change at step 2, so the window
    ending at step 4 is cut where the hook changed it (step 2), and the result equals the
    declared patches (add, flip, add) applied in step order."""
    model, ids = model64("mamba"), tokens()
    shape, batch = model.blocks[0].mixer.state_shape, ids.shape[0]
    kick = torch.full((batch, *shape), 3.0, dtype=torch.float64)
    with torch.no_grad():
        clean = model.run_with_cache(ids, names=[SITE])[1][SITE][:, 2]
        kicked = model.run_with_cache(ids, names=[SITE], fwd_hooks=[(SITE, StatePatch.at(1, deltas=kick))])[1][SITE][:, 2]
    threshold = (float(clean.abs().amax()) + float(kicked.abs().flatten(1).amax(1).amin())) / 2
    assert float(clean.abs().amax()) < threshold < float(kicked.abs().flatten(1).amax(1).amin())
    windows = []

    def hook(states, hook_point):
        first = getattr(hook_point, "position", 0)
        windows.append((first, states.shape[1]))
        states = states.clone()
        for t in range(states.shape[1]):
            if first + t in (1, 4):
                states[:, t] += kick
            if first + t == 2:
                large = states[:, t].flatten(1).abs().amax(1) > threshold
                states[large, t] *= -1.0
        return states

    with torch.no_grad():
        hooked = model.run_with_hooks(ids, fwd_hooks=[(SITE, hook)])
        reference = model.run_with_hooks(ids, fwd_hooks=[(SITE, StatePatch.at(1, deltas=kick)),
                                                        (SITE, StatePatch(list(range(batch)), [2] * batch, fn=lambda c: -c)),
                                                        (SITE, StatePatch.at(4, deltas=kick))])
    length = ids.shape[1]
    assert windows == [(0, length)] * 2 + [(0, 2), (2, 3), (3, 2), (5, 1), (0, length)]  # cut at step 2
    torch.testing.assert_close(hooked, reference, **TOL)
