"""Cache planning: the shape and bytes of every hook's cached activation, known before the run.

`plan_cache(model, tokens, names, positions)` runs the model twice on a tiny prefix of one
example (lengths 2 and 3, or the length itself when shorter) with a shape-recording reader on
every selected hook and no patches, under no_grad and a forked RNG. Each activation's shape is an
affine function of the length on each axis after the first (slope 1 on a time axis, 2 axes for
attention's [B, H, T, T]), and its first axis is the batch; two lengths give that function
exactly, so the planned shape at (B, T) is what the full run caches. The dtype is the dry run's.
(Why not the config: 25 mixers lay out their hooks differently; the dry run reads them all the
same way, costs two forwards of length 3, and the test suite checks it against the real sizes on
every model of the zoo.) The plan is memoised on the model for the same hooks, token device and
dtype, parameter dtypes and execution paths.

A hook's *time axis* is its first axis after the batch that grows with T (the query axis of
hook_attn_scores / hook_pattern, the step axis of hook_state). `positions` keeps some steps of it:

    positions=None               every position
    positions=[3, -1]            those positions of every selected hook that has a time axis
    positions={name: [...]}      per hook (names not listed: every position)

Positions are ints in [-T, T), distinct, kept in the order given (negative ones count from the
end and are stored as t % T). The cache then holds [B, K, ...] on the time axis
(`Cache.positions[name]` lists the K steps), and its bytes are planned as such.

A hook's *head axis* is its axis of attention heads, recurrent heads or channel groups
(`head_axis`): axis 2 of hook_q / k / v / z / result / beta [B, T, H, ...], axis 1 of
hook_attn_scores / hook_pattern [B, H, T, T], and axis 2 of hook_state [B, T, *S] where the state is
per head (S = [H, ...]: mamba2, deltanet, gated_deltanet, kda, based) or per channel (S = [C, N]: mamba and
its variants, h3, s4d: a "head" is then one channel); no other hook has one (docs/caches.md).
`heads` keeps some indices of it, as `positions` does of the time axis:

    heads=None                   every head
    heads=[0, -1]                those heads of every selected hook that has a head axis
    heads={name: [...]}          per hook (names not listed: every head)

Heads are ints in [-H, H) for that hook's H, distinct, kept in the order given and stored as h % H
(`Cache.heads[name]`).

`CachePlan.check(budget, streaming)` refuses (models.memory.MemoryRefused, one line) when the
cache (or, streamed to disk, its largest single activation) exceeds the budget: it names the
largest hooks and kinds, the estimate and the budget, and the ways out.
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from models.memory import MemoryRefused, format_bytes
from models.tl.names import to_ours

DRY_LENGTHS = (2, 3)
# hooks with a head axis, wherever a mixer has them: the axis of [B, T, H, ...] / [B, H, T, T]
PER_HEAD = {"hook_q": 2, "hook_k": 2, "hook_v": 2, "hook_z": 2, "hook_result": 2, "hook_beta": 2, "hook_attn_in": 2,
            "hook_q_input": 2, "hook_k_input": 2, "hook_v_input": 2,
            "hook_attn_scores": 1, "hook_pattern": 1}
# mixers whose hook_state [B, T, *S] has heads (S = [H, ...]) or channels (S = [C, N]) on axis 2
STATE_HEADS = frozenset({"mamba2", "deltanet", "gated_deltanet", "kda", "based", "rwkv7"})
STATE_CHANNELS = frozenset({"mamba", "negative_mamba", "mamba3", "aussm", "h3", "s4d", "lfm2_conv", "rwkv7_ffn"})


@dataclass(frozen=True)
class HookLayout:
    """One hook's activation shape as a function of (B, T): axis 0 is B times base[0]; axis i > 0
    is base[i] + slope[i] * (T - length) (base: the shape of the dry run at batch 1, `length`)."""

    base: tuple[int, ...]
    slope: tuple[int, ...]
    length: int
    dtype: torch.dtype
    head_axis: int | None = None  # the axis of heads / channel groups (module docstring)
    head_unit: str = "heads"  # what one index of it is: "heads" or "channels"

    @property
    def time_axis(self) -> int | None:
        """The first axis after the batch that grows with T (None: the activation has none)."""
        return next((i for i, s in enumerate(self.slope) if i and s), None)

    @property
    def n_heads(self) -> int | None:
        """The size of the head axis (None: none)."""
        return None if self.head_axis is None else self.base[self.head_axis]

    def shape(self, batch: int, length: int, kept: int | None = None, heads: int | None = None) -> tuple[int, ...]:
        """The shape at (batch, length); kept: the time axis holds that many positions; heads: the
        head axis holds that many heads."""
        dims = [b + s * (length - self.length) for b, s in zip(self.base, self.slope)]
        dims[0] = batch * self.base[0]
        if kept is not None and self.time_axis is not None:
            dims[self.time_axis] = kept
        if heads is not None and self.head_axis is not None:
            dims[self.head_axis] = heads
        return tuple(dims)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass
class CachePlan:
    """What a run_with_cache call will hold: per hook its shape and bytes at (batch, length), the
    positions and heads kept per hook, and whether `name + "_grad"` entries come too (incl_bwd: as
    many bytes again, an upper bound since a hook off the metric's graph has none)."""

    batch: int
    length: int
    layouts: dict[str, HookLayout]
    positions: dict[str, list[int]]
    grads: bool = False
    heads: dict[str, list[int]] = field(default_factory=dict)

    def shape(self, name: str) -> tuple[int, ...]:
        kept, heads = self.positions.get(name), self.heads.get(name)
        return self.layouts[name].shape(self.batch, self.length, None if kept is None else len(kept),
                                        None if heads is None else len(heads))

    def bytes(self, name: str) -> int:
        """Bytes of `name`'s cached activation (without its gradient)."""
        return math.prod(self.shape(name)) * _itemsize(self.layouts[name].dtype)

    @property
    def entries(self) -> dict[str, int]:
        """Bytes of every cache entry, the `_grad` ones included."""
        sizes = {name: self.bytes(name) for name in self.layouts}
        if self.grads:
            sizes.update({name + "_grad": size for name, size in list(sizes.items())})
        return sizes

    @property
    def total(self) -> int:
        return sum(self.entries.values())

    @property
    def largest_entry(self) -> int:
        return max(self.entries.values(), default=0)

    def summary(self, top: int = 3) -> str:
        """'largest: a 403 MB, b 403 MB, ...; by kind: mixer.hook_state 9.66 GB (24), ...'."""
        entries = sorted(self.entries.items(), key=lambda kv: -kv[1])
        kinds: dict[str, list[int]] = {}
        for name, size in entries:
            kinds.setdefault(re.sub(r"^blocks\.\d+\.", "", name), []).append(size)
        ranked = sorted(kinds.items(), key=lambda kv: -sum(kv[1]))[:top]
        return ("largest: " + ", ".join(f"{n} {format_bytes(s)}" for n, s in entries[:top])
                + "; by kind: " + ", ".join(f"{k} {format_bytes(sum(v))} ({len(v)})" for k, v in ranked))

    def check(self, budget: int, streaming: bool = False) -> None:
        """Raise MemoryRefused (one line) when the cache does not fit `budget` bytes: the whole
        cache in memory, or with streaming (to_disk) its largest single activation."""
        need = self.largest_entry if streaming else self.total
        if need <= budget:
            return
        what = (f"run_with_cache of {len(self.entries)} entries at B={self.batch}, T={self.length}"
                + (" streamed to disk (one activation at a time)" if streaming else ""))
        ways = ("keep some positions (positions=[...]) or heads (heads=[...]) or fewer names" if streaming else
                "select fewer names, keep some positions (positions=[...]) or heads (heads=[...]), stream to disk "
                "(to_disk='dir')")
        raise MemoryRefused(f"{what} needs about {format_bytes(need)}, over the memory budget of "
                            f"{format_bytes(budget)}; {self.summary()}; {ways} or raise max_memory "
                            f"(docs/caches.md)")

    def check_disk(self, directory) -> None:
        """Raise MemoryRefused when the cache's bytes exceed the free space where `directory`
        is (or would be) created."""
        path = Path(directory)
        where = path if path.is_dir() else path.parent
        if not where.is_dir():
            return  # create_store refuses a target whose parent does not exist
        free = shutil.disk_usage(where).free
        if self.total > free:
            raise MemoryRefused(f"run_with_cache to_disk={str(directory)!r} needs about {format_bytes(self.total)} "
                                f"on disk, more than the {format_bytes(free)} free there; {self.summary()}; keep some "
                                "positions (positions=[...]) or heads (heads=[...]) or fewer names (docs/caches.md)")

    def select(self, name: str, x: torch.Tensor, emitted: Sequence[int] | None = None,
               emitted_heads: Sequence[int] | None = None) -> torch.Tensor:
        """x restricted to `name`'s kept positions and heads (x itself when it keeps them all).
        emitted: the (ascending, distinct) steps x already holds on its time axis, when the mixer
        formed only those (models.hooks.selected_steps); emitted_heads likewise of its head axis
        (models.hooks.selected_heads)."""
        layout = self.layouts.get(name)
        if layout is None:
            return x
        return self._select_heads(name, layout, self._select_positions(name, layout, x, emitted), emitted_heads)

    def _select_positions(self, name: str, layout: HookLayout, x: torch.Tensor, emitted) -> torch.Tensor:
        axis = layout.time_axis
        return _select(name, x, self.positions.get(name), axis, self.length, emitted,
                       lambda: f"steps on its time axis (axis {axis}); positions were planned for T={self.length}")

    def _select_heads(self, name: str, layout: HookLayout, x: torch.Tensor, emitted=None) -> torch.Tensor:
        axis = layout.head_axis
        return _select(name, x, self.heads.get(name), axis, layout.n_heads, emitted,
                       lambda: f"{layout.head_unit} on axis {axis}; heads were planned for {layout.n_heads}")


def _select(name: str, x: torch.Tensor, kept, axis: int | None, planned: int, emitted, what) -> torch.Tensor:
    """x with only the `kept` indices along `axis` (x itself when nothing is selected there); emitted:
    the indices x holds when a decoding step emits part of the axis; otherwise x must hold `planned`
    along it (else a ValueError: "`name` fired with N " + what(), the message built only then)."""
    if kept is None or axis is None:
        return x
    if emitted is not None:
        return _kept_of_emitted(x, axis, kept, emitted)
    if x.shape[axis] != planned:
        raise ValueError(f"{name!r} fired with {x.shape[axis]} {what()}")
    return x.index_select(axis, _long(kept, x))

def _kept_of_emitted(x: torch.Tensor, axis: int, kept: Sequence[int], emitted: Sequence[int]) -> torch.Tensor:
    """The `kept` entries of x's `axis`, which holds the entries `emitted` (x itself when they agree)."""
    where = {e: i for i, e in enumerate(emitted)}
    index = [where[k] for k in kept]
    return x if index == list(range(x.shape[axis])) else x.index_select(axis, _long(index, x))


def _long(index: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(list(index), dtype=torch.long, device=like.device)


def plan_cache(model, tokens: torch.Tensor, names: Sequence[str], positions=None, grads: bool = False,
               heads=None, **kwargs) -> CachePlan:
    """The CachePlan of model.run_with_cache(tokens, names, positions=positions, heads=heads)
    (module docstring); kwargs go to the model's forward as in the run."""
    batch, length = int(tokens.shape[0]), int(tokens.shape[1])
    layouts = hook_layouts(model, tokens, names, **kwargs)
    positions, heads = (({to_ours(n, model.hook_dict): v for n, v in m.items()} if isinstance(m, Mapping) else m)
                        for m in (positions, heads))
    return CachePlan(batch, length, layouts, normalise_positions(positions, layouts, length), grads,
                     normalise_heads(heads, layouts))


def hook_layouts(model, tokens: torch.Tensor, names: Sequence[str], **kwargs) -> dict[str, HookLayout]:
    """{name: HookLayout} of the hooks among `names` that fire (module docstring: two dry runs)."""
    if hasattr(model, "check_tokens"):
        model.check_tokens(tokens)
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        raise ValueError(f"tokens must be a [B, T] tensor of token ids; got {getattr(tokens, 'shape', tokens)!r}")
    lengths = sorted({min(tokens.shape[1], t) for t in DRY_LENGTHS})
    key = (tuple(names), tuple(lengths), tokens.device, tokens.dtype, tuple(sorted(kwargs)),
           tuple(p.dtype for p in model.parameters()), tuple(getattr(m, "execution_path", "") for m in model.modules()))
    memo = getattr(model, "_layout_memo", None)
    if memo is not None and memo[0] == key:
        return memo[1]
    try:
        runs = [_dry_shapes(model, tokens[:1, :t], names, kwargs) for t in lengths]
    except Exception as error:
        error.add_note(f"(raised in run_with_cache's cache planner: a dry run on one example of length <= "
                       f"{max(DRY_LENGTHS)}, with the forward keywords {sorted(kwargs)}; docs/caches.md)")
        raise
    layouts = {}
    for name, (shape, dtype) in runs[0].items():
        later = runs[-1][name][0]
        if len(later) != len(shape):
            raise ValueError(f"{name!r} changes rank with the length ({shape} at T={lengths[0]}, {later} at "
                             f"T={lengths[-1]}): its bytes cannot be planned")
        slope = tuple((b - a) // max(lengths[-1] - lengths[0], 1) for a, b in zip(shape, later))
        axis, unit = head_axis(model, name, slope)
        layouts[name] = HookLayout(tuple(shape), slope, lengths[0], dtype, axis, unit)
    model._layout_memo = (key, layouts)
    return layouts


def _dry_shapes(model, tokens: torch.Tensor, names: Sequence[str], kwargs) -> dict:
    """{name: (shape, dtype)} of every hook among names that fires on tokens [1, t]."""
    seen: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}

    def record(x: torch.Tensor, hook) -> None:
        seen[hook.name] = (tuple(x.shape), x.dtype)

    devices = [tokens.device] if tokens.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad(), model.hooks(readers=[(n, record) for n in names]):
        model(tokens, **kwargs)
    return seen


def head_axis(model, name: str, slope: Sequence[int]) -> tuple[int | None, str]:
    """(axis, unit) of the hook's heads or channel groups (module docstring), (None, "heads") when
    it has none; slope: its layout's (a head axis does not grow with T)."""
    parent, _, short = name.rpartition(".")
    mixer = getattr(model.get_submodule(parent), "mixer_name", None) if parent else None
    if mixer is None:
        return None, "heads"
    if short == "hook_state":
        unit = "heads" if mixer in STATE_HEADS else "channels" if mixer in STATE_CHANNELS else None
        return (2, unit) if unit and len(slope) > 3 and not slope[2] else (None, "heads")
    axis = PER_HEAD.get(short)
    return (axis, "heads") if axis is not None and len(slope) > axis and not slope[axis] else (None, "heads")


def normalise_heads(heads, layouts: Mapping[str, HookLayout]) -> dict[str, list[int]]:
    """heads (None, a list / 1-D integer tensor for every hook with a head axis, or {name: list})
    -> {name: [h % H, ...]} (module docstring); ValueError / TypeError on anything else."""
    if heads is None:
        return {}
    if isinstance(heads, Mapping):
        out = {}
        for name, chosen in heads.items():
            if name not in layouts:
                raise ValueError(f"heads names {name!r}, which is not a cached hook; cached: {list(layouts)[:8]}")
            if layouts[name].head_axis is None:
                raise ValueError(f"heads names {name!r}, whose activation {layouts[name].base} (at B=1, T="
                                 f"{layouts[name].length}) has no head or channel axis (docs/caches.md lists the "
                                 "hooks that have one)")
            out[name] = _indices(chosen, layouts[name].n_heads, f"heads[{name!r}]", _unit(name, layouts[name]))
        return out
    headed = {name: layout for name, layout in layouts.items() if layout.head_axis is not None}
    if not headed:
        raise ValueError(f"heads={heads!r} selects heads, but none of the cached hooks has a head or channel axis "
                         f"(cached: {list(layouts)[:8]}; docs/caches.md lists the hooks that have one)")
    return {name: _indices(heads, layout.n_heads, "heads", _unit(name, layout)) for name, layout in headed.items()}


def _unit(name: str, layout: HookLayout) -> tuple[str, str]:
    """(the letter of the range, what the indices count) for _indices' messages on a head axis."""
    return "H", f"for {name!r} ({layout.n_heads} {layout.head_unit} on axis {layout.head_axis})"


def normalise_positions(positions, layouts: Mapping[str, HookLayout], length: int) -> dict[str, list[int]]:
    """positions (None, a list / 1-D integer tensor for every hook with a time axis, or {name: list})
    -> {name: [t % length, ...]} (module docstring); ValueError / TypeError on anything else."""
    if positions is None:
        return {}
    if isinstance(positions, Mapping):
        out = {}
        for name, steps in positions.items():
            if name not in layouts:
                raise ValueError(f"positions names {name!r}, which is not a cached hook; cached: {list(layouts)[:8]}")
            if layouts[name].time_axis is None:
                raise ValueError(f"positions names {name!r}, whose activation {layouts[name].base} has no time axis")
            out[name] = _indices(steps, length, f"positions[{name!r}]")
        return out
    steps = _indices(positions, length, "positions")
    return {name: steps for name, layout in layouts.items() if layout.time_axis is not None}


def _indices(values, size: int, argument: str, unit: tuple[str, str] = ("T", "")) -> list[int]:
    """A nonempty list of distinct indices in [-size, size) -> the list of i % size. unit: the
    letter of the range and what it is for, in the messages ("T" for positions)."""
    letter, where = unit
    noun = "positions" if letter == "T" else "heads"
    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.dtype.is_floating_point or values.is_complex() or values.dtype == torch.bool:
            raise TypeError(f"{argument} must be a list or 1-D integer tensor of {noun}; got {values.dtype} "
                            f"{tuple(values.shape)}")
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in values):
        raise TypeError(f"{argument} must be a nonempty list of int {noun}; got {values!r}")
    bad = [i for i in values if not -size <= i < size]
    if bad:
        raise ValueError(f"{argument} must lie in [-{letter}, {letter}) = [{-size}, {size}){' ' + where if where else ''}"
                         f"; got {bad[:6]}")
    kept = [i % size for i in values]
    if len(set(kept)) != len(kept):
        raise ValueError(f"{argument} must name each of its {noun} once; got {list(values)[:12]} (mod {letter}={size})")
    return kept
