"""Decoding: `generate` and the per-model `DecodingState` it carries from token to token.

The prompt runs once through the ordinary (fast) per-block computation, which also returns what
each layer carries forward; every new token is then a length-1 call through the same blocks and
hook points, continuing from that carried state:

    recurrent mixers (resume_context not None)   the state after the last step [B, *S] and what
        prepare() reads of earlier positions: the short-conv window [B, C, W - 1] of the conv's
        inputs where that is all (Mixer.carries_conv: Mamba, Mamba-2, DeltaNet, Gated DeltaNet,
        H3, RWKV-7; Mixer.convolve continues it; Based also keeps its sliding window's last
        keys and values there), else the mixer inputs (after hook_in) at the last
        resume_context positions [B, w, D] (Mamba-3); one step of the recurrence per token
        (fast_segment from the carried state; the instrumented path while hook_state /
        hook_gate is in use).
    attention                                   a KV cache: rotated keys and values
        [B, G, T, d_head] (Attention.mix_cached); the new query attends every cached position.
    long convolutions (mix_from_history: Hyena, BaseConv)   the short-conv window and the long
        convolution's inputs at every position [B, t, C] (a buffer grown like the KV cache):
        the new position's output reads them all, O(t) per token, no projection re-run.
    other mixers without a carried state (resume_context None)   the mixer input before
        hook_in at every position [B, t, D]: the mixer is recomputed over the whole prefix at
        each token (correct, but at least O(t) per token; its hooks then see every position).

Positions. While a call runs every hook point of the model has `hook.position`, the absolute
position of the first step on the time axis of what it sees (the query axis of hook_attn_scores
/ hook_pattern): 0 for the prompt, t for the token at position t, so a hook function knows
where it is (`getattr(hook, "position", 0)` also works in an ordinary forward). Inside a
mixer that carries mixer inputs (Mamba-3) the hooks of prepare() (hook_conv, hook_dt, ...) see
the window and the new position, [B, w + 1, ...], starting at t - w; a recomputed mixer's hooks
see [B, t + 1, ...] from 0; every other hook sees the new position only. The attribute is
removed when the call returns.

Readers. A reader on a recurrent mixer's hook_state (model.hooks(readers=...), run_with_cache's
kind: fn(x, hook), nothing returned) is handed each call's states [B, n, *S] unless it selects:
with a `positions` attribute (absolute steps) on every reader of the hook, each call runs its
fast segments up to the selected steps it holds and hands over those states only ([B, K, *S];
hook.emitted_positions: the steps on the call's time axis, hook.position + each is absolute), a
call holding none runs plain; with `heads` (indices of the state's head axis) the states are
narrowed to them (hook.emitted_heads), and with heads alone only those heads' states are formed
on the prompt where the mixer can (Mixer.head_states), a new token's state as the step's last
(emitted_positions [0]). So a reader on every layer need not build the prompt's [B, T, *S]
(benchmarks/RESULTS.md: readers during generate).

State patches. A `models.StatePatch` in fwd_hooks names absolute steps (times >= 0): each call
gets the entries it covers, shifted to its own time axis. Patches apply in step order, each on
the state the earlier ones left (models.hooks.state_patch), in a decoding call and in a full forward
alike, so patches at prompt and generated positions change every later token as the same
patches in a full forward over the final sequence. Hook functions on hook_state patch what they
see (hook.position tells them where). docs/generation.md is the guide.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, MutableMapping, Sequence

import torch

from models.cache import Cache
from models.hooks import HookPoint, StatePatch, selected_heads, selected_steps
from models.memory import progress_bar

# hooks whose time axis is 2 (the query axis) and whose axis 3 grows with the keys
QUERY_AXIS_HOOKS = ("hook_attn_scores", "hook_pattern")
READ_OUT_HOOKS = ("hook_final", "hook_logits", "norm_final.hook_scale")
UNSET = object()
BUFFER_AXES = {"keys": 2, "values": 2, "history": 1}  # DecodingState entries grown ahead, their time axis


def mixer_kind(mixer) -> str:
    """How a mixer decodes: "attention" (KV cache), "recurrent" (carried state and window),
    "history" (a long convolution over its carried inputs) or "recompute" (the whole prefix
    again at every token)."""
    if hasattr(mixer, "mix_cached"):
        return "attention"
    if hasattr(mixer, "hook_state") and mixer.resume_context is not None:
        return "recurrent"
    if hasattr(mixer, "mix_from_history"):
        return "history"
    return "recompute"


class DecodingState:
    """What a model carries from one decoding call to the next, one dict per layer:

        recurrent   {"state": [B, *S] after the last step, and "conv": [B, C, W - 1] the
                     short conv's last inputs (carries_conv) or "window": [B, w, D] mixer inputs
                     (after hook_in) at the last w = resume_context positions; Based also
                     "swa_keys", "swa_values" [B, H, <= window - 1, d_head]}
        attention   {"keys", "values": [B, G, >= position, d_head]} (buffers; positions
                     < `position` are valid; keys rotated for positional="rope")
        history     {"conv": [B, C, W - 1], "history": [B, >= position, C]} the long convolution's
                     inputs (a buffer like the keys)
        recompute   {"inputs": [B, position, D]} mixer inputs (before hook_in) at every position

    A block with a parallel second mixer (Block.mixer2) keeps that mixer's entries in the same
    layer dict under "mixer2." ("mixer2.keys", ...), a shared branch's attention under
    "shared.attn."; an MLP-only block's dict stays empty.
    position: the number of positions consumed (the absolute position of the next token).
    Edit a layer's tensors in place or replace them (same shapes) to change what comes next;
    copy() and select(rows) give independent states; save(path) / load(path) use safetensors."""

    def __init__(self, layers: list[dict[str, torch.Tensor]], position: int) -> None:
        self.layers, self.position = layers, position

    def trimmed(self) -> list[dict[str, torch.Tensor]]:
        """The layers with the KV and history buffers cut to the valid positions (views)."""
        return [{k: v.narrow(BUFFER_AXES[k.rsplit(".", 1)[-1]], 0, self.position)
                 if k.rsplit(".", 1)[-1] in BUFFER_AXES else v for k, v in layer.items()}
                for layer in self.layers]

    def copy(self) -> "DecodingState":
        return DecodingState([{k: v.clone() for k, v in layer.items()} for layer in self.trimmed()], self.position)

    def select(self, rows) -> "DecodingState":
        """The state of the batch rows `rows` (an index or [R] int tensor) only, as a copy."""
        rows = torch.as_tensor(rows)
        return DecodingState([{k: v[rows].clone() for k, v in layer.items()} for layer in self.trimmed()],
                             self.position)

    @property
    def batch(self) -> int:
        return next(v for layer in self.layers for v in layer.values()).shape[0]  # MLP-only layers hold none

    @property
    def nbytes(self) -> int:
        """The bytes of the valid entries (KV buffers' spare room not counted)."""
        return sum(v.numel() * v.element_size() for layer in self.trimmed() for v in layer.values())

    def save(self, path) -> None:
        """Write the state to one safetensors file (tensors by "layers.{l}.{key}", the position
        in the metadata), atomically (models.storage.writer)."""
        from safetensors.torch import save_file

        from models.storage.writer import write_file

        tensors = {f"layers.{i}.{k}": v.contiguous() for i, layer in enumerate(self.trimmed()) for k, v in layer.items()}
        metadata = {"position": str(self.position), "n_layers": str(len(self.layers))}
        write_file(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))

    @classmethod
    def load(cls, path) -> "DecodingState":
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
            layers: list[dict[str, torch.Tensor]] = [{} for _ in range(int(meta["n_layers"]))]
            for name in f.keys():
                _, layer, key = name.split(".", 2)
                layers[int(layer)][key] = f.get_tensor(name)
        return cls(layers, int(meta["position"]))


