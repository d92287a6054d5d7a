"""Receiver gradients: d metric / d x_r for every receiver r of a circuit graph from one forward
and one backward, without a copy of the residual stream per receiver where the mixer allows.

EAP reads g_r = d metric / d x_r at x_r = x (interp.analysis.circuits.eap), x_r receiver r's own
copy of its block's residual stream x. A slot receiver of a mixer whose slot hooks each read
their own rows of a linear map y = W norm(x) of the mixer input (and, from those rows to the hook,
only maps local to their channels or head: the short convolution, activations, per-head norms)
reaches the metric through those rows only, so

    g_r = J_norm(x)^T  sum over r's rows c of  W[c]^T dM/dy[c]

where dM/dy is the gradient at the map's output in the one pass (a zero leaf added to y by a
forward hook on the map) and J_norm^T the norm's vector-Jacobian product at x (closed form for
LayerNorm and RMSNorm). The rows, per mixer (`map_rows`):

    attention        qkv: the q / k / v rows of a (key-value) head; the rest: gate_proj
    mamba2           in_proj: a head's x channels and its dt row (write), a group's B or C
                     channels, a conv node's channels; the rest: the z rows
    deltanet         qkv_proj: a head's q / k / v rows or a conv node's channels; beta_proj: its
                     row; the rest: gate_proj
    gated_deltanet   q / k / v / b / a_proj: a head's rows (q / k without GVA: with more value
                     than key heads a value head shares its key head's), a conv node's
                     channels; the rest: g_proj

Every other receiver (whole inputs, MLPs, the logits, slots of other mixers or layouts) reads a
zero leaf added to its own copy (interp.analysis.circuits.passes.edge_pass: slots by a side run
of the mixer on the copies). `LeafPass` runs the forward, `LeafPass.gradients(value)` the
backward; `Gradients.of(receivers)` forms g_r [R, B, T, D] for the receivers asked for, summed
over the copies of a batch of EAP-IG steps.
"""

from __future__ import annotations

import torch
from torch import nn

from interp.analysis.circuits.graph import Graph, Receiver, block_mixers
from interp.analysis.circuits.passes import edge_pass

def map_rows(mixer) -> tuple[dict, tuple[str, int, int | None]] | None:
    """({slot hook: rows(i) -> (map attribute, start, stop), the rows of head (or channel) i},
    the rest's (map attribute, start, stop or None: every row)) of a mixer whose slots read their
    own rows of linear maps of its input (module docstring); None for any other mixer."""
    name = mixer.mixer_name

    def per_head(attr: str, first: int, width: int):
        return lambda i: (attr, first + i * width, first + (i + 1) * width)

    if name == "attention":
        d, heads, kv = mixer.d_head, mixer.n_heads, mixer.n_kv
        return ({"hook_q": per_head("qkv", 0, d), "hook_k": per_head("qkv", heads * d, d),
                 "hook_v": per_head("qkv", (heads + kv) * d, d)}, ("gate_proj", 0, None))
    if name == "mamba2":
        e = mixer.d_inner
        return ({"hook_conv": per_head("in_proj", e, 1), "hook_dt": per_head("in_proj", e + mixer.conv_dim, 1)},
                ("in_proj", 0, e))
    if name == "deltanet":
        d, inner = mixer.d_head, mixer.heads * mixer.d_head
        return ({"hook_conv": per_head("qkv_proj", 0, 1), "hook_q": per_head("qkv_proj", 0, d),
                 "hook_k": per_head("qkv_proj", inner, d), "hook_v": per_head("qkv_proj", 2 * inner, d),
                 "hook_beta": per_head("beta_proj", 0, 1)}, ("gate_proj", 0, None))
    if name == "gated_deltanet":
        k, v, keys = mixer.d_k, mixer.d_v, mixer.heads * mixer.d_k
        rows = {"hook_conv": lambda c: (("q_proj", c, c + 1) if c < keys else ("k_proj", c - keys, c - keys + 1)
                                        if c < 2 * keys else ("v_proj", c - 2 * keys, c - 2 * keys + 1)),
                "hook_v": per_head("v_proj", 0, v), "hook_beta": per_head("b_proj", 0, 1),
                "hook_dt": per_head("a_proj", 0, 1)}
        if mixer.v_heads == mixer.heads:  # with GVA a value head's q / k are its key head's, shared
            rows.update({"hook_q": per_head("q_proj", 0, k), "hook_k": per_head("k_proj", 0, k)})
        return rows, ("g_proj", 0, None)
    return None


