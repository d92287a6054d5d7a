"""The computational graph of a model for circuit discovery, built from its hook grammar.

Senders write additively into the residual stream; receivers read it. With a residual stream,

    input of a receiver in block l = hook_embed + sum over blocks j < l of (mixer out + MLP out)
                                      (+ block l's mixer out, for block l's MLP)

and each mixer's output splits further into one term per head where the mixer reports
`hook_result` [B, T, H, d_model] (their sum plus the output bias is hook_out). So the senders are:

    embed                 hook_embed
    a{l}.h{i}             attention head i of block l (its hook_result slice)
    s{l}.h{i}             recurrent head i (Mamba-2, DeltaNet, Gated DeltaNet: the read-out of
                          that head's state, its hook_result slice)
    m{l}                  a mixer without per-head outputs, whole (Mamba, RNNs, convolutions)
    mlp{l}                the MLP of block l
    z{l}                  Zamba2's shared transformer at depth l (shared.hook_out), one node: it
                          adds to block l's mixer input only (norm(x + z(x, embed))), so its edges
                          go to block l's mixer receivers only

and the receivers (each one reads its own copy of the residual stream, through the block's norm):

    a{l}.h{i}.q / .k / .v     an attention head's query, key, value inputs (EAP's split inputs;
                              k / v per key-value head with grouped queries)
    s{l}.h{i}.write           what a recurrent head writes into its state (DeltaNet: k, v, beta;
                              Gated DeltaNet: k, v, beta, dt; Mamba-2: its x channels and dt)
    s{l}.h{i}.read            the read-out query of its state (DeltaNet / GDN q)
    s{l}.g{g}.B / .read       Mamba-2's per-group input and read-out vectors B, C (shared by the
                              group's heads)
    a{l}.rest / s{l}.rest     every other path through the mixer's input (output gates, Mamba-2's
                              z gate): the mixer as called on its input
    m{l}.in                   a whole mixer's input
    mlp{l}.in                 an MLP's input
    z{l}.in / z{l}.e          a shared transformer's two inputs: the residual stream x, and the
                              embedding it reads beside it (an edge from embed only)
    logits                    the final norm's input at the answer position

Options: build_graph(model, conv=True) adds the short convolution of Mamba-2 / DeltaNet / Gated
DeltaNet as nodes (`_conv_nodes`: sender c{l}.{unit}.{role}, its input receiver ...in, the state's
reader s{l}.{unit}.{x, B, read, k, v}); channel_groups=G splits a Mamba (-1) layer's output into
senders s{l}.g{g} (`_channel_groups`); positions=[roles] splits every node by position group
(`positional_graph`).

A receiver inside a mixer is a *slot*: a set of (hook, axis, indices) whose values it sets (e.g.
hook_q at head i); its input passes through the norm and the mixer's own maps up to those hooks
(`interp.analysis.circuits.passes`). Every sender upstream of a receiver has an edge to it:
senders of blocks before l (and embed) to block l's mixer receivers, plus block l's mixer senders
to its MLP, and every sender to the logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from models.mixers.mamba import Mamba

SLOT_HOOKS = {  # mixer name -> {role: hooks}, each hook with its head axis (2) unless listed in CHANNELS
    "attention": {"q": ("hook_q",), "k": ("hook_k",), "v": ("hook_v",)},
    "deltanet": {"write": ("hook_k", "hook_v", "hook_beta"), "read": ("hook_q",)},
    "gated_deltanet": {"write": ("hook_k", "hook_v", "hook_beta", "hook_dt"), "read": ("hook_q",)},
}
# mixers with paths from the input that no slot covers (output gates): mixer -> the option that adds them
HAS_REST = {"attention": "output_gate", "deltanet": "gate", "gated_deltanet": "gate", "mamba2": "gate"}


@dataclass(frozen=True)
class Sender:
    """A node writing into the residual stream: hook [B, T, (H,) D] and head (None: whole)."""

    name: str
    layer: int  # -1 for embed
    hook: str
    head: int | None = None
    kind: str = "mixer"  # "embed", "attention", "state", "mixer", "mlp", "shared", "conv"
    position: str | None = None  # a positional graph's position group (interp.analysis.circuits.positional)
    channels: tuple[int, int] | None = None  # a conv node: channels [start, stop) of hook [B, T, C]
    split: int | None = None  # a channel group: hook names a Linear whose input splits into `split` groups


@dataclass(frozen=True)
class Receiver:
    """A node input reading the residual stream of block `layer` (n_layers for the logits).

    site: "mixer", "mlp" or "logits" - where its copy of the stream enters. slots: for a slot
    inside a mixer, ((hook, axis, indices), ...) whose values it sets; empty for a whole input
    ("in", "rest", "mlp", "logits"). feeds: the senders whose outputs its input reaches
    (none for the logits)."""

    name: str
    layer: int
    site: str
    slots: tuple = ()
    feeds: tuple[str, ...] = ()
    module: str = "mixer"  # the block's mixer it belongs to ("mixer" / "mixer2"), for site "mixer"
    position: str | None = None  # a positional graph's position group
    reads: str | None = None  # site "conv": the conv node it reads (its slot is that node's channels)


@dataclass
class Graph:
    """Senders, receivers and the edges between them.

    edges [E, 2] int64: (sender index, receiver index), receiver-major in block order. A positional
    graph (interp.analysis.circuits.positional) also has `base`, the graph it refines, and
    `positions`, its position groups G: edge e is base edge e // G at group e % G.
    """

    senders: list[Sender]
    receivers: list[Receiver]
    edges: torch.Tensor
    n_layers: int
    base: Graph | None = None
    positions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # edge name -> index, filled on first use: an attribute, not a field, so that a Graph's
        # fields (what interp.analysis.units.digest reads) do not change when it is used
        self._index: dict[str, int] = {}

    @property
    def n_edges(self) -> int:
        return len(self.edges)

    def edge_names(self) -> list[str]:
        return [f"{self.senders[s].name}->{self.receivers[r].name}" for s, r in self.edges.tolist()]

    def edge_index(self, name: str) -> int:
        """The index of an edge named "sender->receiver"."""
        if not self._index:
            self._index.update({n: i for i, n in enumerate(self.edge_names())})
        if name not in self._index:
            from models.cache import unknown_name_message

            raise ValueError(unknown_name_message("edge", name, list(self._index)))
        return self._index[name]

    def incoming(self, receiver: int) -> torch.Tensor:
        """Edge indices into receiver [k]."""
        return torch.nonzero(self.edges[:, 1] == receiver)[:, 0]

    def mixer_receivers(self, layer: int, module: str | None = None) -> list[int]:
        """Receivers of block `layer`'s mixers (of one, "mixer" / "mixer2", when given)."""
        return [i for i, r in enumerate(self.receivers) if r.layer == layer and r.site == "mixer"
                and (module is None or r.module == module)]

    @property
    def pass_graph(self) -> Graph:
        """The graph a forward pass runs (interp.analysis.circuits.passes): the base of a positional graph."""
        return self if self.base is None else self.base

    def __repr__(self) -> str:
        where = f", positions {list(self.positions)}" if self.positions else ""
        return f"Graph({len(self.senders)} senders, {len(self.receivers)} receivers, {self.n_edges} edges{where})"


