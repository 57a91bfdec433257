/*
 * gemm_avx2.c - AVX2+FMA kernels of the GEMM for CPUs without AVX-512: the 6x16 fp32 register tile
 * of the packed path, the transposing packers for operands stored k-contiguous, and the streaming
 * kernels of the skinny (decode) path. Every function carries its own target attribute and is only
 * called after the runtime check in gemm.c.
 */
#include "gemm_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "simd_avx2.h"

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

#define MR 6
#define NR 16

/* The k loop of the 6 x 16 tile: 12 ymm accumulators + 2 B vectors + 1 broadcast of the 16 registers. With
 * tick false (nothing to prefetch, the common case) the loop carries no prefetch bookkeeping: the walk's
 * compare and branch per step cost the tile 5-10% of its L1-resident speed, and unrolling by 4 rather
 * than 2 another ~10% (best of 30 rounds on Zen 3: 68 -> 85 GFLOP/s of a 91 GFLOP/s FMA peak). */
AVX2_INLINE void ukr_avx2_loop(int64_t kc, const float *pa, const float *pb, __m256 acc[MR][2], nk_gemm_prefetch *w,
                               bool tick) {
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_load_ps(pb);
        const __m256 b1 = _mm256_load_ps(pb + 8);
        /* The A micro-panel streams from L2: ask for it a few iterations early. */
        _mm_prefetch((const char *)(pa + 8 * MR), _MM_HINT_T0);
        if (tick) nk_gemm_prefetch_tick(w, k);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            const __m256 a = _mm256_broadcast_ss(pa + i);
            acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
        pa += MR;
        pb += NR;
    }
}