def grown(buffer: torch.Tensor | None, axis: int, needed: int, room: int, like: torch.Tensor) -> torch.Tensor:
    """buffer with space for `needed` entries on `axis`: itself, or a new one (uninitialised past
    the old entries, which are copied) with space for max(room, needed, twice the old size);
    shaped like `like` when None."""
    if buffer is not None and buffer.shape[axis] >= needed:
        return buffer
    shape = list(like.shape if buffer is None else buffer.shape)
    shape[axis] = max(room, needed, 0 if buffer is None else 2 * buffer.shape[axis])
    bigger = like.new_empty(shape)
    if buffer is not None:
        bigger.narrow(axis, 0, buffer.shape[axis]).copy_(buffer)
    return bigger


@contextlib.contextmanager
def at_position(points: Sequence[HookPoint], position: int):
    """Set hook.position on these hook points for the block of code (restored after). Written
    into the instance dict: nn.Module.__setattr__ costs ~1 us a point, 18 ms a token at 24 layers."""
    previous = [p.__dict__.get("position", UNSET) for p in points]
    for p in points:
        p.__dict__["position"] = position
    try:
        yield
    finally:
        for p, value in zip(points, previous):
            if value is UNSET:
                del p.__dict__["position"]
            else:
                p.__dict__["position"] = value


