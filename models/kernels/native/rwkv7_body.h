/* The RWKV-7 forward and backward for one real type; included by kernels.c with R (float, double)
 * and SFX (f32, f64). Per batch row b and head h, with the state S [V, K] (values x keys):
 *     S_t = S_{t-1} (diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T (+ shift_t; or pins[b, t]),  o_t = S_t r_t
 * Layout (contiguous): r, w, k, a, b [B, T, H, K], v [B, T, H, V], S [B, H, V, K] (the initial
 * state on entry, the final state on return), o [B, T, H, V]; exported [B, T, H, V, K] every
 * state (NULL: none); shift [B, T, H, V, K] added to each step's state (NULL: none), then where
 * pin_mask[b, t] (uint8 [B, T]; NULL: none) the state becomes pins[b, t] [H, V, K], and o_t and
 * S_t a_{t+1} are read from the result. work: H * (K * V + 2 V + K) elements. ckpt (NULL: none)
 * [B, H, ceil(T / every), K, V]: the state entering every `every`-th step, transposed, for the
 * backward.
 *
 * The loop keeps the transpose St [K, V] so that every product is an axpy along V (no horizontal
 * sums): per key row i, row = e^{w_i} row + b_i m + k_i v (m = S_{t-1} a_t, the removed values);
 * o_t += r_i row; and the next step's m += a_{t+1, i} row, all in one pass over the state per
 * step. Every clone (CLONES) does the same operations in the same order (no contraction), and the
 * backward's recomputation repeats them, so it reproduces the forward's states bit for bit.
 *
 * The backward (rwkv7_bwd), with G_t = dL/dS_t (total) and u_t = G_t b_t, walks t down:
 *     G_t     = gfinal [t = T-1] + gexported_t + gO_t r_t^T
 *               + [t+1 not pinned] (G_{t+1} diag(e^{w_{t+1}}) + u_{t+1} a_{t+1}^T)
 *     dr_t = S_t^T gO_t,  dv_t = G_t k_t,  dk_t = G_t^T v_t,  db_t = G_t^T m_t,  da_t = S_{t-1}^T u_t,
 *     dw_t = e^{w_t} * diag(S_{t-1}^T G_t),  dshift_t = G_t            (zero where step t is pinned)
 *     dpins_t = G_t where pinned,  dS_{-1} = [0 not pinned] (G_0 diag(e^{w_0}) + u_0 a_0^T)
 * One (batch row, head) pair is a unit of work (units run in threads, threads.h): per span of
 * `every` steps, from the checkpoint entering it, the states S_{t0-1} .. S_{t1-1} and the removed
 * values m_t are recomputed into the thread's span buffer, then the steps are walked back, one
 * pass over S_{t-1} and G per step (step t's gradients and step t-1's read-out in one pass). */

#define WCAT_(x, y) x##_##y
#define WCAT(x, y) WCAT_(x, y)
#define WFN(name) WCAT(name, SFX)

/* transpose_f32 / transpose_f64 [rows, cols] -> [cols, rows]: delta_body.h's, included before this */
#define WTRANSPOSE WFN(transpose)

/* One step of one head: src [K, V] the state S_{t-1}, dst [K, V] S_t (the forward passes one
 * buffer as both); m = S_{t-1} a_t on entry, S_t a_{t+1} on return (an NULL: the last step, m is
 * left alone); the step's decay e^{w} in dec [K]. */
