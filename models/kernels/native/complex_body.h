/* The complex-transition selective scans (AUSSM's rotation, Mamba-3's trapezoid) for one real
 * type; included by kernels.c once per type with
 *   R       the real type (float, double)
 *   SFX     the name suffix (f32, f64)
 *   EXP     the exponential in R (exp_f32 of kernels.c, libm exp)
 *   SINCOS  sin and cos in R: SINCOS(x, &s, &c) (sincos_f32 of kernels.c, libm's)
 *   SC_MAX  the largest |x| SINCOS is accurate for; beyond it (and for NaN) the angle is
 *           recomputed with libm's double sin and cos after the vector loop
 *
 * Two transitions (mode), h_t complex, stored as (re, im) planes:
 *   mode 0 (AUSSM)   a_t[e, n] = exp(i dt_t[e] W[e, n])           (W = omega, learned)
 *                    h_t = a_t h_{t-1} + v_t,   v_t[e, n] = (dt_t x_t)[e] Bm_t[n]
 *   mode 1 (Mamba-3) a_t[e, n] = exp(dt_t[e] A[e, n]) exp(i dt_t[e] theta_t[n])
 *                    h_t = a_t (h_{t-1} + w_t) + v_t,   v_t = (dt lam x)_t[e] Bm_t[n],
 *                    w_t = ((1 - lam) dt x_prev)_t[e] B_prev_t[n]
 *                    (= a h + lam dt x B + (1 - lam) dt a x_prev B_prev: the trapezoid)
 *   y_t[e] = sum_n C_t[n] Re h_t[e, n]
 * v and w are real. a is formed per step into a [2, N, E] buffer (re plane, im plane), the
 * state is kept transposed ([2, N, E] per batch row) so inner loops run over E; nothing
 * [B, T, E, N] is read, and only the states variant (store = 1) writes one, in torch's
 * complex layout ([B, T, E, N] interleaved (re, im)).
 *
 * Layout (contiguous, row-major; M = N E):
 *   dt, x, lam, xp, y [B, S, E]   Bm, Bp, C [B, S, N]   At [N, E] (A transposed; mode 1)
 *   W: mode 0 omega transposed [N, E]; mode 1 theta [B, S, N]
 *   h [B, 2, N, E]   ckpt [B, ceil(T / every), 2, N, E]: the state entering steps 0, every, ...
 * S >= T steps per batch row (the states variant runs segments of a longer sequence).
 *
 * Backward: with G_t = dL/dh_t (re, im) and p_t = h_{t-1} + w_t,
 *   dL/dp_t = conj(a_t) G_t (the carry: dL/dh_{t-1} before the read-out of step t-1),
 *   dL/da_t = G_t conj(p_t), dL/d(dt A) = Re(conj(a) dL/da), dL/d(angle) = Im(conj(a) dL/da),
 *   dL/dv_t = Re G_t, dL/dw_t = Re dL/dp_t,
 * reduced over n (per channel: dt, lam, x, x_prev) and over e (per state index: Bm, B_prev, C,
 * theta) inside the loop; omega's and A's gradients are summed over steps per batch row.
 */

#define CAT_(x, y) x##_##y
#define CAT(x, y) CAT_(x, y)
#define FN(name) CAT(name, SFX)

/* cores called with constant mode / store from the exported kernels: inlined there, so each
 * combination compiles without the other's operations (and inside each vector clone) */
#ifndef CX_CORE
#if defined(__has_attribute)
#if __has_attribute(always_inline)
#define CX_CORE static inline __attribute__((always_inline))
#endif
#endif
#endif
#ifndef CX_CORE
#define CX_CORE static inline
#endif

/* a_t [2, N, E] (ar = re plane, ai = im plane) for one step; W: omega^T [N, E] (mode 0) or
 * theta_t [N] (mode 1). */
