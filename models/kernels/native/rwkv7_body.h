/* The RWKV-7 forward for one real type; included by kernels.c with R (float, double) and SFX
 * (f32, f64). Per batch row b and head h, with the state S [V, K] (values x keys):
 *     S_t = S_{t-1} (diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T,    o_t = S_t r_t
 * Layout (contiguous): r, w, k, a, b [B, T, H, K], v [B, T, H, V], S [B, H, V, K] (the initial
 * state on entry, the final state on return), o [B, T, H, V]; exported [B, T, H, V, K] every
 * state (NULL: none); shift [B, T, H, V, K] added to each step's state (NULL: none), then where
 * pin_mask[b, t] (uint8 [B, T]; NULL: none) the state becomes pins[b, t] [H, V, K], and o_t and
 * S_t a_{t+1} are read from the result. work: H * (K * V + 2 V + K) elements.
 *
 * The loop keeps the transpose St [K, V] so that every product is an axpy along V (no horizontal
 * sums): per key row i, row = e^{w_i} row + b_i m + k_i v (m = S_{t-1} a_t, the removed values);
 * o_t += r_i row; and the next step's m += a_{t+1, i} row, all in one pass over the state per
 * step. Every clone (CLONES) does the same operations in the same order (no contraction). */

#define WCAT_(x, y) x##_##y
#define WCAT(x, y) WCAT_(x, y)
#define WFN(name) WCAT(name, SFX)

/* transpose_f32 / transpose_f64 [rows, cols] -> [cols, rows]: delta_body.h's, included before this */
#define WTRANSPOSE WFN(transpose)

/* One step of one head: St [K, V]; m = S_{t-1} a_t on entry, S_t a_{t+1} on return (an NULL: the
 * last step, m is left alone); the step's decay e^{w} in dec [K]. */
static INLINE void WFN(rwkv7_head_step)(R *restrict St, R *restrict m, R *restrict next, const R *dec,
                                        const R *kt, const R *vt, const R *bt, const R *rt, const R *an,
                                        R *restrict ot, int64_t K, int64_t V) {
    for (int64_t j = 0; j < V; j++) {
        ot[j] = 0;
        next[j] = 0;
    }
    for (int64_t i = 0; i < K; i++) {
        R *restrict row = St + i * V;
        const R di = dec[i], bi = bt[i], ki = kt[i], ri = rt[i], ai = an ? an[i] : 0;
#pragma omp simd
        for (int64_t j = 0; j < V; j++) {
            const R s = (di * row[j] + bi * m[j]) + ki * vt[j];
            row[j] = s;
            ot[j] += ri * s;
            next[j] += ai * s;
        }
    }
    for (int64_t j = 0; j < V; j++) m[j] = next[j];
}

/* After a step: St [K, V] += shift [V, K] (NULL: none), then St = pin [V, K] (NULL: none); o_t and
 * m = S_t a_{t+1} (an NULL: left alone) read again from the result. */
static void WFN(rwkv7_replace)(R *restrict St, R *restrict m, const R *shift, const R *pin, const R *rt,
                               const R *an, R *restrict ot, int64_t K, int64_t V) {
    if (shift)
        for (int64_t i = 0; i < K; i++)
            for (int64_t j = 0; j < V; j++) St[i * V + j] += shift[j * K + i];
    if (pin) WTRANSPOSE(pin, St, V, K);
    for (int64_t j = 0; j < V; j++) {
        ot[j] = 0;
        if (an) m[j] = 0;
    }
    for (int64_t i = 0; i < K; i++)
        for (int64_t j = 0; j < V; j++) {
            ot[j] += rt[i] * St[i * V + j];
            if (an) m[j] += an[i] * St[i * V + j];
        }
}

CLONES void WFN(rwkv7_fwd)(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, const R *r, const R *w,
                           const R *k, const R *v, const R *a, const R *b, R *S, R *o, R *exported,
                           const R *shift, const uint8_t *pin_mask, const R *pins, R *work) {
    /* per head: St [K, V], m [V], next [V], dec [K] */
    const int64_t per_head = K * V + 2 * V + K;
    for (int64_t bi = 0; bi < B; bi++) {
        for (int64_t h = 0; h < H; h++) {
            R *St = work + h * per_head, *m = St + K * V;
            WTRANSPOSE(S + (bi * H + h) * V * K, St, V, K);
            const R *a0 = a + (bi * T * H + h) * K;
            for (int64_t j = 0; j < V; j++) m[j] = 0;
            for (int64_t i = 0; i < K; i++)
                for (int64_t j = 0; j < V; j++) m[j] += a0[i] * St[i * V + j]; /* m_0 = S_{-1} a_0 */
        }
        for (int64_t t = 0; t < T; t++) {
            for (int64_t h = 0; h < H; h++) {
                R *St = work + h * per_head, *m = St + K * V, *next = m + V, *dec = next + V;
                const int64_t at = ((bi * T + t) * H + h) * K, vt = ((bi * T + t) * H + h) * V;
                for (int64_t i = 0; i < K; i++) dec[i] = (R)exp(w[at + i]);
                const R *an = t + 1 < T ? a + at + H * K : NULL;
                WFN(rwkv7_head_step)(St, m, next, dec, k + at, v + vt, b + at, r + at, an, o + vt, K, V);
                const int64_t sv = ((bi * T + t) * H + h) * V * K; /* step t, head h in [B, T, H, V, K] */
                const R *pin = pin_mask && pin_mask[bi * T + t] ? pins + sv : NULL;
                if (shift || pin) WFN(rwkv7_replace)(St, m, shift ? shift + sv : NULL, pin, r + at, an, o + vt, K, V);
                if (exported) WTRANSPOSE(St, exported + sv, K, V);
            }
        }
        for (int64_t h = 0; h < H; h++) WTRANSPOSE(work + h * per_head, S + (bi * H + h) * V * K, K, V);
    }
}

#undef WTRANSPOSE
#undef WFN
#undef WCAT
#undef WCAT_
