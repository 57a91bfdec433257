/*
 * gemm_amx.c - bf16 products on AMX tiles (tdpbf16ps: bf16 pairs, fp32 accumulation).
 *
 * Eight tile registers of 16 rows x 64 bytes: four hold a 32x32 fp32 block of C, two hold 32 rows of A
 * (16 rows x 32 k each) and two hold B in the pair-interleaved ("VNNI") order the instruction reads:
 * row p of a B tile is 16 columns x (k = 2p, 2p + 1). Packing brings A into rows of kc bf16 and B into
 * 16-column panels of kc/2 such rows, zero-padded to whole tiles, so the kernel never sees an edge.
 */
#include "gemm_internal.h"

#include <stdlib.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq")))
#define AMX_INLINE static inline __attribute__((always_inline)) AMX_TARGET

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Depth and rows per packed block: 32 rows of A (32 x kc bf16 = 32 KiB) stay in L1 while the B panels
 * stream from L2. */
#define AMX_KC 512
#define AMX_MC 256

static int g_amx_state; /* 0 unknown, 1 usable, -1 not */

bool nk_gemm_amx_available(void) {
    int s = __atomic_load_n(&g_amx_state, __ATOMIC_ACQUIRE);
    if (s != 0) return s > 0;
    unsigned a, b, c, d;
    bool ok = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) && (d & (1u << 24));
    /* Linux hands out the 8 KiB tile state only to processes that ask for it. */
    if (ok) ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    __atomic_store_n(&g_amx_state, ok ? 1 : -1, __ATOMIC_RELEASE);
    return ok;
}

typedef struct amx_tilecfg {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tilecfg;

typedef struct amx_scratch {
    uint16_t *p;
    size_t cap;
} amx_scratch;

static _Thread_local amx_scratch t_amx_b;

static uint16_t *amx_scratch_get(amx_scratch *s, size_t n) {
    if (n <= s->cap) return s->p;
    free(s->p);
    s->p = aligned_alloc(64, (n * 2 + 63) & ~(size_t)63);
    s->cap = s->p ? n : 0;
    return s->p;
}

/* c[32 x 32] (fp32, row stride ldc) = (accumulate ? c : 0) + a[32 x kp] . b, for kp a multiple of 32;
 * rows of a lie lda elements apart. */
AMX_INLINE void amx_kernel(int64_t kp, const uint16_t *a, int64_t lda, const uint16_t *b0, const uint16_t *b1,
                           float *c, int64_t ldc, bool accumulate) {
    const int64_t cs = ldc * 4;
    if (accumulate) {
        _tile_loadd(0, c, cs);
        _tile_loadd(1, c + 16, cs);
        _tile_loadd(2, c + 16 * ldc, cs);
        _tile_loadd(3, c + 16 * ldc + 16, cs);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    const int64_t as = lda * 2;
    /* Each product follows the loads it needs, so the first starts while the others load; the next
     * step's B tiles (2 KiB, from L2) are asked for one step ahead. Both together: 5-15% over four loads
     * then four products (bf16, 2 threads, M=512 and 128). */
    for (int64_t k = 0; k < kp; k += 32) {
        if (k + 32 < kp)
            for (int l = 0; l < 16; l++) {
                _mm_prefetch((const char *)(b0 + (k + 32) * 16) + 64 * l, _MM_HINT_T0);
                _mm_prefetch((const char *)(b1 + (k + 32) * 16) + 64 * l, _MM_HINT_T0);
            }
        _tile_loadd(4, a + k, as);
        _tile_loadd(6, b0 + k * 16, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b1 + k * 16, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a + 16 * lda + k, as);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, cs);
    _tile_stored(1, c + 16, cs);
    _tile_stored(2, c + 16 * ldc, cs);
    _tile_stored(3, c + 16 * ldc + 16, cs);
}

AMX_INLINE __mmask32 mask32(int64_t n) {
    return n >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << n) - 1u);
}

