"""Caches at real size: planned bytes equal the cached bytes on every zoo model, the up-front
refusal, streaming to disk (bit-equal to the in-memory cache, reopened lazily, the analyses on it),
the target checks, and position selection (equal to slicing the full cache; hook_state at some
steps from the fast kernels without the per-step path)."""

import json
import os

import pytest
import torch

import models
from models import Cache
from models.memory import MemoryRefused

VOCAB, B, T = 16, 3, 11


def build(name: str, **overrides) -> models.SequenceModel:
    torch.manual_seed(0)
    return models.build(name, **{"n_layers": 2, "vocab_size": VOCAB, **overrides}).double()


@pytest.fixture
def tokens():
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", models.list_models())
def test_planned_shapes_and_bytes_equal_the_cache_on_every_zoo_model(name, tokens):
    model = build(name)
    for length in (1, 2, T):  # below, at and above the dry runs' lengths
        plan = model.cache_plan(tokens[:, :length])
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens[:, :length])
        assert set(plan.entries) == set(cache)
        for hook, value in cache.items():
            assert plan.shape(hook) == tuple(value.shape), hook
            assert plan.entries[hook] == value.nbytes, hook
        assert plan.total == sum(v.nbytes for v in cache.values())


def test_planned_bytes_with_positions_and_gradients(tokens):
    model = build("transformer", mlp=True)
    names = ["blocks.0.mixer.hook_pattern", "blocks.1.hook_resid_post"]
    plan = model.cache_plan(tokens, names, positions=[4, -1], incl_bwd=True)
    _, cache = model.run_with_cache(tokens, names, positions=[4, -1], incl_bwd=True, metric=lambda l: l[:, -1, 0].sum())
    assert plan.shape("blocks.0.mixer.hook_pattern") == (B, model.cfg.n_heads, 2, T)  # [B, H, K, T]: queries kept
    assert {n: v.nbytes for n, v in cache.items()} == plan.entries  # every _grad entry is there here


def test_refusal_is_one_line_naming_the_largest_hooks_estimate_and_budget(tokens):
    model = build("mamba2", d_model=32)
    plan = model.cache_plan(tokens)
    called = []
    with pytest.raises(MemoryRefused) as refused:
        model.run_with_cache(tokens, fwd_hooks=[("hook_embed", lambda x, h: called.append(1))], max_memory=1000)
    message = str(refused.value)
    assert "\n" not in message and not called  # up front: not even the forward ran
    largest = max(plan.entries, key=plan.entries.get)
    assert largest.endswith("mixer.hook_state") and largest in message
    assert "1 kB" in message and models.memory.format_bytes(plan.total) in message
    assert "to_disk" in message and "positions" in message
    _, cache = model.run_with_cache(tokens, max_memory=plan.total)  # exactly the estimate fits
    assert sum(v.nbytes for v in cache.values()) == plan.total
    with pytest.raises(MemoryRefused, match="one activation at a time"):
        model.run_with_cache(tokens, to_disk="unused", max_memory=plan.largest_entry - 1)


@pytest.mark.parametrize("name", ["mamba", "transformer", "deltanet", "mamba2", "s4d"])  # s4d: complex states
def test_disk_cache_equals_the_memory_cache_bit_for_bit_and_reopens(name, tokens, tmp_path):
    model = build(name, mlp=True)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        disk_logits, disk = model.run_with_cache(tokens, to_disk=tmp_path / "c")
    assert torch.equal(logits, disk_logits) and disk.directory == tmp_path / "c"
    reopened = Cache.open(tmp_path / "c", model)
    for other in (disk, reopened):
        assert list(other) == list(cache)
        for hook in cache:
            assert other[hook].dtype == cache[hook].dtype and torch.equal(other[hook], cache[hook]), hook
        assert torch.equal(other["resid_pre", 1], cache["resid_pre", 1])
        assert torch.equal(other.stack("blocks.*.hook_resid_post"), cache.stack("blocks.*.hook_resid_post"))
        assert torch.equal(other.accumulated_resid(apply_ln=True), cache.accumulated_resid(apply_ln=True))
        assert torch.equal(other.decompose_resid(), cache.decompose_resid())
        assert torch.equal(other.logit_lens(), cache.logit_lens())
    files = sorted(os.listdir(tmp_path / "c"))
    assert files == sorted([f"{hook}.safetensors" for hook in cache] + ["cache.json"])  # nothing else, no temp files
    from safetensors.torch import load_file  # the files are plain safetensors

    hook = "blocks.1.hook_resid_mid"
    assert torch.equal(load_file(tmp_path / "c" / f"{hook}.safetensors")[hook], cache[hook])