CX_CORE void FN(cx_trans)(const int mode, const R *restrict dt, const R *restrict W,
                          const R *restrict At, R *restrict ar, R *restrict ai, int64_t E, int64_t N) {
    int64_t bad = 0;
    for (int64_t n = 0; n < N; n++) {
        R *arn = ar + n * E, *ain = ai + n * E;
#pragma omp simd reduction(+ : bad)
        for (int64_t e = 0; e < E; e++) {
            const R d = dt[e], phi = d * (mode ? W[n] : W[n * E + e]);
            R s, c;
            SINCOS(phi, &s, &c);
            if (mode) {
                const R decay = EXP(d * At[n * E + e]);
                arn[e] = decay * c;
                ain[e] = decay * s;
            } else {
                arn[e] = c;
                ain[e] = s;
            }
            bad += !(phi <= (R)SC_MAX && phi >= -(R)SC_MAX);
        }
    }
    if (!bad) return;
    for (int64_t n = 0; n < N; n++) /* large or NaN angles: libm in double */
        for (int64_t e = 0; e < E; e++) {
            const R d = dt[e], phi = d * (mode ? W[n] : W[n * E + e]);
            if (phi <= (R)SC_MAX && phi >= -(R)SC_MAX) continue;
            const R decay = mode ? EXP(d * At[n * E + e]) : (R)1;
            ar[n * E + e] = decay * (R)cos((double)phi);
            ai[n * E + e] = decay * (R)sin((double)phi);
        }
}

/* The per-channel coefficients of one step: cv [E] = dt x (mode 0) or (dt lam) x (mode 1),
 * cw [E] = ((1 - lam) dt) x_prev (mode 1). */
CX_CORE void FN(cx_coef)(const int mode, const R *restrict dt, const R *restrict lam,
                         const R *restrict x, const R *restrict xp, R *restrict cv, R *restrict cw,
                         int64_t E) {
    for (int64_t e = 0; e < E; e++) {
        if (mode) {
            cv[e] = (dt[e] * lam[e]) * x[e];
            cw[e] = ((1 - lam[e]) * dt[e]) * xp[e];
        } else {
            cv[e] = dt[e] * x[e];
        }
    }
}

/* One step of one batch row: h [2, N, E] <- a (hp + w) + v (h may be hp: each entry is read
 * before it is written). readout: y [E] = sum_n C[n] Re h; store: the state into out [E, N, 2]
 * (torch's complex layout). */
CX_CORE void FN(cx_step)(const int mode, const int readout, const int store, const R *restrict cv,
                         const R *restrict cw, const R *restrict Bm, const R *restrict Bp,
                         const R *restrict C, const R *restrict ar, const R *restrict ai,
                         const R *hp, R *h, R *restrict y, R *restrict out, int64_t E, int64_t N) {
    const int64_t M = E * N;
    if (readout)
        for (int64_t e = 0; e < E; e++) y[e] = 0;
    for (int64_t n = 0; n < N; n++) {
        const R Bn = Bm[n], Bpn = mode ? Bp[n] : 0, Cn = readout ? C[n] : 0;
        const R *arn = ar + n * E, *ain = ai + n * E, *hpr = hp + n * E, *hpi = hp + M + n * E;
        R *hr = h + n * E, *hi = h + M + n * E;
#pragma omp simd
        for (int64_t e = 0; e < E; e++) {
            const R pr = mode ? hpr[e] + cw[e] * Bpn : hpr[e], pi = hpi[e];
            const R nr = (arn[e] * pr - ain[e] * pi) + cv[e] * Bn, ni = ain[e] * pr + arn[e] * pi;
            hr[e] = nr;
            hi[e] = ni;
            if (readout) y[e] += Cn * nr;
            if (store) {
                out[2 * (e * N + n)] = nr;
                out[2 * (e * N + n) + 1] = ni;
            }
        }
    }
}

/* Forward over steps [0, T) of every batch row (rows S steps apart). h: h_{-1} on entry,
 * h_{T-1} on return. work: 2 M + 2 E elements. */
