/* Causal attention scores and pattern in one pass (models/kernels/native/softmax.py), one element
 * type R with suffix SFX and EXP its exp. For each of `rows` rows of a [Tq, Tk] block (query s,
 * the last Tq of Tk positions: keys t <= s + Tk - Tq allowed), in place over the raw products
 * q_s . k_t:
 *     scores_t = product_t / scale (allowed), -inf (after the query)
 *     pattern_t = exp(scores_t - max) / sum_allowed exp(scores_u - max), 0 after the query
 * exp only over the allowed keys (half the block, which softmax over the masked row also computes). */

#define SM_CAT_(a, b) a##_##b
#define SM_CAT(a, b) SM_CAT_(a, b)

CLONES void SM_CAT(causal_softmax, SFX)(int64_t blocks, int64_t n_queries, int64_t n_keys, double scale_d,
                                        R *restrict scores, R *restrict pattern) {
    const R minus_inf = -(R)INFINITY, scale = (R)scale_d;
    for (int64_t blk = 0; blk < blocks; blk++) {
        for (int64_t s = 0; s < n_queries; s++) {
            R *x = scores + (blk * n_queries + s) * n_keys, *p = pattern + (blk * n_queries + s) * n_keys;
            const int64_t allowed = s + n_keys - n_queries + 1; /* keys 0 .. allowed - 1 */
            R top = minus_inf;
#pragma omp simd reduction(max : top)
            for (int64_t t = 0; t < allowed; t++) {
                x[t] = x[t] / scale;
                top = x[t] > top ? x[t] : top;
            }
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

#undef SM_CAT
#undef SM_CAT_