def test_disk_cache_reads_on_access_and_is_read_only_when_reopened(tokens, tmp_path):
    model = build("mamba")
    names = ["blocks.0.mixer.hook_state", "blocks.1.hook_resid_pre"]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names)
        model.run_with_cache(tokens, names, to_disk=tmp_path / "c")
    reopened = Cache.open(tmp_path / "c")
    assert reopened._store.nbytes() == sum(v.nbytes for v in cache.values())
    os.remove(tmp_path / "c" / "blocks.1.hook_resid_pre.safetensors")  # read on access, not at open
    assert names[1] in reopened and ("resid_pre", 1) in reopened and "hook_embed" not in reopened
    assert torch.equal(reopened[names[0]], cache[names[0]])
    with pytest.raises(FileNotFoundError):
        reopened[names[1]]
    with pytest.raises(ValueError, match="read-only"):
        reopened["x"] = torch.zeros(1)
    with pytest.raises(ValueError, match="lacks 1 files"):
        Cache.open(tmp_path / "c")


def test_disk_target_checks(tokens, tmp_path):
    model = build("deltanet")
    names = ["blocks.0.hook_resid_pre"]
    target = tmp_path / "c"
    model.run_with_cache(tokens, names, to_disk=target)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        model.run_with_cache(tokens, names, to_disk=target)
    (target / "notes.txt").write_text("mine")
    _, again = model.run_with_cache(tokens[:1], ["blocks.1.hook_resid_pre"], to_disk=target, overwrite=True)
    assert sorted(os.listdir(target)) == ["blocks.1.hook_resid_pre.safetensors", "cache.json", "notes.txt"]
    assert (target / "notes.txt").read_text() == "mine" and again["resid_pre", 1].shape[0] == 1
    os.symlink(target, tmp_path / "link")
    for overwrite in (False, True):
        with pytest.raises(ValueError, match="symlink"):
            model.run_with_cache(tokens, names, to_disk=tmp_path / "link", overwrite=overwrite)
    with pytest.raises(ValueError, match="parent"):
        model.run_with_cache(tokens, names, to_disk=tmp_path / "missing" / "c")
    with pytest.raises(ValueError, match="incl_bwd"):
        model.run_with_cache(tokens, names, to_disk=tmp_path / "g", incl_bwd=True, metric=lambda l: l.sum())
    assert not (tmp_path / "g").exists()


