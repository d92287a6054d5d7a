/* Plain-C diagonal affine scan h_t = a_t h_{t-1} + b_t with the optional read-out
 * y_t[l] = sum_n c_t[l, n] h_t[l, n], forward and backward, for float32, float64, complex64 and
 * complex128 (diag_body.h; models/kernels/native/library.py builds and loads this file),
 * the delta-rule forward for float32 and float64 (delta_body.h), and Mamba's selective
 * scan for float32 and float64 (selective_body.h: the fused read-out with its backward, and
 * every state, forward only, for the instrumented path), and AUSSM's and Mamba-3's complex-transition
 * scans (complex_body.h, the same three kernels over complex states), and the LSTM recurrence
 * with every gate and state, forward and backward (lstm_body.h), and causal attention scores and
 * pattern in one pass (softmax_body.h), and the RWKV-7 scan, forward and backward (rwkv7_body.h).
 * One sequential pass per batch row over contiguous [T, M] memory: the state stays in cache and
 * every input is read once, so the scan runs at memory bandwidth. No torch headers; the diagonal
 * scan shares its batch rows (or blocks of channels) among threads (threads.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* every kernel gets clones for x86-64-v4 (AVX-512) and x86-64-v3 (AVX2 and FMA) beside the
 * baseline (SSE2) one where the toolchain can dispatch at load time (ifunc: glibc on x86-64;
 * gcc 11 and later know these levels, older gcc and clang get an AVX2 clone without FMA); the
 * real diagonal scan only the x86-64-v3 one (CLONES_NO512: its in-cache forward measured 15-20%
 * slower with AVX-512, benchmarks/RESULTS.md). Where nothing is contracted (below) the clones
 * give the same bits for every elementwise result; the sums vectorised with `omp simd
 * reduction` (the read-out y, the selective scan's sums over channels) add in partial sums as
 * wide as the vector, so there they may differ in the last bits, as two BLAS builds do.
 * -DCLONES= builds the baseline alone. */
#ifndef CLONES
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones) && !defined(__clang__) && __GNUC__ >= 11
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define CLONES_NO512 __attribute__((target_clones("arch=x86-64-v3", "default")))
#elif __has_attribute(target_clones)
#define CLONES __attribute__((target_clones("avx2", "default")))
#define CLONES_NO512 __attribute__((target_clones("avx2", "default")))
#endif
#endif
#endif
#ifndef CLONES
#define CLONES
#endif
#ifndef CLONES_NO512
#define CLONES_NO512
#endif

/* Contraction of a*b + c into one fused multiply-add (one rounding instead of two, half the
 * instructions) is off in the build (-std=c99, library.py) and on between CONTRACT_BEGIN and
 * CONTRACT_END: the LSTM (its mat-vecs) and the complex-transition scans, in the clones with FMA
 * (so those clones differ from the baseline in the last bits of any result). It stays off for
 * the selective scan, whose fused read-out must equal the sum torch forms from its states bit
 * for bit (a hooked Mamba reads its states out in torch), for the memory-bound diagonal scan,
 * and for the delta rule and the attention pass (no gain measured). gcc only (the pragma). */
#if defined(__GNUC__) && !defined(__clang__)
#define CONTRACT_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize (\"fp-contract=fast\")")
#define CONTRACT_END _Pragma("GCC pop_options")
#else
#define CONTRACT_BEGIN
#define CONTRACT_END
#endif

/* Streaming (non-temporal) stores for outputs written once and not read back by the kernel
 * (the backward's gradients): they bypass the cache, so the destination lines are not first
 * read for ownership, which would double the write traffic of a tensor larger than the cache.
 * SSE2 (in every x86-64 baseline); elsewhere memcpy. stream_fence() after the last of them. */
#if defined(__SSE2__)
#include <emmintrin.h>
static inline void stream_bytes(void *restrict dst, const void *restrict src, size_t n) {
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > n) head = n;
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 64; d += 64, s += 64, n -= 64) {
        const __m128i v0 = _mm_loadu_si128((const __m128i *)s), v1 = _mm_loadu_si128((const __m128i *)(s + 16));
        const __m128i v2 = _mm_loadu_si128((const __m128i *)(s + 32)), v3 = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, v0);
        _mm_stream_si128((__m128i *)(d + 16), v1);
        _mm_stream_si128((__m128i *)(d + 32), v2);
        _mm_stream_si128((__m128i *)(d + 48), v3);
    }
    memcpy(d, s, n);
}
static inline void stream_fence(void) { _mm_sfence(); }
#else
static inline void stream_bytes(void *restrict dst, const void *restrict src, size_t n) { memcpy(dst, src, n); }
static inline void stream_fence(void) {}
#endif