HOOK_LISTS: "weakref.WeakKeyDictionary[torch.nn.Module, list[HookPoint]]" = weakref.WeakKeyDictionary()


def hook_points(module: torch.nn.Module) -> list[HookPoint]:
    """Every HookPoint inside module (listed once per module)."""
    if module not in HOOK_LISTS:
        HOOK_LISTS[module] = [m for m in module.modules() if isinstance(m, HookPoint)]
    return HOOK_LISTS[module]


def run_attention(mixer, x: torch.Tensor, layer: dict, start: int, room: int = 0) -> torch.Tensor:
    """Attention from its KV cache: x [B, n, D] (after norm) at positions start, ... -> [B, n, D];
    room: positions to make space for when the buffers grow (generate: all it will run)."""
    u = mixer.hook_in(x)
    end = start + x.shape[1]
    like = u.new_empty(u.shape[0], mixer.n_kv, 1, mixer.d_head)
    layer["keys"] = grown(layer.get("keys"), 2, end, room, like)
    layer["values"] = grown(layer.get("values"), 2, end, room, like)
    return mixer.hook_out(mixer.mix_cached(u, layer["keys"], layer["values"], start))


def run_recurrent(mixer, x: torch.Tensor, layer: dict, start: int, room: int = 0) -> torch.Tensor:
    """A recurrent mixer from its carried state and window: x [B, n, D] -> [B, n, D]."""
    u = mixer.hook_in(x)
    inputs = prepare_conv(mixer, u, layer) if mixer.carries_conv else prepare_window(mixer, u, layer, start)
    out, layer["state"] = scan_from(mixer, u, inputs, layer.get("state"), start)
    return mixer.hook_out(out)


@contextlib.contextmanager
def carrying(mixer, layer):
    """Within the block mixer.conv_carry holds the layer's carried windows (Mixer.convolve's, and
    whatever else a mixer keeps there: Based's window keys and values); the layer then takes
    what the mixer left there."""
    mixer.conv_carry = {k: v for k, v in layer.items() if k not in ("state", "history") and "." not in k}
    try:
        yield
        layer.update(mixer.conv_carry)
    finally:
        mixer.conv_carry = None


def prepare_conv(mixer, u: torch.Tensor, layer: dict) -> dict[str, torch.Tensor]:
    """prepare(u) [B, n, D] continuing the carried windows (carrying), replaced by what follows
    u: the hooks of prepare see the n new positions only."""
    with carrying(mixer, layer):
        return mixer.prepare(u)


def prepare_window(mixer, u: torch.Tensor, layer: dict, start: int) -> dict[str, torch.Tensor]:
    """prepare() over the carried window of mixer inputs and u [B, n, D] -> the inputs at the n
    new positions; the window becomes the last resume_context positions."""
    n = u.shape[1]
    window = u if "window" not in layer else torch.cat([layer["window"], u], dim=1)  # [B, w + n, D]
    w = window.shape[1] - n
    with at_position(hook_points(mixer), start - w) if w else contextlib.nullcontext():
        inputs = {name: value[:, w:] for name, value in mixer.prepare(window).items()}
    layer["window"] = window[:, window.shape[1] - mixer.resume_context:] if mixer.resume_context else window[:, :0]
    return inputs


