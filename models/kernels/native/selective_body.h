/* The selective scan (Mamba's diagonal scan with its discretisation fused in) for one real type;
 * included by kernels.c once per type with
 *   R     the real type (float, double)
 *   SFX   the name suffix (f32, f64)
 *   EXP   the exponential in R (exp_f32 of kernels.c for float, libm exp for double)
 *
 *   a_t[e, n] = s exp(dt_t[e] A[e, n]) - (s - 1),   b_t[e, n] = (dt_t[e] x_t[e]) Bm_t[n]
 *   h_t = a_t h_{t-1} + b_t,                        y_t[e] = sum_n C_t[n] h_t[e, n]
 *
 * s (the scale): 1 for Mamba (a = exp(dt A)), 2 for negative Mamba (a = 2 exp(dt A) - 1, in
 * (-1, 1)). Each exported kernel branches once on s == 1 and passes the constant 1 to its inlined
 * core there, so Mamba's loops compile without the two extra operations (and 1 * e - 0 = e
 * exactly in any case: its results are those of a = exp(dt A) bit for bit).
 *
 * a and b are formed per step in registers; nothing [B, T, E, N] is read, and only
 * selective_states (every state, for Mamba's instrumented path) writes one. The scan's state
 * is kept transposed, [N, E], so every inner loop runs over the E channels (long and contiguous;
 * vectorised) and the read-out accumulates into y_t [E] without horizontal sums.
 * Layout of selective_fwd / selective_bwd (all contiguous, row-major; M = N * E state entries
 * per batch row; selective_states at the end keeps torch's [E, N] layout instead):
 *   dt, x, y [B, T, E]   At [N, E] (A transposed)   Bm, C [B, T, N]   h [B, N, E]
 *   ckpt [B, ceil(T / every), N, E]: the state entering steps 0, every, 2 every, ...
 * Products are associated as in the unfused torch path (exp(dt * A); s * e - (s - 1);
 * (dt * x) * Bm; a * h + b), so states agree with it to the rounding of the exponential.
 */

#define CAT_(x, y) x##_##y
#define CAT(x, y) CAT_(x, y)
#define FN(name) CAT(name, SFX)

/* the cores that each exported kernel calls twice (s = 1 and any s) must be inlined into it: a
 * core left out of line would be compiled once, for the baseline target, not in the vector clones */
#ifndef SEL_CORE
#if defined(__has_attribute)
#if __has_attribute(always_inline)
#define SEL_CORE static inline __attribute__((always_inline))
#endif
#endif
#endif
#ifndef SEL_CORE
#define SEL_CORE static inline
#endif

/* The transition a = s e - (s - 1) from e = exp(dt A) (its derivative in dt A is s e). */
static inline R FN(sel_a)(R e, R s) { return s * e - (s - 1); }

/* One step of one batch row: h [N, E] <- a_t h + b_t in place; y [E] its read-out. shared (a
 * constant at every call): A has one decay per channel (Mamba-2's A expanded over N), At is its
 * [E] row and the transitions a [E] are formed once into ae [E] (the same values bit for bit). */
static inline void FN(sel_step)(const R *restrict dt, const R *restrict x, const R *restrict At,
                                const R *restrict Bm, const R *restrict C, R *restrict h,
                                R *restrict y, R *restrict ae, int64_t E, int64_t N, const R s,
                                const int shared) {
    for (int64_t e = 0; e < E; e++) y[e] = 0;
    if (shared) {
#pragma omp simd
        for (int64_t e = 0; e < E; e++) ae[e] = FN(sel_a)(EXP(dt[e] * At[e]), s);
    }
    for (int64_t n = 0; n < N; n++) {
        const R Bn = Bm[n], Cn = C[n], *An = At + (shared ? 0 : n * E);
        R *hn = h + n * E;
#pragma omp simd
        for (int64_t e = 0; e < E; e++) {
            const R a = shared ? ae[e] : FN(sel_a)(EXP(dt[e] * An[e]), s);
            hn[e] = a * hn[e] + (dt[e] * x[e]) * Bn;
            y[e] += Cn * hn[e];
        }
    }
}