AVX2_TARGET static void ukr_avx2(int64_t kc, const float *pa, const float *pb, float *c, int64_t ldc,
                                 bool accumulate, nk_gemm_prefetch *pf) {
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    /* The C tile is needed only at the end; fetch it now (its rows are often 4 KiB apart and conflict
     * in L1, so they would otherwise miss right when the stores want them). */
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++) _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
    if (pf->n > 0) {
        nk_gemm_prefetch w = *pf; /* in registers while the loop runs */
        ukr_avx2_loop(kc, pa, pb, acc, &w, true);
        *pf = w; /* the next call continues the walk */
    } else {
        ukr_avx2_loop(kc, pa, pb, acc, pf, false);
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

/* ---- loads of fp32 / bf16 / fp16 as fp32 ---------------------------------------------------------- */

AVX2_INLINE __m256 load8_full(const void *p, nk_dtype dt) {
    if (dt == NK_BF16) {
        const __m128i h = _mm_loadu_si128((const __m128i *)p);
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    if (dt == NK_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return _mm256_loadu_ps((const float *)p);
}

/* n < 8 elements (the rest 0). AVX2 has no masked 16-bit load: the tail goes through a small buffer,
 * so nothing past the tensor is read. */
AVX2_INLINE __m256 load8_part(const void *p, nk_dtype dt, size_t es, int64_t n) {
    uint8_t buf[32] __attribute__((aligned(32))) = {0};
    memcpy(buf, p, (size_t)n * es);
    return load8_full(buf, dt);
}

AVX2_INLINE __m256 load8(const void *p, nk_dtype dt, size_t es, int64_t n) {
    return n >= 8 ? load8_full(p, dt) : load8_part(p, dt, es, n);
}

AVX2_INLINE __m256i lane_mask(int64_t n) {
    static const int32_t ramp[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(n < 8 ? n : 8)), _mm256_loadu_si256((const __m256i *)ramp));
}

/* r[j] holds 8 consecutive k of row/column j; afterwards r[k] holds j = 0..7 at that k. */
AVX2_INLINE void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int p = 0; p < 4; p++) {
        t[2 * p] = _mm256_unpacklo_ps(r[2 * p], r[2 * p + 1]);
        t[2 * p + 1] = _mm256_unpackhi_ps(r[2 * p], r[2 * p + 1]);
    }
    for (int q = 0; q < 2; q++) {
        const __m256 t0 = t[4 * q], t1 = t[4 * q + 1], t2 = t[4 * q + 2], t3 = t[4 * q + 3];
        u[4 * q + 0] = _mm256_shuffle_ps(t0, t2, 0x44);
        u[4 * q + 1] = _mm256_shuffle_ps(t0, t2, 0xEE);
        u[4 * q + 2] = _mm256_shuffle_ps(t1, t3, 0x44);
        u[4 * q + 3] = _mm256_shuffle_ps(t1, t3, 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
    }
}

/* ---- transposing packers ------------------------------------------------------------------------------ */

/* B[k, j] (j < NR) at src + (k + j*ldj) elements -> kc rows of NR floats, by 8x8 transposes. */
AVX2_INLINE void pack_b_kcontig_dt(float *dst, const char *src, nk_dtype dt, size_t es, int64_t ldj, int64_t kc) {
    for (int64_t k0 = 0; k0 < kc; k0 += 8) {
        const int64_t kn = kc - k0 < 8 ? kc - k0 : 8;
        for (int half = 0; half < NR / 8; half++) {
            __m256 r[8];
            for (int j = 0; j < 8; j++) {
                const char *q = src + ((half * 8 + j) * ldj + k0) * (int64_t)es;
                /* 16 strided streams are more than the hardware prefetcher follows. */
                _mm_prefetch(q + 256, _MM_HINT_T0);
                r[j] = load8(q, dt, es, kn);
            }
            transpose8(r);
            for (int64_t k = 0; k < kn; k++) _mm256_store_ps(dst + (k0 + k) * NR + half * 8, r[k]);
        }
    }
}

AVX2_TARGET static void pack_b_kcontig_avx2(float *dst, const void *src, nk_dtype dt, int64_t ldj, int64_t kc) {
    switch (dt) {
    case NK_BF16: pack_b_kcontig_dt(dst, src, NK_BF16, 2, ldj, kc); break;
    case NK_F16: pack_b_kcontig_dt(dst, src, NK_F16, 2, ldj, kc); break;
    default: pack_b_kcontig_dt(dst, src, NK_F32, 4, ldj, kc); break;
    }
}

/* A[i, k] (i < MR) at src + (i*ldi + k) -> kc groups of MR floats: 8-row transposes, rows MR..7 zero. */
AVX2_INLINE void pack_a_kcontig_dt(float *dst, const char *src, nk_dtype dt, size_t es, int64_t ldi, int64_t kc) {
    const __m256i keep = lane_mask(MR);
    for (int64_t k0 = 0; k0 < kc; k0 += 8) {
        const int64_t kn = kc - k0 < 8 ? kc - k0 : 8;
        __m256 r[8];
        for (int i = 0; i < MR; i++) r[i] = load8(src + (i * ldi + k0) * (int64_t)es, dt, es, kn);
        for (int i = MR; i < 8; i++) r[i] = _mm256_setzero_ps();
        transpose8(r);
        for (int64_t k = 0; k < kn; k++) _mm256_maskstore_ps(dst + (k0 + k) * MR, keep, r[k]);
    }
}

AVX2_TARGET static void pack_a_kcontig_avx2(float *dst, const void *src, nk_dtype dt, int64_t ldi, int64_t kc) {
    switch (dt) {
    case NK_BF16: pack_a_kcontig_dt(dst, src, NK_BF16, 2, ldi, kc); break;
    case NK_F16: pack_a_kcontig_dt(dst, src, NK_F16, 2, ldi, kc); break;
    default: pack_a_kcontig_dt(dst, src, NK_F32, 4, ldi, kc); break;
    }
}

/* ---- skinny path: dot products along contiguous k ----------------------------------------------- */

/* Bytes ahead of each column's loads that the widening dot loops (fp32, fp16, a bf16 row's last k % 16)
 * prefetch, one line per line read. A decode GEMV streams its weight from memory with few instructions
 * per byte in flight, so the out-of-order window alone keeps too few lines coming; 8 KiB ahead (past the
 * tile's 6 rows at k = 768) raised bf16 decode GEMVs, when they still widened every load, from 15.5-18.1
 * to 17.6-20.5 GB/s on 2 Zen 3 cores. Prefetches never fault, so running past the weight is harmless. */
#define DOT_PREFETCH_BYTES 8192

/* c[ii, jj] = a[ii, :] . B[:, jj] for MB rows and NB columns; the NB columns of B stream once.
 *
 * bf16 B takes a in pair order (nk_gemm_pair_index, the ISA table's skinny_bf16_pairs): a 32-byte load
 * holds 8 (even, odd) pairs of k; the odd ones become fp32 by clearing the low half, the even ones by a
 * shift, each multiplied against its 8 values of a. 5 instructions per 32 bytes of weight instead of 8 for
 * two widened 8-lane loads, and a decode GEMV is bound by how many weight lines each core keeps in
 * flight. That loop prefetches one tile ahead (the next NB columns at the same k; a [N, K] weight's rows
 * are contiguous): on 1-2 Zen 3 cores, 32000x2048 bf16 GEMVs read 1.2-1.6x the bytes per second of the
 * widening loop with its 8 KiB prefetch (the best-of-15 of a standalone loop on a shared host). The k
 * past the last whole block of 16 are in order and take the loops below. */
AVX2_INLINE void dot_tile(int MB, int NB, int64_t k, const float *a, int64_t lda, const char *b, nk_dtype dt,
                          size_t es, int64_t ldb, float *c, int64_t ldc) {
    __m256 acc[4][6];
#pragma GCC unroll 4
    for (int ii = 0; ii < MB; ii++)
#pragma GCC unroll 6
        for (int jj = 0; jj < NB; jj++) acc[ii][jj] = _mm256_setzero_ps();
    int64_t k0 = 0;
    if (dt == NK_BF16) {
        const __m256i hi = _mm256_set1_epi32((int32_t)0xFFFF0000u);
        const int64_t ahead = (int64_t)NB * ldb * 2;
        for (; k0 + 16 <= k; k0 += 16) {
            if ((k0 & 31) == 0)
#pragma GCC unroll 6
                for (int jj = 0; jj < NB; jj++) _mm_prefetch(b + (jj * ldb + k0) * 2 + ahead, _MM_HINT_T0);
#pragma GCC unroll 6
            for (int jj = 0; jj < NB; jj++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(b + (jj * ldb + k0) * 2));
                const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(w, hi));
                const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
#pragma GCC unroll 4
                for (int ii = 0; ii < MB; ii++) {
                    acc[ii][jj] = _mm256_fmadd_ps(_mm256_loadu_ps(a + ii * lda + k0), we, acc[ii][jj]);
                    acc[ii][jj] = _mm256_fmadd_ps(_mm256_loadu_ps(a + ii * lda + k0 + 8), wo, acc[ii][jj]);
                }
            }
        }
    }
    const int64_t line_k = 64 / (int64_t)es; /* k per cache line */
    for (; k0 + 8 <= k; k0 += 8) {
        __m256 w[6];
        if ((k0 & (line_k - 1)) == 0)
#pragma GCC unroll 6
            for (int jj = 0; jj < NB; jj++)
                _mm_prefetch(b + (jj * ldb + k0) * (int64_t)es + DOT_PREFETCH_BYTES, _MM_HINT_T0);
#pragma GCC unroll 6
        for (int jj = 0; jj < NB; jj++) w[jj] = load8_full(b + (jj * ldb + k0) * (int64_t)es, dt);
#pragma GCC unroll 4
        for (int ii = 0; ii < MB; ii++) {
            const __m256 x = _mm256_loadu_ps(a + ii * lda + k0);
#pragma GCC unroll 6
            for (int jj = 0; jj < NB; jj++) acc[ii][jj] = _mm256_fmadd_ps(x, w[jj], acc[ii][jj]);
        }
    }
    if (k0 < k) {
        const int64_t kn = k - k0;
        const __m256i m = lane_mask(kn);
        __m256 w[6];
#pragma GCC unroll 6
        for (int jj = 0; jj < NB; jj++) w[jj] = load8_part(b + (jj * ldb + k0) * (int64_t)es, dt, es, kn);
#pragma GCC unroll 4
        for (int ii = 0; ii < MB; ii++) {
            const __m256 x = _mm256_maskload_ps(a + ii * lda + k0, m);
#pragma GCC unroll 6
            for (int jj = 0; jj < NB; jj++) acc[ii][jj] = _mm256_fmadd_ps(x, w[jj], acc[ii][jj]);
        }
    }