def build_graph(model, positions: Sequence[str | int] | None = None, conv: bool = False,
                channel_groups: int | None = None) -> Graph:
    """The circuit graph of a SequenceModel (module docstring); with positions (roles such as "key",
    "value", "query", or int positions) its positional refinement (`positional_graph`); conv: the
    short convolutions of Mamba-2, DeltaNet and Gated DeltaNet as nodes of their own;
    channel_groups: each Mamba (-1) layer's output split into that many channel groups
    (`_channel_groups`). Without a residual stream (cfg.residual=False: the RNN stacks) the graph
    is a chain, each receiver reading the stage just before it (`_chain_upstream`)."""
    if positions is not None:
        return positional_graph(build_graph(model, conv=conv, channel_groups=channel_groups), positions)
    if channel_groups is not None:
        _check_channel_groups(model, channel_groups)
    senders = [Sender("embed", -1, "hook_embed", kind="embed")]
    receivers: list[Receiver] = []
    for layer, block in enumerate(model.blocks):
        if hasattr(block, "shared"):  # Zamba2: the shared transformer at this depth, one node
            receivers += [Receiver(f"z{layer}.in", layer, "shared", feeds=(f"z{layer}",)),
                          Receiver(f"z{layer}.e", layer, "shared_embed", feeds=(f"z{layer}",))]
            senders.append(Sender(f"z{layer}", layer, f"blocks.{layer}.shared.hook_out", kind="shared"))
        for slot, mixer in block_mixers(block).items():
            mixer_senders, mixer_receivers = _mixer_nodes(mixer, layer, slot, conv, channel_groups)
            receivers += mixer_receivers
            senders += mixer_senders
        if hasattr(block, "mlp"):
            receivers.append(Receiver(f"mlp{layer}.in", layer, "mlp", feeds=(f"mlp{layer}",)))
            senders.append(Sender(f"mlp{layer}", layer, f"blocks.{layer}.mlp.hook_out", kind="mlp"))
    receivers.append(Receiver("logits", len(model.blocks), "logits"))
    upstream = _upstream if getattr(model.cfg, "residual", True) else _chain_upstream(senders)
    edges = [(s, r) for r, rec in enumerate(receivers) for s, snd in enumerate(senders) if upstream(snd, rec)]
    return Graph(senders, receivers, torch.tensor(edges, dtype=torch.long).reshape(-1, 2), len(model.blocks))


