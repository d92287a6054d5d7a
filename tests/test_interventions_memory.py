"""Interchange read-outs and memory plans: logits at the answer only, states at resume positions,
the planner's budget (interp.analysis.interventions.planning)."""

import pytest
import torch

import models
from interp.analysis.interventions import Site, attribute, interchange, planning, site_grid
from interp.analysis.interventions.attribution import first_block, plan_groups
from interp.analysis.interventions.patching import _resume_groups
from models.backbone import StatesAt
from models.cache.plan import DRY_LENGTHS
from models.memory import MemoryRefused
from tests.test_interventions import HOOKS as GRID_HOOKS
from tests.test_interventions import TASK, VOCAB, ar_batch, corrupt_ar


@pytest.fixture(scope="module")
def pair():
    clean = ar_batch(8, 4, seed=0)
    return clean, corrupt_ar(clean, TASK, seed=1)


def build(name: str = "mamba", vocab: int = VOCAB):
    torch.manual_seed(0)
    return models.build(name, vocab_size=vocab, d_model=16, n_heads=2, d_state=4, n_layers=2)


@pytest.mark.parametrize("name", ["mamba", "transformer", "tanh_rnn"])
def test_read_out_at_positions_equals_the_full_logits_there(name):
    model = build(name)
    tokens = torch.randint(0, VOCAB, (3, 9), generator=torch.Generator().manual_seed(0))
    at = torch.tensor([8, 2, 5])
    rows = torch.arange(3)
    with torch.no_grad():
        full = model(tokens)
        torch.testing.assert_close(model(tokens, at=at), full[rows, at], atol=1e-6, rtol=0)
        hooks = model.resume_hooks()
        _, cache = model.run_with_cache(tokens, names=hooks["resid"] + hooks["carry"])
        resumed = model.resume_from(cache, rows, 1, 2, 9)  # [3, 7, V]
        torch.testing.assert_close(model.resume_from(cache, rows, 1, 2, 9, at=at), resumed[rows, at - 2],
                                   atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="at must hold one position per row"):
        model.resume_from(cache, rows, 1, 3, 9, at=at)  # position 2 lies before the resumed start


def test_states_at_reads_like_the_full_states_and_names_missing_positions():
    states = torch.randn(4, 10, 3, 2)
    kept = StatesAt(states[:, [2, 7]], [2, 7])
    examples = torch.tensor([3, 0])
    assert torch.equal(kept[examples, 7], states[examples, 7])
    with pytest.raises(KeyError, match="not at 5"):
        kept[examples, 5]


def test_no_run_forms_logits_beyond_one_position_per_row_at_either_vocabulary(pair):
    """Peak memory does not grow with vocab x positions: every unembedding output is [R, 1, V]."""
    clean, corrupt = pair
    for vocab in (VOCAB, 40 * VOCAB):
        model = build(vocab=vocab)
        shapes = []
        model.unembed.register_forward_hook(lambda mod, args, out: shapes.append(tuple(out.shape)))
        interchange(model, clean, corrupt, site_grid(model, GRID_HOOKS, ["key", "value", "query"]), min_effect=0.0)
        # run_with_cache's planner dry-runs one example over DRY_LENGTHS positions: [1, <= 3, V]
        dry = [shape for shape in shapes if shape[0] == 1 and shape[1] <= max(DRY_LENGTHS)]
        assert shapes and all(shape[1:] == (1, vocab) for shape in shapes if shape not in dry), shapes[:4]


def test_resumed_passes_read_states_only_at_their_resume_positions(pair, monkeypatch):
    clean, corrupt = pair
    model = build()
    seen = []
    original = type(model).resume_from

    def spy(self, cache, examples, layer, start, end, at=None):
        seen.append((start, {name: value for name, value in cache.items() if name.endswith("hook_state")}))
        return original(self, cache, examples, layer, start, end, at=at)

    monkeypatch.setattr(type(model), "resume_from", spy)
    interchange(model, clean, corrupt, site_grid(model, GRID_HOOKS, ["key", "value", "query"]), min_effect=0.0)
    starts = sorted({start for start, _ in seen if start > 0})
    assert starts
    for _, states in seen:
        assert set(states) == {"blocks.0.mixer.hook_state", "blocks.1.mixer.hook_state"}
        for kept in states.values():
            assert isinstance(kept, StatesAt) and set(kept.positions) <= {s - 1 for s in starts}


def test_a_small_budget_takes_more_passes_coarser_starts_and_gives_the_same_result(pair):
    clean, corrupt = pair
    model = build()
    sites = site_grid(model, GRID_HOOKS, ["key", "value", "query"]) + [Site("blocks.1.mixer.hook_state", None)]
    roomy = interchange(model, clean, corrupt, sites, min_effect=0.0, metrics=["logit_diff", "kl"])
    resid = ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"]
    plan = planning.Planner(model, clean.tokens, sorted({s.hook for s in sites}), resid, True, None, None)
    tight_budget = int(max(plan.held + 4 * plan.fp.row(clean.tokens.shape[1]), plan.held_runs + 2 * plan.fp.row(clean.tokens.shape[1])))
    tight = interchange(model, clean, corrupt, sites, min_effect=0.0, metrics=["logit_diff", "kl"],
                        max_memory=tight_budget)
    assert tight.n_passes > roomy.n_passes
    for field in ("p_patched", "logit_diff_patched", "kl_patched", "p_clean", "p_corrupt"):  # runs in chunks too
        torch.testing.assert_close(getattr(tight, field), getattr(roomy, field), atol=1e-6, rtol=0)


