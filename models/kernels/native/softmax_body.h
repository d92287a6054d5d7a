/* Causal attention scores and pattern in one pass (models/kernels/native/softmax.py), one element
 * type R with suffix SFX and EXP its exp. Per block (a batch row and head) q [Tq, d] and the keys
 * transposed, kt [d, Tk] (contiguous); query s is the last Tq of Tk positions, keys
 * t <= s + Tk - Tq allowed:
 *     scores[s, t]  = (q_s . k_t) / scale for allowed t, -inf after the query
 *     pattern[s, t] = exp(scores[s, t] - max) / sum_allowed exp(scores[s, u] - max), 0 after it
 * The products only over the allowed keys (the lower triangle: half of q k^T), SM_BLOCK keys at
 * a time accumulated in registers over d; exp only there too. */

#define SM_CAT_(a, b) a##_##b
#define SM_CAT(a, b) SM_CAT_(a, b)
#define SM_BLOCK 64

CLONES void SM_CAT(causal_softmax, SFX)(int64_t blocks, int64_t n_queries, int64_t n_keys, int64_t d_head,
                                        double scale_d, const R *restrict q, const R *restrict kt,
                                        R *restrict scores, R *restrict pattern) {
    const R minus_inf = -(R)INFINITY, scale = (R)scale_d;
    for (int64_t blk = 0; blk < blocks; blk++) {
        const R *kb = kt + blk * d_head * n_keys;
        for (int64_t s = 0; s < n_queries; s++) {
            const R *qs = q + (blk * n_queries + s) * d_head;
            R *x = scores + (blk * n_queries + s) * n_keys, *p = pattern + (blk * n_queries + s) * n_keys;
            const int64_t allowed = s + n_keys - n_queries + 1; /* keys 0 .. allowed - 1 */
            int64_t t0 = 0;
            for (; t0 + SM_BLOCK <= allowed; t0 += SM_BLOCK) {
                R acc[SM_BLOCK];
                for (int64_t j = 0; j < SM_BLOCK; j++) acc[j] = 0;
                for (int64_t e = 0; e < d_head; e++) {
                    const R qe = qs[e], *ke = kb + e * n_keys + t0;
#pragma omp simd
                    for (int64_t j = 0; j < SM_BLOCK; j++) acc[j] += qe * ke[j];
                }
                for (int64_t j = 0; j < SM_BLOCK; j++) x[t0 + j] = acc[j] / scale;
            }
            if (t0 < allowed) {
                const int64_t width = allowed - t0;
                for (int64_t j = 0; j < width; j++) x[t0 + j] = 0;
                for (int64_t e = 0; e < d_head; e++) {
                    const R qe = qs[e], *ke = kb + e * n_keys + t0;
#pragma omp simd
                    for (int64_t j = 0; j < width; j++) x[t0 + j] += qe * ke[j];
                }
                for (int64_t j = 0; j < width; j++) x[t0 + j] /= scale;
            }
            R top = minus_inf;
#pragma omp simd reduction(max : top)
            for (int64_t t = 0; t < allowed; t++) top = x[t] > top ? x[t] : top;
            R total = 0;
#pragma omp simd reduction(+ : total)
            for (int64_t t = 0; t < allowed; t++) {
                p[t] = EXP(x[t] - top);
                total += p[t];
            }
            const R inv = 1 / total;
#pragma omp simd
            for (int64_t t = 0; t < allowed; t++) p[t] *= inv;
            for (int64_t t = allowed; t < n_keys; t++) x[t] = minus_inf, p[t] = 0;
        }
    }
}

#undef SM_BLOCK
#undef SM_CAT
#undef SM_CAT_
