/* Plain-C diagonal affine scan h_t = a_t h_{t-1} + b_t with the optional read-out
 * y_t[l] = sum_n c_t[l, n] h_t[l, n], forward and backward, for float32, float64, complex64 and
 * complex128 (models/kernels/native_scan.py builds and loads it; native_scan_body.h is the code),
 * and the delta-rule forward for float32 and float64 (native_delta_body.h).
 * One sequential pass per batch row over contiguous [T, M] memory: the state stays in cache and
 * every input is read once, so the scan runs at memory bandwidth. No torch headers, no threads. */
#include <stdint.h>
#include <string.h>

#define R float
#define CPLX 0
#define SFX f32
#include "native_scan_body.h"
#undef R
#undef CPLX
#undef SFX

#define R double
#define CPLX 0
#define SFX f64
#include "native_scan_body.h"
#undef R
#undef CPLX
#undef SFX

/* the delta-rule forward (models/kernels/delta_rule.py, impl="native"), real types only; an AVX2
 * clone beside the baseline one where the toolchain can dispatch at load time (ifunc: glibc) */
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define DELTA_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef DELTA_CLONES
#define DELTA_CLONES
#endif

#define R float
#define SFX f32
#include "native_delta_body.h"
#undef R
#undef SFX

#define R double
#define SFX f64
#include "native_delta_body.h"
#undef R
#undef SFX

#define R float
#define CPLX 1
#define SFX c64
#include "native_scan_body.h"
#undef R
#undef CPLX
#undef SFX

#define R double
#define CPLX 1
#define SFX c128
#include "native_scan_body.h"
#undef R
#undef CPLX
#undef SFX
