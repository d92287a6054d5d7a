/* The LSTM's gates and cell states from its h sequence (models/kernels/native/lstm.py), one
 * element type R with suffix SFX, SIGMOID and TANH its activations. Inputs per batch row, all
 * contiguous: drive [T, 4, H] (W_ih x_t + b_ih + b_hh), zh [T, 4, H] (W_hh h_t, so step t reads
 * row t - 1), z0 [4, H] (W_hh h_0), h [T, H], c0 [H]. Per step t, elementwise over H:
 *     z = drive_t + (t ? zh_{t-1} : z0)            (i, f, g, o) blocks
 *     i, f, o = sigmoid(z_i, z_f, z_o),  g = tanh(z_g),  c_t = f c_{t-1} + i g
 * written as gates [T, 4, H] = (i, f, g, o) and states [T, 2, H] = (h_t, c_t), hook_state's
 * layout. One pass over each input, the previous c read back from the row just written. */

#define LSTM_CAT_(a, b) a##_##b
#define LSTM_CAT(a, b) LSTM_CAT_(a, b)

CLONES void LSTM_CAT(lstm_cells, SFX)(int64_t batch, int64_t length, int64_t hidden, const R *restrict drive,
                                       const R *restrict zh, const R *restrict z0, const R *restrict h,
                                       const R *restrict c0, R *restrict gates, R *restrict states) {
    const int64_t h4 = 4 * hidden, h2 = 2 * hidden;
    for (int64_t bi = 0; bi < batch; bi++) {
        const R *c_prev = c0 + bi * hidden;
        for (int64_t t = 0; t < length; t++) {
            const int64_t row = bi * length + t;
            const R *d = drive + row * h4;
            const R *zp = t ? zh + (row - 1) * h4 : z0 + bi * h4;
            const R *ht = h + row * hidden;
            R *g = gates + row * h4;
            R *s = states + row * h2;
#pragma omp simd
            for (int64_t j = 0; j < hidden; j++) {
                const R in = SIGMOID(d[j] + zp[j]);
                const R forget = SIGMOID(d[hidden + j] + zp[hidden + j]);
                const R cand = TANH(d[2 * hidden + j] + zp[2 * hidden + j]);
                const R out = SIGMOID(d[3 * hidden + j] + zp[3 * hidden + j]);
                g[j] = in, g[hidden + j] = forget, g[2 * hidden + j] = cand, g[3 * hidden + j] = out;
                s[j] = ht[j];
                s[hidden + j] = forget * c_prev[j] + in * cand;
            }
            c_prev = s + hidden;
        }
    }
}

#undef LSTM_CAT
#undef LSTM_CAT_
