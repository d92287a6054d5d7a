"""Mamba-2: the state-space dual mixer (Dao & Gu 2024), laid out exactly like transformers'
Mamba2Mixer (so `models.interop` maps a Mamba2ForCausalLM 1:1).

With E = expand * d_model = H * P (H = n_heads, P = E / H; or H and P given as mixer_options, so
E = H * P), G groups (n_groups, H % G == 0; head h reads group h // (H / G)), N = d_state, W = d_conv:

    z, xBC, dt = in_proj(u)                       [B, T, E], [B, T, E + 2 G N], [B, T, H]
    xBC    = SiLU(short_conv(xBC))                hook_conv [B, T, E + 2 G N] (bias: conv_bias)
    x, B, C = split(xBC)                          x [B, T, H, P]; B, C [B, T, G, N]
    dt     = clamp(softplus(dt + dt_bias), dt_limit)   hook_dt [B, T, H]
    A      = -exp(A_log)                          [H], one scalar per head (init A[h] = -(h + 1))
    h_t    = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T h_t [B, H, P, N] (hook_state [B, T, H, P, N])
    y_t    = h_t C_t + D x_t                      [B, T, H, P], D [H]
    y      = GroupRMSNorm(y * SiLU(z))            G groups of E / G channels, weight [E], eps
             (gated_norm "norm_first": GroupRMSNorm(y) * SiLU(z); "none": y * SiLU(z), no weight)
    out    = out_proj(y)                          hook_gate = SiLU(z) [B, T, E]

hook_z [B, T, H, P]: the normed y per head (what out_proj reads); hook_result [B, T, H, d_model]:
each head's share of the output, out_proj's head-h columns times its z (their sum is hook_out;
the group norm mixes heads before it, so a head's share is of the normed output).

(B_t, C_t here are head h's group's [N] vectors.) Affine and diagonal (is_affine = True):
dh_t/dh_{t-1} = exp(dt_t A) on every (p, n) of head h; `transition` returns it as [B, H, P, N].

Paths: on the CPU (float32/64, the native library built) Mamba's fused selective kernels run it,
one call per group: with dt repeated over each head's P channels and A over N, h_t is Mamba's
recurrence on E channels sharing the group's B_t and C_t, so selective_scan (fast path, read-out
fused, nothing [B, T, E, N] formed, exp(dt A) once per channel and step: its shared decay; the
backward from sqrt(T)-spaced checkpoints), selective_states (instrumented: every state; a re-run
with pins while a gradient is wanted takes diag_scan) and selective_states_shifted (a
hook_state gradient probe or a shift without pins: every state and the read-out, its backward
writing the states' adjoint) apply as they are.
Elsewhere models.kernels.diag_scan (read-out fused on the fast path; every state on the
instrumented one). hook_state patches are pinned and the scan re-run from them
(models.hooks.state.scan_with_state_hook), so a patch at t changes every later step and nothing before t;
declared ones (models.StatePatch) run on the fast path, the scans stopping at each patched step.
The scan plumbing is models.mixers.diagonal.DiagonalScanMixer's.

mixer_options: n_groups (1), conv_bias (True), bias (False: in/out projections), dt_min (0.001),
dt_max (0.1), dt_init_floor (1e-4) (dt_bias init, as transformers), dt_limit (None, or a
(min, max) pair: the clamp of dt; transformers' time_step_limit, whose default (0, inf) is
None here), norm_eps (1e-5: the gated norm's eps), chunk_size (64: diag_scan's), n_heads and
head_dim (None: cfg.n_heads and expand * d_model / n_heads; given, E = n_heads * head_dim and
cfg.d_head is not read: in a hybrid those describe the attention), gated_norm ("gate_first",
"norm_first" or "none", above).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from models.hooks import HookPoint
from models.kernels.native import selective as native_selective
from models.mixers.base import head_outputs, linear_size, mixer_options, register_mixer
from models.mixers.diagonal import DiagonalScanMixer

OPTIONS = {
    "n_groups": 1,
    "conv_bias": True,
    "bias": False,
    "dt_min": 0.001,
    "dt_max": 0.1,
    "dt_init_floor": 1e-4,
    "dt_limit": None,
    "norm_eps": 1e-5,
    "chunk_size": 64,
    "n_heads": None,
    "head_dim": None,
    "gated_norm": "gate_first",
}
GATED_NORMS = ("gate_first", "norm_first", "none")


def _options(cfg) -> dict:
    opts = mixer_options(cfg, OPTIONS)
    for name in ("n_heads", "head_dim"):
        value = opts[name]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"mamba2 mixer_options[{name!r}] must be None or a positive int; got {value!r}")
    groups = opts["n_groups"]
    heads = opts["n_heads"] or cfg.n_heads
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1 or heads % groups:
        raise ValueError(f"mamba2 mixer_options['n_groups'] must be a positive int dividing n_heads={heads}; "
                         f"got {groups!r}")
    if not 0 < opts["dt_min"] <= opts["dt_max"]:
        raise ValueError(f"mamba2 mixer_options need 0 < dt_min <= dt_max; got {opts['dt_min']}, {opts['dt_max']}")
    limit = opts["dt_limit"]
    if limit is not None and (
        not isinstance(limit, (list, tuple)) or len(limit) != 2 or not float(limit[0]) <= float(limit[1])
    ):
        raise ValueError(f"mamba2 mixer_options['dt_limit'] must be None or a (min, max) pair with min <= max; "
                         f"got {limit!r}")
    if not isinstance(opts["norm_eps"], (int, float)) or not opts["norm_eps"] > 0:
        raise ValueError(f"mamba2 mixer_options['norm_eps'] must be a positive float; got {opts['norm_eps']!r}")
    if opts["gated_norm"] not in GATED_NORMS:
        raise ValueError(f"mamba2 mixer_options['gated_norm'] must be one of {GATED_NORMS}; got {opts['gated_norm']!r}")
    return opts


def head_layout(cfg, opts: dict) -> tuple[int, int]:
    """(H, P) of a Mamba-2 mixer: mixer_options n_heads / head_dim where given, else cfg.n_heads
    and expand * d_model / H (then cfg.d_head, when set, must equal it)."""
    heads = opts["n_heads"] or cfg.n_heads
    if opts["head_dim"] is not None:
        return heads, opts["head_dim"]
    inner = cfg.d_inner
    if inner % heads:
        raise ValueError(f"mamba2 needs expand * d_model = {inner} divisible by n_heads = {heads}")
    d_head = cfg.explicit("d_head")   # as set (cfg.d_head reads a derived one: models.config.Derived)
    if opts["n_heads"] is None and d_head is not None and d_head != inner // heads:
        raise ValueError(f"mamba2's d_head is expand * d_model / n_heads = {inner // heads}; got d_head={d_head}")
    return heads, inner // heads


@register_mixer("mamba2", n_layers=2, n_heads=4, norm="rmsnorm")
class Mamba2(DiagonalScanMixer):

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.resume_context = cfg.d_conv - 1  # prepare()'s short conv reads d_conv - 1 earlier inputs
        self.carries_conv = True  # ... through convolve: a decoder carries its window (models.decoding)
        opts = _options(cfg)
        heads, head_dim = head_layout(cfg, opts)
        inner = heads * head_dim
        self.d_inner, self.heads, self.head_dim, self.d_state = inner, heads, head_dim, cfg.d_state
        self.groups = opts["n_groups"]
        self.gated_norm = opts["gated_norm"]
        self.dt_limit = None if opts["dt_limit"] is None else tuple(float(v) for v in opts["dt_limit"])
        self.norm_eps = float(opts["norm_eps"])
        self.chunk_size = opts["chunk_size"]
        self.state_shape = (heads, head_dim, cfg.d_state)
        self.conv_dim = inner + 2 * self.groups * cfg.d_state
        self.in_proj = nn.Linear(cfg.d_model, inner + self.conv_dim + heads, bias=opts["bias"])
        self.conv = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.d_conv, groups=self.conv_dim, bias=opts["conv_bias"])
        self.dt_bias = nn.Parameter(_inverse_softplus_dt(heads, opts))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, heads + 1, dtype=torch.float32)))
        self.A_log._no_weight_decay = True  # a decay rate, not a weight (interp.training make_optimizer)
        self.D = nn.Parameter(torch.ones(heads))
        if self.gated_norm != "none":
            self.norm_weight = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, cfg.d_model, bias=opts["bias"])
        self.hook_conv = HookPoint()
        self.hook_dt = HookPoint()
        self.hook_gate = HookPoint()
        self.hook_z, self.hook_result = HookPoint(), HookPoint()

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        opts = _options(cfg)
        heads, head_dim = head_layout(cfg, opts)
        inner, d = heads * head_dim, cfg.d_model
        conv_dim = inner + 2 * opts["n_groups"] * cfg.d_state
        return (linear_size(d, inner + conv_dim + heads, opts["bias"])
                + conv_dim * (cfg.d_conv + bool(opts["conv_bias"]))
                + 3 * heads + inner * (opts["gated_norm"] != "none") + linear_size(inner, d, opts["bias"])), 0

    def prepare(self, u: torch.Tensor) -> dict[str, torch.Tensor]:  # u [B, T, D]
        batch, length, _ = u.shape
        gn = self.groups * self.d_state
        z, xbc, dt = self.in_proj(u).split([self.d_inner, self.conv_dim, self.heads], dim=-1)
        xbc = self.hook_conv(F.silu(self.convolve(xbc, self.conv.weight[:, 0], self.conv.bias)))
        x, B, C = xbc.split([self.d_inner, gn, gn], dim=-1)
        dt = F.softplus(dt + self.dt_bias)  # [B, T, H]
        if self.dt_limit is not None:
            dt = dt.clamp(min=self.dt_limit[0], max=self.dt_limit[1])
        return {
            "x": x.reshape(batch, length, self.heads, self.head_dim),  # [B, T, H, P]
            "dt": self.hook_dt(dt),
            "B": B.reshape(batch, length, self.groups, self.d_state),  # [B, T, G, N]
            "C": C.reshape(batch, length, self.groups, self.d_state),
            "gate": self.hook_gate(F.silu(z)),  # [B, T, E]
        }

    def A(self) -> torch.Tensor:
        return -torch.exp(self.A_log)  # [H]

    def per_head(self, groups: torch.Tensor) -> torch.Tensor:
        """[..., G, N] -> [..., H, N]: each head's group."""
        return groups.repeat_interleave(self.heads // self.groups, dim=-2)

    def transition_terms(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, b) of h_t = a_t * h_{t-1} + b_t, both [B, (T,) H, P, N], from [B, (T,) ...] inputs."""
        dt = inputs["dt"]  # [B, (T,) H]
        b = (dt[..., None] * inputs["x"])[..., None] * self.per_head(inputs["B"])[..., None, :]
        a = torch.exp(dt * self.A())[..., None, None].expand(b.shape)
        return a, b

    def selective_args(self, inputs, initial=None):
        """Mamba's selective-scan arguments per group: [(dt [B, T, E/G], A [E/G, N], x, B_g [B, T, N],
        C_g, initial [B, E/G, N] | None, channel slice)] (heads are contiguous within a group)."""
        batch, length = inputs["dt"].shape[:2]
        p, n, width = self.head_dim, self.d_state, self.d_inner // self.groups
        dt = inputs["dt"].repeat_interleave(p, dim=-1)  # [B, T, E]
        A = self.A().repeat_interleave(p)[:, None].expand(self.d_inner, n)  # [E, N], equal columns (shared_decay)
        x = inputs["x"].reshape(batch, length, self.d_inner)
        h0 = None if initial is None else initial.reshape(batch, self.d_inner, n)
        # A stays an expanded view (the kernels see its shared decay from the stride) and the state
        # a view (the kernels copy it into their own layout): no [E, N] copy a call, which a
        # one-token decoding step would pay twice per layer
        return [(dt[..., s].contiguous(), A[s], x[..., s].contiguous(), inputs["B"][:, :, g].contiguous(),
                 inputs["C"][:, :, g].contiguous(), None if h0 is None else h0[:, s], s)
                for g, s in enumerate(slice(g * width, (g + 1) * width) for g in range(self.groups))]

    def native_states(self, inputs, pins=None, initial=None) -> torch.Tensor | None:
        """Every state [B, T, H, P, N] from native selective_states, or None where it does not run."""
        groups = self.selective_args(inputs, initial)
        dt, A, x, B, _, h0, _ = groups[0]
        if not native_selective.selective_states_supported(dt, A, x, B, h0, pins):
            return None
        batch, length = dt.shape[:2]
        values = None if pins is None else pins[1].reshape(batch, length, self.d_inner, self.d_state)
        states = [native_selective.selective_states(dt, A, x, B, initial_state=h0, pins=None if pins is None else
                                                    (pins[0], values[:, :, s].contiguous()))
                  for dt, A, x, B, _, h0, s in groups]
        states = states[0] if len(states) == 1 else torch.cat(states, dim=2)  # [B, T, E, N]
        return states.reshape(batch, length, *self.state_shape)

    def head_states(self, inputs, heads) -> torch.Tensor | None:
        """The states of heads `heads` only [B, T, k, P, N] (each head's recurrence runs apart) from
        native selective_states on each head's P channels, or None where it does not run."""
        batch, length = inputs["dt"].shape[:2]
        per_group, n = self.heads // self.groups, self.d_state
        x = inputs["x"]  # [B, T, H, P]
        states = []
        for h in heads:
            dt = inputs["dt"][..., h : h + 1].expand(batch, length, self.head_dim).contiguous()  # [B, T, P]
            A = self.A()[h].expand(self.head_dim, n).contiguous()  # [P, N], equal columns (shared decay)
            B = inputs["B"][:, :, h // per_group].contiguous()  # [B, T, N]
            if not native_selective.selective_states_supported(dt, A, x[:, :, h], B):
                return None
            states.append(native_selective.selective_states(dt, A, x[:, :, h].contiguous(), B))  # [B, T, P, N]
        return torch.stack(states, dim=2)

    def native_states_supported(self, inputs, initial=None) -> bool:
        dt, A, x, B, _, h0, _ = self.selective_args(inputs, initial)[0]
        return native_selective.selective_states_supported(dt, A, x, B, h0)

    def native_shifted(self, inputs, shift, initial=None):
        """(y [B, T, H, P], states [B, T, H, P, N]) with shift [B, T, H, P, N] added to each step's
        state from native selective_states_shifted, one call per group, or None where it does not run."""
        groups = self.selective_args(inputs, initial)
        if not native_selective.selective_supported(*groups[0][:-1], shift):
            return None
        batch, length = inputs["dt"].shape[:2]
        shift = shift.reshape(batch, length, self.d_inner, self.d_state)
        outs = [native_selective.selective_states_shifted(dt, A, x, B, C, shift[:, :, s], initial_state=h0)
                for dt, A, x, B, C, h0, s in groups]
        y, states = outs[0] if len(outs) == 1 else (torch.cat(parts, dim=2) for parts in zip(*outs))
        return y.reshape(batch, length, self.heads, self.head_dim), states.reshape(batch, length, *self.state_shape)

    def native_shifted_supported(self, inputs, initial=None) -> bool:
        return native_selective.selective_supported(*self.selective_args(inputs, initial)[0][:-1])

    def native_scan(self, inputs, initial=None, final: bool = False):
        """(y [B, T, H, P], h_{T-1} [B, H, P, N] or None) from native selective_scan, one call per
        group, or None where it does not run."""
        groups = self.selective_args(inputs, initial)
        if not native_selective.selective_supported(*groups[0][:-1]):
            return None
        batch, length = inputs["dt"].shape[:2]
        outs = [native_selective.selective_scan(dt, A, x, B, C, initial_state=h0, chunk_size=self.chunk_size,
                                                output_final_state=final)
                for dt, A, x, B, C, h0, _ in groups]
        joined = (lambda parts, dim: parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim))  # noqa: E731
        y = joined([out[0] if final else out for out in outs], -1)  # [B, T, E]
        y = y.reshape(batch, length, self.heads, self.head_dim)
        if not final:
            return y, None
        return y, joined([out[1] for out in outs], 1).reshape(batch, *self.state_shape)

    def readout_c(self, inputs, b) -> torch.Tensor:
        """One group: C is shared by every (head, p), diag_scan's [B, T, N]; else per head, b's shape."""
        return inputs["C"][:, :, 0] if self.groups == 1 else self.per_head(inputs["C"])[..., None, :].expand(b.shape)

    def readout(self, u, states, inputs) -> torch.Tensor:  # states [B, T, H, P, N]
        y = (states @ self.per_head(inputs["C"])[..., None])[..., 0]  # [B, T, H, P]
        return self.finish(y, inputs)

    def finish(self, y: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """y [B, T, H, P] (before D) -> [B, T, d_model]: + D x, gate and group RMSNorm (in the
        gated_norm order), out_proj."""
        batch, length = y.shape[:2]
        y = (y + self.D[:, None] * inputs["x"]).reshape(batch, length, self.d_inner)
        if self.gated_norm != "norm_first":
            y = y * inputs["gate"]
        if self.gated_norm != "none":
            grouped = y.reshape(batch, length, self.groups, -1)  # [B, T, G, E / G]
            grouped = grouped * torch.rsqrt(grouped.square().mean(-1, keepdim=True) + self.norm_eps)
            y = grouped.reshape(batch, length, self.d_inner) * self.norm_weight
        if self.gated_norm == "norm_first":
            y = y * inputs["gate"]
        normed = y.view(batch, length, self.heads, -1)
        return head_outputs(normed, self.out_proj, self.hook_z, self.hook_result)  # normed [B, T, H, P]


def _inverse_softplus_dt(heads: int, opts: dict) -> torch.Tensor:
    """dt_bias as transformers initialises it: softplus(dt_bias) log-uniform in [dt_min, dt_max]."""
    log_lo, log_hi = math.log(opts["dt_min"]), math.log(opts["dt_max"])
    dt = torch.exp(torch.rand(heads) * (log_hi - log_lo) + log_lo).clamp(min=opts["dt_init_floor"])
    return dt + torch.log(-torch.expm1(-dt))