CX_CORE void FN(cx_fwd)(const int mode, const int store, int64_t B, int64_t T, int64_t S, int64_t E,
                        int64_t N, const R *dt, const R *W, const R *At, const R *lam, const R *x,
                        const R *xp, const R *Bm, const R *Bp, const R *C, R *h, R *y, int64_t every,
                        R *ckpt, R *states, R *work) {
    const int64_t M = E * N, n_ckpt = (T + every - 1) / every;
    R *ar = work, *ai = work + M, *cv = work + 2 * M, *cw = cv + E;
    for (int64_t bi = 0; bi < B; bi++) {
        R *hb = h + bi * 2 * M;
        for (int64_t t = 0; t < T; t++) {
            const int64_t bt = bi * S + t;
            if (ckpt && t % every == 0) memcpy(ckpt + (bi * n_ckpt + t / every) * 2 * M, hb, 2 * M * sizeof(R));
            FN(cx_trans)(mode, dt + bt * E, mode ? W + bt * N : W, At, ar, ai, E, N);
            FN(cx_coef)(mode, dt + bt * E, lam + (mode ? bt * E : 0), x + bt * E, xp + (mode ? bt * E : 0),
                        cv, cw, E);
            FN(cx_step)(mode, !store, store, cv, cw, Bm + bt * N, Bp + (mode ? bt * N : 0),
                        store ? C : C + bt * N, ar, ai, hb, hb, store ? y : y + bt * E,
                        store ? states + bt * 2 * M : states, E, N);
        }
    }
}

/* mode: 0 AUSSM, 1 Mamba-3 (lam, xp, Bp, At unused in mode 0: may be NULL). states NULL: the
 * read-out y (and ckpt, when not NULL); else every state into states [B, S, E, N, 2] (y, C,
 * ckpt unused). */
CLONES void FN(complex_fwd)(int64_t mode, int64_t B, int64_t T, int64_t S, int64_t E, int64_t N,
                            const R *dt, const R *W, const R *At, const R *lam, const R *x, const R *xp,
                            const R *Bm, const R *Bp, const R *C, R *h, R *y, int64_t every, R *ckpt,
                            R *states, R *work) {
#define CX_FWD(m, st) FN(cx_fwd)(m, st, B, T, S, E, N, dt, W, At, lam, x, xp, Bm, Bp, C, h, y, every, ckpt, \
                                 states, work)
    if (mode && states) CX_FWD(1, 1);
    else if (mode) CX_FWD(1, 0);
    else if (states) CX_FWD(0, 1);
    else CX_FWD(0, 0);
#undef CX_FWD
}

/* The adjoint at step t of one batch row (see the top). carry [2, N, E]: dL/dp_{t+1} on entry
 * (zero after the last step), dL/dp_t on return. hp, h: h_{t-1}, h_t [2, N, E]; ar, ai: a_t.
 * gacc [N, E] accumulates omega^T's gradient (mode 0) or A^T's (mode 1) over steps; gth [N]
 * (mode 1: theta_t's); gdt, glam, gx, gxp [E]; gBm, gBp, gC [N]. */
