"""Ablations: a site replaced by zero or by its mean over a reference batch; short convolutions
shortened at load time (`ablate_short_conv`, no retraining)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

import models
from interp.analysis.interventions.grid import site_grid_units
from interp.analysis.interventions.patching import (after_answer, patched_answer_probs, probs_at, resume_hook_names,
                                                    rows_per_pass, run_cached, select_site, time_first)
from interp.analysis.interventions.sites import Site, answer_positions, check_batch, check_sites, site_positions
from interp.tasks.base import Batch

ABLATION_MODES = ("zero", "mean")
SHORT_CONV_MODES = ("truncate", "identity")


@dataclass
class AblationResult:
    """Answer probability and correctness with each site ablated (separately).

    p_answer [S, N], correct [S, N] bool; baseline_p [N], baseline_correct [N] (no ablation).
    """

    sites: list[Site]
    mode: str
    p_answer: torch.Tensor
    correct: torch.Tensor
    baseline_p: torch.Tensor
    baseline_correct: torch.Tensor

    @property
    def labels(self) -> list[str]:
        return [s.label for s in self.sites]

    def accuracy(self) -> torch.Tensor:
        return self.correct.double().mean(dim=1)

    def to_dataframe(self):
        import pandas as pd

        acc, p = self.accuracy().tolist(), self.p_answer.mean(dim=1).tolist()
        return pd.DataFrame(
            [{"site": s.label, "hook": s.hook, "layer": s.layer, "component": s.component,
              "position": "all" if s.position is None else s.position, "head": s.head,
              "mode": self.mode, "accuracy": acc[i], "p_answer": p[i],
              "baseline_accuracy": self.baseline_correct.double().mean().item(),
              "baseline_p_answer": self.baseline_p.mean().item()}
             for i, s in enumerate(self.sites)]
        )


def site_means(model, reference: Batch, sites: Sequence[Site], batch_size: int | None = None) -> list[torch.Tensor]:
    """Mean activation of each site over `reference` (over examples and the site's positions;
    per position for position=None) -> one tensor per site."""
    with models.instrumented():
        _, cache = run_cached(model, reference, sorted({s.hook for s in sites}),
                              rows_per_pass(batch_size, len(reference)))
    means = []
    for site in sites:
        pos = site_positions(reference, site.position, "reference")
        view = time_first(cache[site.hook], site.hook)
        values = select_site(view, torch.arange(len(reference)), pos, site)  # [N, k, ...]
        means.append(values.mean(dim=0) if site.position is None else values.mean(dim=(0, 1)))
    return means


def ablate(
    model,
    batch: Batch,
    sites: Sequence[Site],
    mode: str = "zero",
    reference: Batch | None = None,
    batch_size: int | None = None,
    answer: str | None = None,
    resume: bool = True,
    executor=None,
    out=None,
    chunk: tuple[int, int] | None = None,
    progress: bool = True,
) -> AblationResult:
    """Zero- or mean-ablate each site separately; answer probability and accuracy per site.

    mode "mean" replaces the site by its mean over `reference` (default: `batch` itself). For a
    subspace site only the component in the subspace is replaced (zero: projected out).
    resume: each ablated run starts at the site's block and first position from the batch's own
    cached run (as in `interchange`; sites after the answer keep the baseline); False: whole passes.
    executor, out, chunk, progress: the grid as units of chunk = (sites, examples), run on the
    executor and kept in out, as `interchange` (interventions.grid); the means are taken once,
    here, over the whole reference.
    """
    if mode not in ABLATION_MODES:
        raise ValueError(f"mode must be one of {ABLATION_MODES}; got {mode!r}")
    check_batch("batch", batch)
    sites = check_sites(model, sites)
    if reference is not None:
        check_batch("reference", reference)
    rows = rows_per_pass(batch_size, len(batch))  # checked here; each run resolves its own
    means = None
    if mode == "mean":
        means = site_means(model, batch if reference is None else reference, sites, rows)
    options = dict(batch_size=batch_size, answer=answer, resume=resume)
    if executor is None and out is None and chunk is None:
        raw = ablated(model, batch, sites, means, **options)
    else:
        inputs = {"batch": batch, "sites": list(sites), "means": means, "options": options}
        raw = site_grid_units(model, ablation_unit, inputs, len(sites), len(batch), PER_EXAMPLE, "ablation",
                              {**options, "mode": mode}, None, chunk, executor, out, progress)
    return AblationResult(sites, mode, raw["p_answer"], raw["correct"], raw["baseline_p"], raw["baseline_correct"])


PER_EXAMPLE = ("baseline_p", "baseline_correct")  # the rest is per site and example [S, N]


def ablation_unit(model, inputs: dict, spec: dict) -> dict[str, torch.Tensor]:
    """One unit of an ablation grid (a worker runs this; interventions.grid)."""
    (s0, s1), (e0, e1) = spec["sites"], spec["examples"]
    means = None if inputs["means"] is None else inputs["means"][s0:s1]
    return ablated(model, inputs["batch"].select(slice(e0, e1)), inputs["sites"][s0:s1], means, **inputs["options"])


def ablated(model, batch: Batch, sites: list[Site], means: list[torch.Tensor] | None, batch_size, answer,
            resume: bool) -> dict[str, torch.Tensor]:
    """p_answer [S, N], correct [S, N], baseline_p [N], baseline_correct [N] with each site set
    to zero (means None) or to its mean."""
    batch_size = rows_per_pass(batch_size, len(batch))
    ans = answer_positions(batch, answer)
    y = batch.targets[torch.arange(len(batch)), ans]

    def source(s: int, examples: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        if means is None:
            return torch.zeros_like(current)
        mean = means[s].to(current)  # [*feat] or, for position=None, [T, *feat]
        if mean.shape != current.shape[2 - (sites[s].position is None):]:
            raise ValueError(
                f"site {sites[s].label}: mean over the reference has shape {tuple(mean.shape)}, the "
                f"batch's activation {tuple(current.shape[1:])} (position=None needs equal lengths)"
            )
        return mean.expand_as(current)

    resume = resume and hasattr(model, "resume_from")
    with models.instrumented():
        logits, cache = run_cached(model, batch, resume_hook_names(model, sites) if resume else [], batch_size,
                                   at=ans)  # logits [N, V] at the answer
        baseline_p = probs_at(logits, y)
        baseline_correct = logits.argmax(-1).cpu() == y
        skip = after_answer([site_positions(batch, s.position) for s in sites], ans) if resume else None
        p_answer, correct, _ = patched_answer_probs(model, batch, sites, source, y, ans, batch_size, skip=skip,
                                                 unpatched=(baseline_p, baseline_correct),
                                                 resume_cache=cache if resume else None)
    return dict(p_answer=p_answer, correct=correct, baseline_p=baseline_p, baseline_correct=baseline_correct)


def short_convs(model) -> list[tuple[str, torch.Tensor]]:
    """Every short-conv kernel of the model: [(name, weight [C, W])], weight[:, -1] the tap on x_t.

    Found by, in order of precedence for a module and everything inside it:
      - a `short_convs()` method returning [(name, weight [C, W])] (views into its parameters);
      - 2-D parameters named `conv_weight` or `*_conv_weight` (models.kernels.short_conv's [C, W]);
      - depthwise `nn.Conv1d` modules (groups == in == out channels), weight[:, 0] as [C, W].
    """
    found: list[tuple[str, torch.Tensor]] = []
    listed: list[str] = []
    for path, module in model.named_modules():
        if any(path.startswith(prefix + ".") for prefix in listed):
            continue
        prefix = f"{path}." if path else ""
        if callable(getattr(module, "short_convs", None)):
            listed.append(path)
            found += [(prefix + name, weight) for name, weight in module.short_convs()]
            continue
        if isinstance(module, torch.nn.Conv1d) and module.groups == module.in_channels == module.out_channels:
            found.append((prefix + "weight", module.weight[:, 0]))
            continue
        for name, param in module.named_parameters(recurse=False):
            if (name == "conv_weight" or name.endswith("_conv_weight")) and param.dim() == 2:
                found.append((prefix + name, param))
    return found


def ablate_short_conv(model, width: int = 1, mode: str = "truncate") -> list[str]:
    """Shorten every short convolution in place; returns the names of the kernels changed.

    mode "truncate": keep the last `width` taps (the current step and width-1 before it) and zero
    the older ones, which equals a width-`width` convolution; width=1 is "no mixing across time"
    (a per-channel scale). mode "identity": the kernel becomes a delta at the current step
    (weight[:, -1] = 1, others 0; `width` is ignored); biases are left as they are.
    """
    if mode not in SHORT_CONV_MODES:
        raise ValueError(f"mode must be one of {SHORT_CONV_MODES}; got {mode!r}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be an int >= 1; got {width!r}")
    kernels = short_convs(model)
    if not kernels:
        raise ValueError(
            "the model has no short convolutions: no module defines short_convs(), a 2-D "
            "`conv_weight` parameter or a depthwise nn.Conv1d"
        )
    with torch.no_grad():
        for _, weight in kernels:
            if mode == "identity":
                weight.zero_()
                weight[:, -1] = 1.0
            elif width < weight.shape[1]:
                weight[:, : weight.shape[1] - width] = 0.0
    return [name for name, _ in kernels]


