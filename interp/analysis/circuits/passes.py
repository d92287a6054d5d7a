"""One forward pass in which every receiver of a circuit graph reads its own copy of the stream.

`edge_pass(model, graph, tokens, at, delta_of)` runs tokens [B, T] and returns the logits [B, V]
at positions at [B]. Before each receiver r reads the residual stream x (the input of its block's
norm), `delta_of(r, x, current)` may return a tensor d of x's shape; r then reads x + d instead
of x, and only r does:

    whole inputs (mlp{l}.in, logits)                               the norm's input becomes x + d
    a shared branch's inputs (z{l}.in, z{l}.e: Zamba2)             its x (or embed) becomes x + d
    whole mixer inputs (m{l}.in, a mixer's rest)                   the mixer's input becomes
        norm(x + d) (a block's parallel mixers read one norm, each its own copy)
    slots (a{l}.h{i}.q, s{l}.h{i}.write, ...)                      the mixer is run once more on
        norm(x + d_r) for every slot r of the block at once (stacked on the batch axis, stopped
        after the slot hooks fired), and in the pass itself each slot's hook values (its head or
        channels) are replaced by those of its own copy

`current` maps each sender hook to its value in this pass so far (senders upstream of r have
fired), so edge patching is d_r = sum over r's patched edges (u, r) of (source_u - current_u),
and EAP's gradient is that of a zero leaf d_r. Senders are read as they fire (hook_embed,
mixer.hook_out / hook_result, mlp.hook_out): under grad mode by patches that keep the autograd
graph, else by readers (the mixers then form hook_result beside their output, without autograd).
A mixer's slot hooks are hooked only while a side run's values replace them (a pass in which no
receiver moves runs every mixer on its own path, its slot hooks untouched).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from interp.analysis.circuits.graph import Graph, Receiver, Sender, block_mixers


class _Stop(Exception):
    """Raised by a slot hook once every slot hook of a side run has fired."""


class _PassState:
    def __init__(self) -> None:
        self.side = False
        self.needed: set[str] = set()
        self.side_values: dict[str, torch.Tensor] = {}
        self.overrides: dict[str, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}  # hook -> (axis, index, value)
        self.current: dict[str, torch.Tensor] = {}
        self.stream: dict[int, torch.Tensor] = {}  # block -> its residual stream (norm_mixer's input)
        self.slot_hooks = contextlib.ExitStack()  # the running mixer's slot hooks


def sender_value(sender: Sender, acts: dict[str, torch.Tensor], at: torch.Tensor | None = None) -> torch.Tensor:
    """The sender's output [B, T, D] from acts (hook -> activation), or [B, 1, D] at positions at [B]."""
    value = acts[sender.hook]
    if sender.head is not None:
        value = value[:, :, sender.head]
    if sender.channels is not None:  # a conv node: its channels of hook_conv
        value = value[:, :, sender.channels[0]:sender.channels[1]]
    if at is None:
        return value
    return value[torch.arange(len(at), device=value.device), at.to(value.device)][:, None]


