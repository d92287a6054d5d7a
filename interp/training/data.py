"""Finite training sets: N distinct sequences drawn once, a disjoint validation set, mixed lengths.

    FiniteData.build(task, lengths, n_train, n_val, seed) -> FiniteData
    data.batch(step, batch_size, order_seed) -> Batch      the step's rows of the epoch stream
    n_distinct(task, length) -> int | None                  |G|^n for group word problems

Drawing. Sequences are drawn with `task.sample` in chunks of CHUNK rows (chunk c of length n in
stream k seeded SeedSequence([seed, k, n, c])) and deduplicated by their token rows, keeping first
occurrences. The validation set is drawn first (stream VAL_DATA); the training stream (TRAIN_DATA)
skips every sequence already in it, so the two are disjoint and the validation set does not depend
on N. Because chunks have a fixed size, the training set of size N is the first N distinct
sequences of its stream: the set for N is a subset of the set for any larger N (nested, as a
sample-efficiency search wants).

Mixed lengths (the joint condition). Every length in `lengths` gets an equal share of n_train (and
of n_val): N // k each, the remainder one each to the shortest lengths. Where a length has fewer
sequences left than its share, it gets what there is and the shortfall is spread equally over the
other lengths (water-filling), so the total stays N whenever the lengths together have N.

Finite pools. A word problem over a group of order m has m^n distinct inputs of length n. The
validation share of a length is capped at half its pool (floor), the training share at what the
validation set leaves. Either cap emits a warning that names the length, the pool and the sizes,
and `capped` records it: {length: {"train": (asked, got), "val": (asked, got)}}. For other tasks
the pool is unknown: drawing stops with ValueError when MAX_DRY_CHUNKS chunks in a row bring no
new sequence.

Rows of different lengths are right-padded (token PAD = 0, loss_mask False, states 0) into one
Batch; models are causal, so padding after a sequence changes nothing at its positions. A batch is
cut to the longest row it holds.

Epochs. The training rows are visited in the concatenation of epoch permutations (epoch e is
permutation(N) from SeedSequence([order_seed, EPOCH, e])); step s reads positions s*B .. s*B+B-1
of that stream, so every epoch visits each sequence exactly once, batches may straddle two epochs,
and the batch of a step depends only on (step, order_seed): resuming needs no data state.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from interp.tasks.base import Batch, Task

VAL_DATA, TRAIN_DATA, EPOCH = 2, 3, 4   # seed streams (0, 1: training / evaluation, see evaluate)
CHUNK = 1024
MAX_DRY_CHUNKS = 64
PAD = 0


def n_distinct(task: Task, length: int) -> int | None:
    """The number of distinct input sequences of `length` (|G|^length for word problems), or None."""
    group = getattr(task, "group", None)
    if group is None or getattr(task, "format", None) is None:
        return None
    return int(group.order) ** int(length)


def equal_shares(total: int, caps: Sequence[int | None]) -> list[int]:
    """`total` split over len(caps) parts in equal shares, each at most its cap (None: no cap);
    what a capped part cannot take goes equally to the others (remainders to the first parts)."""
    shares = [0] * len(caps)
    open_parts = [i for i in range(len(caps))]
    left = total
    while left > 0 and open_parts:
        base, extra = divmod(left, len(open_parts))
        given = 0
        for rank, i in enumerate(open_parts):
            want = base + (1 if rank < extra else 0)
            room = want if caps[i] is None else min(want, caps[i] - shares[i])
            shares[i] += room
            given += room
        left -= given
        open_parts = [i for i in open_parts if caps[i] is None or shares[i] < caps[i]]
        if given == 0:
            break
    return shares


def _rows(tokens: torch.Tensor) -> list[bytes]:
    array = np.ascontiguousarray(tokens.numpy())
    return [array[i].tobytes() for i in range(len(array))]


def draw_distinct(task: Task, length: int, count: int, seed: int, stream: int,
                  exclude: set[bytes] | None = None) -> tuple[Batch, set[bytes]]:
    """The first `count` distinct sequences (by token row) of a stream, skipping `exclude`.

    Returns (batch [count, T], the token-row keys drawn)."""
    exclude = exclude or set()
    seen: set[bytes] = set()
    kept: list[Batch] = []
    have, chunk, dry = 0, 0, 0
    while have < count:
        rng_seed = int(np.random.SeedSequence([seed, stream, length, chunk]).generate_state(1, np.uint32)[0])
        batch = task.sample(CHUNK, length, rng_seed)
        chunk += 1
        take = []
        for i, key in enumerate(_rows(batch.tokens)):
            if key not in seen and key not in exclude:
                seen.add(key)
                take.append(i)
                have += 1
                if have == count:
                    break
        dry = 0 if take else dry + 1
        if dry >= MAX_DRY_CHUNKS:
            raise ValueError(f"task {task.name!r} at length {length} gave only {have} distinct sequences "
                             f"({len(exclude)} more excluded) in {chunk * CHUNK} draws; {count} were asked")
        if take:
            kept.append(batch.select(torch.tensor(take)))
    if not kept:
        return task.sample(1, length, 0).select(slice(0, 0)), seen
    return concat(kept), seen


def concat(batches: Sequence[Batch]) -> Batch:
    """Batches stacked along rows, right-padded to the longest (PAD tokens, no loss, zero states)."""
    width = max(b.tokens.shape[1] for b in batches)

    def pad(x: torch.Tensor, value) -> torch.Tensor:  # [N, T, ...] -> [N, width, ...]
        extra = width - x.shape[1]
        return F.pad(x, (0, 0) * (x.dim() - 2) + (0, extra), value=value) if extra else x

    roles = {name: torch.cat([b.roles[name] for b in batches]) for name in batches[0].roles
             if all(name in b.roles for b in batches)}
    return Batch(torch.cat([pad(b.tokens, PAD) for b in batches]),
                 torch.cat([pad(b.targets, PAD) for b in batches]),
                 torch.cat([pad(b.loss_mask, False) for b in batches]),
                 torch.cat([pad(b.states, 0) for b in batches]), roles)


@dataclass
class FiniteData:
    """A finite training set and its disjoint validation set.

    train, val      Batch [N, T_max], [M, T_max'] (right-padded where lengths differ)
    train_lengths   [N] int64 the length (task units) of each training row; val_lengths likewise
    widths          [N] int64 the token count of each training row (T_max where unpadded)
    capped          {length: {"train": (asked, got), "val": (asked, got)}} for capped lengths
    """

    train: Batch
    val: Batch
    train_lengths: torch.Tensor
    val_lengths: torch.Tensor
    widths: torch.Tensor
    capped: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)
    _epochs: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def n_train(self) -> int:
        return len(self.train)

    @property
    def n_val(self) -> int:
        return len(self.val)

    @classmethod
    def build(cls, task: Task, lengths: Sequence[int], n_train: int, n_val: int, seed: int) -> "FiniteData":
        """Draw the validation set, then the training set, over `lengths` in equal shares."""
        lengths = sorted({int(n) for n in lengths})
        if not lengths or lengths[0] < 1:
            raise ValueError(f"lengths must be a non-empty list of positive ints; got {lengths!r}")
        for name, value in (("n_train", n_train), ("n_val", n_val)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        pools = [n_distinct(task, n) for n in lengths]
        val_shares = equal_shares(n_val, [None if p is None else p // 2 for p in pools])
        train_caps = [None if p is None else p - v for p, v in zip(pools, val_shares)]
        train_shares = equal_shares(n_train, train_caps)
        asked_val, asked_train = equal_shares(n_val, [None] * len(lengths)), equal_shares(n_train, [None] * len(lengths))
        capped: dict[int, dict[str, tuple[int, int]]] = {}
        for n, pool, av, gv, at, gt in zip(lengths, pools, asked_val, val_shares, asked_train, train_shares):
            if gv < av or gt < at:
                capped[n] = {"train": (at, gt), "val": (av, gv)}
                what = [f"validation share {gv} of the {av} asked (at most half the pool)" if gv < av else "",
                        f"training share {gt} of the {at} asked (the rest of the pool)" if gt < at else ""]
                warnings.warn(f"length {n} of task {task.name!r} has only {pool} distinct sequences: capped its "
                              + " and its ".join(w for w in what if w), stacklevel=2)
        if sum(train_shares) < n_train:
            warnings.warn(f"task {task.name!r} at lengths {lengths} has room for only {sum(train_shares)} "
                          f"training sequences beside the validation set; {n_train} were asked "
                          "(the data set is capped)", stacklevel=2)
        trains, vals, train_len, val_len = [], [], [], []
        for n, v_count, t_count in zip(lengths, val_shares, train_shares):
            if v_count == 0 and t_count == 0:
                continue
            val, val_keys = draw_distinct(task, n, v_count, seed, VAL_DATA)
            train, _ = draw_distinct(task, n, t_count, seed, TRAIN_DATA, exclude=val_keys)
            vals.append(val)
            trains.append(train)
            val_len += [n] * v_count
            train_len += [n] * t_count
        train = concat(trains)
        widths = torch.tensor([b.tokens.shape[1] for b in trains for _ in range(len(b))], dtype=torch.int64)
        return cls(train, concat(vals), torch.tensor(train_len, dtype=torch.int64),
                   torch.tensor(val_len, dtype=torch.int64), widths, capped)

    def epoch_order(self, epoch: int, order_seed: int) -> np.ndarray:
        """The permutation of training rows visited in `epoch`."""
        key = (epoch, order_seed)
        if key not in self._epochs:
            if len(self._epochs) > 4:
                self._epochs.clear()
            rng = np.random.default_rng(np.random.SeedSequence([order_seed, EPOCH, epoch]))
            self._epochs[key] = rng.permutation(self.n_train)
        return self._epochs[key]

    def indices(self, step: int, batch_size: int, order_seed: int) -> np.ndarray:
        """Training row indices read at 0-based `step`  [batch_size]."""
        positions = np.arange(step * batch_size, (step + 1) * batch_size)
        epochs, within = np.divmod(positions, self.n_train)
        return np.array([self.epoch_order(int(e), order_seed)[w] for e, w in zip(epochs, within)])

    def batch(self, step: int, batch_size: int, order_seed: int) -> Batch:
        index = torch.from_numpy(self.indices(step, batch_size, order_seed))
        width = int(self.widths[index].max())
        rows = self.train.select(index)
        return Batch(rows.tokens[:, :width], rows.targets[:, :width], rows.loss_mask[:, :width],
                     rows.states[:, :width], rows.roles)

    def summary(self) -> dict:
        """JSON-able sizes: n_train, n_val, per-length counts, caps."""
        count = lambda lengths: {str(n): int((lengths == n).sum()) for n in lengths.unique().tolist()}  # noqa: E731
        return {"n_train": self.n_train, "n_val": self.n_val, "train_by_length": count(self.train_lengths),
                "val_by_length": count(self.val_lengths),
                "capped": {str(n): {k: list(v) for k, v in c.items()} for n, c in self.capped.items()}}


@torch.no_grad()
def validation_loss(model: torch.nn.Module, batch: Batch, rows: int = 512) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) over every loss position of `batch`, `rows` rows per forward."""
    total, correct, count = 0.0, 0, 0
    for start in range(0, len(batch), rows):
        part = batch.select(slice(start, start + rows))
        logits = model(part.tokens)                                            # [R, T, V]
        selected, targets = logits[part.loss_mask], part.targets[part.loss_mask]
        total += F.cross_entropy(selected.double(), targets, reduction="sum").item()
        correct += int((selected.argmax(-1) == targets).sum())
        count += int(targets.numel())
    return total / count, correct / count


def capacity(task: Task, lengths: Sequence[int], n_val: int) -> int | None:
    """The most training sequences `FiniteData.build` can draw over `lengths` beside a validation
    set of `n_val` (None when a pool is unknown): larger N give the same, capped data set."""
    pools = [n_distinct(task, n) for n in sorted({int(n) for n in lengths})]
    if any(p is None for p in pools):
        return None
    val_shares = equal_shares(n_val, [p // 2 for p in pools])
    return sum(p - v for p, v in zip(pools, val_shares))
