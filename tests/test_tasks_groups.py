"""Groups (Cayley tables) and group word problems."""

import itertools

import numpy as np
import pytest
import torch

from interp.tasks import make_task, running_product
from interp.tasks.groups import Group, alternating, cyclic, direct_product, group, symmetric

NAMES = ["C1", "C2", "C6", "Z5", "S3", "S4", "S5", "A4", "A5", "A4xZ5", "S3xC2", "C2xC3xC2"]
ORDERS = {"C1": 1, "C2": 2, "C6": 6, "Z5": 5, "S3": 6, "S4": 24, "S5": 120, "A4": 12, "A5": 60,
          "A4xZ5": 60, "S3xC2": 12, "C2xC3xC2": 12}


@pytest.mark.parametrize("name", NAMES)
def test_group_axioms(name):
    g = group(name)
    assert g.order == ORDERS[name]
    g.check()   # closure, identity 0, inverses, associativity over all n^3 triples (vectorised)
    ids = np.arange(g.order)
    # Every row and column of a group table is a permutation (Latin square).
    assert all(len(set(row)) == g.order for row in g.table)
    assert all(len(set(col)) == g.order for col in g.table.T)
    assert np.array_equal(g.inverse[g.inverse], ids)


def test_check_rejects_non_groups():
    table = np.array([[0, 1, 2], [1, 2, 0], [2, 0, 0]])   # not a Latin square / not associative
    with pytest.raises(ValueError, match="inverse|associative"):
        Group("bad", table, np.array([0, 2, 1])).check()
    with pytest.raises(ValueError, match="identity"):
        Group("bad", np.array([[1, 0], [0, 1]]), np.array([0, 1])).check()
    # A loop of order 5: a Latin square with identity 0 and inverses, but not associative.
    loop = np.array([[0, 1, 2, 3, 4], [1, 0, 3, 4, 2], [2, 4, 0, 1, 3], [3, 2, 4, 0, 1], [4, 3, 1, 2, 0]])
    with pytest.raises(ValueError, match="associative"):
        Group("loop", loop, np.arange(5)).check()


def test_permutation_convention_is_array_reindexing():
    """(a*b)[i] = a[b[i]]: applying arr <- arr[a] then arr <- arr[b] is arr <- arr[a*b]."""
    for g in (group("S4"), group("A5")):
        perms = g.perms
        assert np.array_equal(perms[0], np.arange(perms.shape[1]))            # identity first
        for a, b in itertools.product(range(g.order), repeat=2):
            assert np.array_equal(perms[g.table[a, b]], perms[a][perms[b]])
        arr = np.array(list("abcde"[: perms.shape[1]]))
        assert np.array_equal(arr[perms[3]][perms[7]], arr[perms[g.table[3, 7]]])


