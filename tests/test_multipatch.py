"""Several state patches on one row mean one thing on every path: a later patch applies to the
state as the earlier ones left it (the causal reading). The reference builds that reading from
absolute (`values`) patches only, one step at a time: the state each later patch sees is read
from a run carrying the earlier patches' values. The full forward (declared on the fast kernels,
as hook functions, on the instrumented path) and `generate` (patches at prompt and generated
steps, in different decoding calls) must all equal it, in float64, on every decoding kind."""

import pytest
import torch

import models
from models import StatePatch
from models.decoding.step import advance

VOCAB, T, NEW = 7, 5, 5
SMALL = dict(vocab_size=VOCAB, d_model=16, n_heads=2, d_state=4, n_layers=2)
TOL = dict(atol=1e-10, rtol=1e-10)
# decoding kinds: selective and diagonal scans (Mamba, Mamba-2, S4D, a linear RNN, H3), delta rules
# (DeltaNet, Gated DeltaNet, KDA), RWKV-7, a short-conv window as the state (LFM2), Based (linear
# attention, pinned rather than declared), a window of mixer inputs (Mamba-3), a nonlinear RNN, a hybrid
RECURRENT = ["mamba", "mamba2", "s4d", "linear_rnn", "h3", "deltanet", "gated_deltanet", "kda", "rwkv7", "lfm2_conv",
             "based", "mamba3", "gru", "mamba_attention"]
STEP_PAIRS = {"prompt+prompt": (1, 3), "prompt+generated": (2, T + 1), "generated+generated": (T, T + 2)}
ROWS = {"one row": [0], "several rows": [0, 2]}
MODES = ["values", "deltas", "fn", "hook function"]


def model64(name: str) -> models.SequenceModel:
    torch.manual_seed(0)
    return models.build(name, **SMALL).eval().double()


def prompt(batch=3):
    return torch.randint(0, VOCAB, (batch, T), generator=torch.Generator().manual_seed(1))


def site(model) -> str:
    return "blocks.0.mixer.hook_state"


def state_like(model, n: int, seed: int) -> torch.Tensor:
    """n random states [n, *S] of layer 0 in its dtype (complex for the rotating states of Mamba-3
    and S4D)."""
    with torch.no_grad():
        dtype = advance(model, prompt(1))[1].layers[0]["state"].dtype
    shape, generator = (n, *model.blocks[0].mixer.state_shape), torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=generator, dtype=torch.float64)
    if dtype.is_complex:
        values = torch.complex(values, torch.randn(shape, generator=generator, dtype=torch.float64))
    return values


def affine(current: torch.Tensor) -> torch.Tensor:  # the "fn" patch: a map of the state there
    return 0.6 * current + 0.25


def entries(rows: list[int], steps: tuple[int, int]) -> tuple[list[int], list[int]]:
    """Every row at both steps: rows [M], times [M] with M = 2 len(rows), the earlier step first."""
    return [r for t in steps for r in rows], [t for t in steps for _ in rows]


def adding_hook(rows, times, deltas):
    """A hook function adding deltas[i] to row rows[i]'s state at absolute step times[i]
    (hook.position: the first step a decoding call sees)."""
    def hook(states, hook):
        first = getattr(hook, "position", 0)
        states = states.clone()
        for i, (row, time) in enumerate(zip(rows, times)):
            if 0 <= time - first < states.shape[1]:
                states[row, time - first] += deltas[i]
        return states
    return hook


def patch_hooks(model, mode: str, rows, times, payload, split: bool = False) -> list[tuple]:
    """fwd_hooks patching rows[i] at times[i]: one StatePatch (or one per step when split), or
    the hook function adding payload."""
    if mode == "hook function":
        return [(site(model), adding_hook(rows, times, payload))]
    kind = {"fn": affine} if mode == "fn" else {mode: payload}
    if not split:
        return [(site(model), StatePatch(rows, times, **kind))]
    half = len(rows) // 2
    pieces = [slice(0, half), slice(half, None)]
    return [(site(model), StatePatch(rows[p], times[p], **({"fn": affine} if mode == "fn" else {mode: payload[p]})))
            for p in pieces]


