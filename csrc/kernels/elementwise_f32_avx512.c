/* elementwise_f32_avx512.c - the float32 element-wise loops compiled for AVX-512 (picked at run time). */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")
#define NK_VM_FMA(a, b, c) __builtin_fmaf((a), (b), (c))
#define NK_EW_TABLE nk_ew_f32_avx512
#define NK_EW_ISA_NAME "avx512"
#include "elementwise_f32.h"

#include <immintrin.h>

/*
 * float -> bfloat16 with vcvtneps2bf16 (AVX512_BF16). It rounds to nearest-even like c10::BFloat16,
 * but it flushes subnormal inputs to zero where PyTorch rounds them, and keeps a NaN's sign and payload
 * where c10 (and the portable loop) gives 0x7FC0. Those lanes, rare, are redone, so every ISA gives the
 * same bits.
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
static void nk_ew_f32_to_bf16_cvtne(uint16_t *d, const float *s, int64_t n) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), one = _mm512_set1_epi32(1);
    const __m512i sub_limit = _mm512_set1_epi32(0x007FFFFF), bias = _mm512_set1_epi32(0x7FFF);
    const __m512i inf_bits = _mm512_set1_epi32(0x7F800000);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        const __m512 v = _mm512_maskz_loadu_ps(m, s + i);
        __m256i r = (__m256i)_mm512_cvtneps_pbh(v);
        const __m512i u = _mm512_castps_si512(v);
        /* |u| in [1, 0x7FFFFF]: a nonzero subnormal (|u| - 1 wraps for zero). */
        const __m512i a = _mm512_and_si512(u, abs_mask);
        const __mmask16 sub = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(a, one), sub_limit);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(a, inf_bits);
        if (sub | nan) {
            const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
            const __m512i t = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), lsb), 16);
            r = _mm256_mask_mov_epi16(r, sub, _mm512_cvtepi32_epi16(t));
            r = _mm256_mask_mov_epi16(r, nan, _mm256_set1_epi16(0x7FC0));
        }
        _mm256_mask_storeu_epi16(d + i, m, r);
    }
}

const nk_ew_f32_table nk_ew_f32_avx512bf16 = NK_EW_TABLE_INIT("avx512bf16", nk_ew_f32_to_bf16_cvtne);
#pragma GCC pop_options
#endif
