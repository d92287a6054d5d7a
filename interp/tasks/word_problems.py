"""Group word problems: read group elements, track their running product.

Each input token is a group element x_t (token id = element id, 0..n-1, see `groups`); the
latent state is the running product, taken left to right:

    s_t = x_1 x_2 ... x_t = table[s_{t-1}, x_t],    s_0 = identity (0)

`length` is the number of group elements T. Inputs are drawn uniformly from all n elements.

Formats (what the model sees and where the loss is):

    outcome  tokens x_1..x_T                  [N, T]; targets[t] = s_{t+1} (0-based t) at every
             position, loss_mask only at the last position (the final state s_T).
    acot     aligned chain of thought: the same tokens and targets, loss at every position.
    cot      chain of thought emitted after the input, next-token targets:
                 tokens  = x_1 .. x_T  SEP  s_1 .. s_{T-1}          [N, 2T]
                 targets = x_2 .. x_T  SEP  s_1 .. s_T              (tokens shifted by one)
             SEP = n (vocab_size n + 1); loss_mask on the state part only, positions T..2T-1
             (the SEP position predicts s_1, the position of token s_j predicts s_{j+1}).

states [N, T_tokens] int64: for outcome / acot states[:, t] = s_{t+1}, the product of the inputs
read so far. For cot, positions 0..T-1 (the inputs) carry the product so far, s_1..s_T, and
positions T..2T-1 (SEP and the emitted states) carry the state the position must output,
s_1..s_T, which equals its target.

roles: `last` [N] the position of the last input element x_T (T-1); cot adds `sep` [N] (T).
"""

from __future__ import annotations

import numpy as np
import torch

from interp.tasks.base import Batch
from interp.tasks.common import check_choice, check_count, make_rng
from interp.tasks.groups import Group, group

FORMATS = ("outcome", "acot", "cot")


def running_product(table: np.ndarray, elements: np.ndarray) -> np.ndarray:
    """s[:, t] = x[:, 0] x[:, 1] ... x[:, t] for elements x [N, T] under `table` [n, n].  -> [N, T]

    A loop over positions vectorised across the batch (on time-major copies so each step reads
    and writes contiguous rows; a flat `take` on the table is the cheapest gather in numpy).
    """
    n = table.shape[0]
    flat = np.ascontiguousarray(table, dtype=np.int64).reshape(-1)
    x = np.ascontiguousarray(elements.T, dtype=np.int64)          # [T, N]
    s = np.empty_like(x)
    if x.shape[0]:
        s[0] = x[0]
    for t in range(1, x.shape[0]):
        np.take(flat, s[t - 1] * n + x[t], out=s[t])
    return np.ascontiguousarray(s.T)                              # [N, T]


class WordProblem:
    """The word problem of a named group (e.g. "S3", "Z5", "A4xZ5") in one supervision format."""

    OPTIONS = ("format",)

    def __init__(self, name: str, format: str = "acot") -> None:
        self.group: Group = group(name)
        self.name = name
        self.format = check_choice("format", format, FORMATS)
        self.n_states = self.group.order
        self.sep = self.n_states if self.format == "cot" else None
        self.vocab_size = self.n_states + (1 if self.format == "cot" else 0)

    def __repr__(self) -> str:
        return f"WordProblem({self.name!r}, format={self.format!r})"

    def options(self) -> dict:
        return {"format": self.format}

    def sample(self, n: int, length: int, seed) -> Batch:
        check_count("n", n)
        check_count("length", length)
        rng = make_rng(seed)
        x = rng.integers(0, self.n_states, size=(n, length), dtype=np.int64)   # [N, T]
        s = running_product(self.group.table, x)                                # [N, T]
        last = torch.full((n,), length - 1, dtype=torch.int64)
        x, s = torch.from_numpy(x), torch.from_numpy(s)
        if self.format != "cot":
            mask = torch.ones(n, length, dtype=torch.bool)
            if self.format == "outcome":
                mask[:, :-1] = False
            return Batch(x, s, mask, s.clone(), {"last": last})
        sep = torch.full((n, 1), self.sep, dtype=torch.int64)
        tokens = torch.cat([x, sep, s[:, :-1]], dim=1)                          # [N, 2T]
        targets = torch.cat([x[:, 1:], sep, s], dim=1)                          # [N, 2T]
        mask = torch.zeros(n, 2 * length, dtype=torch.bool)
        mask[:, length:] = True
        states = torch.cat([s, s], dim=1)
        return Batch(tokens, targets, mask, states, {"last": last, "sep": last + 1})
