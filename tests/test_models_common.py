"""Properties every registered model must have: fast == instrumented, causality, state patches."""

import pytest
import torch

import models

VOCAB, B, T = 7, 3, 12
SMALL = dict(vocab_size=VOCAB, d_model=16, n_heads=2, d_state=4, n_layers=2)


def small_model(name: str) -> models.SequenceModel:
    torch.manual_seed(0)
    return models.build(name, **SMALL)


def state_hooks(model) -> list[str]:
    return [n for n in model.hook_names() if n.endswith("hook_state")]


@pytest.fixture
def tokens():
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", models.list_models())
def test_fast_path_equals_instrumented_path(name, tokens):
    model = small_model(name)
    fast = model.set_execution_path("fast")(tokens)
    (grad_fast,) = torch.autograd.grad(fast.square().sum(), model.embed.weight)
    slow = model.set_execution_path("instrumented")(tokens)
    (grad_slow,) = torch.autograd.grad(slow.square().sum(), model.embed.weight)
    torch.testing.assert_close(slow, fast, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad_slow, grad_fast, atol=1e-5, rtol=1e-5)


def converted_copy(name: str, **to) -> models.SequenceModel:
    """small_model(name) with the same weights, moved with .to(**to)."""
    model = models.build(name, **SMALL)
    model.load_state_dict(small_model(name).state_dict())
    return model.to(**to)


