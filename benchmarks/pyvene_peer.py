"""pyvene as a benchmark contender: the interchange grid the way a pyvene user runs it.

One pyvene.IntervenableModel with one VanillaIntervention ("pos" unit) per site, one call per site
(a source pass of the clean tokens and a base pass of the corrupted ones; with cached_sources the
clean activations once, then a base pass per site), through a small adapter
(what pyvene expects of a model: `.config`, `.device`, keyword inputs). The adapter wraps a copy of
the model (pyvene removes every forward hook of the model it wraps; the runs take each mixer's
default path, instrumented where pyvene hooks its hook_state) in which every `hook_state`
shows pyvene its states flattened to [B, T, prod(S)]: pyvene's position unit gathers and scatters
[B, T, d] (a 4-D tensor it reads as [B, H, T, d]), and Mamba's states are [B, T, E, N]. The view is
a reshape; the patched states go back into the scan as [B, T, E, N], which pins and re-runs them
as for any hook_state patch. pyvene is optional (benchmarks only): `available()` says whether it
imports, and `PyveneGrid` raises ImportError where it does not.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from interp.analysis.interventions import answer_positions, answer_probs
from interp.analysis.interventions.sites import site_positions
from models.hooks import HookPoint


def available() -> str | None:
    """None when pyvene imports, else why not (the ImportError's message)."""
    try:
        import pyvene  # noqa: F401
    except ImportError as error:
        return f"{type(error).__name__}: {error}"
    return None


class FlatState(HookPoint):
    """hook_state whose states [B, T, *S] pass through `flat` as [B, T, prod(S)] (pyvene's target)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name, self.flat = name, nn.Identity()

    @property
    def has_patches(self) -> bool:
        """pyvene's hooks sit on `flat`: the mixer takes its instrumented path for them too."""
        return super().has_patches or bool(self.flat._forward_hooks) or bool(self.flat._forward_pre_hooks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.flat(x.flatten(2)).view(x.shape)


class Adapter(nn.Module):
    """What pyvene expects of a model: `.config`, `.device`, keyword inputs; counts its calls."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner, self.config, self.calls = inner, None, 0

    @property
    def device(self):
        return next(self.parameters()).device

    def forward(self, tokens):
        self.calls += 1
        return self.inner(tokens)


class PyveneGrid:
    """p_patched [S, N] of an interchange grid via pyvene (module docstring); build once, call per run.

    cached_sources: instead of a source pass per site, the clean run's activations at every grid
    hook are collected once (model.run_with_cache, standing in for pyvene's CollectIntervention)
    and handed to each call as `source_representations`: one base pass per site."""

    def __init__(self, model, cached_sources: bool = False) -> None:
        import pyvene  # ImportError where pyvene is missing
        from pyvene.models.modeling_utils import type_to_dimension_mapping

        self.pv = pyvene
        type_to_dimension_mapping[Adapter] = {}  # unknown architecture: no dimension lookup
        inner = copy.deepcopy(model)
        for name, module in list(inner.named_modules()):
            if name.endswith("hook_state"):
                parent, attr = name.rsplit(".", 1)
                setattr(inner.get_submodule(parent), attr, FlatState(module.name))
        self.adapter, self.model, self.cached_sources = Adapter(inner), model, cached_sources

    def component(self, hook: str) -> str:
        return f"inner.{hook}.flat.output" if hook.endswith("hook_state") else f"inner.{hook}.output"

    def __call__(self, clean, corrupt, sites, answer: str | None = None) -> torch.Tensor:
        pv = self.pv
        clean_ans = answer_positions(clean, answer, "clean")
        y = clean.targets[torch.arange(len(clean)), clean_ans]
        out = []
        with torch.no_grad():  # each mixer on its own path (instrumented where pyvene hooks hook_state)
            if self.cached_sources:
                _, cache = self.model.run_with_cache(clean.tokens, names=sorted({s.hook for s in sites}))
            for site in sites:
                config = pv.IntervenableConfig([{"component": self.component(site.hook), "unit": "pos",
                                                 "intervention_type": pv.VanillaIntervention}])
                intervenable = pv.IntervenableModel(config, self.adapter)
                intervenable.disable_model_gradients()
                source = site_positions(clean, site.position, "clean")[None].tolist()  # [1, N, k]
                base = site_positions(corrupt, site.position, "corrupt")[None].tolist()
                if self.cached_sources:
                    at = site_positions(clean, site.position, "clean")  # [N, k]
                    rep = cache[site.hook][torch.arange(len(clean))[:, None], at].flatten(2)  # [N, k, d]
                    _, logits = intervenable({"tokens": corrupt.tokens}, unit_locations={"sources->base": (None, base)},
                                             source_representations=rep)
                else:
                    _, logits = intervenable({"tokens": corrupt.tokens}, [{"tokens": clean.tokens}],
                                             {"sources->base": (source, base)})
                out.append(answer_probs(logits, answer_positions(corrupt, answer, "corrupt"), y))
        return torch.stack(out)