/* Outputs of at least STREAM_MIN_BYTES are written with streaming stores, smaller ones (which
 * fit the cache, where their reader finds them) with ordinary ones. */
#define STREAM_MIN_BYTES ((size_t)8 << 20)
static inline void copy_out(void *restrict dst, const void *restrict src, size_t n, int stream) {
    if (stream) stream_bytes(dst, src, n);
    else memcpy(dst, src, n);
}

/* Software prefetch of the lines of [p, p + n) for reading soon (a no-op without the builtin). */
#if defined(__GNUC__)
static inline void prefetch_bytes(const void *p, size_t n) {
    for (size_t i = 0; i < n; i += 64) __builtin_prefetch((const char *)p + i, 0, 1);
}
#else
static inline void prefetch_bytes(const void *p, size_t n) { (void)p, (void)n; }
#endif

/* A helper a cloned kernel calls runs in that clone's instruction set only when it is inlined
 * into it; an out-of-line static helper is compiled once, for the baseline (SSE2). Helpers too
 * large for the compiler to inline on its own are marked INLINE. */
#if defined(__GNUC__)
#define INLINE inline __attribute__((always_inline))
#else
#define INLINE inline
#endif

#include "threads.h"

/* the diagonal scan (models/kernels/native/diag.py), real types (complex below) */
#pragma push_macro("CLONES")
#undef CLONES
#define CLONES CLONES_NO512
#define R float
#define CPLX 0
#define SFX f32
#include "diag_body.h"
#undef R
#undef CPLX
#undef SFX

#define R double
#define CPLX 0
#define SFX f64
#include "diag_body.h"
#undef R
#undef CPLX
#undef SFX
#pragma pop_macro("CLONES")

/* the delta-rule forward (models/kernels/native/delta.py; delta_rule's impl="native"), real types only */
#define R float
#define SFX f32
#include "delta_body.h"
#undef R
#undef SFX

#define R double
#define SFX f64
#include "delta_body.h"
#undef R
#undef SFX

/* the RWKV-7 scan, forward and backward (models/kernels/native/rwkv7.py), real types only */
#define R float
#define SFX f32
#include "rwkv7_body.h"
#undef R
#undef SFX

#define R double
#define SFX f64
#include "rwkv7_body.h"
#undef R
#undef SFX

#define R float
#define CPLX 1
#define SFX c64
#include "diag_body.h"
#undef R
#undef CPLX
#undef SFX

#define R double
#define CPLX 1
#define SFX c128
#include "diag_body.h"
#undef R
#undef CPLX
#undef SFX

/* exp for float32 in a form the compiler can vectorise (libm's expf is a call per element, about
 * 4 ns here, more than the rest of a selective-scan step): Cephes' expf. exp(x) = 2^k exp(r) with
 * k = round(x log2 e) and r = x - k ln 2 (ln 2 in two parts, k * 0.693359375 exact), exp(r) by
 * its degree-7 minimax polynomial, 2^k applied as two exact powers of two (so k from -150 to 128
 * needs no special case). x is clamped to [-104, 89], where the same formula rounds to 0 and
 * overflows to inf; NaN stays NaN. Under 1 ulp from exp on a dense grid over the float range
 * (0.99 measured; tests/test_kernels_native_selective.py allows 1.5), torch's float32 exp under 0.6. The
 * selects vectorise only without trapping math (-fno-trapping-math in library.py's FLAGS). */
static inline float exp_f32(float x) {
    float xc = x > -104.0f ? x : -104.0f; /* NaN -> -104 here, restored at the end */
    xc = xc < 89.0f ? xc : 89.0f;
    const float k = (xc * 1.44269504f + 12582912.0f) - 12582912.0f; /* round to nearest (1.5 2^23) */
    const float r = (xc - k * 0.693359375f) - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const int32_t ki = (int32_t)k, k1 = ki / 2, k2 = ki - k1;
    const int32_t bits1 = (k1 + 127) << 23, bits2 = (k2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &bits1, sizeof s1);
    memcpy(&s2, &bits2, sizeof s2);
    const float y = ((p * r) * r + r + 1.0f) * s1 * s2;
    return x != x ? x : y;
}

/* exp_f32 over an array (for the accuracy test). */
void vexp_f32(int64_t n, const float *x, float *y) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = exp_f32(x[i]);
}

