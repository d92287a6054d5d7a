/* The diagonal scan for one element type; included by kernels.c once per type with
 *   R     the real type (float, double)
 *   CPLX  0: elements are R; 1: elements are (re, im) pairs of R (torch's complex layout)
 *   SFX   the name suffix (f32, f64, c64, c128)
 *
 * Layout (all contiguous, row-major; M = L * N state entries per batch row):
 *   a, b [B, T, M]   h [B, M]   y [B, T, L]   hs [B, T, M]
 *   c [B, T, N] (c_lead_stride = 0: shared over the L lead rows) or [B, T, M] (c_lead_stride = N)
 *   slot [T]: the export slot of step t, or -1; exported [B, K, M]
 *   ckpt [B, ceil(T / every), M]: the state entering steps 0, every, 2 every, ...
 */

#define CAT_(x, y) x##_##y
#define CAT(x, y) CAT_(x, y)
#define FN(name) CAT(name, SFX)
#define E FN(elem)

#if CPLX
typedef struct { R re, im; } E;
static inline E FN(mul)(E x, E y) { E r = {x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re}; return r; }
static inline E FN(add)(E x, E y) { E r = {x.re + y.re, x.im + y.im}; return r; }
static inline E FN(conj)(E x) { E r = {x.re, -x.im}; return r; }
static const E FN(zero) = {0, 0};

/* sum_n c[n] h[n] */
static inline E FN(dot)(const E *c, const E *h, int64_t n) {
    R re = 0, im = 0;
    for (int64_t i = 0; i < n; i++) {
        re += c[i].re * h[i].re - c[i].im * h[i].im;
        im += c[i].re * h[i].im + c[i].im * h[i].re;
    }
    E r = {re, im};
    return r;
}
#else
typedef R E;
static inline E FN(mul)(E x, E y) { return x * y; }
static inline E FN(add)(E x, E y) { return x + y; }
static inline E FN(conj)(E x) { return x; }
static const E FN(zero) = 0;
#endif

/* h_t = a_t h_{t-1} + b_t over n entries, in place. */
static inline void FN(step)(const E *restrict a, const E *restrict b, E *restrict h, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] = FN(add)(FN(mul)(a[i], h[i]), b[i]);
}

/* The same from h_prev into a separate h_next (the backward's recomputation). */
static inline void FN(step_to)(const E *restrict a, const E *restrict b, const E *restrict h_prev,
                               E *restrict h_next, int64_t n) {
    for (int64_t i = 0; i < n; i++) h_next[i] = FN(add)(FN(mul)(a[i], h_prev[i]), b[i]);
}

#if CPLX
/* One lead row: the step, then its read-out sum_n c[n] h[n]. */
static inline E FN(step_dot)(const E *restrict a, const E *restrict b, const E *restrict c,
                             E *restrict h, int64_t n) {
    FN(step)(a, b, h, n);
    return FN(dot)(c, h, n);
}
#else
/* Real: the step and the read-out in one loop; the omp simd reduction (-fopenmp-simd) lets the
 * compiler vectorise the sum with partial sums, which plain C rounding rules would forbid. */
static inline E FN(step_dot)(const E *restrict a, const E *restrict b, const E *restrict c,
                             E *restrict h, int64_t n) {
    R acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; i++) {
        h[i] = a[i] * h[i] + b[i];
        acc += c[i] * h[i];
    }
    return acc;
}
#endif

/* Forward. h holds h_{-1} on entry and h_{T-1} on return. Optional outputs (NULL: skipped):
 * y (needs c), hs (every state), exported (the states at steps with slot[t] >= 0), ckpt. */
