/* The delta-rule forward for one real type; included by kernels.c with R (float, double) and
 * SFX (f32, f64). Per batch row b and head h, with the state S [V, K] (values x keys) and the
 * decay a_t = exp(g_t) (g NULL: a_t = 1, bit for bit the undecayed loop since a * x = x for a = 1):
 *     S_t = a_t S_{t-1} + beta_t (v_t - a_t S_{t-1} k_t) k_t^T,    o_t = S_t q_t
 * or with a channel-wise decay (gk [B, T, H, K] not NULL, g NULL) a_t [K] per key column,
 * D_t = S_{t-1} Diag(a_t):
 *     S_t = D_t + beta_t (v_t - D_t k_t) k_t^T,                   o_t = S_t q_t
 * Layout (contiguous): q, k [B, T, H, K], v [B, T, H, V], beta and g [B, T, H], S [B, H, V, K] (the
 * initial state on entry, the final state on return), o [B, T, H, V]; slot [T] (export slot of
 * step t or -1) and exported [B, n_export, H, V, K]. work: H * (K * V + 2 * V + 2 * K) elements.
 * With gk the recall r = D_t k_t = S_{t-1} (a_t * k_t) runs in the previous step's pass on the
 * decayed next key a_{t+1} * k_{t+1} (per head ak [K] holds a_t, kn [K] that key) and each key row
 * i of St is scaled by its own a_i.
 *
 * The loop keeps the transpose St [K, V] in work so that every product is an axpy along V (no
 * horizontal sums): per key index i, St[i] += k_t[i] d_t; o_t += q_t[i] St[i]; and the next
 * step's recall r_{t+1} += k_{t+1}[i] St[i], all in one pass over the state per step.
 * The loop is compute-bound, so on x86-64 with glibc it is also compiled for AVX-512 and AVX2 and
 * picked at load time (CLONES, kernels.c); every lane does the same operations in the same order
 * (no contraction into fused multiply-adds here), so all versions give the same bits. */

#define DCAT_(x, y) x##_##y
#define DCAT(x, y) DCAT_(x, y)
#define DFN(name) DCAT(name, SFX)