/* 16 lanes of 32-bit words: the same 16x16 transpose as the fp32 packer, on raw bits. */
AMX_INLINE void transpose16_bits(__m512 r[16]) {
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

/*
 * B block (kcur x ncur at b, strides sk, sn) into panels of 16 columns x kp/2 rows of (k even, k odd)
 * pairs; kp = kcur rounded up to 32, columns to 32; missing k and columns are zero.
 */
AMX_TARGET static void pack_b_vnni(uint16_t *dst, const uint16_t *b, int64_t sk, int64_t sn, int64_t kcur,
                                   int64_t ncur, int64_t kp) {
    const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                         37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    /* Whole panel pairs: the kernel reads 32 columns at a time. */
    const int64_t npad = (ncur + 31) / 32 * 32;
    for (int64_t p0 = 0; p0 < npad; p0 += 16) {
        const int64_t cols = ncur - p0 >= 16 ? 16 : (ncur - p0 > 0 ? ncur - p0 : 0);
        uint16_t *d = dst + p0 * kp;
        if (sk == 1) {
            /* Column j's k pairs are 32-bit words: a 16x16 word transpose per 32 k. */
            for (int64_t k0 = 0; k0 < kp; k0 += 32) {
                const __mmask32 m = k0 < kcur ? mask32(kcur - k0) : 0;
                __m512 r[16];
                for (int j = 0; j < 16; j++)
                    r[j] = j < cols ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, b + (p0 + j) * sn + k0))
                                    : _mm512_setzero_ps();
                transpose16_bits(r);
                for (int q = 0; q < 16; q++) _mm512_store_ps((float *)(d + (k0 / 2 + q) * 32), r[q]);
            }
        } else if (sn == 1) {
            /* Rows k and k + 1 interleave element by element. */
            const __mmask16 cm = (__mmask16)((1u << cols) - 1u);
            for (int64_t k = 0; k < kp; k += 2) {
                const __m256i r0 = k < kcur ? _mm256_maskz_loadu_epi16(cm, b + k * sk + p0) : _mm256_setzero_si256();
                const __m256i r1 = k + 1 < kcur ? _mm256_maskz_loadu_epi16(cm, b + (k + 1) * sk + p0)
                                                : _mm256_setzero_si256();
                const __m512i v = _mm512_permutex2var_epi16(_mm512_castsi256_si512(r0), idx, _mm512_castsi256_si512(r1));
                _mm512_store_si512((void *)(d + k * 16), v);
            }
        } else {
            for (int64_t k = 0; k < kp; k++)
                for (int64_t j = 0; j < 16; j++)
                    d[(k / 2) * 32 + j * 2 + (k & 1)] = (k < kcur && j < cols) ? b[k * sk + (p0 + j) * sn] : 0;
        }
    }
}

/* A block (mcur x kcur at a, strides sm, sk) into mp rows of kp bf16, zero-padded. */
static void pack_a_rows(uint16_t *dst, const uint16_t *a, int64_t sm, int64_t sk, int64_t mcur, int64_t kcur,
                        int64_t mp, int64_t kp) {
    for (int64_t i = 0; i < mp; i++) {
        uint16_t *d = dst + i * kp;
        int64_t k = 0;
        if (i < mcur) {
            const uint16_t *src = a + i * sm;
            if (sk == 1) {
                memcpy(d, src, (size_t)kcur * 2);
                k = kcur;
            } else {
                for (; k < kcur; k++) d[k] = src[k * sk];
            }
        }
        for (; k < kp; k++) d[k] = 0;
    }
}