def causal_reference(model, tokens, mode: str, rows, times, payload, extra=()) -> torch.Tensor:
    """Logits [B, L, V] of the causal reading built from values patches only: step by step, the
    state a patch sees is read from a run with the earlier steps' values, its value computed
    from that, and the last run carries every value (extra: other hooks on every run)."""
    found: list[tuple[int, int, torch.Tensor]] = []  # (row, time, value)
    for step in sorted(set(times)):
        hooks = values_hooks(model, found) + list(extra)
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names=[site(model)], fwd_hooks=hooks)
        for i, (row, time) in enumerate(zip(rows, times)):
            if time == step:
                before = cache[site(model)][row, time]
                after = payload[i] if mode == "values" else affine(before) if mode == "fn" else before + payload[i]
                found.append((row, time, after))
    with torch.no_grad():
        return model.run_with_hooks(tokens, fwd_hooks=values_hooks(model, found) + list(extra))


def values_hooks(model, found) -> list[tuple]:
    if not found:
        return []
    return [(site(model), StatePatch([r for r, _, _ in found], [t for _, t, _ in found],
                                     values=torch.stack([v for _, _, v in found])))]


def generated_logits(model, tokens, hooks) -> tuple[torch.Tensor, torch.Tensor]:
    """(the final sequence [B, T + NEW], generate's logits at every position run [B, T + NEW - 1, V])."""
    out, cache = model.generate(tokens, NEW, fwd_hooks=hooks, cache_names=["hook_logits"], progress=False)
    return out, cache["hook_logits"]


def payload_for(model, mode: str, n: int) -> torch.Tensor | None:
    if mode == "fn":
        return None
    return state_like(model, n, seed=11) * (1.0 if mode == "values" else 3.0)


@pytest.mark.parametrize("rows", ROWS.values(), ids=list(ROWS))
@pytest.mark.parametrize("steps", STEP_PAIRS.values(), ids=list(STEP_PAIRS))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", RECURRENT)
def test_generate_and_the_full_forward_apply_several_patches_causally(name, mode, steps, rows):
    model = model64(name)
    rows, times = entries(rows, steps)
    payload = payload_for(model, mode, len(rows))
    hooks = patch_hooks(model, mode, rows, times, payload)
    out, logits = generated_logits(model, prompt(), hooks)
    tokens = out[:, :-1]
    reference = causal_reference(model, tokens, mode, rows, times, payload)
    with torch.no_grad():  # the full forward, declared on the fast kernels where it can
        torch.testing.assert_close(model.run_with_hooks(tokens, fwd_hooks=hooks), reference, **TOL)
    torch.testing.assert_close(logits, reference, **TOL)
    assert torch.equal(out[:, T:], reference[:, T - 1:].argmax(-1))  # the tokens are the reference's argmax
    clean = model(tokens)
    assert (reference[rows, steps[1]:] - clean[rows, steps[1]:]).abs().amax() > 1e-3  # the patches act


@pytest.mark.parametrize("mode", ["deltas", "fn", "hook function"])
@pytest.mark.parametrize("name", ["mamba", "deltanet", "rwkv7", "gru", "mamba_attention"])
def test_every_full_forward_path_reads_several_patches_causally(name, mode):
    """Declared (no grad), as hook functions under grad (scan_with_state_hook's pinned re-runs),
    forced instrumented, and two StatePatches one per step: the same logits."""
    model = model64(name)
    rows, times = entries([0, 1], STEP_PAIRS["prompt+prompt"])
    payload = payload_for(model, mode, len(rows))
    tokens = prompt()
    reference = causal_reference(model, tokens, mode, rows, times, payload)
    hooks = patch_hooks(model, mode, rows, times, payload)
    torch.testing.assert_close(model.run_with_hooks(tokens, fwd_hooks=hooks).detach(), reference, **TOL)  # grad on
    if mode != "hook function":
        with torch.no_grad():
            split = patch_hooks(model, mode, rows, times, payload, split=True)
            torch.testing.assert_close(model.run_with_hooks(tokens, fwd_hooks=split), reference, **TOL)
    model.set_execution_path("instrumented")
    with torch.no_grad():
        torch.testing.assert_close(model.run_with_hooks(tokens, fwd_hooks=hooks), reference, **TOL)


