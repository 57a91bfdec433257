/* elementwise_f32_avx512.c - the float32 element-wise loops compiled for AVX-512 (picked at run time). */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")
#define NK_VM_FMA(a, b, c) __builtin_fmaf((a), (b), (c))
#define NK_EW_TABLE nk_ew_f32_avx512
#define NK_EW_ISA_NAME "avx512"
#include "elementwise_f32.h"

#include <immintrin.h>

#define NK_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512bf16")))

/*
 * float -> bfloat16 with vcvtneps2bf16 (AVX512_BF16). It rounds to nearest-even like c10::BFloat16,
 * but it flushes subnormal inputs to zero where PyTorch rounds them, and keeps a NaN's sign and payload
 * where c10 (and the portable loop) gives 0x7FC0. Those lanes, rare, are redone, so every ISA gives the
 * same bits.
 */
NK_BF16_TARGET static inline __m256i nk_ew_v_to_bf16(__m512 v) {
    const __m512i one = _mm512_set1_epi32(1);
    __m256i r = (__m256i)_mm512_cvtneps_pbh(v);
    const __m512i u = _mm512_castps_si512(v);
    const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    /* |u| in [1, 0x7FFFFF]: a nonzero subnormal (|u| - 1 wraps for zero). */
    const __mmask16 sub = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(a, one), _mm512_set1_epi32(0x007FFFFF));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
    if (sub | nan) {
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        const __m512i t = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
        r = _mm256_mask_mov_epi16(r, sub, _mm512_cvtepi32_epi16(t));
        r = _mm256_mask_mov_epi16(r, nan, _mm256_set1_epi16(0x7FC0));
    }
    return r;
}

NK_BF16_TARGET static inline __m512 nk_ew_v_from_bf16(__mmask16 m, const uint16_t *p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

NK_BF16_TARGET static void nk_ew_f32_to_bf16_cvtne(uint16_t *d, const float *s, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = nk_ew_tail_mask(n - i);
        _mm256_mask_storeu_epi16(d + i, m, nk_ew_v_to_bf16(_mm512_maskz_loadu_ps(m, s + i)));
    }
}

/* The fused bfloat16 ops: widen, compute in float as the blocked path does, round once. */
#define NK_EW_BF16_UNARY(name, vexpr)                                                              \
    NK_BF16_TARGET static int nk_ew_bf16_##name(void *o_, const void *const *in, int64_t n,       \
                                                const nk_ew_args *A) {                            \
        uint16_t *o = (uint16_t *)o_;                                                              \
        const uint16_t *x = (const uint16_t *)in[0];                                               \
        (void)A;                                                                                   \
        for (int64_t i = 0; i < n; i += 16) {                                                      \
            const __mmask16 m = nk_ew_tail_mask(n - i);                                            \
            const __m512 v = nk_ew_v_from_bf16(m, x + i);                                          \
            _mm256_mask_storeu_epi16(o + i, m, nk_ew_v_to_bf16(vexpr));                            \
        }                                                                                          \
        return 0;                                                                                  \
    }
#define NK_EW_BF16_BINARY(name, vexpr)                                                             \
    NK_BF16_TARGET static int nk_ew_bf16_##name(void *o_, const void *const *in, int64_t n,       \
                                                const nk_ew_args *A) {                            \
        uint16_t *o = (uint16_t *)o_;                                                              \
        const uint16_t *x = (const uint16_t *)in[0], *y = (const uint16_t *)in[1];                 \
        const __m512 alpha = _mm512_set1_ps(A->f32[NK_ARG_ALPHA]);                                 \
        (void)alpha;                                                                               \
        for (int64_t i = 0; i < n; i += 16) {                                                      \
            const __mmask16 m = nk_ew_tail_mask(n - i);                                            \
            const __m512 a = nk_ew_v_from_bf16(m, x + i), b = nk_ew_v_from_bf16(m, y + i);         \
            _mm256_mask_storeu_epi16(o + i, m, nk_ew_v_to_bf16(vexpr));                            \
        }                                                                                          \
        return 0;                                                                                  \
    }