CX_CORE void FN(cx_adjoint)(const int mode, const R *restrict gy, const R *restrict dt,
                            const R *restrict W, const R *restrict At, const R *restrict lam,
                            const R *restrict x, const R *restrict xp, const R *restrict cv,
                            const R *restrict cw, const R *restrict Bm, const R *restrict Bp,
                            const R *restrict C, const R *restrict ar, const R *restrict ai,
                            const R *restrict hp, const R *restrict h, R *restrict carry,
                            R *restrict gacc, R *restrict gth, R *restrict gdt, R *restrict glam,
                            R *restrict gx, R *restrict gxp, R *restrict gBm, R *restrict gBp,
                            R *restrict gC, int64_t E, int64_t N) {
    const int64_t M = E * N;
    for (int64_t e = 0; e < E; e++) { /* gdt, gx, gxp: the sums over n, finished at the end */
        gdt[e] = gx[e] = 0;
        if (mode) gxp[e] = 0;
    }
    for (int64_t n = 0; n < N; n++) {
        const R Bn = Bm[n], Bpn = mode ? Bp[n] : 0, Cn = C[n], thn = mode ? W[n] : 0;
        const R *arn = ar + n * E, *ain = ai + n * E, *hpr = hp + n * E, *hpi = hp + M + n * E,
                *hr = h + n * E, *An = mode ? At + n * E : At, *Wn = mode ? W : W + n * E;
        R *cr = carry + n * E, *ci = carry + M + n * E, *gan = gacc + n * E;
        R gBn = 0, gBpn = 0, gCn = 0, gthn = 0;
#pragma omp simd reduction(+ : gBn, gBpn, gCn, gthn)
        for (int64_t e = 0; e < E; e++) {
            const R Gr = cr[e] + gy[e] * Cn, Gi = ci[e], d = dt[e], a_r = arn[e], a_i = ain[e];
            const R pr = mode ? hpr[e] + cw[e] * Bpn : hpr[e], pi = hpi[e];
            const R gar = Gr * pr + Gi * pi, gai = Gi * pr - Gr * pi; /* dL/da = G conj(p) */
            const R gph = gai * a_r - gar * a_i;                      /* dL/d angle */
            if (mode) {
                const R gz = gar * a_r + gai * a_i; /* dL/d(dt A) */
                gdt[e] += gz * An[e] + gph * thn;
                gan[e] += gz * d;
                gthn += gph * d;
            } else {
                gdt[e] += gph * Wn[e];
                gan[e] += gph * d;
            }
            gx[e] += Gr * Bn;
            gBn += Gr * cv[e];
            const R gpr = Gr * a_r + Gi * a_i, gpi = Gi * a_r - Gr * a_i; /* conj(a) G */
            if (mode) {
                gxp[e] += gpr * Bpn;
                gBpn += gpr * cw[e];
            }
            gCn += gy[e] * hr[e];
            cr[e] = gpr;
            ci[e] = gpi;
        }
        gBm[n] = gBn;
        gC[n] = gCn;
        if (mode) {
            gBp[n] = gBpn;
            gth[n] = gthn;
        }
    }
    for (int64_t e = 0; e < E; e++) {
        const R d = dt[e], sdt = gdt[e], sv = gx[e];
        if (mode) {
            const R sw = gxp[e], l = lam[e];
            gdt[e] = sdt + sv * (l * x[e]) + sw * ((1 - l) * xp[e]);
            glam[e] = (sv * x[e] - sw * xp[e]) * d;
            gx[e] = sv * (d * l);
            gxp[e] = sw * ((1 - l) * d);
        } else {
            gdt[e] = sdt + sv * x[e];
            gx[e] = sv * d;
        }
    }
}

/* Backward of complex_fwd's read-out from its checkpoints given gy [B, T, E]. gW: mode 0
 * omega^T's gradient [N, E] (summed), mode 1 theta's [B, T, N]; gAt [N, E] (mode 1, summed);
 * gdt, glam, gx, gxp [B, T, E]; gBm, gBp, gC [B, T, N]; gh0 [B, 2, N, E].
 * work: (4 min(every, T) + 1) M + 2 E elements: the states and transitions of one checkpoint
 * span, recomputed from its checkpoint, then one batch row's sum of omega's or A's gradient. */