def test_known_structure():
    assert group("C6").is_abelian() and not group("S3").is_abelian()
    assert group("A4xZ5").is_abelian() is False
    assert group("Z7").name == "C7"
    # A5 is simple, hence no element of A5 other than the identity is central.
    a5 = group("A5")
    central = [a for a in range(60) if np.array_equal(a5.table[a], a5.table[:, a])]
    assert central == [0]
    # A_k are exactly the even permutations: sign is a homomorphism S_k -> C2 with kernel A_k.
    s4, a4 = symmetric(4), alternating(4)
    assert {tuple(p) for p in a4.perms} <= {tuple(p) for p in s4.perms}
    # Direct product ids are mixed radix: (g, h) -> g*|H| + h.
    p = direct_product(cyclic(3), symmetric(3))
    for a, b in itertools.product(range(18), repeat=2):
        g = (cyclic(3).table[a // 6, b // 6], symmetric(3).table[a % 6, b % 6])
        assert p.table[a, b] == g[0] * 6 + g[1]


@pytest.mark.parametrize("bad", ["S9", "X3", "s3", "C0", "A4x", "", "S5xS5", "S3xZ"])
def test_bad_group_names(bad):
    with pytest.raises(ValueError):
        group(bad)


def reference_fold(table, x):
    """Slow reference: s_t = s_{t-1} * x_t one element at a time."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        s = 0
        for t in range(x.shape[1]):
            s = table[s, x[i, t]]
            out[i, t] = s
    return out


@pytest.mark.parametrize("name", ["C2", "Z5", "S3", "S5", "A5", "A4xZ5"])
def test_targets_equal_reference_fold(name):
    task = make_task(name, format="acot")
    b = task.sample(8, 40, seed=3)
    x = b.tokens.numpy()
    ref = reference_fold(task.group.table, x)
    assert np.array_equal(b.targets.numpy(), ref)
    assert np.array_equal(b.states.numpy(), ref)
    assert b.loss_mask.all()
    assert task.vocab_size == task.n_states == task.group.order
    assert b.tokens.dtype == torch.int64 and b.tokens.max() < task.vocab_size


def test_running_product_edge_cases():
    table = group("S3").table
    assert running_product(table, np.zeros((3, 0), np.int64)).shape == (3, 0)
    x = np.array([[4, 2, 5]])
    assert np.array_equal(running_product(table, x), reference_fold(table, x))


def test_outcome_format():
    task = make_task("S3", format="outcome")
    b = task.sample(5, 12, seed=0)
    assert b.loss_mask[:, -1].all() and not b.loss_mask[:, :-1].any()
    assert np.array_equal(b.targets[:, -1].numpy(), reference_fold(task.group.table, b.tokens.numpy())[:, -1])
    assert (b.roles["last"] == 11).all()


def test_cot_format():
    task = make_task("S3", format="cot")
    T = 7
    b = task.sample(6, T, seed=1)
    assert task.vocab_size == 7 and task.sep == 6
    assert b.tokens.shape == (6, 2 * T)
    x = b.tokens[:, :T].numpy()
    s = reference_fold(task.group.table, x)
    assert (b.tokens[:, T] == task.sep).all()
    assert np.array_equal(b.tokens[:, T + 1:].numpy(), s[:, :-1])
    # Next-token convention: targets are the tokens shifted by one, ending with s_T.
    assert torch.equal(b.targets[:, :-1], b.tokens[:, 1:])
    assert np.array_equal(b.targets[:, T:].numpy(), s)
    assert not b.loss_mask[:, :T].any() and b.loss_mask[:, T:].all()
    assert np.array_equal(b.states[:, :T].numpy(), s) and torch.equal(b.states[:, T:], b.targets[:, T:])
    assert (b.roles["last"] == T - 1).all() and (b.roles["sep"] == T).all()


@pytest.mark.parametrize("spec,options", [("S3", {"format": "cot"}), ("A4xZ5", {}), ("C2", {"format": "outcome"})])
def test_determinism_and_options_roundtrip(spec, options):
    import json

    task = make_task(spec, **options)
    a, b, c = task.sample(4, 30, 7), task.sample(4, 30, 7), task.sample(4, 30, 8)
    for f in ("tokens", "targets", "loss_mask", "states"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert not torch.equal(a.tokens, c.tokens)
    rebuilt = make_task(task.name, **json.loads(json.dumps(task.options())))
    assert torch.equal(rebuilt.sample(4, 30, 7).tokens, a.tokens)
    assert rebuilt.vocab_size == task.vocab_size


def test_bad_arguments():
    with pytest.raises(ValueError, match="format"):
        make_task("S3", format="acto")
    with pytest.raises(ValueError, match="formt"):
        make_task("S3", formt="acot")
    with pytest.raises(ValueError, match="did you mean"):
        make_task("S33")
    with pytest.raises(TypeError):
        make_task(3)
    task = make_task("S3")
    for kwargs in ({"n": 0, "length": 5, "seed": 0}, {"n": 2, "length": 0, "seed": 0},
                   {"n": 2, "length": 5, "seed": -1}, {"n": 2.5, "length": 5, "seed": 0}):
        with pytest.raises(ValueError):
            task.sample(**kwargs)
