"""Finite groups as Cayley tables, built by name.

A `Group` has elements 0..n-1, identity 0, and a Cayley table with `table[a, b] = a * b`.

Names (case-sensitive, as written in papers):
    C{n}, Z{n}   cyclic group of order n (Z is an alias of C): a * b = (a + b) mod n
    S{k}         symmetric group on k points (k = 1..6), all k! permutations
    A{k}         alternating group on k points (k = 1..6), the even permutations
    GxH[xK...]   direct product, e.g. "A4xZ5": the element (g, h) has id g * |H| + h, and
                 (g, h) * (g', h') = (g g', h h')

Permutation convention. A permutation element `p` is stored as the tuple `p = (p[0], ..., p[k-1])`
of images of 0..k-1 (`Group.perms[id]`), in lexicographic order of these tuples, so the identity
(0, 1, ..., k-1) has id 0. The product is composition as array indexing:

    (a * b)[i] = a[b[i]]        (numpy: a[b])

Read a permutation as a re-indexing of an array: the statement `arr <- arr[p]` moves the value
at slot p[i] to slot i. Applying a and then b gives `arr[a][b] = arr[a[b]] = arr[a * b]`, so a
left-to-right running product s_t = x_1 x_2 ... x_t is exactly the effect of applying
x_1, x_2, ..., x_t in order: arr_t = arr_0[s_t]. (This is a[b] = a o b as functions.)
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
from dataclasses import dataclass

import numpy as np

MAX_ORDER = 4096          # the Cayley table is n x n int64; 4096 -> 128 MiB
_MAX_PERM_DEGREE = 6      # S6 has 720 elements; S7 (5040) would exceed MAX_ORDER anyway


@dataclass(frozen=True, eq=False)
class Group:
    """A finite group given by its Cayley table.

    name     str               canonical name ("C5", "S3", "A4xC5", ...)
    table    [n, n] int64      table[a, b] = a * b; element 0 is the identity
    inverse  [n] int64         inverse[a] * a = a * inverse[a] = 0
    perms    [n, k] int64 or None   the permutation of each element (permutation groups only)
    factors  tuple[Group, ...]  the factors of a direct product (empty otherwise)
    """

    name: str
    table: np.ndarray
    inverse: np.ndarray
    perms: np.ndarray | None = None
    factors: tuple["Group", ...] = ()

    def __post_init__(self) -> None:
        for array in (self.table, self.inverse, self.perms):
            if array is not None:
                array.flags.writeable = False     # groups are cached and shared

    @property
    def order(self) -> int:
        return int(self.table.shape[0])

    def __len__(self) -> int:
        return self.order

    def __repr__(self) -> str:
        return f"Group({self.name!r}, order={self.order})"

    @property
    def identity(self) -> int:
        return 0

    def mul(self, a, b) -> np.ndarray:
        """Elementwise product a * b of arrays (or ints) of element ids."""
        return self.table[np.asarray(a), np.asarray(b)]

    def is_abelian(self) -> bool:
        return bool(np.array_equal(self.table, self.table.T))

    def check(self) -> None:
        """Raise ValueError unless the table is a group: closure, identity 0, inverses, associativity."""
        n, table = self.order, self.table
        if table.shape != (n, n) or table.min() < 0 or table.max() >= n:
            raise ValueError(f"{self.name}: table is not closed on 0..{n - 1}")
        ids = np.arange(n)
        if not (np.array_equal(table[0], ids) and np.array_equal(table[:, 0], ids)):
            raise ValueError(f"{self.name}: element 0 is not the identity")
        if not (np.all(table[ids, self.inverse] == 0) and np.all(table[self.inverse, ids] == 0)):
            raise ValueError(f"{self.name}: inverse table is wrong")
        # (a b) c == a (b c) for all n^3 triples, vectorised over [a-chunk, b, c] blocks.
        chunk = max(1, (1 << 22) // (n * n))
        for start in range(0, n, chunk):
            a = ids[start:start + chunk]
            left = table[table[a][:, :, None], ids[None, None, :]]      # [a, b, c] -> (a b) c
            right = table[a[:, None, None], table[None, :, :]]          # [a, b, c] -> a (b c)
            if not np.array_equal(left, right):
                raise ValueError(f"{self.name}: table is not associative")


# ---------------------------------------------------------------------------------------------
# Constructors


def cyclic(n: int) -> Group:
    """C_n: elements 0..n-1 under addition mod n."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ValueError(f"cyclic group order n must be a positive int; got {n!r}")
    if n > MAX_ORDER:
        raise ValueError(f"cyclic group order n={n} exceeds MAX_ORDER={MAX_ORDER}")
    ids = np.arange(n, dtype=np.int64)
    table = (ids[:, None] + ids[None, :]) % n
    return Group(f"C{n}", table, (-ids) % n)


