/* The LSTM recurrence, forward and backward (models/kernels/native/lstm.py), one element type R
 * with suffix SFX, SIGMOID and TANH its activations. Per batch row, over contiguous memory:
 *     z_t = drive_t + W_hh h_{t-1}                    drive_t = W_ih x_t + b_ih + b_hh, [4, H] blocks
 *     i, f, o = sigmoid(z_i, z_f, z_o),  g = tanh(z_g)
 *     c_t = f c_{t-1} + i g,   h_t = o tanh(c_t)                          (h_{-1}, c_{-1}: h0, c0)
 * The forward writes gates [T, 4, H] = (i, f, g, o) and states [T, 2, H] = (h_t, c_t). The
 * backward walks the adjoint back from the cotangents of h (gh [T, H]) and, when `extra`, of the
 * gates (gg [T, 4, H]) and of c (gc [T, H]):
 *     dh_t = gh_t + W_hh^T dz_{t+1},   dc_t = gc_t + dh_t o (1 - tanh^2 c_t) + dc_{t+1} f_{t+1}
 *     dz_t = (di i (1 - i), df f (1 - f), dg (1 - g^2), do o (1 - o))   with di = dc_t g + gg_i,
 *     df = dc_t c_{t-1} + gg_f, dg = dc_t i + gg_g, do = dh_t tanh c_t + gg_o
 * writing dz [T, 4, H] (= the drive's gradient; W_hh's is sum_t dz_t h_{t-1}^T, one matmul in
 * torch) and dh_{-1}, dc_{-1}. Batch rows run through time LSTM_ROWS at a time, their products
 * with W_hh one register-blocked product per step over contiguous rows of W (W_hh^T [H, 4H]
 * forward, W_hh [4H, H] backward; in cache for H of a few hundred). */

#define LSTM_CAT_(a, b) a##_##b
#define LSTM_CAT(a, b) LSTM_CAT_(a, b)
#define LFN(name) LSTM_CAT(name, SFX)
#define LSTM_BLOCK 64 /* outputs of one row in registers */
#define LSTM_ROWS 4   /* batch rows advanced together through time */
#define LSTM_WIDTH (64 / (int64_t)sizeof(R))

/* out[n] += sum_k v[k] w[k, n] for one row, w [K, N] row-major: blocks of LSTM_BLOCK outputs kept in
 * an accumulator (registers) while k runs, the remainder in one narrower block. */
static inline __attribute__((always_inline)) void LFN(lstm_matvec)(R *restrict out, const R *restrict w,
                                                                   const R *restrict v, int64_t K, int64_t N) {
    int64_t n0 = 0;
    for (; n0 + LSTM_BLOCK <= N; n0 += LSTM_BLOCK) {
        R acc[LSTM_BLOCK];
        for (int64_t j = 0; j < LSTM_BLOCK; j++) acc[j] = out[n0 + j];
        for (int64_t k = 0; k < K; k++) {
            const R vk = v[k], *wk = w + k * N + n0;
#pragma omp simd
            for (int64_t j = 0; j < LSTM_BLOCK; j++) acc[j] += vk * wk[j];
        }
        for (int64_t j = 0; j < LSTM_BLOCK; j++) out[n0 + j] = acc[j];
    }
    for (int64_t k = 0; n0 < N && k < K; k++) {
        const R vk = v[k], *wk = w + k * N + n0;
#pragma omp simd
        for (int64_t j = 0; j < N - n0; j++) out[n0 + j] += vk * wk[j];
    }
}

/* The same for the rows r < rows (a constant after inlining, 2 to 4),
 * out [rows, N] contiguous, v[r] the r-th row's vector, w [K, N] row-major: LSTM_WIDTH outputs
 * of every row (64 bytes: two AVX registers, four SSE ones) stay in registers while k runs, so
 * each load of w serves all the rows. One row alone reads all of w per step (64 KiB in float32
 * at H = 64, more than L1) and is bound by L2; four rows share that read. A loop per row (not
 * one over all of them) keeps the accumulators out of memory (gcc 12). Every output adds its K
 * products in the same order as lstm_matvec, so a row gets the same bits in any block. */