/* The same step from h_prev into h_next [N, E], keeping exp(dt_t A) [N, E] ([E] when shared;
 * the backward's recomputation; the states are the forward's bit for bit). */
static inline void FN(sel_step_to)(const R *restrict dt, const R *restrict x, const R *restrict At,
                                   const R *restrict Bm, const R *restrict h_prev, R *restrict h_next,
                                   R *restrict e_out, int64_t E, int64_t N, const R s, const int shared) {
    if (shared) {
#pragma omp simd
        for (int64_t e = 0; e < E; e++) e_out[e] = EXP(dt[e] * At[e]);
        for (int64_t n = 0; n < N; n++) {
            const R Bn = Bm[n], *hp = h_prev + n * E;
            R *hn = h_next + n * E;
#pragma omp simd
            for (int64_t e = 0; e < E; e++) hn[e] = FN(sel_a)(e_out[e], s) * hp[e] + (dt[e] * x[e]) * Bn;
        }
        return;
    }
    for (int64_t n = 0; n < N; n++) {
        const R Bn = Bm[n], *An = At + n * E, *hp = h_prev + n * E;
        R *hn = h_next + n * E, *en = e_out + n * E;
#pragma omp simd
        for (int64_t e = 0; e < E; e++) {
            en[e] = EXP(dt[e] * An[e]);
            hn[e] = FN(sel_a)(en[e], s) * hp[e] + (dt[e] * x[e]) * Bn;
        }
    }
}

/* The adjoint at one step t of one batch row. carry [N, E] holds a_{t+1} g_{t+1} on entry and
 * a_t g_t on return, where g_t = dL/dh_t = gy_t[e] C_t[n] + a_{t+1} g_{t+1}. With z = dt A
 * (so grad z = g_t h_{t-1} s exp(z)) and grad b_t = g_t:
 *   gdt [E] = sum_n grad z A[e, n] + x[e] sum_n g Bm[n]      gx [E] = dt[e] sum_n g Bm[n]
 *   gAt_acc [N, E] += grad z dt[e]                             gBm [N] = sum_e g (dt x)[e]
 *   gC [N] = sum_e gy[e] h_t[n, e]
 * (ez, h_prev, h: exp(z_t), h_{t-1}, h_t [N, E], recomputed; gy, dt, x [E]; Bm, C [N]). gdt and
 * gx hold the two sums over n until the end. shared: At and ez are [E] rows (sel_step); gAt_acc
 * stays [N, E], so grad A is the expanded A's bit for bit. */
static inline void FN(sel_adjoint)(const R *restrict gy, const R *restrict dt, const R *restrict x,
                                   const R *restrict At, const R *restrict Bm, const R *restrict C,
                                   const R *restrict ez, const R *restrict h_prev, const R *restrict h,
                                   R *restrict carry, R *restrict gAt_acc, R *restrict gdt,
                                   R *restrict gx, R *restrict gBm, R *restrict gC, int64_t E, int64_t N,
                                   const R s, const int shared) {
    R *restrict s_z = gdt, *restrict s_b = gx; /* sum_n grad z A[e, n], sum_n g Bm[n] */
    for (int64_t e = 0; e < E; e++) s_z[e] = s_b[e] = 0;
    for (int64_t n = 0; n < N; n++) {
        const R Bn = Bm[n], Cn = C[n], *An = At + (shared ? 0 : n * E), *en = ez + (shared ? 0 : n * E),
                *hp = h_prev + n * E, *hn = h + n * E;
        R *cn = carry + n * E, *gAn = gAt_acc + n * E, gBn = 0, gCn = 0;
#pragma omp simd reduction(+ : gBn, gCn)
        for (int64_t e = 0; e < E; e++) {
            const R g = cn[e] + gy[e] * Cn;
            const R gz = g * hp[e] * (s * en[e]);
            s_z[e] += gz * An[e];
            s_b[e] += g * Bn;
            gAn[e] += gz * dt[e];
            gBn += g * (dt[e] * x[e]);
            gCn += gy[e] * hn[e];
            cn[e] = FN(sel_a)(en[e], s) * g;
        }
        gBm[n] = gBn;
        gC[n] = gCn;
    }
    for (int64_t e = 0; e < E; e++) {
        gdt[e] = s_z[e] + s_b[e] * x[e];
        gx[e] = s_b[e] * dt[e];
    }
}

