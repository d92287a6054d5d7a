"""Associative treecall (ATR): recall over documents sampled from a random PCFG.

The grammar (fixed by `grammar_seed`) has `n_nonterminals` nonterminals X and `n_terminals`
terminals. Each nonterminal has a level in 0..max_depth-1; a rule of X rewrites it as

    X -> [head] Y_1 ... Y_r          r in 1..max_rule_length, Y_i a terminal or a nonterminal of a
                                      deeper level (so every tree has depth <= max_depth)

with `rules_per_nonterminal` rules (probabilities from a flat Dirichlet) and a head terminal drawn
from X's own head distribution (a flat Dirichlet over terminals), always placed first. A
phrase is represented by its head terminal, so the parent of a terminal occurrence is:
  - for a child terminal Y_i of a phrase: that phrase, answered by its head;
  - for the head of a phrase: the enclosing phrase, answered by its head
    (the root phrase's head has no parent and is never queried).

Sequence (`length` = the most terminals a document may have; shorter documents are left-padded):

    PAD .. PAD BOS t_1 ... t_m EOS q a           T_tokens = length + 4, m <= length

Token ids: PAD = 0, BOS = 1, EOS = 2, terminals 3 .. 3+n_terminals-1 (`terminal_ids`). The query
q is a terminal that occurs exactly once in the document (so the answer is well defined); the
answer a is the head terminal of its parent phrase. Documents are rejection-sampled until
2 <= m <= length and some terminal qualifies.

Held-out split: a fixed random set of (query terminal, answer terminal) pairs, a fraction
`heldout_fraction` of all n_terminals^2 pairs (from `grammar_seed`), is held out. `split="train"`
queries only pairs outside it, `"heldout"` only pairs inside it, `"all"` any pair.

Targets are next-token (targets[:, t] = tokens[:, t+1], the last target EOS); the loss is only at
the query position (target = a). roles [N], as in AR: `key` (the occurrence of q in the document),
`value` (the occurrence of its parent's head), `query`, `answer` (query + 1), `bos`, `eos` (the
BOS and EOS tokens' positions).
states [N, T_tokens] int64: at a document terminal, the head terminal of its parent phrase (what
the answer would be if it were queried); at the query and answer positions the answer; -1 at PAD,
BOS, EOS and the root head.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from interp.tasks.base import Batch
from interp.tasks.common import check_choice, check_count, make_rng, roles_to_torch

PAD, BOS, EOS = 0, 1, 2
SPLITS = ("train", "heldout", "all")
_MAX_ROUNDS = 64


class Grammar(NamedTuple):
    """A random PCFG. Symbols: terminals 0..n_t-1, nonterminal X is the symbol n_t + X.

    level       [n_nt] int64                  depth level of each nonterminal
    rules       [n_nt, R, max_rule_length]    rule right-hand sides, padded with -1
    rule_cum    [n_nt, R] float64             cumulative rule probabilities
    head_cum    [n_nt, n_t] float64           cumulative head-terminal probabilities
    start_cum   [n_nt] float64                cumulative probabilities of the root nonterminal
    heldout     [n_t, n_t] bool               held-out (query, answer) terminal pairs
    """

    n_terminals: int
    level: np.ndarray
    rules: np.ndarray
    rule_cum: np.ndarray
    head_cum: np.ndarray
    start_cum: np.ndarray
    heldout: np.ndarray


def random_grammar(n_nonterminals: int, n_terminals: int, max_rule_length: int,
                   rules_per_nonterminal: int, max_depth: int, heldout_fraction: float,
                   seed: int) -> Grammar:
    """Draw a PCFG as described in the module docstring (deterministic for `seed`)."""
    rng = np.random.default_rng(seed)
    n_nt, n_t = n_nonterminals, n_terminals
    level = np.sort(rng.integers(0, max_depth, size=n_nt))
    level[0] = 0                                     # at least one root-level nonterminal
    rules = np.full((n_nt, rules_per_nonterminal, max_rule_length), -1, dtype=np.int64)
    for x in range(n_nt):                            # grammar construction: once per task
        deeper = n_t + np.flatnonzero(level > level[x])
        for r in range(rules_per_nonterminal):
            size = rng.integers(1, max_rule_length + 1)
            # Each slot is a deeper nonterminal with probability 1/2 (when one exists).
            use_nt = (rng.random(size) < 0.5) & (len(deeper) > 0)
            rules[x, r, :size] = np.where(use_nt, rng.choice(deeper, size) if len(deeper) else 0,
                                          rng.integers(0, n_t, size))
    rule_cum = np.cumsum(rng.dirichlet(np.ones(rules_per_nonterminal), size=n_nt), axis=1)
    head_cum = np.cumsum(rng.dirichlet(np.ones(n_t), size=n_nt), axis=1)
    start_cum = np.cumsum(np.where(level == 0, 1.0, 0.0) / (level == 0).sum())
    heldout = rng.random((n_t, n_t)) < heldout_fraction
    return Grammar(n_t, level, rules, rule_cum, head_cum, start_cum, heldout)


def _draw(rng: np.random.Generator, cum: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """One categorical draw from each cum[rows[f]] (cumulative probabilities cum [M, K]).  -> [F]

    Inverse CDF on the rows laid end to end: row r's cumulative probabilities shifted by r are
    increasing overall, so one searchsorted finds every draw.
    """
    m, k = cum.shape
    flat = (cum / cum[:, -1:] + np.arange(m)[:, None]).reshape(-1)          # [M*K] increasing
    u = rows + rng.random(len(rows))                                        # in [row, row + 1)
    return np.minimum(np.searchsorted(flat, u, side="right") - rows * k, k - 1)


class Documents(NamedTuple):
    """Documents as flat, document-ordered terminal arrays.

    doc     [M] int64   document index of each terminal
    token   [M] int64   terminal id (0-based)
    parent  [M] int64   flat index of the head terminal of the parent phrase, -1 for the root head
    label   [M] int64   the nonterminal whose phrase this terminal heads, -1 for non-heads
    """

    doc: np.ndarray
    token: np.ndarray
    parent: np.ndarray
    label: np.ndarray


def sample_documents(grammar: Grammar, n: int, rng: np.random.Generator) -> Documents:
    """Expand n root nonterminals top-down, one tree level per step, vectorised over all nodes."""
    n_t, width = grammar.n_terminals, 1 + grammar.rules.shape[2]
    roots = n_t + _draw(rng, grammar.start_cum[None, :], np.zeros(n, dtype=np.int64))
    # Frontier in document order: symbol, document, own node id (heads only), parent node id, label.
    sym, doc = roots, np.arange(n, dtype=np.int64)
    node, parent, label = np.full(n, -1), np.full(n, -1), np.full(n, -1)
    next_id = 0
    while (sym >= n_t).any():
        is_nt = sym >= n_t
        nt = np.where(is_nt, sym - n_t, 0)
        heads, rule = np.zeros_like(sym), np.zeros_like(sym)
        heads[is_nt] = _draw(rng, grammar.head_cum, nt[is_nt])            # [F]
        rule[is_nt] = _draw(rng, grammar.rule_cum, nt[is_nt])             # [F]
        new_ids = np.where(is_nt, next_id + np.cumsum(is_nt) - 1, node)   # ids of the new heads
        next_id += int(is_nt.sum())
        # children [F, width]: a terminal stays itself; a nonterminal becomes [head, rhs...].
        children = np.full((len(sym), width), -1, dtype=np.int64)
        children[:, 0] = np.where(is_nt, heads, sym)
        children[:, 1:] = np.where(is_nt[:, None], grammar.rules[nt, rule], -1)
        child_parent = np.empty_like(children)
        child_parent[:, 0], child_parent[:, 1:] = parent, new_ids[:, None]
        child_node = np.full_like(children, -1)
        child_node[:, 0] = new_ids
        child_label = np.full_like(children, -1)
        child_label[:, 0] = np.where(is_nt, nt, label)
        keep = (children >= 0).reshape(-1)
        sym = children.reshape(-1)[keep]
        doc = np.repeat(doc, width)[keep]
        node, parent = child_node.reshape(-1)[keep], child_parent.reshape(-1)[keep]
        label = child_label.reshape(-1)[keep]
    index_of_node = np.full(max(next_id, 1), -1, dtype=np.int64)
    heads = node >= 0
    index_of_node[node[heads]] = np.flatnonzero(heads)
    parent_index = np.where(parent >= 0, index_of_node[np.maximum(parent, 0)], -1)
    return Documents(doc, sym, parent_index, label)


class TreeBatch(NamedTuple):
    """A Batch and the trees behind it.

    parent [N, T_tokens] int64  position of the head of each document terminal's parent phrase
                                 (-1 elsewhere and for the root head)
    label  [N, T_tokens] int64  the nonterminal of the phrase headed at this position, -1 elsewhere
    """

    batch: Batch
    parent: torch.Tensor
    label: torch.Tensor


class AssociativeTreecall:
    """ATR over one random PCFG; see the module docstring for the sequence layout."""

    OPTIONS = ("n_nonterminals", "n_terminals", "max_rule_length", "rules_per_nonterminal",
               "max_depth", "heldout_fraction", "grammar_seed", "split")
    name = "ATR"

    def __init__(self, n_nonterminals: int = 16, n_terminals: int = 64, max_rule_length: int = 3,
                 rules_per_nonterminal: int = 3, max_depth: int = 4, heldout_fraction: float = 0.1,
                 grammar_seed: int = 0, split: str = "train") -> None:
        self._options = {
            "n_nonterminals": check_count("n_nonterminals", n_nonterminals),
            "n_terminals": check_count("n_terminals", n_terminals, minimum=2),
            "max_rule_length": check_count("max_rule_length", max_rule_length),
            "rules_per_nonterminal": check_count("rules_per_nonterminal", rules_per_nonterminal),
            "max_depth": check_count("max_depth", max_depth),
            "heldout_fraction": self._check_fraction(heldout_fraction),
            "grammar_seed": check_count("grammar_seed", grammar_seed, minimum=0),
            "split": check_choice("split", split, SPLITS),
        }
        grammar_args = {k: v for k, v in self._options.items() if k not in ("grammar_seed", "split")}
        self.grammar = random_grammar(**grammar_args, seed=self._options["grammar_seed"])
        self.split = split
        self.pad, self.bos, self.eos = PAD, BOS, EOS
        self.terminal_ids = range(3, 3 + n_terminals)
        self.vocab_size = 3 + n_terminals

    @staticmethod
    def _check_fraction(value) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"heldout_fraction must be a number in [0, 1); got {value!r}")
        return float(value)

    def __repr__(self) -> str:
        return f"AssociativeTreecall({', '.join(f'{k}={v!r}' for k, v in self._options.items())})"

    def options(self) -> dict:
        return dict(self._options)

    def sample(self, n: int, length: int, seed) -> Batch:
        return self.sample_trees(n, length, seed).batch

    def sample_trees(self, n: int, length: int, seed) -> TreeBatch:
        """`sample` together with each document's tree (parent positions, phrase labels)."""
        check_count("n", n)
        check_count("length", length, minimum=2)
        rng = make_rng(seed)
        parts, have = [], 0
        for _ in range(_MAX_ROUNDS):
            docs = self._candidates(rng, max(2 * (n - have), 16), length)
            parts.append(docs)
            have += len(docs[0])
            if have >= n:
                break
        else:
            raise ValueError(f"ATR: could not find {n} documents of at most length={length} "
                             f"terminals with a queryable terminal in split {self.split!r} after "
                             f"{_MAX_ROUNDS} rounds; raise length (this grammar's documents are "
                             f"often longer) or change the grammar")
        tokens, parent, label, key = (np.concatenate(p)[:n] for p in zip(*parts))
        return self._assemble(tokens, parent, label, key, length)

    def _candidates(self, rng, count: int, length: int):
        """Accepted documents from `count` draws: (terminals, parent, label [k, length], key [k])."""
        docs = sample_documents(self.grammar, count, rng)
        sizes = np.bincount(docs.doc, minlength=count)
        starts = np.cumsum(sizes) - sizes
        fits = (sizes >= 2) & (sizes <= length)
        sel = fits[docs.doc]
        row = np.cumsum(fits)[docs.doc[sel]] - 1                  # index among fitting documents
        col = (np.arange(len(docs.doc)) - starts[docs.doc])[sel]  # position inside the document
        k = int(fits.sum())
        terminals = np.full((k, length), -1, dtype=np.int64)
        parent = np.full((k, length), -1, dtype=np.int64)
        label = np.full((k, length), -1, dtype=np.int64)
        terminals[row, col] = docs.token[sel]
        label[row, col] = docs.label[sel]
        has_parent = docs.parent[sel] >= 0
        parent[row[has_parent], col[has_parent]] = (docs.parent[sel] - starts[docs.doc[sel]])[has_parent]
        # A query must occur once in its document and have a parent in the requested split.
        counts = np.zeros((k, self.grammar.n_terminals), dtype=np.int64)
        np.add.at(counts, (row, docs.token[sel]), 1)
        valid = terminals >= 0
        safe_t = np.maximum(terminals, 0)
        unique = valid & (np.take_along_axis(counts, safe_t, axis=1) == 1)
        answer = np.take_along_axis(safe_t, np.maximum(parent, 0), axis=1)
        eligible = unique & (parent >= 0)
        if self.split != "all":
            held = self.grammar.heldout[safe_t, answer]
            eligible &= held if self.split == "heldout" else ~held
        score = np.where(eligible, rng.random((k, length)), -1.0)
        key = score.argmax(axis=1)
        ok = eligible.any(axis=1)
        return terminals[ok], parent[ok], label[ok], key[ok]

    def _assemble(self, terminals, parent, label, key, length: int) -> TreeBatch:
        """Left-pad documents into `PAD.. BOS t.. EOS q a` and build targets, states and roles."""
        n = terminals.shape[0]
        sizes = (terminals >= 0).sum(axis=1)
        offset = length - sizes + 1                                  # position of t_1
        rows = np.arange(n)[:, None]
        # Right-align the documents: column c of `terminals` goes to position offset + c.
        shift = np.arange(length)[None, :] + offset[:, None]          # [N, length]
        inside = terminals >= 0
        T = length + 4
        tokens = np.full((n, T), PAD, dtype=np.int64)
        tokens[rows.repeat(length, 1)[inside], shift[inside]] = terminals[inside] + 3
        tokens[np.arange(n), offset - 1] = BOS
        key_pos = offset + key
        parent_pos = np.where(parent >= 0, parent + offset[:, None], -1)
        value_pos = parent_pos[np.arange(n), key]
        query, answer = tokens[np.arange(n), key_pos], tokens[np.arange(n), value_pos]
        tokens[:, length + 1], tokens[:, length + 2], tokens[:, length + 3] = EOS, query, answer
        targets = np.empty_like(tokens)
        targets[:, :-1], targets[:, -1] = tokens[:, 1:], EOS
        loss_mask = np.zeros((n, T), dtype=bool)
        loss_mask[:, length + 2] = True

        tree_parent = np.full((n, T), -1, dtype=np.int64)
        tree_label = np.full((n, T), -1, dtype=np.int64)
        tree_parent[rows.repeat(length, 1)[inside], shift[inside]] = parent_pos[inside]
        tree_label[rows.repeat(length, 1)[inside], shift[inside]] = label[inside]
        states = np.where(tree_parent >= 0,
                          np.take_along_axis(tokens, np.maximum(tree_parent, 0), axis=1), -1)
        states[:, length + 2] = states[:, length + 3] = answer
        query_pos = np.full(n, length + 2, dtype=np.int64)
        roles = {"key": key_pos, "value": value_pos, "query": query_pos, "answer": query_pos + 1,
                 "bos": offset - 1, "eos": np.full(n, length + 1, dtype=np.int64)}
        batch = Batch(torch.from_numpy(tokens), torch.from_numpy(targets), torch.from_numpy(loss_mask),
                      torch.from_numpy(states),
                      roles_to_torch(roles))
        return TreeBatch(batch, torch.from_numpy(tree_parent), torch.from_numpy(tree_label))
