"""Memory plans of the patch engine: what a run, a cache and a patched pass hold, before any work.

Sizes come from a probe: one example over the first few positions with a reader on every hook
(`footprint`), giving the bytes per example and position of each hook. From them:

    a pass of r rows over n positions   r * (n * (PASS_FACTOR * widest block + 2 d_model floats)
                                             + READ_OUT_FLOATS * vocab * 8)
                                        (the read-out is one position per row: logits [r, V])
    a cache of hooks over N examples    N * T * sum of the hooks' bytes per position
    recurrent states kept at P positions of L blocks   N * P * L * state bytes

The recurrent states of a run (`hook_state`, [N, T, *S] per block: 400 MB per block for
Mamba-130m at N = 8, T = 512) are cached whole only where a site reads them and they are small:
at most WHOLE_STATES_SHARE of the budget, leaving every cached run and pass its full rows (the
cached runs form them anyway; keeping them saves a block forward per state hook and run). Else a
site on them reads its block's states from `LazyStates`, which recomputes them from the cached
block input (one block forward) on first use and keeps one block at a time. A resumed pass reads
the states only at the positions where the passes resume (`resume_states`:
`models.backbone.StatesAt`, sliced from the whole states or recomputed), and the planner spaces
those positions (snapping each pass's start down to a multiple of a stride, the positions in
between recomputed) until they fit the budget.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from dataclasses import dataclass

import torch

from models.backbone import StatesAt
from models.memory import budget_bytes, rows_that_fit

PASS_FACTOR = 2.0  # live copies of a block's activations during a forward (inputs, outputs, temporaries)
READ_OUT_FLOATS = 3  # [r, V] float64 tensors formed per read-out row (logits, softmax, log-softmax)
PROBE_LENGTH = 4  # positions of the probe run
HEAD_FIRST = ("hook_pattern", "hook_attn_scores")  # [B, H, T, T]: bytes per position grow with T
WHOLE_STATES_SHARE = 0.25  # of the budget: states this small are cached whole, not recomputed per block


def is_state(hook: str) -> bool:
    """A recurrent state hook ([N, T, *S]): recomputed per block, never cached whole."""
    return hook.endswith("hook_state")


def block_input(hook: str) -> str:
    """The block input a state hook is recomputed from: blocks.j.hook_resid_pre."""
    return f"blocks.{layer_of(hook)}.hook_resid_pre"


def block_inputs(model, hook: str) -> set[str]:
    """What a state hook is recomputed from: its block input, and hook_embed where the block has
    a shared branch that reads the embedding (Zamba2)."""
    return {block_input(hook)} | ({"hook_embed"} if hasattr(model.blocks[layer_of(hook)], "shared") else set())


def layer_of(hook: str) -> int:
    return int(hook.split(".")[1])


@dataclass
class Footprint:
    """Bytes per example and position of every hook of a model at sequence length `length`."""

    per_position: dict[str, float]
    length: int
    vocab: int
    d_model: int

    def cache(self, hooks, n_rows: int) -> float:
        """Bytes of {hook: [n_rows, T, ...]} for these hooks."""
        return n_rows * self.length * sum(self.per_position[h] for h in hooks)

    def blocks(self) -> dict[int, float]:
        """{block j: the sum over its hooks of bytes per position}."""
        blocks: dict[int, float] = {}
        for hook, size in self.per_position.items():
            if hook.startswith("blocks."):
                blocks[layer_of(hook)] = blocks.get(layer_of(hook), 0.0) + size
        return blocks

    def widest_block(self) -> float:
        """The largest sum over one block's hooks of bytes per position."""
        return max(self.blocks().values(), default=4.0 * self.d_model)

    def graph_row(self, first: int) -> float:
        """Bytes one example's autograd graph holds over the whole length from block `first` on:
        every later block's activations (their hooks' sizes), the residual stream, the read-out."""
        kept = sum(size for j, size in self.blocks().items() if j >= first)
        return self.length * (kept + 8.0 * self.d_model) + READ_OUT_FLOATS * 8.0 * self.vocab

    def row(self, n_positions: int, read_out: bool = True) -> float:
        """Bytes one row of a forward pass over n_positions holds at its peak."""
        per_position = PASS_FACTOR * self.widest_block() + 8.0 * self.d_model
        return n_positions * per_position + (READ_OUT_FLOATS * 8.0 * self.vocab if read_out else 0.0)