def test_a_coarser_stride_snaps_starts_down_and_keeps_the_hooks_apart():
    sites = [Site("blocks.0.hook_resid_pre", 5), Site("blocks.0.hook_resid_pre", 6), Site("blocks.1.mixer.hook_out", 7)]
    positions = [torch.full((2, 1), p) for p in (5, 6, 7)]
    pairs = torch.cartesian_prod(torch.arange(3), torch.arange(2))
    answer = torch.full((2,), 9)
    assert [(layer, start) for layer, start, _ in _resume_groups(pairs, sites, positions, answer, stride=4)] \
        == [(0, 4), (1, 4)]
    assert [(layer, start) for layer, start, _ in _resume_groups(pairs, sites, positions, answer)] \
        == [(0, 5), (1, 7)]


def test_the_planner_refuses_up_front_in_one_line_naming_hooks_estimate_and_budget(pair):
    clean, corrupt = pair
    model = build()
    sites = site_grid(model, GRID_HOOKS, ["key", "value"])
    with pytest.raises(MemoryRefused) as refused:
        interchange(model, clean, corrupt, sites, max_memory="2kB")
    message = str(refused.value)
    assert "\n" not in message
    assert "blocks.{l}.hook_resid_pre" in message and "blocks.{l}.mixer.hook_state" in message
    assert "layers 0-1" in message and "needs about" in message and "budget of 2 kB" in message


def test_interchange_checks_progress_and_max_memory(pair):
    clean, corrupt = pair
    model = build()
    sites = [Site("blocks.0.hook_resid_pre", "key")]
    with pytest.raises(TypeError, match="progress must be a bool"):
        interchange(model, clean, corrupt, sites, progress="yes")
    with pytest.raises(ValueError, match="max_memory must be"):
        interchange(model, clean, corrupt, sites, max_memory="lots")


def test_hooks_of_the_whole_grid_name_every_template():
    hooks = [f"blocks.{l}.{h}" for l in range(3) for h in ("hook_resid_pre", "mixer.hook_state")] + ["hook_embed"]
    assert planning.describe(hooks) == ("hooks blocks.{l}.hook_resid_pre, blocks.{l}.mixer.hook_state, "
                                        "hook_embed (layers 0-2)")


def test_attribution_in_planned_groups_and_chunks_equals_one_run(pair):
    clean, corrupt = pair
    model = build().double()
    sites = site_grid(model, GRID_HOOKS, ["key", "value", "query"])
    whole = attribute(model, clean, corrupt, sites, min_effect=0.0, metrics=["logit_diff", "kl"])
    hooks = sorted({s.hook for s in sites})
    assert len(plan_groups(model, clean.tokens, hooks, 10**12)) == 1
    small = int(10**12)
    while len(plan_groups(model, clean.tokens, hooks, small // 2)) < 8:  # several hook groups and example chunks
        small //= 2
    plan = plan_groups(model, clean.tokens, hooks, small // 2)
    assert len({p[0].start for p in plan}) > 1 and len({tuple(p[1]) for p in plan}) > 1
    assert any(min(first_block(model, h) for h in p[1]) > 0 for p in plan)  # a run whose graph starts later
    split = attribute(model, clean, corrupt, sites, min_effect=0.0, metrics=["logit_diff", "kl"], max_memory=small // 2)
    for field in ("p_patched", "logit_diff_patched", "kl_patched", "p_clean", "p_corrupt"):
        torch.testing.assert_close(getattr(split, field), getattr(whole, field), atol=1e-12, rtol=0)


def test_attribution_refuses_up_front_naming_hooks_estimate_and_budget(pair):
    clean, corrupt = pair
    model = build()
    with pytest.raises(MemoryRefused, match=r"^attribution at hooks blocks\.\{l\}\.mixer\.hook_state \(layers 0-1\) "
                                            r"over N=8, T=11 \(one row .*\) needs about .*budget of 1 kB"):
        attribute(model, clean, corrupt, site_grid(model, ["blocks.{l}.mixer.hook_state"], ["key"]), max_memory=1000)


def test_small_states_are_cached_whole_large_ones_recomputed_per_block_with_the_same_result(pair, monkeypatch):
    """States within WHOLE_STATES_SHARE of the budget come from the cached runs (no block forward
    recomputes them); beyond it from block_activation; the values are the same bit for bit."""
    clean, corrupt = pair
    model = build()
    sites = site_grid(model, GRID_HOOKS, ["key", "value", "query"])
    recomputed = []
    original = planning.block_activation
    monkeypatch.setattr(planning, "block_activation", lambda *args, **kw: recomputed.append(args[2]) or original(*args, **kw))
    whole = interchange(model, clean, corrupt, sites, min_effect=0.0, metrics=["logit_diff"])
    assert recomputed == []
    monkeypatch.setattr(planning, "WHOLE_STATES_SHARE", 0.0)
    lazy = interchange(model, clean, corrupt, sites, min_effect=0.0, metrics=["logit_diff"])
    assert set(recomputed) == {"blocks.0.mixer.hook_state", "blocks.1.mixer.hook_state"}
    for field in ("p_patched", "logit_diff_patched", "p_clean", "p_corrupt"):
        assert torch.equal(getattr(lazy, field), getattr(whole, field)), field
    assert (lazy.n_run, lazy.n_passes) == (whole.n_run, whole.n_passes)
