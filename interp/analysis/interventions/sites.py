"""Sites and batch positions: what an intervention patches, and where.

A `Site(hook, position, head=None, subspace=None)` names one activation: a hook in the model's
grammar (`blocks.0.mixer.hook_out`), a position (a role of the batch such as "key", "value",
"query" - per-example positions from `batch.roles` - an int index, or None for every position),
optionally one head of a [B, T, H, ...] activation and a subspace: a projection matrix P [d, k]
with orthonormal columns, d the size of the selected feature vector; a subspace patch replaces
only the component in span(P):  f <- f + P P^T (f_source - f).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from interp.tasks.base import Batch


@dataclass(eq=False)
class Site:
    """One patchable activation: hook name, position (role | int | None), head, subspace [d, k]."""

    hook: str
    position: str | int | None = None
    head: int | None = None
    subspace: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.hook, str):
            raise TypeError(f"Site.hook must be a hook name (str); got {type(self.hook).__name__}")
        if self.position is not None and (
            isinstance(self.position, bool) or not isinstance(self.position, (str, int))
        ):
            raise TypeError(
                f"Site.position must be a role name (str), an int index or None; got {self.position!r}"
            )
        if self.head is not None and (
            isinstance(self.head, bool) or not isinstance(self.head, int) or self.head < 0
        ):
            raise ValueError(f"Site.head must be None or an int >= 0; got {self.head!r}")
        if self.subspace is not None:
            self.subspace = check_subspace(self.subspace)

    @property
    def label(self) -> str:
        """`hook@position[.head][/k-dim]`, e.g. `blocks.0.mixer.hook_out@value`."""
        text = f"{self.hook}@{'all' if self.position is None else self.position}"
        if self.head is not None:
            text += f".h{self.head}"
        if self.subspace is not None:
            text += f"/{self.subspace.shape[1]}d"
        return text

    @property
    def layer(self) -> int | None:
        match = re.match(r"blocks\.(\d+)\.", self.hook)
        return int(match.group(1)) if match else None

    @property
    def component(self) -> str:
        """The hook name without its `blocks.{l}.` prefix (`mixer.hook_out`)."""
        return re.sub(r"^blocks\.\d+\.", "", self.hook)

    def __repr__(self) -> str:
        return f"Site({self.label})"


def check_subspace(subspace) -> torch.Tensor:
    """A float [d, k] matrix with orthonormal columns (P^T P = I within 1e-4)."""
    if not isinstance(subspace, torch.Tensor):
        raise TypeError(f"subspace must be a torch.Tensor [d, k]; got {type(subspace).__name__}")
    if subspace.dim() != 2 or not subspace.dtype.is_floating_point or subspace.shape[1] < 1:
        raise ValueError(
            f"subspace must be a float [d, k] matrix with k >= 1; got dtype {subspace.dtype}, "
            f"shape {tuple(subspace.shape)}"
        )
    gram = subspace.double().T @ subspace.double()
    error = (gram - torch.eye(gram.shape[0], dtype=torch.float64)).abs().max().item()
    if error > 1e-4:
        raise ValueError(
            f"subspace columns must be orthonormal (P^T P = I); max |P^T P - I| = {error:.3g}. "
            "Orthonormalise first, e.g. torch.linalg.qr(P).Q"
        )
    return subspace.detach()


def site_grid(
    model,
    hooks: Sequence[str],
    roles: Sequence[str | int],
    layers: Iterable[int] | None = None,
    head: int | None = None,
) -> list[Site]:
    """Sites for every layer x hook x role, layer-major.

    hooks: templates with `{l}` for the layer ("blocks.{l}.mixer.hook_out") or plain names
    (taken once). layers: default every layer of the model. Every name is checked.
    """
    if isinstance(hooks, str) or isinstance(roles, str):
        raise TypeError("hooks and roles must be sequences (lists), not a single string")
    layer_list = list(range(model.cfg.n_layers) if layers is None else layers)
    sites: list[Site] = []
    for template in (h for h in hooks if "{l}" not in h):
        sites += [Site(template, role, head) for role in roles]
    for layer in layer_list:
        for template in (h for h in hooks if "{l}" in h):
            sites += [Site(template.format(l=layer), role, head) for role in roles]
    check_sites(model, sites)
    return sites


def check_sites(model, sites: Sequence[Site]) -> list[Site]:
    """The sites as a list; TypeError/ValueError for non-sites and unknown hook names."""
    if isinstance(sites, Site):
        sites = [sites]
    if isinstance(sites, (str, bytes)) or not isinstance(sites, Iterable):
        raise TypeError(f"sites must be a Site or a list of Sites; got {type(sites).__name__}: {sites!r}")
    sites = list(sites)
    if not sites:
        raise ValueError("sites must hold at least one Site; got none")
    for site in sites:
        if not isinstance(site, Site):
            raise TypeError(f"sites must be Site objects; got {type(site).__name__}: {site!r}")
        model.hook_point(site.hook)  # ValueError with close matches
    return sites


def check_batch(name: str, batch) -> None:
    if not isinstance(batch, Batch):
        raise TypeError(f"{name} must be an interp.tasks.base.Batch; got {type(batch).__name__}")


def check_pair(clean: Batch, corrupt: Batch) -> None:
    check_batch("clean", clean)
    check_batch("corrupt", corrupt)
    if clean.tokens.shape != corrupt.tokens.shape:
        raise ValueError(
            f"clean and corrupt tokens must have the same shape [N, T]; got clean "
            f"{tuple(clean.tokens.shape)} and corrupt {tuple(corrupt.tokens.shape)}"
        )


def check_aligned(clean: Batch, corrupt: Batch, sites: Sequence[Site], answer: str | None = None) -> None:
    """ValueError, one line naming the site and the pair, when a site patches position t from position
    t (position None or an int) while a pair's clean and corrupted answers lie at different
    positions (prompts of different lengths, aligned by role only: interp.prompts' corrupted_roles):
    position t of one is then not position t of the other. A role site maps the clean role's
    position to the corrupted role's, whatever they are."""
    fixed = [s for s in sites if not isinstance(s.position, str)]
    if not fixed:
        return
    clean_at, corrupt_at = answer_positions(clean, answer, "clean"), answer_positions(corrupt, answer, "corrupt")
    differ = torch.nonzero(clean_at != corrupt_at)[:, 0]
    if len(differ):
        i = int(differ[0])
        raise ValueError(
            f"site {fixed[0].label} patches position t from position t, but pair {i} has its clean answer at "
            f"position {int(clean_at[i])} and its corrupted answer at {int(corrupt_at[i])} (prompts of different "
            "lengths, aligned by role only); give such pairs' sites a role position"
        )


def site_positions(batch: Batch, position: str | int | None, which: str = "batch") -> torch.Tensor:
    """Positions [N, k] (int64) of a site in each example of `batch`."""
    n, length = batch.tokens.shape
    if position is None:
        return torch.arange(length).expand(n, length)
    if isinstance(position, int):
        if not -length <= position < length:
            raise ValueError(f"position {position} is out of range for length T={length}")
        return torch.full((n, 1), position % length, dtype=torch.long)
    if position not in batch.roles:
        raise ValueError(
            f"role {position!r} is not in the {which} batch's roles; available: {sorted(batch.roles)}"
        )
    pos = batch.roles[position].long()
    if pos.dim() == 1:
        pos = pos[:, None]
    if pos.dim() != 2 or pos.shape[0] != n:
        raise ValueError(f"role {position!r} must be [N] or [N, k] with N={n}; got {tuple(pos.shape)}")
    if bool((pos < 0).any()) or bool((pos >= length).any()):
        raise ValueError(f"role {position!r} holds positions outside [0, {length}) in the {which} batch")
    return pos


def answer_positions(batch: Batch, answer: str | None = None, which: str = "batch") -> torch.Tensor:
    """Answer-prediction position per example [N]: the last loss_mask position, or a role."""
    if answer is not None:
        if isinstance(answer, bool) or not isinstance(answer, (str, int)):
            raise TypeError(f"answer must be None, a role name or an int position; got {answer!r}")
        try:
            pos = site_positions(batch, answer, which)
        except ValueError as error:
            raise ValueError(f"answer {answer!r}: {error}") from None
        if pos.shape[1] != 1:
            raise ValueError(f"answer role {answer!r} must give one position per example; got {tuple(pos.shape)}")
        return pos[:, 0]
    has_loss = batch.loss_mask.any(dim=1)
    if not bool(has_loss.all()):
        missing = torch.nonzero(~has_loss)[:5, 0].tolist()
        raise ValueError(f"every {which} example needs a loss_mask position (the answer); examples {missing} have none")
    length = batch.tokens.shape[1]
    return (length - 1) - batch.loss_mask.flip(1).long().argmax(dim=1)


def answer_probs(logits: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """p(tokens[b]) at positions[b] from logits [N, T, V] -> [N] float64."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    probs = logits[rows, positions.to(logits.device)].double().softmax(-1)  # [N, V]
    return probs[rows, tokens.to(logits.device)].cpu()




def rival_answers(corrupt: Batch, corrupt_at: torch.Tensor, y: torch.Tensor, corrupt_ans: torch.Tensor) -> torch.Tensor:
    """y' [N], the corrupted answer the logit difference logit(y) - logit(y') is taken against: the
    corrupt batch's target at its answer position where it differs from y (a value corruption),
    else the corrupted run's most likely token other than y. corrupt_at [N, V]: that run's logits there."""
    rows = torch.arange(len(y))
    rival = corrupt.targets[rows, corrupt_ans].clone()
    same = rival == y
    others = corrupt_at.detach().clone()
    others[rows, y] = -float("inf")
    rival[same] = others.argmax(-1).cpu()[same]
    return rival
