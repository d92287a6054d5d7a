"""Associative recall (AR) and multi-query associative recall (MQAR).

Sequence (L = `length`, the number of key-value pairs in context; k = number of queries):

    BOS k_1 v_1 ... k_L v_L EOS q_1 a_1 ... q_k a_k              T_tokens = 2L + 2 + 2k

    position  0      BOS
              1+2i   key k_{i+1}        2+2i   its value v_{i+1}        (i = 0..L-1)
              2L+1   EOS
              2L+2+2j  query q_{j+1}    2L+3+2j  its answer a_{j+1}    (j = 0..k-1)

Token ids: BOS = 0, EOS = 1, keys 2 .. 2+n_keys-1 (`key_ids`), values 2+n_keys ..
2+n_keys+n_values-1 (`value_ids`); vocab_size = 2 + n_keys + n_values. In each sequence the L keys
are drawn without replacement, and so are the L values (so a value also identifies its pair).
Each query is one of the in-context keys (the k queries are distinct keys), its answer the value
paired with it in context.

Targets follow the next-token convention: targets[:, t] = tokens[:, t+1] (the last target is EOS).
The loss (loss_mask) is only at the query positions, whose target is the answer a_j; the answer
token itself follows as input (teacher forcing) and carries no loss.

roles (AR: [N]; MQAR: [N, k], one column per query):
    key     position of the queried key's occurrence in context (1+2i)
    value   position of its paired value (2+2i)
    query   position of the query token (carries the loss)
    answer  position of the answer token (query + 1)
    bos, eos  positions of BOS (0) and EOS (2L + 1), the same in every column for MQAR

states [N, T_tokens] int64: the value token bound to the key at that position - at a key or value
position the value of that pair, at a query or answer position the answer; -1 at BOS and EOS.
"""

from __future__ import annotations

import numpy as np
import torch

from interp.tasks.base import Batch
from interp.tasks.common import check_count, make_rng, roles_to_torch

BOS, EOS = 0, 1


def permuted_prefix(rng: np.random.Generator, n: int, size: int, count: int) -> np.ndarray:
    """`n` rows of `count` distinct draws from 0..size-1 (uniform, without replacement).  [n, count]"""
    rows = np.broadcast_to(np.arange(size, dtype=np.int64), (n, size))
    return rng.permuted(rows, axis=1)[:, :count]


class MultiQueryRecall:
    """MQAR: `n_queries` distinct in-context keys queried after EOS; roles are [N, n_queries]."""

    OPTIONS = ("n_keys", "n_values", "n_queries")
    OPTION_HINTS = {"n_pairs": "the number of pairs in context is the `length` argument of sample()"}
    name = "MQAR"

    def __init__(self, n_keys: int = 64, n_values: int = 64, n_queries: int = 4) -> None:
        self.n_keys = check_count("n_keys", n_keys)
        self.n_values = check_count("n_values", n_values)
        self.n_queries = check_count("n_queries", n_queries)
        self.bos, self.eos = BOS, EOS
        self.key_ids = range(2, 2 + self.n_keys)
        self.value_ids = range(2 + self.n_keys, 2 + self.n_keys + self.n_values)
        self.vocab_size = 2 + self.n_keys + self.n_values

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in self.options().items())})"

    def options(self) -> dict:
        return {"n_keys": self.n_keys, "n_values": self.n_values, "n_queries": self.n_queries}

    def max_length(self) -> int:
        """The largest `length` (pairs in context) that fits the key and value vocabularies."""
        return min(self.n_keys, self.n_values)

    def sample(self, n: int, length: int, seed) -> Batch:
        check_count("n", n)
        check_count("length", length)
        if length > self.max_length():
            raise ValueError(f"length (pairs in context) must be <= min(n_keys, n_values) = "
                             f"{self.max_length()} for pairs without replacement; got {length}")
        if self.n_queries > length:
            raise ValueError(f"n_queries={self.n_queries} distinct queries need length >= "
                             f"n_queries; got length={length}")
        rng = make_rng(seed)
        L, k = length, self.n_queries
        keys = permuted_prefix(rng, n, self.n_keys, L) + self.key_ids.start          # [N, L]
        values = permuted_prefix(rng, n, self.n_values, L) + self.value_ids.start    # [N, L]
        if k == 1:   # one query: a uniform pair index (cheaper than a permutation)
            pair = rng.integers(0, L, size=(n, 1), dtype=np.int64)                   # [N, 1]
        else:
            pair = permuted_prefix(rng, n, L, k)                                     # [N, k]
        query = np.take_along_axis(keys, pair, axis=1)                               # [N, k]
        answer = np.take_along_axis(values, pair, axis=1)                            # [N, k]

        T = 2 * L + 2 + 2 * k
        tokens = np.empty((n, T), dtype=np.int64)
        tokens[:, 0], tokens[:, 2 * L + 1] = BOS, EOS
        tokens[:, 1:2 * L + 1:2], tokens[:, 2:2 * L + 2:2] = keys, values
        tokens[:, 2 * L + 2::2], tokens[:, 2 * L + 3::2] = query, answer
        targets = np.empty_like(tokens)
        targets[:, :-1], targets[:, -1] = tokens[:, 1:], EOS
        states = np.full_like(tokens, -1)
        states[:, 1:2 * L + 1:2] = states[:, 2:2 * L + 2:2] = values
        states[:, 2 * L + 2::2] = states[:, 2 * L + 3::2] = answer
        loss_mask = np.zeros((n, T), dtype=bool)
        loss_mask[:, 2 * L + 2::2] = True

        query_pos = np.broadcast_to(2 * L + 2 + 2 * np.arange(k), (n, k))
        roles = {"key": 1 + 2 * pair, "value": 2 + 2 * pair, "query": query_pos, "answer": query_pos + 1,
                 "bos": np.zeros((n, k), dtype=np.int64), "eos": np.full((n, k), 2 * L + 1, dtype=np.int64)}
        return Batch(torch.from_numpy(tokens), torch.from_numpy(targets), torch.from_numpy(loss_mask),
                     torch.from_numpy(states), self._roles(roles))

    def _roles(self, roles: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return roles_to_torch(roles)


class AssociativeRecall(MultiQueryRecall):
    """AR: one query per sequence; roles are [N]."""

    OPTIONS = ("n_keys", "n_values")
    name = "AR"

    def __init__(self, n_keys: int = 64, n_values: int = 64) -> None:
        super().__init__(n_keys, n_values, n_queries=1)

    def options(self) -> dict:
        return {"n_keys": self.n_keys, "n_values": self.n_values}

    def _roles(self, roles: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return super()._roles({name: pos[:, 0] for name, pos in roles.items()})
