/*
 * simd_avx2.h - small AVX2 helpers shared by the kernels' AVX2 code paths. Include it only where
 * <immintrin.h> is usable (x86-64, GCC or clang); each helper carries its own target attribute, so it
 * inlines into any caller compiled for AVX2.
 */
#ifndef NEURON_SIMD_AVX2_H
#define NEURON_SIMD_AVX2_H

#include <immintrin.h>

/* Sum of the 8 lanes: high half onto low half, then pairs, then the last two. */
static inline __attribute__((always_inline, target("avx2,fma"))) float nk_hsum8_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