static inline __attribute__((always_inline)) void LFN(lstm_matvec_rows)(R *restrict out, const R *restrict w,
                                                                        const R *const *v, int64_t K, int64_t N,
                                                                        const int rows) {
    const R *restrict v0 = v[0], *restrict v1 = v[rows > 1], *restrict v2 = v[2 * (rows > 2)],
            *restrict v3 = v[3 * (rows > 3)];
    int64_t n0 = 0;
    for (; n0 + LSTM_WIDTH <= N; n0 += LSTM_WIDTH) {
        R a0[LSTM_WIDTH], a1[LSTM_WIDTH], a2[LSTM_WIDTH], a3[LSTM_WIDTH];
        for (int64_t j = 0; j < LSTM_WIDTH; j++) {
            a0[j] = out[n0 + j];
            if (rows > 1) a1[j] = out[N + n0 + j];
            if (rows > 2) a2[j] = out[2 * N + n0 + j];
            if (rows > 3) a3[j] = out[3 * N + n0 + j];
        }
        for (int64_t k = 0; k < K; k++) {
            const R *wk = w + k * N + n0, x0 = v0[k], x1 = v1[k], x2 = v2[k], x3 = v3[k];
#pragma omp simd
            for (int64_t j = 0; j < LSTM_WIDTH; j++) a0[j] += x0 * wk[j];
            if (rows > 1) {
#pragma omp simd
                for (int64_t j = 0; j < LSTM_WIDTH; j++) a1[j] += x1 * wk[j];
            }
            if (rows > 2) {
#pragma omp simd
                for (int64_t j = 0; j < LSTM_WIDTH; j++) a2[j] += x2 * wk[j];
            }
            if (rows > 3) {
#pragma omp simd
                for (int64_t j = 0; j < LSTM_WIDTH; j++) a3[j] += x3 * wk[j];
            }
        }
        for (int64_t j = 0; j < LSTM_WIDTH; j++) {
            out[n0 + j] = a0[j];
            if (rows > 1) out[N + n0 + j] = a1[j];
            if (rows > 2) out[2 * N + n0 + j] = a2[j];
            if (rows > 3) out[3 * N + n0 + j] = a3[j];
        }
    }
    if (n0 < N) /* the last N - n0 outputs, row by row */
        for (int64_t r = 0; r < rows; r++) {
            const R *restrict vr = v[r];
            R *restrict o = out + r * N + n0;
            for (int64_t k = 0; k < K; k++) {
                const R vk = vr[k], *wk = w + k * N + n0;
#pragma omp simd
                for (int64_t j = 0; j < N - n0; j++) o[j] += vk * wk[j];
            }
        }
}

/* lstm_matvec_rows for rows = 2 .. LSTM_ROWS, lstm_matvec for one (a run-time count: one
 * specialised copy each).
 * Inlined into each caller, so every clone of the caller gets its own vector code. */
static inline __attribute__((always_inline)) void LFN(lstm_matvec_block)(R *restrict out, const R *restrict w,
                                                                         const R *const *v, int64_t K, int64_t N,
                                                                         int64_t rows) {
    switch (rows) {
    case 4: LFN(lstm_matvec_rows)(out, w, v, K, N, 4); break;
    case 3: LFN(lstm_matvec_rows)(out, w, v, K, N, 3); break;
    case 2: LFN(lstm_matvec_rows)(out, w, v, K, N, 2); break;
    default: LFN(lstm_matvec)(out, w, v[0], K, N);
    }
}

/* One forward step's elementwise part for one row: z [4H] -> gate row g [4H], state row s [2H]. */
static inline void LFN(lstm_fwd_cell)(int64_t hidden, const R *restrict z, const R *restrict c_prev, R *restrict g,
                                      R *restrict s) {
#pragma omp simd
    for (int64_t j = 0; j < hidden; j++) {
        const R in = SIGMOID(z[j]), forget = SIGMOID(z[hidden + j]);
        const R cand = TANH(z[2 * hidden + j]), out = SIGMOID(z[3 * hidden + j]);
        const R c = forget * c_prev[j] + in * cand;
        g[j] = in, g[hidden + j] = forget, g[2 * hidden + j] = cand, g[3 * hidden + j] = out;
        s[j] = out * TANH(c);
        s[hidden + j] = c;
    }
}

/* Batch rows in blocks of LSTM_ROWS (the last block may be shorter). work: [LSTM_ROWS, 4H] */
CLONES void LFN(lstm_fwd)(int64_t batch, int64_t length, int64_t hidden, const R *restrict drive,
                          const R *restrict w_hh_t, const R *restrict h0, const R *restrict c0, R *restrict gates,
                          R *restrict states, R *restrict work) {
    const int64_t h4 = 4 * hidden, h2 = 2 * hidden;
    R *restrict z = work;
    for (int64_t bi = 0; bi < batch; bi += LSTM_ROWS) {
        const int64_t rows = batch - bi < LSTM_ROWS ? batch - bi : LSTM_ROWS;
        const R *h_prev[LSTM_ROWS], *c_prev[LSTM_ROWS];
        for (int64_t r = 0; r < rows; r++) h_prev[r] = h0 + (bi + r) * hidden, c_prev[r] = c0 + (bi + r) * hidden;
        for (int64_t t = 0; t < length; t++) {
            for (int64_t r = 0; r < rows; r++) memcpy(z + r * h4, drive + ((bi + r) * length + t) * h4, h4 * sizeof(R));
            LFN(lstm_matvec_block)(z, w_hh_t, h_prev, hidden, h4, rows);
            for (int64_t r = 0; r < rows; r++) {
                const int64_t row = (bi + r) * length + t;
                R *s = states + row * h2;
                LFN(lstm_fwd_cell)(hidden, z + r * h4, c_prev[r], gates + row * h4, s);
                h_prev[r] = s, c_prev[r] = s + hidden;
            }
        }
    }
}