CLONES void FN(scan_fwd)(int64_t B, int64_t T, int64_t L, int64_t N,
                  const E *a, const E *b, const E *c, int64_t c_lead_stride,
                  E *h, E *y, E *hs, const int64_t *slot, E *exported, int64_t K,
                  int64_t every, E *ckpt) {
    const int64_t M = L * N, c_row = c_lead_stride ? M : N, n_ckpt = (T + every - 1) / every;
    for (int64_t bi = 0; bi < B; bi++) {
        E *hb = h + bi * M;
        for (int64_t t = 0; t < T; t++) {
            const int64_t bt = bi * T + t;
            const E *at = a + bt * M, *bt_ = b + bt * M;
            if (ckpt && t % every == 0) memcpy(ckpt + (bi * n_ckpt + t / every) * M, hb, M * sizeof(E));
            if (y)
                for (int64_t l = 0; l < L; l++)
                    y[bt * L + l] = FN(step_dot)(at + l * N, bt_ + l * N, c + bt * c_row + l * c_lead_stride,
                                                 hb + l * N, N);
            else
                FN(step)(at, bt_, hb, M);
            if (hs) memcpy(hs + bt * M, hb, M * sizeof(E));
            if (slot && slot[t] >= 0) memcpy(exported + (bi * K + slot[t]) * M, hb, M * sizeof(E));
        }
    }
}

/* The adjoint at one step over m state entries:
 *   g = carry + d1 + d2    (direct terms: read-out or all-states output, export; NULL: absent)
 *   carry = conj(a) g      (g is stored for grads_step).
 * The has_* flags are constants at every call, so each combination compiles to its own
 * branch-free loop. */
static inline void FN(adjoint_core)(const E *restrict a, const E *restrict d1, const E *restrict d2,
                                    E *restrict carry, E *restrict g_out, int64_t m, const int has_d1,
                                    const int has_d2) {
    for (int64_t i = 0; i < m; i++) {
        E g = carry[i];
        if (has_d1) g = FN(add)(g, d1[i]);
        if (has_d2) g = FN(add)(g, d2[i]);
        g_out[i] = g;
        carry[i] = FN(mul)(FN(conj)(a[i]), g);
    }
}

static void FN(adjoint_step)(const E *a, const E *d1, const E *d2, E *carry, E *g, int64_t m) {
    if (d1 && d2) FN(adjoint_core)(a, d1, d2, carry, g, m, 1, 1);
    else if (d1) FN(adjoint_core)(a, d1, NULL, carry, g, m, 1, 0);
    else if (d2) FN(adjoint_core)(a, NULL, d2, carry, g, m, 0, 1);
    else FN(adjoint_core)(a, NULL, NULL, carry, g, m, 0, 0);
}

/* The gradients of one step from its adjoint g: grad b = g, grad a = g conj(h_prev). */
static inline void FN(grads_step)(const E *restrict g, const E *restrict h_prev, E *restrict ga,
                                  E *restrict gb, int64_t m) {
    for (int64_t i = 0; i < m; i++) {
        gb[i] = g[i];
        ga[i] = FN(mul)(g[i], FN(conj)(h_prev[i]));
    }
}

/* dL/dh_t through the read-out: direct [L, N] = gy_l conj(c_l) (c [N] shared when stride 0). */
static void FN(readout_direct)(const E *restrict gy, const E *restrict c, int64_t c_lead_stride,
                               E *restrict direct, int64_t L, int64_t N) {
    for (int64_t l = 0; l < L; l++)
        for (int64_t n = 0; n < N; n++) direct[l * N + n] = FN(mul)(gy[l], FN(conj)(c[l * c_lead_stride + n]));
}

/* grad c_t from one step's states h [L, N] and read-out cotangents gy [L]: gc [N] = sum_l gy_l
 * conj(h_l) when c is shared over the lead rows, else gc [L, N] = gy_l conj(h_l). */
static void FN(readout_grad)(const E *restrict gy, const E *restrict h, E *restrict gc, int64_t L,
                             int64_t N, int shared) {
    if (shared) {
        for (int64_t n = 0; n < N; n++) gc[n] = FN(zero);
        for (int64_t l = 0; l < L; l++)
            for (int64_t n = 0; n < N; n++) gc[n] = FN(add)(gc[n], FN(mul)(gy[l], FN(conj)(h[l * N + n])));
    } else {
        for (int64_t l = 0; l < L; l++)
            for (int64_t n = 0; n < N; n++) gc[l * N + n] = FN(mul)(gy[l], FN(conj)(h[l * N + n]));
    }
}

