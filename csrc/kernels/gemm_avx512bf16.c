/*
 * gemm_avx512bf16.c - bf16 products on AVX512-BF16 (vdpbf16ps), for CPUs that have it but no AMX.
 *
 * vdpbf16ps adds to each fp32 lane the two products of one pair of bf16 values, so it does twice the
 * multiply-adds of an fp32 FMA and reads half the bytes; the products of two bf16 are exact in fp32, and
 * it is the instruction oneDNN uses, so results stay close to PyTorch CPU (like oneDNN it treats denormal
 * inputs as zero and flushes denormal sums). Both operands are therefore packed as 32-bit words holding
 * the pair (k even, k odd) of one row/column, an odd k padded with a zero:
 *  - packed path: a 12 x 32 register tile; the A micro-panel is kq groups of 12 words (one word of each
 *    row per k pair, broadcast) and the B micro-panel kq groups of 32 words (one word of each column);
 *  - skinny path (B read once, rows of A in bf16): for a k-contiguous B (a linear layer's weight) dot
 *    products along k, 32 k per instruction straight from the weight rows; for an n-contiguous B axpy along
 *    n, rows 2q and 2q + 1 paired on the fly.
 * Everything carries its own target attribute and runs only after nk_gemm_dpbf16_available().
 */
#include "gemm_internal.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include "gemm_avx512_tile.h"

#define DP_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define DP_INLINE static inline __attribute__((always_inline)) DP_TARGET

#define MR 12
#define NR 32
/* Depth and rows of a packed block: the 144 x 1024 A block (288 KiB) stays in L2, a B micro-panel (up
 * to 512 pairs x 32 words = 64 KiB) in L1 or L2, which is enough: each 128 bytes of B feed 24 dot
 * instructions. 1024 deep measured 2-8% faster than 512 on Zen 5 at K = 768 and 2048 (one pass over the
 * accumulator, and a weight row's pairs packed in one go). */
#define DP_KC_MAX NK_GEMM_DPBF16_KC_MAX
#define DP_MC NK_GEMM_DPBF16_MC

bool nk_gemm_dpbf16_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bf16");
}

typedef struct dp_scratch {
    uint32_t *p;
    size_t cap; /* words */
} dp_scratch;

static _Thread_local dp_scratch t_dp_a, t_dp_b;

static uint32_t *dp_scratch_get(dp_scratch *s, size_t n) {
    if (n <= s->cap) return s->p;
    free(s->p);
    s->p = aligned_alloc(64, (n * 4 + 63) & ~(size_t)63);
    s->cap = s->p ? n : 0;
    return s->p;
}

DP_INLINE __mmask32 mask32(int64_t n) {
    return n >= 32 ? (__mmask32)0xFFFFFFFFu : (n <= 0 ? (__mmask32)0 : (__mmask32)((1u << n) - 1u));
}

DP_INLINE __m512bh as_bh(__m512i v) {
    return (__m512bh)v;
}

/* ---- packed path ---------------------------------------------------------------------------------- */

/*
 * c (R x 32 fp32, row stride ldc) = (accumulate ? c : 0) + pa . pb over kq pairs, for the first R rows of
 * a 12-row A micro-panel. At R = 12: 24 accumulators, two B vectors and a broadcast A word per pair, 24
 * dot instructions against 2 vector loads and 12 broadcasts, so the dot unit stays the limit. A smaller
 * R serves the last rows of A (M = 128 is 10 x 12 + 8) without multiplying zeros. The lines of pf are
 * prefetched into L2 one every kq / n pairs (nk_gemm_prefetch).
 * Row i's word for pair q is pa[i * rs + q * qs]: a packed micro-panel (rs 1, qs MR) or bf16 rows read in
 * place (rs the row stride in words, qs 1; pf NULL: nothing streams).
 */