/* The same with b (vs) or a (sv) one float for the whole call: a column-broadcast operand. */
#define NK_EW_BF16_BINARY_SCALAR(name, vexpr)                                                      \
    NK_BF16_TARGET static int nk_ew_bf16_##name##_vs(void *o_, const void *const *in, int64_t n,  \
                                                     const nk_ew_args *A) {                       \
        uint16_t *o = (uint16_t *)o_;                                                              \
        const uint16_t *x = (const uint16_t *)in[0];                                               \
        const __m512 alpha = _mm512_set1_ps(A->f32[NK_ARG_ALPHA]), b = _mm512_set1_ps(*(const float *)in[1]); \
        (void)alpha;                                                                               \
        for (int64_t i = 0; i < n; i += 16) {                                                      \
            const __mmask16 m = nk_ew_tail_mask(n - i);                                            \
            const __m512 a = nk_ew_v_from_bf16(m, x + i);                                          \
            _mm256_mask_storeu_epi16(o + i, m, nk_ew_v_to_bf16(vexpr));                            \
        }                                                                                          \
        return 0;                                                                                  \
    }                                                                                              \
    NK_BF16_TARGET static int nk_ew_bf16_##name##_sv(void *o_, const void *const *in, int64_t n,  \
                                                     const nk_ew_args *A) {                       \
        uint16_t *o = (uint16_t *)o_;                                                              \
        const uint16_t *y = (const uint16_t *)in[1];                                               \
        const __m512 alpha = _mm512_set1_ps(A->f32[NK_ARG_ALPHA]), a = _mm512_set1_ps(*(const float *)in[0]); \
        (void)alpha;                                                                               \
        for (int64_t i = 0; i < n; i += 16) {                                                      \
            const __mmask16 m = nk_ew_tail_mask(n - i);                                            \
            const __m512 b = nk_ew_v_from_bf16(m, y + i);                                          \
            _mm256_mask_storeu_epi16(o + i, m, nk_ew_v_to_bf16(vexpr));                            \
        }                                                                                          \
        return 0;                                                                                  \
    }
/* add: a + alpha * b fused (as nk_ew_f32_add with alpha != 1; with alpha == 1 the fma is exact a + b). */
#define NK_EW_BF16_ADD _mm512_fmadd_ps(alpha, b, a)
NK_EW_BF16_BINARY(add, NK_EW_BF16_ADD)
NK_EW_BF16_BINARY(mul, _mm512_mul_ps(a, b))
NK_EW_BF16_BINARY(div, _mm512_div_ps(a, b))
NK_EW_BF16_BINARY_SCALAR(add, NK_EW_BF16_ADD)
NK_EW_BF16_BINARY_SCALAR(mul, _mm512_mul_ps(a, b))
NK_EW_BF16_BINARY_SCALAR(div, _mm512_div_ps(a, b))
NK_EW_BF16_UNARY(silu, nk_ew_v_silu(v))

const nk_ew_f32_table nk_ew_f32_avx512bf16 = NK_EW_TABLE_INIT(
    "avx512bf16", nk_ew_f32_to_bf16_cvtne,
    .bf16 = {[NK_EW_BINARY(NK_ADD)] = nk_ew_bf16_add, [NK_EW_BINARY(NK_MUL)] = nk_ew_bf16_mul,
             [NK_EW_BINARY(NK_DIV)] = nk_ew_bf16_div, [NK_EW_UNARY(NK_SILU)] = nk_ew_bf16_silu},
    .bf16_vs = {[NK_ADD] = nk_ew_bf16_add_vs, [NK_MUL] = nk_ew_bf16_mul_vs, [NK_DIV] = nk_ew_bf16_div_vs},
    .bf16_sv = {[NK_ADD] = nk_ew_bf16_add_sv, [NK_MUL] = nk_ew_bf16_mul_sv, [NK_DIV] = nk_ew_bf16_div_sv});
#pragma GCC pop_options
#endif
