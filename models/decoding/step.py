"""One decoding call (`advance`): tokens at positions state.position, ... through the model's
blocks and hook points, each layer continuing from what it carried out of the call before.

The prompt runs once through the ordinary (fast) per-block computation, which also returns what
each layer carries forward; every new token is then a length-1 call through the same blocks and
hook points, continuing from that carried state (mixer_kind):

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
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import MutableMapping, Sequence

import torch

from models.decoding import DecodingState, grown
from models.decoding.readers import streamed_segment
from models.hooks import HookPoint

UNSET = object()


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