/* Forward. h holds h_{-1} on entry and h_{T-1} on return ([B, N, E]); y [B, T, E]; ckpt or NULL;
 * ae: E elements of scratch (shared). */
SEL_CORE void FN(sel_fwd)(int64_t B, int64_t T, int64_t E, int64_t N, const R *dt, const R *At,
                          const R *x, const R *Bm, const R *C, R *h, R *y, int64_t every,
                          R *ckpt, R *ae, const R s, const int shared) {
    const int64_t M = E * N, n_ckpt = (T + every - 1) / every;
    for (int64_t bi = 0; bi < B; bi++) {
        R *hb = h + bi * M;
        for (int64_t t = 0; t < T; t++) {
            const int64_t bt = bi * T + t;
            if (ckpt && t % every == 0) memcpy(ckpt + (bi * n_ckpt + t / every) * M, hb, M * sizeof(R));
            FN(sel_step)(dt + bt * E, x + bt * E, At, Bm + bt * N, C + bt * N, hb, y + bt * E, ae, E, N, s,
                         shared);
        }
    }
}

/* scale: s (see the top); s = 1 runs the core with the constant 1 (so do the two below).
 * shared: At is A's [E] column (one decay per channel), each combination its own compiled core. */
CLONES void FN(selective_fwd)(int64_t B, int64_t T, int64_t E, int64_t N,
                                  const R *dt, const R *At, const R *x, const R *Bm, const R *C,
                                  R *h, R *y, int64_t every, R *ckpt, double scale, int64_t shared, R *ae) {
#define SEL_FWD(sv, sh) FN(sel_fwd)(B, T, E, N, dt, At, x, Bm, C, h, y, every, ckpt, ae, sv, sh)
    if (shared && scale == 1) SEL_FWD((R)1, 1);
    else if (shared) SEL_FWD((R)scale, 1);
    else if (scale == 1) SEL_FWD((R)1, 0);
    else SEL_FWD((R)scale, 0);
#undef SEL_FWD
}

/* Backward of selective_fwd from its checkpoints given gy [B, T, E]: gdt, gx [B, T, E],
 * gAt [N, E] (summed over batch and time), gBm, gC [B, T, N], gh0 [B, N, E] = a_0 g_0.
 * work: (2 min(every, T) + 1) M elements ((min(every, T) + 1) M + min(every, T) E when shared): the
 * states and exponentials exp(dt A) of one checkpoint span, recomputed from its checkpoint, while
 * the adjoint walks back over them; then one batch row's sum of grad A (added to gAt per row,
 * which keeps float32 sums short). */