def scan_from(mixer, u: torch.Tensor, inputs: dict[str, torch.Tensor], initial, start: int = 0):
    """(output [B, n, D], state after the last step [B, *S]) of a recurrent mixer from prepared
    inputs and the carried state `initial` (None: the initial state) at positions start, ...: its
    fast segment; with StatePatches all that uses hook_state, its declared segment, with readers
    alone there that select steps or heads, streamed_segment (neither forms [B, n, *S]); while
    other per-step hooks are in use the instrumented path (patches pinned, the last state read
    after them)."""
    plan = mixer.declared_plan(u)
    if plan is not None:  # StatePatches only: on the fast kernels, stopped at each patched step
        return mixer.declared_segment(u, inputs, plan, initial)
    if not mixer.wants_instrumented():
        return mixer.fast_segment(u, inputs, initial)
    streamed = streamed_segment(mixer, u, inputs, initial, start)
    if streamed is not None:
        return streamed
    final: list[torch.Tensor] = []
    reader = lambda states, hook: final.append(states[:, -1])  # noqa: E731  the last state, after patches
    mixer.hook_state._readers.append(reader)
    try:
        out = mixer.instrumented_forward(u, inputs, initial)
    finally:
        mixer.hook_state._readers.remove(reader)
    return out, final[-1]


def read_steps(hook: HookPoint, start: int, n: int) -> list[int] | None:
    """The steps of a call at positions [start, start + n) that hook's readers keep, on the call's
    time axis: every reader has `positions` (absolute steps, as StatePatch times in generate;
    models.hooks.selected_steps) and nothing patches or probes the hook. Else None."""
    wanted = selected_steps(hook)
    return None if wanted is None else [p - start for p in wanted if start <= p < start + n]


def streamed_segment(mixer, u: torch.Tensor, inputs: dict[str, torch.Tensor], initial, start: int):
    """scan_from's (output, last state) with readers alone on hook_state selecting steps and / or
    heads (the module docstring) and no other per-step hook in use; None where that does not hold."""
    hook, gate = mixer.hook_state, getattr(mixer, "hook_gate", None)
    if not mixer.segments_allowed(u) or (gate is not None and gate.is_active):
        return None
    steps, heads = read_steps(hook, start, u.shape[1]), selected_heads(hook)
    if steps is None and heads is not None and u.shape[1] == 1:
        steps = [0]  # heads alone, one new token: its state is the segment's last
    if steps is None:
        states = mixer.head_states(inputs, heads) if heads is not None and initial is None else None
        if states is None:
            return None
        hook.emit(states, heads=heads)
        return mixer.fast_segment(u, inputs, initial)
    bounds = [0, *(t + 1 for t in steps)]
    bounds += [u.shape[1]] if bounds[-1] < u.shape[1] else []
    outs, finals, state = [], [], initial
    for lo, hi in zip(bounds, bounds[1:]):
        out, state = mixer.fast_segment(u[:, lo:hi], {k: v[:, lo:hi] for k, v in inputs.items()}, state)
        outs.append(out)
        finals.append(state)
    if steps:
        kept = finals[: len(steps)]  # one step: a view, not a fresh [B, 1, *S] (a page-faulting copy)
        states = kept[0].unsqueeze(1) if len(kept) == 1 else torch.stack(kept, dim=1)  # [B, K, *S]
        hook.emit(states if heads is None else states[:, :, heads], positions=steps, heads=heads)
    return torch.cat(outs, dim=1) if len(outs) > 1 else outs[0], state


def run_history(mixer, x: torch.Tensor, layer: dict, start: int, room: int = 0) -> torch.Tensor:
    """A long-convolution mixer (Hyena, BaseConv: mix_from_history) from its carried short-conv
    window and the history of its long convolution's inputs [B, >= start + n, C] (a buffer
    grown like the KV cache): x [B, n, D] -> [B, n, D], O(t) per new token."""
    u = mixer.hook_in(x)
    end = start + x.shape[1]
    like = u.new_empty(u.shape[0], 1, mixer.history_width)
    layer["history"] = grown(layer.get("history"), 1, end, room, like)
    with carrying(mixer, layer):
        out = mixer.mix_from_history(u, layer["history"], start)
    return mixer.hook_out(out)