@pytest.mark.parametrize("name", models.list_models())
def test_float64_model_computes_in_float64(name, tokens):
    """model.double(): both paths agree to float64 precision, match the float32 model, and every
    activation is float64 (complex128) - no kernel or table silently stays in float32."""
    model = converted_copy(name, dtype=torch.float64)
    with torch.no_grad():
        reference = small_model(name).set_execution_path("fast")(tokens)
        fast = model.set_execution_path("fast")(tokens)
        _, cache = model.set_execution_path("instrumented").run_with_cache(tokens)
    assert fast.dtype == torch.float64
    torch.testing.assert_close(cache["hook_logits"], fast, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(fast.float(), reference, atol=1e-5, rtol=1e-5)
    wrong = {n: v.dtype for n, v in cache.items() if v.dtype not in (torch.float64, torch.complex128)}
    assert not wrong, wrong


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", models.list_models())
def test_cuda_model_matches_cpu(name, tokens):
    """The model on CUDA (Triton kernels where they exist) gives the CPU outputs on both paths."""
    model = converted_copy(name, device="cuda")
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        reference = small_model(name)(tokens)
        for path in ("fast", "instrumented"):
            out = model.set_execution_path(path)(tokens.cuda())
            torch.testing.assert_close(out.cpu(), reference, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", models.list_models())
@pytest.mark.parametrize("path", ["fast", "instrumented"])
def test_causal(name, path, tokens):
    model = small_model(name).set_execution_path(path)
    changed = tokens.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % VOCAB
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(after[:, :7], before[:, :7], atol=1e-6, rtol=1e-6)
    assert (after[:, 7:] - before[:, 7:]).abs().max() > 1e-4


@pytest.mark.parametrize("name", models.list_models())
def test_state_patch_with_own_value_is_a_no_op(name, tokens):
    model = small_model(name)
    names = state_hooks(model)
    if not names:
        pytest.skip(f"{name} has no recurrent state")
    with torch.no_grad():
        clean, cache = model.run_with_cache(tokens, names=names)
        hooks = [(n, lambda s, hook, v=cache[n]: v.clone()) for n in names]
        patched = model.run_with_hooks(tokens, fwd_hooks=hooks)
        # declared (models.StatePatch, on the fast kernels): the cached value, and the identity
        declared = model.run_with_hooks(tokens, fwd_hooks=[(n, models.StatePatch.at(6, values=cache[n][:, 6]))
                                                           for n in names])
        same = model.run_with_hooks(tokens, fwd_hooks=[(n, models.StatePatch([0, 1, 2], [1, 6, 11], fn=lambda s: s))
                                                       for n in names])
    assert torch.equal(patched, clean)
    torch.testing.assert_close(declared, clean, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(same, clean, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", models.list_models())
def test_state_patch_changes_only_later_steps(name, tokens):
    model = small_model(name).set_execution_path("instrumented")
    names = state_hooks(model)
    if not names:
        pytest.skip(f"{name} has no recurrent state")
    t = 5

    def scramble(state, hook):
        state[:, t] = torch.randn_like(state[:, t]) * 3
        return state

    with torch.no_grad():
        clean, cache = model.run_with_cache(tokens, names=names)
        patched, patched_cache = model.run_with_cache(tokens, names=names, fwd_hooks=[(names[0], scramble)])
    assert torch.equal(patched[:, :t], clean[:, :t])
    assert (patched[:, t:] - clean[:, t:]).abs().max() > 1e-4
    first = patched_cache[names[0]]
    # the patched step holds the patched value; later states differ from the clean run's
    assert (first[:, t + 1] - cache[names[0]][:, t + 1]).abs().max() > 1e-5


@pytest.mark.parametrize("name", models.list_models())
def test_state_patch_of_wrong_shape_raises(name, tokens):
    model = small_model(name)
    names = state_hooks(model)
    if not names:
        pytest.skip(f"{name} has no recurrent state")
    with pytest.raises(ValueError, match="shape"):
        model.run_with_hooks(tokens, fwd_hooks=[(names[0], lambda s, hook: s[:, :-1])])


@pytest.mark.parametrize("name", models.list_models())
def test_every_hook_caches_with_batch_first_shape(name, tokens):
    model = small_model(name)
    _, cache = model.run_with_cache(tokens)
    assert set(cache) == set(model.hook_names())
    for hook_name, value in cache.items():
        if hook_name.endswith(("hook_pattern", "hook_attn_scores")):
            assert value.shape[0] == B and value.shape[-2:] == (T, T), hook_name
        else:
            assert value.shape[:2] == (B, T), (hook_name, tuple(value.shape))


def resume_cache(model, tokens):
    """Logits and the activations `resume_from` reads, from one instrumented run."""
    hooks = model.resume_hooks()
    return model.run_with_cache(tokens, names=hooks["resid"] + hooks["carry"])


@pytest.mark.parametrize("path", ["instrumented", "auto"])
@pytest.mark.parametrize("name", models.list_models())
def test_resume_from_cache_equals_the_full_run(name, path, tokens):
    model = small_model(name).set_execution_path(path)  # auto: resumed without hooks = fast_from
    with torch.no_grad():
        full, cache = resume_cache(model, tokens)
        for layer in range(len(model.blocks)):
            for start, end in [(0, T), (1, T), (5, 9), (T - 1, T)]:
                resumed = model.resume_from(cache, torch.tensor([2, 0]), layer, start, end)
                torch.testing.assert_close(resumed, full[[2, 0], start:end], atol=1e-5, rtol=1e-5,
                                           msg=f"layer {layer}, positions [{start}, {end})")


def at_position(t: int, end: int, new_value):
    """A patch writing new_value(act[:, t]) at absolute position t, for full and resumed runs
    alike: a hook tensor with m time steps holds positions end - m, ..., end - 1."""

    def patch(act, hook):
        act = act.clone()
        local = t - (end - act.shape[1])
        act[:, local] = new_value(act[:, local])
        return act

    return patch


@pytest.mark.parametrize("name", models.list_models())
def test_resumed_run_with_a_patch_equals_the_full_patched_run(name, tokens):
    model = small_model(name).set_execution_path("instrumented")
    start, end = 4, 10
    gen = torch.Generator().manual_seed(3)
    names = ["blocks.1.hook_resid_pre", "blocks.1.mixer.hook_in", "blocks.1.mixer.hook_out"]
    names += [n for n in model.hook_names() if n.startswith("blocks.1.mixer.hook_")
              and n.rsplit(".", 1)[1] in ("hook_state", "hook_conv", "hook_q", "hook_k", "hook_v", "hook_gate")]
    with torch.no_grad():
        clean, cache = resume_cache(model, tokens[:, :end])
        for hook_name in names:
            for t in (start, start + 2):
                scale = 1 + torch.rand((), generator=gen).item()
                patch = at_position(t, end, lambda v: v * scale + 0.5)
                full = model.run_with_hooks(tokens[:, :end], fwd_hooks=[(hook_name, patch)])
                with model.hooks([(hook_name, patch)]):
                    resumed = model.resume_from(cache, torch.arange(B), 1, start, end)
                torch.testing.assert_close(resumed, full[:, start:], atol=1e-5, rtol=1e-5,
                                           msg=f"{hook_name} patched at {t}")
                assert (full[:, t:] - clean[:, t:]).abs().max() > 1e-6, f"{hook_name}: the patch changed nothing"


def test_resume_from_names_missing_cache_entries_and_bad_ranges(tokens):
    model = small_model("mamba")
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names=model.resume_hooks()["resid"])
        with pytest.raises(ValueError, match=r"cache lacks \['blocks.0.mixer.hook_state'"):
            model.resume_from(cache, torch.arange(B), 0, 2, T)
        with pytest.raises(ValueError, match="start < end"):
            model.resume_from(cache, torch.arange(B), 0, 5, 5)


class CountedPatch(models.StatePatch):
    """A StatePatch that counts the calls of its hook function (the declared path makes none)."""

    calls = 0

    def __call__(self, states, hook):
        CountedPatch.calls += 1
        return super().__call__(states, hook)


def runs_declared(model, hook_name: str) -> bool:
    """Whether the mixer of hook_name runs StatePatches declared (every RecurrentMixer whose mix
    is the base class's: Based attends over a window in its own mix)."""
    from models.mixers.base import RecurrentMixer

    mixer = model.get_submodule(hook_name.rsplit(".", 1)[0])
    return isinstance(mixer, RecurrentMixer) and type(mixer).mix is RecurrentMixer.mix


def declared_patches(states: torch.Tensor, t: int) -> list[list[models.StatePatch]]:
    """Patch sets for states [B, T, *S]: values at t for every row; deltas at a different step per
    row; two patches, one of them a function, with a row patched at two steps."""
    gen = torch.Generator().manual_seed(2)
    noise = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64).to(states.dtype)  # noqa: E731
    shape = states.shape[2:]
    return [
        [CountedPatch.at(t, values=noise(B, *shape) * 2)],
        [CountedPatch([0, 2, 1], [3, 7, 9], deltas=noise(3, *shape))],
        [CountedPatch([0, 1], [2, -3], deltas=noise(2, *shape)),
         CountedPatch([0, 2, 0], [8, 4, 2], fn=lambda s: 1.5 * s + 0.25)],
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", models.list_models())
def test_declared_state_patch_equals_the_hook_function(name, dtype, tokens):
    """A StatePatch run declared (fast kernels stopped at the patched steps) gives the logits of
    the same patch run as a hook function (pinned and re-scanned), in full and resumed runs; the
    read-out at the patched step and every later one changes, nothing before it."""
    model = converted_copy(name, dtype=dtype)
    names = [n for n in state_hooks(model) if runs_declared(model, n)]
    if not names:
        pytest.skip(f"{name} has no recurrent state that runs StatePatches declared")
    tol = dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=1e-12, rtol=1e-12)
    with torch.no_grad():
        hooks = model.resume_hooks()
        clean, cache = model.run_with_cache(tokens, names=sorted(set(names + hooks["resid"] + hooks["carry"])))
        for hook_name in names:
            for patches in declared_patches(cache[hook_name], 5):
                hooks = [(hook_name, p) for p in patches]
                CountedPatch.calls = 0
                declared = model.run_with_hooks(tokens, fwd_hooks=hooks)
                assert CountedPatch.calls == 0, f"{hook_name}: the patch ran as a hook function"
                with models.instrumented():
                    reference = model.run_with_hooks(tokens, fwd_hooks=hooks)
                torch.testing.assert_close(declared, reference, **tol, msg=f"{hook_name}: {patches}")
                first = min(int(p.times.min()) % T for p in patches)
                torch.testing.assert_close(declared[:, :first], clean[:, :first], **tol)
                assert (declared[:, first] - clean[:, first]).abs().max() > 1e-4, "the read-out at t is the patched one"
            layer = int(hook_name.split(".")[1])
            patch = CountedPatch.at(5 - T, values=cache[hook_name][:, 5] * 2)  # from the end: full and resumed runs
            full = model.run_with_hooks(tokens, fwd_hooks=[(hook_name, patch)])
            with model.hooks([(hook_name, patch)]):
                resumed = model.resume_from(cache, torch.arange(B), layer, 4, T)
            torch.testing.assert_close(resumed, full[:, 4:], **tol)


@pytest.mark.parametrize("name", ["mamba", "mamba2", "deltanet"])
def test_declared_state_patch_under_grad_runs_as_the_hook_function(name, tokens):
    """With a gradient wanted the patch runs declared as pins (RecurrentMixer.pinned_forward: the
    patched step scanned, patched, then one pinned scan differentiating through the kernels; no
    hook-function call), forced instrumented as a hook function: the same gradient."""
    model = small_model(name)
    hook_name = state_hooks(model)[-1]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names=[hook_name])
    grads = []
    for forced in (False, True):
        CountedPatch.calls = 0
        with models.instrumented(forced):
            logits = model.run_with_hooks(tokens, fwd_hooks=[(hook_name, CountedPatch.at(4, deltas=cache[hook_name][:, 4]))])
        assert CountedPatch.calls == int(forced)
        grads.append(torch.autograd.grad(logits[:, 4:].square().sum(), model.embed.weight)[0])
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-5)  # as fast vs instrumented