def receiver_rows(mixer, receiver: Receiver) -> list[tuple[str, int, int]] | None:
    """The (map attribute, start, stop) row ranges receiver r of `mixer` reads, or None when it
    needs its own copy of the stream (a mixer without map_rows, a whole input, a map that is
    not an nn.Linear)."""
    spec = map_rows(mixer)
    if spec is None:
        return None
    slots, rest = spec
    if not receiver.slots:
        if not receiver.name.endswith(".rest"):
            return None
        ranges = [rest]
    else:
        ranges = []
        for hook, axis, indices in receiver.slots:
            suffix = hook.rsplit(".", 1)[1]
            if axis != 2 or suffix not in slots:
                return None
            ranges += [slots[suffix](i) for i in indices]
    out = []
    for attr, start, stop in ranges:
        linear = getattr(mixer, attr, None)
        if type(linear) is not nn.Linear:  # noqa: E721 - a subclass may compute more than x W^T + b
            return None
        stop = linear.out_features if stop is None else stop
        if out and out[-1][0] == attr and out[-1][2] == start:  # adjacent rows of one map: one range
            out[-1] = (attr, out[-1][1], stop)
        else:
            out.append((attr, start, stop))
    return out


def fast_receivers(model, graph: Graph) -> dict[int, tuple[int, str, list[tuple[str, int, int]]]]:
    """{receiver: (layer, mixer slot, row ranges)} of the receivers read through map rows: every
    receiver of each mixer whose receivers all have receiver_rows (and whose block's norm has a
    closed-form vector-Jacobian product)."""
    out = {}
    for layer, block in enumerate(model.blocks):
        if not _norm_supported(getattr(block, "norm_mixer", None)):
            continue
        for slot, mixer in block_mixers(block).items():
            receivers = graph.mixer_receivers(layer, slot)
            rows = [receiver_rows(mixer, graph.receivers[r]) for r in receivers]
            if receivers and all(r is not None for r in rows):
                out.update({r: (layer, slot, ranges) for r, ranges in zip(receivers, rows)})
    return out


class LeafPass:
    """One forward of tokens [B, T] (answer positions at [B]) with a zero leaf for every receiver
    of graph (module docstring): .logits [B, V], .acts {sender hook: [B, T, ...]} (detached; {}
    unless capture), then .gradients(value) after one backward of the scalar value."""

    def __init__(self, model, graph: Graph, tokens: torch.Tensor, at: torch.Tensor, fwd_hooks: list = (),
                 capture: bool = True) -> None:
        self.model, self.graph = model, graph
        self.fast = fast_receivers(model, graph)
        self.leaves: dict[int, torch.Tensor] = {}  # receiver -> its zero leaf [B, T, D] (or [B, 1, D])
        self.maps: dict[tuple[int, str, str], torch.Tensor | None] = {
            (layer, slot, attr): None for layer, slot, ranges in self.fast.values() for attr, _, _ in ranges}
        self.stream: dict[int, torch.Tensor] = {}  # layer -> x [B, T, D], the norm's input
        handles = []
        try:
            for key in self.maps:
                layer, slot, attr = key
                linear = getattr(block_mixers(model.blocks[key[0]])[slot], attr)
                handles.append(linear.register_forward_hook(self._map_leaf(key)))
            for layer in {layer for layer, _, _ in self.maps}:
                handles.append(model.blocks[layer].norm_mixer.register_forward_pre_hook(self._record(layer)))
            with torch.enable_grad():
                self.logits, self.acts = edge_pass(model, graph, tokens, at, self._delta_of, fwd_hooks,
                                                   capture="values" if capture else None)
        finally:
            for handle in handles:
                handle.remove()
        missing = [key for key, leaf in self.maps.items() if leaf is None]
        if missing:
            raise RuntimeError(f"the maps {missing[:4]} were not called as modules in the pass (internal error)")

    def _delta_of(self, r: int, x: torch.Tensor, current: dict) -> torch.Tensor | None:
        if r in self.fast:
            return None
        self.leaves[r] = torch.zeros_like(x, requires_grad=True)
        return self.leaves[r]

    def _map_leaf(self, key):
        def hook(module, args, output):
            if self.maps[key] is not None:
                raise RuntimeError(f"map {key} called twice in one pass (internal error)")
            self.maps[key] = torch.zeros_like(output, requires_grad=True)
            return output + self.maps[key]

        return hook

    def _record(self, layer: int):
        def pre(module, args):
            self.stream[layer] = args[0].detach()

        return pre

    def gradients(self, value: torch.Tensor) -> Gradients:
        """Gradients of the scalar value (computed from .logits) at every leaf."""
        whole, maps = sorted(self.leaves), list(self.maps)
        grads = torch.autograd.grad(value, [self.leaves[r] for r in whole] + [self.maps[k] for k in maps],
                                    allow_unused=True)
        leaves = [self.leaves[r] for r in whole] + [self.maps[k] for k in maps]
        grads = [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, leaves)]
        return Gradients(self.model, self.fast, dict(zip(whole, grads[:len(whole)])),
                         dict(zip(maps, grads[len(whole):])), self.stream)


