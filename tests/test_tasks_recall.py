"""Associative recall (AR) and multi-query recall (MQAR)."""

import json

import numpy as np
import pytest
import torch

from interp.tasks import make_task


def check_recall(task, b, L, k):
    """Every stated property of the layout, checked one sequence at a time (slow reference)."""
    keys, values = set(task.key_ids), set(task.value_ids)
    assert not keys & values and task.bos not in keys | values and task.eos not in keys | values
    assert max(values) == task.vocab_size - 1
    T = 2 * L + 2 + 2 * k
    assert b.tokens.shape == (len(b), T)
    for i in range(len(b)):
        tok = b.tokens[i].tolist()
        assert tok[0] == task.bos and tok[2 * L + 1] == task.eos
        ctx_keys, ctx_values = tok[1:2 * L + 1:2], tok[2:2 * L + 2:2]
        assert set(ctx_keys) <= keys and set(ctx_values) <= values
        assert len(set(ctx_keys)) == L and len(set(ctx_values)) == L    # without replacement
        binding = dict(zip(ctx_keys, ctx_values))
        roles = {name: pos[i].reshape(-1).tolist() for name, pos in b.roles.items()}
        queried = []
        for j in range(k):
            q, a = roles["query"][j], roles["answer"][j]
            assert a == q + 1
            assert tok[q] in binding and tok[a] == binding[tok[q]]
            assert b.targets[i, q] == binding[tok[q]]                         # loss target = answer
            assert tok[roles["key"][j]] == tok[q]                              # in-context key
            assert tok[roles["value"][j]] == binding[tok[q]] and roles["value"][j] == roles["key"][j] + 1
            assert b.states[i, q] == b.states[i, a] == binding[tok[q]]
            queried.append(tok[q])
        assert len(set(queried)) == k
        assert b.loss_mask[i].nonzero().reshape(-1).tolist() == sorted(roles["query"])
        for t in range(1, 2 * L + 1):
            pair_value = tok[t + 1] if t % 2 == 1 else tok[t]
            assert b.states[i, t] == pair_value
        assert b.states[i, 0] == b.states[i, 2 * L + 1] == -1
    assert torch.equal(b.targets[:, :-1], b.tokens[:, 1:])


def test_ar_layout_and_answers():
    task = make_task("AR", n_keys=12, n_values=10)
    assert task.vocab_size == 24 and task.key_ids == range(2, 14) and task.value_ids == range(14, 24)
    b = task.sample(64, 8, seed=0)
    check_recall(task, b, 8, 1)
    assert all(pos.shape == (64,) for pos in b.roles.values())
    # The queried pair is spread over the context.
    assert len(set(b.roles["key"].tolist())) == 8


def test_ar_full_vocabulary():
    task = make_task("AR", n_keys=5, n_values=5)
    b = task.sample(16, 5, seed=1)
    check_recall(task, b, 5, 1)


def test_mqar_layout_and_answers():
    task = make_task("MQAR", n_keys=20, n_values=30, n_queries=3)
    b = task.sample(32, 6, seed=2)
    check_recall(task, b, 6, 3)
    assert all(pos.shape == (32, 3) for pos in b.roles.values())


@pytest.mark.parametrize("spec,options", [("AR", {"n_keys": 16, "n_values": 16}),
                                          ("MQAR", {"n_queries": 2})])
def test_determinism_and_roundtrip(spec, options):
    task = make_task(spec, **options)
    a, b, c = task.sample(8, 6, 5), task.sample(8, 6, 5), task.sample(8, 6, 6)
    for f in ("tokens", "targets", "loss_mask", "states"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert all(torch.equal(a.roles[r], b.roles[r]) for r in a.roles)
    assert not torch.equal(a.tokens, c.tokens)
    rebuilt = make_task(task.name, **json.loads(json.dumps(task.options())))
    assert torch.equal(rebuilt.sample(8, 6, 5).tokens, a.tokens)


def test_bad_arguments():
    with pytest.raises(ValueError, match="length"):
        make_task("AR", n_keys=4, n_values=8).sample(2, 5, 0)
    with pytest.raises(ValueError, match="n_queries"):
        make_task("MQAR", n_queries=4).sample(2, 3, 0)
    with pytest.raises(ValueError, match="`length`"):
        make_task("AR", n_pairs=4)
    with pytest.raises(ValueError, match="n_keys"):
        make_task("AR", n_keys=0)
    with pytest.raises(ValueError, match="n_queries"):
        make_task("AR", n_queries=2)
    with pytest.raises(ValueError, match="did you mean"):
        make_task("MQRA")
