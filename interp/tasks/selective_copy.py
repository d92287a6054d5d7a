"""Selective copying (seed 001): the tokens to copy are scattered among
noise tokens at random positions and must be reproduced in order after the context, one per marker.

Sequence (L = `length`, the context positions; k = `n_tokens`, the tokens to copy):

    x_1 .. x_L  MARK_1 .. MARK_k                                        T_tokens = L + k

    context   k positions p_1 < .. < p_k drawn uniformly without replacement from 0..L-1 hold
              data tokens d_1 .. d_k (uniform over the n_data data ids, with replacement); every
              other context position holds NOISE
    markers   positions L .. L+k-1 hold MARK; marker j (position L+j-1) must output d_j

Token ids: NOISE = 0, MARK = 1, data 2 .. 2+n_data-1 (`data_ids`); vocab_size = 2 + n_data.
The output is not teacher-forced: the model never sees the tokens it emits, so every marker has
to read the j-th stored token from the state; a time-invariant convolution cannot pick the data
tokens out of the noise by content, a selective (input-dependent) recurrence can.

targets [N, T]: d_j at marker j, NOISE elsewhere (no loss there); loss_mask: the k markers.
states [N, T, k] int64: the ground truth memory after each position, the data tokens seen so far
in order (d_1 .. d_m after the m-th data token) and -1 for slots not yet filled, so at every
marker it is (d_1 .. d_k).
roles [N, k]: `token` the context positions p_j of the data tokens, `marker` the positions
L+j-1 that output them (the loss positions).
"""

from __future__ import annotations

import numpy as np
import torch

from interp.tasks.base import Batch
from interp.tasks.common import check_count, make_rng, roles_to_torch
from interp.tasks.recall import permuted_prefix

NOISE, MARK = 0, 1


class SelectiveCopy:
    """Selective copying of `n_tokens` data tokens (of `n_data` kinds) out of `length` context positions."""

    OPTIONS = ("n_tokens", "n_data")
    OPTION_HINTS = {"n_context": "the number of context positions is the `length` argument of sample()"}
    name = "SelectiveCopy"

    def __init__(self, n_tokens: int = 4, n_data: int = 8) -> None:
        self.n_tokens = check_count("n_tokens", n_tokens)
        self.n_data = check_count("n_data", n_data, minimum=2)
        self.data_ids = range(2, 2 + self.n_data)
        self.vocab_size = 2 + self.n_data

    def __repr__(self) -> str:
        return f"SelectiveCopy(n_tokens={self.n_tokens}, n_data={self.n_data})"

    def options(self) -> dict:
        return {"n_tokens": self.n_tokens, "n_data": self.n_data}

    def sample(self, n: int, length: int, seed) -> Batch:
        check_count("n", n)
        check_count("length", length)
        k = self.n_tokens
        if length < k:
            raise ValueError(f"length (context positions) must be >= n_tokens={k}; got {length}")
        rng = make_rng(seed)
        positions = np.sort(permuted_prefix(rng, n, length, k), axis=1)             # [N, k]
        data = rng.integers(0, self.n_data, size=(n, k), dtype=np.int64) + self.data_ids.start  # [N, k]
        T = length + k
        tokens = np.full((n, T), NOISE, dtype=np.int64)
        np.put_along_axis(tokens, positions, data, axis=1)
        tokens[:, length:] = MARK
        targets = np.full_like(tokens, NOISE)
        targets[:, length:] = data
        loss_mask = np.zeros((n, T), dtype=bool)
        loss_mask[:, length:] = True
        # memory after each position: slot j holds d_j once position p_j has been read
        filled = np.arange(T)[None, :, None] >= positions[:, None, :]               # [N, T, k]
        states = np.where(filled, data[:, None, :], -1)
        markers = np.broadcast_to(length + np.arange(k), (n, k))
        return Batch(torch.from_numpy(tokens), torch.from_numpy(targets), torch.from_numpy(loss_mask),
                     torch.from_numpy(np.ascontiguousarray(states)),
                     roles_to_torch({"token": positions, "marker": markers}))
