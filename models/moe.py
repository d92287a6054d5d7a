"""A sparse mixture-of-experts MLP (the Qwen2-MoE / Qwen3-MoE / Qwen3-Next block), chosen per
layer by ModelConfig.moe in place of the dense MLP.

For a token x [D], E experts of width F (SwiGLU, no biases), k of them chosen per token:

    l    = W_r x                                   [E]     router logits
    p    = softmax(l)                              [E]     in float32 at least (as transformers)
    i    = the k largest p (descending)            [k]     chosen experts
    w_j  = s p_{i_j}, / sum_j p_{i_j} with norm_topk_prob  [k]     routing weights (s: routed_scaling_factor)
    h_j  = silu(G_{i_j} x) * U_{i_j} x             [k, F]  each chosen expert's neurons
    o_j  = W_{i_j} h_j                             [k, D]  each chosen expert's output
    y    = sum_j w_j o_j  (+ sigmoid(w_s . x) * shared(x) with a shared expert)

routing "sigmoid" (NemotronH, DeepSeek-V3): p = sigmoid(l), and the choice reads p + b (b the
score_bias buffer [E], transformers' e_score_correction_bias) within the n_group groups of E /
n_group experts whose two largest p + b sum highest (topk_group of them); the weights read p (the
normalisation's denominator + 1e-20, as transformers). expert_activation "relu2": ungated experts,
h_j = relu(U_{i_j} x)^2 (no G).

The shared expert is an ordinary dense MLP (models.backbone.MLP, cfg.mlp_activation, width
d_shared), its gate a [1, D] map (shared_gate False: the shared expert is added ungated).

Hooks (time on axis 1 as everywhere; the k slots of a token are in the router's order):
  hook_router_logits   [B, T, E]     l
  hook_expert_indices  [B, T, k]     i (int64): a patch reroutes the token to the experts it names,
                                     weighted by their router probabilities
  hook_expert_weights  [B, T, k]     w
  hook_expert_post     [B, T, k, F]  h, the neurons each chosen expert's down map reads
  hook_expert_out      [B, T, k, D]  o, unweighted (expert e's output at a token is the slot
                                     where hook_expert_indices == e)
  hook_shared_gate     [B, T, 1]     sigmoid(w_s . x), with a gated shared expert
  shared_expert.hook_pre | hook_post | hook_out   the shared expert's own (models.backbone.MLP)
  hook_out             [B, T, D]     y

ModelConfig.moe keys: experts (E), top_k (k), d_expert (F), norm_topk_prob (True), d_shared
(None: no shared expert), shared_gate (True), layers (None: every layer; else the layer indices
whose MLP is sparse, the others dense with d_mlp; a layer without an MLP has neither), routing
("softmax" or "sigmoid"), n_group (1), topk_group (1), routed_scaling_factor (1.0),
expert_activation ("swiglu" or "relu2").
Parameters: router.weight [E, D], experts.gate (swiglu only), experts.up [E, F, D], experts.down
[E, D, F], shared_expert.*, shared_gate.weight [1, D]; buffer score_bias [E] (sigmoid routing).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from models.gated_product import gated_product
from models.hooks import HookPoint

OPTIONS: dict[str, Any] = {"experts": None, "top_k": None, "d_expert": None, "norm_topk_prob": True,
                           "d_shared": None, "shared_gate": True, "layers": None, "routing": "softmax",
                           "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
                           "expert_activation": "swiglu"}
ROUTINGS, EXPERT_ACTIVATIONS = ("softmax", "sigmoid"), ("swiglu", "relu2")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def moe_options(cfg) -> dict[str, Any]:
    """cfg.moe over the defaults, checked (ValueError / TypeError naming the key)."""
    if not isinstance(cfg.moe, dict):
        raise TypeError(f"moe must be None or a dict of {sorted(OPTIONS)}; got {cfg.moe!r}")
    unknown = set(cfg.moe) - set(OPTIONS)
    if unknown:
        raise ValueError(f"moe: unknown keys {sorted(unknown)}; allowed: {sorted(OPTIONS)}")
    opts = {**OPTIONS, **cfg.moe}
    for name in ("experts", "top_k", "d_expert"):
        if not _positive_int(opts[name]):
            raise ValueError(f"moe[{name!r}] must be a positive int; got {opts[name]!r}")
    if opts["top_k"] > opts["experts"]:
        raise ValueError(f"moe['top_k'] must be at most moe['experts']={opts['experts']}; got {opts['top_k']}")
    if opts["d_shared"] is not None and not _positive_int(opts["d_shared"]):
        raise ValueError(f"moe['d_shared'] must be None or a positive int; got {opts['d_shared']!r}")
    for name in ("norm_topk_prob", "shared_gate"):
        if not isinstance(opts[name], bool):
            raise TypeError(f"moe[{name!r}] must be a bool; got {opts[name]!r}")
    for name, allowed in (("routing", ROUTINGS), ("expert_activation", EXPERT_ACTIVATIONS)):
        if opts[name] not in allowed:
            raise ValueError(f"moe[{name!r}] must be one of {allowed}; got {opts[name]!r}")
    _check_groups(opts)
    scale = opts["routed_scaling_factor"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"moe['routed_scaling_factor'] must be a positive number; got {scale!r}")
    layers = opts["layers"]
    if layers is not None and (not isinstance(layers, list)
                               or not all(isinstance(l, int) and 0 <= l < cfg.n_layers for l in layers)):
        raise ValueError(f"moe['layers'] must be None or a list of layer indices in [0, {cfg.n_layers}); "
                         f"got {layers!r}")
    return opts


def _check_groups(opts: dict[str, Any]) -> None:
    groups, kept = opts["n_group"], opts["topk_group"]
    if not _positive_int(groups) or opts["experts"] % groups:
        raise ValueError(f"moe['n_group'] must be a positive int dividing moe['experts']={opts['experts']}; "
                         f"got {groups!r}")
    if not _positive_int(kept) or kept > groups:
        raise ValueError(f"moe['topk_group'] must be a positive int at most moe['n_group']={groups}; got {kept!r}")
    if groups > 1 and (opts["routing"] != "sigmoid" or opts["experts"] // groups < 2):
        raise ValueError(f"moe['n_group']={groups} > 1 needs routing 'sigmoid' and at least 2 experts a group; "
                         f"got routing {opts['routing']!r}, {opts['experts'] // groups} a group")


def uses_moe(cfg, layer: int) -> bool:
    """Whether layer `layer`'s MLP is the sparse one."""
    return cfg.moe is not None and (cfg.moe.get("layers") is None or layer in cfg.moe["layers"])