#pragma GCC unroll 4
    for (int ii = 0; ii < MB; ii++)
#pragma GCC unroll 6
        for (int jj = 0; jj < NB; jj++) c[ii * ldc + jj] = nk_hsum8_avx2(acc[ii][jj]);
}

typedef void (*dot_tile_fn)(int64_t k, const float *a, int64_t lda, const char *b, int64_t ldb, float *c,
                            int64_t ldc);

/* Columns per tile for MB rows: MB*NB accumulators + NB weights + 1 input within the 16 registers. */
static const int dot_nb[5] = {0, 6, 4, 3, 2};

#define DOT_FN(DT, ES, MB, NB)                                                                            \
    AVX2_TARGET static void dot_##DT##_##MB##x##NB(int64_t k, const float *a, int64_t lda, const char *b,    \
                                                   int64_t ldb, float *c, int64_t ldc) {                  \
        dot_tile(MB, NB, k, a, lda, b, NK_##DT, ES, ldb, c, ldc);                                        \
    }
#define DOT_ALL(DT, ES)                                                                                   \
    DOT_FN(DT, ES, 1, 6) DOT_FN(DT, ES, 2, 4) DOT_FN(DT, ES, 3, 3) DOT_FN(DT, ES, 4, 2)                     \
    DOT_FN(DT, ES, 1, 2) DOT_FN(DT, ES, 2, 2) DOT_FN(DT, ES, 3, 2)                                         \
    DOT_FN(DT, ES, 1, 1) DOT_FN(DT, ES, 2, 1) DOT_FN(DT, ES, 3, 1) DOT_FN(DT, ES, 4, 1)                     \
    static const dot_tile_fn dot_##DT##_main[5] = {NULL, dot_##DT##_1x6, dot_##DT##_2x4, dot_##DT##_3x3,   \
                                                   dot_##DT##_4x2};                                       \
    static const dot_tile_fn dot_##DT##_nb2[5] = {NULL, dot_##DT##_1x2, dot_##DT##_2x2, dot_##DT##_3x2,    \
                                                  dot_##DT##_4x2};                                        \
    static const dot_tile_fn dot_##DT##_one[5] = {NULL, dot_##DT##_1x1, dot_##DT##_2x1, dot_##DT##_3x1,    \
                                                  dot_##DT##_4x1};

DOT_ALL(F32, 4)
DOT_ALL(BF16, 2)
DOT_ALL(F16, 2)

static void skinny_kcontig_avx2(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                                nk_dtype dt, int64_t ldb, float *c, int64_t ldc) {
    const dot_tile_fn *main_fns, *nb2_fns, *one_fns;
    size_t es = 2;
    switch (dt) {
    case NK_BF16: main_fns = dot_BF16_main, nb2_fns = dot_BF16_nb2, one_fns = dot_BF16_one; break;
    case NK_F16: main_fns = dot_F16_main, nb2_fns = dot_F16_nb2, one_fns = dot_F16_one; break;
    case NK_F32: main_fns = dot_F32_main, nb2_fns = dot_F32_nb2, one_fns = dot_F32_one, es = 4; break;
    default: nk_gemm_skinny_kcontig_generic(m, n, k, a, lda, b, dt, ldb, c, ldc); return;
    }
    /* With more than 4 rows the rows go in blocks of 4, all using the 4-row column count (2). */
    const int mb0 = m < 4 ? (int)m : 4;
    const int nb = dot_nb[mb0];
    const char *bb = b;
    int64_t j = 0;
    for (; j + nb <= n; j += nb) {
        for (int64_t i = 0; i < m; i += 4) {
            const int mb = m - i < 4 ? (int)(m - i) : 4;
            const dot_tile_fn fn = (mb == mb0) ? main_fns[mb] : nb2_fns[mb];
            fn(k, a + i * lda, lda, bb + j * ldb * (int64_t)es, ldb, c + i * ldc + j, ldc);
        }
    }
    for (; j < n; j++)
        for (int64_t i = 0; i < m; i += 4) {
            const int mb = m - i < 4 ? (int)(m - i) : 4;
            one_fns[mb](k, a + i * lda, lda, bb + j * ldb * (int64_t)es, ldb, c + i * ldc + j, ldc);
        }
}

/* ---- skinny path: axpy along contiguous n ------------------------------------------------------- */

/* c[ii, 0:16] = sum_k a[ii, k] * B[k, 0:16] for MB rows; lanes beyond nn are neither read nor written. */
AVX2_INLINE void axpy_tile(int MB, int64_t k, const float *a, int64_t lda, const char *b, nk_dtype dt, size_t es,
                           int64_t ldb, int64_t nn, float *c, int64_t ldc) {
    const int64_t n0 = nn < 8 ? nn : 8, n1 = nn > 8 ? nn - 8 : 0;
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int ii = 0; ii < MB; ii++) acc[ii][0] = acc[ii][1] = _mm256_setzero_ps();
    if (nn == 16) {
        for (int64_t p = 0; p < k; p++) {
            const char *br = b + p * ldb * (int64_t)es;
            const __m256 w0 = load8_full(br, dt), w1 = load8_full(br + 8 * (int64_t)es, dt);
#pragma GCC unroll 6
            for (int ii = 0; ii < MB; ii++) {
                const __m256 x = _mm256_broadcast_ss(a + ii * lda + p);
                acc[ii][0] = _mm256_fmadd_ps(x, w0, acc[ii][0]);
                acc[ii][1] = _mm256_fmadd_ps(x, w1, acc[ii][1]);
            }
        }
    } else {
        for (int64_t p = 0; p < k; p++) {
            const char *br = b + p * ldb * (int64_t)es;
            const __m256 w0 = load8(br, dt, es, n0);
            const __m256 w1 = n1 > 0 ? load8(br + 8 * (int64_t)es, dt, es, n1) : _mm256_setzero_ps();
#pragma GCC unroll 6
            for (int ii = 0; ii < MB; ii++) {
                const __m256 x = _mm256_broadcast_ss(a + ii * lda + p);
                acc[ii][0] = _mm256_fmadd_ps(x, w0, acc[ii][0]);
                acc[ii][1] = _mm256_fmadd_ps(x, w1, acc[ii][1]);
            }
        }
    }
    const __m256i m0 = lane_mask(n0), m1 = lane_mask(n1);
#pragma GCC unroll 6
    for (int ii = 0; ii < MB; ii++) {
        _mm256_maskstore_ps(c + ii * ldc, m0, acc[ii][0]);
        if (n1 > 0) _mm256_maskstore_ps(c + ii * ldc + 8, m1, acc[ii][1]);
    }
}