SEL_CORE void FN(sel_bwd)(int64_t B, int64_t T, int64_t E, int64_t N, const R *dt, const R *At,
                          const R *x, const R *Bm, const R *C, const R *ckpt, int64_t every,
                          const R *gy, R *gdt, R *gAt, R *gx, R *gBm, R *gC, R *gh0, R *work,
                          const R s, const int shared) {
    const int64_t M = E * N, n_ckpt = (T + every - 1) / every, span = every < T ? every : T;
    const int64_t Me = shared ? E : M; /* exp(dt A) entries a step */
    R *hs = work, *es = work + span * M, *gA_row = es + span * Me;
    for (int64_t i = 0; i < M; i++) gAt[i] = 0;
    for (int64_t bi = 0; bi < B; bi++) {
        R *carry = gh0 + bi * M; /* a_{t+1} g_{t+1}; zero after the last step */
        for (int64_t i = 0; i < M; i++) carry[i] = gA_row[i] = 0;
        for (int64_t k = n_ckpt - 1; k >= 0; k--) {
            const int64_t t0 = k * every, t1 = t0 + every < T ? t0 + every : T;
            const R *start = ckpt + (bi * n_ckpt + k) * M; /* h_{t0 - 1} */
            for (int64_t t = t0; t < t1; t++) { /* hs[t - t0] = h_t, es[t - t0] = exp(dt_t A) */
                const int64_t bt = bi * T + t, j = t - t0;
                FN(sel_step_to)(dt + bt * E, x + bt * E, At, Bm + bt * N, j ? hs + (j - 1) * M : start,
                                hs + j * M, es + j * Me, E, N, s, shared);
            }
            for (int64_t t = t1 - 1; t >= t0; t--) {
                const int64_t bt = bi * T + t, j = t - t0;
                FN(sel_adjoint)(gy + bt * E, dt + bt * E, x + bt * E, At, Bm + bt * N, C + bt * N,
                                es + j * Me, j ? hs + (j - 1) * M : start, hs + j * M, carry, gA_row,
                                gdt + bt * E, gx + bt * E, gBm + bt * N, gC + bt * N, E, N, s, shared);
            }
        }
        for (int64_t i = 0; i < M; i++) gAt[i] += gA_row[i];
    }
}

CLONES void FN(selective_bwd)(int64_t B, int64_t T, int64_t E, int64_t N,
                                  const R *dt, const R *At, const R *x, const R *Bm, const R *C,
                                  const R *ckpt, int64_t every, const R *gy,
                                  R *gdt, R *gAt, R *gx, R *gBm, R *gC, R *gh0, R *work, double scale,
                                  int64_t shared) {
#define SEL_BWD(sv, sh) FN(sel_bwd)(B, T, E, N, dt, At, x, Bm, C, ckpt, every, gy, gdt, gAt, gx, gBm, gC, gh0, work, sv, sh)
    if (shared && scale == 1) SEL_BWD((R)1, 1);
    else if (shared) SEL_BWD((R)scale, 1);
    else if (scale == 1) SEL_BWD((R)1, 0);
    else SEL_BWD((R)scale, 0);
#undef SEL_BWD
}

/* Every state, forward only (selective_states; no read-out, no checkpoints): states
 * [B, *, E, N] in torch's layout, so A [E, N] is not transposed here and the inner loop runs
 * over N; each step reads h_{t-1} back from the previous output row (in cache). Same products
 * as selective_fwd, so the states are the ones it would read out. One segment of a longer
 * sequence: dt, x [B, S, E], Bm [B, S, N] and states [B, S, E, N] are pointers to step `start`
 * of arrays with S steps per batch row (S >= T); h0 [B, E, N] with rows h0_stride apart (a
 * contiguous initial state: E N; the pinned state at step start - 1 of `states`: S E N). */
SEL_CORE void FN(sel_states)(int64_t B, int64_t T, int64_t S, int64_t E, int64_t N, const R *dt,
                             const R *A, const R *x, const R *Bm, const R *h0, int64_t h0_stride,
                             R *states, const R s) {
    const int64_t M = E * N;
    for (int64_t bi = 0; bi < B; bi++) {
        const R *hp = h0 + bi * h0_stride;
        for (int64_t t = 0; t < T; t++) {
            const int64_t bt = bi * S + t;
            const R *dtt = dt + bt * E, *xt = x + bt * E, *Bt = Bm + bt * N;
            R *h = states + bt * M;
            for (int64_t e = 0; e < E; e++) {
                const R d = dtt[e], u = d * xt[e], *Ae = A + e * N, *hpe = hp + e * N;
                R *he = h + e * N;
#pragma omp simd
                for (int64_t n = 0; n < N; n++) he[n] = FN(sel_a)(EXP(d * Ae[n]), s) * hpe[n] + u * Bt[n];
            }
            hp = h;
        }
    }
}

CLONES void FN(selective_states)(int64_t B, int64_t T, int64_t S, int64_t E, int64_t N,
                                     const R *dt, const R *A, const R *x, const R *Bm,
                                     const R *h0, int64_t h0_stride, R *states, double scale) {
    if (scale == 1) FN(sel_states)(B, T, S, E, N, dt, A, x, Bm, h0, h0_stride, states, (R)1);
    else FN(sel_states)(B, T, S, E, N, dt, A, x, Bm, h0, h0_stride, states, (R)scale);
}