class Experts(nn.Module):
    """E experts of width F without biases: SwiGLU (gate, up [E, F, D]) or relu2 (up only), down
    [E, D, F]."""

    def __init__(self, experts: int, width: int, d_model: int, activation: str = "swiglu") -> None:
        super().__init__()
        bound = d_model ** -0.5  # nn.Linear's init, per expert
        if activation == "swiglu":
            self.gate = nn.Parameter(torch.empty(experts, width, d_model).uniform_(-bound, bound))
        self.up = nn.Parameter(torch.empty(experts, width, d_model).uniform_(-bound, bound))
        self.down = nn.Parameter(torch.empty(experts, d_model, width).uniform_(-width ** -0.5, width ** -0.5))

    @staticmethod
    def size(experts: int, width: int, d_model: int, activation: str = "swiglu") -> int:
        """Parameters of Experts(experts, width, d_model, activation)."""
        return (3 if activation == "swiglu" else 2) * experts * width * d_model

    def neurons(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        """Expert `expert`'s neurons [N, F] for its tokens x [N, D]."""
        if hasattr(self, "gate"):
            return gated_product(x @ self.gate[expert].T, x @ self.up[expert].T, "swiglu")
        return F.relu(x @ self.up[expert].T).square()

    def forward(self, x: torch.Tensor, index: torch.Tensor, hook_post: HookPoint) -> torch.Tensor:
        """Each chosen expert's output [B, T, k, D] for x [B, T, D] and index [B, T, k], the neurons
        [B, T, k, F] through hook_post on the way: the (token, slot) pairs sorted by expert, one
        matmul chain per expert in use."""
        batch, length, k = index.shape
        flat = index.reshape(-1)  # [N k]
        order = flat.argsort(stable=True)
        inverse = order.argsort()
        counts = torch.bincount(flat, minlength=self.up.shape[0]).tolist()
        used = [e for e, n in enumerate(counts) if n]
        sizes = [counts[e] for e in used]
        tokens = x.reshape(batch * length, -1)[order // k].split(sizes)  # grouped by expert
        hidden = torch.cat([self.neurons(e, t) for e, t in zip(used, tokens)])
        hidden = hook_post(hidden[inverse].view(batch, length, k, -1)).reshape(batch * length * k, -1)
        out = torch.cat([h @ self.down[e].T for e, h in zip(used, hidden[order].split(sizes))])
        return out[inverse].view(batch, length, k, -1)


class MoE(nn.Module):
    """The sparse MLP of the module docstring; dense_mlp: the dense MLP class (models.backbone.MLP),
    which builds the shared expert."""

    def __init__(self, cfg, dense_mlp: type[nn.Module]) -> None:
        super().__init__()
        opts = self.options = moe_options(cfg)
        self.top_k = opts["top_k"]
        self.router = nn.Linear(cfg.d_model, opts["experts"], bias=False)
        self.experts = Experts(opts["experts"], opts["d_expert"], cfg.d_model, opts["expert_activation"])
        if opts["routing"] == "sigmoid":
            self.register_buffer("score_bias", torch.zeros(opts["experts"]))
        if opts["d_shared"] is not None:
            self.shared_expert = dense_mlp(cfg.replace(d_mlp=opts["d_shared"], moe=None))
            if opts["shared_gate"]:
                self.shared_gate = nn.Linear(cfg.d_model, 1, bias=False)
                self.hook_shared_gate = HookPoint()
        for name in ("hook_router_logits", "hook_expert_indices", "hook_expert_weights", "hook_expert_post",
                     "hook_expert_out", "hook_out"):
            setattr(self, name, HookPoint())

    @staticmethod
    def element_counts(cfg, dense_mlp) -> tuple[int, int]:
        """(parameters, buffer bytes) of MoE(cfg, dense_mlp) (models.size; dense_mlp.element_counts
        counts the shared expert)."""
        opts = moe_options(cfg)
        experts, d = opts["experts"], cfg.d_model
        parameters = experts * d + Experts.size(experts, opts["d_expert"], d, opts["expert_activation"])
        if opts["d_shared"] is not None:
            parameters += dense_mlp.element_counts(cfg.replace(d_mlp=opts["d_shared"], moe=None))[0]
            parameters += d if opts["shared_gate"] else 0
        return parameters, 4 * experts if opts["routing"] == "sigmoid" else 0   # score_bias, float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D]
        logits = self.hook_router_logits(self.router(x))  # [B, T, E]
        probs, choice = self.scores(logits)  # [B, T, E] each, in >= float32
        index = self.hook_expert_indices(choice.topk(self.top_k, dim=-1).indices)  # [B, T, k]
        if self.hook_expert_indices.has_patches:
            self.check_indices(index)
        weights = probs.gather(-1, index)  # [B, T, k]
        if self.options["norm_topk_prob"]:
            sigmoid = self.options["routing"] == "sigmoid"
            weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if sigmoid else 0.0))
        weights = self.hook_expert_weights((weights * self.options["routed_scaling_factor"]).to(x.dtype))
        out = self.hook_expert_out(self.experts(x, index, self.hook_expert_post))  # [B, T, k, D]
        y = (weights[..., None] * out).sum(-2)
        if hasattr(self, "shared_expert"):
            shared = self.shared_expert(x)
            if hasattr(self, "shared_gate"):
                shared = self.hook_shared_gate(torch.sigmoid(self.shared_gate(x))) * shared
            y = y + shared
        return self.hook_out(y)

    def scores(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(p, the scores the top-k chooses by) [B, T, E] from the router logits (module docstring)."""
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # routing in >= float32
        if self.options["routing"] == "softmax":
            probs = logits.softmax(-1)
            return probs, probs
        probs = logits.sigmoid()
        choice = probs + self.score_bias.to(probs)
        groups = self.options["n_group"]
        if groups == 1:
            return probs, choice
        grouped = choice.unflatten(-1, (groups, -1))  # [B, T, G, E / G]
        best = grouped.topk(2, dim=-1).values.sum(-1).topk(self.options["topk_group"], dim=-1).indices  # [B, T, g]
        keep = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter(-1, best, True)  # [B, T, G]
        return probs, grouped.masked_fill(~keep[..., None], float("-inf")).flatten(-2)

    def check_indices(self, index: torch.Tensor) -> None:
        experts = self.router.out_features
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= experts):
            raise ValueError(f"a patch of {self.hook_expert_indices.name!r} must name experts in [0, {experts}); "
                             f"got values in [{int(index.min())}, {int(index.max())}]")