def run_recompute(mixer, x: torch.Tensor, layer: dict, start: int, room: int = 0) -> torch.Tensor:
    """A mixer without a carried state, recomputed over every position so far -> [B, n, D]."""
    n = x.shape[1]
    history = x if "inputs" not in layer else torch.cat([layer["inputs"], x], dim=1)  # [B, start + n, D]
    layer["inputs"] = history
    with at_position(hook_points(mixer), 0):
        return mixer(history)[:, history.shape[1] - n:]


RUNNERS = {"attention": run_attention, "recurrent": run_recurrent, "history": run_history, "recompute": run_recompute}


class Prefixed(MutableMapping):
    """A layer dict's entries under `prefix` ("mixer2.": a block's parallel second mixer, whose
    carried tensors sit beside the first mixer's in the same DecodingState layer)."""

    def __init__(self, layer: dict, prefix: str) -> None:
        self.layer, self.prefix = layer, prefix

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.layer[self.prefix + key]

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        self.layer[self.prefix + key] = value

    def __delitem__(self, key: str) -> None:
        del self.layer[self.prefix + key]

    def __iter__(self):
        return (k[len(self.prefix):] for k in list(self.layer) if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def advance(model, tokens: torch.Tensor, state: DecodingState | None = None, all_logits: bool = False,
            room: int = 0):
    """Run tokens [B, n] at positions state.position, ... (0 with no state), continuing from
    `state` (updated in place; a new one when None) -> (logits, state): logits [B, n, V] when
    all_logits, else [B, V] at the last position only (the read-out of that one position).
    room: the positions a KV cache that grows makes space for at once (generate: all it runs)."""
    model.check_tokens(tokens)
    state = DecodingState([{} for _ in model.blocks], 0) if state is None else state
    if any(state.layers) and state.batch != tokens.shape[0]:
        raise ValueError(f"tokens has {tokens.shape[0]} rows; the decoding state has {state.batch}")
    start, n = state.position, tokens.shape[1]
    if hasattr(model, "pos_embed") and start + n > model.cfg.max_len:
        raise ValueError(f"positions up to {start + n} exceed the learned positions' max_len={model.cfg.max_len}")
    with at_position(hook_points(model), start):
        x = embedding = model.embedding(tokens, start)
        for block, layer in zip(model.blocks, state.layers):
            x = block(x, embed=embedding, run=lambda slot, mixer, normed: RUNNERS[mixer_kind(mixer)](
                mixer, normed, layer if slot == "mixer" else Prefixed(layer, f"{slot}."), start, room))
        if all_logits:
            logits = model.read_out(x)
        else:
            logits = model.read_out(x, torch.full((x.shape[0],), n - 1, device=x.device))
    state.position = start + n
    return logits, state


def next_tokens(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int | None,
                top_p: float | None, generator: torch.Generator | None) -> torch.Tensor:
    """The next token [B] from logits [B, V]: argmax, or a sample from softmax(logits /
    temperature) restricted to the top_k most likely tokens and then to the smallest set whose
    probability reaches top_p (the order of HF's warpers)."""
    if not do_sample:
        return logits.argmax(-1)
    scores = logits.float() / temperature
    if top_k is not None and top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, index = scores.sort(dim=-1, descending=False)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative <= 1 - top_p
        drop[:, -1] = False  # keep at least the most likely token
        scores = scores.masked_fill(drop.scatter(1, index, drop), float("-inf"))
    probs = scores.softmax(-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(logits.device)


def check_sampling(max_new_tokens, do_sample, temperature, top_k, top_p, seed) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0; got {max_new_tokens!r}")
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be a bool; got {do_sample!r}")
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature must be a float > 0; got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1; got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a float in (0, 1]; got {top_p!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be None or an int; got {seed!r}")


MAX_NEW_TOKENS = 1 << 20   # every model kind; a longer continuation is generated in pieces (state=)
SECONDS_PER_TOKEN_LAYER = 5e-4   # the floor of one token's step per layer (a 1-layer tanh RNN: 1.6 ms on a CPU)


def check_new_tokens(model, max_new_tokens: int) -> None:
    """ValueError past MAX_NEW_TOKENS, with the time it would take at the floor of a step's cost:
    a recurrent model has no max_len to stop it, and the loop would run for years."""
    if max_new_tokens > MAX_NEW_TOKENS:
        seconds = max_new_tokens * SECONDS_PER_TOKEN_LAYER * model.cfg.n_layers
        raise ValueError(f"max_new_tokens {max_new_tokens} is past the bound {MAX_NEW_TOKENS}: at "
                         f"{SECONDS_PER_TOKEN_LAYER * 1e3:g} ms a token per layer or more ({model.cfg.n_layers} layers) "
                         f"it would run for at least {_duration(seconds)}; generate in pieces (return_state=True, "
                         "then state=)")


def _duration(seconds: float) -> str:
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


class Recorder:
    """Readers for generate's cache: each call's new positions of every named hook, joined along
    the time axis at the end (the key axis of scores / pattern padded to the final length)."""

    def __init__(self, names: list[str]) -> None:
        self.chunks: dict[str, list[torch.Tensor]] = {n: [] for n in names}
        self.call_start = 0

    def readers(self) -> list[tuple[str, Callable]]:
        return [(name, self.reader(name)) for name in self.chunks]

    def reader(self, name: str):
        axis = 2 if name.endswith(QUERY_AXIS_HOOKS) else 1

        def store(x: torch.Tensor, hook: HookPoint) -> None:
            skip = self.call_start - getattr(hook, "position", 0)
            self.chunks[name].append(x.detach().narrow(axis, skip, x.shape[axis] - skip))

        return store

    def cache(self, model, length: int) -> Cache:
        cache = Cache(model=model)
        for name, chunks in self.chunks.items():
            if name.endswith(QUERY_AXIS_HOOKS):
                fill = float("-inf") if name.endswith("hook_attn_scores") else 0.0
                chunks = [torch.nn.functional.pad(c, (0, length - c.shape[-1]), value=fill) for c in chunks]
                cache[name] = torch.cat(chunks, dim=2)
            elif chunks:
                cache[name] = torch.cat(chunks, dim=1)
        return cache


def split_hooks(model, fwd_hooks) -> tuple[list, list[tuple[str, StatePatch]]]:
    """fwd_hooks -> (hook functions, [(hook_state name, StatePatch)]): StatePatches are handed to
    each call translated to its positions (call_patches); their times must be >= 0."""
    with model.hooks(fwd_hooks):  # checks them as run_with_hooks does (a bare pair, unknown names, ...)
        pass
    functions, patches = [], []
    for pair in fwd_hooks:
        if not isinstance(pair[1], StatePatch):
            functions.append(pair)
            continue
        name, patch = pair
        names = [n for n in model.hook_dict if name(n)] if callable(name) else [name]
        for target in names:
            model.hook_point(target)
            if not target.endswith("hook_state") or mixer_kind(model.get_submodule(target.rsplit(".", 1)[0])) == "attention":
                raise ValueError(f"a StatePatch goes on a recurrent mixer's hook_state; got {target!r}")
            if int(patch.times.min()) < 0:
                raise ValueError(f"a StatePatch in generate names absolute steps (times >= 0); got "
                                 f"times {patch.times.tolist()[:8]} on {target!r}")
            patches.append((target, patch))
    return functions, patches


def call_patches(model, patches, start: int, n: int) -> list[tuple[str, StatePatch]]:
    """The StatePatches' entries a call at positions [start, start + n) covers, as StatePatches
    on that call's time axis (a recomputed mixer's axis starts at 0, a recurrent one's at start)."""
    out = []
    for name, patch in patches:
        kind = mixer_kind(model.get_submodule(name.rsplit(".", 1)[0]))
        first = 0 if kind == "recompute" else start
        keep = (patch.times >= first) & (patch.times < start + n)
        if not bool(keep.any()):
            continue
        rows, times = patch.rows[keep], patch.times[keep] - first
        if patch.mode == "map":
            out.append((name, StatePatch(rows, times, fn=patch.payload)))
        else:
            index = keep.nonzero()[:, 0].to(patch.payload.device)
            given = {"values" if patch.mode == "set" else "deltas": patch.payload[index]}
            out.append((name, StatePatch(rows, times, **given)))
    return out


def prompt_layout(tokens: torch.Tensor, prompt_lengths, attention_mask, pad: int | None):
    """(tokens [B, T] with each row's prompt first, lengths [B] long or None when every row is
    T long) from generate's prompt_lengths (B ints in [1, T]; tokens right-padded) or
    attention_mask [B, T] (1 on each row's prompt: one contiguous run, moved to the front)."""
    if prompt_lengths is None and attention_mask is None:
        return tokens, None
    if prompt_lengths is not None and attention_mask is not None:
        raise ValueError("give prompt_lengths or attention_mask, not both")
    batch, length = tokens.shape
    if attention_mask is not None:
        mask = torch.as_tensor(attention_mask, device=tokens.device)
        if tuple(mask.shape) != (batch, length) or not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(f"attention_mask must be a 0/1 [B, T]={(batch, length)} tensor; got "
                             f"{tuple(mask.shape)} {mask.dtype}")
        mask = mask.bool()
        lengths = mask.sum(1)
        starts = mask.int().argmax(1)  # each row's first prompt position
        ends = starts + lengths
        inside = (torch.arange(length, device=tokens.device) >= starts[:, None]) & \
                 (torch.arange(length, device=tokens.device) < ends[:, None])
        if bool((lengths == 0).any()) or not bool((inside == mask).all()):
            raise ValueError("attention_mask must mark one contiguous, non-empty run of prompt positions per row")
        index = (starts[:, None] + torch.arange(length, device=tokens.device)).clamp(max=length - 1)
        tokens = tokens.gather(1, index)  # [B, T], each row's prompt first
    else:
        lengths = torch.as_tensor(prompt_lengths, device=tokens.device)
        if lengths.dtype.is_floating_point or lengths.dtype == torch.bool or tuple(lengths.shape) != (batch,) \
                or bool(((lengths < 1) | (lengths > length)).any()):
            raise ValueError(f"prompt_lengths must be {batch} ints in [1, {length}] (tokens [B, T]={(batch, length)}); "
                             f"got {torch.as_tensor(prompt_lengths).tolist()}")
    lengths = lengths.long()
    if bool((lengths == length).all()):
        return tokens, None
    if pad is None:
        raise ValueError("prompts of different lengths need pad_token_id (or eos_token_id) for the rows that end "
                         "before the longest; got neither")
    return tokens, lengths


def generate(model, tokens: torch.Tensor, max_new_tokens: int, *, do_sample: bool = False, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             eos_token_id: int | None = None, pad_token_id: int | None = None, fwd_hooks: Sequence[tuple] = (),
             cache_names=None, state: DecodingState | None = None, return_state: bool = False,
             prompt_lengths=None, attention_mask: torch.Tensor | None = None,
             allow_nonfinite: bool = False, progress: bool = True):
    """Continue tokens [B, T] by up to max_new_tokens tokens -> tokens [B, T + N] (N <= max_new_tokens).

    Greedy (argmax) by default; do_sample=True samples with temperature, top_k and top_p from a
    torch.Generator seeded with `seed` (same seed, same tokens on the CPU). eos_token_id: a row
    that produced it is finished; later positions of that row hold pad_token_id (default: the
    eos id) and the loop stops when every row is finished (finished rows are still computed,
    on the pad tokens). fwd_hooks: [(name or predicate, fn)] patches active for the prompt and
    every new token (hook.position says where a call is, the module docstring); StatePatches
    name absolute steps. cache_names: hook names (as run_with_cache's `names`) to record over
    prompt + generated positions: returns (tokens, Cache) with [B, T + N - 1, ...] entries (the
    last token is sampled, never run; read-out hooks hold every prompt position only when
    named). state: a DecodingState to continue from (tokens are then the tokens at positions
    state.position, ...; it is advanced in place); return_state=True appends the final state
    to what is returned.

    Prompts of different lengths: prompt_lengths (B ints, tokens right-padded) or attention_mask
    [B, T] (1 on each row's prompt, one contiguous run: left or right padding, as a tokenizer
    gives). Every row generates as it would alone: all rows share absolute positions, the
    common prefix of the shortest prompt runs at once and a longer row's remaining prompt
    tokens are fed one per step in place of the token it would have chosen (prompt_layout).
    Row b of the result is its prompt, up to max_new_tokens new tokens, then pad_token_id (or
    the eos id; one of them is required): [B, max length + N]. Hooks and the Cache see every
    row at every position; a row's positions past its end run on pad tokens.
    """
    check_sampling(max_new_tokens, do_sample, temperature, top_k, top_p, seed)
    check_new_tokens(model, max_new_tokens)
    for name, value in (("eos_token_id", eos_token_id), ("pad_token_id", pad_token_id)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value < model.cfg.vocab_size):
            raise ValueError(f"{name} must be None or a token id in [0, {model.cfg.vocab_size}); got {value!r}")
    model.check_tokens(tokens)
    pad = eos_token_id if pad_token_id is None else pad_token_id
    tokens, lengths = prompt_layout(tokens, prompt_lengths, attention_mask, pad)
    last = (0 if state is None else state.position) + tokens.shape[1] + max_new_tokens - 1  # positions run
    if hasattr(model, "pos_embed") and last > model.cfg.max_len:
        raise ValueError(f"{tokens.shape[1]} tokens + max_new_tokens={max_new_tokens} run {last} positions; the "
                         f"learned positions allow max_len={model.cfg.max_len}")
    functions, patches = split_hooks(model, fwd_hooks)
    names = [] if cache_names is None else model.resolve_hook_names(cache_names)
    recorder = Recorder(names)
    hooked_names = {n for n in names} | {n for n, _ in functions if isinstance(n, str)}
    full_read_out = any(n.endswith(READ_OUT_HOOKS) for n in hooked_names) or any(callable(n) for n, _ in functions)
    generator = torch.Generator().manual_seed(seed) if do_sample and seed is not None else None
    first = tokens.shape[1] if lengths is None else int(lengths.min())  # run at once
    out = feed = tokens[:, :first]
    steps = tokens.shape[1] - first + max_new_tokens
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    with torch.no_grad(), model.hooks(functions, readers=recorder.readers(), allow_nonfinite=allow_nonfinite), \
            progress_bar(steps, progress, desc="generate", unit="tok") as bar:
        for step in range(steps):
            start = 0 if state is None else state.position
            recorder.call_start = start
            with model.hooks(call_patches(model, patches, start, feed.shape[1]), allow_nonfinite=allow_nonfinite):
                logits, state = advance(model, feed, state, all_logits=full_read_out and step == 0, room=last)
            logits = logits[:, -1] if logits.dim() == 3 else logits
            new = next_tokens(logits, do_sample, temperature, top_k, top_p, generator)
            prompted = torch.zeros_like(finished)
            if lengths is not None:  # rows still in their prompt take it; rows past their N take pad
                column, position = min(out.shape[1], tokens.shape[1] - 1), out.shape[1]
                prompted = position < lengths
                new = torch.where(prompted, tokens[:, column], new)
                finished |= position >= lengths + max_new_tokens
            if eos_token_id is not None or lengths is not None:
                new = torch.where(finished, torch.full_like(new, pad), new)
            if eos_token_id is not None:
                finished |= (new == eos_token_id) & ~prompted
            out = torch.cat([out, new[:, None]], dim=1)
            feed = new[:, None]
            bar.update(1)
            if bool(finished.all()):
                break
    result = [out]
    if cache_names is not None:
        result.append(recorder.cache(model, out.shape[1] - 1))
    if return_state:
        result.append(state)
    return result[0] if len(result) == 1 else tuple(result)