DP_INLINE void ukr_rows(const int R, int64_t kq, const uint32_t *pa, int64_t rs, int64_t qs, const uint32_t *pb,
                        float *c, int64_t ldc, bool accumulate, nk_gemm_prefetch *pf) {
    __m512 acc[MR][2];
    nk_gemm_prefetch w = {0};
    if (pf != NULL) w = *pf; /* in registers while the loop runs */
#pragma GCC unroll 12
    for (int i = 0; i < R; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    if (accumulate) nk_tile_prefetch_c(c, ldc, R);
    for (int64_t q = 0; q < kq; q++) {
        const __m512bh b0 = as_bh(_mm512_load_si512((const void *)pb));
        const __m512bh b1 = as_bh(_mm512_load_si512((const void *)(pb + 16)));
        if (pf != NULL) {
            /* The A micro-panel streams from L2. */
            _mm_prefetch((const char *)(pa + 8 * MR), _MM_HINT_T0);
            nk_gemm_prefetch_tick(&w, q);
        }
#pragma GCC unroll 12
        for (int i = 0; i < R; i++) {
            const __m512bh a = as_bh(_mm512_set1_epi32((int)pa[i * rs]));
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], a, b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], a, b1);
        }
        pa += qs;
        pb += NR;
    }
    if (pf != NULL) *pf = w; /* the next call continues the walk */
    nk_tile_store_c(c, ldc, acc, R, accumulate);
}

DP_TARGET static void ukr_dp12(int64_t kq, const uint32_t *pa, const uint32_t *pb, float *c, int64_t ldc,
                               bool accumulate, nk_gemm_prefetch *pf) {
    ukr_rows(12, kq, pa, 1, MR, pb, c, ldc, accumulate, pf);
}
DP_TARGET static void ukr_dp8(int64_t kq, const uint32_t *pa, const uint32_t *pb, float *c, int64_t ldc,
                               bool accumulate, nk_gemm_prefetch *pf) {
    ukr_rows(8, kq, pa, 1, MR, pb, c, ldc, accumulate, pf);
}
DP_TARGET static void ukr_dp4(int64_t kq, const uint32_t *pa, const uint32_t *pb, float *c, int64_t ldc,
                               bool accumulate, nk_gemm_prefetch *pf) {
    ukr_rows(4, kq, pa, 1, MR, pb, c, ldc, accumulate, pf);
}

