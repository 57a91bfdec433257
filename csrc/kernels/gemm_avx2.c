/*
 * gemm_avx2.c - AVX2+FMA kernels of the GEMM for CPUs without AVX-512: the 6x16 fp32 register tile of
 * the packed path and the streaming kernels of the skinny (decode) path. The skinny kernels are what a
 * decoding language model spends its time in: they must read the weight at memory bandwidth, which the
 * portable loop (one scalar dependency chain per output) is far from.
 */
#include "gemm_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline)) AVX2_TARGET

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

/* ---- skinny path ---------------------------------------------------------------------------------- */

/* 8 elements of dtype dt at p as fp32. */
AVX2_INLINE __m256 load8(const char *p, nk_dtype dt) {
    switch (dt) {
    case NK_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    case NK_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    default: return _mm256_loadu_ps((const float *)p);
    }
}

AVX2_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float load1(const char *p, nk_dtype dt) {
    switch (dt) {
    case NK_BF16: return nk_bf16_to_f32(*(const uint16_t *)p);
    case NK_F16: return nk_f16_to_f32(*(const uint16_t *)p);
    default: return *(const float *)p;
    }
}

/*
 * c[ii, jj] = a[ii, :] . B[:, jj] for MB rows and NB columns, B's columns contiguous along k (a linear
 * layer's weight): each of the NB columns streams once, MB*NB accumulators + MB inputs + 1 weight vector
 * stay within the 16 registers. Two k-steps per iteration keep two loads of every column in flight.
 */
AVX2_INLINE void dot_tile(int MB, int NB, int64_t k, const float *a, int64_t lda, const char *b, nk_dtype dt,
                          int64_t es, int64_t ldb, float *c, int64_t ldc) {
    __m256 acc[4][8];
#pragma GCC unroll 4
    for (int ii = 0; ii < MB; ii++)
#pragma GCC unroll 8
        for (int jj = 0; jj < NB; jj++) acc[ii][jj] = _mm256_setzero_ps();
    int64_t k0 = 0;
    for (; k0 + 8 <= k; k0 += 8) {
        __m256 x[4];
#pragma GCC unroll 4
        for (int ii = 0; ii < MB; ii++) x[ii] = _mm256_loadu_ps(a + ii * lda + k0);
#pragma GCC unroll 8
        for (int jj = 0; jj < NB; jj++) {
            const __m256 w = load8(b + (jj * ldb + k0) * es, dt);
#pragma GCC unroll 4
            for (int ii = 0; ii < MB; ii++) acc[ii][jj] = _mm256_fmadd_ps(x[ii], w, acc[ii][jj]);
        }
    }
#pragma GCC unroll 4
    for (int ii = 0; ii < MB; ii++)
#pragma GCC unroll 8
        for (int jj = 0; jj < NB; jj++) {
            float s = hsum8(acc[ii][jj]);
            for (int64_t p = k0; p < k; p++) s += a[ii * lda + p] * load1(b + (jj * ldb + p) * es, dt);
            c[ii * ldc + jj] = s;
        }
}

typedef void (*dot_tile_fn)(int64_t k, const float *a, int64_t lda, const char *b, int64_t ldb, float *c,
                            int64_t ldc);

/* Columns per tile for MB rows (MB*NB + MB + 1 <= 16). */
static const int dot_nb[5] = {0, 8, 6, 4, 2};

