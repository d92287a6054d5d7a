"""PFSA-SR: probabilistic swaps with deterministic reveals, and the exact belief state.

Hidden state: an arrangement of n items in n slots (`n_items`), a permutation `vals` with
vals[i] = item in slot i, given as its S_n element id (`groups`; `task.group.perms[id] == vals`).

Tokens (`length` = number of swap actions; a reveal after every `reveal_every` actions):
    SWAP_{i,j}   an attempted swap of slots i < j: it happens with probability p (a hidden coin),
                 vals <- vals[(i j)]                       ids 0 .. n(n-1)/2 - 1 (pairs in
                                                           lexicographic order, `pairs`)
    ASK_i        a reveal of slot i ...                    ids P .. P+n-1      (P = n(n-1)/2)
    ITEM_v       ... answered with the item v it holds     ids P+n .. P+2n-1   vocab_size = P + 2n
A reveal is the two tokens ASK_i ITEM_v, v the true item (reveals are deterministic). The slot is
uniform per reveal (`reveal="random"`) or always slot 0 (`reveal="adversarial"`: one item revealed
over and over while the swaps stay random). With `full_every=m` (0: never) every m-th reveal is
full: ASK_0 ITEM ASK_1 ITEM ... ASK_{n-1} ITEM, every slot in order, which pins the arrangement
down; the others are partial (one slot). `since_full(length)` counts, per ASK token, the partial
reveals before it since the last full reveal (or the start). The initial arrangement is the identity and known
(`init="identity"`) or uniform and unknown (`init="uniform"`: drawn uniformly, prior uniform).

Belief b_t over the n! arrangements, the posterior given the tokens up to and including t
(the normalised belief update of seed 004):
    SWAP_{i,j}:  b <- (1 - p) b + p b o (i j)          (b o s)[g] = b[g * s^-1]
    ASK_i:       b unchanged
    ITEM_v:      b <- b * [vals_g[i] = v] / sum(...)    prune inconsistent states, renormalise
states [N, T, n!] float32 (computed in float64): b_t at every position. `marginals(states)` [N, T, n, n]: probability
that slot i holds item v.

Targets are next-token (targets[:, t] = tokens[:, t+1], the last target a copy of the last
token); loss_mask: `loss="reveals"` only at the ASK positions (target: the revealed item, whose
Bayes-optimal prediction is the belief marginal of that slot), `loss="all"` at every position but
the last. roles: `reveal` [N, R] the ASK positions, `reveal_value` = reveal + 1 (the ITEM tokens).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from interp.tasks.base import Batch
from interp.tasks.common import check_choice, check_count, make_rng, roles_to_torch
from interp.tasks.groups import Group, symmetric
from interp.tasks.repl import permutation_ids

REVEALS = ("random", "adversarial")
INITS = ("identity", "uniform")
LOSSES = ("reveals", "all")


def swap_update(belief: np.ndarray, swap_ids: np.ndarray, p: float, group: Group) -> np.ndarray:
    """(1 - p) b + p (b o s) for beliefs [N, n!] and transposition ids [N] (self-inverse)."""
    # (b o s)[g] = b[g * s]: gather column s of the table for every row.
    moved = np.take_along_axis(belief, group.table.T[swap_ids], axis=1)
    return (1.0 - p) * belief + p * moved


def reveal_update(belief: np.ndarray, slots: np.ndarray, items: np.ndarray, group: Group) -> np.ndarray:
    """Prune arrangements with vals[slot] != item and renormalise: beliefs [N, n!], slots/items [N]."""
    consistent = group.perms[:, slots].T == items[:, None]                  # [N, n!]
    pruned = np.where(consistent, belief, 0.0)
    return pruned / pruned.sum(axis=1, keepdims=True)


class PfsaSwaps:
    """PFSA-SR with probabilistic swaps and exact beliefs; see the module docstring."""

    OPTIONS = ("n_items", "p", "reveal_every", "reveal", "init", "loss", "full_every")
    name = "PFSA"

    def __init__(self, n_items: int = 3, p: float = 0.5, reveal_every: int = 2,
                 reveal: str = "random", init: str = "identity", loss: str = "reveals", full_every: int = 0) -> None:
        self.n_items = check_count("n_items", n_items, minimum=2)
        if self.n_items > 6:
            raise ValueError(f"n_items must be <= 6 (beliefs are over n! arrangements); got {n_items}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise ValueError(f"p (swap probability) must be a number in [0, 1]; got {p!r}")
        self.p = float(p)
        self.reveal_every = check_count("reveal_every", reveal_every)
        self.full_every = check_count("full_every", full_every, minimum=0)
        self.reveal = check_choice("reveal", reveal, REVEALS)
        self.init = check_choice("init", init, INITS)
        self.loss = check_choice("loss", loss, LOSSES)
        self.group = symmetric(self.n_items)
        self.n_states = self.group.order
        n = self.n_items
        self.pairs = np.array(list(itertools.combinations(range(n), 2)), dtype=np.int64)   # [P, 2]
        transpositions = np.broadcast_to(np.arange(n), (len(self.pairs), n)).copy()
        transpositions[np.arange(len(self.pairs)), self.pairs[:, 0]] = self.pairs[:, 1]
        transpositions[np.arange(len(self.pairs)), self.pairs[:, 1]] = self.pairs[:, 0]
        self.swap_element = permutation_ids(transpositions, self.group.perms)               # [P]
        self.swap_ids = range(0, len(self.pairs))
        self.ask_ids = range(len(self.pairs), len(self.pairs) + n)
        self.item_ids = range(len(self.pairs) + n, len(self.pairs) + 2 * n)
        self.vocab_size = len(self.pairs) + 2 * n

    def __repr__(self) -> str:
        return f"PfsaSwaps({', '.join(f'{k}={v!r}' for k, v in self.options().items())})"

    def options(self) -> dict:
        return {"n_items": self.n_items, "p": self.p, "reveal_every": self.reveal_every,
                "reveal": self.reveal, "init": self.init, "loss": self.loss, "full_every": self.full_every}

    def marginals(self, states: torch.Tensor) -> torch.Tensor:
        """P(slot i holds item v) from joint beliefs [..., n!].  -> [..., n, n]"""
        n = self.n_items
        onehot = torch.zeros(self.n_states, n, n, dtype=states.dtype)
        perms = torch.tensor(self.group.perms)
        onehot[torch.arange(self.n_states)[:, None], torch.arange(n)[None, :], perms] = 1
        return torch.einsum("...g,giv->...iv", states, onehot)

    def full_reveals(self, length: int) -> np.ndarray:
        """Which of the length // reveal_every reveals are full: bool [R]."""
        number = np.arange(1, length // self.reveal_every + 1)
        return number % self.full_every == 0 if self.full_every else np.zeros(len(number), dtype=bool)

    def layout(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions of the swap tokens [L] and of the ASK tokens [A] for `length` swaps
        (A = R partial reveals + n per full reveal)."""
        sizes = np.where(self.full_reveals(length), self.n_items, 1)                # ASK tokens per reveal
        asks_before = np.concatenate([[0], np.cumsum(sizes)])                       # [R + 1]
        swap_pos = np.arange(length) + 2 * asks_before[np.arange(length) // self.reveal_every]
        first = swap_pos[self.reveal_every - 1::self.reveal_every] + 1               # [R] first ASK per reveal
        ask_pos = np.concatenate([start + 2 * np.arange(size) for start, size in zip(first, sizes)]).astype(np.int64)
        return swap_pos, ask_pos

    def fixed_slots(self, length: int) -> np.ndarray:
        """Per ASK token [A]: its slot in a full reveal, -1 in a partial one (drawn per sequence)."""
        return np.concatenate([np.arange(self.n_items) if full else [-1]
                               for full in self.full_reveals(length)]).astype(np.int64)

    def since_full(self, length: int) -> np.ndarray:
        """Per ASK token [A]: partial reveals before it since the last full reveal (or the start)."""
        counts, k = [], 0
        for full in self.full_reveals(length):
            counts += [k] * (self.n_items if full else 1)
            k = 0 if full else k + 1
        return np.array(counts, dtype=np.int64)

    def sample(self, n: int, length: int, seed) -> Batch:
        check_count("n", n)
        check_count("length", length)
        rng = make_rng(seed)
        k, G = self.n_items, self.group
        swap_pos, ask_pos = self.layout(length)
        R, T = len(ask_pos), length + 2 * len(ask_pos)                            # R: ASK tokens
        pair = rng.integers(0, len(self.pairs), size=(n, length))                 # [N, L]
        happens = rng.random((n, length)) < self.p                                # [N, L]
        slot = (rng.integers(0, k, size=(n, R)) if self.reveal == "random"
                else np.zeros((n, R), dtype=np.int64))                            # [N, R]
        fixed = self.fixed_slots(length)
        slot = np.where(fixed >= 0, fixed, slot)
        start = (rng.integers(0, self.n_states, size=n) if self.init == "uniform"
                 else np.zeros(n, dtype=np.int64))
        if self.init == "identity":
            belief = np.zeros((n, self.n_states))
            belief[:, 0] = 1.0
        else:
            belief = np.full((n, self.n_states), 1.0 / self.n_states)

        tokens = np.empty((n, T), dtype=np.int64)
        states = np.empty((n, T, self.n_states), dtype=np.float32)   # computed in float64
        kind = np.zeros(T, dtype=np.int64)              # 0 swap, 1 ask, 2 item
        kind[ask_pos], kind[ask_pos + 1] = 1, 2
        index = np.zeros(T, dtype=np.int64)             # swap number or reveal number
        index[swap_pos], index[ask_pos], index[ask_pos + 1] = np.arange(length), np.arange(R), np.arange(R)
        truth = start
        # One step per position, vectorised across the batch (the belief update is sequential).
        for t in range(T):
            j = index[t]
            if kind[t] == 0:
                tokens[:, t] = pair[:, j]
                swap = self.swap_element[pair[:, j]]
                truth = np.where(happens[:, j], G.table[truth, swap], truth)
                belief = swap_update(belief, swap, self.p, G)
            elif kind[t] == 1:
                tokens[:, t] = self.ask_ids.start + slot[:, j]
            else:
                item = G.perms[truth, slot[:, j]]
                tokens[:, t] = self.item_ids.start + item
                belief = reveal_update(belief, slot[:, j], item, G)
            states[:, t] = belief

        targets = np.empty_like(tokens)
        targets[:, :-1], targets[:, -1] = tokens[:, 1:], tokens[:, -1]
        loss_mask = np.zeros((n, T), dtype=bool)
        if self.loss == "all":
            loss_mask[:, :-1] = True
        else:
            loss_mask[:, ask_pos] = True
        roles = {"reveal": np.broadcast_to(ask_pos, (n, R)), "reveal_value": np.broadcast_to(ask_pos + 1, (n, R))}
        return Batch(torch.from_numpy(tokens), torch.from_numpy(targets), torch.from_numpy(loss_mask),
                     torch.from_numpy(states),
                     roles_to_torch(roles))