OTHER = "other"  # the position group of every position no named group claims


def positional_graph(graph: Graph, positions: Sequence[str | int]) -> Graph:
    """The graph with every node split by position group: groups = positions (role names or int
    positions, as interp patch's --positions) + "other" (every position left). Sender u@g is u's
    output at the group's positions, receiver r@g r's input there, and edge u@g -> r@g carries u
    at those positions into r (the residual stream is per position: edges join equal positions;
    positions mix inside nodes). Node u@g is u * G + g, edge e@g is e * G + g. A receiver feeds its
    senders at every group (a mixer mixes positions), an MLP's input its MLP at its own group."""
    if graph.base is not None:
        raise ValueError("graph is positional already; pass its base graph")
    if isinstance(positions, (str, int)) or not len(positions):
        raise ValueError(f"positions must be a non-empty list of roles or int positions; got {positions!r}")
    groups = tuple(str(p) for p in positions)
    bad = [p for p in positions if isinstance(p, bool) or not isinstance(p, (str, int))]
    if bad or len(set(groups)) != len(groups) or OTHER in groups:
        raise ValueError(f"positions must be distinct roles or int positions, without {OTHER!r} (the positions "
                         f"left over); got {list(positions)!r}")
    groups += (OTHER,)
    count = len(groups)
    senders = [replace(s, name=f"{s.name}@{g}", position=g) for s in graph.senders for g in groups]
    receivers = []
    for r in graph.receivers:
        for g in groups:
            feeds = (tuple(f"{f}@{g}" for f in r.feeds) if r.site == "mlp"
                     else tuple(f"{f}@{h}" for f in r.feeds for h in groups))
            receivers.append(replace(r, name=f"{r.name}@{g}", position=g, feeds=feeds))
    group = torch.arange(count)
    edges = (graph.edges[:, None, :] * count + group[None, :, None]).reshape(-1, 2)  # [E G, 2]
    return Graph(senders, receivers, edges, graph.n_layers, base=graph, positions=groups)


def _upstream(sender: Sender, receiver: Receiver) -> bool:
    if receiver.reads is not None or sender.kind == "conv":  # a conv node feeds the one receiver reading it
        return sender.name == receiver.reads
    if receiver.site == "shared_embed":  # a shared branch's embedding input reads hook_embed only
        return sender.kind == "embed"
    if sender.kind == "shared":  # it adds to its block's mixer input, not to the residual stream
        return sender.layer == receiver.layer and receiver.site == "mixer"
    if sender.layer < receiver.layer:
        return True
    return sender.layer == receiver.layer and receiver.site == "mlp" and sender.kind not in ("mlp", "shared")