CX_CORE void FN(cx_bwd)(const int mode, int64_t B, int64_t T, int64_t E, int64_t N, const R *dt,
                        const R *W, const R *At, const R *lam, const R *x, const R *xp, const R *Bm,
                        const R *Bp, const R *C, const R *ckpt, int64_t every, const R *gy, R *gdt,
                        R *gW, R *gAt, R *glam, R *gx, R *gxp, R *gBm, R *gBp, R *gC, R *gh0, R *work) {
    const int64_t M = E * N, n_ckpt = (T + every - 1) / every, span = every < T ? every : T;
    R *hs = work, *as = work + 2 * span * M, *g_row = work + 4 * span * M, *cv = g_row + M, *cw = cv + E;
    R *gsum = mode ? gAt : gW;
    for (int64_t i = 0; i < M; i++) gsum[i] = 0;
    for (int64_t bi = 0; bi < B; bi++) {
        R *carry = gh0 + bi * 2 * M;
        for (int64_t i = 0; i < 2 * M; i++) carry[i] = 0;
        for (int64_t i = 0; i < M; i++) g_row[i] = 0;
        for (int64_t k = n_ckpt - 1; k >= 0; k--) {
            const int64_t t0 = k * every, t1 = t0 + every < T ? t0 + every : T;
            const R *start = ckpt + (bi * n_ckpt + k) * 2 * M; /* h_{t0 - 1} */
            for (int64_t t = t0; t < t1; t++) { /* hs[j] = h_t, as[j] = a_t */
                const int64_t bt = bi * T + t, j = t - t0;
                R *aj = as + j * 2 * M;
                FN(cx_trans)(mode, dt + bt * E, mode ? W + bt * N : W, At, aj, aj + M, E, N);
                FN(cx_coef)(mode, dt + bt * E, lam + (mode ? bt * E : 0), x + bt * E,
                            xp + (mode ? bt * E : 0), cv, cw, E);
                FN(cx_step)(mode, 0, 0, cv, cw, Bm + bt * N, Bp + (mode ? bt * N : 0), C, aj, aj + M,
                            j ? hs + (j - 1) * 2 * M : start, hs + j * 2 * M, NULL, NULL, E, N);
            }
            for (int64_t t = t1 - 1; t >= t0; t--) {
                const int64_t bt = bi * T + t, j = t - t0, bE = mode ? bt * E : 0, bN = mode ? bt * N : 0;
                const R *aj = as + j * 2 * M;
                FN(cx_coef)(mode, dt + bt * E, lam + bE, x + bt * E, xp + bE, cv, cw, E);
                FN(cx_adjoint)(mode, gy + bt * E, dt + bt * E, mode ? W + bt * N : W, At, lam + bE,
                               x + bt * E, xp + bE, cv, cw, Bm + bt * N, Bp + bN, C + bt * N, aj, aj + M,
                               j ? hs + (j - 1) * 2 * M : start, hs + j * 2 * M, carry, g_row,
                               mode ? gW + bt * N : gW, gdt + bt * E, glam + bE, gx + bt * E, gxp + bE,
                               gBm + bt * N, gBp + bN, gC + bt * N, E, N);
            }
        }
        for (int64_t i = 0; i < M; i++) gsum[i] += g_row[i];
    }
}

CLONES void FN(complex_bwd)(int64_t mode, int64_t B, int64_t T, int64_t E, int64_t N, const R *dt,
                            const R *W, const R *At, const R *lam, const R *x, const R *xp,
                            const R *Bm, const R *Bp, const R *C, const R *ckpt, int64_t every,
                            const R *gy, R *gdt, R *gW, R *gAt, R *glam, R *gx, R *gxp, R *gBm,
                            R *gBp, R *gC, R *gh0, R *work) {
#define CX_BWD(m) FN(cx_bwd)(m, B, T, E, N, dt, W, At, lam, x, xp, Bm, Bp, C, ckpt, every, gy, gdt, gW, gAt, \
                           glam, gx, gxp, gBm, gBp, gC, gh0, work)
    if (mode) CX_BWD(1);
    else CX_BWD(0);
#undef CX_BWD
}

/* Backward of the states variant (complex_fwd with states, no pins) given G = dL/dstates
 * [B, T, E, N, 2] (torch's complex layout: (dL/d Re, dL/d Im)): the adjoint of cx_bwd with the
 * read-out's cotangent replaced by G_t, added into the carry before each step, and h_{t-1} read
 * from the saved states [B, T, E, N, 2] (h0 [B, 2, N, E] before step 0) instead of recomputed.
 * cx_adjoint runs with gy = 0 (so its G is the carry) and a scratch gC. Gradients as complex_bwd's
 * (no gC); work: 5 M + 3 E + 2 N elements. */
