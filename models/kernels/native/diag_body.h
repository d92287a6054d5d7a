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

/* The forward's arguments (scan_fwd's), for the threads of one call. */
struct FN(fwd_args) {
    int64_t B, T, L, N;
    const E *a, *b, *c;
    int64_t c_lead_stride;
    E *h, *y, *hs;
    const int64_t *slot;
    E *exported;
    int64_t K, every;
    E *ckpt;
    int64_t blocks; /* channel blocks per batch row: unit u is row u / blocks, block u % blocks */
};

/* The forward over units [u0, u1): for each, its batch row's lead rows [l0, l1) through all T
 * steps (the m = (l1 - l0) N entries at offset o = l0 N of every [M] row). */
CLONES static void FN(scan_fwd_units)(const struct FN(fwd_args) *p, int64_t u0, int64_t u1) {
    const int64_t T = p->T, L = p->L, N = p->N, M = L * N, K = p->K, every = p->every;
    const int64_t c_lead_stride = p->c_lead_stride, c_row = c_lead_stride ? M : N, n_ckpt = (T + every - 1) / every;
    const E *a = p->a, *b = p->b, *c = p->c;
    E *y = p->y, *hs = p->hs, *exported = p->exported, *ckpt = p->ckpt;
    const int64_t *slot = p->slot;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t bi = u / p->blocks, blk = u % p->blocks;
        const int64_t l0 = L * blk / p->blocks, l1 = L * (blk + 1) / p->blocks, o = l0 * N, m = (l1 - l0) * N;
        E *hb = p->h + bi * M;
        for (int64_t t = 0; t < T; t++) {
            const int64_t bt = bi * T + t;
            const E *at = a + bt * M, *bt_ = b + bt * M;
            if (ckpt && t % every == 0) memcpy(ckpt + (bi * n_ckpt + t / every) * M + o, hb + o, m * sizeof(E));
            if (y)
                for (int64_t l = l0; l < l1; l++)
                    y[bt * L + l] = FN(step_dot)(at + l * N, bt_ + l * N, c + bt * c_row + l * c_lead_stride,
                                                 hb + l * N, N);
            else
                FN(step)(at + o, bt_ + o, hb + o, m);
            if (hs) memcpy(hs + bt * M + o, hb + o, m * sizeof(E));
            if (slot && slot[t] >= 0) memcpy(exported + (bi * K + slot[t]) * M + o, hb + o, m * sizeof(E));
        }
    }
}

static void FN(scan_fwd_range)(void *p, int64_t k, int64_t u0, int64_t u1) {
    (void)k;
    FN(scan_fwd_units)((const struct FN(fwd_args) *)p, u0, u1);
}

/* Forward. h holds h_{-1} on entry and h_{T-1} on return. Optional outputs (NULL: skipped):
 * y (needs c), hs (every state), exported (the states at steps with slot[t] >= 0), ckpt.
 * threads: how many threads may share the B rows x channel blocks (threads.h; 1: the caller's). */
void FN(scan_fwd)(int64_t B, int64_t T, int64_t L, int64_t N,
                  const E *a, const E *b, const E *c, int64_t c_lead_stride,
                  E *h, E *y, E *hs, const int64_t *slot, E *exported, int64_t K,
                  int64_t every, E *ckpt, int64_t threads) {
    struct FN(fwd_args) p = {B, T, L, N, a, b, c, c_lead_stride, h, y, hs, slot, exported, K, every, ckpt,
                             channel_blocks(threads, B, L)};
    parallel_ranges(threads, B * p.blocks, FN(scan_fwd_range), &p);
}