#define DOT_FN(DT, ES, MB, NB)                                                                            \
    AVX2_TARGET static void dot_##DT##_##MB##x##NB(int64_t k, const float *a, int64_t lda, const char *b,    \
                                                   int64_t ldb, float *c, int64_t ldc) {                  \
        dot_tile(MB, NB, k, a, lda, b, NK_##DT, ES, ldb, c, ldc);                                        \
    }
#define DOT_ALL(DT, ES)                                                                                   \
    DOT_FN(DT, ES, 1, 8) DOT_FN(DT, ES, 2, 6) DOT_FN(DT, ES, 3, 4) DOT_FN(DT, ES, 4, 2)                   \
    DOT_FN(DT, ES, 1, 1) DOT_FN(DT, ES, 2, 1) DOT_FN(DT, ES, 3, 1) DOT_FN(DT, ES, 4, 1)                   \
    DOT_FN(DT, ES, 1, 2) DOT_FN(DT, ES, 2, 2) DOT_FN(DT, ES, 3, 2)                                         \
    static const dot_tile_fn dot_##DT##_main[5] = {NULL, dot_##DT##_1x8, dot_##DT##_2x6, dot_##DT##_3x4,    \
                                                   dot_##DT##_4x2};                                        \
    static const dot_tile_fn dot_##DT##_nb2[5] = {NULL, dot_##DT##_1x2, dot_##DT##_2x2, dot_##DT##_3x2,     \
                                                  dot_##DT##_4x2};                                         \
    static const dot_tile_fn dot_##DT##_one[5] = {NULL, dot_##DT##_1x1, dot_##DT##_2x1, dot_##DT##_3x1,     \
                                                  dot_##DT##_4x1};

DOT_ALL(F32, 4)
DOT_ALL(BF16, 2)
DOT_ALL(F16, 2)

static void skinny_kcontig_avx2(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                                nk_dtype dt, int64_t ldb, float *c, int64_t ldc) {
    const dot_tile_fn *main_fns, *nb2_fns, *one_fns;
    int64_t es = 2;
    switch (dt) {
    case NK_BF16: main_fns = dot_BF16_main, nb2_fns = dot_BF16_nb2, one_fns = dot_BF16_one; break;
    case NK_F16: main_fns = dot_F16_main, nb2_fns = dot_F16_nb2, one_fns = dot_F16_one; break;
    case NK_F32: main_fns = dot_F32_main, nb2_fns = dot_F32_nb2, one_fns = dot_F32_one, es = 4; break;
    default: nk_gemm_skinny_kcontig_generic(m, n, k, a, lda, b, dt, ldb, c, ldc); return;
    }
    /* More than 4 rows go in blocks of 4, all with the 4-row column count (2): the columns of one
     * tile are re-read from L1 for every block. */
    const int mb0 = m < 4 ? (int)m : 4;
    const int nb = dot_nb[mb0];
    const char *bb = b;
    int64_t j = 0;
    for (; j + nb <= n; j += nb) {
        for (int64_t i = 0; i < m; i += 4) {
            const int mb = m - i < 4 ? (int)(m - i) : 4;
            const dot_tile_fn fn = (mb == mb0) ? main_fns[mb] : nb2_fns[mb];
            fn(k, a + i * lda, lda, bb + j * ldb * es, ldb, c + i * ldc + j, ldc);
        }
    }
    for (; j < n; j++)
        for (int64_t i = 0; i < m; i += 4) {
            const int mb = m - i < 4 ? (int)(m - i) : 4;
            one_fns[mb](k, a + i * lda, lda, bb + j * ldb * es, ldb, c + i * ldc + j, ldc);
        }
}

/*
 * c[ii, 0:nn] = sum_k a[ii, k] * B[k, 0:nn] for MB rows and nn <= 32 columns, B's rows contiguous
 * along n: 4 weight vectors per k, MB*4 accumulators. Columns beyond nn are neither read nor written.
 */
AVX2_INLINE void axpy_tile(int MB, int64_t k, const float *a, int64_t lda, const char *b, nk_dtype dt, int64_t es,
                           int64_t ldb, float *c, int64_t ldc) {
    __m256 acc[2][4];
#pragma GCC unroll 2
    for (int ii = 0; ii < MB; ii++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) acc[ii][v] = _mm256_setzero_ps();
    for (int64_t p = 0; p < k; p++) {
        const char *br = b + p * ldb * es;
        __m256 w[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) w[v] = load8(br + 8 * v * es, dt);
#pragma GCC unroll 2
        for (int ii = 0; ii < MB; ii++) {
            const __m256 x = _mm256_broadcast_ss(a + ii * lda + p);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) acc[ii][v] = _mm256_fmadd_ps(x, w[v], acc[ii][v]);
        }
    }
#pragma GCC unroll 2
    for (int ii = 0; ii < MB; ii++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) _mm256_storeu_ps(c + ii * ldc + 8 * v, acc[ii][v]);
}

#define AXPY_FN(DT, ES, MB)                                                                               \
    AVX2_TARGET static void axpy_##DT##_##MB(int64_t k, const float *a, int64_t lda, const char *b,         \
                                             int64_t ldb, float *c, int64_t ldc) {                        \
        axpy_tile(MB, k, a, lda, b, NK_##DT, ES, ldb, c, ldc);                                           \
    }
AXPY_FN(F32, 4, 1) AXPY_FN(F32, 4, 2) AXPY_FN(BF16, 2, 1) AXPY_FN(BF16, 2, 2) AXPY_FN(F16, 2, 1) AXPY_FN(F16, 2, 2)

static void skinny_ncontig_avx2(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                                nk_dtype dt, int64_t ldb, float *c, int64_t ldc) {
    void (*one)(int64_t, const float *, int64_t, const char *, int64_t, float *, int64_t);
    void (*two)(int64_t, const float *, int64_t, const char *, int64_t, float *, int64_t);
    int64_t es = 2;
    switch (dt) {
    case NK_BF16: one = axpy_BF16_1, two = axpy_BF16_2; break;
    case NK_F16: one = axpy_F16_1, two = axpy_F16_2; break;
    case NK_F32: one = axpy_F32_1, two = axpy_F32_2, es = 4; break;
    default: nk_gemm_skinny_ncontig_generic(m, n, k, a, lda, b, dt, ldb, c, ldc); return;
    }
    const char *bb = b;
    const int64_t n32 = n / 32 * 32;
    for (int64_t j = 0; j < n32; j += 32) {
        int64_t i = 0;
        for (; i + 2 <= m; i += 2) two(k, a + i * lda, lda, bb + j * es, ldb, c + i * ldc + j, ldc);
        if (i < m) one(k, a + i * lda, lda, bb + j * es, ldb, c + i * ldc + j, ldc);
    }
    /* The last columns (fewer than 32): the portable loop, on c shifted to them. */
    if (n32 < n) nk_gemm_skinny_ncontig_generic(m, n - n32, k, a, lda, bb + n32 * es, dt, ldb, c + n32, ldc);
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
    .skinny_kcontig = skinny_kcontig_avx2,
    .skinny_ncontig = skinny_ncontig_avx2,
};

#else

const nk_gemm_isa nk_gemm_isa_avx2 = {0};
void nk_gemm_fma_loop_avx2(int64_t iters, float *sink) {
    (void)iters;
    *sink = 0.f;
}

#endif