/* One backward step's elementwise part: dh (in: W_hh^T dz_{t+1}), dc (in: dc_{t+1} f_{t+1}, out:
 * dc_t f_t); writes dz. extra: add the gates' and c's cotangents (a constant after inlining). */
static inline void LFN(lstm_bwd_cell)(int64_t hidden, const R *restrict g, const R *restrict c,
                                      const R *restrict c_prev, const R *restrict gh, const R *restrict gg,
                                      const R *restrict gc, const R *restrict dh, R *restrict dc, R *restrict dz,
                                      const int extra) {
#pragma omp simd
    for (int64_t j = 0; j < hidden; j++) {
        const R in = g[j], forget = g[hidden + j], cand = g[2 * hidden + j], out = g[3 * hidden + j];
        const R tc = TANH(c[j]), dhj = dh[j] + gh[j];
        const R dcj = dc[j] + dhj * out * (1 - tc * tc) + (extra ? gc[j] : 0);
        const R d_in = dcj * cand + (extra ? gg[j] : 0), d_forget = dcj * c_prev[j] + (extra ? gg[hidden + j] : 0);
        const R d_cand = dcj * in + (extra ? gg[2 * hidden + j] : 0), d_out = dhj * tc + (extra ? gg[3 * hidden + j] : 0);
        dz[j] = d_in * in * (1 - in);
        dz[hidden + j] = d_forget * forget * (1 - forget);
        dz[2 * hidden + j] = d_cand * (1 - cand * cand);
        dz[3 * hidden + j] = d_out * out * (1 - out);
        dc[j] = dcj * forget;
    }
}

/* gh [B, T, H]; gg [B, T, 4H] and gc [B, T, H] read when extra (else may be NULL); dz [B, T, 4H],
 * dh0, dc0 [B, H] written; work [2, LSTM_ROWS, H] (dh, dc of the block's rows). Rows in blocks
 * as the forward. */
CLONES void LFN(lstm_bwd)(int64_t batch, int64_t length, int64_t hidden, const R *restrict w_hh,
                          const R *restrict c0, const R *restrict gates, const R *restrict states,
                          const R *restrict gh, const R *restrict gg, const R *restrict gc, int64_t extra,
                          R *restrict dz, R *restrict dh0, R *restrict dc0, R *restrict work) {
    const int64_t h4 = 4 * hidden, h2 = 2 * hidden;
    R *restrict dh = work, *restrict dc = work + LSTM_ROWS * hidden;
    for (int64_t bi = 0; bi < batch; bi += LSTM_ROWS) {
        const int64_t rows = batch - bi < LSTM_ROWS ? batch - bi : LSTM_ROWS;
        for (int64_t j = 0; j < 2 * LSTM_ROWS * hidden; j++) work[j] = 0;
        for (int64_t t = length - 1; t >= 0; t--) {
            const R *z[LSTM_ROWS];
            for (int64_t r = 0; r < rows; r++) {
                const int64_t row = (bi + r) * length + t;
                const R *c = states + row * h2 + hidden, *c_prev = t ? c - h2 : c0 + (bi + r) * hidden;
                R *zr = dz + row * h4, *dhr = dh + r * hidden, *dcr = dc + r * hidden;
                if (extra)
                    LFN(lstm_bwd_cell)(hidden, gates + row * h4, c, c_prev, gh + row * hidden, gg + row * h4,
                                       gc + row * hidden, dhr, dcr, zr, 1);
                else
                    LFN(lstm_bwd_cell)(hidden, gates + row * h4, c, c_prev, gh + row * hidden, NULL, NULL, dhr, dcr,
                                       zr, 0);
                z[r] = zr;
            }
            for (int64_t j = 0; j < rows * hidden; j++) dh[j] = 0;
            LFN(lstm_matvec_block)(dh, w_hh, z, h4, hidden, rows);
        }
        memcpy(dh0 + bi * hidden, dh, rows * hidden * sizeof(R));
        memcpy(dc0 + bi * hidden, dc, rows * hidden * sizeof(R));
    }
}

#undef LSTM_BLOCK
#undef LSTM_ROWS
#undef LSTM_WIDTH
#undef LFN
#undef LSTM_CAT
#undef LSTM_CAT_
