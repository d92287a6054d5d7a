"""REPL traces: permutation composition written as Python statements, with `print` reveals.

A trace over n variables a, b, c, ... (n = `n_vars`, 2..8) holding the values 0..n-1:

    a , b , c = 2 , 0 , 1            init line: a random arrangement (identity if not random_init)
    a , c = c , a                    `length` statements, one per line
    b , c , a = c , a , b
    print ( a , c )                  a reveal every `reveal_every` statements and after the last
    1 0                              ... followed by the REPL's output: the revealed values
    ...

Statement forms (`ops`), all with a fixed token count so a batch is rectangular:
    "swap"   x , y = y , x                 two distinct variables        8 tokens
    "cycle"  x , y , z = y , z , x         three distinct variables     12 tokens (needs n >= 3)
    "full"   a , b , ... = p_a , p_b , ... a uniform permutation        4n tokens
A reveal prints m = max(1, round(reveal_fraction * n)) variables (a random subset, listed in
alphabetical order; all of them when reveal_fraction = 1): `print ( ... )` then the output line,
3m + 4 tokens in all.

Tokeniser (word level; joining the tokens of a line with spaces gives valid Python, `decode`):
    0 NEWLINE   1 ","   2 "="   3 "print"   4 "("   5 ")"
    6 .. 6+n-1        variable names a, b, c, ...
    6+n .. 6+2n-1     values 0 .. n-1                      vocab_size = 6 + 2n

State: the arrangement `vals` (vals[i] = value held by variable i), a permutation of 0..n-1,
given as its element id in S_n (`groups`, `task.group.perms[id] == vals`). A statement
`x_1, .., x_k = y_1, .., y_k` is the permutation p with p[x_j] = y_j (identity elsewhere) and
vals <- vals[p] = vals * p, so states are a running product over [init, p_1, ..., p_L].
states [N, T] int64: the arrangement after the last statement whose NEWLINE is at or before t
(the init arrangement at positions of the init line).

Targets are next-token: targets[:, t] = tokens[:, t+1] (the last target NEWLINE). loss_mask:
`loss="all"` every position but the last; `loss="reveals"` only the positions whose target is a
revealed value. roles: `reveal` [N, R*m] the positions predicting a revealed value (the loss
positions under loss="reveals"); `reveal_value` = reveal + 1, the value tokens themselves.
"""

from __future__ import annotations

import numpy as np
import torch

from interp.tasks.base import Batch
from interp.tasks.common import check_choice, check_count, make_rng, roles_to_torch
from interp.tasks.groups import symmetric
from interp.tasks.word_problems import running_product

NEWLINE, COMMA, EQUALS, PRINT, LPAREN, RPAREN = range(6)
_PUNCT = {NEWLINE: "\n", COMMA: ",", EQUALS: "=", PRINT: "print", LPAREN: "(", RPAREN: ")"}
OPS = ("swap", "cycle", "full")
LOSSES = ("all", "reveals")
NAMES = "abcdefgh"


def permutation_ids(perms: np.ndarray, group_perms: np.ndarray) -> np.ndarray:
    """The S_n element id of each permutation in perms [..., n] (group_perms in lexicographic order)."""
    n = perms.shape[-1]
    radix = n ** np.arange(n - 1, -1, -1, dtype=np.int64)
    return np.searchsorted(group_perms @ radix, perms @ radix)