CX_CORE void FN(cx_states_bwd)(const int mode, int64_t B, int64_t T, int64_t E, int64_t N, const R *dt,
                               const R *W, const R *At, const R *lam, const R *x, const R *xp,
                               const R *Bm, const R *Bp, const R *h0, const R *states, const R *G,
                               R *gdt, R *gW, R *gAt, R *glam, R *gx, R *gxp, R *gBm, R *gBp, R *gh0,
                               R *work) {
    const int64_t M = E * N;
    R *ar = work, *ai = work + M, *hp = work + 2 * M, *g_row = work + 4 * M, *cv = g_row + M, *cw = cv + E,
      *zero = cw + E, *gC = zero + E + N; /* zero: E + N zeros (gy [E], then C [N]) */
    R *gsum = mode ? gAt : gW;
    for (int64_t i = 0; i < E + N; i++) zero[i] = 0;
    for (int64_t i = 0; i < M; i++) gsum[i] = 0;
    for (int64_t bi = 0; bi < B; bi++) {
        R *carry = gh0 + bi * 2 * M; /* dL/dp_{t+1}, then G_t added: dL/dh_t */
        for (int64_t i = 0; i < 2 * M; i++) carry[i] = 0;
        for (int64_t i = 0; i < M; i++) g_row[i] = 0;
        for (int64_t t = T - 1; t >= 0; t--) {
            const int64_t bt = bi * T + t, bE = mode ? bt * E : 0, bN = mode ? bt * N : 0;
            const R *Gt = G + bt * 2 * M, *prev = t ? states + (bt - 1) * 2 * M : NULL;
            for (int64_t e = 0; e < E; e++) /* [E, N, 2] -> the [2, N, E] planes */
                for (int64_t n = 0; n < N; n++) {
                    carry[n * E + e] += Gt[2 * (e * N + n)];
                    carry[M + n * E + e] += Gt[2 * (e * N + n) + 1];
                    if (prev) {
                        hp[n * E + e] = prev[2 * (e * N + n)];
                        hp[M + n * E + e] = prev[2 * (e * N + n) + 1];
                    }
                }
            const R *h_prev = prev ? hp : h0 + bi * 2 * M;
            FN(cx_trans)(mode, dt + bt * E, mode ? W + bt * N : W, At, ar, ai, E, N);
            FN(cx_coef)(mode, dt + bt * E, lam + bE, x + bt * E, xp + bE, cv, cw, E);
            FN(cx_adjoint)(mode, zero, dt + bt * E, mode ? W + bt * N : W, At, lam + bE, x + bt * E, xp + bE,
                           cv, cw, Bm + bt * N, Bp + bN, zero + E, ar, ai, h_prev, h_prev, carry, g_row,
                           mode ? gW + bt * N : gW, gdt + bt * E, glam + bE, gx + bt * E, gxp + bE,
                           gBm + bt * N, gBp + bN, gC, E, N);
        }
        for (int64_t i = 0; i < M; i++) gsum[i] += g_row[i];
    }
}

CLONES void FN(complex_states_bwd)(int64_t mode, int64_t B, int64_t T, int64_t E, int64_t N, const R *dt,
                                   const R *W, const R *At, const R *lam, const R *x, const R *xp,
                                   const R *Bm, const R *Bp, const R *h0, const R *states, const R *G,
                                   R *gdt, R *gW, R *gAt, R *glam, R *gx, R *gxp, R *gBm, R *gBp, R *gh0,
                                   R *work) {
#define CX_SBWD(m) FN(cx_states_bwd)(m, B, T, E, N, dt, W, At, lam, x, xp, Bm, Bp, h0, states, G, gdt, gW, gAt, \
                                     glam, gx, gxp, gBm, gBp, gh0, work)
    if (mode) CX_SBWD(1);
    else CX_SBWD(0);
#undef CX_SBWD
}

#undef FN
#undef CAT
#undef CAT_