/* The adjoint at one step over m state entries:
 *   g = carry + d1 + d2    (direct terms: read-out or all-states output, export; NULL: absent)
 *   carry = conj(a) g      (g is stored: the span's adjoints).
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

static INLINE void FN(adjoint_step)(const E *a, const E *d1, const E *d2, E *carry, E *g, int64_t m) {
    if (d1 && d2) FN(adjoint_core)(a, d1, d2, carry, g, m, 1, 1);
    else if (d1) FN(adjoint_core)(a, d1, NULL, carry, g, m, 1, 0);
    else if (d2) FN(adjoint_core)(a, NULL, d2, carry, g, m, 0, 1);
    else FN(adjoint_core)(a, NULL, NULL, carry, g, m, 0, 0);
}

/* One step's adjoint through the read-out, one pass over its [L, N] entries:
 *   g = carry + gy_l conj(c_l[n]) (+ ge: an export's cotangent)   stored in g_out,
 *   carry = conj(a) g,
 * and (want_gc) the step's grad c: gc [N] = sum_l gy_l conj(h_l) when c is shared over the lead
 * rows (c_lead_stride 0), else gc [L, N] = gy_l conj(h_l). The flags are constants at every call. */
static inline void FN(readout_adjoint_core)(const E *restrict a, const E *restrict gy, const E *restrict c,
                                            int64_t c_lead_stride, const E *restrict ge, const E *restrict h,
                                            E *restrict carry, E *restrict g_out, E *restrict gc, int64_t L,
                                            int64_t N, const int has_ge, const int want_gc) {
    if (want_gc && !c_lead_stride)
        for (int64_t n = 0; n < N; n++) gc[n] = FN(zero);
    for (int64_t l = 0; l < L; l++) {
        const E gyl = gy[l], *cl = c + l * c_lead_stride;
        const int64_t o = l * N;
        for (int64_t n = 0; n < N; n++) {
            E g = FN(add)(carry[o + n], FN(mul)(gyl, FN(conj)(cl[n])));
            if (has_ge) g = FN(add)(g, ge[o + n]);
            g_out[o + n] = g;
            carry[o + n] = FN(mul)(FN(conj)(a[o + n]), g);
        }
        if (want_gc && c_lead_stride)
            for (int64_t n = 0; n < N; n++) gc[o + n] = FN(mul)(gyl, FN(conj)(h[o + n]));
        else if (want_gc)
            for (int64_t n = 0; n < N; n++) gc[n] = FN(add)(gc[n], FN(mul)(gyl, FN(conj)(h[o + n])));
    }
}

static INLINE void FN(readout_adjoint)(const E *a, const E *gy, const E *c, int64_t c_lead_stride, const E *ge,
                                const E *h, E *carry, E *g_out, E *gc, int64_t L, int64_t N) {
    if (ge && gc) FN(readout_adjoint_core)(a, gy, c, c_lead_stride, ge, h, carry, g_out, gc, L, N, 1, 1);
    else if (ge) FN(readout_adjoint_core)(a, gy, c, c_lead_stride, ge, h, carry, g_out, NULL, L, N, 1, 0);
    else if (gc) FN(readout_adjoint_core)(a, gy, c, c_lead_stride, NULL, h, carry, g_out, gc, L, N, 0, 1);
    else FN(readout_adjoint_core)(a, gy, c, c_lead_stride, NULL, h, carry, g_out, NULL, L, N, 0, 0);
}

/* dst rows (stride dst_row) <- src rows of m entries (contiguous), one copy when dst is too. */
static inline void FN(copy_rows)(E *dst, int64_t dst_row, const E *src, int64_t m, int64_t rows, int stream) {
    if (dst_row == m) copy_out(dst, src, rows * m * sizeof(E), stream);
    else
        for (int64_t j = 0; j < rows; j++) copy_out(dst + j * dst_row, src + j * m, m * sizeof(E), stream);
}

/* The backward's arguments (scan_bwd's), for the threads of one call. */
struct FN(bwd_args) {
    int64_t B, T, L, N;
    const E *a, *b, *c;
    int64_t c_lead_stride;
    const E *ckpt;
    int64_t every;
    const E *gy, *gfinal;
    const int64_t *slot;
    const E *gexp;
    int64_t K;
    E *ga, *gb, *gc, *gh0, *work;
    int64_t blocks; /* channel blocks per batch row (1 when grad c is summed over the lead rows) */
};