typedef void (*axpy_tile_fn)(int64_t k, const float *a, int64_t lda, const char *b, int64_t ldb, int64_t nn, float *c,
                             int64_t ldc);

#define AXPY_FN(DT, ES, MB)                                                                                 \
    AVX2_TARGET static void axpy_##DT##_##MB(int64_t k, const float *a, int64_t lda, const char *b,            \
                                             int64_t ldb, int64_t nn, float *c, int64_t ldc) {             \
        axpy_tile(MB, k, a, lda, b, NK_##DT, ES, ldb, nn, c, ldc);                                         \
    }
#define AXPY_ALL(DT, ES)                                                                                    \
    AXPY_FN(DT, ES, 1) AXPY_FN(DT, ES, 2) AXPY_FN(DT, ES, 3) AXPY_FN(DT, ES, 4) AXPY_FN(DT, ES, 5)           \
    AXPY_FN(DT, ES, 6)                                                                                      \
    static const axpy_tile_fn axpy_##DT[7] = {NULL,         axpy_##DT##_1, axpy_##DT##_2, axpy_##DT##_3,     \
                                              axpy_##DT##_4, axpy_##DT##_5, axpy_##DT##_6};

AXPY_ALL(F32, 4)
AXPY_ALL(BF16, 2)
AXPY_ALL(F16, 2)

static void skinny_ncontig_avx2(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                                nk_dtype dt, int64_t ldb, float *c, int64_t ldc) {
    const axpy_tile_fn *fns;
    size_t es = 2;
    switch (dt) {
    case NK_BF16: fns = axpy_BF16; break;
    case NK_F16: fns = axpy_F16; break;
    case NK_F32: fns = axpy_F32, es = 4; break;
    default: nk_gemm_skinny_ncontig_generic(m, n, k, a, lda, b, dt, ldb, c, ldc); return;
    }
    const char *bb = b;
    for (int64_t j = 0; j < n; j += 16) {
        const int64_t nn = n - j < 16 ? n - j : 16;
        for (int64_t i = 0; i < m; i += 6) {
            const int mb = m - i < 6 ? (int)(m - i) : 6;
            fns[mb](k, a + i * lda, lda, bb + j * (int64_t)es, ldb, nn, c + i * ldc + j, ldc);
        }
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
    .pack_a_kcontig = pack_a_kcontig_avx2,
    .pack_b_kcontig = pack_b_kcontig_avx2,
    .skinny_kcontig = skinny_kcontig_avx2,
    .skinny_ncontig = skinny_ncontig_avx2,
    .skinny_bf16_pairs = true,
};

#else

const nk_gemm_isa nk_gemm_isa_avx2 = {0};
void nk_gemm_fma_loop_avx2(int64_t iters, float *sink) {
    (void)iters;
    *sink = 0.f;
}

#endif
