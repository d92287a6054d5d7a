"""Corruptions: `corrupt_ar` / `corrupt_atr` / `corrupt_key` replace the queried key's occurrences
in context by a key absent from the example, so the query no longer matches; `corrupt_ar_value` /
`corrupt_value` swap the queried value for one absent from the example, so the corrupted run has
its own correct answer (the new value, its targets updated)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from interp.analysis.interventions.sites import check_batch, site_positions
from interp.tasks.base import Batch


def corrupt_key(
    batch: Batch,
    candidates: Iterable[int],
    seed,
    key_role: str = "key",
    query_role: str = "query",
) -> Batch:
    """Replace the queried key in context by a candidate token absent from the example.

    For each example (and each query of an [N, k] role) the query token q = tokens[query]; every
    occurrence of q before the query position (the `key` role's position among them) becomes one
    new token drawn uniformly from `candidates` minus the tokens of the example, so the query no
    longer matches. targets, loss_mask, states and roles are kept (they describe the clean answer).
    """
    rng, pool = _rng_and_pool(batch, candidates, seed)
    keys = site_positions(batch, key_role).numpy()  # [N, k]
    queries = site_positions(batch, query_role).numpy()
    if keys.shape != queries.shape:
        raise ValueError(f"roles {key_role!r} and {query_role!r} must have the same shape; got "
                         f"{keys.shape} and {queries.shape}")
    tokens = batch.tokens.clone()
    array = tokens.numpy()
    for b in range(array.shape[0]):
        free = np.setdiff1d(pool, array[b])
        if free.size < keys.shape[1]:
            raise ValueError(f"example {b}: fewer than {keys.shape[1]} candidate keys are absent from it")
        new = rng.choice(free, size=keys.shape[1], replace=False)
        for j in range(keys.shape[1]):
            query_token = array[b, queries[b, j]]
            if array[b, keys[b, j]] != query_token:
                raise ValueError(
                    f"example {b}: the {key_role!r} token {array[b, keys[b, j]]} at position "
                    f"{keys[b, j]} does not match the query token {query_token}"
                )
            context = np.nonzero(array[b, : queries[b, j]] == query_token)[0]
            array[b, context] = new[j]
    return Batch(tokens, batch.targets.clone(), batch.loss_mask.clone(), batch.states.clone(),
                 {k: v.clone() for k, v in batch.roles.items()})


def _rng_and_pool(batch: Batch, candidates: Iterable[int], seed) -> tuple[np.random.Generator, np.ndarray]:
    """(generator from seed, the sorted distinct candidate ids), checked."""
    check_batch("batch", batch)
    rng = seed if isinstance(seed, np.random.Generator) else None
    if rng is None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int or a numpy Generator; got {seed!r}")
        rng = np.random.default_rng(int(seed))
    pool = np.asarray(sorted(set(int(c) for c in candidates)), dtype=np.int64)
    if pool.size == 0:
        raise ValueError("candidates must hold at least one token id; got none")
    return rng, pool


def _token_ids(task, attribute: str) -> Iterable[int]:
    if not hasattr(task, attribute):
        raise TypeError(f"task must expose `{attribute}` (the token ids to draw from); "
                        f"{type(task).__name__} has none")
    return getattr(task, attribute)


def corrupt_ar(batch: Batch, task, seed) -> Batch:
    """AR / MQAR: swap each queried key in context for a key (task.key_ids) not in the example."""
    return corrupt_key(batch, _token_ids(task, "key_ids"), seed)


def corrupt_atr(batch: Batch, task, seed) -> Batch:
    """ATR: swap the queried terminal's occurrences in context for a terminal
    (task.terminal_ids) absent from the document."""
    return corrupt_key(batch, _token_ids(task, "terminal_ids"), seed)



def corrupt_value(batch: Batch, candidates: Iterable[int], seed, value_role: str = "value") -> Batch:
    """Replace the token at the `value` role (the queried pair's value) by a candidate absent from
    the example, everywhere it occurs (the answer token too), targets included: the corrupted
    example is a valid one whose answer is the new value. loss_mask and roles are kept; states
    holding the old value get the new one."""
    rng, pool = _rng_and_pool(batch, candidates, seed)
    values = site_positions(batch, value_role).numpy()  # [N, k]
    tokens, targets, states = batch.tokens.clone(), batch.targets.clone(), batch.states.clone()
    for b in range(tokens.shape[0]):
        free = np.setdiff1d(pool, tokens[b].numpy())
        if free.size < values.shape[1]:
            raise ValueError(f"example {b}: fewer than {values.shape[1]} candidate values are absent from it")
        new = rng.choice(free, size=values.shape[1], replace=False)
        for j in range(values.shape[1]):
            old = int(tokens[b, values[b, j]])
            for array in (tokens, targets, states):
                array[b][array[b] == old] = int(new[j])
    return Batch(tokens, targets, batch.loss_mask.clone(), states, {k: v.clone() for k, v in batch.roles.items()})


def corrupt_ar_value(batch: Batch, task, seed) -> Batch:
    """AR / MQAR: swap each queried value (the `value` role) for a value (task.value_ids) not in the example."""
    return corrupt_value(batch, _token_ids(task, "value_ids"), seed)