def hook_function_patches(t: int):
    """Hook functions on hook_state [B, T, *S]: in place at one step for every row; a new tensor
    changing rows at different steps (one row at two: pinned in step order, models.hooks.state.
    causal_pins); an in-place change returned as a copy; every step of one row (step order);
    each row at its own step (more distinct steps than max_hooked_steps: the pinned re-run)."""

    def in_place(states, hook):
        states[:, t] = 2 * states[:, t] + 0.5

    def new_tensor(states, hook):
        out = states.clone()
        out[0, 2], out[2, 8], out[0, 9] = 0.25, -out[2, 8], 3 * out[0, 9]
        return out

    def in_place_then_new(states, hook):  # the copy returned holds the in-place change
        states[2, t + 1] = 0.75
        return states.clone()

    def every_step(states, hook):
        states[1] += 0.125
        return states

    def staggered(states, hook):
        for row in range(states.shape[0]):
            states[row, t + row] *= -1

    return [in_place, new_tensor, in_place_then_new, every_step, staggered]


@pytest.mark.parametrize("name", models.list_models())
def test_hook_function_state_patch_runs_on_the_fast_kernels(name, tokens, monkeypatch):
    """A hook function on hook_state with no gradient wanted runs as the declared plan of what it
    changed (RecurrentMixer.hooked_forward: declared_forward on the fast kernels, no pinned
    re-run) where it changed each row at one step and at most max_hooked_steps steps, else as
    the pinned re-run (where a row changed at several steps, in rounds until the hook gives
    back what was pinned, models.hooks.state.causal_pins: more than one call): the logits equal
    the instrumented path's (scan_with_state_hook) in float64, in full and resumed runs, and
    the hook's first call sees the unpatched states."""
    from models.mixers.base import RecurrentMixer

    model = converted_copy(name, dtype=torch.float64)
    names = [n for n in state_hooks(model) if runs_declared(model, n)]
    if not names:
        pytest.skip(f"{name} has no recurrent state that runs StatePatches declared")
    declared_calls = []
    original = RecurrentMixer.declared_forward
    monkeypatch.setattr(RecurrentMixer, "max_hooked_steps", 2)  # staggered changes 3 steps, each row at one
    monkeypatch.setattr(RecurrentMixer, "declared_forward",
                        lambda self, *a, **k: declared_calls.append(1) or original(self, *a, **k))
    with torch.no_grad():
        hooks = model.resume_hooks()
        _, cache = model.run_with_cache(tokens, names=sorted(set(names + hooks["resid"] + hooks["carry"])))
        for hook_name in names:
            for fn in hook_function_patches(5):
                seen = []
                counted = lambda s, hook, fn=fn: seen.append(s.clone()) or fn(s, hook)  # noqa: E731
                declared_calls.clear()
                patched = model.run_with_hooks(tokens, fwd_hooks=[(hook_name, counted)])
                several = fn.__name__ in ("new_tensor", "every_step")  # a row changed at several steps
                assert (len(seen) > 1) == several, f"{fn.__name__}: {len(seen)} calls"
                torch.testing.assert_close(seen[0], cache[hook_name], atol=1e-12, rtol=1e-12)  # the unpatched states
                assert len(declared_calls) == (fn.__name__ in ("in_place", "in_place_then_new")), f"{hook_name}: {fn.__name__}"
                with models.instrumented():
                    reference = model.run_with_hooks(tokens, fwd_hooks=[(hook_name, fn)])
                torch.testing.assert_close(patched, reference, atol=1e-12, rtol=1e-12, msg=f"{hook_name}: {fn.__name__}")
            layer = int(hook_name.split(".")[1])
            shifted = lambda s, hook: s.index_add_(1, torch.tensor([s.shape[1] - 3]), torch.ones_like(s[:, :1]))  # noqa: E731
            full = model.run_with_hooks(tokens, fwd_hooks=[(hook_name, shifted)])
            with model.hooks([(hook_name, shifted)]):
                resumed = model.resume_from(cache, torch.arange(B), layer, 4, T)
            torch.testing.assert_close(resumed, full[:, 4:], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
def test_unpatched_states_recomputed_in_blocks_are_bit_equal(name, tokens):
    """The native states scan resumed from each block's last state gives the whole scan's states
    bit for bit (DiagonalScanMixer.unpatched_blocks, with one-step and three-step blocks), so a
    hook function's unchanged steps are never pinned."""
    for dtype in (torch.float32, torch.float64):
        mixer = converted_copy(name, dtype=dtype).blocks[1].mixer
        with torch.no_grad():
            inputs = mixer.prepare(torch.randn(B, T, SMALL["d_model"], dtype=dtype))
            states = mixer.scan(inputs)[1]
            step_bytes = states[:, :1].numel() * states.element_size()
            for span in (1, 3):
                mixer.unpatched_block_bytes = span * step_bytes
                blocks = list(mixer.unpatched_blocks(inputs, None, states)())
                assert len(blocks) == -(-T // span)
                assert all(torch.equal(states[:, lo:lo + b.shape[1]], b) for lo, b in blocks)


@pytest.mark.parametrize("per_step", [(3, 4), (16, 32, 32)])  # 48 B and 64 kB per (example, step)
def test_changed_steps_marks_exactly_the_changed_states(per_step):
    """models.hooks.state.changed_steps (small states compared at once, large ones one (example, step)
    at a time): a changed value, a NaN where there was none and a -0.0 for 0.0 (equal) at known
    places, over blocks of the unpatched states; None when nothing changed."""
    from models.hooks.state import changed_steps

    before = torch.randn(2, 7, *per_step, generator=torch.Generator().manual_seed(3))
    before[1, 5].view(-1)[0] = 0.0
    after = before.clone()
    after[0, 2].view(-1)[-1] += 1e-6
    after[1, 6].view(-1)[3] = float("nan")
    after[1, 5].view(-1)[0] = -0.0
    blocks = [(0, before[:, :3]), (3, before[:, 3:])]
    expected = torch.zeros(2, 7, dtype=torch.bool)
    expected[0, 2] = expected[1, 6] = True
    assert torch.equal(changed_steps(after, iter(blocks), len(per_step)), expected)
    assert changed_steps(before.clone(), iter(blocks), len(per_step)) is None
    with pytest.raises(ValueError, match="must keep the shape"):
        changed_steps(after[:, :, :1], iter(blocks), len(per_step))
