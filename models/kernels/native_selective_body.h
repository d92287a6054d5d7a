/* The selective scan (Mamba's diagonal scan with its discretisation fused in) for one real type;
 * included by native_scan.c once per type with
 *   R     the real type (float, double)
 *   SFX   the name suffix (f32, f64)
 *   EXP   the exponential in R (exp_f32 of native_scan.c for float, libm exp for double)
 *
 *   a_t[e, n] = exp(dt_t[e] A[e, n]),   b_t[e, n] = (dt_t[e] x_t[e]) Bm_t[n]
 *   h_t = a_t h_{t-1} + b_t,            y_t[e] = sum_n C_t[n] h_t[e, n]
 *
 * a and b are formed per step in registers; nothing [B, T, E, N] is read or written.
 * Layout (all contiguous, row-major; M = E * N state entries per batch row):
 *   dt, x, y [B, T, E]   A [E, N]   Bm, C [B, T, N]   h [B, E, N]
 *   ckpt [B, ceil(T / every), E, N]: the state entering steps 0, every, 2 every, ...
 * Products are associated as in the unfused torch path (exp(dt * A); (dt * x) * Bm; a * h + b),
 * so states agree with it to the rounding of the exponential.
 */

#define CAT_(x, y) x##_##y
#define CAT(x, y) CAT_(x, y)
#define FN(name) CAT(name, SFX)

/* One step of one batch row: h [E, N] <- a_t h + b_t in place; y [E] its read-out. */
static inline void FN(sel_step)(const R *restrict dt, const R *restrict x, const R *restrict A,
                                const R *restrict Bm, const R *restrict C, R *restrict h,
                                R *restrict y, int64_t E, int64_t N) {
    for (int64_t e = 0; e < E; e++) {
        const R d = dt[e], dx = d * x[e];
        const R *Ae = A + e * N;
        R *he = h + e * N, acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t n = 0; n < N; n++) {
            const R a = EXP(d * Ae[n]);
            he[n] = a * he[n] + dx * Bm[n];
            acc += C[n] * he[n];
        }
        y[e] = acc;
    }
}

/* The same step from h_prev into h_next [E, N], keeping a_t [E, N] (the backward's recomputation;
 * the states are the forward's bit for bit). */
static inline void FN(sel_step_to)(const R *restrict dt, const R *restrict x, const R *restrict A,
                                   const R *restrict Bm, const R *restrict h_prev, R *restrict h_next,
                                   R *restrict a_out, int64_t E, int64_t N) {
    for (int64_t e = 0; e < E; e++) {
        const R d = dt[e], dx = d * x[e];
        const R *Ae = A + e * N, *hp = h_prev + e * N;
        R *hn = h_next + e * N, *ae = a_out + e * N;
#pragma omp simd
        for (int64_t n = 0; n < N; n++) {
            const R a = EXP(d * Ae[n]);
            ae[n] = a;
            hn[n] = a * hp[n] + dx * Bm[n];
        }
    }
}

/* The adjoint at one step t of one batch row. carry [E, N] holds a_{t+1} g_{t+1} on entry and
 * a_t g_t on return, where g_t = dL/dh_t = gy_t[e] C_t[n] + a_{t+1} g_{t+1}. With
 * z = dt A (so grad z = g_t h_{t-1} a_t) and grad b_t = g_t:
 *   gdt [E] = sum_n grad z A[e, n] + x[e] sum_n g Bm[n]      gx [E] = dt[e] sum_n g Bm[n]
 *   gA_acc [E, N] += grad z dt[e]                              gBm [N] = sum_e g (dt x)[e]
 *   gC [N] = sum_e gy[e] h_t[e, n]
 * (a_t, h_prev, h_t [E, N]: the recomputed step; gy, dt, x [E]; Bm, C [N]) */