/* Backward of scan_fwd from its checkpoints: the reverse adjoint
 *   g_t = dL/dh_t (direct: read-out, all-states output, final state, exports) + conj(a_{t+1}) g_{t+1}
 *   grad a_t = g_t conj(h_{t-1}), grad b_t = g_t, grad h_{-1} = conj(a_0) g_0,
 *   grad c_t = gy_t conj(h_t) (summed over the lead rows when c is shared).
 * gy: [B, T, L] (with c) or [B, T, M] (without), or NULL; gfinal [B, M] or NULL; gexp [B, K, M]
 * with slot, or NULL. Outputs ga, gb [B, T, M], gh0 [B, M], gc (c's shape; needs c and gy) or
 * NULL. work: scratch of (2 min(every, T) + 1) * M elements: the states of one checkpoint span,
 * recomputed from its checkpoint, and the span's adjoints stay in cache while the adjoint walks
 * back over the span; then a forward walk writes the span's gradients, so every gradient tensor
 * is written in ascending blocks of one span (written step by step in reverse, the same stores
 * took twice as long here: the store stream is what bounds this backward); last, one step's
 * dL/dh through the read-out. */
CLONES void FN(scan_bwd)(int64_t B, int64_t T, int64_t L, int64_t N,
                  const E *a, const E *b, const E *c, int64_t c_lead_stride,
                  const E *ckpt, int64_t every,
                  const E *gy, const E *gfinal, const int64_t *slot, const E *gexp, int64_t K,
                  E *ga, E *gb, E *gc, E *gh0, E *work) {
    const int64_t M = L * N, c_row = c_lead_stride ? M : N, n_ckpt = (T + every - 1) / every;
    const int64_t span = every < T ? every : T;
    E *adj = work + span * M, *direct = adj + span * M;
    for (int64_t bi = 0; bi < B; bi++) {
        E *carry = gh0 + bi * M; /* conj(a_{t+1}) g_{t+1}; starts as dL/dh_{T-1} from the final state */
        for (int64_t i = 0; i < M; i++) carry[i] = gfinal ? gfinal[bi * M + i] : FN(zero);
        for (int64_t k = n_ckpt - 1; k >= 0; k--) {
            const int64_t t0 = k * every, t1 = t0 + every < T ? t0 + every : T;
            const E *start = ckpt + (bi * n_ckpt + k) * M; /* h_{t0 - 1} */
            for (int64_t t = t0; t < t1; t++) { /* work[t - t0] = h_t */
                E *ht = work + (t - t0) * M;
                FN(step_to)(a + (bi * T + t) * M, b + (bi * T + t) * M, t > t0 ? ht - M : start, ht, M);
            }
            for (int64_t t = t1 - 1; t >= t0; t--) { /* adj[t - t0] = g_t */
                const int64_t bt = bi * T + t;
                const E *ge = gexp && slot[t] >= 0 ? gexp + (bi * K + slot[t]) * M : NULL;
                const E *d1 = NULL; /* dL/dh_t through the output */
                if (gy && c) {
                    FN(readout_direct)(gy + bt * L, c + bt * c_row, c_lead_stride, direct, L, N);
                    d1 = direct;
                } else if (gy) {
                    d1 = gy + bt * M;
                }
                FN(adjoint_step)(a + bt * M, d1, ge, carry, adj + (t - t0) * M, M);
            }
            for (int64_t t = t0; t < t1; t++) {
                const int64_t bt = bi * T + t;
                const E *ht = work + (t - t0) * M, *hprev = t > t0 ? ht - M : start;
                FN(grads_step)(adj + (t - t0) * M, hprev, ga + bt * M, gb + bt * M, M);
                if (gc) FN(readout_grad)(gy + bt * L, ht, gc + bt * c_row, L, N, !c_lead_stride);
            }
        }
    }
}

#undef E
#undef FN
#undef CAT
#undef CAT_