/* r[j] holds 16 words of row j; afterwards r[q] holds word q of rows 0..15 (a 16 x 16 transpose). */
DP_INLINE void transpose16_words(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int p = 0; p < 8; p++) {
        t[2 * p] = _mm512_unpacklo_epi32(r[2 * p], r[2 * p + 1]);
        t[2 * p + 1] = _mm512_unpackhi_epi32(r[2 * p], r[2 * p + 1]);
    }
    for (int q = 0; q < 4; q++) {
        u[4 * q + 0] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
        u[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
        u[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
        u[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
    }
    /* u[4q + c], 128-bit lane L: rows 4q..4q+3 at word 4L + c; transpose the 4 x 4 grid of lanes. */
    for (int c = 0; c < 4; c++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
        const __m512i v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
        const __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        r[0 + c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
        r[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
}

/* Word j of the result: (lo[j0 + j], hi[j0 + j]) for j < 16, j0 = 0 (first) or 16 (second). */
DP_INLINE __m512i interleave_lo(__m512i lo, __m512i hi) {
    const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                         37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    return _mm512_permutex2var_epi16(lo, idx, hi);
}
DP_INLINE __m512i interleave_hi(__m512i lo, __m512i hi) {
    const __m512i idx = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23, 54,
                                         22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    return _mm512_permutex2var_epi16(lo, idx, hi);
}

static inline uint32_t pair_word(uint16_t lo, uint16_t hi) {
    return (uint32_t)lo | ((uint32_t)hi << 16);
}

/*
 * A block (mcur x kcur at a, element (i, k) at a + i*sm + k*sk) into micro-panels of MR rows: panel p
 * at dst + p*MR*kq holds, for each pair q, the words (A[i, 2q], A[i, 2q + 1]) of its MR rows. Missing
 * rows and the odd k are zero.
 */
DP_TARGET static void pack_a_dp(uint32_t *dst, const uint16_t *a, int64_t sm, int64_t sk, int64_t mcur,
                                int64_t kcur) {
    const int64_t kq = (kcur + 1) / 2;
    const __mmask16 wm = (__mmask16)((1u << MR) - 1u);
    for (int64_t p0 = 0; p0 < mcur; p0 += MR) {
        const int64_t rows = mcur - p0 < MR ? mcur - p0 : MR;
        uint32_t *d = dst + p0 * kq;
        const uint16_t *ap = a + p0 * sm;
        if (sk == 1) {
            /* Row i's pairs are consecutive words: a word transpose per 32 k. */
            for (int64_t k0 = 0; k0 < kcur; k0 += 32) {
                const __mmask32 m = mask32(kcur - k0);
                __m512i r[16];
                for (int i = 0; i < 16; i++)
                    r[i] = i < rows ? _mm512_maskz_loadu_epi16(m, ap + i * sm + k0) : _mm512_setzero_si512();
                transpose16_words(r);
                const int64_t nq = kq - k0 / 2 < 16 ? kq - k0 / 2 : 16;
                for (int64_t q = 0; q < nq; q++) _mm512_mask_storeu_epi32(d + (k0 / 2 + q) * MR, wm, r[q]);
            }
        } else if (sm == 1) {
            /* Columns k and k + 1 of A are runs of rows: interleave them element by element. */
            const __mmask32 rm = mask32(rows);
            for (int64_t q = 0; q < kq; q++) {
                const int64_t k = 2 * q;
                const __m512i c0 = _mm512_maskz_loadu_epi16(rm, ap + k * sk);
                const __m512i c1 = k + 1 < kcur ? _mm512_maskz_loadu_epi16(rm, ap + (k + 1) * sk) : _mm512_setzero_si512();
                _mm512_mask_storeu_epi32(d + q * MR, wm, interleave_lo(c0, c1));
            }
        } else {
            for (int64_t q = 0; q < kq; q++)
                for (int64_t i = 0; i < MR; i++) {
                    const int64_t k = 2 * q;
                    const uint16_t lo = i < rows ? ap[i * sm + k * sk] : 0;
                    const uint16_t hi = i < rows && k + 1 < kcur ? ap[i * sm + (k + 1) * sk] : 0;
                    d[q * MR + i] = pair_word(lo, hi);
                }
        }
    }
}

/*
 * One B micro-panel: cols <= NR columns of kcur rows at b (element (k, j) at b + k*sk + j*sn) become, for
 * each pair q, the words (B[2q, j], B[2q + 1, j]) of NR columns at d. Missing columns and the odd k are
 * zero.
 */
DP_TARGET static void pack_b_panel(uint32_t *d, const uint16_t *b, int64_t sk, int64_t sn, int64_t kcur,
                                   int64_t cols) {
    const int64_t kq = (kcur + 1) / 2;
    if (sk == 1) {
        /* Column j's pairs are consecutive words (a linear layer's weight row). */
        for (int half = 0; half < NR / 16; half++) {
            const int64_t hc = cols - 16 * half;
            for (int64_t k0 = 0; k0 < kcur; k0 += 32) {
                const __mmask32 m = mask32(kcur - k0);
                __m512i r[16];
                for (int j = 0; j < 16; j++)
                    r[j] = j < hc ? _mm512_maskz_loadu_epi16(m, b + (16 * half + j) * sn + k0) : _mm512_setzero_si512();
                transpose16_words(r);
                const int64_t nq = kq - k0 / 2 < 16 ? kq - k0 / 2 : 16;
                for (int64_t q = 0; q < nq; q++) _mm512_store_si512((void *)(d + (k0 / 2 + q) * NR + 16 * half), r[q]);
            }
        }
    } else if (sn == 1) {
        /* Rows k and k + 1 interleave element by element. */
        const __mmask32 cm = mask32(cols);
        for (int64_t q = 0; q < kq; q++) {
            const int64_t k = 2 * q;
            const __m512i r0 = _mm512_maskz_loadu_epi16(cm, b + k * sk);
            const __m512i r1 = k + 1 < kcur ? _mm512_maskz_loadu_epi16(cm, b + (k + 1) * sk) : _mm512_setzero_si512();
            _mm512_store_si512((void *)(d + q * NR), interleave_lo(r0, r1));
            _mm512_store_si512((void *)(d + q * NR + 16), interleave_hi(r0, r1));
        }
    } else {
        for (int64_t q = 0; q < kq; q++)
            for (int64_t j = 0; j < NR; j++) {
                const int64_t k = 2 * q;
                const uint16_t lo = j < cols ? b[k * sk + j * sn] : 0;
                const uint16_t hi = j < cols && k + 1 < kcur ? b[(k + 1) * sk + j * sn] : 0;
                d[q * NR + j] = pair_word(lo, hi);
            }
    }
}

DP_TARGET bool nk_gemm_dpbf16_block(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t a_sm, int64_t a_sk,
                                    const uint16_t *b, int64_t b_sk, int64_t b_sn, float *acc, int64_t ldacc,
                                    bool stream_b, nk_gemm_rows_fn flush, void *flush_ctx) {
    const int64_t np = (n + NR - 1) / NR * NR;
    /* Equal blocks of at most DP_KC_MAX, of even depth so that pairs never straddle two blocks. */
    const int64_t nblk = (k + DP_KC_MAX - 1) / DP_KC_MAX;
    /* One pass over k: each row block is final once its columns are done, and goes out while it is
     * still in L2 (the accumulator then holds one row block, not all m rows beside packed B and A). */
    const bool rolling = flush != NULL && nblk == 1;
    const int64_t kc = ((k + nblk - 1) / nblk + 1) / 2 * 2;
    const int64_t kq_max = ((k < kc ? k : kc) + 1) / 2;
    const int64_t mp_all = (m + MR - 1) / MR * MR;
    const int64_t mc_max = mp_all < DP_MC ? mp_all : DP_MC;
    uint32_t *ap = dp_scratch_get(&t_dp_a, (size_t)(mc_max * kq_max));
    /* With one row block every B micro-panel is used right after it is packed: one slot, which stays in
     * L1, instead of writing out the whole block. */
    const bool one_block = m <= DP_MC;
    uint32_t *bp = dp_scratch_get(&t_dp_b, (size_t)((one_block ? NR : np) * kq_max));
    if (ap == NULL || bp == NULL) return false;
    for (int64_t pc = 0; pc < k; pc += kc) {
        const int64_t kcur = k - pc < kc ? k - pc : kc;
        const int64_t kq = (kcur + 1) / 2;
        const uint16_t *bk = b + pc * b_sk;
        for (int64_t ic = 0; ic < m; ic += DP_MC) {
            const int64_t mcur = m - ic < DP_MC ? m - ic : DP_MC;
            const int64_t parts = (mcur + MR - 1) / MR;
            pack_a_dp(ap, a + ic * a_sm + pc * a_sk, a_sm, a_sk, mcur, kcur);
            for (int64_t jr = 0; jr < np; jr += NR) {
                uint32_t *pb = one_block ? bp : bp + jr * kq;
                /* The first row block packs each B micro-panel right before it uses it, prefetching the
                 * next one's source meanwhile; the other row blocks find the panels packed. */
                const bool first = ic == 0, next = stream_b && first && jr + NR < n;
                if (first) pack_b_panel(pb, bk + jr * b_sn, b_sk, b_sn, kcur, n - jr < NR ? n - jr : NR);
                nk_gemm_prefetch pf = {0};
                const int64_t lines = next ? nk_gemm_prefetch_init(&pf, (const char *)(bk + (jr + NR) * b_sn), 2, b_sk,
                                                                   b_sn, kcur, n - jr - NR < NR ? n - jr - NR : NR)
                                           : 0;
                for (int64_t ir = 0; ir < mcur; ir += MR) {
                    nk_gemm_prefetch_share(&pf, lines, ir / MR, parts, kq);
                    const int64_t rows = mcur - ir;
                    float *ct = acc + ((rolling ? 0 : ic) + ir) * ldacc + jr;
                    if (rows > 8) ukr_dp12(kq, ap + ir * kq, pb, ct, ldacc, pc > 0, &pf);
                    else if (rows > 4) ukr_dp8(kq, ap + ir * kq, pb, ct, ldacc, pc > 0, &pf);
                    else ukr_dp4(kq, ap + ir * kq, pb, ct, ldacc, pc > 0, &pf);
                }
            }
            if (rolling) flush(flush_ctx, ic, mcur, acc, ldacc);
        }
    }
    if (flush != NULL && !rolling) flush(flush_ctx, 0, m, acc, ldacc);
    return true;
}

/* ---- attention's small products: B packed once and reused, A's bf16 rows read in place ------------- */

/* Attention's query and probability blocks are already bf16 rows: read in place (ukr_rows), as packing
 * them would cost a pass as long as the products at head dims of 40-80. */
DP_TARGET static void ukr_direct12(int64_t kq, const uint16_t *a, int64_t lda, const uint32_t *pb, float *c,
                                   int64_t ldc, bool accumulate) {
    ukr_rows(12, kq, (const uint32_t *)a, lda / 2, 1, pb, c, ldc, accumulate, NULL);
}
DP_TARGET static void ukr_direct8(int64_t kq, const uint16_t *a, int64_t lda, const uint32_t *pb, float *c,
                                  int64_t ldc, bool accumulate) {
    ukr_rows(8, kq, (const uint32_t *)a, lda / 2, 1, pb, c, ldc, accumulate, NULL);
}
DP_TARGET static void ukr_direct4(int64_t kq, const uint16_t *a, int64_t lda, const uint32_t *pb, float *c,
                                  int64_t ldc, bool accumulate) {
    ukr_rows(4, kq, (const uint32_t *)a, lda / 2, 1, pb, c, ldc, accumulate, NULL);
}

void nk_dp_pack_b(uint32_t *dst, const uint16_t *b, int64_t sk, int64_t sn, int64_t kcur, int64_t ncur,
                  int64_t kp) {
    const int64_t kq = kp / 2, kq_data = (kcur + 1) / 2;
    for (int64_t j = 0; j < ncur; j += NR) {
        uint32_t *d = dst + (j / NR) * kq * NR;
        pack_b_panel(d, b + j * sn, sk, sn, kcur, ncur - j < NR ? ncur - j : NR);
        memset(d + kq_data * NR, 0, sizeof(uint32_t) * (size_t)((kq - kq_data) * NR));
    }
}

DP_TARGET void nk_dp_matmul(int64_t m, int64_t np, int64_t kp, const uint16_t *a, int64_t lda, const uint32_t *bp,
                            float *c, int64_t ldc, bool accumulate) {
    const int64_t kq = kp / 2;
    /* Rows outer: 12 rows of A (at most 12 x 1 KiB) stay in L1 while the B panels stream from L2. */
    for (int64_t ir = 0; ir < m; ir += MR) {
        const int64_t rows = m - ir;
        for (int64_t jr = 0; jr < np; jr += NR) {
            const uint32_t *pb = bp + jr * kq;
            float *ct = c + ir * ldc + jr;
            if (rows > 8) ukr_direct12(kq, a + ir * lda, lda, pb, ct, ldc, accumulate);
            else if (rows > 4) ukr_direct8(kq, a + ir * lda, lda, pb, ct, ldc, accumulate);
            else ukr_direct4(kq, a + ir * lda, lda, pb, ct, ldc, accumulate);
        }
    }
}

/* ---- skinny path: dot products along contiguous k -------------------------------------------------- */

/* c[ii, jj] = a[ii, :] . B[:, jj] for MB rows and NB columns: the NB weight rows stream once. */
DP_INLINE void dot_tile(int MB, int NB, int64_t k, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                        float *c, int64_t ldc) {
    __m512 acc[8][8];
#pragma GCC unroll 8
    for (int ii = 0; ii < MB; ii++)
#pragma GCC unroll 8
        for (int jj = 0; jj < NB; jj++) acc[ii][jj] = _mm512_setzero_ps();
    int64_t k0 = 0;
    for (; k0 + 32 <= k; k0 += 32) {
        __m512bh w[8];
#pragma GCC unroll 8
        for (int jj = 0; jj < NB; jj++) {
            /* The weight rows are short streams (k * 2 bytes) that end before the hardware prefetcher
             * ramps up: fetch those of the tile after next (past the end of b prefetches are harmless). */
            _mm_prefetch((const char *)(b + (jj + 2 * NB) * ldb + k0), _MM_HINT_T1);
            w[jj] = as_bh(_mm512_loadu_si512((const void *)(b + jj * ldb + k0)));
        }
#pragma GCC unroll 8
        for (int ii = 0; ii < MB; ii++) {
            const __m512bh x = as_bh(_mm512_loadu_si512((const void *)(a + ii * lda + k0)));
#pragma GCC unroll 8
            for (int jj = 0; jj < NB; jj++) acc[ii][jj] = _mm512_dpbf16_ps(acc[ii][jj], x, w[jj]);
        }
    }
    if (k0 < k) {
        /* Masked lanes read nothing and are zero on both sides, so the odd k needs no padding. */
        const __mmask32 m = mask32(k - k0);
        __m512bh w[8];
#pragma GCC unroll 8
        for (int jj = 0; jj < NB; jj++) w[jj] = as_bh(_mm512_maskz_loadu_epi16(m, b + jj * ldb + k0));
#pragma GCC unroll 8
        for (int ii = 0; ii < MB; ii++) {
            const __m512bh x = as_bh(_mm512_maskz_loadu_epi16(m, a + ii * lda + k0));
#pragma GCC unroll 8
            for (int jj = 0; jj < NB; jj++) acc[ii][jj] = _mm512_dpbf16_ps(acc[ii][jj], x, w[jj]);
        }
    }
#pragma GCC unroll 8
    for (int ii = 0; ii < MB; ii++)
#pragma GCC unroll 8
        for (int jj = 0; jj < NB; jj++) c[ii * ldc + jj] = _mm512_reduce_add_ps(acc[ii][jj]);
}

typedef void (*dp_dot_fn)(int64_t k, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float *c,
                          int64_t ldc);

#define DP_DOT(MB, NB)                                                                                        \
    DP_TARGET static void dp_dot_##MB##x##NB(int64_t k, const uint16_t *a, int64_t lda, const uint16_t *b,     \
                                             int64_t ldb, float *c, int64_t ldc) {                           \
        dot_tile(MB, NB, k, a, lda, b, ldb, c, ldc);                                                         \
    }

/* Columns per tile for MB rows: MB*NB accumulators, NB weight vectors and one row of A in 32 registers. */
DP_DOT(1, 8) DP_DOT(2, 8) DP_DOT(3, 6) DP_DOT(4, 5) DP_DOT(5, 4) DP_DOT(6, 4) DP_DOT(7, 3) DP_DOT(8, 3)
DP_DOT(1, 3) DP_DOT(2, 3) DP_DOT(3, 3) DP_DOT(4, 3) DP_DOT(5, 3) DP_DOT(6, 3)
DP_DOT(1, 1) DP_DOT(2, 1) DP_DOT(3, 1) DP_DOT(4, 1) DP_DOT(5, 1) DP_DOT(6, 1) DP_DOT(7, 1) DP_DOT(8, 1)

static const int dp_nb[9] = {0, 8, 8, 6, 5, 4, 4, 3, 3};
static const dp_dot_fn dp_main[9] = {NULL,        dp_dot_1x8, dp_dot_2x8, dp_dot_3x6, dp_dot_4x5,
                                     dp_dot_5x4, dp_dot_6x4, dp_dot_7x3, dp_dot_8x3};
/* The row blocks after the first 8 rows use the 8-row column count (3), so all blocks step together. */
static const dp_dot_fn dp_nb3[9] = {NULL,        dp_dot_1x3, dp_dot_2x3, dp_dot_3x3, dp_dot_4x3,
                                    dp_dot_5x3, dp_dot_6x3, dp_dot_7x3, dp_dot_8x3};
static const dp_dot_fn dp_one[9] = {NULL,        dp_dot_1x1, dp_dot_2x1, dp_dot_3x1, dp_dot_4x1,
                                    dp_dot_5x1, dp_dot_6x1, dp_dot_7x1, dp_dot_8x1};

void nk_gemm_dpbf16_skinny_kcontig(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                                   const uint16_t *b, int64_t ldb, float *c, int64_t ldc) {
    const int mb0 = m < 8 ? (int)m : 8;
    const int nb = dp_nb[mb0];
    int64_t j = 0;
    for (; j + nb <= n; j += nb)
        for (int64_t i = 0; i < m; i += 8) {
            const int mb = m - i < 8 ? (int)(m - i) : 8;
            const dp_dot_fn fn = mb == mb0 ? dp_main[mb] : dp_nb3[mb];
            fn(k, a + i * lda, lda, b + j * ldb, ldb, c + i * ldc + j, ldc);
        }
    for (; j < n; j++)
        for (int64_t i = 0; i < m; i += 8) {
            const int mb = m - i < 8 ? (int)(m - i) : 8;
            dp_one[mb](k, a + i * lda, lda, b + j * ldb, ldb, c + i * ldc + j, ldc);
        }
}

/* ---- skinny path: axpy along contiguous n ----------------------------------------------------------- */

/*
 * c[ii, 0:64] = sum_k a[ii, k] * B[k, 0:64] for MB rows (lanes beyond nn neither read nor written); a is
 * bf16 rows whose word q is the pair (a[2q], a[2q + 1]), zero past k. Rows 2q and 2q + 1 of B are paired
 * with unpacklo/hi, which interleave within 128-bit lanes only: accumulator v = 2h + s then holds columns
 * 32h + 8L + 4s + (0..3) in lane L, put back in order once at the end.
 */
DP_INLINE void axpy_tile(int MB, int64_t k, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                         int64_t nn, float *c, int64_t ldc) {
    const __mmask32 m0 = mask32(nn), m1 = mask32(nn - 32);
    __m512 acc[6][4];
#pragma GCC unroll 6
    for (int ii = 0; ii < MB; ii++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) acc[ii][v] = _mm512_setzero_ps();
    const int64_t kq = (k + 1) / 2;
    for (int64_t q = 0; q < kq; q++) {
        const uint16_t *r0 = b + 2 * q * ldb, *r1 = r0 + ldb;
        const bool odd = 2 * q + 1 < k;
        const __m512i x0 = _mm512_maskz_loadu_epi16(m0, r0), y0 = odd ? _mm512_maskz_loadu_epi16(m0, r1) : _mm512_setzero_si512();
        const __m512i x1 = _mm512_maskz_loadu_epi16(m1, r0 + 32), y1 = odd ? _mm512_maskz_loadu_epi16(m1, r1 + 32) : _mm512_setzero_si512();
        const __m512bh w[4] = {as_bh(_mm512_unpacklo_epi16(x0, y0)), as_bh(_mm512_unpackhi_epi16(x0, y0)),
                               as_bh(_mm512_unpacklo_epi16(x1, y1)), as_bh(_mm512_unpackhi_epi16(x1, y1))};
#pragma GCC unroll 6
        for (int ii = 0; ii < MB; ii++) {
            const __m512bh x = as_bh(_mm512_set1_epi32((int)((const uint32_t *)(a + ii * lda))[q]));
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) acc[ii][v] = _mm512_dpbf16_ps(acc[ii][v], x, w[v]);
        }
    }
    /* lo = accumulator 2h, hi = 2h + 1: columns 32h + 16t + (0..15) are lanes (lo.2t, hi.2t, lo.2t+1, hi.2t+1). */
    const __m512i even = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i oddl = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
    const __mmask16 sm[4] = {(__mmask16)m0, (__mmask16)(m0 >> 16), (__mmask16)m1, (__mmask16)(m1 >> 16)};
#pragma GCC unroll 6
    for (int ii = 0; ii < MB; ii++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512 lo = acc[ii][2 * h], hi = acc[ii][2 * h + 1];
            _mm512_mask_storeu_ps(c + ii * ldc + 32 * h, sm[2 * h], _mm512_permutex2var_ps(lo, even, hi));
            _mm512_mask_storeu_ps(c + ii * ldc + 32 * h + 16, sm[2 * h + 1], _mm512_permutex2var_ps(lo, oddl, hi));
        }
}

typedef void (*dp_axpy_fn)(int64_t k, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, int64_t nn,
                           float *c, int64_t ldc);

#define DP_AXPY(MB)                                                                                          \
    DP_TARGET static void dp_axpy_##MB(int64_t k, const uint16_t *a, int64_t lda, const uint16_t *b,           \
                                       int64_t ldb, int64_t nn, float *c, int64_t ldc) {                     \
        axpy_tile(MB, k, a, lda, b, ldb, nn, c, ldc);                                                        \
    }
DP_AXPY(1) DP_AXPY(2) DP_AXPY(3) DP_AXPY(4) DP_AXPY(5) DP_AXPY(6)
static const dp_axpy_fn dp_axpy[7] = {NULL, dp_axpy_1, dp_axpy_2, dp_axpy_3, dp_axpy_4, dp_axpy_5, dp_axpy_6};

void nk_gemm_dpbf16_skinny_ncontig(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                                   const uint16_t *b, int64_t ldb, float *c, int64_t ldc) {
    for (int64_t j = 0; j < n; j += 64) {
        const int64_t nn = n - j < 64 ? n - j : 64;
        for (int64_t i = 0; i < m; i += 6) {
            const int mb = m - i < 6 ? (int)(m - i) : 6;
            dp_axpy[mb](k, a + i * lda, lda, b + j, ldb, nn, c + i * ldc + j, ldc);
        }
    }
}

#else /* not x86-64: never selected */

bool nk_gemm_dpbf16_available(void) {
    return false;
}

void nk_dp_pack_b(uint32_t *dst, const uint16_t *b, int64_t sk, int64_t sn, int64_t kcur, int64_t ncur,
                  int64_t kp) {
    (void)dst, (void)b, (void)sk, (void)sn, (void)kcur, (void)ncur, (void)kp;
}

void nk_dp_matmul(int64_t m, int64_t np, int64_t kp, const uint16_t *a, int64_t lda, const uint32_t *bp,
                  float *c, int64_t ldc, bool accumulate) {
    (void)m, (void)np, (void)kp, (void)a, (void)lda, (void)bp, (void)c, (void)ldc, (void)accumulate;
}

bool nk_gemm_dpbf16_block(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t a_sm, int64_t a_sk,
                          const uint16_t *b, int64_t b_sk, int64_t b_sn, float *acc, int64_t ldacc, bool stream_b,
                          nk_gemm_rows_fn flush, void *flush_ctx) {
    return false;
}

void nk_gemm_dpbf16_skinny_kcontig(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                                   const uint16_t *b, int64_t ldb, float *c, int64_t ldc) {
    (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)ldc;
}

void nk_gemm_dpbf16_skinny_ncontig(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                                   const uint16_t *b, int64_t ldb, float *c, int64_t ldc) {
    (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)ldc;
}

#endif