/* Backward of selective_states (no pins) given G = dL/dstates [B, T, E, N]: the adjoint
 * g_t = G_t + a_{t+1} g_{t+1} walks back over the saved states (h_{t-1} is the previous output
 * row; h0 [B, E, N] before step 0), with z = dt A, grad z = g_t h_{t-1} s exp(z), grad b_t = g_t:
 *   gdt [B, T, E] = sum_n grad z A[e, n] + x[e] sum_n g Bm[n]      gx = dt[e] sum_n g Bm[n]
 *   gA [E, N] = sum over batch and time of grad z dt[e]            gBm [B, T, N] = sum_e g (dt x)[e]
 *   gh0 [B, E, N] = a_0 g_0
 * torch's [E, N] layout (the inner loops run over N). work: 2 E N elements (one batch row's
 * adjoint carry a_{t+1} g_{t+1} and its sum of grad A, added to gA per row: short float32 sums).
 * The per-step gradients are E + E + N elements a step, written in descending t (small next to
 * the [E, N] rows of G and the states read a step, also descending). */
SEL_CORE void FN(sel_states_bwd)(int64_t B, int64_t T, int64_t E, int64_t N, const R *dt, const R *A,
                                 const R *x, const R *Bm, const R *h0, const R *states, const R *G,
                                 R *gdt, R *gA, R *gx, R *gBm, R *gh0, R *work, const R s) {
    const int64_t M = E * N;
    R *carry = work, *gA_row = work + M;
    for (int64_t i = 0; i < M; i++) gA[i] = 0;
    for (int64_t bi = 0; bi < B; bi++) {
        for (int64_t i = 0; i < M; i++) carry[i] = gA_row[i] = 0;
        for (int64_t t = T - 1; t >= 0; t--) {
            const int64_t bt = bi * T + t;
            const R *dtt = dt + bt * E, *xt = x + bt * E, *Bt = Bm + bt * N, *Gt = G + bt * M;
            const R *hp = t ? states + (bt - 1) * M : h0 + bi * M;
            R *gBt = gBm + bt * N;
            for (int64_t n = 0; n < N; n++) gBt[n] = 0;
            for (int64_t e = 0; e < E; e++) {
                const R d = dtt[e], u = d * xt[e], *Ae = A + e * N, *hpe = hp + e * N, *Ge = Gt + e * N;
                R *ce = carry + e * N, *gAe = gA_row + e * N, s_z = 0, s_b = 0;
#pragma omp simd reduction(+ : s_z, s_b)
                for (int64_t n = 0; n < N; n++) {
                    const R ez = EXP(d * Ae[n]);
                    const R g = Ge[n] + ce[n];
                    const R gz = g * hpe[n] * (s * ez);
                    s_z += gz * Ae[n];
                    s_b += g * Bt[n];
                    gAe[n] += gz * d;
                    gBt[n] += g * u;
                    ce[n] = FN(sel_a)(ez, s) * g;
                }
                gdt[bt * E + e] = s_z + s_b * xt[e];
                gx[bt * E + e] = s_b * d;
            }
        }
        memcpy(gh0 + bi * M, carry, M * sizeof(R));
        for (int64_t i = 0; i < M; i++) gA[i] += gA_row[i];
    }
}

