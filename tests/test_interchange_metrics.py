"""Interchange's richer results: logit difference and KL per pair (against a hand-run patch),
counts of pairs run / skipped / dropped and passes, interchange(clean, clean), value corruption,
bos / eos roles."""

import sys
from pathlib import Path

import pytest
import torch

import models
from interp.analysis.interventions import Site, corrupt_ar_value, interchange
from interp.tasks import make_task

sys.path.insert(0, str(Path(__file__).parent))
from test_interventions import TASK, VOCAB, ar_batch, corrupt_ar  # noqa: E402


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = models.build("mamba", vocab_size=VOCAB, d_model=16, d_state=4, n_layers=2).double()
    clean = ar_batch(8, 3, seed=0)
    return model, clean, corrupt_ar(clean, TASK, seed=1)


def test_logit_diff_and_kl_equal_a_hand_run_patch(setup):
    model, clean, corrupt = setup
    sites = [Site("blocks.0.mixer.hook_state", "key"), Site("blocks.1.hook_resid_pre", "value"),
             Site("blocks.0.hook_resid_pre", 0)]  # the last is BOS, equal in both runs: a skipped no-op
    result = interchange(model, clean, corrupt, sites, min_effect=0.0, metrics=["logit_diff", "kl"])
    rows, q = torch.arange(len(clean)), clean.roles["query"]
    y = clean.targets[rows, q]
    with torch.no_grad(), models.instrumented():
        clean_logits, cache = model.run_with_cache(clean.tokens)
        corrupt_logits = model(corrupt.tokens)
        site = sites[1]

        def patch(act, hook):
            act = act.clone()
            act[rows, clean.roles["value"]] = cache[site.hook][rows, clean.roles["value"]]
            return act

        patched = model.run_with_hooks(corrupt.tokens, fwd_hooks=[(site.hook, patch)])
    at_corrupt = corrupt_logits[rows, q]
    others = at_corrupt.clone()
    others[rows, y] = -float("inf")
    y2 = others.argmax(-1)  # a key corruption: the corrupted answer is the corrupted run's best other token
    ld = patched[rows, q, y] - patched[rows, q, y2]
    torch.testing.assert_close(result.logit_diff_patched[1], ld, atol=1e-9, rtol=0)
    torch.testing.assert_close(result.logit_diff_corrupt, at_corrupt[rows, y] - at_corrupt[rows, y2], atol=1e-9, rtol=0)
    p_clean = clean_logits[rows, q].log_softmax(-1)
    kl = (p_clean.exp() * (p_clean - patched[rows, q].log_softmax(-1))).sum(-1)
    torch.testing.assert_close(result.kl_patched[1], kl, atol=1e-9, rtol=0)
    # the skipped site keeps the corrupted run's values
    torch.testing.assert_close(result.kl_patched[2], result.kl_corrupt)
    torch.testing.assert_close(result.kl_change[2], torch.zeros(len(clean), dtype=torch.float64))
    kept = result.kept
    assert kept.any() and result.logit_diff_restoration[2][~kept].isnan().all()
    torch.testing.assert_close(result.logit_diff_restoration[2][kept], torch.zeros(int(kept.sum()), dtype=torch.float64))
    # counts
    assert result.n_run + result.n_skipped == result.n_pairs == 3 * len(clean)
    assert result.n_skipped >= len(clean) and result.n_passes >= 1
    assert result.n_dropped == 3 * int((~kept).sum())
    frame = result.to_dataframe("example")
    assert {"logit_diff_patched", "kl_change", "logit_diff_restoration"} <= set(frame.columns)
    assert "pairs run" in repr(result)
    # whole passes give the same numbers
    whole = interchange(model, clean, corrupt, sites, min_effect=0.0, metrics=["logit_diff", "kl"], resume=False)
    torch.testing.assert_close(whole.kl_patched, result.kl_patched, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="metrics"):
        interchange(model, clean, corrupt, sites, metrics=["entropy"])
    with pytest.raises(ValueError, match="logit_diff"):
        interchange(model, clean, corrupt, sites).logit_diff_restoration


def test_interchange_of_a_batch_with_itself_restores_fully(setup):
    model, clean, _ = setup
    result = interchange(model, clean, clean, [Site("blocks.0.mixer.hook_out", "key")])
    assert bool(result.kept.all())
    assert torch.equal(result.restoration, torch.ones_like(result.restoration))
    assert torch.equal(result.p_patched[0], result.p_clean)


def test_value_corruption_gives_a_valid_example_with_its_own_answer():
    task = make_task("AR", n_keys=6, n_values=6)
    clean = task.sample(32, 3, seed=0)
    corrupt = corrupt_ar_value(clean, task, seed=1)
    rows, value, query = torch.arange(32), clean.roles["value"], clean.roles["query"]
    old, new = clean.tokens[rows, value], corrupt.tokens[rows, value]
    assert bool((old != new).all()) and all(int(v) in task.value_ids for v in new)
    for b in range(32):
        assert int(new[b]) not in clean.tokens[b].tolist()
    assert torch.equal(corrupt.targets[rows, query], new)  # the corrupted answer is the new value
    changed = clean.tokens != corrupt.tokens
    assert torch.equal(changed.sum(1), torch.full((32,), 2))  # the value and the answer token
    assert torch.equal(clean.roles["bos"], torch.zeros(32, dtype=torch.long))
    assert bool((clean.tokens[rows, clean.roles["bos"]] == task.bos).all())
    assert bool((clean.tokens[rows, clean.roles["eos"]] == task.eos).all())
    atr = make_task("ATR", n_terminals=8)
    doc = atr.sample(4, 8, seed=0)
    assert bool((doc.tokens[torch.arange(4), doc.roles["bos"]] == atr.bos).all())
    assert bool((doc.tokens[torch.arange(4), doc.roles["eos"]] == atr.eos).all())
