"""Head / channel selection in run_with_cache (heads=...): which axis each hook's heads are on, the
selected cache equal to the full cache indexed on that axis (in memory, streamed to disk and
reopened, with positions), planned bytes equal to the cached bytes, the refusal counting the
selection, the checks on the argument, and the Cache analyses on a cache with some heads."""

import pytest
import torch
from test_cache_store import B, T, build, tokens  # noqa: F401  (tokens: the fixture)

from models import Cache
from models.memory import MemoryRefused


def head_axes(model, tokens) -> dict[str, tuple[int, int, str]]:
    """{hook: (axis, size, unit)} of every hook with a head axis, from the plan."""
    plan = model.cache_plan(tokens)
    return {n: (l.head_axis, l.n_heads, l.head_unit) for n, l in plan.layouts.items() if l.head_axis is not None}


def test_which_hooks_have_a_head_axis(tokens):
    """The axis is the one the hook grammar names: [B, T, H, ...], [B, H, T, T], a per-head state
    [B, T, H, ...], a per-channel state [B, T, E, N]; LSTM's [B, T, 2, H] (h, c) and gates have none."""
    suffixes = lambda axes, l: {n.removeprefix(f"blocks.{l}.mixer."): v for n, v in axes.items()  # noqa: E731
                                if n.startswith(f"blocks.{l}.")}
    attention = suffixes(head_axes(build("transformer"), tokens), 0)
    assert attention == {**{h: (2, 4, "heads") for h in ("hook_q", "hook_k", "hook_v", "hook_z", "hook_result")},
                         "hook_attn_scores": (1, 4, "heads"), "hook_pattern": (1, 4, "heads")}
    mamba = suffixes(head_axes(build("mamba"), tokens), 1)
    assert mamba == {"hook_state": (2, 128, "channels")}  # d_inner = 2 * 64 channels, each a [N] state
    mamba2 = suffixes(head_axes(build("mamba2"), tokens), 0)
    assert mamba2 == {"hook_state": (2, 4, "heads"), "hook_z": (2, 4, "heads"), "hook_result": (2, 4, "heads")}
    delta = suffixes(head_axes(build("gated_deltanet"), tokens), 0)
    assert set(delta) == {"hook_q", "hook_k", "hook_v", "hook_z", "hook_result", "hook_beta", "hook_state"}
    assert delta["hook_state"] == (2, 4, "heads") and delta["hook_beta"] == (2, 4, "heads")
    assert head_axes(build("lstm"), tokens) == {} and head_axes(build("gru"), tokens) == {}
    hybrid = head_axes(build("mamba_attention"), tokens)
    assert hybrid["blocks.0.mixer.hook_state"] == (2, 128, "channels")
    assert hybrid["blocks.1.mixer.hook_pattern"] == (1, 4, "heads")


@pytest.mark.parametrize("name", ["transformer", "mamba", "mamba2", "deltanet", "gated_deltanet", "mamba_attention"])
def test_heads_equal_indexing_the_full_cache_in_memory_and_on_disk(name, tokens, tmp_path):
    model = build(name, mlp=True)
    chosen = [-1, 1]
    with torch.no_grad():
        logits, full = model.run_with_cache(tokens)
        kept_logits, kept = model.run_with_cache(tokens, heads=chosen)
        model.run_with_cache(tokens, heads=chosen, to_disk=tmp_path / "c")
    reopened = Cache.open(tmp_path / "c", model)
    plan = model.cache_plan(tokens, heads=chosen)
    axes = head_axes(model, tokens)
    assert axes and torch.equal(kept_logits, logits)
    assert kept.heads == reopened.heads == {n: [size - 1, 1] for n, (_, size, _) in axes.items()}
    for hook, value in full.items():
        expected = value
        if hook in axes:
            axis, size, _ = axes[hook]
            expected = value.index_select(axis, torch.tensor([size - 1, 1]))
        for cache in (kept, reopened):
            assert torch.equal(cache[hook], expected), hook
        assert plan.shape(hook) == tuple(kept[hook].shape) and plan.entries[hook] == kept[hook].nbytes, hook
    assert plan.total == sum(v.nbytes for v in kept.values()) == reopened._store.nbytes()
    assert plan.total < model.cache_plan(tokens).total