def _stage(node: Sender | Receiver) -> tuple[int, int]:
    """Where a node sits on the stream: (layer, 0) for mixers and their inputs, (layer, 1) for an
    MLP and its input, (-1, 1) for embed, (n_layers, 0) for the logits."""
    return node.layer, int(node.kind in ("embed", "mlp") if isinstance(node, Sender) else node.site == "mlp")


def _chain_upstream(senders: list[Sender]):
    """_upstream without a residual stream (cfg.residual=False): a block's output replaces its
    input, so a receiver's input is exactly the output of the stage just before it (embed, the
    previous block's mixers or MLP, this block's mixers for its MLP): one sender for whole
    mixers, the heads of a per-head mixer. Conv nodes and shared branches connect as with one."""
    stages = sorted({_stage(s) for s in senders if s.kind not in ("conv", "shared")})

    def upstream(sender: Sender, receiver: Receiver) -> bool:
        if receiver.reads is not None or sender.kind in ("conv", "shared") or receiver.site == "shared_embed":
            return _upstream(sender, receiver)
        before = [stage for stage in stages if stage < _stage(receiver)]
        return bool(before) and _stage(sender) == before[-1]

    return upstream


def block_mixers(block) -> dict:
    """{slot: mixer} of a block ("mixer", "mixer2"; none in an MLP-only block)."""
    if hasattr(block, "mixers"):
        return block.mixers
    return {"mixer": block.mixer} if getattr(block, "mixer", None) is not None else {}


def _mixer_nodes(mixer, layer: int, slot: str = "mixer", conv: bool = False,
                 channel_groups: int | None = None) -> tuple[list[Sender], list[Receiver]]:
    """The senders and receivers of one of a block's mixers (slot "mixer" or "mixer2": its nodes'
    names then end their layer with "b", e.g. s3b.h0); conv: its short conv as nodes;
    channel_groups: a Mamba-1 mixer's output split into that many channel groups."""
    name, prefix = mixer.mixer_name, f"blocks.{layer}.{slot}."
    per_head = hasattr(mixer, "hook_result")
    kind = "attention" if name == "attention" else ("state" if hasattr(mixer, "hook_state") else "mixer")
    tag = {"attention": "a", "state": "s"}.get(kind, "m")
    if channel_groups is not None and isinstance(mixer, Mamba):
        senders, receivers = _channel_groups(mixer, layer, prefix, channel_groups)
    else:
        senders, receivers = _named_nodes(mixer, layer, prefix, kind, tag, per_head, conv and name in CONV_ROLES)

    def renamed(text: str | None) -> str | None:  # the node's own layer tag: s3.h0 -> s3b.h0, m3 -> m3b
        if text is None:
            return None
        head, dot, rest = text.partition(".")
        return f"{head}b{dot}{rest}" if slot == "mixer2" and head in (f"{tag}{layer}", f"c{layer}", f"m{layer}") else text

    return ([replace(s, name=renamed(s.name)) for s in senders],
            [replace(r, name=renamed(r.name), module=slot, feeds=tuple(renamed(f) for f in r.feeds),
                     reads=renamed(r.reads)) for r in receivers])


def _named_nodes(mixer, layer: int, prefix: str, kind: str, tag: str, per_head: bool, conv: bool):
    name = mixer.mixer_name
    heads = _result_heads(mixer) if per_head else 0
    if not per_head:
        return ([Sender(f"m{layer}", layer, prefix + "hook_out", kind=kind)],
                [Receiver(f"m{layer}.in", layer, "mixer", feeds=(f"m{layer}",))])
    senders = [Sender(f"{tag}{layer}.h{i}", layer, prefix + "hook_result", i, kind) for i in range(heads)]
    if name == "mamba2":
        receivers = _mamba2_slots(mixer, layer, prefix, conv)
    elif name in SLOT_HOOKS:
        receivers = _head_slots(mixer, layer, prefix, tag, (CONV_SLOT_HOOKS if conv else SLOT_HOOKS)[name])
    else:  # per-head outputs but no known input slots: the mixer's input, whole
        feeds = tuple(s.name for s in senders)
        return senders, [Receiver(f"{tag}{layer}.in", layer, "mixer", feeds=feeds)]
    rest = HAS_REST.get(name)
    if rest is not None and _option(mixer, rest):
        receivers.append(Receiver(f"{tag}{layer}.rest", layer, "mixer", feeds=tuple(s.name for s in senders)))
    if conv:
        conv_senders, conv_receivers = _conv_nodes(mixer, layer, prefix)
        senders, receivers = senders + conv_senders, receivers + conv_receivers
    return senders, receivers