class Gradients:
    """d value / d x_r of a LeafPass: `whole` {receiver: [B, T, D]} for receivers with their own
    leaf, `maps` {(layer, slot, attr): [B, T, C]} at the maps' outputs for the others."""

    def __init__(self, model, fast: dict, whole: dict, maps: dict, stream: dict) -> None:
        self.model, self.fast, self.whole, self.maps, self.stream = model, fast, whole, maps, stream

    def of(self, receivers: list[int], copies: int = 1) -> torch.Tensor:
        """g_r [R, B / copies, T, D] of these receivers, summed over the `copies` consecutive
        blocks of B / copies rows (EAP-IG's steps)."""
        layers = {self.fast[r][0] for r in receivers if r in self.fast}
        if len(layers) == 1 and all(r in self.fast for r in receivers):  # one block's mixer inputs
            return self._fast(receivers, layers.pop(), copies)
        if len(receivers) == 1 and receivers[0] not in self.fast:  # an MLP's input, the logits
            g = self.whole[receivers[0]]
            return (g if copies == 1 else g.view(copies, -1, *g.shape[1:]).sum(0))[None]
        return torch.cat([self.of([r], copies) for r in receivers])

    def _fast(self, receivers: list[int], layer: int, copies: int) -> torch.Tensor:
        """g_r [R, B / copies, T, D] of block `layer`'s receivers read through map rows, one copy
        (EAP-IG step) at a time."""
        x = self.stream[layer]  # [B, T, D]
        n = len(x) // copies
        out = None
        for c in range(copies):
            rows = slice(c * n, (c + 1) * n)
            part = self._fast_rows(receivers, layer, x[rows], {key: g[rows] for key, g in self.maps.items()
                                                               if key[0] == layer})
            out = part if out is None else out.add_(part)
        return out

    def _fast_rows(self, receivers: list[int], layer: int, x: torch.Tensor, maps: dict) -> torch.Tensor:
        """g_r [R, N, T, D] at rows x [N, T, D] of the stream: with w = weight * (sum over r's rows
        of dM/dy[rows] W[rows]), J_norm^T w = (w - mean(w) - x_hat mean(w x_hat)) / s (RMSNorm
        without the mean(w) term; normalised's s and x_hat). The divisor s is folded into dM/dy,
        the norm's weight and (LayerNorm) the centring into W, then one pass for the x_hat term."""
        norm = self.model.blocks[layer].norm_mixer
        inverse, x_hat = normalised(norm, x)  # [N, T, 1], [N, T, D] (None, None: no norm)
        width = x.shape[-1]
        scaled = {key: (g if inverse is None else g * inverse).flatten(0, 1) for key, g in maps.items()}  # [N T, C]
        weights: dict = {}
        out = x.new_empty(len(receivers), x.shape[0] * x.shape[1], width)  # [R, N T, D]
        for i, r in enumerate(receivers):
            _, slot, ranges = self.fast[r]
            for j, (attr, start, stop) in enumerate(ranges):
                key = (layer, slot, attr)
                if key not in weights:
                    linear = getattr(block_mixers(self.model.blocks[layer])[slot], attr)
                    weights[key] = folded_weight(norm, linear.weight)
                g, w = scaled[key][:, start:stop], weights[key][start:stop]  # [N T, c], [c, D]
                if j == 0:
                    torch.mm(g, w, out=out[i])
                else:
                    out[i].addmm_(g, w)
        out = out.view(len(receivers), *x.shape)
        if x_hat is not None:
            along = (out * x_hat).mean(-1, keepdim=True)  # [R, N, T, 1]
            out.addcmul_(along, x_hat, value=-1)
        return out


def _norm_supported(norm) -> bool:
    if isinstance(norm, nn.Identity):
        return True
    return isinstance(norm, (nn.LayerNorm, nn.RMSNorm)) and len(norm.normalized_shape) == 1


def normalised(norm, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(1 / s [B, T, 1], x_hat [B, T, D]) of a LayerNorm (s = sqrt(var(x) + eps), x_hat = (x -
    mean(x)) / s) or RMSNorm (s = sqrt(mean(x^2) + eps), x_hat = x / s) at x [B, T, D]; (None,
    None) for no norm."""
    if isinstance(norm, nn.Identity):
        return None, None
    if isinstance(norm, nn.LayerNorm):
        x = x - x.mean(-1, keepdim=True)
    eps = torch.finfo(x.dtype).eps if norm.eps is None else norm.eps
    inverse = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return inverse, x * inverse


def folded_weight(norm, weight: torch.Tensor) -> torch.Tensor:
    """A map's weight [C, D] times the norm's weight [D] (each row), centred (LayerNorm), detached."""
    weight = weight.detach()
    if getattr(norm, "weight", None) is not None:
        weight = weight * norm.weight.detach()
    return weight - weight.mean(-1, keepdim=True) if isinstance(norm, nn.LayerNorm) else weight