@pytest.mark.parametrize("name", ["mamba", "mamba2", "deltanet"])
def test_heads_with_positions_from_the_fast_kernels_and_on_disk(name, tokens, tmp_path, monkeypatch):
    """hook_state read at some positions is formed by the fast kernels at those steps only; the
    head selection then applies to what they emit."""
    model = build(name)
    state = "blocks.1.mixer.hook_state"
    names = [state, "blocks.0.mixer.hook_state"]
    with torch.no_grad():
        _, full = model.run_with_cache(tokens, names)
        for block in model.blocks:  # the per-step path must not run
            monkeypatch.setattr(block.mixer, "instrumented_forward", None)
        kwargs = dict(positions=[5, -1], heads={state: [2, -1]})
        _, kept = model.run_with_cache(tokens, names, **kwargs)
        _, disk = model.run_with_cache(tokens, names, to_disk=tmp_path / "c", **kwargs)
    size = full[state].shape[2]
    expected = full[state][:, [5, T - 1]][:, :, [2, size - 1]]
    for cache in (kept, disk, Cache.open(tmp_path / "c")):
        torch.testing.assert_close(cache[state], expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(cache[names[1]], full[names[1]][:, [5, T - 1]], rtol=0, atol=1e-12)
        assert cache.heads == {state: [2, size - 1]} and cache.positions[state] == [5, T - 1]
    assert model.cache_plan(tokens, names, **kwargs).entries == {n: v.nbytes for n, v in kept.items()}


def test_refusal_counts_the_selection(tokens, tmp_path):
    """A selection that fits is not refused where the full hooks would be, in memory and streamed."""
    model = build("mamba2")
    names = lambda n: n.endswith("hook_state")  # noqa: E731
    full, one = model.cache_plan(tokens, names), model.cache_plan(tokens, names, heads=[0])
    assert one.total * 4 == full.total  # 1 of 4 heads
    with pytest.raises(MemoryRefused, match="heads=") as refused:
        model.run_with_cache(tokens, names, max_memory=one.total)
    assert "\n" not in str(refused.value)
    _, cache = model.run_with_cache(tokens, names, heads=[0], max_memory=one.total)
    assert sum(v.nbytes for v in cache.values()) == one.total
    with pytest.raises(MemoryRefused, match="one activation at a time"):
        model.run_with_cache(tokens, names, to_disk=tmp_path / "a", max_memory=one.largest_entry)
    model.run_with_cache(tokens, names, heads=[0], to_disk=tmp_path / "b", max_memory=one.largest_entry)
    assert Cache.open(tmp_path / "b")._store.nbytes() == one.total


def test_heads_with_gradients(tokens):
    model = build("transformer")
    names = ["blocks.0.mixer.hook_q", "blocks.1.mixer.hook_pattern"]
    metric = lambda logits: logits[:, -1, 0].sum()  # noqa: E731
    _, full = model.run_with_cache(tokens, names, incl_bwd=True, metric=metric)
    _, kept = model.run_with_cache(tokens, names, incl_bwd=True, metric=metric, heads=[3])
    assert torch.equal(kept[names[0] + "_grad"], full[names[0] + "_grad"][:, :, [3]])
    assert torch.equal(kept[names[1] + "_grad"], full[names[1] + "_grad"][:, [3]])
    assert {n: v.nbytes for n, v in kept.items()} == model.cache_plan(tokens, names, heads=[3], incl_bwd=True).entries


def test_head_results_keep_the_model_head_labels_and_still_sum_to_the_residual(tokens):
    model = build("transformer", mlp=True)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, heads={"blocks.0.mixer.hook_result": [3, 1]})
    stack, labels = cache.stack_head_results(1, return_labels=True)
    assert labels == ["L0H3", "L0H1"]
    parts, labels = cache.get_full_resid_decomposition(expand_neurons=False, return_labels=True, layout="ours")
    assert labels[:5] == ["embed", "L0H3", "L0H1", "0_mixer_rest", "0_mlp_out"] and "1_mixer_bias" in labels
    torch.testing.assert_close(parts.sum(0), cache["blocks.1.hook_resid_post"], rtol=0, atol=1e-12)
    parts, labels = cache.get_full_resid_decomposition(expand_neurons=False, return_labels=True)  # TL's order
    assert labels[:2] == ["L0H3", "L0H1"] and labels[-5:] == ["0_mlp_out", "1_mlp_out", "embed", "pos_embed", "rest"]
    torch.testing.assert_close(parts.sum(0), cache["blocks.1.hook_resid_post"], rtol=0, atol=1e-12)