@pytest.mark.parametrize("steps", STEP_PAIRS.values(), ids=list(STEP_PAIRS))
@pytest.mark.parametrize("name", ["mamba", "mamba2", "gated_deltanet", "rwkv7"])
def test_a_patch_with_the_state_its_step_reaches_is_a_no_op(name, steps):
    """After a first patch, a values patch with the state the run then reaches at the later step
    (read from the run with the first patch) changes nothing, in the full forward and generate."""
    model = model64(name)
    first = StatePatch([0, 2], [steps[0]] * 2, deltas=state_like(model, 2, seed=5) * 3)
    out, logits = generated_logits(model, prompt(), [(site(model), first)])
    tokens = out[:, :-1]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names=[site(model)], fwd_hooks=[(site(model), first)])
    own = StatePatch([0, 2], [steps[1]] * 2, values=cache[site(model)][[0, 2], steps[1]])
    both = [(site(model), first), (site(model), own)]
    with torch.no_grad():
        torch.testing.assert_close(model.run_with_hooks(tokens, fwd_hooks=both), logits, **TOL)
    _, again = generated_logits(model, prompt(), both)
    torch.testing.assert_close(again, logits, **TOL)


def test_absolute_patches_at_prompt_and_generated_steps_match_in_both_paths():
    """Two values patches per row (a prompt and a generated step) on Mamba-2: generate equals
    the full forward, and the state at each patched step is the value set."""
    model = model64("mamba2")
    rows, times = entries([0, 1, 2], STEP_PAIRS["prompt+generated"])
    values = state_like(model, len(rows), seed=3)
    hooks = [(site(model), StatePatch(rows, times, values=values))]
    out, logits = generated_logits(model, prompt(), hooks)
    with torch.no_grad():
        full, cache = model.run_with_cache(out[:, :-1], names=[site(model)], fwd_hooks=hooks)
    torch.testing.assert_close(logits, full, **TOL)
    torch.testing.assert_close(cache[site(model)][rows, times], values, atol=0, rtol=0)


@pytest.mark.parametrize("hook_name", ["blocks.0.mixer.hook_k", "blocks.0.mixer.hook_v", "blocks.1.hook_resid_mid"])
@pytest.mark.parametrize("steps", STEP_PAIRS.values(), ids=list(STEP_PAIRS))
@pytest.mark.parametrize("name", ["transformer", "mamba_attention"])
def test_attention_cache_patches_at_two_steps_match_the_full_forward(name, steps, hook_name):
    """Relative hook functions at two steps on attention's keys / values (the KV cache) or the
    residual: generate's logits equal the full forward's."""
    model = model64(name)
    if hook_name.startswith("blocks.0.mixer") and name == "mamba_attention":
        hook_name = hook_name.replace("blocks.0", "blocks.1")
    rows, times = entries([0, 2], steps)
    probe = model.run_with_cache(prompt(), names=[hook_name])[1][hook_name]
    deltas = torch.randn(len(rows), *probe.shape[2:], generator=torch.Generator().manual_seed(2),
                         dtype=torch.float64) * 3
    hooks = [(hook_name, adding_hook(rows, times, deltas))]
    out, logits = generated_logits(model, prompt(), hooks)
    with torch.no_grad():
        full = model.run_with_hooks(out[:, :-1], fwd_hooks=hooks)
    torch.testing.assert_close(logits, full, **TOL)
    assert (full - model(out[:, :-1])).abs().amax() > 1e-3