static INLINE void WFN(rwkv7_head_step)(const R *src, R *dst, R *restrict m, R *restrict next, const R *dec,
                                        const R *kt, const R *vt, const R *bt, const R *rt, const R *an,
                                        R *restrict ot, int64_t K, int64_t V) {
    for (int64_t j = 0; j < V; j++) {
        ot[j] = 0;
        next[j] = 0;
    }
    for (int64_t i = 0; i < K; i++) {
        const R *in = src + i * V;
        R *row = dst + i * V;
        const R di = dec[i], bi = bt[i], ki = kt[i], ri = rt[i], ai = an ? an[i] : 0;
#pragma omp simd
        for (int64_t j = 0; j < V; j++) {
            const R s = (di * in[j] + bi * m[j]) + ki * vt[j];
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

/* m = St^T a (St [K, V]): the removed values of the step after the state St. */
static void WFN(rwkv7_removed)(const R *St, const R *a, R *restrict m, int64_t K, int64_t V) {
    for (int64_t j = 0; j < V; j++) m[j] = 0;
    for (int64_t i = 0; i < K; i++)
        for (int64_t j = 0; j < V; j++) m[j] += a[i] * St[i * V + j];
}

static void WFN(rwkv7_decays)(R *restrict dec, const R *w, int64_t K) {
    for (int64_t i = 0; i < K; i++) dec[i] = (R)exp(w[i]);
}

CLONES void WFN(rwkv7_fwd)(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, const R *r, const R *w,
                           const R *k, const R *v, const R *a, const R *b, R *S, R *o, R *exported,
                           const R *shift, const uint8_t *pin_mask, const R *pins, int64_t every, R *ckpt,
                           R *work) {
    /* per head: St [K, V], m [V], next [V], dec [K] */
    const int64_t per_head = K * V + 2 * V + K, n_ckpt = (T + every - 1) / every;
    for (int64_t bi = 0; bi < B; bi++) {
        for (int64_t h = 0; h < H; h++) {
            R *St = work + h * per_head, *m = St + K * V;
            WTRANSPOSE(S + (bi * H + h) * V * K, St, V, K);
            if (T > 0) WFN(rwkv7_removed)(St, a + (bi * T * H + h) * K, m, K, V); /* m_0 = S_{-1} a_0 */
        }
        for (int64_t t = 0; t < T; t++) {
            for (int64_t h = 0; h < H; h++) {
                R *St = work + h * per_head, *m = St + K * V, *next = m + V, *dec = next + V;
                const int64_t at = ((bi * T + t) * H + h) * K, vt = ((bi * T + t) * H + h) * V;
                if (ckpt && t % every == 0)
                    memcpy(ckpt + ((bi * H + h) * n_ckpt + t / every) * K * V, St, (size_t)(K * V) * sizeof(R));
                WFN(rwkv7_decays)(dec, w + at, K);
                const R *an = t + 1 < T ? a + at + H * K : NULL;
                WFN(rwkv7_head_step)(St, St, m, next, dec, k + at, v + vt, b + at, r + at, an, o + vt, K, V);
                const int64_t sv = ((bi * T + t) * H + h) * V * K; /* step t, head h in [B, T, H, V, K] */
                const R *pin = pin_mask && pin_mask[bi * T + t] ? pins + sv : NULL;
                if (shift || pin) WFN(rwkv7_replace)(St, m, shift ? shift + sv : NULL, pin, r + at, an, o + vt, K, V);
                if (exported) WTRANSPOSE(St, exported + sv, K, V);
            }
        }
        for (int64_t h = 0; h < H; h++) WTRANSPOSE(work + h * per_head, S + (bi * H + h) * V * K, K, V);
    }
}

/* Step p's read-out into one key row: g += r_i gO + gx (gx: the exported state's cotangent row;
 * gO and gx zero rows where none); dr_i = s . gO (s = S_p[i]); un += b_i g and dvn += k_i g
 * (u_p = G_p b_p, dv_p = G_p k_p). */
static INLINE void WFN(rwkv7_row_readout)(R *restrict g, const R *restrict s, const R *restrict go,
                                          const R *restrict gx, R ri, R bi, R ki, R *restrict un, R *restrict dvn,
                                          R *dr, int64_t V) {
    R sr = 0;
#pragma omp simd reduction(+ : sr)
    for (int64_t j = 0; j < V; j++) {
        const R gj = (g[j] + gx[j]) + ri * go[j];
        sr += s[j] * go[j];
        un[j] += bi * gj;
        dvn[j] += ki * gj;
        g[j] = gj;
    }
    *dr = sr;
}

/* Step t's gradients from one key row, s = S_{t-1}[i] and g = G_t[i] (rows along V): dk_i, db_i,
 * da_i, dw_i; g becomes G_{t-1}[i], its part through step t (e^{w_i} g + a_i u) plus step t - 1's
 * read-out as in rwkv7_row_readout (at t = 0 with zero rows and coefficients), in one loop. */
static INLINE void WFN(rwkv7_row_step)(R *restrict g, const R *restrict s, const R *restrict u, const R *restrict vt,
                                       const R *restrict mt, R di, R ai, R *dk, R *db, R *da, R *dw,
                                       const R *restrict go, const R *restrict gx, R ri, R bi, R ki,
                                       R *restrict un, R *restrict dvn, R *dr, int64_t V) {
    R sk = 0, sb = 0, sa = 0, sw = 0, sr = 0;
#pragma omp simd reduction(+ : sk, sb, sa, sw, sr)
    for (int64_t j = 0; j < V; j++) {
        const R gj = g[j], sj = s[j];
        sk += gj * vt[j];
        sb += gj * mt[j];
        sa += sj * u[j];
        sw += sj * gj;
        const R next = ((di * gj + ai * u[j]) + gx[j]) + ri * go[j];
        sr += sj * go[j];
        un[j] += bi * next;
        dvn[j] += ki * next;
        g[j] = next;
    }
    *dk = sk, *db = sb, *da = sa, *dw = di * sw, *dr = sr;
}

struct WFN(rwkv7_bwd_args) {
    int64_t T, H, K, V, every, per_thread;
    const R *r, *w, *k, *v, *a, *b, *shift, *pins, *ckpt, *go, *gexp, *gfinal;
    const uint8_t *pin_mask;
    R *dr, *dw, *dk, *dv, *da, *db, *dh0, *dshift, *dpins, *work;
};

/* Step p's read-out over every key row of G (step p's cotangents absorbed): see rwkv7_row_readout;
 * gxt [K, V] the transposed exported cotangent (NULL: none), zero a zero row [V]; zeroes un and dvn
 * first. */
static INLINE void WFN(rwkv7_readout)(const struct WFN(rwkv7_bwd_args) *A, R *restrict G, const R *Sp,
                                      const R *gxt, const R *zero, int64_t bi, int64_t h, int64_t p,
                                      R *restrict un, R *restrict dvn) {
    const int64_t K = A->K, V = A->V, ap = ((bi * A->T + p) * A->H + h) * K;
    const R *go = A->go ? A->go + ((bi * A->T + p) * A->H + h) * V : zero;
    for (int64_t j = 0; j < V; j++) un[j] = dvn[j] = 0;
    for (int64_t i = 0; i < K; i++)
        WFN(rwkv7_row_readout)(G + i * V, Sp + i * V, go, gxt ? gxt + i * V : zero, A->r[ap + i], A->b[ap + i],
                               A->k[ap + i], un, dvn, A->dr + ap + i, V);
}

/* The cotangent of the exported state of step p transposed into gxt [K, V]; NULL when none given. */
static const R *WFN(rwkv7_gexp)(const struct WFN(rwkv7_bwd_args) *A, R *gxt, int64_t bi, int64_t h, int64_t p) {
    if (!A->gexp) return NULL;
    WTRANSPOSE(A->gexp + ((bi * A->T + p) * A->H + h) * A->V * A->K, gxt, A->V, A->K);
    return gxt;
}

/* The units [u0, u1) (one batch row and head each) on the thread's share of the work (see rwkv7_bwd). */
CLONES static void WFN(rwkv7_bwd_units)(const struct WFN(rwkv7_bwd_args) *A, int64_t thread, int64_t u0, int64_t u1) {
    const int64_t T = A->T, H = A->H, K = A->K, V = A->V, every = A->every, KV = K * V;
    const int64_t n_ckpt = (T + every - 1) / every, span = every < T ? every : T;
    /* the thread's work: span (span + 1) [K, V], ms span [V], G [K, V], gxt [K, V], u, un, dv, dvn,
     * m, next, osc, zero [V], dec [K] */
    R *span_buf = A->work + thread * A->per_thread, *ms = span_buf + (span + 1) * KV, *G = ms + span * V;
    R *gxt = G + KV, *u = gxt + KV, *un = u + V, *dv = un + V, *dvn = dv + V, *m = dvn + V, *next = m + V;
    R *osc = next + V, *zero = osc + V, *dec = zero + V;
    memset(zero, 0, (size_t)V * sizeof(R));
    for (int64_t unit = u0; unit < u1; unit++) {
        const int64_t bi = unit / H, h = unit % H;
        if (A->gfinal) WTRANSPOSE(A->gfinal + unit * KV, G, V, K);
        else memset(G, 0, (size_t)KV * sizeof(R));
        for (int64_t c = n_ckpt - 1; c >= 0; c--) {
            const int64_t t0 = c * every, t1 = t0 + every < T ? t0 + every : T;
            /* recompute S_{t0-1} .. S_{t1-1} into the span and m_t for t in [t0, t1) */
            memcpy(span_buf, A->ckpt + (unit * n_ckpt + c) * KV, (size_t)KV * sizeof(R));
            WFN(rwkv7_removed)(span_buf, A->a + ((bi * T + t0) * H + h) * K, m, K, V);
            for (int64_t t = t0; t < t1; t++) {
                const int64_t at = ((bi * T + t) * H + h) * K, vt = ((bi * T + t) * H + h) * V;
                R *dst = span_buf + (t - t0 + 1) * KV;
                memcpy(ms + (t - t0) * V, m, (size_t)V * sizeof(R));
                WFN(rwkv7_decays)(dec, A->w + at, K);
                const R *an = t + 1 < T ? A->a + at + H * K : NULL;
                WFN(rwkv7_head_step)(dst - KV, dst, m, next, dec, A->k + at, A->v + vt, A->b + at, A->r + at, an,
                                     osc, K, V);
                const int64_t sv = ((bi * T + t) * H + h) * KV;
                const R *pin = A->pin_mask && A->pin_mask[bi * T + t] ? A->pins + sv : NULL;
                if (A->shift || pin) WFN(rwkv7_replace)(dst, m, A->shift ? A->shift + sv : NULL, pin, A->r + at, an,
                                                        osc, K, V);
            }
            if (t1 == T) /* G_{T-1}: the last step's read-out, from S_{T-1} */
                WFN(rwkv7_readout)(A, G, span_buf + (T - t0) * KV, WFN(rwkv7_gexp)(A, gxt, bi, h, T - 1), zero, bi,
                                   h, T - 1, u, dv);
            for (int64_t t = t1 - 1; t >= t0; t--) {
                const int64_t at = ((bi * T + t) * H + h) * K, vt = ((bi * T + t) * H + h) * V;
                const int64_t sv = ((bi * T + t) * H + h) * KV, ap = at - H * K; /* ap: step t - 1 */
                const R *Sp = span_buf + (t - t0) * KV, *mt = ms + (t - t0) * V;
                const int pinned = A->pin_mask && A->pin_mask[bi * T + t];
                if (A->dshift) {
                    if (pinned) memset(A->dshift + sv, 0, (size_t)KV * sizeof(R));
                    else WTRANSPOSE(G, A->dshift + sv, K, V);
                }
                if (pinned) {
                    if (A->dpins) WTRANSPOSE(G, A->dpins + sv, K, V);
                    memset(G, 0, (size_t)KV * sizeof(R));
                    for (int64_t i = 0; i < K; i++) A->dk[at + i] = A->db[at + i] = A->da[at + i] = A->dw[at + i] = 0;
                    for (int64_t j = 0; j < V; j++) A->dv[vt + j] = 0;
                } else {
                    memcpy(A->dv + vt, dv, (size_t)V * sizeof(R));
                    WFN(rwkv7_decays)(dec, A->w + at, K);
                }
                /* per key row: step t's gradients (G_t -> its part of G_{t-1}), then step t-1's read-out */
                const R *go = t > 0 && A->go ? A->go + (ap / K) * V : zero;
                const R *gx = t > 0 ? WFN(rwkv7_gexp)(A, gxt, bi, h, t - 1) : NULL;
                for (int64_t j = 0; j < V; j++) un[j] = dvn[j] = 0;
                for (int64_t i = 0; i < K; i++) {
                    R *g = G + i * V;
                    const R *s = Sp + i * V, *gxi = gx ? gx + i * V : zero;
                    R unused;
                    if (!pinned)
                        WFN(rwkv7_row_step)(g, s, u, A->v + vt, mt, dec[i], A->a[at + i], A->dk + at + i, A->db + at + i,
                                            A->da + at + i, A->dw + at + i, go, gxi, t > 0 ? A->r[ap + i] : 0,
                                            t > 0 ? A->b[ap + i] : 0, t > 0 ? A->k[ap + i] : 0, un, dvn,
                                            t > 0 ? A->dr + ap + i : &unused, V);
                    else if (t > 0)
                        WFN(rwkv7_row_readout)(g, s, go, gxi, A->r[ap + i], A->b[ap + i], A->k[ap + i], un, dvn,
                                               A->dr + ap + i, V);
                }
                R *swap = u;
                u = un, un = swap, swap = dv, dv = dvn, dvn = swap;
            }
        }
        WTRANSPOSE(G, A->dh0 + unit * KV, K, V);
    }
}

static void WFN(rwkv7_bwd_range)(void *ctx, int64_t thread, int64_t u0, int64_t u1) {
    WFN(rwkv7_bwd_units)((const struct WFN(rwkv7_bwd_args) *)ctx, thread, u0, u1);
}

/* The backward of rwkv7_fwd (see the top of the file) from its checkpoints: cotangents go [B, T, H, V]
 * of o, gexp [B, T, H, V, K] of the exported states, gfinal [B, H, V, K] of the final state (each
 * NULL: zero) -> dr, dw, dk, da, db [B, T, H, K], dv [B, T, H, V], dh0 [B, H, V, K], dshift
 * [B, T, H, V, K] (NULL: not wanted), dpins [B, T, H, V, K] (NULL: not wanted; written at the
 * pinned steps only). work: threads * per_thread elements, per_thread = (n + 3) K V + (n + 8) V + K
 * with n = min(every, T). Each unit's arithmetic is the same for any thread count and any spacing. */
CLONES void WFN(rwkv7_bwd)(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, const R *r, const R *w,
                           const R *k, const R *v, const R *a, const R *b, const R *shift, const uint8_t *pin_mask,
                           const R *pins, int64_t every, const R *ckpt, const R *go, const R *gexp, const R *gfinal,
                           R *dr, R *dw, R *dk, R *dv, R *da, R *db, R *dh0, R *dshift, R *dpins, R *work,
                           int64_t threads) {
    const int64_t span = every < T ? every : T;
    struct WFN(rwkv7_bwd_args) args = {T, H, K, V, every, (span + 3) * K * V + (span + 8) * V + K,
                                       r, w, k, v, a, b, shift, pins, ckpt, go, gexp, gfinal, pin_mask,
                                       dr, dw, dk, dv, da, db, dh0, dshift, dpins, work};
    if (T == 0) { /* nothing to walk: dS_{-1} = gfinal */
        for (int64_t unit = 0; unit < B * H; unit++)
            for (int64_t e = 0; e < K * V; e++) dh0[unit * K * V + e] = gfinal ? gfinal[unit * K * V + e] : 0;
        return;
    }
    parallel_ranges(threads, B * H, WFN(rwkv7_bwd_range), &args);
}

#undef WTRANSPOSE
#undef WFN
#undef WCAT
#undef WCAT_
