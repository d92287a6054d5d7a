"""Evaluation by length: final-state accuracy, per-position accuracy, and mp.

    evaluate_lengths(model, task, lengths, n=256, seed=0) -> LengthEval
    max_passing_length({length: accuracy}, threshold=0.9) -> mp
    refine_mp(model, task, {length: accuracy}, resolution=0.02) -> (mp, {length: accuracy} added)

Final-state accuracy at length T: the fraction of examples whose prediction at the *last* loss
position (the final state s_T for word problems in every format) equals the target.
Per-position accuracy: for every position t, the fraction of examples with a loss at t whose
prediction at t is right (NaN where no example has a loss at t).

`mp` (max-passing length, docs/length-generalisation.md): the largest evaluated length whose final-state
accuracy is at least `threshold` (0.9 by default); None when no evaluated length passes. Lengths
are not required to pass in order: a model that fails at 100 and passes at 200 has mp >= 200.

Evaluation samples fresh data with its own seed stream (`eval_seed`), runs the model under
no_grad in chunks (at most `max_tokens` tokens per forward pass) on its default execution path
("auto": the fast path unless a hook asks for per-step values).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from interp.tasks.base import Batch, Task

TRAIN_STREAM, EVAL_STREAM = 0, 1


def stream_seed(seed: int, stream: int, index: int) -> int:
    """A 32-bit seed for item `index` of stream `stream` of a run seeded `seed` (independent streams)."""
    return int(np.random.SeedSequence([seed, stream, index]).generate_state(1, np.uint32)[0])


def eval_seed(seed: int, length: int) -> int:
    return stream_seed(seed, EVAL_STREAM, length)


@dataclass
class LengthEval:
    """Accuracy by length.

    final_accuracy: {length: final-state accuracy}
    position_accuracy: {length: [T] per-position accuracy (NaN where no loss)}
    n: examples per length; threshold: the mp threshold; seed: the evaluation seed.
    """

    final_accuracy: dict[int, float]
    position_accuracy: dict[int, np.ndarray] = field(repr=False)
    n: int
    threshold: float = 0.9
    seed: int = 0

    @property
    def lengths(self) -> list[int]:
        return sorted(self.final_accuracy)

    @property
    def mp(self) -> int | None:
        return max_passing_length(self.final_accuracy, self.threshold)

    def to_dict(self) -> dict:
        """JSON-able form (NaN per-position entries become None)."""
        return {
            "final_accuracy": {str(k): v for k, v in sorted(self.final_accuracy.items())},
            "position_accuracy": {
                str(k): [None if np.isnan(a) else float(a) for a in v]
                for k, v in sorted(self.position_accuracy.items())
            },
            "n": self.n, "threshold": self.threshold, "seed": self.seed, "mp": self.mp,
        }


def max_passing_length(accuracies: Mapping[int, float], threshold: float = 0.9) -> int | None:
    """The largest length whose accuracy is >= threshold; None when none passes."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1]; got {threshold!r}")
    passing = [int(length) for length, acc in accuracies.items() if acc >= threshold]
    return max(passing) if passing else None


def check_lengths(lengths: Iterable[int]) -> list[int]:
    lengths = list(lengths)
    if not lengths or any(not isinstance(t, (int, np.integer)) or isinstance(t, bool) or t < 1 for t in lengths):
        raise ValueError(f"lengths must be a non-empty list of positive ints; got {lengths!r}")
    return sorted({int(t) for t in lengths})


def last_loss_position(loss_mask: torch.Tensor) -> torch.Tensor:
    """[N, T] bool -> [N] index of the last True per row (ValueError if a row has none)."""
    if not bool(loss_mask.any(dim=1).all()):
        raise ValueError("every example needs at least one loss position to have a final state")
    positions = torch.arange(loss_mask.shape[1], device=loss_mask.device)
    return torch.where(loss_mask, positions, -1).max(dim=1).values