def _option(mixer, name: str) -> bool:
    options = getattr(mixer, "options", None) or {}
    return bool(options.get(name, True))


def _result_heads(mixer) -> int:
    for attr in ("v_heads", "n_heads", "heads"):
        if isinstance(getattr(mixer, attr, None), int):
            return getattr(mixer, attr)
    raise ValueError(f"cannot tell the number of heads of the {mixer.mixer_name!r} mixer")


def _hook_heads(mixer, role_hook: str) -> int:
    """Heads on axis 2 of one of a mixer's per-head hooks."""
    name = mixer.mixer_name
    if name == "attention":
        return mixer.n_heads if role_hook == "hook_q" else mixer.n_kv
    return _result_heads(mixer)  # DeltaNet, GDN: every per-head hook has one entry per (value) head


def _head_slots(mixer, layer: int, prefix: str, tag: str, roles: dict) -> list[Receiver]:
    receivers = []
    n_out = _result_heads(mixer)
    for role, hooks in roles.items():
        n = _hook_heads(mixer, hooks[0])
        for i in range(n):
            feeds = tuple(f"{tag}{layer}.h{j}" for j in range(n_out) if j * n // n_out == i)
            slots = tuple((prefix + hook, 2, (i,)) for hook in hooks)
            receivers.append(Receiver(f"{tag}{layer}.h{i}.{role}", layer, "mixer", slots, feeds))
    return receivers


def _mamba2_slots(mixer, layer: int, prefix: str, conv: bool = False) -> list[Receiver]:
    """Mamba-2: per head its x channels of hook_conv and its dt; per group B and C (read). Every
    one feeds the heads of its group (the group norm divides each head's output by the group's
    norm). conv: the write is dt only, x, B and C being conv nodes (`_conv_nodes`)."""
    heads, groups, p, n, e = mixer.heads, mixer.groups, mixer.head_dim, mixer.d_state, mixer.d_inner
    per_group = heads // groups
    group_of = [tuple(f"s{layer}.h{i}" for i in range(g * per_group, (g + 1) * per_group)) for g in range(groups)]
    # the gated group norm mixes the heads of a group: a head's write reaches its group's outputs
    def x_slot(i: int) -> tuple:  # head i's x channels of hook_conv, unless the conv is a node of its own
        return () if conv else ((prefix + "hook_conv", 2, tuple(range(i * p, (i + 1) * p))),)

    receivers = [Receiver(f"s{layer}.h{i}.write", layer, "mixer", x_slot(i) + ((prefix + "hook_dt", 2, (i,)),),
                          group_of[i // per_group]) for i in range(heads)]
    for g in range(0 if conv else groups):
        feeds = group_of[g]
        for role, start in (("B", e + g * n), ("read", e + groups * n + g * n)):
            receivers.append(Receiver(f"s{layer}.g{g}.{role}", layer, "mixer",
                                      ((prefix + "hook_conv", 2, tuple(range(start, start + n))),), feeds))
    return receivers


# with conv=True the slots that the short conv feeds are conv nodes, and the rest stay slots
CONV_SLOT_HOOKS = {"deltanet": {"write": ("hook_beta",)}, "gated_deltanet": {"write": ("hook_beta", "hook_dt")}}
CONV_ROLES = {"mamba2": {"x": "x", "B": "B", "C": "read"}, "deltanet": {"q": "read", "k": "k", "v": "v"},
              "gated_deltanet": {"q": "read", "k": "k", "v": "v"}}  # mixer -> {conv channels: what reads them}


def _conv_nodes(mixer, layer: int, prefix: str) -> tuple[list[Sender], list[Receiver]]:
    """The short conv of a mixer as nodes: per head (or group) and kind of channel, a sender
    c{l}.{unit}.{role} (its hook_conv channels), the receiver c{l}.{unit}.{role}.in of its input
    (those channels set from its own copy of the stream: the conv reads d_conv positions of it) and
    the receiver s{l}.{unit}.{reader} that reads its output into the state (the one edge from it)."""
    hook = prefix + "hook_conv"
    senders, inputs, readers = [], [], []
    for unit, role, start, stop, heads in _conv_segments(mixer):
        name, channels = f"c{layer}.{unit}.{role}", tuple(range(start, stop))
        feeds = tuple(f"s{layer}.h{i}" for i in heads)
        senders.append(Sender(name, layer, hook, kind="conv", channels=(start, stop)))
        inputs.append(Receiver(f"{name}.in", layer, "mixer", ((hook, 2, channels),), (name,)))
        readers.append(Receiver(f"s{layer}.{unit}.{CONV_ROLES[mixer.mixer_name][role]}", layer, "conv",
                                ((hook, 2, channels),), feeds, reads=name))
    return senders, inputs + readers


def _conv_segments(mixer) -> list[tuple[str, str, int, int, range]]:
    """(unit, role, start, stop, heads fed) of each conv node of hook_conv's channels."""
    if mixer.mixer_name == "mamba2":  # x per head; B, C per group, read by the group's heads
        heads, groups, p, n, e = mixer.heads, mixer.groups, mixer.head_dim, mixer.d_state, mixer.d_inner
        per_group = heads // groups
        segments = [(f"h{i}", "x", i * p, (i + 1) * p, range(g * per_group, (g + 1) * per_group))
                    for i in range(heads) for g in [i // per_group]]
        for role, offset in (("B", e), ("C", e + groups * n)):
            segments += [(f"g{g}", role, offset + g * n, offset + (g + 1) * n, range(g * per_group, (g + 1) * per_group))
                         for g in range(groups)]
        return segments
    if mixer.mixer_name == "deltanet":  # q | k | v, each per head
        h, d = mixer.heads, mixer.d_head
        return [(f"h{i}", role, (j * h + i) * d, (j * h + i + 1) * d, range(i, i + 1))
                for j, role in enumerate(("q", "k", "v")) for i in range(h)]
    h, hv, dk, dv = mixer.heads, mixer.v_heads, mixer.d_k, mixer.d_v  # Gated DeltaNet: q, k per key head
    per_key = hv // h
    segments = [(f"k{j}", role, (r * h + j) * dk, (r * h + j + 1) * dk, range(j * per_key, (j + 1) * per_key))
                for r, role in enumerate(("q", "k")) for j in range(h)]
    return segments + [(f"h{i}", "v", 2 * h * dk + i * dv, 2 * h * dk + (i + 1) * dv, range(i, i + 1)) for i in range(hv)]


def _check_channel_groups(model, groups) -> None:
    mambas = [mixer for block in model.blocks for mixer in block_mixers(block).values() if isinstance(mixer, Mamba)]
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or not mambas:
        raise ValueError(f"channel_groups must be an int >= 1 for a model with Mamba layers; got {groups!r} "
                         f"({len(mambas)} Mamba layers)")
    widths = sorted({mixer.d_inner for mixer in mambas})
    if any(width % groups for width in widths):
        raise ValueError(f"channel_groups={groups} must divide the Mamba layers' d_inner {widths}")


def _channel_groups(mixer, layer: int, prefix: str, groups: int) -> tuple[list[Sender], list[Receiver]]:
    """Mamba (-1) by channel groups: out = out_proj(v), v = (y + D x) * SiLU(z) [B, T, E], so
    out = sum over groups g of W_out[:, g's channels] v_g (+ bias): sender s{l}.g{g} is that term,
    the read-out of the group's states (channel e's state reads only x_e, dt_e and the shared B, C).
    The inputs stay whole (s{l}.in, feeding every group): B, C and dt come from x_proj over every
    channel, so a group's channels reach every group's state."""
    senders = [Sender(f"s{layer}.g{g}", layer, prefix + "out_proj", g, "state", split=groups) for g in range(groups)]
    return senders, [Receiver(f"s{layer}.in", layer, "mixer", feeds=tuple(s.name for s in senders))]
