"""Interchange interventions: restoration of the clean answer per site and example.

    restoration[s, b] = (p_patched[s, b](y_b) - p_corrupt[b](y_b)) / (p_clean[b](y_b) - p_corrupt[b](y_b))

(docs/restoration.md; the package docstring has the whole procedure.) With `metrics=` also, per
pair, at the answer position:

    "logit_diff"  logit(y_b) - logit(y'_b), y'_b the corrupted answer: the corrupt batch's target
                  there where it differs from y_b (a value corruption), else the corrupted run's
                  most likely token other than y_b; logit_diff_restoration normalises it as
                  restoration does
    "kl"          KL(p_clean || p_patched) over the vocabulary; kl_change = KL to clean of the
                  corrupted run minus that of the patched run (> 0: the patch moved towards clean)

An example whose corrupted tokens equal its clean tokens (interchange(clean, clean)) has
p_clean = p_corrupt by construction: every patch gives back the clean run, so its restoration is
1 (and it counts as kept) rather than 0 / 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

import models
from interp.analysis.interventions.exact import interchange_grid, measure, restoration
from interp.analysis.interventions.patching import rows_per_pass
from interp.analysis.interventions.sites import Site, check_aligned, check_pair, check_sites
from interp.tasks.base import Batch

METRICS = ("restoration",)
EXTRA_METRICS = ("logit_diff", "kl")


@dataclass
class InterchangeResult:
    """Restoration per site and example.

    restoration [S, N] float64 (NaN for dropped examples), p_patched [S, N], p_clean [N],
    p_corrupt [N], kept [N] bool; labels[s] names sites[s]; n_kept examples passed the filter.
    With metrics (module docstring): logit_diff_patched [S, N], logit_diff_clean / _corrupt [N],
    kl_patched [S, N], kl_corrupt [N] (else None). Counts: n_run pairs run, n_skipped no-op pairs
    not run (they take the corrupted run's values), n_passes forward passes of patched rows;
    n_dropped = pairs of examples dropped by min_effect.
    """

    sites: list[Site]
    restoration: torch.Tensor
    p_patched: torch.Tensor
    p_clean: torch.Tensor
    p_corrupt: torch.Tensor
    kept: torch.Tensor
    min_effect: float
    logit_diff_patched: torch.Tensor | None = None
    logit_diff_clean: torch.Tensor | None = None
    logit_diff_corrupt: torch.Tensor | None = None
    kl_patched: torch.Tensor | None = None
    kl_corrupt: torch.Tensor | None = None
    n_run: int | None = None
    n_skipped: int | None = None
    n_passes: int | None = None

    @property
    def n_pairs(self) -> int:
        return len(self.sites) * len(self.kept)

    @property
    def n_dropped(self) -> int:
        return len(self.sites) * int((~self.kept).sum())

    @property
    def p_change(self) -> torch.Tensor:
        """p_patched - p_corrupt [S, N]."""
        return self.p_patched - self.p_corrupt

    @property
    def logit_diff_restoration(self) -> torch.Tensor:
        """(ld_patched - ld_corrupt) / (ld_clean - ld_corrupt) [S, N], NaN for examples dropped
        (by the probability filter) or with ld_clean = ld_corrupt."""
        if self.logit_diff_patched is None:
            raise ValueError("this result has no logit differences: run interchange(..., metrics=['logit_diff'])")
        effect = self.logit_diff_clean - self.logit_diff_corrupt
        valid = self.kept & (effect != 0)
        value = (self.logit_diff_patched - self.logit_diff_corrupt) / torch.where(valid, effect, torch.ones_like(effect))
        return value.masked_fill(~valid, float("nan"))

    @property
    def kl_change(self) -> torch.Tensor:
        """KL(clean || corrupt) - KL(clean || patched) [S, N]."""
        if self.kl_patched is None:
            raise ValueError("this result has no KL divergences: run interchange(..., metrics=['kl'])")
        return self.kl_corrupt - self.kl_patched

    @property
    def labels(self) -> list[str]:
        return [s.label for s in self.sites]

    @property
    def n_kept(self) -> int:
        return int(self.kept.sum())

    def mean(self) -> torch.Tensor:
        """Mean restoration per site over the kept examples [S] (NaN when none is kept)."""
        return self.restoration[:, self.kept].mean(dim=1)

    def sem(self) -> torch.Tensor:
        """Standard error of the mean per site [S] (NaN with fewer than 2 kept examples)."""
        values = self.restoration[:, self.kept]
        if values.shape[1] < 2:
            return torch.full((len(self.sites),), float("nan"), dtype=torch.float64)
        return values.std(dim=1) / math.sqrt(values.shape[1])

    def __getitem__(self, label: str) -> torch.Tensor:
        """Restoration [N] of the site with this label."""
        if label not in self.labels:
            raise KeyError(models.hooks.unknown_name_message("site label", label, self.labels))
        return self.restoration[self.labels.index(label)]

    def to_dataframe(self, per: str = "site"):
        """Tidy pandas DataFrame: per="site" (mean, sem, n_kept) or per="example" (one row each)."""
        import pandas as pd

        meta = [
            {"site": s.label, "hook": s.hook, "layer": s.layer, "component": s.component,
             "position": "all" if s.position is None else s.position, "head": s.head}
            for s in self.sites
        ]
        if per == "site":
            mean, sem = self.mean().tolist(), self.sem().tolist()
            return pd.DataFrame(
                [{**m, "mean": mean[i], "sem": sem[i], "n_kept": self.n_kept, "n": len(self.kept)}
                 for i, m in enumerate(meta)]
            )
        if per == "example":
            n = self.restoration.shape[1]
            frame = pd.DataFrame(meta).loc[np.repeat(np.arange(len(meta)), n)].reset_index(drop=True)
            frame["example"] = np.tile(np.arange(n), len(meta))
            frame["restoration"] = self.restoration.reshape(-1).numpy()
            frame["p_patched"] = self.p_patched.reshape(-1).numpy()
            frame["p_clean"] = np.tile(self.p_clean.numpy(), len(meta))
            frame["p_corrupt"] = np.tile(self.p_corrupt.numpy(), len(meta))
            frame["kept"] = np.tile(self.kept.numpy(), len(meta))
            if self.logit_diff_patched is not None:
                frame["logit_diff_patched"] = self.logit_diff_patched.reshape(-1).numpy()
                frame["logit_diff_restoration"] = self.logit_diff_restoration.reshape(-1).numpy()
            if self.kl_patched is not None:
                frame["kl_patched"] = self.kl_patched.reshape(-1).numpy()
                frame["kl_change"] = self.kl_change.reshape(-1).numpy()
            return frame
        raise ValueError(f"per must be 'site' or 'example'; got {per!r}")

    def __repr__(self) -> str:
        skipped = "not run (no example kept)" if self.n_run == 0 and self.n_kept == 0 else "skipped as no-ops"
        counts = "" if self.n_run is None else f"; {self.n_run} pairs run, {self.n_skipped} {skipped}, " \
            f"{self.n_dropped} dropped by min_effect, {self.n_passes} passes"
        return (f"InterchangeResult({len(self.sites)} sites x {len(self.kept)} examples, "
                f"{self.n_kept} kept with p_clean - p_corrupt > {self.min_effect}{counts})")


def interchange(
    model,
    clean: Batch,
    corrupt: Batch,
    sites: Sequence[Site],
    metric: str = "restoration",
    batch_size: int | None = None,
    min_effect: float = 0.01,
    answer: str | None = None,
    skip_noops: bool = True,
    resume: bool = True,
    metrics: Sequence[str] = (),
    max_memory: int | float | str | None = None,
    progress: bool = True,
    executor=None,
    out=None,
    chunk: tuple[int, int] | None = None,
) -> InterchangeResult:
    """Patch each site of the corrupted run from the clean run; restoration per site and example.

    batch_size: rows per forward pass ((site, example) pairs are packed up to it); default
    max(N, 512). On a CPU the cost per row does not fall with larger passes (it can rise for
    memory-bound scans), so packing pays where a pass's fixed cost dominates: small N, or a GPU,
    where passes of several thousand rows cost little more than one of N.
    answer: a role naming the answer-prediction position (default the last loss_mask position).
    Positions come from clean.roles for the source and corrupt.roles for the target.
    skip_noops: pairs whose patch cannot change the answer are not run and get p_corrupt: every
    site position after the answer position (the model is causal), or the clean value equal to
    the corrupt one at the site (a patch with the run's own value is a no-op). Same result, bit
    for bit; False runs every pair.
    resume: a patched run starts at the site's block and first position from the corrupt run's
    cached block inputs and recurrent states (everything before is the corrupt run's, by
    causality) and stops at the last site or answer position: the work per pair falls with the
    site's depth and position (`SequenceModel.resume_from`; attention still reads every earlier
    key, and mixers without a carried state - BaseConv, Hyena, see Mixer.resume_context -
    recompute their prefix). The values agree with whole passes up to float rounding (1e-6
    measured, tests/test_interventions.py); False runs whole passes.
    min_effect: examples with p_clean - p_corrupt <= min_effect are dropped (restoration NaN).
    The count kept is known once the clean and corrupted runs are cached, before any patched
    pass: a unit none of whose examples is kept runs no pair (its p_patched = p_corrupt, n_run
    0), so a plain call (one unit) keeping none stops there, saying so in one line on stderr
    (and, with progress, it prints the count kept before its passes).
    metrics: more per-pair numbers, any of "logit_diff", "kl" (module docstring).
    max_memory: the memory budget (models.memory.budget_bytes; default half the memory available
    now). Every run reads its logits at the answer position only ([rows, V], never [rows, T, V]),
    and recurrent states are cached whole only where they are small (a quarter of the budget at
    most): else a state site's clean states are recomputed per block from the cached block input;
    a resumed pass reads the corrupt run's states at the positions passes resume from only
    (interventions.planning). The planner estimates the caches
    and a row of each pass up front and picks the rows per pass (at most batch_size) and how
    coarse the resume positions are to fit; models.memory.MemoryRefused, one line naming the
    hooks, the estimate and the budget, before any work when not even one row fits.
    progress: a bar (counts, ETA) over the pairs run (off with INTERP_PROGRESS=0), or over the
    units of a grid.
    executor, out, chunk: split the grid into units of chunk = (sites, examples) (default
    (UNIT_SITES, UNIT_EXAMPLES)), run them on `executor` (None: here; else an executor of
    interp.sweep.executors: processes or Ray actors) and keep each finished unit in `out` (a
    directory: reruns skip finished units; interp.analysis.units). The result is a function of the
    inputs and the chunk alone: any executor, any number of workers and any completion order give
    the same bits as executor=None with the same chunk (each unit runs with one torch thread).
    Without any of the three the grid runs as one unit, as before (its bits may differ from a
    chunked run's in the last places: a pass's rows and threads change the rounding).
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}; got {metric!r}")
    if isinstance(metrics, str) or any(m not in EXTRA_METRICS for m in metrics):
        raise ValueError(f"metrics must be a list of {EXTRA_METRICS}; got {metrics!r}")
    if isinstance(min_effect, bool) or not isinstance(min_effect, (int, float)) or min_effect < 0:
        raise ValueError(f"min_effect must be a float >= 0; got {min_effect!r}")
    for name, flag in (("skip_noops", skip_noops), ("resume", resume), ("progress", progress)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool; got {flag!r}")
    check_pair(clean, corrupt)
    sites = check_sites(model, sites)
    check_aligned(clean, corrupt, sites, answer)
    rows_per_pass(batch_size, len(clean))  # checked here, resolved per unit
    options = dict(batch_size=batch_size, answer=answer, skip_noops=skip_noops, resume=resume, metrics=tuple(metrics),
                   min_effect=float(min_effect))
    if executor is None and out is None and chunk is None:
        raw = measure(model, clean, corrupt, sites, **options, max_memory=max_memory, progress=progress,
                      announce=progress)
    else:
        raw = interchange_grid(model, clean, corrupt, sites, options, max_memory, chunk, executor, out, progress)
    return assemble(sites, raw, clean, corrupt, float(min_effect), metrics)


def assemble(sites: list[Site], raw: dict, clean: Batch, corrupt: Batch, min_effect: float,
             metrics) -> InterchangeResult:
    """The InterchangeResult of raw numbers (measure's, or merged from units)."""
    values, kept = restoration(raw["p_patched"], raw["p_clean"], raw["p_corrupt"], min_effect)
    identical = (clean.tokens == corrupt.tokens).all(1)  # p_clean = p_corrupt by construction
    values[:, identical], kept = 1.0, kept | identical
    n_run, n_skipped, n_passes = raw["stats"].tolist()
    result = InterchangeResult(sites, values, raw["p_patched"], raw["p_clean"], raw["p_corrupt"], kept, min_effect,
                               n_run=n_run, n_skipped=n_skipped, n_passes=n_passes)
    if "logit_diff" in metrics:
        result.logit_diff_patched, result.logit_diff_clean = raw["scores"][..., 0], raw["ld_clean"]
        result.logit_diff_corrupt = raw["scores_corrupt"][:, 0]
    if "kl" in metrics:
        result.kl_patched, result.kl_corrupt = raw["scores"][..., 1], raw["scores_corrupt"][:, 1]
    return result