/* The backward over units [u0, u1) (as in scan_fwd_units) with thread k's work buffer. */
CLONES static void FN(scan_bwd_units)(const struct FN(bwd_args) *p, int64_t k_thread, int64_t u0, int64_t u1) {
    const int64_t B = p->B, T = p->T, L = p->L, N = p->N, M = L * N, K = p->K, every = p->every;
    const int64_t c_lead_stride = p->c_lead_stride, c_row = c_lead_stride ? M : N, n_ckpt = (T + every - 1) / every;
    const int64_t span = every < T ? every : T;
    const E *a = p->a, *b = p->b, *c = p->c, *ckpt = p->ckpt, *gy = p->gy, *gfinal = p->gfinal, *gexp = p->gexp;
    const int64_t *slot = p->slot;
    E *ga = p->ga, *gb = p->gb, *gc = p->gc;
    E *work = p->work + k_thread * 3 * span * M, *adj = work + span * M, *gcs = adj + span * M;
    const int stream = (size_t)(B * T * M) * sizeof(E) >= STREAM_MIN_BYTES;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t bi = u / p->blocks, blk = u % p->blocks;
        const int64_t l0 = L * blk / p->blocks, l1 = L * (blk + 1) / p->blocks, o = l0 * N, m = (l1 - l0) * N;
        const int64_t c_off = l0 * c_lead_stride, gc_w = c_lead_stride ? m : N; /* grad c per step */
        E *carry = p->gh0 + bi * M + o; /* conj(a_{t+1}) g_{t+1}; starts as dL/dh_{T-1} from the final state */
        for (int64_t i = 0; i < m; i++) carry[i] = gfinal ? gfinal[bi * M + o + i] : FN(zero);
        for (int64_t k = n_ckpt - 1; k >= 0; k--) {
            const int64_t t0 = k * every, t1 = t0 + every < T ? t0 + every : T, len = t1 - t0;
            const E *start = ckpt + (bi * n_ckpt + k) * M + o; /* h_{t0 - 1} */
            /* the span processed next: (u, k - 1), else the last span of unit u + 1, else none */
            const int64_t nu = k ? u : u + 1, nb = nu / p->blocks, nt0 = k ? t0 - every : (n_ckpt - 1) * every;
            const int64_t nlen = nu < u1 ? (k ? every : T - nt0) : 0;
            const int64_t nblk = nu % p->blocks, no = L * nblk / p->blocks * N;
            const int64_t nm = (L * (nblk + 1) / p->blocks - L * nblk / p->blocks) * N;
            for (int64_t t = t0; t < t1; t++) { /* work[t - t0] = h_t */
                E *ht = work + (t - t0) * m;
                FN(step_to)(a + (bi * T + t) * M + o, b + (bi * T + t) * M + o, t > t0 ? ht - m : start, ht, m);
            }
            for (int64_t t = t1 - 1; t >= t0; t--) { /* adj[t - t0] = g_t */
                const int64_t bt = bi * T + t, j = t - t0;
                if (j < nlen) {
                    const int64_t nbt = nb * T + nt0 + j;
                    prefetch_bytes(a + nbt * M + no, nm * sizeof(E));
                    if (c) prefetch_bytes(c + nbt * c_row + (c_lead_stride ? no : 0), (c_lead_stride ? nm : N) * sizeof(E));
                    if (gy && c && j % 4 == 0) prefetch_bytes(gy + nbt * L, 4 * L * sizeof(E));
                }
                const E *ge = gexp && slot[t] >= 0 ? gexp + (bi * K + slot[t]) * M + o : NULL;
                if (gy && c)
                    FN(readout_adjoint)(a + bt * M + o, gy + bt * L + l0, c + bt * c_row + c_off, c_lead_stride, ge,
                                        work + j * m, carry, adj + j * m, gc ? gcs + j * gc_w : NULL, l1 - l0, N);
                else
                    FN(adjoint_step)(a + bt * M + o, gy ? gy + bt * M + o : NULL, ge, carry, adj + j * m, m);
            }
            const int64_t bt0 = bi * T + t0;
            for (int64_t j = 0; j < len; j++) {
                const E *hprev = j ? work + (j - 1) * m : start;
                E *g = adj + j * m;
                if (j < nlen) prefetch_bytes(b + (nb * T + nt0 + j) * M + no, nm * sizeof(E));
                copy_out(gb + (bt0 + j) * M + o, g, m * sizeof(E), stream);
                for (int64_t i = 0; i < m; i++) g[i] = FN(mul)(g[i], FN(conj)(hprev[i]));
                copy_out(ga + (bt0 + j) * M + o, g, m * sizeof(E), stream);
                if (gc) copy_out(gc + (bt0 + j) * c_row + (c_lead_stride ? o : 0), gcs + j * gc_w, gc_w * sizeof(E), stream);
            }
        }
    }
    stream_fence();
}