def edge_pass(model, graph: Graph, tokens: torch.Tensor, at: torch.Tensor,
              delta_of: Callable[[int, torch.Tensor, dict], torch.Tensor | None],
              fwd_hooks: list = (), capture: str | None = "auto") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(logits [B, V] at `at` of tokens [B, T] with each receiver reading x + delta_of(r, x,
    current), the senders' hook values of the pass {hook: [B, T, ...]}). fwd_hooks: more
    patches for the pass (EAP-IG's interpolated embedding). capture: how the senders are read,
    "auto" (module docstring), "values" (readers, also under grad mode) or None (not at all:
    then delta_of sees no current values)."""
    if capture not in ("auto", "values", None):
        raise ValueError(f"capture must be 'auto', 'values' or None; got {capture!r}")
    state = _PassState()
    senders = sorted({s.hook for s in graph.senders if not s.split}) if capture else []
    slot_hooks = sorted({hook for r in graph.receivers for hook, _, _ in r.slots})
    conv_hooks = {h: readers for h in slot_hooks for readers in [_conv_readers(state, graph, h, delta_of)] if readers}
    # hooks of conv nodes are recorded (and read by their receivers) in the slot hook: never by readers
    read = capture == "values" or not torch.is_grad_enabled()
    fwd = list(fwd_hooks) + [(h, _sender_hook(state)) for h in senders if not read or h in conv_hooks]
    readers = [(h, _sender_reader(state)) for h in senders if h not in conv_hooks] if read else []
    fwd += [(h, _slot_hook(state, h, conv_hooks[h])) for h in conv_hooks]  # the others: while a side run replaces them
    handles = [model.get_submodule(h).register_forward_hook(_group_terms(state, h, g))  # Mamba channel groups
               for h, g in sorted({(s.hook, s.split) for s in graph.senders if s.split})] if capture else []
    try:
        for layer, block in enumerate(model.blocks):
            mixers = {slot: m for slot, m in block_mixers(block).items() if graph.mixer_receivers(layer, slot)}
            if mixers:
                handles.append(block.norm_mixer.register_forward_pre_hook(_record_stream(state, layer)))
            for slot, mixer in mixers.items():
                handles.append(mixer.register_forward_pre_hook(
                    _mixer_pre_hook(state, model, graph, block, layer, mixer, graph.mixer_receivers(layer, slot),
                                    delta_of, set(conv_hooks))))
                handles.append(mixer.register_forward_hook(_close_slot_hooks(state)))
            shared = [i for i, r in enumerate(graph.receivers) if r.layer == layer and r.site.startswith("shared")]
            if shared:  # Zamba2's shared branch: its inputs x and embed (z{l}.in, z{l}.e)
                handles.append(block.shared.register_forward_pre_hook(_shared_pre_hook(state, shared, delta_of)))
            mlp = [i for i, r in enumerate(graph.receivers) if r.layer == layer and r.site == "mlp"]
            if mlp:
                handles.append(block.norm_mlp.register_forward_pre_hook(_whole_pre_hook(state, mlp[0], delta_of)))
        logits_r = next(i for i, r in enumerate(graph.receivers) if r.site == "logits")
        handles.append(model.norm_final.register_forward_pre_hook(_whole_pre_hook(state, logits_r, delta_of)))
        with model.hooks(fwd, readers=readers):
            return model(tokens, at=at), state.current
    finally:
        for handle in handles:
            handle.remove()
        state.slot_hooks.close()


def _sender_hook(state: _PassState):
    def capture(x: torch.Tensor, hook) -> None:
        if not state.side:
            state.current[hook.name] = x

    return capture


def _group_terms(state: _PassState, name: str, groups: int):
    """A Linear's output split by input channel group: W[:, group g] x_g -> current[name] [B, T, G, D]."""
    def capture(module, args, out) -> None:
        if not state.side:
            x = args[0]
            weight = module.weight.view(module.weight.shape[0], groups, -1)  # [D, G, E / G]
            state.current[name] = torch.einsum("btge,dge->btgd", x.view(*x.shape[:-1], groups, -1), weight)

    return capture


def _sender_reader(state: _PassState):
    def read(x: torch.Tensor, hook) -> None:
        if not state.side:
            state.current[hook.name] = x.detach()

    return read


def _close_slot_hooks(state: _PassState):
    def post(module, args, output):
        if not state.side:
            state.slot_hooks.close()  # the mixer has run: its slot hooks are done

    return post


def _slot_hook(state: _PassState, name: str, readers=None):
    def slot(x: torch.Tensor, hook) -> torch.Tensor | None:
        if state.side:
            if name in state.needed:
                state.side_values[name] = x
                state.needed.discard(name)
                if not state.needed:
                    raise _Stop
            return None
        overrides = state.overrides.get(name)
        if not overrides:
            return None if readers is None else readers(x)
        out = x.clone()
        for axis, index, value in overrides:  # value: the slot's own [B, T, ..k..] at index on axis
            out.index_copy_(axis, index.to(x.device), value.to(x))
        return out if readers is None else readers(out)

    return slot


def _conv_readers(state: _PassState, graph: Graph, name: str, delta_of):
    """For a hook holding conv nodes (site "conv" receivers read them): after the slots' overrides,
    record the hook as the conv senders' value and add each reader's delta to its channels."""
    readers = [r for r, receiver in enumerate(graph.receivers) if receiver.site == "conv" and receiver.slots[0][0] == name]
    if not readers:
        return None

    def apply(x: torch.Tensor) -> torch.Tensor:
        state.current[name] = x
        out = x
        for r in readers:
            (_, axis, indices), = graph.receivers[r].slots
            index = torch.tensor(indices, device=x.device)
            delta = delta_of(r, x.index_select(axis, index), state.current)
            if delta is not None:
                out = out.index_add(axis, index, delta.to(x))
        return out

    return apply


def _whole_pre_hook(state: _PassState, receiver: int, delta_of):
    def pre(module, args):
        delta = delta_of(receiver, args[0], state.current)
        return None if delta is None else (args[0] + delta,) + tuple(args[1:])

    return pre


def _shared_pre_hook(state: _PassState, receivers: list[int], delta_of):
    def pre(module, args):  # args (x, embed, run)
        moved = list(args)
        for i, r in enumerate(receivers):  # z{l}.in moves x, z{l}.e the embedding
            delta = delta_of(r, args[i], state.current)
            moved[i] = args[i] if delta is None else args[i] + delta
        return tuple(moved)

    return pre


def _record_stream(state: _PassState, layer: int):
    def pre(module, args):
        if not state.side:
            state.stream[layer] = args[0]  # [B, T, D] the block's residual stream

    return pre


def _mixer_pre_hook(state: _PassState, model, graph: Graph, block, layer: int, mixer, receivers: list[int],
                    delta_of, hooked: set):
    """One mixer's receivers: a whole input (or the rest) replaces the mixer's input by
    norm(x + d); slots run the side pass whenever any of the mixer's receivers is moved, with the
    mixer's slot hooks (those not `hooked` for the whole pass) hooked until it has run."""
    slots = [r for r in receivers if graph.receivers[r].slots]
    whole = [r for r in receivers if not graph.receivers[r].slots]
    slot_hooks = sorted({h for r in slots for h, _, _ in graph.receivers[r].slots})
    lazy = [h for h in slot_hooks if h not in hooked]

    def pre(module, args):
        if state.side:  # the side run's own call
            return None
        x = state.stream[layer]
        deltas = {r: delta_of(r, x, state.current) for r in receivers}
        for hook in slot_hooks:
            state.overrides.pop(hook, None)
        if slots and any(d is not None for d in deltas.values()):
            state.slot_hooks.enter_context(model.hooks([(h, _slot_hook(state, h)) for h in lazy]))
            _side_run(state, graph, block, mixer, x, [(r, deltas[r]) for r in slots])
        moved = [deltas[r] for r in whole if deltas[r] is not None]
        return (block.norm_mixer.forward(x + sum(moved)),) + tuple(args[1:]) if moved else None

    return pre


def _side_run(state: _PassState, graph: Graph, block, mixer, x: torch.Tensor,
              slots: list[tuple[int, torch.Tensor | None]]):
    """Each slot r's hook values from norm(x + d_r) -> the overrides the pass's slot hooks apply.
    Attention's q / k / v: their rows of the qkv map (`_linear_slots`); other mixers: the mixer
    run on every copy stacked on the batch axis, stopped once the slot hooks fired."""
    stacked = torch.stack([x if d is None else x + d for _, d in slots])  # [S, B, T, D]
    normed = block.norm_mixer.forward(stacked)  # .forward: not through this pre-hook again
    receivers = [graph.receivers[r] for r, _ in slots]
    if mixer.mixer_name == "attention" and isinstance(getattr(mixer, "qkv", None), torch.nn.Linear):
        values = _linear_slots(mixer, normed, receivers)
    else:
        values = _mixer_slots(state, mixer, normed, receivers)
    for receiver, per_hook in zip(receivers, values):
        for (hook, axis, indices), value in zip(receiver.slots, per_hook):
            state.overrides.setdefault(hook, []).append((axis, torch.tensor(indices), value))


def _mixer_slots(state: _PassState, mixer, normed: torch.Tensor, receivers: list[Receiver]) -> list[list[torch.Tensor]]:
    """[[value of each of a receiver's slots]] from one run of the mixer on normed [S, B, T, D]."""
    copies, batch = normed.shape[:2]
    state.needed = {h for r in receivers for h, _, _ in r.slots}
    state.side_values = {}
    state.side = True
    try:
        with contextlib.suppress(_Stop):
            mixer(normed.flatten(0, 1))
    finally:
        state.side = False
    if state.needed:
        raise RuntimeError(f"slot hooks {sorted(state.needed)} did not fire in the mixer's side run (internal error)")
    return [[state.side_values[hook][copy * batch:(copy + 1) * batch].index_select(
        axis, torch.tensor(indices, device=normed.device)) for hook, axis, indices in receiver.slots]
        for copy, receiver in enumerate(receivers)]


def _linear_slots(mixer, normed: torch.Tensor, receivers: list[Receiver]) -> list[list[torch.Tensor]]:
    """Attention's hook_q / hook_k / hook_v at one head each are rows of its qkv map: one batched
    product over the copies normed [S, B, T, D] with each copy's d_head rows."""
    d_head, n_q, n_kv = mixer.d_head, mixer.n_heads, mixer.n_kv
    offset = {"hook_q": 0, "hook_k": n_q, "hook_v": n_q + n_kv}
    starts = []
    for receiver in receivers:
        (hook, _, (head,)), = receiver.slots
        starts.append((offset[hook.rsplit(".", 1)[1]] + head) * d_head)
    rows = torch.tensor(starts)[:, None] + torch.arange(d_head)  # [S, d_head]
    weight = mixer.qkv.weight[rows.to(normed.device)]  # [S, d_head, D]
    out = torch.einsum("sbtd,sed->sbte", normed, weight)  # [S, B, T, d_head]
    if mixer.qkv.bias is not None:
        out = out + mixer.qkv.bias[rows.to(normed.device)][:, None, None]
    return [[value[:, :, None]] for value in out]  # each [B, T, 1, d_head]