def takes_at(model) -> bool:
    """Whether model(tokens, at=positions) reads the logits at one position per row."""
    return "at" in inspect.signature(model.forward).parameters


def logits_at(model, tokens: torch.Tensor, at: torch.Tensor, run=None, **options) -> torch.Tensor:
    """The logits [B, V] of run(tokens, **options) (default model) at positions at [B]: read there
    only where the model allows (takes_at), else taken from the whole [B, T, V]."""
    run = model if run is None else run
    if takes_at(model):
        return run(tokens, at=at, **options)
    out = run(tokens, **options)
    return out[torch.arange(len(at), device=out.device), at.to(out.device)]


@contextlib.contextmanager
def reading_at(model, tokens: torch.Tensor, at: torch.Tensor | None):
    """Within the context, a forward of exactly tokens' shape reads its logits at `at` [B] only
    (where takes_at; a forward pre-hook adds at=). Not a run_with_cache keyword, which its cache
    planner would also pass to its dry runs on one example's first few positions."""
    if at is None or not takes_at(model):
        yield
        return

    def add_at(module, args, kwargs):
        if args and isinstance(args[0], torch.Tensor) and args[0].shape == tokens.shape and "at" not in kwargs:
            return args, {**kwargs, "at": at}
        return None

    handle = model.register_forward_pre_hook(add_at, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def footprint(model, tokens: torch.Tensor) -> Footprint:
    """Probe one example (tokens [N, T], its first row and first PROBE_LENGTH positions) with a
    reader on every hook; [B, H, T, T] hooks are scaled to the full length T."""
    length = tokens.shape[1]
    probe = tokens[:1, : min(length, PROBE_LENGTH)]
    sizes: dict[str, float] = {}

    def reader(x: torch.Tensor, hook) -> None:
        scale = length / probe.shape[1] if hook.name.endswith(HEAD_FIRST) else 1.0
        sizes[hook.name] = x[0].numel() * x.element_size() / probe.shape[1] * scale

    names = [n for n in model.hook_names() if n != "hook_logits"]
    with torch.no_grad(), model.hooks(readers=[(n, reader) for n in names]):
        logits = logits_at(model, probe.to(_device(model)), torch.tensor([probe.shape[1] - 1]))
    return Footprint(sizes, length, logits.shape[-1], getattr(model.cfg, "d_model", 0))


def _device(model) -> torch.device:
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def block_activation(model, inputs: torch.Tensor, hook: str, chunk: int, positions: list[int] | None = None,
                     embed: torch.Tensor | None = None):
    """The activation `hook` of block j recomputed from its cached input [N, T, D] (one block
    forward per chunk of rows, on the current path) -> [N, T, ...], or [N, P, ...] at positions.
    embed [N, T, D]: the cached hook_embed, which a block with a shared branch (Zamba2) reads."""
    out = []
    embeds = [None] * len(inputs.split(chunk)) if embed is None else embed.split(chunk)
    for rows, rows_embed in zip(inputs.split(chunk), embeds):
        got: list[torch.Tensor] = []

        def keep(x: torch.Tensor, _hook) -> None:
            got.append(x.detach() if positions is None else x.detach()[:, positions].clone())

        with torch.no_grad(), model.hooks(readers=[(hook, keep)]):
            model.blocks[layer_of(hook)](rows, embed=rows_embed)
        out.append(got[-1])
    return torch.cat(out)


class LazyStates:
    """{hook: activation [N, ...]} of one run, as the dict it wraps, except that state hooks
    in `lazy` are recomputed from the cached block input on first use (block_activation) and only
    the last one asked for is kept."""

    def __init__(self, model, cache: dict, chunk: int, lazy) -> None:
        self.model, self.cache, self.chunk, self.lazy = model, cache, chunk, set(lazy)
        self.last: tuple[str, torch.Tensor] | None = None

    def __getitem__(self, hook: str) -> torch.Tensor:
        if hook not in self.lazy:
            return self.cache[hook]
        if self.last is None or self.last[0] != hook:
            self.last = None  # free the previous block's states first
            self.last = (hook, block_activation(self.model, self.cache[block_input(hook)], hook, self.chunk,
                                                embed=self.cache.get("hook_embed")))
        return self.last[1]


def resume_positions(groups, n_layers: int) -> dict[int, list[int]]:
    """{block j: the positions start - 1 whose states passes resumed at blocks <= j read}."""
    wanted: dict[int, set[int]] = {j: set() for j in range(n_layers)}
    for layer, start, _ in groups:
        if layer is not None and start > 0:
            for j in range(layer, n_layers):
                wanted[j].add(start - 1)
    return {j: sorted(p) for j, p in wanted.items()}


def states_bytes(model, fp: Footprint, groups, n_rows: int) -> float:
    """Bytes of the states `resume_states` keeps for these groups."""
    positions = resume_positions(groups, len(model.blocks))
    return n_rows * sum(len(p) * fp.per_position.get(f"blocks.{j}.{slot}.hook_state", 0.0)
                        for j, p in positions.items() if p for slot in model._carrying(j))


def resume_states(model, cached: dict, groups, chunk: int) -> dict:
    """The resume cache of `groups`: the block inputs of `cached` ({blocks.j.hook_resid_pre:
    [N, T, D]}) and, per carrying block, a StatesAt of its states [N, P, *S] at the positions P
    passes resume from: sliced from the whole states where `cached` holds them ([N, T, *S], the
    planner's whole_states), else recomputed from the block input (block_activation)."""
    cache = {hook: value for hook, value in cached.items() if not is_state(hook)}
    for j, positions in resume_positions(groups, len(model.blocks)).items():
        for hook in (f"blocks.{j}.{slot}.hook_state" for slot in model._carrying(j)):  # mixer, a parallel mixer2
            if f"blocks.{j}.hook_resid_pre" in cached:
                cache[hook] = StatesAt(_states_at(model, cached, hook, positions, chunk), positions)
    return cache


def _states_at(model, cached: dict, hook: str, positions: list[int], chunk: int) -> torch.Tensor:
    """The states of `hook` at positions [N, P, *S]: a copy out of the whole states where cached
    holds them, else one block forward per chunk of rows (none where P = 0)."""
    if hook in cached:
        return cached[hook][:, positions]
    inputs = cached[block_input(hook)]  # [N, T, D]
    if not positions:
        return inputs[:, :0]
    return block_activation(model, inputs, hook, chunk, positions, cached.get("hook_embed"))


def describe(hooks) -> str:
    """'hooks blocks.{l}.hook_resid_pre, blocks.{l}.mixer.hook_out (layers 0-23)': the hook names
    with the layer as {l}, and the layers they cover."""
    templates = sorted({re.sub(r"^blocks\.\d+\.", "blocks.{l}.", h) for h in hooks})
    layers = sorted({layer_of(h) for h in hooks if h.startswith("blocks.")})
    span = "" if not layers else f" (layers {layers[0]}" + (f"-{layers[-1]})" if len(layers) > 1 else ")")
    return "hooks " + ", ".join(templates) + span


HINT = "pass a larger max_memory, or fewer examples, sites or positions"


class Planner:
    """The memory plan of one patch_from call (module docstring), made before any work.

    source_names / target_names: the hooks the clean (source) and corrupted (target) runs cache:
    the grid's state hooks whole where they are small (whole_states), else replaced by their
    block inputs and recomputed per block (lazy); chunk: rows per cached run; passes(groups of a
    stride) -> (groups, rows per pass of each group), the stride doubled until the resume states
    fit. MemoryRefused (models.memory.refuse: what, the estimate, the budget) when not even one
    row fits.
    """

    def __init__(self, model, tokens: torch.Tensor, hooks, resid, skip_noops: bool, max_memory, batch_size,
                 lazy: bool = True) -> None:
        self.model, self.budget = model, budget_bytes(max_memory)
        self.fp = footprint(model, tokens)
        self.n, self.length = tokens.shape
        self.what = f"interchange at {describe(hooks)} over N={self.n}, T={self.length}"
        self.wanted = max(1, batch_size if batch_size is not None else max(self.n, 512))
        # lazy (resumed passes, one hook each): a SequenceModel's large states are recomputed per
        # block; else (whole passes mix hooks, or another model) they are cached whole
        states = [h for h in hooks if lazy and is_state(h) and hasattr(model, "resume_from")]
        # the target's states whole: for the no-op check, and the resume states are sliced from them
        whole_target = set(resid) | set(hooks if skip_noops else states)
        self.whole_states = bool(states) and self._fits_whole(states, set(hooks), whole_target)
        self.lazy = [] if self.whole_states else states
        if self.whole_states:
            self._names(set(hooks), whole_target, resid, 0.0)
        else:
            light = {h for h in hooks if h not in states}.union(*(block_inputs(model, h) for h in states))
            one_block = max((self.fp.cache([h], self.n) for h in states), default=0.0)  # one block's states at a time
            self._names(light, set(resid) | (light if skip_noops else set()), resid, one_block, 1 + skip_noops)
        self.chunk = rows_that_fit(self.fp.row(self.length), self.budget, min(self.wanted, self.n), self.what,
                                   self.held_runs, HINT)

    def _names(self, source, target, resid, one_block: float, lazy_blocks: int = 0) -> None:
        """The cached hooks and the bytes held during the cached runs (held_runs) and the passes
        (held); one_block: the bytes of one block's recomputed states, lazy_blocks of them held
        during the runs (the source's and, for the no-op check, the target's)."""
        self.source_names, self.target_names = sorted(source), sorted(target)
        source_bytes = self.fp.cache(self.source_names, self.n)
        self.held_runs = source_bytes + self.fp.cache(self.target_names, self.n) + lazy_blocks * one_block
        self.held = source_bytes + self.fp.cache(resid, self.n) + one_block

    def _fits_whole(self, states, source, target) -> bool:
        """Whether the grid's states may be cached whole (the hooks `source` and `target` cached):
        both runs' states at most WHOLE_STATES_SHARE of the budget, and every cache with a pass of
        the most rows over the whole length within it."""
        whole = self.fp.cache(states, self.n) + self.fp.cache([h for h in target if is_state(h)], self.n)
        held = self.fp.cache(source, self.n) + self.fp.cache(target, self.n)
        return (whole <= WHOLE_STATES_SHARE * self.budget
                and held + self.wanted * self.fp.row(self.length) <= self.budget)

    def passes(self, make_groups) -> tuple[list, list[int]]:
        """(groups, rows per pass) from make_groups(stride), the stride the smallest power of 2
        whose resume states fit beside the caches and one row of the longest pass."""
        stride = 1
        while True:
            groups = make_groups(stride)
            states = states_bytes(self.model, self.fp, groups, self.n)
            longest = max((self.fp.row(self.length - start) for _, start, _ in groups), default=0.0)
            if self.held + states + longest <= self.budget or stride >= self.length:
                break
            stride *= 2
        fixed = self.held + states
        return groups, [rows_that_fit(self.fp.row(self.length - start), self.budget, self.wanted, self.what, fixed,
                                      HINT) for _, start, _ in groups]