CLONES void FN(selective_states_bwd)(int64_t B, int64_t T, int64_t E, int64_t N,
                                         const R *dt, const R *A, const R *x, const R *Bm, const R *h0,
                                         const R *states, const R *G, R *gdt, R *gA, R *gx, R *gBm,
                                         R *gh0, R *work, double scale) {
    /* Mamba's N = 16 as a constant too: its inner loop then compiles to whole vectors, no loop
     * (measured 15% faster at B = 32, T = 256, E = 128; the same results) */
    if (N == 16 && scale == 1) FN(sel_states_bwd)(B, T, E, 16, dt, A, x, Bm, h0, states, G, gdt, gA, gx, gBm, gh0, work, (R)1);
    else if (N == 16) FN(sel_states_bwd)(B, T, E, 16, dt, A, x, Bm, h0, states, G, gdt, gA, gx, gBm, gh0, work, (R)scale);
    else if (scale == 1) FN(sel_states_bwd)(B, T, E, N, dt, A, x, Bm, h0, states, G, gdt, gA, gx, gBm, gh0, work, (R)1);
    else FN(sel_states_bwd)(B, T, E, N, dt, A, x, Bm, h0, states, G, gdt, gA, gx, gBm, gh0, work, (R)scale);
}

/* Every state and the read-out with a shift (selective_states_shifted; forward of a hook_state
 * gradient probe): h_t = a_t h_{t-1} + (b_t + shift_t), y_t[e] = sum_n C_t[n] h_t[e, n], states
 * [B, T, E, N] in torch's layout (A [E, N] not transposed, the inner loops run over N) with h0
 * [B, E, N] contiguous; shift [B, T, E, N]. The products of sel_states, the shift added to b. */
SEL_CORE void FN(sel_shifted)(int64_t B, int64_t T, int64_t E, int64_t N, const R *dt, const R *A,
                              const R *x, const R *Bm, const R *C, const R *h0, const R *shift,
                              R *states, R *y, const R s) {
    const int64_t M = E * N;
    for (int64_t bi = 0; bi < B; bi++) {
        const R *hp = h0 + bi * M;
        for (int64_t t = 0; t < T; t++) {
            const int64_t bt = bi * T + t;
            const R *dtt = dt + bt * E, *xt = x + bt * E, *Bt = Bm + bt * N, *Ct = C + bt * N;
            const R *sh = shift + bt * M;
            R *h = states + bt * M, *yt = y + bt * E;
            for (int64_t e = 0; e < E; e++) {
                const R d = dtt[e], u = d * xt[e], *Ae = A + e * N, *hpe = hp + e * N, *she = sh + e * N;
                R *he = h + e * N, acc = 0;
#pragma omp simd reduction(+ : acc)
                for (int64_t n = 0; n < N; n++) {
                    const R v = FN(sel_a)(EXP(d * Ae[n]), s) * hpe[n] + (u * Bt[n] + she[n]);
                    he[n] = v;
                    acc += Ct[n] * v;
                }
                yt[e] = acc;
            }
            hp = h;
        }
    }
}

CLONES void FN(selective_shifted)(int64_t B, int64_t T, int64_t E, int64_t N, const R *dt,
                                      const R *A, const R *x, const R *Bm, const R *C, const R *h0,
                                      const R *shift, R *states, R *y, double scale) {
    if (scale == 1) FN(sel_shifted)(B, T, E, N, dt, A, x, Bm, C, h0, shift, states, y, (R)1);
    else FN(sel_shifted)(B, T, E, N, dt, A, x, Bm, C, h0, shift, states, y, (R)scale);
}

/* Backward of sel_shifted given the cotangents G of the states [B, T, E, N] and gy of y
 * [B, T, E] (either NULL: zero), reading h_{t-1} back from the states. The adjoint
 *   g_t = G_t + gy_t[e] C_t[n] + a_{t+1} g_{t+1}   (= dL/dh_t, the total derivative of the state)
 * is written to gshift [B, T, E, N] (dL/dshift_t = g_t); with z = dt A, grad z = g_t h_{t-1} s exp(z):
 *   gdt [B, T, E] = sum_n grad z A[e, n] + x[e] sum_n g Bm[n]      gx = dt[e] sum_n g Bm[n]
 *   gA [E, N] = sum over batch and time of grad z dt[e]            gBm [B, T, N] = sum_e g (dt x)[e]
 *   gC [B, T, N] = sum_e gy[e] h_t[e, n]                           gh0 [B, E, N] = a_0 g_0
 * work: 3 E N elements (one batch row's carry a_{t+1} g_{t+1}, its sum of grad A, and a zero
 * row standing in for an absent G). */
