"""DeltaNet (Schlag et al. 2021; Yang et al. 2024), laid out like fla's DeltaNet layer.

Per head h (d = d_head, H = n_heads), from the mixer input x_t [d_model]:

    c_t = SiLU(conv([W_q x | W_k x | W_v x])_t)        short causal depthwise conv, width d_conv
    q_t, k_t, v_t = split(c_t) per head                [H, d]
    q_t <- c q_t / ||q_t||,  k_t <- k_t / ||k_t||      (L2 norm per head; c = q_scale, 1 by default)
    beta_t = s_h * sigmoid(W_beta x_t + b_beta)        [H], s_h = cfg.beta_scales[h]
    S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T      S_t [H, d (values), d (keys)]
    o_t = S_t q_t                                      [H, d]
    y_t = W_out concat_h( RMSNorm(o_t,h) [* SiLU(W_g x_t)_h] )

With unit keys, I - beta k k^T has eigenvalues 1 (d-1 times) and 1 - beta: s = 1 keeps them in
[0, 1], s = 2 in [-1, 1] (beta = 2 is a Householder reflection; fla's allow_neg_eigval). The beta
projection has a bias by default (fla's has none: beta_bias=False) so that experiments can push
beta towards 0 or s.

Affine in the state: vec(S_t) = M_t vec(S_{t-1}) + vec(beta_t v_t k_t^T), where M_t acts on each
value row of S_t as I - beta_t k_t k_t^T (`transition` returns it dense, [B, n, n], n = H d d).

Hooks (besides hook_in / hook_out / hook_state):
  hook_conv   [B, T, 3 H d]  the SiLU'd short-conv outputs of q | k | v, concatenated in that
                             order, before the L2 norm of q and k
  hook_q, hook_k  [B, T, H, d]  the L2-normalised (q: and scaled) queries and keys the recurrence uses
  hook_v      [B, T, H, d]  the values the recurrence uses
  hook_beta   [B, T, H]     beta = s_h * sigmoid(.), before any clamp
  hook_gate   [B, T, H, d]  SiLU(W_g x), only with mixer_options gate=True
  hook_state  [B, T, H, d, d]  S_t after step t, values x keys (fla stores keys x values)
  hook_z      [B, T, H, d]  each head's RMSNorm(o_t) [* gate], what W_out reads
  hook_result [B, T, H, d_model]  each head's share of the output (sum over heads = hook_out)

Beta clamp for ablations: `mixer.beta_clamp` is None or an [H, 2] tensor of (min, max) per head,
applied inside the kernel on every path (hook_beta still shows the unclamped beta).
`mixer.clamp_beta(head, lo, hi)` sets one head's row (the others are unbounded);
`mixer.clear_beta_clamp()` removes the clamp. Not saved in checkpoints.

Paths (models.mixers.delta.DeltaRuleMixer): fast = the delta-rule kernel returning outputs only;
instrumented = the same kernel with every step's state exported and hook_state pins honoured.
Both read o_t from the kernel (the pinned state where a patch sets one), so without patches they
agree bit for bit (`readout` from hook_state's states gives the same up to rounding).

mixer_options: gate (bool, default False): output gate as in fla's use_gate; q_scale (float,
default 1.0; fla's DeltaNet uses d^-1/2); beta_bias (bool, default True); norm_eps (float, default
1e-5: the output RMSNorm's); l2_eps (None, default: q / max(||q||, 1e-12) as F.normalize; a float:
q / sqrt(||q||^2 + l2_eps), fla's l2norm with 1e-6); chunk_size (int,
default 64): chunk length of the chunked kernel; impl (models.kernels.delta_rule's "auto",
"naive", "chunked", "native", "triton"; default "auto": Triton on CUDA; on the CPU the native C
forward when no gradient is needed, else chunked): the kernel on both paths ("native" is forward
only; forcing "triton" runs it under TRITON_INTERPRET=1 on the CPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.hooks import HookPoint
from models.kernels import delta_rule
from models.kernels.delta_rule import IMPLS
from models.mixers.base import FLOAT32_BYTES, linear_size, register_mixer
from models.mixers.delta import DeltaRuleMixer

OPTIONS = {"gate": False, "q_scale": 1.0, "beta_bias": True, "norm_eps": 1e-5, "l2_eps": None,
           "chunk_size": 64, "impl": "auto"}
_PRESET = dict(n_layers=2, d_model=64, n_heads=4, d_conv=4, norm="rmsnorm", mlp=True)


@register_mixer(
    "deltanet",
    presets={"deltanet_neg": {**_PRESET, "beta_scale": 2.0}},
    **_PRESET, beta_scale=1.0,
)
class DeltaNet(DeltaRuleMixer):

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.resume_context = cfg.d_conv - 1  # prepare()'s short conv reads d_conv - 1 earlier inputs
        self.carries_conv = True  # ... through convolve: a decoder carries its window (models.decoding)
        self.options = _options(cfg.mixer_options)
        heads, d = cfg.n_heads, cfg.head_dim
        self.heads, self.d_head = heads, d
        self.state_shape = (heads, d, d)
        inner = heads * d
        self.qkv_proj = nn.Linear(cfg.d_model, 3 * inner, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(3 * inner, cfg.d_conv))
        nn.init.kaiming_uniform_(self.conv_weight, a=5**0.5)  # as nn.Conv1d (fan_in = d_conv)
        self.beta_proj = nn.Linear(cfg.d_model, heads, bias=self.options["beta_bias"])
        self.register_buffer("beta_scales", torch.tensor(cfg.beta_scales), persistent=False)
        self.o_norm = nn.RMSNorm(d, eps=float(self.options["norm_eps"]))
        if self.options["gate"]:
            self.gate_proj = nn.Linear(cfg.d_model, inner, bias=False)
            self.hook_gate = HookPoint()
        self.out_proj = nn.Linear(inner, cfg.d_model, bias=False)
        for name in ("hook_conv", "hook_q", "hook_k", "hook_v", "hook_beta", "hook_z", "hook_result"):
            setattr(self, name, HookPoint())
        self.beta_clamp: torch.Tensor | None = None

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        opts, d, heads = _options(cfg.mixer_options), cfg.d_model, cfg.n_heads
        inner = heads * cfg.head_dim
        return (linear_size(d, 3 * inner, False) + 3 * inner * cfg.d_conv + linear_size(d, heads, opts["beta_bias"])
                + cfg.head_dim + linear_size(d, inner, False) * opts["gate"] + linear_size(inner, d, False),
                FLOAT32_BYTES * heads)  # beta_scales

    # -------------------------------------------------------------- beta clamp (ablations)

    def clamp_beta(self, head: int, lo: float, hi: float) -> None:
        """Clamp head `head`'s beta to [lo, hi] in every later forward pass (others unchanged)."""
        if not isinstance(head, int) or isinstance(head, bool) or not 0 <= head < self.heads:
            raise ValueError(f"head must be an int in [0, n_heads={self.heads}); got {head!r}")
        if not float(lo) <= float(hi):
            raise ValueError(f"clamp_beta needs lo <= hi; got lo={lo!r}, hi={hi!r}")
        clamp = self.beta_clamp
        if clamp is None:
            clamp = torch.tensor([[-float("inf"), float("inf")]] * self.heads)
        clamp = clamp.clone()
        clamp[head] = torch.tensor([float(lo), float(hi)])
        self.beta_clamp = clamp

    def clear_beta_clamp(self) -> None:
        self.beta_clamp = None

    def _clamp(self) -> torch.Tensor | None:
        clamp = self.beta_clamp
        if clamp is None:
            return None
        if not isinstance(clamp, torch.Tensor) or tuple(clamp.shape) != (self.heads, 2):
            raise ValueError(
                f"beta_clamp must be None or an [n_heads, 2] = ({self.heads}, 2) tensor; got "
                f"{getattr(clamp, 'shape', type(clamp).__name__)}"
            )
        return clamp.to(self.beta_scales.device)

    # -------------------------------------------------------------- recurrence

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # x [B, T, D]
        batch, length, _ = x.shape
        heads, d = self.heads, self.d_head
        conv = self.hook_conv(F.silu(self.convolve(self.qkv_proj(x), self.conv_weight)))  # [B, T, 3Hd]
        q, k, v = (part.reshape(batch, length, heads, d) for part in conv.chunk(3, dim=-1))
        inputs = {
            "q": self.hook_q(self._l2(q) * self.options["q_scale"]),
            "k": self.hook_k(self._l2(k)),
            "v": self.hook_v(v),
            "beta": self.hook_beta(self.beta_scales * torch.sigmoid(self.beta_proj(x))),  # [B, T, H]
        }
        if self.options["gate"]:
            inputs["gate"] = self.hook_gate(F.silu(self.gate_proj(x)).reshape(batch, length, heads, d))
        return inputs

    def _l2(self, x: torch.Tensor) -> torch.Tensor:  # [..., d] -> unit rows
        eps = self.options["l2_eps"]
        if eps is None:
            return F.normalize(x, dim=-1)
        return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)

    def _beta(self, beta: torch.Tensor) -> torch.Tensor:  # [..., H], clamped as the kernel does
        clamp = self._clamp()
        if clamp is None:
            return beta
        return torch.clamp(beta, min=clamp[:, 0].to(beta), max=clamp[:, 1].to(beta))

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        k, v = inputs_t["k"], inputs_t["v"]  # [B, H, d]
        beta = self._beta(inputs_t["beta"])  # [B, H]
        recalled = torch.einsum("bhvk,bhk->bhv", h, k)
        return h + (beta[..., None] * (v - recalled))[..., None] * k[:, :, None, :]  # [B, H, d, d]

    def transition(self, inputs_t: dict[str, torch.Tensor]) -> torch.Tensor:
        """Dense [B, n, n], n = H d d: vec(S_t) = M_t vec(S_{t-1}) + ..., row-major (h, v, k)."""
        k, beta = inputs_t["k"], self._beta(inputs_t["beta"])  # [B, H, d], [B, H]
        batch, heads, d = k.shape
        eye = torch.eye(d, dtype=k.dtype, device=k.device)
        A = eye - beta[..., None, None] * k[..., :, None] * k[..., None, :]  # [B, H, d, d] symmetric
        eye_h = torch.eye(heads, dtype=k.dtype, device=k.device)
        # S_t[h, v, j] = sum_i S_{t-1}[h, v, i] A[h, i, j]
        M = torch.einsum("hg,vw,bhij->bhvjgwi", eye_h, eye, A)
        n = heads * d * d
        return M.reshape(batch, n, n)

    def kernel(self, inputs, initial=None, **kwargs):
        return delta_rule(inputs["q"], inputs["k"], inputs["v"], inputs["beta"], initial_state=initial,
                          beta_clamp=self._clamp(), chunk_size=self.options["chunk_size"],
                          impl=self.options["impl"], **kwargs)

    def output_projection(self) -> nn.Linear:
        return self.out_proj


def _options(options: dict) -> dict:
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise ValueError(f"unknown deltanet mixer_options {sorted(unknown)}; valid: {sorted(OPTIONS)}")
    merged = {**OPTIONS, **options}
    for name in ("gate", "beta_bias"):
        if not isinstance(merged[name], bool):
            raise TypeError(f"mixer_options[{name!r}] must be a bool; got {merged[name]!r}")
    for name, allow_none in (("q_scale", False), ("norm_eps", False), ("l2_eps", True)):
        value = merged[name]
        if not (value is None and allow_none) and (
            not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0
        ):
            raise ValueError(f"mixer_options[{name!r}] must be a positive float{' or None' if allow_none else ''}; "
                             f"got {value!r}")
    size = merged["chunk_size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"mixer_options['chunk_size'] must be a positive int; got {size!r}")
    if merged["impl"] not in IMPLS:
        raise ValueError(f"mixer_options['impl'] must be one of {IMPLS}; got {merged['impl']!r}")
    return merged
