/*
 * gemm_avx2.c - AVX2+FMA micro-kernel of the GEMM (6x16 fp32 register tile) for CPUs without AVX-512.
 * The skinny path uses the portable kernels there.
 */
#include "gemm_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AVX2_TARGET __attribute__((target("avx2,fma")))

#define MR 6
#define NR 16

/* 6 x 16: 12 ymm accumulators + 2 B vectors + 1 broadcast of the 16 registers. */
AVX2_TARGET static void ukr_avx2(int64_t kc, const float *pa, const float *pb, float *c, int64_t ldc,
                                 bool accumulate) {
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_load_ps(pb);
        const __m256 b1 = _mm256_load_ps(pb + 8);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            const __m256 a = _mm256_broadcast_ss(pa + i);
            acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
        pa += MR;
        pb += NR;
    }
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) {
        float *cr = c + i * ldc;
        if (accumulate) {
            acc[i][0] = _mm256_add_ps(acc[i][0], _mm256_loadu_ps(cr));
            acc[i][1] = _mm256_add_ps(acc[i][1], _mm256_loadu_ps(cr + 8));
        }
        _mm256_storeu_ps(cr, acc[i][0]);
        _mm256_storeu_ps(cr + 8, acc[i][1]);
    }
}

AVX2_TARGET void nk_gemm_fma_loop_avx2(int64_t iters, float *sink) {
    __m256 acc[12];
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
    }
    __m256 s = acc[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, acc[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    *sink = out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

const nk_gemm_isa nk_gemm_isa_avx2 = {
    .name = "avx2",
    .mr = MR,
    .nr = NR,
    .ukr = ukr_avx2,
    .pack_a_kcontig = NULL,
    .pack_b_kcontig = NULL,
    .skinny_kcontig = nk_gemm_skinny_kcontig_generic,
    .skinny_ncontig = nk_gemm_skinny_ncontig_generic,
};

#else

const nk_gemm_isa nk_gemm_isa_avx2 = {0};
void nk_gemm_fma_loop_avx2(int64_t iters, float *sink) {
    (void)iters;
    *sink = 0.f;
}

#endif
