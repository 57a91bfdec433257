/*
 * reduce_simd.h - float-row building blocks of the reduction, softmax, norm and loss kernels.
 *
 * Every kernel of this family converts a row (any float dtype, any stride) into a float buffer on the
 * stack, works on contiguous floats, and converts back on store. So the SIMD code below only ever sees
 * float arrays. It is written with GCC vector extensions (16 floats per vector): the bodies are
 * always_inline and instantiated per ISA by NK_SIMD_FN, so the same source becomes AVX-512 (one zmm),
 * AVX2 (one ymm: 8 lanes there) or baseline SSE2 code, chosen at run time by nk_reduce_isa().
 */
#ifndef NEURON_REDUCE_SIMD_H
#define NEURON_REDUCE_SIMD_H

#include "kernels_internal.h"

#include <float.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#pragma GCC diagnostic ignored "-Wpsabi"

#define NK_AI static inline __attribute__((always_inline))

/* 2: AVX-512, 1: AVX2+FMA, 0: baseline. */
int nk_reduce_isa(void);

/* Rows are processed in chunks of this many floats (16 KiB of stack). */
#define NK_CHUNK 4096
/* Columns per block of a column sum (nk_colsum): its 4 cascade levels take 4 KiB each. */
#define NK_COLTILE 1024

typedef float nk_v16f __attribute__((vector_size(64)));
typedef int32_t nk_v16i __attribute__((vector_size(64)));
typedef uint32_t nk_v16u __attribute__((vector_size(64)));
typedef uint16_t nk_v16h __attribute__((vector_size(32)));
typedef float nk_v8f __attribute__((vector_size(32)));
typedef int32_t nk_v8i __attribute__((vector_size(32)));
typedef uint32_t nk_v8u __attribute__((vector_size(32)));
typedef uint16_t nk_v8h __attribute__((vector_size(16)));

/* A lane-0 shuffle becomes one broadcast; a 16-element initializer is built lane by lane by GCC. */
/* m ? a : b for a comparison mask m (all ones / zeros per lane). */

/*
 * exp for float lanes: x = n*ln2 + r, |r| <= ln2/2, e^r by its degree-7 Taylor polynomial (truncation
 * below 1e-8 relative), times 2^n built in the exponent bits. Max error ~2 ulp. x > 88.72 gives inf,
 * x < -87.34 gives 0 (PyTorch would give a subnormal), NaN stays NaN.
 */
#define NK_EXP_BODY(T, SPLAT, BITS, FLOAT, SEL, LT, GT, NE, x, out)                                     \
    do {                                                                                                 \
        T xc_ = SEL(LT(x, SPLAT(-86.5f)), SPLAT(-86.5f), x);                                              \
        xc_ = SEL(GT(xc_, SPLAT(88.7f)), SPLAT(88.7f), xc_);                                              \
        T t_ = xc_ * SPLAT(1.44269504088896341f) + SPLAT(12582912.0f);                                    \
        T n_ = t_ - SPLAT(12582912.0f);                                                                   \
        T r_ = xc_ - n_ * SPLAT(0.693359375f);                                                            \
        r_ = r_ + n_ * SPLAT(2.12194440e-4f);                                                             \
        T p_ = SPLAT(1.0f / 5040.0f);                                                                     \
        p_ = p_ * r_ + SPLAT(1.0f / 720.0f);                                                              \
        p_ = p_ * r_ + SPLAT(1.0f / 120.0f);                                                              \
        p_ = p_ * r_ + SPLAT(1.0f / 24.0f);                                                               \
        p_ = p_ * r_ + SPLAT(1.0f / 6.0f);                                                                \
        p_ = p_ * r_ + SPLAT(0.5f);                                                                       \
        p_ = p_ * r_ + SPLAT(1.0f);                                                                       \
        p_ = p_ * r_ + SPLAT(1.0f);                                                                       \
        T s_ = FLOAT(((BITS(t_) - BITS(SPLAT(12582912.0f))) + 126u) << 23);                               \
        T e_ = p_ * s_ * SPLAT(2.0f);                                                                     \
        e_ = SEL(GT(x, SPLAT(88.72283f)), SPLAT(INFINITY), e_);                                           \
        e_ = SEL(LT(x, SPLAT(-87.33654f)), SPLAT(0.0f), e_);                                              \
        out = SEL(NE(x, x), x, e_);                                                                       \
    } while (0)