@pytest.mark.parametrize("name", ["mamba", "deltanet", "gru"])
def test_gradients_through_several_patches_match_finite_differences(name):
    """Under grad, a hook function adding leaf deltas at two steps of one row (pinned in step
    order, the re-run taking the hook's shift): d metric / d deltas equals central finite
    differences of the same forward along random directions."""
    model = model64(name)
    rows, times = entries([0], STEP_PAIRS["prompt+prompt"])
    deltas = (state_like(model, len(rows), seed=9) * 2).requires_grad_(True)
    tokens = prompt()

    def metric(d):
        logits = model.run_with_hooks(tokens, fwd_hooks=[(site(model), adding_hook(rows, times, d))])
        return logits[0, times[1]:].pow(2).sum()

    (grad,) = torch.autograd.grad(metric(deltas), deltas)
    for seed in range(2):
        direction = torch.randn(deltas.shape, generator=torch.Generator().manual_seed(seed), dtype=deltas.dtype)
        eps = 1e-6
        with torch.no_grad():
            numeric = (metric(deltas + eps * direction) - metric(deltas - eps * direction)) / (2 * eps)
        torch.testing.assert_close((grad * direction).sum(), numeric, atol=1e-6, rtol=1e-6)


def test_several_patches_with_a_gate_patch_apply_in_step_order():
    """A GRU with its gates patched (hook_gate) and a hook function adding at two steps of its
    state: the pins are found one step a round (models.hooks.state.in_step_order), equal to the
    reference."""
    model = model64("gru")
    gate = ("blocks.0.mixer.hook_gate", lambda gates, hook: gates * 0.5)
    rows, times = entries([0, 2], STEP_PAIRS["prompt+prompt"])
    payload = payload_for(model, "deltas", len(rows))
    tokens = prompt()
    reference = causal_reference(model, tokens, "deltas", rows, times, payload, extra=[gate])
    with torch.no_grad():
        patched = model.run_with_hooks(tokens, fwd_hooks=[gate, (site(model), adding_hook(rows, times, payload))])
    torch.testing.assert_close(patched, reference, **TOL)


@pytest.mark.parametrize("grad", [False, True])
def test_a_hook_setting_every_step_settles_in_one_round(grad):
    """A hook function zeroing a row's state at every step (it sets states) is called twice: on
    the unpatched states, then once on the re-run. One scaling them (relative) does not settle
    so: it is then called on each step alone, a window a step scanned from the state the
    earlier changes left (hook.position: the step), and once more on every state to confirm
    (models.hooks.state.in_windows): T + 3 calls, not a re-run a step. Both equal the reference."""
    model = model64("mamba")
    tokens = prompt()
    length = tokens.shape[1]
    calls = []

    def zeroing(states, hook):
        calls.append((states.shape[1], getattr(hook, "position", 0)))
        states = states.clone()
        states[1] = 0
        return states

    def scaling(states, hook):
        calls.append((states.shape[1], getattr(hook, "position", 0)))
        states = states.clone()
        states[1] *= 0.5
        return states

    with torch.set_grad_enabled(grad):
        zeroed = model.run_with_hooks(tokens, fwd_hooks=[(site(model), zeroing)]).detach()
        assert calls == [(length, 0)] * 2
        calls.clear()
        scaled = model.run_with_hooks(tokens, fwd_hooks=[(site(model), scaling)]).detach()
        assert calls == [(length, 0)] * 2 + [(1, t) for t in range(length)] + [(length, 0)]
    zeros = torch.zeros(length, *model.blocks[0].mixer.state_shape, dtype=torch.float64)
    with torch.no_grad():
        every = StatePatch([1] * length, list(range(length)), values=zeros)
        torch.testing.assert_close(zeroed, model.run_with_hooks(tokens, fwd_hooks=[(site(model), every)]), **TOL)
        halved = StatePatch([1] * length, list(range(length)), fn=lambda current: 0.5 * current)
        torch.testing.assert_close(scaled, model.run_with_hooks(tokens, fwd_hooks=[(site(model), halved)]), **TOL)