/* Every tile 16 rows x 64 bytes. */
AMX_TARGET static void amx_config(void) {
    amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    /* GCC does not see ldtilecfg read the whole struct and may drop the stores above. */
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* The products of a tile session and of nk_gemm_amx_block_packed_a. */
AMX_TARGET void nk_amx_matmul(int64_t mp, int64_t np, int64_t kp, const uint16_t *a, int64_t lda,
                              const uint16_t *bp, float *c, int64_t ldc, bool accumulate) {
    /* A rows outer: a 32-row group (32 x 512 deep, 32 KiB) stays in L1 across every B panel pair, which
     * streams from L2 in whole 1 KiB tiles. B panels outer kept B in L1 instead and fetched A's tiles
     * from L2 as 16 lines 1 KiB apart, and ran at 2/3 the speed (M=512 x 768 x 2048, one thread: 520-560
     * -> 755-811 GFLOP/s). */
    for (int64_t ir = 0; ir < mp; ir += 32)
        for (int64_t jr = 0; jr < np; jr += 32)
            amx_kernel(kp, a + ir * lda, lda, bp + jr * kp, bp + (jr + 16) * kp, c + ir * ldc + jr, ldc, accumulate);
}

/* A packed once for every column block of a task: per depth block of AMX_KC, mp x kp rows (mp = m
 * rounded up to 32, kp = the block's depth rounded up to 32), blocks one after another. */
int64_t nk_gemm_amx_packed_a_size(int64_t m, int64_t k) {
    const int64_t mp = (m + 31) / 32 * 32;
    int64_t total = 0;
    for (int64_t pc = 0; pc < k; pc += AMX_KC) total += mp * (((k - pc < AMX_KC ? k - pc : AMX_KC) + 31) / 32 * 32);
    return total;
}

void nk_gemm_amx_pack_a(uint16_t *dst, int64_t m, int64_t k, const uint16_t *a, int64_t a_sm, int64_t a_sk) {
    const int64_t mp = (m + 31) / 32 * 32;
    for (int64_t pc = 0; pc < k; pc += AMX_KC) {
        const int64_t kcur = k - pc < AMX_KC ? k - pc : AMX_KC, kp = (kcur + 31) / 32 * 32;
        pack_a_rows(dst, a + pc * a_sk, a_sm, a_sk, m, kcur, mp, kp);
        dst += mp * kp;
    }
}

AMX_TARGET bool nk_gemm_amx_block_packed_a(int64_t m, int64_t n, int64_t k, const uint16_t *ap, const uint16_t *b,
                                           int64_t b_sk, int64_t b_sn, float *acc, int64_t ldacc) {
    const int64_t np = (n + 31) / 32 * 32, mp = (m + 31) / 32 * 32;
    const int64_t kc_max = k < AMX_KC ? (k + 31) / 32 * 32 : AMX_KC;
    uint16_t *bp = amx_scratch_get(&t_amx_b, (size_t)(np * kc_max));
    if (bp == NULL) return false;
    amx_config();
    for (int64_t pc = 0; pc < k; pc += AMX_KC) {
        const int64_t kcur = k - pc < AMX_KC ? k - pc : AMX_KC;
        const int64_t kp = (kcur + 31) / 32 * 32;
        pack_b_vnni(bp, b + pc * b_sk, b_sk, b_sn, kcur, n, kp);
        for (int64_t ic = 0; ic < mp; ic += AMX_MC)
            nk_amx_matmul(mp - ic < AMX_MC ? mp - ic : AMX_MC, np, kp, ap + ic * kp, kp, bp, acc + ic * ldacc, ldacc,
                          pc > 0);
        ap += mp * kp;
    }
    _tile_release();
    return true;
}

/* ---- few rows: the weights read in place ------------------------------------------------------------ */

static _Thread_local amx_scratch t_amx_w;


/* Rows r0.. of a 32-row block of w (rows ldw apart, k contiguous) whose tiles would read past row n or
 * column k: copied, zero-padded, so the tile loads stay inside the caller's memory. */
static const uint16_t *amx_w_padded(const uint16_t *w, int64_t ldw, int64_t rows, int64_t k, int64_t kp) {
    uint16_t *d = amx_scratch_get(&t_amx_w, (size_t)(32 * kp));
    if (d == NULL) return NULL;
    for (int64_t r = 0; r < 32; r++) {
        if (r < rows) memcpy(d + r * kp, w + r * ldw, (size_t)k * 2);
        memset(d + r * kp + (r < rows ? k : 0), 0, (size_t)(kp - (r < rows ? k : 0)) * 2);
    }
    return d;
}

/* Tile c (16 rows of w x 16 rows of a, fp32) into acc transposed: acc row i0 + q, columns j0.. */
AMX_INLINE void amx_store_transposed(const float *tmp, float *acc, int64_t ldacc, int64_t i0, int64_t m, int64_t j0) {
    __m512 r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_load_ps(tmp + 16 * i);
    transpose16_bits(r);
    for (int q = 0; q < 16 && i0 + q < m; q++) _mm512_storeu_ps(acc + (i0 + q) * ldacc + j0, r[q]);
}

AMX_TARGET bool nk_gemm_amx_skinny(int64_t m, int64_t n, int64_t k, const uint16_t *ap, const uint16_t *w,
                                   int64_t ldw, float *acc, int64_t ldacc) {
    const int64_t kp = (k + 31) / 32 * 32;
    /* A tile reads 64 bytes of each row: whole rows only when k fills the last one. */
    const bool k_whole = k == kp;
    const uint16_t *a0 = ap, *a1 = ap + 16 * kp;
    const bool two = m > 16;
    float tmp[256] __attribute__((aligned(64)));
    amx_config();
    for (int64_t j = 0; j < n; j += 32) {
        const uint16_t *wb = w + j * ldw;
        int64_t ld = ldw;
        if (n - j < 32 || !k_whole) {
            wb = amx_w_padded(wb, ldw, n - j < 32 ? n - j : 32, k, kp);
            if (wb == NULL) {
                _tile_release();
                return false;
            }
            ld = kp;
        }
        const int64_t ws = ld * 2;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t kk = 0; kk < kp; kk += 32) {
            _tile_loadd(4, wb + kk, ws);
            _tile_loadd(5, wb + 16 * ld + kk, ws);
            _tile_loadd(6, a0 + kk * 16, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(2, 5, 6);
            if (two) {
                _tile_loadd(7, a1 + kk * 16, 64);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
        _tile_stored(0, tmp, 64);
        amx_store_transposed(tmp, acc, ldacc, 0, m, j);
        _tile_stored(2, tmp, 64);
        amx_store_transposed(tmp, acc, ldacc, 0, m, j + 16);
        if (two) {
            _tile_stored(1, tmp, 64);
            amx_store_transposed(tmp, acc, ldacc, 16, m, j);
            _tile_stored(3, tmp, 64);
            amx_store_transposed(tmp, acc, ldacc, 16, m, j + 16);
        }
    }
    _tile_release();
    return true;
}

/* ---- a tile session for callers issuing many small products (attention) ---------------------- */

AMX_TARGET bool nk_amx_session_begin(void) {
    if (!nk_gemm_bf16_on_amx()) return false;
    amx_config();
    return true;
}

AMX_TARGET void nk_amx_session_end(void) {
    _tile_release();
}

void nk_amx_pack_b(uint16_t *dst, const uint16_t *b, int64_t sk, int64_t sn, int64_t kcur, int64_t ncur,
                   int64_t kp) {
    pack_b_vnni(dst, b, sk, sn, kcur, ncur, kp);
}

/* Every CPU with AMX-BF16 has vcvtne2ps2bf16 too. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void nk_amx_row_to_bf16(const float *s, int64_t n,
                                                                               uint16_t *p) {
    for (int64_t j = 0; j < n; j += 32) {
        const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + j + 16), _mm512_loadu_ps(s + j));
        _mm512_storeu_si512((void *)(p + j), (__m512i)v);
    }
}

#else

bool nk_gemm_amx_available(void) {
    return false;
}

int64_t nk_gemm_amx_packed_a_size(int64_t m, int64_t k) {
    (void)m, (void)k;
    return 0;
}

void nk_gemm_amx_pack_a(uint16_t *dst, int64_t m, int64_t k, const uint16_t *a, int64_t a_sm, int64_t a_sk) {
    (void)dst, (void)m, (void)k, (void)a, (void)a_sm, (void)a_sk;
}

bool nk_gemm_amx_block_packed_a(int64_t m, int64_t n, int64_t k, const uint16_t *ap, const uint16_t *b,
                                int64_t b_sk, int64_t b_sn, float *acc, int64_t ldacc) {
    (void)m, (void)n, (void)k, (void)ap, (void)b, (void)b_sk, (void)b_sn, (void)acc, (void)ldacc;
    return false;
}

bool nk_gemm_amx_skinny(int64_t m, int64_t n, int64_t k, const uint16_t *ap, const uint16_t *w, int64_t ldw,
                        float *acc, int64_t ldacc) {
    (void)m, (void)n, (void)k, (void)ap, (void)w, (void)ldw, (void)acc, (void)ldacc;
    return false;
}

bool nk_amx_session_begin(void) {
    return false;
}

void nk_amx_session_end(void) {}

void nk_amx_pack_b(uint16_t *dst, const uint16_t *b, int64_t sk, int64_t sn, int64_t kcur, int64_t ncur,
                   int64_t kp) {
    (void)dst, (void)b, (void)sk, (void)sn, (void)kcur, (void)ncur, (void)kp;
}

void nk_amx_matmul(int64_t mp, int64_t np, int64_t kp, const uint16_t *a, int64_t lda, const uint16_t *bp,
                   float *c, int64_t ldc, bool accumulate) {
    (void)mp, (void)np, (void)kp, (void)a, (void)lda, (void)bp, (void)c, (void)ldc, (void)accumulate;
}

void nk_amx_row_to_bf16(const float *s, int64_t n, uint16_t *p) {
    (void)s, (void)n, (void)p;
}

#endif