/* the selective scan (models/kernels/native/selective.py), real types */

#define R float
#define SFX f32
#define EXP exp_f32
#include "selective_body.h"
#undef R
#undef SFX
#undef EXP

#define R double
#define SFX f64
#define EXP exp
#include "selective_body.h"
#undef R
#undef SFX
#undef EXP

/* sin and cos for float32 in a form the compiler can vectorise (libm's are a call per element):
 * Cephes' sinf / cosf. x = k pi/2 + r with k = round(x 2/pi) and r by Cody-Waite reduction
 * (pi/2 in three parts, the first two short enough that k times them is exact for |x| <= 8192),
 * sin r and cos r by their minimax polynomials on [-pi/4, pi/4], then the quadrant k mod 4 swaps
 * and negates them. Accurate for |x| <= 8192 (SC_MAX_F32); x is clamped to twice that so the
 * integer conversion stays defined, and callers recompute larger (or NaN) angles with libm. */
#define SC_MAX_F32 8192.0f
static inline void sincos_f32(float x, float *s, float *c) {
    float xc = x > -2 * SC_MAX_F32 ? x : -2 * SC_MAX_F32; /* NaN -> the bound: the caller redoes it */
    xc = xc < 2 * SC_MAX_F32 ? xc : 2 * SC_MAX_F32;
    const float k = (xc * 0.63661977236758134f + 12582912.0f) - 12582912.0f; /* round (1.5 2^23) */
    const float r = ((xc - k * 1.5703125f) - k * 4.837512969970703125e-4f) - k * 7.54978995489188216e-8f;
    const float z = r * r;
    const float sr = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * r + r;
    const float cr = ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * z * z
                     - 0.5f * z + 1.0f;
    const int32_t q = (int32_t)k;
    const float sv = (q & 1) ? cr : sr, cv = (q & 1) ? sr : cr; /* sin, cos of r + (q mod 2) pi/2 */
    *s = (q & 2) ? -sv : sv;
    *c = ((q + 1) & 2) ? -cv : cv;
}

/* sincos_f32 over an array (for the accuracy test). */
void vsincos_f32(int64_t n, const float *x, float *s, float *c) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) sincos_f32(x[i], s + i, c + i);
}

static inline void sincos_f64(double x, double *s, double *c) {
    *s = sin(x);
    *c = cos(x);
}

/* AUSSM's and Mamba-3's complex-transition scans (models/kernels/native/complex.py) */
CONTRACT_BEGIN

#define R float
#define SFX f32
#define EXP exp_f32
#define SINCOS sincos_f32
#define SC_MAX SC_MAX_F32
#include "complex_body.h"
#undef R
#undef SFX
#undef EXP
#undef SINCOS
#undef SC_MAX

#define R double
#define SFX f64
#define EXP exp
#define SINCOS sincos_f64
#define SC_MAX HUGE_VAL
#include "complex_body.h"
#undef R
#undef SFX
#undef EXP
#undef SINCOS
#undef SC_MAX
CONTRACT_END

/* the LSTM recurrence (models/kernels/native/lstm.py). sigmoid(x) = 1 / (1 + exp(-x));
 * float32 tanh(x) = 1 - 2 / (1 + exp(2x)) through exp_f32 (vectorised; absolute error about
 * 1e-7, relative error larger only where |tanh x| < 1e-2), float64 through libm. */
static inline float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }
static inline float tanh_f32(float x) { return 1.0f - 2.0f / (1.0f + exp_f32(2.0f * x)); }
static inline double sigmoid_f64(double x) { return 1.0 / (1.0 + exp(-x)); }

CONTRACT_BEGIN
#define R float
#define SFX f32
#define SIGMOID sigmoid_f32
#define TANH tanh_f32
#include "lstm_body.h"
#undef R
#undef SFX
#undef SIGMOID
#undef TANH

#define R double
#define SFX f64
#define SIGMOID sigmoid_f64
#define TANH tanh
#include "lstm_body.h"
#undef R
#undef SFX
#undef SIGMOID
#undef TANH
CONTRACT_END

/* causal attention scores and pattern (models/kernels/native/softmax.py) */
#define R float
#define SFX f32
#define EXP exp_f32
#include "softmax_body.h"
#undef R
#undef SFX
#undef EXP

#define R double
#define SFX f64
#define EXP exp
#include "softmax_body.h"
#undef R
#undef SFX
#undef EXP
