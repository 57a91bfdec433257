/*
 * gemm_avx512.c - AVX-512 micro-kernels of the GEMM: the 12x32 fp32 register tile of the packed path,
 * the transposing packer for B stored k-contiguous (a linear layer's weight), and the streaming
 * kernels of the skinny (decode) path. Compiled for any x86-64 target: every function carries its
 * own target attribute and is only called after the runtime check in gemm.c.
 */
#include "gemm_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include "gemm_avx512_tile.h"

#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define AVX512_INLINE static inline __attribute__((always_inline)) AVX512_TARGET

#define MR 12
#define NR 32

/*
 * 12 rows x 32 columns: 24 accumulators, two B vectors and a broadcast A value per k. Each k does 24
 * FMAs against 2 loads + 12 broadcasts, so the two FMA ports, not the load ports, are the limit.
 */
AVX512_TARGET static void ukr_avx512(int64_t kc, const float *pa, const float *pb, float *c, int64_t ldc,
                                     bool accumulate, nk_gemm_prefetch *pf) {
    __m512 acc[MR][2];
    nk_gemm_prefetch w = *pf; /* in registers while the loop runs */
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    if (accumulate) nk_tile_prefetch_c(c, ldc, MR);
    for (int64_t k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_load_ps(pb);
        const __m512 b1 = _mm512_load_ps(pb + 16);
        /* The A micro-panel streams from L2: ask for it a few iterations early. */
        _mm_prefetch((const char *)(pa + 8 * MR), _MM_HINT_T0);
        nk_gemm_prefetch_tick(&w, k);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            const __m512 a = _mm512_set1_ps(pa[i]);
            acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
        }
        pa += MR;
        pb += NR;
    }
    *pf = w; /* the next call continues the walk */
    nk_tile_store_c(c, ldc, acc, MR, accumulate);
}