static void FN(scan_bwd_range)(void *p, int64_t k, int64_t u0, int64_t u1) {
    FN(scan_bwd_units)((const struct FN(bwd_args) *)p, k, u0, u1);
}

/* Backward of scan_fwd from its checkpoints: the reverse adjoint
 *   g_t = dL/dh_t (direct: read-out, all-states output, final state, exports) + conj(a_{t+1}) g_{t+1}
 *   grad a_t = g_t conj(h_{t-1}), grad b_t = g_t, grad h_{-1} = conj(a_0) g_0,
 *   grad c_t = gy_t conj(h_t) (summed over the lead rows when c is shared).
 * gy: [B, T, L] (with c) or [B, T, M] (without), or NULL; gfinal [B, M] or NULL; gexp [B, K, M]
 * with slot, or NULL. Outputs ga, gb [B, T, M], gh0 [B, M], gc (c's shape; needs c and gy) or
 * NULL. work: threads x 3 min(every, T) M elements (a block per thread). threads: as in scan_fwd;
 * channel blocks only where grad c is not a sum over the lead rows (no c, c per lead row, or
 * grad c not asked for), so every thread's output is its own.
 * Per unit (batch row or its block of channels), one checkpoint span at a time, last first, in
 * three walks that keep the span in cache:
 *   1. ascending, the span's states recomputed from its checkpoint into work (from cache: its
 *      a and b were prefetched during the walks 2 and 3 of the span before; a stays in cache
 *      for walk 2);
 *   2. descending, the adjoints g_t into the span's second buffer (with the read-out's direct
 *      term and grad c formed in the same pass, grad c into the third buffer), while the lines of
 *      the next span's a and c are prefetched (the hardware prefetcher does not cross from one
 *      span back into the one before it);
 *   3. ascending, step by step, the span's grad b (the adjoints), grad a (g conj(h_prev), in
 *      place) and grad c copied out, with streaming stores when the gradients exceed
 *      STREAM_MIN_BYTES (no read for ownership of the fresh gradient tensors; descending stores
 *      ran at half speed here), while the next span's b is prefetched: the memory then reads
 *      while it writes, as in a copy (with all of the prefetch in walk 2 the backward took
 *      40.5 ms at B 8, T 16384, 4 x 64, against 32.4-33.0 ms so). */
void FN(scan_bwd)(int64_t B, int64_t T, int64_t L, int64_t N,
                  const E *a, const E *b, const E *c, int64_t c_lead_stride,
                  const E *ckpt, int64_t every,
                  const E *gy, const E *gfinal, const int64_t *slot, const E *gexp, int64_t K,
                  E *ga, E *gb, E *gc, E *gh0, E *work, int64_t threads) {
    const int64_t blocks = gc && !c_lead_stride ? 1 : channel_blocks(threads, B, L);
    struct FN(bwd_args) p = {B, T, L, N, a, b, c, c_lead_stride, ckpt, every, gy, gfinal, slot, gexp, K,
                             ga, gb, gc, gh0, work, blocks};
    parallel_ranges(threads, B * blocks, FN(scan_bwd_range), &p);
}

#undef E
#undef FN
#undef CAT
#undef CAT_
