"""Instrumented sequence kernels: every kernel can return and replace the states it scans.

short_conv(x [B,T,C], weight [C,W], bias [C] | None, initial_state [B,C,W-1] | None = None,
           output_final_state=False, impl="auto" | "naive" | "torch")
    -> y [B,T,C], or (y, final_state [B,C,W-1]) when output_final_state
    causal depthwise convolution with a carried state (models/kernels/short_conv.py).

diag_scan(a [B,T,*S], b [B,T,*S], c None | [B,T,N] | [B,T,*S] = None, *, initial_state [B,*S],
          output_final_state=False, export_at=None | "all" | "chunks" | time indices,
          pins=(mask [B,T], values [B,T,*S]),
          patches={t: state [B,*S]}, impl="auto" | "naive" | "chunked" | "native" | "triton",
          chunk_size=64)
    -> ScanOutput(output, final_state, states_at)
    h_t = a_t * h_{t-1} + b_t, real or complex; output = states [B,T,*S] or, with c, the read-out
    y_t = sum_n c_t[..., n] h_t[..., n] [B,T,*lead] without returning the states
    (models/kernels/diag_scan.py). A pin at t replaces h_t; the scan continues from it.
    chunked: exact products (a = 0, negative, complex a are safe), custom backward; native: a
    plain-C loop on the CPU built with the system compiler (models/kernels/native/diag.py), the
    CPU default when built; triton: real dtypes, CUDA or TRITON_INTERPRET=1
    (models/kernels/triton_diag_scan.py).

delta_rule(q [B,T,H,K], k [B,T,H,K], v [B,T,H,V], beta [B,T,H], *, g=None | [B,T,H], initial_state [B,H,V,K],
           output_final_state=False, export_at=None | "all" | "chunks" | time indices,
           pins=(mask [B,T], values [B,T,H,V,K]), patches={t: state [B,H,V,K]},
           beta_clamp=None | [H,2], chunk_size=64,
           impl="auto" | "naive" | "chunked" | "native" | "triton")
    -> ScanOutput(output [B,T,H,V], final_state [B,H,V,K], states_at [B,n,H,V,K])
    S_t = alpha_t S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T, o_t = S_t q_t, state values x
    keys, alpha_t = exp(g_t) (1 without g: DeltaNet; with it Gated DeltaNet) (models/kernels/delta_rule.py). A pin at t replaces S_t; the scan continues from it.
    native: a plain-C loop on the CPU, forward only (models/kernels/native/delta.py; impl="auto"
    uses it on the CPU when no gradient is wanted).

native.selective.selective_scan(dt [B,T,E], A [E,N], x [B,T,E], Bm [B,T,N], C [B,T,N], initial_state=None,
                                scale=1.0, output_final_state=False)
    -> y [B,T,E] (output_final_state: (y, final state [B,E,N]), forward only): Mamba's scan with
    a = scale exp(dt A) - (scale - 1) (1: Mamba, 2: negative Mamba) and dt x Bm formed inside the C loop (CPU, float32/64; forward and backward, nothing [B,T,E,N]
    materialised); the fast path of Mamba and negative Mamba on the CPU.
native.selective.selective_states(dt, A, x, Bm, initial_state=None, pins=None, scale=1.0) -> states
    [B,T,E,N]: the same recurrence returning every state (differentiable without pins; with pins
    forward only); their instrumented path.
native.complex.rotation_scan / trapezoid_scan and rotation_states / trapezoid_states: the same pair
    for the complex transitions of AUSSM (exp(i dt omega)) and Mamba-3 (exp(dt (A + i theta)) with
    the trapezoid's previous-input term); complex64/128 states in torch's layout; the scans take
    output_final_state too.

The native kernels' C library (build, load, availability) is models/kernels/native/library.py; the
package's docstring lists its modules, one per op family.
"""

from models.kernels.delta_rule import delta_rule
from models.kernels.diag_scan import ScanOutput, diag_scan
from models.kernels.short_conv import short_conv

__all__ = ["ScanOutput", "delta_rule", "diag_scan", "short_conv"]
