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
 * torch) and dh_{-1}, dc_{-1}. The products with W_hh are register-blocked mat-vecs over
 * contiguous rows (W_hh^T [H, 4H] forward, W_hh [4H, H] backward), in cache for H of a few
 * hundred. */

#define LSTM_CAT_(a, b) a##_##b
#define LSTM_CAT(a, b) LSTM_CAT_(a, b)
#define LFN(name) LSTM_CAT(name, SFX)
#define LSTM_BLOCK 64

/* out[n] += sum_k v[k] w[k, n] for w [K, N] row-major: blocks of LSTM_BLOCK outputs kept in an
 * accumulator (registers) while k runs, the remainder in one narrower block. */
static inline void LFN(lstm_matvec_acc)(R *restrict out, const R *restrict w, const R *restrict v, int64_t K,
                                        int64_t N) {
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
    if (n0 < N) {
        const int64_t width = N - n0;
        for (int64_t k = 0; k < K; k++) {
            const R vk = v[k], *wk = w + k * N + n0;
#pragma omp simd
            for (int64_t j = 0; j < width; j++) out[n0 + j] += vk * wk[j];
        }
    }
}

/* work: [4H] */
CLONES void LFN(lstm_fwd)(int64_t batch, int64_t length, int64_t hidden, const R *restrict drive,
                          const R *restrict w_hh_t, const R *restrict h0, const R *restrict c0, R *restrict gates,
                          R *restrict states, R *restrict work) {
    const int64_t h4 = 4 * hidden, h2 = 2 * hidden;
    R *restrict z = work;
    for (int64_t bi = 0; bi < batch; bi++) {
        const R *h_prev = h0 + bi * hidden, *c_prev = c0 + bi * hidden;
        for (int64_t t = 0; t < length; t++) {
            const int64_t row = bi * length + t;
            memcpy(z, drive + row * h4, h4 * sizeof(R));
            LFN(lstm_matvec_acc)(z, w_hh_t, h_prev, hidden, h4);
            R *g = gates + row * h4, *s = states + row * h2;
#pragma omp simd
            for (int64_t j = 0; j < hidden; j++) {
                const R in = SIGMOID(z[j]), forget = SIGMOID(z[hidden + j]);
                const R cand = TANH(z[2 * hidden + j]), out = SIGMOID(z[3 * hidden + j]);
                const R c = forget * c_prev[j] + in * cand;
                g[j] = in, g[hidden + j] = forget, g[2 * hidden + j] = cand, g[3 * hidden + j] = out;
                s[j] = out * TANH(c);
                s[hidden + j] = c;
            }
            h_prev = s, c_prev = s + hidden;
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
 * dh0, dc0 [B, H] written; work [2H]. */
CLONES void LFN(lstm_bwd)(int64_t batch, int64_t length, int64_t hidden, const R *restrict w_hh,
                          const R *restrict c0, const R *restrict gates, const R *restrict states,
                          const R *restrict gh, const R *restrict gg, const R *restrict gc, int64_t extra,
                          R *restrict dz, R *restrict dh0, R *restrict dc0, R *restrict work) {
    const int64_t h4 = 4 * hidden, h2 = 2 * hidden;
    R *restrict dh = work, *restrict dc = work + hidden;
    for (int64_t bi = 0; bi < batch; bi++) {
        for (int64_t j = 0; j < hidden; j++) dh[j] = dc[j] = 0;
        for (int64_t t = length - 1; t >= 0; t--) {
            const int64_t row = bi * length + t;
            const R *c = states + row * h2 + hidden, *c_prev = t ? c - h2 : c0 + bi * hidden;
            R *z = dz + row * h4;
            if (extra)
                LFN(lstm_bwd_cell)(hidden, gates + row * h4, c, c_prev, gh + row * hidden, gg + row * h4,
                                   gc + row * hidden, dh, dc, z, 1);
            else
                LFN(lstm_bwd_cell)(hidden, gates + row * h4, c, c_prev, gh + row * hidden, NULL, NULL, dh, dc, z, 0);
            for (int64_t j = 0; j < hidden; j++) dh[j] = 0;
            LFN(lstm_matvec_acc)(dh, w_hh, z, h4, hidden);
        }
        memcpy(dh0 + bi * hidden, dh, hidden * sizeof(R));
        memcpy(dc0 + bi * hidden, dc, hidden * sizeof(R));
    }
}

#undef LSTM_BLOCK
#undef LFN
#undef LSTM_CAT
#undef LSTM_CAT_