SEL_CORE void FN(sel_shifted_bwd)(int64_t B, int64_t T, int64_t E, int64_t N, const R *dt, const R *A,
                                  const R *x, const R *Bm, const R *C, const R *h0, const R *states,
                                  const R *G, const R *gy, R *gdt, R *gA, R *gx, R *gBm, R *gC, R *gh0,
                                  R *gshift, R *work, const R s) {
    const int64_t M = E * N;
    R *carry = work, *gA_row = work + M, *zero = work + 2 * M;
    for (int64_t i = 0; i < M; i++) gA[i] = zero[i] = 0;
    for (int64_t bi = 0; bi < B; bi++) {
        for (int64_t i = 0; i < M; i++) carry[i] = gA_row[i] = 0;
        for (int64_t t = T - 1; t >= 0; t--) {
            const int64_t bt = bi * T + t;
            const R *dtt = dt + bt * E, *xt = x + bt * E, *Bt = Bm + bt * N, *Ct = C + bt * N;
            const R *Gt = G ? G + bt * M : zero, *h = states + bt * M;
            const R *hp = t ? states + (bt - 1) * M : h0 + bi * M;
            R *gBt = gBm + bt * N, *gCt = gC + bt * N, *gst = gshift + bt * M;
            for (int64_t n = 0; n < N; n++) gBt[n] = gCt[n] = 0;
            for (int64_t e = 0; e < E; e++) {
                const R d = dtt[e], u = d * xt[e], gye = gy ? gy[bt * E + e] : 0;
                const R *Ae = A + e * N, *hpe = hp + e * N, *he = h + e * N, *Ge = Gt + e * N;
                R *ce = carry + e * N, *gAe = gA_row + e * N, *gse = gst + e * N, s_z = 0, s_b = 0;
#pragma omp simd reduction(+ : s_z, s_b)
                for (int64_t n = 0; n < N; n++) {
                    const R ez = EXP(d * Ae[n]);
                    const R g = Ge[n] + gye * Ct[n] + ce[n];
                    const R gz = g * hpe[n] * (s * ez);
                    gse[n] = g;
                    s_z += gz * Ae[n];
                    s_b += g * Bt[n];
                    gAe[n] += gz * d;
                    gBt[n] += g * u;
                    gCt[n] += gye * he[n];
                    ce[n] = FN(sel_a)(ez, s) * g;
                }
                gdt[bt * E + e] = s_z + s_b * xt[e];
                gx[bt * E + e] = s_b * d;
            }
        }
        memcpy(gh0 + bi * M, carry, M * sizeof(R));
        for (int64_t i = 0; i < M; i++) gA[i] += gA_row[i];
    }
}

CLONES void FN(selective_shifted_bwd)(int64_t B, int64_t T, int64_t E, int64_t N, const R *dt,
                                          const R *A, const R *x, const R *Bm, const R *C, const R *h0,
                                          const R *states, const R *G, const R *gy, R *gdt, R *gA,
                                          R *gx, R *gBm, R *gC, R *gh0, R *gshift, R *work, double scale) {
    if (N == 16 && scale == 1) FN(sel_shifted_bwd)(B, T, E, 16, dt, A, x, Bm, C, h0, states, G, gy, gdt, gA, gx, gBm, gC, gh0, gshift, work, (R)1);
    else if (N == 16) FN(sel_shifted_bwd)(B, T, E, 16, dt, A, x, Bm, C, h0, states, G, gy, gdt, gA, gx, gBm, gC, gh0, gshift, work, (R)scale);
    else if (scale == 1) FN(sel_shifted_bwd)(B, T, E, N, dt, A, x, Bm, C, h0, states, G, gy, gdt, gA, gx, gBm, gC, gh0, gshift, work, (R)1);
    else FN(sel_shifted_bwd)(B, T, E, N, dt, A, x, Bm, C, h0, states, G, gy, gdt, gA, gx, gBm, gC, gh0, gshift, work, (R)scale);
}

#undef FN
#undef CAT
#undef CAT_