/* 16 elements of dtype dt (lanes outside mask read nothing and are 0) as fp32. */
AVX512_INLINE __m512 load16(const void *p, nk_dtype dt, __mmask16 m) {
    if (dt == NK_BF16) {
        const __m256i h = _mm256_maskz_loadu_epi16(m, p);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    if (dt == NK_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_maskz_loadu_ps(m, p);
}

AVX512_INLINE __mmask16 tail_mask(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

/* r[j] holds 16 consecutive k of column j; afterwards r[k] holds column 0..15 at that k. */
AVX512_INLINE void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int p = 0; p < 8; p++) {
        t[2 * p] = _mm512_unpacklo_ps(r[2 * p], r[2 * p + 1]);
        t[2 * p + 1] = _mm512_unpackhi_ps(r[2 * p], r[2 * p + 1]);
    }
    for (int q = 0; q < 4; q++) {
        const __m512d t0 = _mm512_castps_pd(t[4 * q]), t1 = _mm512_castps_pd(t[4 * q + 1]);
        const __m512d t2 = _mm512_castps_pd(t[4 * q + 2]), t3 = _mm512_castps_pd(t[4 * q + 3]);
        u[4 * q + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        u[4 * q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        u[4 * q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        u[4 * q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
    /* u[4q + c], 128-bit lane L = rows 4q..4q+3 at k = 4L + c: transpose the 4x4 grid of lanes. */
    for (int c = 0; c < 4; c++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
        const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
        const __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        r[0 + c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
}

/* dst[i * ldd + j] = src[j * lds + i] for j < 16, i < n (n <= 16): a 16 x 16 block transposed, its first n
 * rows stored (16 floats of each source row are read). */
AVX512_TARGET void nk_transpose16_f32_avx512(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t n) {
    __m512 r[16];
    for (int j = 0; j < 16; j++) r[j] = _mm512_loadu_ps(src + j * lds);
    transpose16(r);
    for (int64_t i = 0; i < n; i++) _mm512_storeu_ps(dst + i * ldd, r[i]);
}

AVX512_INLINE void pack_kcontig_dt(float *dst, const char *src, nk_dtype dt, size_t es, int64_t ldj, int64_t kc) {
    for (int64_t k0 = 0; k0 < kc; k0 += 16) {
        const int64_t kn = kc - k0 < 16 ? kc - k0 : 16;
        const __mmask16 m = tail_mask(kn);
        for (int half = 0; half < NR / 16; half++) {
            __m512 r[16];
            for (int j = 0; j < 16; j++) {
                const char *q = src + ((half * 16 + j) * ldj + k0) * (int64_t)es;
                /* 32 strided streams are more than the hardware prefetcher follows. */
                _mm_prefetch(q + 256, _MM_HINT_T0);
                r[j] = load16(q, dt, m);
            }
            transpose16(r);
            for (int64_t k = 0; k < kn; k++) _mm512_store_ps(dst + (k0 + k) * NR + half * 16, r[k]);
        }
    }
}

AVX512_TARGET static void pack_b_kcontig_avx512(float *dst, const void *src, nk_dtype dt, int64_t ldj, int64_t kc) {
    switch (dt) {
    case NK_BF16: pack_kcontig_dt(dst, src, NK_BF16, 2, ldj, kc); break;
    case NK_F16: pack_kcontig_dt(dst, src, NK_F16, 2, ldj, kc); break;
    default: pack_kcontig_dt(dst, src, NK_F32, 4, ldj, kc); break;
    }
}

/* Packs A[i, k] (i < MR, k < kc, element (i, k) at src + (i*ldi + k), so k is contiguous) into kc
 * groups of MR floats: 16-row transposes of which the first MR rows are real. */
AVX512_INLINE void pack_a_kcontig_dt(float *dst, const char *src, nk_dtype dt, size_t es, int64_t ldi, int64_t kc) {
    for (int64_t k0 = 0; k0 < kc; k0 += 16) {
        const int64_t kn = kc - k0 < 16 ? kc - k0 : 16;
        const __mmask16 m = tail_mask(kn);
        __m512 r[16];
        for (int i = 0; i < MR; i++) r[i] = load16(src + (i * ldi + k0) * (int64_t)es, dt, m);
        for (int i = MR; i < 16; i++) r[i] = _mm512_setzero_ps();
        transpose16(r);
        for (int64_t k = 0; k < kn; k++) _mm512_mask_storeu_ps(dst + (k0 + k) * MR, (__mmask16)((1u << MR) - 1u), r[k]);
    }
}

AVX512_TARGET static void pack_a_kcontig_avx512(float *dst, const void *src, nk_dtype dt, int64_t ldi, int64_t kc) {
    switch (dt) {
    case NK_BF16: pack_a_kcontig_dt(dst, src, NK_BF16, 2, ldi, kc); break;
    case NK_F16: pack_a_kcontig_dt(dst, src, NK_F16, 2, ldi, kc); break;
    default: pack_a_kcontig_dt(dst, src, NK_F32, 4, ldi, kc); break;
    }
}

/* nk_gemm_pack_rows_fn for a panel width W known at compile time. The rows are ldk apart, often further
 * than the hardware prefetchers look, so each row's segment is asked for PF_ROWS rows ahead. */
#define PF_ROWS 4
AVX512_INLINE void pack_rows_dt(float *dst, const char *src, nk_dtype dt, size_t es, int64_t ldk, int64_t count,
                                int64_t kc, const int W) {
    const int64_t panels = (count + W - 1) / W;
    const int64_t lines = (count * (int64_t)es + 63) / 64 + 1; /* the segment need not start on a line */
    const int64_t row_bytes = ldk * (int64_t)es;
    for (int64_t k = 0; k < kc; k++) {
        const char *row = src + k * row_bytes;
        if (k + PF_ROWS < kc)
            for (int64_t l = 0; l < lines; l++) _mm_prefetch(row + PF_ROWS * row_bytes + 64 * l, _MM_HINT_T0);
        float *d = dst + k * W;
        for (int64_t p = 0; p < panels; p++, d += kc * W) {
            const int64_t j0 = p * W;
#pragma GCC unroll 2
            for (int v = 0; v < W; v += 16) {
                const int64_t have = count - j0 - v;
                const __mmask16 lm = have <= 0 ? 0 : tail_mask(have); /* masked lanes read nothing */
                _mm512_mask_storeu_ps(d + v, tail_mask(W - v), load16(row + (j0 + v) * (int64_t)es, dt, lm));
            }
        }
    }
}

#define PACK_ROWS_W(W)                                                                                    \
    AVX512_TARGET static void pack_rows_w##W(float *dst, const void *src, nk_dtype dt, int64_t ldk, int64_t count, \
                                             int64_t kc) {                                                \
        switch (dt) {                                                                                     \
        case NK_BF16: pack_rows_dt(dst, src, NK_BF16, 2, ldk, count, kc, W); break;                       \
        case NK_F16: pack_rows_dt(dst, src, NK_F16, 2, ldk, count, kc, W); break;                         \
        default: pack_rows_dt(dst, src, NK_F32, 4, ldk, count, kc, W); break;                             \
        }                                                                                                 \
    }
PACK_ROWS_W(12)
PACK_ROWS_W(32)

static void pack_rows_avx512(float *dst, const void *src, nk_dtype dt, int64_t ldk, int64_t count, int64_t kc,
                             int64_t w) {
    if (w == MR) pack_rows_w12(dst, src, dt, ldk, count, kc);
    else pack_rows_w32(dst, src, dt, ldk, count, kc);
}

/* ---- skinny path: dot products along contiguous k ----------------------------------------------- */

/* c[ii, jj] = a[ii, :] . B[:, jj] for MB rows and NB columns; the NB columns of B stream once. */
AVX512_INLINE void dot_tile(int MB, int NB, int64_t k, const float *a, int64_t lda, const char *b, nk_dtype dt,
                            size_t es, int64_t ldb, float *c, int64_t ldc) {
    __m512 acc[8][8];
#pragma GCC unroll 8
    for (int ii = 0; ii < MB; ii++)
#pragma GCC unroll 8
        for (int jj = 0; jj < NB; jj++) acc[ii][jj] = _mm512_setzero_ps();
    int64_t k0 = 0;
    for (; k0 + 16 <= k; k0 += 16) {
        __m512 w[8];
#pragma GCC unroll 8
        for (int jj = 0; jj < NB; jj++) {
            /* The next tile's columns, at the same depth: their rows start streaming now rather than
             * when that tile begins, and the hardware prefetcher is not left to find each new row. */
            if (MB >= 4) _mm_prefetch(b + ((NB + jj) * ldb + k0) * (int64_t)es, _MM_HINT_T0);
            w[jj] = load16(b + (jj * ldb + k0) * (int64_t)es, dt, 0xFFFF);
        }
#pragma GCC unroll 8
        for (int ii = 0; ii < MB; ii++) {
            const __m512 x = _mm512_loadu_ps(a + ii * lda + k0);
#pragma GCC unroll 8
            for (int jj = 0; jj < NB; jj++) acc[ii][jj] = _mm512_fmadd_ps(x, w[jj], acc[ii][jj]);
        }
    }
    if (k0 < k) {
        const __mmask16 m = tail_mask(k - k0);
        __m512 w[8];
#pragma GCC unroll 8
        for (int jj = 0; jj < NB; jj++) w[jj] = load16(b + (jj * ldb + k0) * (int64_t)es, dt, m);
#pragma GCC unroll 8
        for (int ii = 0; ii < MB; ii++) {
            const __m512 x = _mm512_maskz_loadu_ps(m, a + ii * lda + k0);
#pragma GCC unroll 8
            for (int jj = 0; jj < NB; jj++) acc[ii][jj] = _mm512_fmadd_ps(x, w[jj], acc[ii][jj]);
        }
    }
#pragma GCC unroll 8
    for (int ii = 0; ii < MB; ii++)
#pragma GCC unroll 8
        for (int jj = 0; jj < NB; jj++) c[ii * ldc + jj] = _mm512_reduce_add_ps(acc[ii][jj]);
}

typedef void (*dot_tile_fn)(int64_t k, const float *a, int64_t lda, const char *b, int64_t ldb, float *c,
                            int64_t ldc);

/* Columns per tile for MB rows: keeps MB*NB accumulators within the 32 registers. */
static const int dot_nb[9] = {0, 8, 6, 4, 4, 3, 3, 2, 2};

#define DOT_FN(DT, ES, MB, NB)                                                                            \
    AVX512_TARGET static void dot_##DT##_##MB##x##NB(int64_t k, const float *a, int64_t lda, const char *b,  \
                                                     int64_t ldb, float *c, int64_t ldc) {                \
        dot_tile(MB, NB, k, a, lda, b, NK_##DT, ES, ldb, c, ldc);                                        \
    }
#define DOT_ROWS(DT, ES, MB, NB) DOT_FN(DT, ES, MB, NB) DOT_FN(DT, ES, MB, 1)
#define DOT_ALL(DT, ES)                                                                                   \
    DOT_ROWS(DT, ES, 1, 8) DOT_ROWS(DT, ES, 2, 6) DOT_ROWS(DT, ES, 3, 4) DOT_ROWS(DT, ES, 4, 4)            \
    DOT_ROWS(DT, ES, 5, 3) DOT_ROWS(DT, ES, 6, 3) DOT_ROWS(DT, ES, 7, 2) DOT_ROWS(DT, ES, 8, 2)            \
    DOT_FN(DT, ES, 1, 2) DOT_FN(DT, ES, 2, 2) DOT_FN(DT, ES, 3, 2) DOT_FN(DT, ES, 4, 2) DOT_FN(DT, ES, 5, 2) \
    DOT_FN(DT, ES, 6, 2)                                                                                  \
    static const dot_tile_fn dot_##DT##_main[9] = {NULL,          dot_##DT##_1x8, dot_##DT##_2x6,          \
                                                   dot_##DT##_3x4, dot_##DT##_4x4, dot_##DT##_5x3,         \
                                                   dot_##DT##_6x3, dot_##DT##_7x2, dot_##DT##_8x2};        \
    static const dot_tile_fn dot_##DT##_nb2[9] = {NULL,          dot_##DT##_1x2, dot_##DT##_2x2,           \
                                                  dot_##DT##_3x2, dot_##DT##_4x2, dot_##DT##_5x2,          \
                                                  dot_##DT##_6x2, dot_##DT##_7x2, dot_##DT##_8x2};         \
    static const dot_tile_fn dot_##DT##_one[9] = {NULL,          dot_##DT##_1x1, dot_##DT##_2x1,           \
                                                  dot_##DT##_3x1, dot_##DT##_4x1, dot_##DT##_5x1,          \
                                                  dot_##DT##_6x1, dot_##DT##_7x1, dot_##DT##_8x1};

DOT_ALL(F32, 4)
DOT_ALL(BF16, 2)
DOT_ALL(F16, 2)

static void skinny_kcontig_avx512(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                                  nk_dtype dt, int64_t ldb, float *c, int64_t ldc) {
    const dot_tile_fn *main_fns, *nb2_fns, *one_fns;
    size_t es = 2;
    switch (dt) {
    case NK_BF16: main_fns = dot_BF16_main, nb2_fns = dot_BF16_nb2, one_fns = dot_BF16_one; break;
    case NK_F16: main_fns = dot_F16_main, nb2_fns = dot_F16_nb2, one_fns = dot_F16_one; break;
    case NK_F32: main_fns = dot_F32_main, nb2_fns = dot_F32_nb2, one_fns = dot_F32_one, es = 4; break;
    default: nk_gemm_skinny_kcontig_generic(m, n, k, a, lda, b, dt, ldb, c, ldc); return;
    }
    /* With more than 8 rows the rows go in blocks of 8, all using the 8-row column count (2). */
    const int mb0 = m < 8 ? (int)m : 8;
    const int nb = dot_nb[mb0];
    const char *bb = b;
    int64_t j = 0;
    for (; j + nb <= n; j += nb) {
        for (int64_t i = 0; i < m; i += 8) {
            const int mb = m - i < 8 ? (int)(m - i) : 8;
            const dot_tile_fn fn = (mb == mb0) ? main_fns[mb] : nb2_fns[mb];
            fn(k, a + i * lda, lda, bb + j * ldb * (int64_t)es, ldb, c + i * ldc + j, ldc);
        }
    }
    for (; j < n; j++)
        for (int64_t i = 0; i < m; i += 8) {
            const int mb = m - i < 8 ? (int)(m - i) : 8;
            one_fns[mb](k, a + i * lda, lda, bb + j * ldb * (int64_t)es, ldb, c + i * ldc + j, ldc);
        }
}

/* ---- skinny path: axpy along contiguous n ------------------------------------------------------- */

/* c[ii, 0:64] = sum_k a[ii, k] * B[k, 0:64] for MB rows; lanes beyond nn are neither read nor written. */
AVX512_INLINE void axpy_tile(int MB, int64_t k, const float *a, int64_t lda, const char *b, nk_dtype dt, size_t es,
                             int64_t ldb, int64_t nn, float *c, int64_t ldc) {
    __mmask16 msk[4];
#pragma GCC unroll 8
    for (int v = 0; v < 4; v++) msk[v] = nn > 16 * v ? tail_mask(nn - 16 * v) : 0;
    __m512 acc[6][4];
#pragma GCC unroll 8
    for (int ii = 0; ii < MB; ii++)
#pragma GCC unroll 8
        for (int v = 0; v < 4; v++) acc[ii][v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k; p++) {
        __m512 w[4];
        const char *br = b + p * ldb * (int64_t)es;
#pragma GCC unroll 8
        for (int v = 0; v < 4; v++) w[v] = load16(br + 16 * v * (int64_t)es, dt, msk[v]);
#pragma GCC unroll 8
        for (int ii = 0; ii < MB; ii++) {
            const __m512 x = _mm512_set1_ps(a[ii * lda + p]);
#pragma GCC unroll 8
            for (int v = 0; v < 4; v++) acc[ii][v] = _mm512_fmadd_ps(x, w[v], acc[ii][v]);
        }
    }
#pragma GCC unroll 8
    for (int ii = 0; ii < MB; ii++)
#pragma GCC unroll 8
        for (int v = 0; v < 4; v++) _mm512_mask_storeu_ps(c + ii * ldc + 16 * v, msk[v], acc[ii][v]);
}

typedef void (*axpy_tile_fn)(int64_t k, const float *a, int64_t lda, const char *b, int64_t ldb, int64_t nn, float *c,
                             int64_t ldc);

#define AXPY_FN(DT, ES, MB)                                                                                 \
    AVX512_TARGET static void axpy_##DT##_##MB(int64_t k, const float *a, int64_t lda, const char *b,          \
                                               int64_t ldb, int64_t nn, float *c, int64_t ldc) {           \
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

static void skinny_ncontig_avx512(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
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
    for (int64_t j = 0; j < n; j += 64) {
        const int64_t nn = n - j < 64 ? n - j : 64;
        for (int64_t i = 0; i < m; i += 6) {
            const int mb = m - i < 6 ? (int)(m - i) : 6;
            fns[mb](k, a + i * lda, lda, bb + j * (int64_t)es, ldb, nn, c + i * ldc + j, ldc);
        }
    }
}

/* ---- epilogue: one output row ------------------------------------------------------------------- */

/* 16 fp32 -> bf16 with round-to-nearest-even, NaN -> 0x7FC0 (as nk_f32_to_bf16). */
AVX512_INLINE __m256i f32_to_bf16_16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
    return _mm512_cvtepi32_epi16(r);
}

AVX512_INLINE void store16(void *p, nk_dtype dt, __m512 v, __mmask16 m) {
    if (dt == NK_BF16) _mm256_mask_storeu_epi16(p, m, f32_to_bf16_16(v));
    else if (dt == NK_F16) _mm256_mask_storeu_epi16(p, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    else _mm512_mask_storeu_ps(p, m, v);
}

AVX512_INLINE void store_row_dt(void *out, nk_dtype dt, size_t es, const float *acc, const void *self, int64_t ss,
                                int64_t n, float alpha, float beta) {
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    const __m512 s0 = (self != NULL && ss == 0) ? load16(self, dt, 1) : _mm512_setzero_ps();
    const __m512 bcast = _mm512_set1_ps(_mm512_cvtss_f32(s0));
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = tail_mask(n - j);
        __m512 v = _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, acc + j));
        if (self != NULL) {
            const __m512 sv = ss == 0 ? bcast : load16((const char *)self + j * (int64_t)es, dt, m);
            v = _mm512_fmadd_ps(vb, sv, v);
        }
        store16((char *)out + j * (int64_t)es, dt, v, m);
    }
}

/* out[j] = alpha * acc[j] (+ beta * self[j * ss], ss 0 or 1) for a unit-stride output row. */
AVX512_TARGET void nk_gemm_store_row_avx512(void *out, nk_dtype dt, const float *acc, const void *self, int64_t ss,
                                            int64_t n, float alpha, float beta) {
    switch (dt) {
    case NK_BF16: store_row_dt(out, NK_BF16, 2, acc, self, ss, n, alpha, beta); break;
    case NK_F16: store_row_dt(out, NK_F16, 2, acc, self, ss, n, alpha, beta); break;
    default: store_row_dt(out, NK_F32, 4, acc, self, ss, n, alpha, beta); break;
    }
}

AVX512_TARGET void nk_gemm_fma_loop_avx512(int64_t iters, float *sink) {
    __m512 acc[16];
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 16; i++) acc[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
    }
    __m512 s = acc[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, acc[i]);
    *sink = _mm512_reduce_add_ps(s);
}

const nk_gemm_isa nk_gemm_isa_avx512 = {
    .name = "avx512",
    .mr = MR,
    .nr = NR,
    .ukr = ukr_avx512,
    .pack_a_kcontig = pack_a_kcontig_avx512,
    .pack_b_kcontig = pack_b_kcontig_avx512,
    .pack_rows = pack_rows_avx512,
    .skinny_kcontig = skinny_kcontig_avx512,
    .skinny_ncontig = skinny_ncontig_avx512,
};

#else /* not x86-64: never selected (gemm.c checks the CPU first) */

void nk_transpose16_f32_avx512(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        for (int j = 0; j < 16; j++) dst[i * ldd + j] = src[j * lds + i];
}

void nk_gemm_store_row_avx512(void *out, nk_dtype dt, const float *acc, const void *self, int64_t ss, int64_t n,
                              float alpha, float beta) {
    (void)out, (void)dt, (void)acc, (void)self, (void)ss, (void)n, (void)alpha, (void)beta;
}

const nk_gemm_isa nk_gemm_isa_avx512 = {0};
void nk_gemm_fma_loop_avx512(int64_t iters, float *sink) {
    (void)iters;
    *sink = 0.f;
}

#endif
