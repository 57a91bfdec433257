/*
 * gemm_avx512_tile.h - the ends of an AVX-512 register tile that the fp32 and the bf16-dot micro-kernels
 * share: rows of 32 fp32 accumulators (two vectors) against a C tile of row stride ldc. Included by
 * gemm_avx512.c and gemm_avx512bf16.c; the functions carry the common subset of their targets, so they
 * inline into either.
 */
#ifndef NK_GEMM_AVX512_TILE_H
#define NK_GEMM_AVX512_TILE_H

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#define NK_TILE_INLINE static inline __attribute__((always_inline, target("avx512f")))

/* The C tile is needed only at the end; fetch it at the start (its rows are often 4 KiB apart and
 * conflict in L1, so they would otherwise miss right when the stores want them). */
NK_TILE_INLINE void nk_tile_prefetch_c(const float *c, int64_t ldc, int rows) {
#pragma GCC unroll 12
    for (int i = 0; i < rows; i++) {
        _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + i * ldc + 16), _MM_HINT_T0);
    }
}

/* c (rows x 32) = (accumulate ? c : 0) + acc. */
NK_TILE_INLINE void nk_tile_store_c(float *c, int64_t ldc, __m512 (*acc)[2], int rows, bool accumulate) {
    if (accumulate) {
#pragma GCC unroll 12
        for (int i = 0; i < rows; i++) {
            float *cr = c + i * ldc;
            _mm512_storeu_ps(cr, _mm512_add_ps(_mm512_loadu_ps(cr), acc[i][0]));
            _mm512_storeu_ps(cr + 16, _mm512_add_ps(_mm512_loadu_ps(cr + 16), acc[i][1]));
        }
    } else {
#pragma GCC unroll 12
        for (int i = 0; i < rows; i++) {
            _mm512_storeu_ps(c + i * ldc, acc[i][0]);
            _mm512_storeu_ps(c + i * ldc + 16, acc[i][1]);
        }
    }
}

#endif