def _perm_group(name: str, perms: np.ndarray) -> Group:
    """The group of the given permutations [n, k] (identity first), product (a*b)[i] = a[b[i]]."""
    n, k = perms.shape
    composed = perms[np.arange(n)[:, None, None], perms[None, :, :]]   # [a, b, i] -> a[b[i]]
    # Look the composed tuples up by their mixed-radix code.
    radix = k ** np.arange(k - 1, -1, -1, dtype=np.int64)
    codes, composed_codes = perms @ radix, composed @ radix            # [n], [n, n]
    order = np.argsort(codes)
    slot = np.searchsorted(codes, composed_codes, sorter=order).clip(max=n - 1)
    table = order[slot].astype(np.int64)
    if not np.array_equal(codes[table], composed_codes):
        raise ValueError(f"{name}: permutations are not closed under composition")
    inverse = np.argmax(table == 0, axis=1).astype(np.int64)
    return Group(name, table, inverse, perms=perms)


def _check_degree(kind: str, k) -> None:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= _MAX_PERM_DEGREE:
        raise ValueError(f"{kind} degree k must be an int in 1..{_MAX_PERM_DEGREE}; got {k!r}")


def symmetric(k: int) -> Group:
    """S_k: all k! permutations of 0..k-1 in lexicographic order (identity first)."""
    _check_degree("symmetric group", k)
    perms = np.array(list(itertools.permutations(range(k))), dtype=np.int64).reshape(-1, k)
    return _perm_group(f"S{k}", perms)


def _parity(perms: np.ndarray) -> np.ndarray:
    """0 for even, 1 for odd permutations: the parity of the inversion count.  [n, k] -> [n]"""
    inversions = (perms[:, :, None] > perms[:, None, :]) & np.triu(np.ones(perms.shape[1:] * 2, bool), 1)
    return inversions.sum(axis=(1, 2)) % 2


def alternating(k: int) -> Group:
    """A_k: the even permutations of 0..k-1 in lexicographic order (identity first)."""
    _check_degree("alternating group", k)
    perms = np.array(list(itertools.permutations(range(k))), dtype=np.int64).reshape(-1, k)
    return _perm_group(f"A{k}", perms[_parity(perms) == 0])


def direct_product(*factors: Group) -> Group:
    """G_1 x ... x G_m: the element (g_1, ..., g_m) has mixed-radix id (g_1 most significant)."""
    if len(factors) < 2:
        raise ValueError(f"direct_product needs at least two groups; got {len(factors)}")
    for f in factors:
        if not isinstance(f, Group):
            raise TypeError(f"direct_product takes Group objects; got {type(f).__name__}")
    order = math.prod(f.order for f in factors)
    if order > MAX_ORDER:
        raise ValueError(f"direct product {'x'.join(f.name for f in factors)} has order {order} > "
                         f"MAX_ORDER={MAX_ORDER}")
    table, inverse = factors[0].table, factors[0].inverse
    for f in factors[1:]:
        m = f.order
        # (g, h) -> g * m + h;  table[(g,h), (g',h')] = table_G[g, g'] * m + table_H[h, h']
        table = (table[:, None, :, None] * m + f.table[None, :, None, :]).reshape(
            table.shape[0] * m, table.shape[0] * m)
        inverse = (inverse[:, None] * m + f.inverse[None, :]).reshape(-1)
    return Group("x".join(f.name for f in factors), table, inverse, factors=tuple(factors))


# ---------------------------------------------------------------------------------------------
# By name

_PATTERN = re.compile(r"^(C|Z|S|A)([1-9][0-9]*)$")
EXAMPLE_NAMES = ("C2", "C6", "Z5", "S3", "S4", "S5", "A4", "A5", "A4xZ5", "S3xC2")


def _simple(name: str) -> Group:
    match = _PATTERN.match(name)
    if match is None:
        close = difflib.get_close_matches(name, EXAMPLE_NAMES, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown group name {name!r}: allowed C<n>, Z<n>, S<k>, A<k> (k <= "
                         f"{_MAX_PERM_DEGREE}) and direct products like 'A4xZ5'{hint}")
    kind, size = match.group(1), int(match.group(2))
    if kind in "CZ":
        return cyclic(size)
    return symmetric(size) if kind == "S" else alternating(size)


_CACHE: dict[str, Group] = {}


def group(name: str) -> Group:
    """The group called `name` (see the module docstring). Z{n} is returned with its name C{n}."""
    if not isinstance(name, str):
        raise TypeError(f"group name must be a str; got {type(name).__name__}")
    if name not in _CACHE:
        parts = name.split("x")
        found = _simple(parts[0]) if len(parts) == 1 else direct_product(*(_simple(p) for p in parts))
        _CACHE[name] = found
    return _CACHE[name]
