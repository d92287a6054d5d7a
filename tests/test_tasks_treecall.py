"""Associative treecall (ATR): documents are valid trees of the grammar; answers are parent heads."""

import json

import pytest
import torch

from interp.tasks import make_task

OPTIONS = dict(n_nonterminals=10, n_terminals=24, max_rule_length=3, rules_per_nonterminal=3,
               max_depth=4, heldout_fraction=0.2, grammar_seed=3)


def span(h, parent, label, n_tokens):
    """Positions covered by the phrase headed at h: the head, then each child's span in order."""
    out = [h]
    for p in range(n_tokens):
        if parent[p] == h:
            out += span(p, parent, label, n_tokens) if label[p] >= 0 else [p]
    return out


def check_trees(task, tb, length):
    b, g = tb.batch, task.grammar
    n_t = g.n_terminals
    rules = {x: [tuple(s for s in r if s >= 0) for r in g.rules[x].tolist()] for x in range(len(g.level))}
    T = length + 4
    assert b.tokens.shape == (len(b), T) and b.loss_mask.sum() == len(b)
    for i in range(len(b)):
        tok, parent, label = b.tokens[i].tolist(), tb.parent[i].tolist(), tb.label[i].tolist()
        bos = tok.index(task.bos)
        assert all(t == task.pad for t in tok[:bos]) and tok[length + 1] == task.eos
        doc = list(range(bos + 1, length + 1))
        assert all(t in task.terminal_ids for t in (tok[p] for p in doc))
        # The tree: one root phrase spanning the document; every phrase expands by a grammar rule.
        roots = [p for p in doc if label[p] >= 0 and parent[p] == -1]
        assert len(roots) == 1 and roots[0] == doc[0] and g.level[label[roots[0]]] == 0
        assert span(roots[0], parent, label, T) == doc
        for h in (p for p in doc if label[p] >= 0):
            children = [p for p in doc if parent[p] == h]
            symbols = tuple(n_t + label[p] if label[p] >= 0 else tok[p] - 3 for p in children)
            assert symbols in rules[label[h]]
            assert span(h, parent, label, T) == list(range(h, h + len(span(h, parent, label, T))))
        # The query: a terminal occurring once; the answer: the head of its parent phrase.
        key, value, q = b.roles["key"][i].item(), b.roles["value"][i].item(), b.roles["query"][i].item()
        assert q == length + 2 and b.roles["answer"][i] == q + 1
        assert tok[q] == tok[key] and [tok[p] for p in doc].count(tok[key]) == 1
        assert value == parent[key] and tok[q + 1] == tok[value] and b.targets[i, q] == tok[value]
        assert b.loss_mask[i].nonzero().item() == q
        for p in doc:
            assert b.states[i, p] == (tok[parent[p]] if parent[p] >= 0 else -1)
        held = bool(g.heldout[tok[key] - 3, tok[value] - 3])
        assert held == (task.split == "heldout") or task.split == "all"
    assert torch.equal(b.targets[:, :-1], b.tokens[:, 1:])
    # Not vacuous: some documents nest phrases, and some queries are phrase heads themselves.
    assert (tb.label >= 0).sum(dim=1).max() >= 3
    assert (tb.label.gather(1, b.roles["key"][:, None]) >= 0).any()


@pytest.mark.parametrize("split", ["train", "heldout", "all"])
def test_atr_trees_and_answers(split):
    task = make_task("ATR", **OPTIONS, split=split)
    tb = task.sample_trees(48, 24, seed=0)
    check_trees(task, tb, 24)
    assert torch.equal(task.sample(48, 24, seed=0).tokens, tb.batch.tokens)


def test_atr_determinism_and_roundtrip():
    task = make_task("ATR", **OPTIONS)
    a, b, c = task.sample(16, 20, 1), task.sample(16, 20, 1), task.sample(16, 20, 2)
    for f in ("tokens", "targets", "loss_mask", "states"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert not torch.equal(a.tokens, c.tokens)
    rebuilt = make_task(task.name, **json.loads(json.dumps(task.options())))
    assert torch.equal(rebuilt.sample(16, 20, 1).tokens, a.tokens)
    other = make_task("ATR", **{**OPTIONS, "grammar_seed": 4})
    assert not (other.grammar.rules.shape == task.grammar.rules.shape
                and (other.grammar.rules == task.grammar.rules).all())


def test_atr_bad_arguments():
    with pytest.raises(ValueError, match="heldout"):
        make_task("ATR", heldout_fraction=0.0, split="heldout").sample(4, 16, 0)
    with pytest.raises(ValueError, match="split"):
        make_task("ATR", split="test")
    with pytest.raises(ValueError, match="heldout_fraction"):
        make_task("ATR", heldout_fraction=1.5)
    with pytest.raises(ValueError, match="max_depth"):
        make_task("ATR", max_depth=0)
    with pytest.raises(ValueError, match="n_terminal"):
        make_task("ATR", n_terminal=5)


def test_categorical_draw_matches_probabilities():
    import numpy as np

    from interp.tasks.treecall import _draw

    probs = np.array([[0.2, 0.3, 0.5], [0.0, 1.0, 0.0], [0.5, 0.0, 0.5], [0.0, 0.0, 1.0]])
    rng = np.random.default_rng(0)
    rows = np.repeat(np.arange(4), 100_000)
    draws = _draw(rng, np.cumsum(probs, axis=1), rows)
    freq = np.stack([np.bincount(draws[rows == r], minlength=3) / 100_000 for r in range(4)])
    assert np.all(freq[probs == 0] == 0)                   # impossible categories never drawn
    np.testing.assert_allclose(freq, probs, atol=0.01)