#define NK_VLT(a, b) ((a) < (b))
#define NK_VGT(a, b) ((a) > (b))
/* NaN test on the bits: GCC scalarises vector float `x != x` (and `x == x`) lane by lane. */
#define NK_VISNAN(v) ((nk_vbits(v) & 0x7FFFFFFF) > 0x7F800000)
#define NK_VNE(a, b) NK_VISNAN(a)
#define NK_SNE(a, b) ((a) != (b))

NK_AI float nk_sid(float f) { return f; }
/* Unsigned, so the exponent shift of a NaN's garbage is defined behaviour. */
NK_AI uint32_t nk_sbits(float f) { return nk_f32_bits(f); }
NK_AI float nk_sfloat(uint32_t i) { return nk_f32_from_bits(i); }
#define NK_SSEL(c, a, b) ((c) ? (a) : (b))
/* The scalar twin, bit-identical to a lane of nk_vexp. */
static inline float nk_exp_f32(float x) {
    float out;
    NK_EXP_BODY(float, nk_sid, nk_sbits, nk_sfloat, NK_SSEL, NK_VLT, NK_VGT, NK_SNE, x, out);
    return out;
}

/* ---- dtype <-> float rows ---- */





static inline float nk_load_f32(const char *p, nk_dtype t) {
    switch (t) {
    case NK_F32: return *(const float *)p;
    case NK_BF16: return nk_bf16_to_f32(*(const uint16_t *)p);
    case NK_F16: return nk_f16_to_f32(*(const uint16_t *)p);
    case NK_F64: return (float)*(const double *)p;
    default: return 0.0f;
    }
}

static inline void nk_store_f32(char *p, nk_dtype t, float v) {
    switch (t) {
    case NK_F32: *(float *)p = v; break;
    case NK_BF16: *(uint16_t *)p = nk_f32_to_bf16(v); break;
    case NK_F16: *(uint16_t *)p = nk_f32_to_f16(v); break;
    case NK_F64: *(double *)p = v; break;
    default: break;
    }
}

static inline bool nk_is_half_or_float(nk_dtype t) { return t == NK_F32 || t == NK_BF16 || t == NK_F16; }



/* ---- float-row kernels ---- */


/*
 * Sum in float with PyTorch's CPU summation order (8-lane vectors as its reduction kernels use,
 * 4 interleaved vector accumulators, a 4-level cascade flushing every 2^k vector groups, the scalar
 * tail first and the lanes added one by one), so sums and means of contiguous rows round exactly like
 * PyTorch's. The 8-lane vectors still compile to full-width SIMD on every ISA.
 */

/* The same cascade over single elements: PyTorch's order for a strided (outer) reduction. */
static inline float nk_sum_cascade1(const float *x, int64_t n) {
    int64_t lg = 0;
    while ((INT64_C(1) << lg) < n) lg++;
    const int64_t power = lg / 4 > 4 ? lg / 4 : 4, step = INT64_C(1) << power, mask = step - 1;
    float acc[4] = {0, 0, 0, 0};
    int64_t i = 0;
    while (i + step <= n) {
        for (int64_t j = 0; j < step; j++, i++) acc[0] += x[i];
        for (int l = 1; l < 4; l++) {
            acc[l] += acc[l - 1];
            acc[l - 1] = 0;
            if ((i & (mask << (l * power))) != 0) break;
        }
    }
    for (; i < n; i++) acc[0] += x[i];
    return ((acc[0] + acc[1]) + acc[2]) + acc[3];
}







#define NK_BODY static __attribute__((unused))

/* The ISAs with FMA fuse a * b + c (C11 mode turns contraction off): the exp polynomial is a chain of
 * them, and fused it is both shorter and rounded once. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#pragma GCC optimize("fp-contract=fast")
#define NK_ISA avx512
#include "reduce_simd_body.h"
#undef NK_ISA
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("fp-contract=fast")
#define NK_ISA avx2
#include "reduce_simd_body.h"
#undef NK_ISA
#pragma GCC pop_options

#define NK_ISA base
#include "reduce_simd_body.h"
#undef NK_ISA

/* `name` dispatches to name_body_<isa> (reduce_simd_body.h). `params` is the parenthesised parameter
 * list, `args` the matching argument list. */
#define NK_SIMD_FN(ret, name, params, args)                                                              \
    static inline ret name params {                                                                      \
        const int isa_ = nk_reduce_isa();                                                                \
        return isa_ == 2 ? name##_body_avx512 args : isa_ == 1 ? name##_body_avx2 args : name##_body_base args; \
    }

#endif /* NEURON_REDUCE_SIMD_H */
