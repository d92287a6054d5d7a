"""Selective copying: the layout checked one sequence at a time against the module docstring."""

import numpy as np
import pytest

from interp.tasks import make_task
from interp.tasks.selective_copy import MARK, NOISE


@pytest.mark.parametrize("k,n_data,L", [(1, 2, 1), (3, 5, 3), (4, 8, 20)])
def test_layout_roles_states_and_targets(k, n_data, L):
    task = make_task("SelectiveCopy", n_tokens=k, n_data=n_data)
    assert task.vocab_size == 2 + n_data
    b = task.sample(64, L, seed=3)
    assert b.tokens.shape == (64, L + k) and b.states.shape == (64, L + k, k)
    for i in range(len(b)):
        tok = b.tokens[i].tolist()
        where = b.roles["token"][i].tolist()
        data = [tok[p] for p in where]
        assert where == sorted(set(where)) and all(0 <= p < L for p in where)       # distinct, in order
        assert all(d in task.data_ids for d in data)
        assert all(tok[t] == NOISE for t in range(L) if t not in where)              # noise elsewhere
        assert tok[L:] == [MARK] * k and b.roles["marker"][i].tolist() == list(range(L, L + k))
        assert b.loss_mask[i].nonzero().reshape(-1).tolist() == list(range(L, L + k))
        assert b.targets[i, L:].tolist() == data                                      # copied in order
        assert (b.targets[i, :L] == NOISE).all()
        for t in range(L + k):                                                        # memory so far
            seen = [tok[p] for p in where if p <= t]
            assert b.states[i, t].tolist() == seen + [-1] * (k - len(seen))


def test_positions_and_tokens_are_uniform():
    """Each context position is a data position with probability k / L; data ids are uniform."""
    task = make_task("SelectiveCopy", n_tokens=4, n_data=4)
    b = task.sample(4000, 16, seed=0)
    share = np.bincount(b.roles["token"].reshape(-1).numpy(), minlength=16) / 4000
    assert np.allclose(share, 4 / 16, atol=0.03)
    counts = np.bincount(b.targets[:, 16:].reshape(-1).numpy() - 2, minlength=4) / (4000 * 4)
    assert np.allclose(counts, 0.25, atol=0.02)


def test_bad_arguments_name_what_is_allowed():
    with pytest.raises(ValueError, match="length .* >= n_tokens=4"):
        make_task("SelectiveCopy").sample(2, 3, seed=0)
    with pytest.raises(ValueError, match="n_data"):
        make_task("SelectiveCopy", n_data=1)
    with pytest.raises(ValueError, match="`length` argument"):
        make_task("SelectiveCopy", n_context=8)