static inline void FN(sel_adjoint)(const R *restrict gy, const R *restrict dt, const R *restrict x,
                                   const R *restrict A, const R *restrict Bm, const R *restrict C,
                                   const R *restrict a, const R *restrict h_prev, const R *restrict h,
                                   R *restrict carry, R *restrict gA_acc, R *restrict gdt,
                                   R *restrict gx, R *restrict gBm, R *restrict gC, int64_t E, int64_t N) {
    for (int64_t n = 0; n < N; n++) gBm[n] = gC[n] = 0;
    for (int64_t e = 0; e < E; e++) {
        const R gye = gy[e], d = dt[e], dx = d * x[e];
        const R *Ae = A + e * N, *ae = a + e * N, *hp = h_prev + e * N, *he = h + e * N;
        R *ce = carry + e * N, *gAe = gA_acc + e * N, s_z = 0, s_b = 0;
#pragma omp simd reduction(+ : s_z, s_b)
        for (int64_t n = 0; n < N; n++) {
            const R g = ce[n] + gye * C[n];
            const R gz = g * hp[n] * ae[n];
            s_z += gz * Ae[n];
            s_b += g * Bm[n];
            gAe[n] += gz * d;
            gBm[n] += g * dx;
            gC[n] += gye * he[n];
            ce[n] = ae[n] * g;
        }
        gdt[e] = s_z + s_b * x[e];
        gx[e] = s_b * d;
    }
}

/* Forward. h holds h_{-1} on entry and h_{T-1} on return; y [B, T, E]; ckpt or NULL. */
SEL_CLONES void FN(selective_fwd)(int64_t B, int64_t T, int64_t E, int64_t N,
                                  const R *dt, const R *A, const R *x, const R *Bm, const R *C,
                                  R *h, R *y, int64_t every, R *ckpt) {
    const int64_t M = E * N, n_ckpt = (T + every - 1) / every;
    for (int64_t bi = 0; bi < B; bi++) {
        R *hb = h + bi * M;
        for (int64_t t = 0; t < T; t++) {
            const int64_t bt = bi * T + t;
            if (ckpt && t % every == 0) memcpy(ckpt + (bi * n_ckpt + t / every) * M, hb, M * sizeof(R));
            FN(sel_step)(dt + bt * E, x + bt * E, A, Bm + bt * N, C + bt * N, hb, y + bt * E, E, N);
        }
    }
}

/* Backward of selective_fwd from its checkpoints given gy [B, T, E]: gdt, gx [B, T, E],
 * gA [E, N] (summed over batch and time), gBm, gC [B, T, N], gh0 [B, E, N] = a_0 g_0.
 * work: (2 min(every, T) + 1) M elements: the states and transitions of one checkpoint span,
 * recomputed from its checkpoint, stay in cache while the adjoint walks back over them; then
 * one batch row's sum of grad A (added to gA per row, which keeps float32 sums short). */
SEL_CLONES void FN(selective_bwd)(int64_t B, int64_t T, int64_t E, int64_t N,
                                  const R *dt, const R *A, const R *x, const R *Bm, const R *C,
                                  const R *ckpt, int64_t every, const R *gy,
                                  R *gdt, R *gA, R *gx, R *gBm, R *gC, R *gh0, R *work) {
    const int64_t M = E * N, n_ckpt = (T + every - 1) / every, span = every < T ? every : T;
    R *hs = work, *as = work + span * M, *gA_row = work + 2 * span * M;
    for (int64_t i = 0; i < M; i++) gA[i] = 0;
    for (int64_t bi = 0; bi < B; bi++) {
        R *carry = gh0 + bi * M; /* a_{t+1} g_{t+1}; zero after the last step */
        for (int64_t i = 0; i < M; i++) carry[i] = gA_row[i] = 0;
        for (int64_t k = n_ckpt - 1; k >= 0; k--) {
            const int64_t t0 = k * every, t1 = t0 + every < T ? t0 + every : T;
            const R *start = ckpt + (bi * n_ckpt + k) * M; /* h_{t0 - 1} */
            for (int64_t t = t0; t < t1; t++) { /* hs[t - t0] = h_t, as[t - t0] = a_t */
                const int64_t bt = bi * T + t, j = t - t0;
                FN(sel_step_to)(dt + bt * E, x + bt * E, A, Bm + bt * N, j ? hs + (j - 1) * M : start,
                                hs + j * M, as + j * M, E, N);
            }
            for (int64_t t = t1 - 1; t >= t0; t--) {
                const int64_t bt = bi * T + t, j = t - t0;
                FN(sel_adjoint)(gy + bt * E, dt + bt * E, x + bt * E, A, Bm + bt * N, C + bt * N,
                                as + j * M, j ? hs + (j - 1) * M : start, hs + j * M, carry, gA_row,
                                gdt + bt * E, gx + bt * E, gBm + bt * N, gC + bt * N, E, N);
            }
        }
        for (int64_t i = 0; i < M; i++) gA[i] += gA_row[i];
    }
}

#undef FN
#undef CAT
#undef CAT_