class ReplTrace:
    """REPL traces of permutation composition; see the module docstring."""

    OPTIONS = ("n_vars", "ops", "reveal_every", "reveal_fraction", "random_init", "loss")
    name = "REPL"

    def __init__(self, n_vars: int = 3, ops: str = "swap", reveal_every: int = 4,
                 reveal_fraction: float = 1.0, random_init: bool = True, loss: str = "all") -> None:
        self.n_vars = check_count("n_vars", n_vars, minimum=2)
        if self.n_vars > len(NAMES):
            raise ValueError(f"n_vars must be <= {len(NAMES)}; got {n_vars}")
        self.ops = check_choice("ops", ops, OPS)
        if ops == "cycle" and self.n_vars < 3:
            raise ValueError(f"ops='cycle' needs n_vars >= 3; got n_vars={n_vars}")
        self.reveal_every = check_count("reveal_every", reveal_every)
        if isinstance(reveal_fraction, bool) or not isinstance(reveal_fraction, (int, float)) \
                or not 0 < reveal_fraction <= 1:
            raise ValueError(f"reveal_fraction must be a number in (0, 1]; got {reveal_fraction!r}")
        self.reveal_fraction = float(reveal_fraction)
        if not isinstance(random_init, bool):
            raise TypeError(f"random_init must be a bool; got {type(random_init).__name__}")
        self.random_init = random_init
        self.loss = check_choice("loss", loss, LOSSES)
        self.group = symmetric(self.n_vars)
        self.n_states = self.group.order
        self.n_revealed = max(1, round(self.reveal_fraction * self.n_vars))
        self.name_ids = range(6, 6 + self.n_vars)
        self.value_ids = range(6 + self.n_vars, 6 + 2 * self.n_vars)
        self.vocab_size = 6 + 2 * self.n_vars

    def __repr__(self) -> str:
        return f"ReplTrace({', '.join(f'{k}={v!r}' for k, v in self.options().items())})"

    def options(self) -> dict:
        return {"n_vars": self.n_vars, "ops": self.ops, "reveal_every": self.reveal_every,
                "reveal_fraction": self.reveal_fraction, "random_init": self.random_init,
                "loss": self.loss}

    def decode(self, tokens) -> str:
        """Python text of one trace [T] (tokens joined by spaces, one line per NEWLINE)."""
        words = []
        for tok in (int(t) for t in tokens):
            if tok in _PUNCT:
                words.append(_PUNCT[tok])
            elif tok in self.name_ids:
                words.append(NAMES[tok - self.name_ids.start])
            elif tok in self.value_ids:
                words.append(str(tok - self.value_ids.start))
            else:
                raise ValueError(f"token {tok} is not in the REPL vocabulary (0..{self.vocab_size - 1})")
        return " ".join(words).replace(" \n ", "\n").replace(" \n", "\n")

    # -- sampling ---------------------------------------------------------------------------------

    def _statements(self, rng, n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Left- and right-hand variable indices of each statement: two [N, L, k] arrays."""
        k = self.n_vars
        if self.ops == "full":
            lhs = np.broadcast_to(np.arange(k), (n, length, k))
            return lhs, rng.permuted(np.broadcast_to(np.arange(k), (n, length, k)), axis=2)
        chosen = rng.permuted(np.broadcast_to(np.arange(k), (n, length, k)), axis=2)
        size = 2 if self.ops == "swap" else 3
        lhs = chosen[..., :size]
        return lhs, np.roll(lhs, -1, axis=2)       # swap: (x, y) <- (y, x); cycle: (x,y,z) <- (y,z,x)

    def _line(self, left: np.ndarray, right: np.ndarray | None = None) -> np.ndarray:
        """Tokens of `l1 , l2 , .. [= r1 , r2 , ..] NEWLINE` for id arrays [..., k].  -> [..., 4k or 2k]"""
        def listed(ids):
            out = np.full(ids.shape[:-1] + (2 * ids.shape[-1] - 1,), COMMA, dtype=np.int64)
            out[..., ::2] = ids
            return out
        parts = [listed(left)]
        if right is not None:
            parts += [np.full(left.shape[:-1] + (1,), EQUALS, dtype=np.int64), listed(right)]
        parts.append(np.full(left.shape[:-1] + (1,), NEWLINE, dtype=np.int64))
        return np.concatenate(parts, axis=-1)

    def sample(self, n: int, length: int, seed) -> Batch:
        check_count("n", n)
        check_count("length", length)
        rng = make_rng(seed)
        k, m = self.n_vars, self.n_revealed
        names, values = self.name_ids.start, self.value_ids.start
        init = rng.permuted(np.broadcast_to(np.arange(k), (n, k)), axis=1) if self.random_init \
            else np.broadcast_to(np.arange(k), (n, k))                           # [N, k]
        lhs, rhs = self._statements(rng, n, length)                             # [N, L, s]
        perm = np.broadcast_to(np.arange(k), (n, length, k)).copy()
        np.put_along_axis(perm, lhs, rhs, axis=2)                               # p[x_j] = y_j
        ids = permutation_ids(np.concatenate([init[:, None], perm], axis=1), self.group.perms)
        arrangement = running_product(self.group.table, ids)                    # [N, L+1]

        # Reveals after statements j = every, 2 every, ... and after the last one.
        after = np.unique(np.r_[np.arange(self.reveal_every, length + 1, self.reveal_every), length])
        R = len(after)
        shown = np.sort(rng.permuted(np.broadcast_to(np.arange(k), (n, R, k)), axis=2)[..., :m], axis=2)
        vals = self.group.perms[arrangement[:, after]]                          # [N, R, k]
        revealed = np.take_along_axis(vals, shown, axis=2)                      # [N, R, m]
        print_line = np.concatenate([np.full((n, R, 2), [PRINT, LPAREN]), self._line(shown + names)[..., :-1],
                                     np.full((n, R, 2), [RPAREN, NEWLINE])], axis=2)
        output_line = np.concatenate([revealed + values, np.full((n, R, 1), NEWLINE)], axis=2)
        reveal_block = np.concatenate([print_line, output_line], axis=2)        # [N, R, 3m+4]

        init_line = self._line(np.broadcast_to(np.arange(k) + names, (n, k)), init + values)   # [N, 4k]
        statement_block = self._line(lhs + names, rhs + names)                  # [N, L, 4s]
        S, V = statement_block.shape[2], reveal_block.shape[2]
        # Block start positions: init, then statement j followed by its reveal when j is in `after`.
        n_reveals_before = np.searchsorted(after, np.arange(1, length + 1), side="left")  # reveals before stmt j
        stmt_start = 4 * k + np.arange(length) * S + n_reveals_before * V
        reveal_start = stmt_start[after - 1] + S
        T = 4 * k + length * S + R * V
        tokens = np.empty((n, T), dtype=np.int64)
        tokens[:, :4 * k] = init_line
        tokens[:, (stmt_start[:, None] + np.arange(S)).reshape(-1)] = statement_block.reshape(n, -1)
        tokens[:, (reveal_start[:, None] + np.arange(V)).reshape(-1)] = reveal_block.reshape(n, -1)

        # State at t: the arrangement after the statements whose NEWLINE is at or before t.
        done = np.searchsorted(stmt_start + S - 1, np.arange(T), side="right")   # [T] in 0..L
        states = arrangement[:, done]
        targets = np.empty_like(tokens)
        targets[:, :-1], targets[:, -1] = tokens[:, 1:], NEWLINE
        value_pos = (reveal_start[:, None] + 2 * m + 3 + np.arange(m)).reshape(-1)   # [R*m]
        loss_mask = np.zeros((n, T), dtype=bool)
        if self.loss == "all":
            loss_mask[:, :-1] = True
        else:
            loss_mask[:, value_pos - 1] = True
        roles = {"reveal": np.broadcast_to(value_pos - 1, (n, R * m)),
                 "reveal_value": np.broadcast_to(value_pos, (n, R * m))}
        return Batch(torch.from_numpy(tokens), torch.from_numpy(targets), torch.from_numpy(loss_mask),
                     torch.from_numpy(np.ascontiguousarray(states)),
                     roles_to_torch(roles))