@torch.no_grad()
def predictions(model: torch.nn.Module, tokens: torch.Tensor, max_tokens: int = 1 << 16) -> torch.Tensor:
    """argmax logits [N, T] computed in chunks of at most max_tokens tokens (at least one row)."""
    rows = max(1, max_tokens // tokens.shape[1])
    return torch.cat([model(tokens[i:i + rows]).argmax(-1) for i in range(0, len(tokens), rows)])


def score(pred: torch.Tensor, batch: Batch) -> tuple[float, np.ndarray]:
    """(final-state accuracy, per-position accuracy [T]) of predictions [N, T] on a batch."""
    correct = (pred == batch.targets) & batch.loss_mask                       # [N, T]
    last = last_loss_position(batch.loss_mask)                                 # [N]
    final = correct.gather(1, last[:, None]).float().mean().item()
    counts = batch.loss_mask.sum(0).double()
    with np.errstate(invalid="ignore", divide="ignore"):
        per_position = (correct.sum(0).double() / counts).cpu().numpy()
    per_position[counts.cpu().numpy() == 0] = np.nan
    return final, per_position


def final_state_accuracy(model: torch.nn.Module, task: Task, length: int, n: int, seed: int,
                         device: str | torch.device = "cpu", max_tokens: int = 1 << 16) -> float:
    batch = task.sample(n, length, eval_seed(seed, length)).to(device)
    return score(predictions(model, batch.tokens, max_tokens), batch)[0]


def evaluate_lengths(model: torch.nn.Module, task: Task, lengths: Iterable[int], n: int = 256,
                     seed: int = 0, threshold: float = 0.9, device: str | torch.device | None = None,
                     max_tokens: int = 1 << 16) -> LengthEval:
    """Final-state and per-position accuracy of `model` on `n` fresh examples at each length."""
    lengths = check_lengths(lengths)
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int; got {n!r}")
    max_passing_length({}, threshold)  # validates threshold
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    final, per_position = {}, {}
    try:
        for length in lengths:
            batch = task.sample(n, length, eval_seed(seed, length)).to(device)
            final[length], per_position[length] = score(predictions(model, batch.tokens, max_tokens), batch)
    finally:
        model.train(was_training)
    return LengthEval(final, per_position, n=n, threshold=threshold, seed=seed)


def refine_mp(model: torch.nn.Module, task: Task, accuracies: Mapping[int, float], resolution: float = 0.02,
              n: int = 256, seed: int = 0, threshold: float = 0.9, device: str | torch.device | None = None
              ) -> tuple[int | None, dict[int, float]]:
    """mp on a grid of lengths refined between the grid's mp and the next evaluated length above it (which
    fails, by mp's definition): bisection on the final-state accuracy at `n` fresh examples per length
    until the bracket is at most max(1, resolution x mp) tokens wide. Returns the refined mp (still the
    largest evaluated length that passes, the bracket's lower end) and the accuracies evaluated on the way.
    Accuracy is assumed to fall monotonically inside the bracket; the grid's mp is kept where it is None
    or the longest length. A coarse grid turns mp into a few discrete values (r over runs that share
    them is an artefact); this makes the mp of each run a number with a stated resolution."""
    if not 0.0 < resolution < 1.0:
        raise ValueError(f"resolution must be in (0, 1); got {resolution!r}")
    mp = max_passing_length(accuracies, threshold)
    above = sorted(int(t) for t in accuracies if mp is not None and int(t) > mp)
    added: dict[int, float] = {}
    if mp is None or not above:
        return mp, added
    low, high = mp, above[0]
    while high - low > max(1, int(resolution * low)):
        middle = (low + high) // 2
        added[middle] = evaluate_lengths(model, task, [middle], n=n, seed=seed, threshold=threshold,
                                         device=device).final_accuracy[middle]
        low, high = (middle, high) if added[middle] >= threshold else (low, middle)
    return low, added