static void DFN(transpose)(const R *restrict src, R *restrict dst, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

/* One step on four key rows St[i..i+3] (each V long): row = a_i row + k_i d (ar: the four rows'
 * decays, all a_t for a decay per head); o += q_i row; r += kn_i row (kn NULL: the last step, no
 * next recall). */
static inline void DFN(rows4)(R *restrict St, const R *ar, const R *kt, const R *qt, const R *kn, const R *restrict d,
                              R *restrict o, R *restrict r, int64_t V) {
    R *restrict s0 = St, *restrict s1 = St + V, *restrict s2 = St + 2 * V, *restrict s3 = St + 3 * V;
    const R k0 = kt[0], k1 = kt[1], k2 = kt[2], k3 = kt[3], q0 = qt[0], q1 = qt[1], q2 = qt[2], q3 = qt[3];
    const R e0 = ar[0], e1 = ar[1], e2 = ar[2], e3 = ar[3];
    if (kn) {
        const R n0 = kn[0], n1 = kn[1], n2 = kn[2], n3 = kn[3];
        for (int64_t j = 0; j < V; j++) {
            const R a0 = e0 * s0[j] + k0 * d[j], a1 = e1 * s1[j] + k1 * d[j], a2 = e2 * s2[j] + k2 * d[j], a3 = e3 * s3[j] + k3 * d[j];
            s0[j] = a0; s1[j] = a1; s2[j] = a2; s3[j] = a3;
            o[j] += ((q0 * a0 + q1 * a1) + q2 * a2) + q3 * a3;
            r[j] += ((n0 * a0 + n1 * a1) + n2 * a2) + n3 * a3;
        }
    } else {
        for (int64_t j = 0; j < V; j++) {
            const R a0 = e0 * s0[j] + k0 * d[j], a1 = e1 * s1[j] + k1 * d[j], a2 = e2 * s2[j] + k2 * d[j], a3 = e3 * s3[j] + k3 * d[j];
            s0[j] = a0; s1[j] = a1; s2[j] = a2; s3[j] = a3;
            o[j] += ((q0 * a0 + q1 * a1) + q2 * a2) + q3 * a3;
        }
    }
}

static inline void DFN(rows1)(R *restrict row, R a, R ki, R qi, R ni, const R *restrict d, R *restrict o,
                              R *restrict r, int64_t V) {
    for (int64_t j = 0; j < V; j++) {
        row[j] = a * row[j] + ki * d[j];
        o[j] += qi * row[j];
        r[j] += ni * row[j];
    }
}

/* One step of one head (r = S_{t-1} k_t on entry; with ak, r = S_{t-1} (a_t * k_t) and at = 1):
 * d = beta (v - at r); St = Diag(a) St + k d^T (key row i scaled by ak[i], or at without ak);
 * o = St^T q; r = St^T k_next. */
static INLINE void DFN(head_step)(R *restrict St, R *restrict r, R *restrict d, const R *kt, const R *qt,
                                  const R *vt, const R *kn, R at, const R *ak, R bt, R *restrict ot, int64_t K,
                                  int64_t V) {
    const R same[4] = {at, at, at, at};
    for (int64_t j = 0; j < V; j++) {
        d[j] = bt * (vt[j] - at * r[j]);
        ot[j] = 0;
        r[j] = 0;
    }
    int64_t i = 0;
    for (; i + 4 <= K; i += 4) /* four key rows per pass over o and r */
        DFN(rows4)(St + i * V, ak ? ak + i : same, kt + i, qt + i, kn ? kn + i : NULL, d, ot, r, V);
    for (; i < K; i++) DFN(rows1)(St + i * V, ak ? ak[i] : at, kt[i], qt[i], kn ? kn[i] : 0, d, ot, r, V);
}

/* With a channel-wise decay: dst = exp(gk) [K] (kk NULL), or exp(gk) * kk. */
static inline void DFN(decayed)(R *restrict dst, const R *gk, const R *kk, int64_t K) {
    for (int64_t i = 0; i < K; i++) dst[i] = kk ? (R)exp(gk[i]) * kk[i] : (R)exp(gk[i]);
}

CLONES void DFN(delta_fwd)(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V,
                    const R *q, const R *k, const R *v, const R *beta, const R *g, const R *gk, R *S, R *o,
                    const int64_t *slot, R *exported, int64_t n_export, R *work) {
    /* per head: St [K, V], r [V], d [V], ak [K], kn [K]; all heads of one batch row advance
     * together, so q, k, v and o are walked once, in memory order */
    const int64_t per_head = K * V + 2 * V + 2 * K;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            R *St = work + h * per_head, *r = St + K * V, *kn = r + 2 * V + K;
            DFN(transpose)(S + (b * H + h) * V * K, St, V, K);
            const R *k0 = k + (b * T * H + h) * K;
            if (gk) { DFN(decayed)(kn, gk + (b * T * H + h) * K, k0, K); k0 = kn; } /* a_0 * k_0 */
            for (int64_t j = 0; j < V; j++) r[j] = 0;
            for (int64_t i = 0; i < K; i++)
                for (int64_t j = 0; j < V; j++) r[j] += k0[i] * St[i * V + j]; /* r_0 = S_{-1} k_0 */
        }
        for (int64_t t = 0; t < T; t++) {
            for (int64_t h = 0; h < H; h++) {
                const int64_t bth = (b * T + t) * H + h;
                R *St = work + h * per_head, *r = St + K * V, *d = r + V, *ak = d + V, *kn = ak + K;
                const R *next = t + 1 < T ? k + (bth + H) * K : NULL;
                if (gk) {
                    DFN(decayed)(ak, gk + bth * K, NULL, K);
                    if (next) { DFN(decayed)(kn, gk + (bth + H) * K, next, K); next = kn; }
                }
                DFN(head_step)(St, r, d, k + bth * K, q + bth * K, v + bth * V, next,
                               g ? exp(g[bth]) : (R)1, gk ? ak : NULL, beta[bth], o + bth * V, K, V);
                if (slot && slot[t] >= 0)
                    DFN(transpose)(St, exported + ((b * n_export + slot[t]) * H + h) * V * K, K, V);
            }
        }
        for (int64_t h = 0; h < H; h++) DFN(transpose)(work + h * per_head, S + (b * H + h) * V * K, K, V);
    }
}

#undef DFN
#undef DCAT
#undef DCAT_