def test_a_failed_streaming_run_leaves_no_files(tokens, tmp_path):
    model = build("transformer")

    def boom(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_cache(tokens, to_disk=tmp_path / "c", fwd_hooks=[("blocks.1.hook_resid_pre", boom)])
    assert os.listdir(tmp_path / "c") == []
    with pytest.raises(ValueError, match="no finished cache"):
        Cache.open(tmp_path / "c")


def test_reopen_checks_the_model_config(tokens, tmp_path):
    model = build("mamba")
    model.run_with_cache(tokens, ["hook_embed"], to_disk=tmp_path / "c")
    assert json.loads((tmp_path / "c" / "cache.json").read_text())["model"] == model.cfg.to_dict()
    with pytest.raises(ValueError, match="d_model"):
        Cache.open(tmp_path / "c", build("mamba", d_model=32))


@pytest.mark.parametrize("name", ["mamba", "transformer", "deltanet", "mamba2", "lstm", "s4d"])
def test_positions_equal_slicing_the_full_cache(name, tokens):
    model = build(name, mlp=True)
    positions = [7, 0, -1]
    with torch.no_grad():
        _, full = model.run_with_cache(tokens)
        _, kept = model.run_with_cache(tokens, positions=positions)
        model.set_execution_path("instrumented")  # every mixer per step, as in the full run: sliced as it fires
        _, sliced = model.run_with_cache(tokens, positions=positions)
        model.set_execution_path("auto")
    plan = model.cache_plan(tokens)
    for hook, value in full.items():
        axis = plan.layouts[hook].time_axis
        expected = value if axis is None else value.index_select(axis, torch.tensor([7, 0, T - 1]))
        assert kept.positions.get(hook) == sliced.positions.get(hook) == (None if axis is None else [7, 0, T - 1])
        assert torch.equal(sliced[hook], expected), hook
        # where hook_state is read only here, a mixer's fast kernels run to each kept step: float rounding
        torch.testing.assert_close(kept[hook], expected, rtol=0, atol=1e-12)
    assert kept.accumulated_resid().shape == (3, B, 3, model.cfg.d_model)


@pytest.mark.parametrize("name", ["mamba", "mamba2", "deltanet", "gated_deltanet", "lstm", "s4d", "mamba3"])
def test_hook_state_at_some_steps_runs_the_fast_kernels_to_each_step(name, tokens, monkeypatch):
    model = build(name)
    hooks = [f"blocks.{l}.mixer.hook_state" for l in range(2)]
    with torch.no_grad():
        logits, full = model.run_with_cache(tokens, hooks)
        for block in model.blocks:  # the per-step path (every state [B, T, *S]) must not run now
            monkeypatch.setattr(block.mixer, "instrumented_forward", None)
        kept_logits, kept = model.run_with_cache(tokens, hooks, positions={hooks[0]: [9, 2], hooks[1]: [-1]})
    torch.testing.assert_close(kept_logits, logits, rtol=0, atol=1e-12)
    torch.testing.assert_close(kept[hooks[0]], full[hooks[0]][:, [9, 2]], rtol=0, atol=1e-12)
    torch.testing.assert_close(kept[hooks[1]], full[hooks[1]][:, [T - 1]], rtol=0, atol=1e-12)
    assert kept.positions == {hooks[0]: [9, 2], hooks[1]: [T - 1]}


def test_positions_are_checked(tokens):
    model = build("mamba")
    for bad, error in [([T], ValueError), ([1, 1 - T], ValueError), ([], TypeError), ([0.5], TypeError),
                       ({"hook_embed": [0], "nope": [1]}, ValueError)]:
        with pytest.raises(error, match="positions"):
            model.run_with_cache(tokens, positions=bad)


def test_streaming_keeps_no_activation_in_memory(tokens, tmp_path, monkeypatch):
    import gc
    import weakref

    from models.cache import store as cache_store

    written, write = [], cache_store.write_tensor

    def spy(path, name, value):
        written.append(weakref.ref(value))
        write(path, name, value)

    monkeypatch.setattr(cache_store, "write_tensor", spy)
    model = build("mamba2")
    with torch.no_grad():
        logits, disk = model.run_with_cache(tokens, to_disk=tmp_path / "c")
    gc.collect()
    assert len(written) == len(disk) > 20
    assert [ref for ref in written if ref() is not None] == []  # every activation freed once written


def test_a_failing_dry_run_says_it_is_the_planner(tokens):
    model = build("transformer")
    with pytest.raises(TypeError) as raised:
        model.run_with_cache(tokens, no_such_keyword=5)  # a forward keyword the model does not take
    assert "cache planner" in "".join(getattr(raised.value, "__notes__", []))
