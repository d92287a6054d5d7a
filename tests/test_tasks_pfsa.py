"""PFSA-SR: the belief states equal brute-force enumeration of every hidden path."""

import itertools
import json

import numpy as np
import pytest
import torch

from interp.tasks import make_task


def brute_force_beliefs(task, tokens):
    """Posterior over arrangements after every token, by enumerating initial states and coins."""
    n, p = task.n_items, task.p
    starts = [tuple(range(n))] if task.init == "identity" else list(itertools.permutations(range(n)))
    n_swaps = sum(t in task.swap_ids for t in tokens)
    beliefs = np.zeros((len(tokens), task.n_states))
    index = {tuple(perm): g for g, perm in enumerate(task.group.perms.tolist())}
    for start in starts:
        for coins in itertools.product([0, 1], repeat=n_swaps):
            weight = (1 / len(starts)) * np.prod([p if c else 1 - p for c in coins])
            vals, j, alive, asked = list(start), 0, True, None
            for t, tok in enumerate(tokens):
                if tok in task.swap_ids:
                    a, b = task.pairs[tok]
                    if coins[j]:
                        vals[a], vals[b] = vals[b], vals[a]
                    j += 1
                elif tok in task.ask_ids:
                    asked = tok - task.ask_ids.start
                else:
                    alive = alive and vals[asked] == tok - task.item_ids.start
                if alive:
                    beliefs[t, index[tuple(vals)]] += weight
    return beliefs / beliefs.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("options", [
    {"n_items": 3, "p": 0.3},
    {"n_items": 3, "p": 0.5, "init": "uniform", "reveal_every": 1},
    {"n_items": 4, "p": 0.7, "reveal": "adversarial", "init": "uniform"},
    {"n_items": 2, "p": 1.0},
    {"n_items": 3, "p": 0.5, "reveal_every": 2, "full_every": 3},
])
def test_beliefs_equal_brute_force(options):
    task = make_task("PFSA", **options)
    b = task.sample(5, 6, seed=1)
    for i in range(len(b)):
        expected = brute_force_beliefs(task, b.tokens[i].tolist())
        np.testing.assert_allclose(b.states[i].numpy(), expected, atol=1e-6)
    # The revealed item is the truth: it always has positive belief just before it is revealed.
    marg = task.marginals(b.states)                                         # [N, T, n, n]
    ask = b.roles["reveal"]
    slot = b.tokens.gather(1, ask) - task.ask_ids.start
    item = b.tokens.gather(1, ask + 1) - task.item_ids.start
    rows = torch.arange(len(b))[:, None]
    assert (marg[rows, ask, slot, item] > 0).all()
    assert torch.allclose(marg[rows, ask + 1, slot, item], torch.ones(()))   # known after the reveal
    if task.reveal == "adversarial":
        assert (slot == 0).all()


def test_layout_targets_and_marginals():
    task = make_task("PFSA", n_items=3, reveal_every=3)
    b = task.sample(4, 7, seed=0)
    # 7 swaps, reveals after swaps 3 and 6: S S S A I S S S A I S
    assert b.tokens.shape == (4, 11)
    assert b.roles["reveal"][0].tolist() == [3, 8]
    kinds = [0 if t in task.swap_ids else 1 if t in task.ask_ids else 2 for t in b.tokens[0].tolist()]
    assert kinds == [0, 0, 0, 1, 2, 0, 0, 0, 1, 2, 0]
    assert b.loss_mask[0].nonzero().view(-1).tolist() == [3, 8]
    assert torch.equal(b.targets[:, :-1], b.tokens[:, 1:])
    assert torch.allclose(b.states.sum(-1), torch.ones(4, 11))
    marg = task.marginals(b.states)
    assert torch.allclose(marg.sum(-1), torch.ones(4, 11, 3)) and torch.allclose(marg.sum(-2), torch.ones(4, 11, 3))


def test_full_reveals_print_every_slot_and_pin_the_arrangement_down():
    task = make_task("PFSA", n_items=3, reveal_every=2, full_every=3)
    b = task.sample(5, 8, seed=2)
    # 8 swaps, reveals after swaps 2, 4, 6 (full), 8: S S A I S S A I S S A0 I A1 I A2 I S S A I
    assert task.layout(8)[1].tolist() == b.roles["reveal"][0].tolist() == [2, 6, 10, 12, 14, 18]
    assert task.since_full(8).tolist() == [0, 1, 2, 2, 2, 0] and task.fixed_slots(8).tolist() == [-1, -1, 0, 1, 2, -1]
    assert (b.tokens[:, [10, 12, 14]] - task.ask_ids.start).tolist() == [[0, 1, 2]] * 5
    assert torch.equal(b.states[:, 15].max(-1).values, torch.ones(5))        # the full print leaves one arrangement
    assert task.sample(5, 8, seed=2).tokens.equal(b.tokens)
    with pytest.raises(ValueError, match="full_every"):
        make_task("PFSA", full_every=-1)


def test_determinism_and_roundtrip():
    task = make_task("PFSA", n_items=4, p=0.25, reveal="adversarial")
    a, b, c = task.sample(3, 9, 5), task.sample(3, 9, 5), task.sample(3, 9, 6)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.states, b.states)
    assert not torch.equal(a.tokens, c.tokens)
    rebuilt = make_task("PFSA", **json.loads(json.dumps(task.options())))
    assert torch.equal(rebuilt.sample(3, 9, 5).states, a.states)


def test_bad_arguments():
    for kwargs in ({"n_items": 7}, {"n_items": 1}, {"p": 1.5}, {"reveal": "adverse"},
                   {"init": "random"}, {"loss": "reveal"}, {"reveal_every": 0}):
        with pytest.raises(ValueError):
            make_task("PFSA", **kwargs)