def test_an_interchange_state_site_over_every_position_applies_in_step_order():
    """interventions: a hook_state site at every position with a subspace (a change relative to
    the state at each step of a row) patches in step order: declared (resumed passes) and as a
    hook function under models.instrumented() (whole passes) both equal the causal reference
    built from values patches one step at a time."""
    from interp.analysis.interventions import Site, corrupt_ar, interchange
    from interp.analysis.interventions.sites import answer_positions
    from tests.test_interventions import TASK, VOCAB, ar_batch

    torch.manual_seed(0)
    model = models.build("mamba", vocab_size=VOCAB, d_model=16, n_layers=2).eval().double()
    clean = ar_batch(6, 3, seed=0)
    corrupt = corrupt_ar(clean, TASK, seed=1)
    shape = model.blocks[0].mixer.state_shape
    basis = torch.linalg.qr(torch.randn(shape[0] * shape[1], 4, generator=torch.Generator().manual_seed(3),
                                        dtype=torch.float64))[0]  # [d, 4]
    state_site = Site(site(model), None, subspace=basis)
    with torch.no_grad():
        source = model.run_with_cache(clean.tokens, names=[state_site.hook])[1][state_site.hook]  # [N, T, *S]
    rows, length = torch.arange(len(clean)), clean.tokens.shape[1]
    found = []
    for step in range(length):  # each step's state from the run carrying the earlier steps' values
        with torch.no_grad():
            before = model.run_with_cache(corrupt.tokens, names=[state_site.hook], fwd_hooks=values_hooks(model, found))[1]
        now = before[state_site.hook][:, step]  # [N, *S]
        moved = ((source[:, step] - now).flatten(1) @ basis @ basis.T).reshape(now.shape)
        found += [(int(row), step, now[row] + moved[row]) for row in rows]
    with torch.no_grad():
        logits = model.run_with_hooks(corrupt.tokens, fwd_hooks=values_hooks(model, found))
    answer = answer_positions(clean)
    reference = logits[rows, answer].softmax(-1)[rows, clean.targets[rows, answer]]
    for resume in (True, False):
        result = interchange(model, clean, corrupt, [state_site], min_effect=0.0, resume=resume, progress=False)
        torch.testing.assert_close(result.p_patched[0].double(), reference, atol=1e-9, rtol=1e-9)


def test_fn_is_called_once_a_step_with_that_steps_entries():
    """fn sees each patched step's entries in their order (with_index: their places in rows /
    times), declared and as a hook function; the result equals deltas given per entry."""
    model = model64("mamba2")
    rows, times = [2, 0, 0, 2], [3, 1, 3, 1]
    deltas = state_like(model, 4, seed=4)
    seen = []

    def fn(current, index):
        seen.append(index.tolist())
        return current + deltas[index]

    tokens = prompt()
    with torch.no_grad():
        declared = model.run_with_hooks(tokens, fwd_hooks=[(site(model), StatePatch(rows, times, fn=fn, with_index=True))])
        assert seen == [[1, 3], [0, 2]]  # step 1: entries 1 and 3; step 3: entries 0 and 2
        expected = model.run_with_hooks(tokens, fwd_hooks=[(site(model), StatePatch(rows, times, deltas=deltas))])
    torch.testing.assert_close(declared, expected, **TOL)
    seen.clear()
    hooked = model.run_with_hooks(tokens, fwd_hooks=[(site(model), StatePatch(rows, times, fn=fn, with_index=True))])
    assert seen[:2] == [[1, 3], [0, 2]]  # the first call on the unpatched states; the rounds after it alike
    torch.testing.assert_close(hooked.detach(), expected, **TOL)