def test_heads_are_checked(tokens):
    model = build("mamba2")
    state = "blocks.0.mixer.hook_state"
    for bad, error, words in [
        ([4], ValueError, ["heads", "[-4, 4)", "got [4]"]),
        ([-5, 0], ValueError, ["heads", "[-4, 4)", "got [-5]"]),
        ({state: [128]}, ValueError, [f"heads[{state!r}]", "[-4, 4)", "128"]),
        ([0, -4], ValueError, ["heads", "once"]),
        ([], TypeError, ["heads", "nonempty"]),
        ([0.5], TypeError, ["heads"]),
        (torch.tensor([[0]]), TypeError, ["heads", "1-D"]),
        ({"hook_embed": [0]}, ValueError, ["'hook_embed'", "no head or channel axis"]),
        ({"blocks.0.mixer.hook_dt": [0]}, ValueError, ["'blocks.0.mixer.hook_dt'", "no head or channel axis"]),
        ({"nope": [0]}, ValueError, ["'nope'", "not a cached hook"]),
    ]:
        with pytest.raises(error) as raised:
            model.run_with_cache(tokens, heads=bad)
        assert all(word in str(raised.value) for word in words), (bad, str(raised.value))
    with pytest.raises(ValueError, match="none of the cached hooks has a head"):
        model.run_with_cache(tokens, ["hook_embed", "blocks.0.hook_resid_pre"], heads=[0])
    _, cache = model.run_with_cache(tokens, [state], heads=torch.tensor([-1, 0]))  # negative like Python
    assert cache.heads == {state: [3, 0]} and cache[state].shape == (B, T, 2, 32, 16)


@pytest.mark.parametrize("name", ["mamba", "mamba2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mamba_forms_the_selected_heads_states_only(name, dtype, tokens, monkeypatch):
    """Mamba's channels and Mamba-2's heads recur apart, so heads=[...] on hook_state scans those
    only (RecurrentMixer.head_states: the per-step path, which forms every state, never runs);
    the cache equals the full states indexed, bit for bit, with and without positions, and the
    logits are the plain forward's."""
    from models.mixers.base import RecurrentMixer

    model = build(name).to(dtype)
    states = [n for n in model.hook_names() if n.endswith("hook_state")]
    heads = [0, 2] if name == "mamba2" else [1, 17, -1]
    with torch.no_grad():
        plain = model(tokens)
        _, full = model.run_with_cache(tokens, names=states)

        def forbidden(*args, **kwargs):
            raise AssertionError("every state was formed")

        monkeypatch.setattr(RecurrentMixer, "instrumented_forward", forbidden)
        monkeypatch.setattr(RecurrentMixer, "selected_forward", forbidden)
        for positions in (None, [0, T - 1]):
            logits, cache = model.run_with_cache(tokens, names=states, heads=heads, positions=positions)
            torch.testing.assert_close(logits, plain, rtol=0, atol=0)
            for n in states:
                expected = full[n] if positions is None else full[n][:, positions]
                assert torch.equal(cache[n], expected[:, :, heads]), n
