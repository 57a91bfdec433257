/*
 * attention.c - scaled dot-product attention, forward and backward (see neuron_kernels.h).
 *
 * Flash-attention style: a task owns a block of query rows of one (batch, head) and streams over
 * key blocks, keeping only a row maximum, a row sum and an fp32 output accumulator (online softmax),
 * so memory is O(block^2) whatever the sequence lengths. Inputs of any float dtype and strides are
 * converted into small zero-padded fp32 panels (head dims padded to 16 so every inner loop is whole
 * vectors); the inner loops live in attention_simd.h, compiled per ISA and picked at run time.
 *
 * The backward recomputes the probabilities block by block from the saved log-sum-exp. A task owns
 * one key/value head (all its query heads, for grouped-query attention) so dK and dV accumulate
 * without synchronisation; dQ of a query block is complete after its sweep over the keys.
 */
#include "gemm_internal.h"
#include "kernels_internal.h"

#include <stdatomic.h>
#include <stdlib.h>

#pragma GCC diagnostic ignored "-Wpsabi"

typedef struct nk_attn_simd {
    void (*gemm_acc)(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                     float *C, int64_t ldc);
    void (*gemv_dots)(int64_t n, int64_t d, const float *q, const float *K, int64_t ldk, float *s);
    /* The same with B / K rows in bf16 (NULL where an ISA has none: rows are then widened first). */
    void (*gemm_acc_bf16)(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const uint16_t *B,
                          int64_t ldb, float *C, int64_t ldc);
    void (*gemv_dots_bf16)(int64_t n, int64_t d, const float *q, const uint16_t *K, int64_t ldk, float *s);
    float (*row_max)(const float *s, int64_t n);
    float (*row_scale_max)(float *s, int64_t n, float scale);
    void (*rows_exp_sum)(float *S, int64_t ld, int64_t rows, int64_t n, const float *m, float *sum);
    void (*vec_exp_diff)(const float *a, const float *b, float *out, int64_t n);
    float (*row_exp_sum)(float *s, int64_t n, float m);
    void (*row_exp)(float *s, int64_t n, float m);
    /* gemm_acc's N must be a multiple of this (16, or 8 where a narrower strip exists). */
    int64_t n_align;
    /* C[M, N] (+)= A[M, K] @ B[K, N] with B packed in column strips (NULL where an ISA has none): strip j
     * (columns j .. j+w, w = 16 or, last, 8) at Bpk + j * ldk (ldk >= K), element (k, j + jj) at
     * [k * w + jj]. N a multiple of 8; init: C = A @ B (C is not read), else C += A @ B. */
    void (*gemm_pk)(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *Bpk, int64_t ldk,
                    float *C, int64_t ldc, bool init);
    /* dst[i * ldd + j] = src[j * lds + i], j < 16, i < n <= 16 (NULL: a scalar loop); packs K^T's strips. */
    void (*transpose16)(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t n);
} nk_attn_simd;

/* fp-contract=fast: ISO C mode turns off a*b+c -> fma contraction, which halves GEMM throughput. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/*
 * gemm_pk (see nk_attn_simd) for AVX-512 in intrinsics: tiles of up to 6 rows x 4 strips (24 zmm
 * accumulators, four strip vectors and a broadcast of the 32 registers; 6 row and 4 strip pointers fit
 * the 16 general registers, where a 12 x 2 tile's 12 row pointers spilled to the stack and were reloaded
 * every k). The generic 8 x 32 tile over K^T blocks of 64 keys, with V rows copied per query block where
 * the head dim is not a multiple of 16, ran a head-dim-40 attention at 0.70x PyTorch CPU on a 2-core
 * Xeon with two FMA pipes.
 */
#define NK_AVX512 __attribute__((target("avx512f"), optimize("fp-contract=fast")))
/* Rows of K per pass: four 16-column strips (NK_AVX512_KC x 256 bytes, 32 KiB) stay in L1 while every
 * row tile of A passes over them; C sums its products in k order whatever the blocking. */
#define NK_AVX512_KC 128

/* C[R, 16 V] (+)= A[R, kc] @ strips B, B + sb, ... (V of them); pf (NULL: nothing): the next strips'
 * lines, one of each per k, prefetched by the first row tile (the hardware prefetchers do not follow
 * strips that far apart, and each group's first tile waited for them). */
__attribute__((always_inline)) NK_AVX512 static inline void nk_pk_tile_avx512(const int R, const int V, int64_t kc,
                                                                              const float *At, int64_t lda,
                                                                              const float *B, int64_t sb,
                                                                              float *Ct, int64_t ldc, bool init,
                                                                              const float *pf, int64_t spf) {
    __m512 c[6][4];
    const float *b[4];
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) b[v] = B + v * sb;
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) c[r][v] = init ? _mm512_setzero_ps() : _mm512_loadu_ps(Ct + r * ldc + 16 * v);
    for (int64_t k = 0; k < kc; k++) {
        if (pf != NULL)
#pragma GCC unroll 4
            for (int v = 0; v < V; v++) _mm_prefetch((const char *)(pf + v * spf + k * 16), _MM_HINT_T0);
        __m512 bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) bv[v] = _mm512_load_ps(b[v] + k * 16);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m512 a = _mm512_set1_ps(At[r * lda + k]);
#pragma GCC unroll 4
            for (int v = 0; v < V; v++) c[r][v] = _mm512_fmadd_ps(a, bv[v], c[r][v]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) _mm512_storeu_ps(Ct + r * ldc + 16 * v, c[r][v]);
}

/* Every row tile of one pass over a group of V strips. */
__attribute__((always_inline)) NK_AVX512 static inline void nk_pk_rows_avx512(const int V, int64_t M, int64_t kc,
                                                                              const float *A, int64_t lda,
                                                                              const float *B, int64_t sb,
                                                                              float *C, int64_t ldc, bool init,
                                                                              const float *pf, int64_t spf) {
    int64_t i = 0;
    for (; i + 6 <= M; i += 6)
        nk_pk_tile_avx512(6, V, kc, A + i * lda, lda, B, sb, C + i * ldc, ldc, init, i == 0 ? pf : NULL, spf);
    const float *At = A + i * lda;
    float *Ct = C + i * ldc;
    const float *p = i == 0 ? pf : NULL;
    switch (M - i) {
    case 5: nk_pk_tile_avx512(5, V, kc, At, lda, B, sb, Ct, ldc, init, p, spf); break;
    case 4: nk_pk_tile_avx512(4, V, kc, At, lda, B, sb, Ct, ldc, init, p, spf); break;
    case 3: nk_pk_tile_avx512(3, V, kc, At, lda, B, sb, Ct, ldc, init, p, spf); break;
    case 2: nk_pk_tile_avx512(2, V, kc, At, lda, B, sb, Ct, ldc, init, p, spf); break;
    case 1: nk_pk_tile_avx512(1, V, kc, At, lda, B, sb, Ct, ldc, init, p, spf); break;
    default: break;
    }
}

/* Strips are 16 wide here (n_align 16): N a multiple of 16. */
NK_AVX512 static void nk_gemm_pk_avx512(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                                        const float *Bpk, int64_t ldk, float *C, int64_t ldc, bool init_all) {
    const int64_t sb = 16 * ldk; /* from one strip to the next */
    for (int64_t k0 = 0; k0 < K; k0 += NK_AVX512_KC) {
        const int64_t kc = K - k0 < NK_AVX512_KC ? K - k0 : NK_AVX512_KC;
        const bool init = init_all && k0 == 0;
        for (int64_t j = 0; j < N;) {
            /* Groups of 4 strips; five left go as 3 + 2: a lone strip is 6 accumulators, each FMA waiting
             * on its predecessor's 4-cycle latency, so it ran at 3/4 of the rate (80 = 5 strips, D = 80). */
            const int64_t left = (N - j) / 16;
            const int V = left == 5 ? 3 : left >= 4 ? 4 : (int)left;
            const float *B = Bpk + j * ldk + k0 * 16;
            /* The next group of this pass, else the first of the next pass (a prefetch past the end of the
             * strips only fetches a line for nothing: it never faults). */
            const float *pf = j + 16 * V < N ? B + V * sb : (k0 + kc < K ? Bpk + (k0 + kc) * 16 : NULL);
            const float *Aj = A + k0;
            float *Cj = C + j;
#define NK_PK_GROUP(VV)                                                                                   \
    do {                                                                                                  \
        if (init) nk_pk_rows_avx512(VV, M, kc, Aj, lda, B, sb, Cj, ldc, true, pf, sb);                    \
        else nk_pk_rows_avx512(VV, M, kc, Aj, lda, B, sb, Cj, ldc, false, pf, sb);                        \
    } while (0)
            switch (V) {
            case 4: NK_PK_GROUP(4); break;
            case 3: NK_PK_GROUP(3); break;
            case 2: NK_PK_GROUP(2); break;
            default: NK_PK_GROUP(1); break;
            }
#undef NK_PK_GROUP
            j += 16 * V;
        }
    }
}
#define NK_ATTN_GEMM_PK nk_gemm_pk_avx512
#define NK_ATTN_TRANSPOSE16 nk_transpose16_f32_avx512

#define NK_ATTN_AVX512_EXP
#endif
#define NK_SFX(name) name##_avx512
#define NK_TGT __attribute__((target("avx512f"), optimize("fp-contract=fast")))
#define NK_GEMM_ROWS 8
#include "attention_simd.h"
#undef NK_ATTN_AVX512_EXP
#undef NK_ATTN_GEMM_PK
#undef NK_ATTN_TRANSPOSE16
#undef NK_SFX
#undef NK_TGT
#undef NK_GEMM_ROWS
#define NK_SFX(name) name##_avx2
#define NK_TGT __attribute__((target("avx2,fma"), optimize("fp-contract=fast")))
#define NK_ATTN_OWN_PRODUCTS /* below, in intrinsics */
#define NK_ATTN_OWN_ROWS
#include "attention_simd.h"
#undef NK_SFX
#undef NK_TGT
#undef NK_ATTN_OWN_PRODUCTS
#undef NK_ATTN_OWN_ROWS
#define NK_SFX(name) name##_base
#define NK_TGT
#define NK_GEMM_ROWS 4
#include "attention_simd.h"
#undef NK_SFX
#undef NK_TGT
#undef NK_GEMM_ROWS

/*
 * The two products of attention for AVX2 in 8-float intrinsics. GCC lowers the 64-byte vectors of
 * attention_simd.h for AVX2 through the stack (a splat and every FMA go via memory), which made a
 * 512-token causal attention 24x slower than PyTorch's; with AVX-512 those vectors are one register.
 */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "simd_avx2.h"
#define NK_AVX2 __attribute__((target("avx2,fma")))

/*
 * C[R rows, 16] += A[R, K] @ B[K, 16] for R <= 6: 2R accumulators, two B vectors and a broadcast fill 15
 * of the 16 ymm registers (the shape of BLIS's Haswell kernel). Two loads feed every 2R FMAs, so R = 6
 * runs near the FMA rate where R = 4 (three loads per four FMAs) waited on loads.
 */
/* init: the accumulators start at zero instead of C's values. */
#define NK_AVX2_TILE_I(R, init) NK_AVX2_TILE_IP(R, init, (const float *)0)
/* PF (when not a null constant): a line of a 16-wide strip prefetched per k, for the next strip. */
#define NK_AVX2_TILE_IP(R, init, PF)                                                                       \
    do {                                                                                                   \
        __m256 c_[R][2];                                                                                   \
        for (int r_ = 0; r_ < (R); r_++) {                                                                 \
            c_[r_][0] = (init) ? _mm256_setzero_ps() : _mm256_loadu_ps(Ct + r_ * ldc);                     \
            c_[r_][1] = (init) ? _mm256_setzero_ps() : _mm256_loadu_ps(Ct + r_ * ldc + 8);                 \
        }                                                                                                  \
        for (int64_t k_ = 0; k_ < kc; k_++) {                                                              \
            if ((PF) != 0) _mm_prefetch((const char *)((PF) + k_ * 16), _MM_HINT_T0);                      \
            const __m256 b0_ = _mm256_loadu_ps(Bt + k_ * ldb), b1_ = _mm256_loadu_ps(Bt + k_ * ldb + 8);   \
            for (int r_ = 0; r_ < (R); r_++) {                                                             \
                const __m256 a_ = _mm256_broadcast_ss(At + r_ * lda + k_);                                 \
                c_[r_][0] = _mm256_fmadd_ps(a_, b0_, c_[r_][0]);                                           \
                c_[r_][1] = _mm256_fmadd_ps(a_, b1_, c_[r_][1]);                                           \
            }                                                                                              \
        }                                                                                                  \
        for (int r_ = 0; r_ < (R); r_++) {                                                                 \
            _mm256_storeu_ps(Ct + r_ * ldc, c_[r_][0]);                                                    \
            _mm256_storeu_ps(Ct + r_ * ldc + 8, c_[r_][1]);                                                \
        }                                                                                                  \
    } while (0)

/* The same for an 8-column strip (R <= 12: R accumulators, one B vector, a broadcast): the last strip
 * of a row length that is a multiple of 8 but not of 16 (head dims 40, 72, 24), which a 16-wide strip
 * padded with zeros (a fifth of the product's work at 40). */
#define NK_AVX2_TILE8_I(R, init)                                                                           \
    do {                                                                                                   \
        __m256 c_[R];                                                                                      \
        for (int r_ = 0; r_ < (R); r_++) c_[r_] = (init) ? _mm256_setzero_ps() : _mm256_loadu_ps(Ct + r_ * ldc); \
        for (int64_t k_ = 0; k_ < kc; k_++) {                                                              \
            const __m256 b0_ = _mm256_loadu_ps(Bt + k_ * ldb);                                             \
            for (int r_ = 0; r_ < (R); r_++)                                                               \
                c_[r_] = _mm256_fmadd_ps(_mm256_broadcast_ss(At + r_ * lda + k_), b0_, c_[r_]);            \
        }                                                                                                  \
        for (int r_ = 0; r_ < (R); r_++) _mm256_storeu_ps(Ct + r_ * ldc, c_[r_]);                          \
    } while (0)

/* Rows of K per pass: a 16-column strip of B (NK_AVX2_KC x 64 bytes) stays in L1 while every row block
 * of A passes over it. Each C element still sums its products in k order (stored and reloaded between
 * passes), so the result does not depend on the blocking. */
#define NK_AVX2_KC 128

/* The row tiles of one kc-deep pass over a strip of B (Bt, row stride ldb) into C[:, j...]: a 16-wide
 * strip in 6-row tiles and a 1-5 row remainder, the first tile prefetching pf (NULL: nothing); an
 * 8-wide strip in 12-row tiles, then 6-row ones, then the remainder. init: the tiles start from zero
 * instead of C. Always inlined with init and pf constant at each call, so every tile keeps its
 * compile-time shape. */
__attribute__((always_inline)) NK_AVX2 static inline void nk_rows16_avx2(int64_t M, int64_t kc, const float *A, int64_t lda,
                                                                     const float *Bt, int64_t ldb, float *C,
                                                                     int64_t ldc, bool init, const float *pf) {
    int64_t i = 0;
    if (pf != NULL && M >= 6) {
        const float *At = A;
        float *Ct = C;
        if (init) NK_AVX2_TILE_IP(6, true, pf);
        else NK_AVX2_TILE_IP(6, false, pf);
        i = 6;
    }
    for (; i + 6 <= M; i += 6) {
        const float *At = A + i * lda;
        float *Ct = C + i * ldc;
        if (init) NK_AVX2_TILE_I(6, true);
        else NK_AVX2_TILE_I(6, false);
    }
    const float *At = A + i * lda;
    float *Ct = C + i * ldc;
    switch ((M - i) * 2 + init) {
    case 11: NK_AVX2_TILE_I(5, true); break;
    case 10: NK_AVX2_TILE_I(5, false); break;
    case 9: NK_AVX2_TILE_I(4, true); break;
    case 8: NK_AVX2_TILE_I(4, false); break;
    case 7: NK_AVX2_TILE_I(3, true); break;
    case 6: NK_AVX2_TILE_I(3, false); break;
    case 5: NK_AVX2_TILE_I(2, true); break;
    case 4: NK_AVX2_TILE_I(2, false); break;
    case 3: NK_AVX2_TILE_I(1, true); break;
    case 2: NK_AVX2_TILE_I(1, false); break;
    default: break;
    }
}

__attribute__((always_inline)) NK_AVX2 static inline void nk_rows8_avx2(int64_t M, int64_t kc, const float *A, int64_t lda,
                                                                    const float *Bt, int64_t ldb, float *C,
                                                                    int64_t ldc, bool init) {
    int64_t i = 0;
    for (; i + 12 <= M; i += 12) {
        const float *At = A + i * lda;
        float *Ct = C + i * ldc;
        if (init) NK_AVX2_TILE8_I(12, true);
        else NK_AVX2_TILE8_I(12, false);
    }
    for (; i < M; i += 6) {
        const float *At = A + i * lda;
        float *Ct = C + i * ldc;
        switch ((M - i < 6 ? M - i : 6) * 2 + init) {
        case 13: NK_AVX2_TILE8_I(6, true); break;
        case 12: NK_AVX2_TILE8_I(6, false); break;
        case 11: NK_AVX2_TILE8_I(5, true); break;
        case 10: NK_AVX2_TILE8_I(5, false); break;
        case 9: NK_AVX2_TILE8_I(4, true); break;
        case 8: NK_AVX2_TILE8_I(4, false); break;
        case 7: NK_AVX2_TILE8_I(3, true); break;
        case 6: NK_AVX2_TILE8_I(3, false); break;
        case 5: NK_AVX2_TILE8_I(2, true); break;
        case 4: NK_AVX2_TILE8_I(2, false); break;
        case 3: NK_AVX2_TILE8_I(1, true); break;
        case 2: NK_AVX2_TILE8_I(1, false); break;
        default: break;
        }
    }
}

/* C[M, N] += A[M, K] @ B[K, N]; N a multiple of 8 (of 16 for the other ISAs' versions). */
NK_AVX2 static void nk_gemm_acc_avx2(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                                       int64_t ldb_in, float *C, int64_t ldc) {
    float Bp[NK_AVX2_KC * 16] __attribute__((aligned(32)));
    for (int64_t k0 = 0; k0 < K; k0 += NK_AVX2_KC) {
        const int64_t kc = K - k0 < NK_AVX2_KC ? K - k0 : NK_AVX2_KC;
        int64_t j = 0;
        for (; j + 16 <= N; j += 16) {
            const float *Bt = B + k0 * ldb_in + j;
            int64_t ldb = ldb_in;
            if (M > 6) {
                /* The strip copied to consecutive lines: in place, rows a power-of-two multiple of 256
                 * bytes apart (K^T blocks, V rows of wide heads) share a few L1 sets and evicted each
                 * other before the next row block came back to them. The next strip's rows are
                 * prefetched meanwhile: they are far apart, which the hardware prefetchers do not
                 * follow, and their misses stalled this copy for a fifth of the product's time. */
                const float *nx = j + 16 < N ? Bt + 16 : (k0 + kc < K ? B + (k0 + kc) * ldb : NULL);
                const int64_t nkc = j + 16 < N ? kc : (K - k0 - kc < NK_AVX2_KC ? K - k0 - kc : NK_AVX2_KC);
                for (int64_t k = 0; k < kc; k++) {
                    if (nx != NULL && k < nkc) _mm_prefetch((const char *)(nx + k * ldb), _MM_HINT_T0);
                    _mm256_store_ps(Bp + k * 16, _mm256_loadu_ps(Bt + k * ldb));
                    _mm256_store_ps(Bp + k * 16 + 8, _mm256_loadu_ps(Bt + k * ldb + 8));
                }
                Bt = Bp;
                ldb = 16;
            }
            nk_rows16_avx2(M, kc, A + k0, lda, Bt, ldb, C + j, ldc, false, NULL);
        }
        if (j < N) /* an 8-column strip, read in place (8 floats: one line or two per row) */
            nk_rows8_avx2(M, kc, A + k0, lda, B + k0 * ldb_in + j, ldb_in, C + j, ldc, false);
    }
}

/* gemm_pk (see nk_attn_simd): the forward packs K^T and V once per call in the strips the tiles read, so
 * no product copies a strip per query block (an eighth of the products' time at head dim 40, much of
 * it waiting for rows far apart in L3), and the scores start from zero without a memset and a load. */
NK_AVX2 static void nk_gemm_pk_avx2(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *Bpk,
                                    int64_t ldk, float *C, int64_t ldc, bool init_all) {
    for (int64_t k0 = 0; k0 < K; k0 += NK_AVX2_KC) {
        const int64_t kc = K - k0 < NK_AVX2_KC ? K - k0 : NK_AVX2_KC;
        const bool init = init_all && k0 == 0;
        for (int64_t j = 0; j < N; j += 16) {
            const int64_t w = N - j < 16 ? 8 : 16;
            const float *Bt = Bpk + j * ldk + k0 * w;
            if (w == 16) {
                /* The first row tile prefetches the next 16-wide strip of this pass (or the first of the
                 * next pass), a line per k: strips come from L2 or L3 (a head's K^T and V exceed L2 from
                 * about 1k keys at head dim 128) and the first tile of each waited for them, 14% of the
                 * products of a head-dim-512 attention.
                 * (A prefetch past a short last strip or pass only fetches a line for nothing: it never faults.)
                 */
                const float *pf = j + 16 < N ? Bpk + (j + 16) * ldk + k0 * 16 : (k0 + kc < K ? Bpk + (k0 + kc) * 16 : Bt);
                if (init) nk_rows16_avx2(M, kc, A + k0, lda, Bt, 16, C + j, ldc, true, pf);
                else nk_rows16_avx2(M, kc, A + k0, lda, Bt, 16, C + j, ldc, false, pf);
            } else if (init) {
                nk_rows8_avx2(M, kc, A + k0, lda, Bt, 8, C + j, ldc, true);
            } else {
                nk_rows8_avx2(M, kc, A + k0, lda, Bt, 8, C + j, ldc, false);
            }
        }
    }
}
#undef NK_AVX2_TILE_I
#undef NK_AVX2_TILE_IP
#undef NK_AVX2_TILE8_I

/* s[j] = dot(q, K[j, :]) for j < n; d a multiple of 16. */
NK_AVX2 static void nk_gemv_dots_avx2(int64_t n, int64_t d, const float *q, const float *K, int64_t ldk, float *s) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t k = 0; k < d; k += 8) {
            const __m256 qv = _mm256_loadu_ps(q + k);
            for (int r = 0; r < 4; r++) a[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(K + (j + r) * ldk + k), a[r]);
        }
        for (int r = 0; r < 4; r++) s[j + r] = nk_hsum8_avx2(a[r]);
    }
    for (; j < n; j++) {
        __m256 a = _mm256_setzero_ps();
        for (int64_t k = 0; k < d; k += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + k), _mm256_loadu_ps(K + j * ldk + k), a);
        s[j] = nk_hsum8_avx2(a);
    }
}

/*
 * The row functions for AVX2 in 8-float intrinsics, for the same reason: GCC compiles the comparisons
 * of 64-byte vectors (exp's range checks, the NaN-keeping max) lane by lane when the target has no
 * 64-byte registers, and those made up 45% of a 512-token causal attention (0.62x PyTorch's CPU).
 * Same algorithm as attention_simd.h's portable exp: range checks, rounding by 1.5 * 2^23, degree-6
 * polynomial, 2^n in two halves; below -87.34 gives 0, NaN stays NaN.
 */
NK_AVX2 static inline __m256 nk_exp8_avx2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.72283f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ), nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 xc = _mm256_blendv_ps(x, lo, under);
    xc = _mm256_blendv_ps(xc, hi, _mm256_cmp_ps(xc, hi, _CMP_GT_OQ));
    xc = _mm256_andnot_ps(nan, xc);
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), magic), magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.f / 720.f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    const __m256 y = _mm256_andnot_ps(under, _mm256_mul_ps(_mm256_mul_ps(p, s1), s2));
    return _mm256_blendv_ps(y, x, nan);
}

/*
 * exp(x) for x <= 0 or NaN, the softmax's arguments (a score minus its row maximum), in 14 instructions
 * where nk_exp8_avx2 takes 23 (the exponentials were 15-20% of a head-dim-40 attention, bound by the FP
 * pipes at about 10 cycles per vector):
 * - no overflow side, so 2^n (n in [-127, 0]) is one multiply, its exponent bits taken from the rounding
 *   sum itself ((1.5 * 2^23 + n) has n in its low mantissa bits);
 * - the clamp is one max whose operand order keeps a NaN x (vmaxps returns its second operand when
 *   either is NaN): the NaN flows through to the result;
 * - the clamp sits at -88.03, where n reaches -127 and 2^n's bits are those of +0: x = -inf (masked
 *   scores) and everything below about -87.7 give exactly 0 with no compare and mask (between -87.7 and
 *   -87.34 the result is subnormal, as expf's is; nk_exp8_avx2 flushes those to 0);
 * - r = x - n ln2 in one fused step with ln2 rounded to float: the error, |n| * 2e-9 relative, is on
 *   values of 2^n, so absolutely below 1e-9 of the row's largest probability.
 */
NK_AVX2 static inline __m256 nk_exp8_nonpos_avx2(__m256 x) {
    const __m256 xc = _mm256_max_ps(_mm256_set1_ps(-88.03f), x); /* NaN x -> NaN */
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    const __m256 t = _mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), magic);
    const __m256 n = _mm256_sub_ps(t, magic);
    const __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693147180559945309f), xc);
    __m256 p = _mm256_set1_ps(1.f / 720.f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
    const __m256 s = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(p, s); /* NaN * s is NaN whatever s's bits */
}

/* max(a, b) per lane keeping a NaN of b, as nk_vmax_nan. */
NK_AVX2 static inline __m256 nk_max_nan8_avx2(__m256 a, __m256 b) {
    const __m256 take = _mm256_or_ps(_mm256_cmp_ps(b, a, _CMP_GT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    return _mm256_blendv_ps(a, b, take);
}

NK_AVX2 static inline float nk_hmax8_avx2(__m256 m) {
    m = nk_max_nan8_avx2(m, _mm256_permute2f128_ps(m, m, 1));
    m = nk_max_nan8_avx2(m, _mm256_permute_ps(m, 0x4E));
    m = nk_max_nan8_avx2(m, _mm256_permute_ps(m, 0xB1));
    return _mm256_cvtss_f32(m);
}

/* A NaN anywhere makes the maximum NaN (as nk_max_nan8_avx2), found by an unordered-compare flag beside a
 * plain max: the NaN-keeping max per vector (two compares, an or, a blend in a chain) made this pass
 * a quarter of the exponentials' time. */
NK_AVX2 static float nk_row_max_avx2(const float *s, int64_t n) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, u0 = _mm256_setzero_ps(), u1 = u0;
    for (int64_t j = 0; j < n; j += 16) {
        const __m256 v0 = _mm256_loadu_ps(s + j), v1 = _mm256_loadu_ps(s + j + 8);
        m0 = _mm256_max_ps(m0, v0);
        m1 = _mm256_max_ps(m1, v1);
        u0 = _mm256_or_ps(u0, _mm256_cmp_ps(v0, v0, _CMP_UNORD_Q));
        u1 = _mm256_or_ps(u1, _mm256_cmp_ps(v1, v1, _CMP_UNORD_Q));
    }
    if (!_mm256_testz_ps(_mm256_or_ps(u0, u1), _mm256_or_ps(u0, u1))) return NAN;
    return nk_hmax8_avx2(_mm256_max_ps(m0, m1));
}

NK_AVX2 static float nk_row_scale_max_avx2(float *s, int64_t n, float scale) {
    const __m256 sc = _mm256_set1_ps(scale);
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    for (int64_t j = 0; j < n; j += 16) {
        const __m256 v0 = _mm256_mul_ps(_mm256_loadu_ps(s + j), sc), v1 = _mm256_mul_ps(_mm256_loadu_ps(s + j + 8), sc);
        _mm256_storeu_ps(s + j, v0);
        _mm256_storeu_ps(s + j + 8, v1);
        m0 = nk_max_nan8_avx2(m0, v0);
        m1 = nk_max_nan8_avx2(m1, v1);
    }
    return nk_hmax8_avx2(nk_max_nan8_avx2(m0, m1));
}

/* m is the row's maximum (s[j] - m <= 0 or NaN: nk_exp8_nonpos_avx2). */
NK_AVX2 static float nk_row_exp_sum_avx2(float *s, int64_t n, float m) {
    const __m256 vm = _mm256_set1_ps(m);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (int64_t j = 0; j < n; j += 16) {
        const __m256 e0 = nk_exp8_nonpos_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        const __m256 e1 = nk_exp8_nonpos_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), vm));
        _mm256_storeu_ps(s + j, e0);
        _mm256_storeu_ps(s + j + 8, e1);
        a0 = _mm256_add_ps(a0, e0);
        a1 = _mm256_add_ps(a1, e1);
    }
    return nk_hsum8_avx2(_mm256_add_ps(a0, a1));
}

NK_AVX2 static void nk_rows_exp_sum_avx2(float *S, int64_t ld, int64_t rows, int64_t n, const float *m, float *sum) {
    for (int64_t r = 0; r < rows; r++) {
        float *s = S + r * ld;
        if (m[r] == -INFINITY) { /* nothing to attend: zeros, sum 0 */
            for (int64_t j = 0; j < n; j += 8) _mm256_storeu_ps(s + j, _mm256_setzero_ps());
            sum[r] = 0.f;
        } else {
            sum[r] = nk_row_exp_sum_avx2(s, n, m[r]);
        }
    }
}

NK_AVX2 static void nk_vec_exp_diff_avx2(const float *a, const float *b, float *out, int64_t n) {
    for (int64_t r = 0; r < n; r += 8)
        _mm256_storeu_ps(out + r, nk_exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(a + r), _mm256_loadu_ps(b + r))));
}

NK_AVX2 static void nk_row_exp_avx2(float *s, int64_t n, float m) {
    const __m256 vm = _mm256_set1_ps(m);
    for (int64_t j = 0; j < n; j += 8) _mm256_storeu_ps(s + j, nk_exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm)));
}

static const nk_attn_simd nk_attn_simd_table_avx2 = {
    .gemm_acc = nk_gemm_acc_avx2,
    .gemv_dots = nk_gemv_dots_avx2,
    .row_max = nk_row_max_avx2,
    .row_scale_max = nk_row_scale_max_avx2,
    .rows_exp_sum = nk_rows_exp_sum_avx2,
    .vec_exp_diff = nk_vec_exp_diff_avx2,
    .row_exp_sum = nk_row_exp_sum_avx2,
    .row_exp = nk_row_exp_avx2,
    .n_align = 8,
    .gemm_pk = nk_gemm_pk_avx2,
};
#endif

static const nk_attn_simd *nk_attn_simd_get(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return &nk_attn_simd_table_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &nk_attn_simd_table_avx2;
    return &nk_attn_simd_table_base;
}

#define NK_ATTN_BQ 64 /* query rows per block */
#define NK_ATTN_BK 64 /* keys per block (the backward; the forward: nk_sdpa_ctx.bk) */
/* Keys per block of the AVX2 forward (packed strips): longer rows of scores cut the per-block work of a
 * row (its maximum and sum folded across lanes, the rescale of its output, the products' tile loads and
 * stores). 128 keys against 64: 1.05-1.14x at head dims 40-512 on a Zen 3 (thread CPU time, 1 thread);
 * 256 against 128 (an S block of 64 KiB, still in L2): 1.03-1.06x at head dims 40-128, even at 512. */
#define NK_ATTN_BK_PK 256
/* Keys per block of the AMX forward: the per-block work of a row (its max and sum folded across lanes, the
 * rescale of its output) is paid once per 256 keys instead of per 64. */
#define NK_ATTN_AMX_BK 256

static int64_t nk_round16(int64_t x) {
    return (x + 15) & ~(int64_t)15;
}

static bool nk_attn_float_dtype(nk_dtype t) {
    return t == NK_F32 || t == NK_BF16 || t == NK_F16;
}

typedef struct nk_sdpa_ctx {
    const nk_sdpa_args *a;
    const nk_attn_simd *simd;
    int64_t B, Hq, Hkv, Lq, Lk, D, Dv, Dp, Dvp, group, nqb;
    int64_t Dvn; /* Dv rounded to simd->n_align (<= Dvp): the forward's output columns */
    int64_t bk;  /* keys per block of the forward: NK_ATTN_BK_PK with simd->gemm_pk, else NK_ATTN_BK */
    bool dp;     /* the bf16 tile path runs on AVX512-BF16 dot products, not AMX tiles */
    size_t es; /* element size of q/k/v/out */
    nk_cast_fn to_f32;     /* q/k/v dtype -> f32 */
    nk_cast_fn from_f32;   /* f32 -> q dtype */
    nk_cast_fn mask_f32;   /* mask dtype -> f32 */
    bool mask_bool;
    double keep;           /* 1 - dropout_p */
    float keep_scale;
    const nk_tensor *out, *lse, *grad_out, *dq, *dk, *dv, *dmask;
    float *kt; /* forward: K transposed once per call, [B][Hkv][key block][Dp][nkp] (see nk_sdpa_kt_range),
                * or with simd->gemm_pk in its strips: [B][Hkv][key block][nkp / 16][D][16] */
    float *vp; /* forward with simd->gemm_pk: V in strips once per call, [B][Hkv][key block][Dvn / 16][nk][16 or 8] */
    int64_t nkb;
    atomic_int failed;
} nk_sdpa_ctx;

static const char *nk_at(const nk_tensor *t, size_t es, int64_t i0, int64_t i1, int64_t i2) {
    return (const char *)t->data + (i0 * t->strides[0] + i1 * t->strides[1] + i2 * t->strides[2]) * (int64_t)es;
}

/* dst[0..n) = row as fp32, dst[n..np) = 0. */
static void nk_load_row(const nk_sdpa_ctx *c, float *dst, const char *src, int64_t stride, int64_t n, int64_t np) {
    if (n > 0) c->to_f32(dst, 1, src, stride, n);
    for (int64_t j = n; j < np; j++) dst[j] = 0.f;
}

/* Scores of row (b, h, qi) over keys k0 .. k0+nk: adds the mask, applies causality and -inf padding
 * up to nkp. tmp holds nk floats. */
static void nk_mask_row(const nk_sdpa_ctx *c, float *s, float *tmp, int64_t b, int64_t h, int64_t qi, int64_t k0,
                        int64_t nk, int64_t nkp) {
    const nk_sdpa_args *a = c->a;
    if (a->mask != NULL && nk > 0) {
        const nk_tensor *m = a->mask;
        const size_t mes = nk_dtype_size(m->dtype);
        const char *src = (const char *)m->data +
                          (b * m->strides[0] + h * m->strides[1] + qi * m->strides[2] + k0 * m->strides[3]) *
                              (int64_t)mes;
        c->mask_f32(tmp, 1, src, m->strides[3], nk);
        if (c->mask_bool) {
            for (int64_t j = 0; j < nk; j++) s[j] = tmp[j] != 0.f ? s[j] : -INFINITY;
        } else {
            for (int64_t j = 0; j < nk; j++) s[j] += tmp[j];
        }
    }
    if (a->causal) {
        int64_t first = qi + 1 - k0; /* first masked column: key index > qi */
        if (first < 0) first = 0;
        for (int64_t j = first; j < nk; j++) s[j] = -INFINITY;
    }
    for (int64_t j = nk; j < nkp; j++) s[j] = -INFINITY;
}

/* z[j] = dropout factor (0 or 1/(1-p)) of element (b, h, qi, k0 + j) for j < n. */
static void nk_dropout_row(const nk_sdpa_ctx *c, float *z, int64_t b, int64_t h, int64_t qi, int64_t k0, int64_t n) {
    const nk_sdpa_args *a = c->a;
    const uint32_t key[2] = {(uint32_t)a->seed, (uint32_t)(a->seed >> 32)};
    const uint64_t w0 = a->offset + (uint64_t)(((b * c->Hq + h) * c->Lq + qi) * c->Lk + k0);
    uint64_t block = UINT64_MAX;
    uint32_t words[4] = {0, 0, 0, 0};
    for (int64_t j = 0; j < n; j++) {
        const uint64_t w = w0 + (uint64_t)j;
        if (w / 4 != block) {
            block = w / 4;
            const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0, 0};
            nk_philox4x32_10(ctr, key, words);
        }
        const double u = (double)words[w % 4] * 0x1.0p-32;
        z[j] = u < c->keep ? c->keep_scale : 0.f;
    }
}

/* Per 32-element chunk, even elements then odd ones (the lane order of the bf16 products), and back;
 * n a multiple of 32; the copy goes through tmp (n floats). */
static void nk_deinterleave32(float *x, float *tmp, int64_t n) {
    for (int64_t c = 0; c < n; c += 32)
        for (int64_t i = 0; i < 16; i++) {
            tmp[c + i] = x[c + 2 * i];
            tmp[c + 16 + i] = x[c + 2 * i + 1];
        }
    memcpy(x, tmp, sizeof(float) * (size_t)n);
}

static void nk_interleave32(float *dst, const float *src, int64_t n) {
    for (int64_t c = 0; c < n; c += 32)
        for (int64_t i = 0; i < 16; i++) {
            dst[c + 2 * i] = src[c + i];
            dst[c + 2 * i + 1] = src[c + 16 + i];
        }
}

/*
 * Per-thread scratch for the forward, reused across calls: a decode step runs attention over a dozen
 * heads in a few microseconds, where allocating its seven buffers per call cost as much again.
 * nk_attn_carve points *bufs[i] at sizes[i] floats (64-byte aligned) of it; false without memory.
 */
static _Thread_local struct {
    float *p;
    size_t cap;
} t_attn_scratch;

static bool nk_attn_carve(float **const bufs[], const size_t sizes[], int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (sizes[i] + 15) & ~(size_t)15;
    if (total > t_attn_scratch.cap) {
        free(t_attn_scratch.p);
        t_attn_scratch.p = (float *)aligned_alloc(64, total * sizeof(float));
        t_attn_scratch.cap = t_attn_scratch.p != NULL ? total : 0;
        if (t_attn_scratch.p == NULL) return false;
    }
    float *p = t_attn_scratch.p;
    for (int i = 0; i < n; i++) {
        *bufs[i] = p;
        p += (sizes[i] + 15) & ~(size_t)15;
    }
    return true;
}

static float *nk_attn_alloc(size_t floats) {
    size_t bytes = (floats < 16 ? 16 : floats) * sizeof(float);
    bytes = (bytes + 63) & ~(size_t)63;
    return (float *)aligned_alloc(64, bytes);
}

/* Output row qi of head (b, h): o (fp32, normalised here by the softmax sum l) stored in the output's
 * dtype, and the log-sum-exp m + log(l) (-inf for a row that attended nothing). */
static void nk_sdpa_store_row(const nk_sdpa_ctx *c, int64_t b, int64_t h, int64_t qi, float *o, float m, float l) {
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const nk_tensor *out = c->out, *lse = c->lse;
    if (out->dtype == NK_F32 && out->strides[3] == 1) { /* one pass straight into the output */
        float *dst = (float *)nk_at(out, c->es, b, h, qi);
        for (int64_t d = 0; d < c->Dv; d++) dst[d] = o[d] * inv;
    } else {
        for (int64_t d = 0; d < c->Dv; d++) o[d] *= inv;
        if (c->Dv > 0) c->from_f32((char *)nk_at(out, c->es, b, h, qi), out->strides[3], o, 1, c->Dv);
    }
    float *lp = (float *)lse->data + b * lse->strides[0] + h * lse->strides[1] + qi * lse->strides[2];
    *lp = l > 0.f ? m + logf(l) : -INFINITY;
}

/* ---- forward ---------------------------------------------------------------------------------- */

/* Key block kb of head (b, hk), transposed to [Dp][nkp] (nkp = nk rounded to 16, zero-padded) for the score
 * GEMM, which broadcasts Q and streams K rows. Done once per call for all query blocks (each used to
 * transpose every key block again: 16 times over for 1024 queries) and in 16 x 16 tiles: a row-at-a-time
 * transpose wrote each key's D values to D different cache lines, 41% of a D = 512 attention. */
static float *nk_sdpa_kt_block(const nk_sdpa_ctx *c, int64_t b, int64_t hk, int64_t kb) {
    return c->kt + ((b * c->Hkv + hk) * c->nkb + kb) * c->Dp * c->bk;
}

static void nk_sdpa_kt_range(void *ctx, int64_t begin, int64_t end) {
    nk_sdpa_ctx *c = (nk_sdpa_ctx *)ctx;
    const nk_tensor *k = c->a->k;
    const int64_t D = c->D, Dp = c->Dp;
    const bool direct = c->simd->gemm_pk != NULL && c->simd->transpose16 != NULL && k->dtype == NK_F32 &&
                        k->strides[3] == 1 && D == Dp;
    float *rows;
    float **const bufs[] = {&rows};
    const size_t sizes[] = {(size_t)(16 * Dp)};
    if (!nk_attn_carve(bufs, sizes, 1)) {
        atomic_store(&c->failed, 1);
        return;
    }
    for (int64_t t = begin; t < end; t++) {
        const int64_t b = t / (c->Hkv * c->nkb), hk = (t / c->nkb) % c->Hkv, kb = t % c->nkb;
        const int64_t k0 = kb * c->bk;
        const int64_t nk = c->Lk - k0 < c->bk ? c->Lk - k0 : c->bk, nkp = nk_round16(nk);
        float *dst = nk_sdpa_kt_block(c, b, hk, kb);
        for (int64_t j0 = 0; j0 < nkp; j0 += 16) {
            const int64_t nj = nk - j0 < 16 ? (nk - j0 > 0 ? nk - j0 : 0) : 16;
            /* The 16 rows: K's own when they are whole fp32 rows of whole vectors, else widened and padded
             * into rows (Dp long, a multiple of 16). */
            const float *src = rows;
            int64_t lds = Dp;
            if (direct && nj == 16) {
                src = (const float *)nk_at(k, c->es, b, hk, k0 + j0);
                lds = k->strides[2];
            } else {
                for (int64_t j = 0; j < 16; j++) {
                    if (j < nj) nk_load_row(c, rows + j * Dp, nk_at(k, c->es, b, hk, k0 + j0 + j), k->strides[3], D, Dp);
                    else memset(rows + j * Dp, 0, sizeof(float) * (size_t)Dp);
                }
            }
            if (c->simd->gemm_pk != NULL) { /* the strip of these 16 keys: [D][16] */
                if (c->simd->transpose16 != NULL) {
                    for (int64_t d0 = 0; d0 < D; d0 += 16)
                        c->simd->transpose16(dst + j0 * D + d0 * 16, 16, src + d0, lds, D - d0 < 16 ? D - d0 : 16);
                    continue;
                }
                for (int64_t d = 0; d < D; d++) {
                    float *o = dst + j0 * D + d * 16;
                    for (int64_t j = 0; j < 16; j++) o[j] = rows[j * Dp + d];
                }
                continue;
            }
            for (int64_t d0 = 0; d0 < Dp; d0 += 16)
                for (int64_t d = d0; d < d0 + 16; d++) {
                    float *o = dst + d * nkp + j0;
                    for (int64_t j = 0; j < 16; j++) o[j] = rows[j * Dp + d];
                }
        }
    }
}

/*
 * The forward's per-call copies of K and V (megabytes: K^T and packed V of every head), one of each kept
 * across calls (up to 64 MiB each): glibc maps and unmaps allocations that large on every call, and
 * faulting the fresh zero pages in was 4% of a 1k-token head-dim-512 attention. get takes the kept buffer
 * if it is large enough (else a new one; *cap its size); put keeps the buffer if the slot is empty.
 */
#define NK_ATTN_KEEP_FLOATS ((size_t)16 << 20)
static struct {
    float *p;
    size_t cap;
} g_attn_big[2];
static atomic_flag g_attn_big_lock = ATOMIC_FLAG_INIT;

static float *nk_attn_big_get(int slot, size_t floats, size_t *cap) {
    while (atomic_flag_test_and_set_explicit(&g_attn_big_lock, memory_order_acquire)) {
    }
    float *p = g_attn_big[slot].p;
    size_t have = g_attn_big[slot].cap;
    g_attn_big[slot].p = NULL;
    g_attn_big[slot].cap = 0;
    atomic_flag_clear_explicit(&g_attn_big_lock, memory_order_release);
    if (p != NULL && have >= floats) {
        *cap = have;
        return p;
    }
    free(p);
    p = nk_attn_alloc(floats);
    *cap = p != NULL ? floats : 0;
    return p;
}

static void nk_attn_big_put(int slot, float *p, size_t cap) {
    if (p == NULL) return;
    if (cap <= NK_ATTN_KEEP_FLOATS) {
        while (atomic_flag_test_and_set_explicit(&g_attn_big_lock, memory_order_acquire)) {
        }
        const bool kept = g_attn_big[slot].p == NULL;
        if (kept) {
            g_attn_big[slot].p = p;
            g_attn_big[slot].cap = cap;
        }
        atomic_flag_clear_explicit(&g_attn_big_lock, memory_order_release);
        if (kept) return;
    }
    free(p);
}

/* Value block kb of head (b, hk) in gemm_pk's strips (Dvn columns; the block's nk keys are the
 * contraction), once per call like the transposed keys. */
static float *nk_sdpa_vp_block(const nk_sdpa_ctx *c, int64_t b, int64_t hk, int64_t kb) {
    return c->vp + ((b * c->Hkv + hk) * c->nkb + kb) * c->Dvn * c->bk;
}

static void nk_sdpa_vp_range(void *ctx, int64_t begin, int64_t end) {
    nk_sdpa_ctx *c = (nk_sdpa_ctx *)ctx;
    if (c->vp == NULL) return;
    const nk_tensor *v = c->a->v;
    const int64_t Dv = c->Dv, Dvn = c->Dvn;
    const bool direct = v->dtype == NK_F32 && v->strides[3] == 1 && Dv == Dvn;
    float *row;
    float **const bufs[] = {&row};
    const size_t sizes[] = {(size_t)Dvn};
    if (!nk_attn_carve(bufs, sizes, 1)) {
        atomic_store(&c->failed, 1);
        return;
    }
    for (int64_t t = begin; t < end; t++) {
        const int64_t b = t / (c->Hkv * c->nkb), hk = (t / c->nkb) % c->Hkv, kb = t % c->nkb;
        const int64_t k0 = kb * c->bk;
        const int64_t nk = c->Lk - k0 < c->bk ? c->Lk - k0 : c->bk;
        float *dst = nk_sdpa_vp_block(c, b, hk, kb);
        for (int64_t j = 0; j < nk; j++) {
            const char *src = nk_at(v, c->es, b, hk, k0 + j);
            const float *r = row;
            /* fp32 rows with no padding are read in place (a staging copy per key was 3% of a D = 80 call) */
            if (direct) r = (const float *)src;
            else nk_load_row(c, row, src, v->strides[3], Dv, Dvn);
            int64_t d0 = 0;
            for (; d0 + 16 <= Dvn; d0 += 16) memcpy(dst + d0 * nk + j * 16, r + d0, sizeof(float) * 16);
            if (d0 < Dvn) memcpy(dst + d0 * nk + j * 8, r + d0, sizeof(float) * 8);
        }
    }
}

/* Both per-call copies in one parallel pass (one barrier). */
static void nk_sdpa_pack_range(void *ctx, int64_t begin, int64_t end) {
    nk_sdpa_kt_range(ctx, begin, end);
    nk_sdpa_vp_range(ctx, begin, end);
}

static void nk_sdpa_fwd_range(void *ctx, int64_t begin, int64_t end) {
    nk_sdpa_ctx *c = (nk_sdpa_ctx *)ctx;
    const nk_sdpa_args *a = c->a;
    const nk_attn_simd *simd = c->simd;
    const int64_t Dp = c->Dp, Dvp = c->Dvp, Dvn = c->Dvn, BQ = NK_ATTN_BQ, BK = c->bk;
    float *Q, *O, *S, *Kp, *V, *tmp, *row; /* Kp: K rows, or K transposed [Dp, nkp] */
    float **const bufs[] = {&Q, &O, &S, &Kp, &V, &tmp, &row};
    const size_t sizes[] = {(size_t)(BQ * Dp), (size_t)(BQ * Dvp), (size_t)(BQ * BK), (size_t)(BK * Dp),
                            (size_t)(BK * Dvp), (size_t)(2 * BK + 5 * BQ), (size_t)(Dp > Dvp ? Dp : Dvp)};
    if (!nk_attn_carve(bufs, sizes, 7)) {
        atomic_store(&c->failed, 1);
        return;
    }
    float *z = tmp + BK, *mrow = tmp + 2 * BK, *lrow = mrow + BQ, *mnew = lrow + BQ, *alpha = mnew + BQ;
    float *sum = alpha + BQ;
    for (int64_t i = 0; i < BQ; i++) mrow[i] = mnew[i] = 0.f; /* rows past mq: finite, unused */
    const nk_tensor *q = a->q, *k = a->k, *v = a->v;
    /* Rows that are contiguous and a whole number of vectors are read in place: fp32 ones always, bf16
     * ones where the ISA widens them in registers. */
    const bool direct_k = q->dtype == NK_F32 && k->strides[3] == 1 && c->D == Dp;
    const bool direct_v = q->dtype == NK_F32 && v->strides[3] == 1 && c->Dv == Dvn;
    const bool direct_kb = q->dtype == NK_BF16 && simd->gemv_dots_bf16 != NULL && k->strides[3] == 1 && c->D % 32 == 0;
    const bool direct_vb = q->dtype == NK_BF16 && simd->gemm_acc_bf16 != NULL && v->strides[3] == 1 && c->Dv % 32 == 0;
    for (int64_t t = begin; t < end; t++) {
        const int64_t b = t / (c->Hq * c->nqb), h = (t / c->nqb) % c->Hq, q0 = (t % c->nqb) * BQ;
        const int64_t hk = h / c->group;
        const int64_t mq = c->Lq - q0 < BQ ? c->Lq - q0 : BQ;
        const float scale = (float)a->scale;
        for (int64_t i = 0; i < mq; i++) {
            float *qr = Q + i * Dp;
            const char *src = nk_at(q, c->es, b, h, q0 + i);
            if (q->dtype == NK_F32 && q->strides[3] == 1) { /* one pass, no staging copy */
                for (int64_t d = 0; d < c->D; d++) qr[d] = ((const float *)src)[d] * scale;
                for (int64_t d = c->D; d < Dp; d++) qr[d] = 0.f;
            } else {
                nk_load_row(c, qr, src, q->strides[3], c->D, Dp);
                for (int64_t d = 0; d < c->D; d++) qr[d] *= scale;
            }
            if (direct_kb && mq < 4) nk_deinterleave32(qr, row, c->D); /* for gemv_dots_bf16 */
            mrow[i] = -INFINITY;
            lrow[i] = 0.f;
        }
        memset(O, 0, sizeof(float) * (size_t)(mq * Dvp));
        const int64_t kend = a->causal ? (c->Lk < q0 + mq ? c->Lk : q0 + mq) : c->Lk;
        for (int64_t k0 = 0; k0 < kend; k0 += BK) {
            const int64_t nk = kend - k0 < BK ? kend - k0 : BK, nkp = nk_round16(nk);
            const float *Kd = direct_k ? (const float *)k->data + b * k->strides[0] + hk * k->strides[1] +
                                             k0 * k->strides[2]
                                       : NULL;
            const float *Vd = direct_v ? (const float *)v->data + b * v->strides[0] + hk * v->strides[1] +
                                             k0 * v->strides[2]
                                       : NULL;
            const uint16_t *Kb = direct_kb ? (const uint16_t *)k->data + b * k->strides[0] + hk * k->strides[1] +
                                                 k0 * k->strides[2]
                                           : NULL;
            const uint16_t *Vb = direct_vb ? (const uint16_t *)v->data + b * v->strides[0] + hk * v->strides[1] +
                                                 k0 * v->strides[2]
                                           : NULL;
            if (mq >= 4 && c->kt != NULL && simd->gemm_pk != NULL) {
                simd->gemm_pk(mq, nkp, c->D, Q, Dp, nk_sdpa_kt_block(c, b, hk, k0 / BK), c->D, S, nkp, true);
            } else if (mq >= 4 && c->kt != NULL) {
                memset(S, 0, sizeof(float) * (size_t)(mq * nkp));
                /* The stored block spans all its keys (causality may use fewer): its own row stride. */
                const int64_t ldk = nk_round16(c->Lk - k0 < BK ? c->Lk - k0 : BK);
                /* Contracted over the D real dims only: the padding rows of the block are zeros. */
                simd->gemm_acc(mq, nkp, c->D, Q, Dp, nk_sdpa_kt_block(c, b, hk, k0 / BK), ldk, S, nkp);
            } else if (mq >= 4) {
                /* Without memory for the shared transpose: K into [Dp, nkp] here. */
                for (int64_t j = 0; j < nk; j++) {
                    const float *kr = tmp;
                    if (Kd != NULL) {
                        kr = Kd + j * k->strides[2];
                    } else {
                        nk_load_row(c, tmp, nk_at(k, c->es, b, hk, k0 + j), k->strides[3], c->D, c->D);
                    }
                    for (int64_t d = 0; d < c->D; d++) Kp[d * nkp + j] = kr[d];
                }
                for (int64_t d = 0; d < Dp; d++)
                    for (int64_t j = (d < c->D ? nk : 0); j < nkp; j++) Kp[d * nkp + j] = 0.f;
                memset(S, 0, sizeof(float) * (size_t)(mq * nkp));
                simd->gemm_acc(mq, nkp, c->D, Q, Dp, Kp, nkp, S, nkp);
            } else if (Kd != NULL) {
                /* Few query rows (decode): dot products straight from the key rows. */
                for (int64_t i = 0; i < mq; i++) simd->gemv_dots(nk, Dp, Q + i * Dp, Kd, k->strides[2], S + i * nkp);
            } else if (Kb != NULL) {
                for (int64_t i = 0; i < mq; i++)
                    simd->gemv_dots_bf16(nk, Dp, Q + i * Dp, Kb, k->strides[2], S + i * nkp);
            } else {
                for (int64_t j = 0; j < nk; j++)
                    nk_load_row(c, Kp + j * Dp, nk_at(k, c->es, b, hk, k0 + j), k->strides[3], c->D, Dp);
                for (int64_t i = 0; i < mq; i++) simd->gemv_dots(nk, Dp, Q + i * Dp, Kp, Dp, S + i * nkp);
            }
            if (Vd == NULL && Vb == NULL && (c->vp == NULL || mq < 4))
                for (int64_t j = 0; j < nk; j++)
                    nk_load_row(c, V + j * Dvp, nk_at(v, c->es, b, hk, k0 + j), v->strides[3], c->Dv, Dvn);
            /* Online softmax in three sweeps, as the AMX path: new row maxima, the rescale factors of all
             * rows in one vector call (a scalar expf per row and block was 2% of a D = 40 attention),
             * the exponentials and sums of all rows in one call. */
            for (int64_t i = 0; i < mq; i++) {
                float *s = S + i * nkp;
                nk_mask_row(c, s, tmp, b, h, q0 + i, k0, nk, nkp);
                const float mx = simd->row_max(s, nkp);
                /* A NaN maximum is kept, so the row comes out NaN as PyTorch's does: taking the old maximum
                 * (-inf in the first block) skipped the block as if nothing were attended, zeros. */
                mnew[i] = mx > mrow[i] || mx != mx ? mx : mrow[i];
            }
            simd->vec_exp_diff(mrow, mnew, alpha, nk_round16(mq));
            simd->rows_exp_sum(S, nkp, mq, nkp, mnew, sum); /* rows with nothing to attend: zeros */
            for (int64_t i = 0; i < mq; i++) {
                float *s = S + i * nkp;
                if (mnew[i] == -INFINITY) continue;
                const float al = mrow[i] == -INFINITY ? 0.f : alpha[i];
                lrow[i] = lrow[i] * al + sum[i];
                mrow[i] = mnew[i];
                if (al != 1.f) {
                    float *o = O + i * Dvp;
                    for (int64_t d = 0; d < Dvn; d++) o[d] *= al;
                }
                if (a->dropout_p > 0.0) {
                    nk_dropout_row(c, z, b, h, q0 + i, k0, nk);
                    for (int64_t j = 0; j < nk; j++) s[j] *= z[j];
                }
            }
            /* Only the nk real keys: columns past them hold zero probabilities and may lie past the
             * end of v. */
            if (c->vp != NULL && mq >= 4) {
                /* The stored block spans all its keys (causality may use fewer): strips that far apart. */
                const int64_t nks = c->Lk - k0 < BK ? c->Lk - k0 : BK;
                simd->gemm_pk(mq, Dvn, nk, S, nkp, nk_sdpa_vp_block(c, b, hk, k0 / BK), nks, O, Dvp, false);
            } else if (Vd != NULL) {
                simd->gemm_acc(mq, Dvn, nk, S, nkp, Vd, v->strides[2], O, Dvp);
            } else if (Vb != NULL) {
                simd->gemm_acc_bf16(mq, Dvp, nk, S, nkp, Vb, v->strides[2], O, Dvp);
            } else {
                simd->gemm_acc(mq, Dvn, nk, S, nkp, V, Dvp, O, Dvp);
            }
        }
        /* gemm_acc_bf16 (not the packed V strips) left the rows deinterleaved */
        const bool deinterleaved = direct_vb && !(c->vp != NULL && mq >= 4);
        for (int64_t i = 0; i < mq; i++) {
            float *o = O + i * Dvp;
            if (deinterleaved) {
                nk_interleave32(row, o, c->Dv);
                o = row;
            }
            nk_sdpa_store_row(c, b, h, q0 + i, o, mrow[i], lrow[i]);
        }
    }
}

/*
 * bf16 forward on AMX tiles or, on CPUs without AMX, AVX512-BF16 dot products (c->dp), as PyTorch's CPU
 * attention computes it: S = Q K^T from the bf16 inputs with fp32 accumulation, scaled, masked and
 * exponentiated in fp32; the probabilities are rounded to bf16 for the product with V, accumulated in
 * fp32. K and V blocks are packed into the instructions' pair order per block (a few shuffles per 16x16
 * words); everything else matches the fp32 path above. Both instructions read bf16 pairs and accumulate
 * in fp32, so the two differ only in summation order. On the dot products the fp32 path (bf16 rows
 * widened to fp32 FMAs) ran at half their rate: 0.90-1.05x PyTorch CPU, which uses them through oneDNN.
 */
static int64_t nk_round32(int64_t x) {
    return (x + 31) & ~(int64_t)31;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/*
 * The AMX path's exponentials, sums and bf16 probabilities in one pass: for rows r < rows of S (row
 * stride ld, n columns, a multiple of 32), P[r][j] = bf16(exp(S[r][j] * rs[r] - m[r])) (rounded to
 * nearest even) for j < lim[r] (a multiple of 32; columns past it are masked: zeros) and sum[r] = the
 * sum of the fp32 exponentials; a row whose m[r] is -inf becomes zeros.
 * rs[r] is the softmax scale for a row not scaled yet (its maximum pass only read it) and 1 for one
 * already scaled; the product is rounded before the subtraction, as a separate scaling pass rounds it.
 * Separate passes (scale, exp, bf16) wrote S twice more and read it twice more: 2/3 of the time of a
 * bf16 2k-token attention went to them.
 */
__attribute__((target("avx512f,avx512bw,avx512bf16"), optimize("fp-contract=fast"))) static void
nk_rows_exp_sum_to_bf16(const float *S, int64_t ld, int64_t rows, int64_t n, const float *m, const float *rs,
                        const int64_t *lim, float *sum, uint16_t *P, int64_t ldp) {
    for (int64_t r = 0; r < rows; r++) {
        const float *s = S + r * ld;
        uint16_t *p = P + r * ldp;
        if (m[r] == -INFINITY) {
            memset(p, 0, sizeof(uint16_t) * (size_t)n);
            sum[r] = 0.f;
            continue;
        }
        memset(p + lim[r], 0, sizeof(uint16_t) * (size_t)(n - lim[r]));
        const nk_v16f mv = nk_vsplat_avx512(m[r]), sc = nk_vsplat_avx512(rs[r]);
        nk_v16f acc = nk_vsplat_avx512(0.f);
        for (int64_t j = 0; j < lim[r]; j += 32) {
            nk_v16f t0 = NK_VLOAD(s + j) * sc, t1 = NK_VLOAD(s + j + 16) * sc;
            __asm__("" : "+v"(t0), "+v"(t1)); /* no fused multiply-subtract: the scaled score is rounded */
            const nk_v16f e0 = nk_vexp_avx512(t0 - mv), e1 = nk_vexp_avx512(t1 - mv);
            acc += e0;
            acc += e1;
            _mm512_storeu_si512((void *)(p + j), (__m512i)_mm512_cvtne2ps_pbh((__m512)e1, (__m512)e0));
        }
        sum[r] = nk_vhsum_avx512(acc);
    }
}
#endif

static void nk_sdpa_fwd_tiles_range(void *ctx, int64_t begin, int64_t end) {
    nk_sdpa_ctx *c = (nk_sdpa_ctx *)ctx;
    const nk_sdpa_args *a = c->a;
    const nk_attn_simd *simd = c->simd;
    const int64_t BQ = NK_ATTN_BQ, BK = NK_ATTN_AMX_BK;
    const int64_t Dk = nk_round32(c->D), Dv32 = nk_round32(c->Dv);
    float *Qf, *Kf, *Vf, *Pf, *Nf, *S, *O, *tmp;
    /* Packed K and V blocks of the current (batch, key head), kept while consecutive tasks (the query
     * blocks of a head, the heads of a group) reuse them; packed_nk[kb]: keys packed in block kb, 0 none. */
    const int64_t nkb = (c->Lk + BK - 1) / BK;
    float **const bufs[] = {&Qf, &Kf, &Vf, &Pf, &Nf, &S, &O, &tmp};
    const size_t sizes[] = {(size_t)(BQ * Dk / 2), (size_t)(nkb * BK * Dk / 2), (size_t)(nkb * Dv32 * BK / 2),
                            (size_t)(BQ * BK / 2), (size_t)(2 * nkb), (size_t)(BQ * BK), (size_t)(BQ * Dv32),
                            (size_t)(2 * BK + 8 * BQ)};
    const bool dp = c->dp;
    if (!nk_attn_carve(bufs, sizes, 8) || (!dp && !nk_amx_session_begin())) {
        atomic_store(&c->failed, 1);
        return;
    }
    uint16_t *Qa = (uint16_t *)Qf, *Kc = (uint16_t *)Kf, *Vc = (uint16_t *)Vf, *Pa = (uint16_t *)Pf;
    int64_t *packed_nk = (int64_t *)Nf;
    int64_t packed_b = -1, packed_hk = -1;
    float *z = tmp + BK, *mrow = tmp + 2 * BK, *lrow = mrow + BQ, *mnew = lrow + BQ, *alpha = mnew + BQ;
    float *sum = alpha + BQ, *rs = sum + BQ;
    int64_t *lim = (int64_t *)(rs + BQ);
    const nk_tensor *q = a->q, *k = a->k, *v = a->v;
    const float scale = (float)a->scale;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    /* One pass from scores to bf16 probabilities (every AMX CPU has AVX512-BF16); dropout scales the
     * fp32 probabilities between the two, and a scale that is not positive would not commute with the
     * maximum. */
    const bool fused = a->dropout_p <= 0.0 && scale > 0.f;
#else
    const bool fused = false;
#endif
    for (int64_t t = begin; t < end; t++) {
        const int64_t b = t / (c->Hq * c->nqb), h = (t / c->nqb) % c->Hq, q0 = (t % c->nqb) * BQ;
        const int64_t hk = h / c->group;
        const int64_t mq = c->Lq - q0 < BQ ? c->Lq - q0 : BQ, mp = nk_round32(mq);
        memset(Qa, 0, sizeof(uint16_t) * (size_t)(mp * Dk));
        memset(Pa, 0, sizeof(uint16_t) * (size_t)(mp * BK)); /* rows past mq stay zero */
        for (int64_t i = 0; i < BQ; i++) mrow[i] = mnew[i] = 0.f; /* rows past mq: finite, unused */
        for (int64_t i = 0; i < mq; i++) {
            const uint16_t *src = (const uint16_t *)nk_at(q, 2, b, h, q0 + i);
            if (q->strides[3] == 1) {
                memcpy(Qa + i * Dk, src, sizeof(uint16_t) * (size_t)c->D);
            } else {
                for (int64_t d = 0; d < c->D; d++) Qa[i * Dk + d] = src[d * q->strides[3]];
            }
            mrow[i] = -INFINITY;
            lrow[i] = 0.f;
        }
        memset(O, 0, sizeof(float) * (size_t)(mp * Dv32));
        const int64_t kend = a->causal ? (c->Lk < q0 + mq ? c->Lk : q0 + mq) : c->Lk;
        const uint16_t *kb = (const uint16_t *)k->data + b * k->strides[0] + hk * k->strides[1];
        const uint16_t *vb = (const uint16_t *)v->data + b * v->strides[0] + hk * v->strides[1];
        if (b != packed_b || hk != packed_hk) {
            memset(packed_nk, 0, sizeof(int64_t) * (size_t)nkb);
            packed_b = b;
            packed_hk = hk;
        }
        for (int64_t k0 = 0; k0 < kend; k0 += BK) {
            const int64_t nk = kend - k0 < BK ? kend - k0 : BK, nkp = nk_round32(nk);
            uint16_t *Kp = Kc + (k0 / BK) * BK * Dk, *Vp = Vc + (k0 / BK) * Dv32 * BK;
            if (packed_nk[k0 / BK] != nk) {
                const uint16_t *ks = kb + k0 * k->strides[2], *vs = vb + k0 * v->strides[2];
                if (dp) {
                    nk_dp_pack_b((uint32_t *)Kp, ks, k->strides[3], k->strides[2], c->D, nk, Dk);
                    nk_dp_pack_b((uint32_t *)Vp, vs, v->strides[2], v->strides[3], nk, c->Dv, nkp);
                } else {
                    nk_amx_pack_b(Kp, ks, k->strides[3], k->strides[2], c->D, nk, Dk);
                    nk_amx_pack_b(Vp, vs, v->strides[2], v->strides[3], nk, c->Dv, nkp);
                }
                packed_nk[k0 / BK] = nk;
            }
            /* The dot products need only the block's rows (to a multiple of 4), the tiles 32 of them. */
            if (dp) nk_dp_matmul(mq, nkp, Dk, Qa, Dk, (const uint32_t *)Kp, S, BK, false);
            else nk_amx_matmul(mp, nkp, Dk, Qa, Dk, Kp, S, BK, false);
            /* Online softmax over the block in three sweeps: new row maxima, then the exponentials of
             * all rows in one call, then the running sums, rescaled outputs and bf16 probabilities. */
            for (int64_t i = 0; i < mq; i++) {
                float *s = S + i * BK;
                const bool masked = a->mask != NULL || nk < nkp || (a->causal && k0 + nk > q0 + i + 1);
                float mx;
                lim[i] = nkp;
                if (fused && !masked) {
                    /* Rounding is monotonic: the largest scaled score is the scaled largest score. */
                    mx = simd->row_max(s, nkp) * scale;
                    rs[i] = scale;
                } else if (fused && a->mask == NULL) {
                    /* Causal (or past the last key) only: the row's keys end at nv. Its maximum and
                     * exponentials cover whole vectors up to there, the rest of the block is zeros. */
                    int64_t nv = a->causal ? q0 + i + 1 - k0 : nk;
                    nv = nv < 0 ? 0 : (nv > nk ? nk : nv);
                    lim[i] = nk_round32(nv);
                    for (int64_t j = nv; j < lim[i]; j++) s[j] = -INFINITY;
                    mx = nv > 0 ? simd->row_max(s, nk_round16(nv)) * scale : -INFINITY;
                    rs[i] = scale;
                } else {
                    mx = simd->row_scale_max(s, nkp, scale);
                    rs[i] = 1.f;
                    if (masked) {
                        nk_mask_row(c, s, tmp, b, h, q0 + i, k0, nk, nkp);
                        mx = simd->row_max(s, nkp);
                    }
                }
                mnew[i] = mx > mrow[i] ? mx : mrow[i];
            }
            simd->vec_exp_diff(mrow, mnew, alpha, nk_round16(mq));
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
            if (fused)
                nk_rows_exp_sum_to_bf16(S, BK, mq, nkp, mnew, rs, lim, sum, Pa, BK);
            else
#endif
                simd->rows_exp_sum(S, BK, mq, nkp, mnew, sum);
            for (int64_t i = 0; i < mq; i++) {
                float *s = S + i * BK;
                uint16_t *p = Pa + i * BK;
                if (mnew[i] == -INFINITY) {
                    memset(p, 0, sizeof(uint16_t) * (size_t)nkp);
                    continue;
                }
                const float al = mrow[i] == -INFINITY ? 0.f : alpha[i];
                lrow[i] = lrow[i] * al + sum[i];
                mrow[i] = mnew[i];
                if (al != 1.f) {
                    float *o = O + i * Dv32;
                    for (int64_t d = 0; d < Dv32; d++) o[d] *= al;
                }
                if (a->dropout_p > 0.0) {
                    nk_dropout_row(c, z, b, h, q0 + i, k0, nk);
                    for (int64_t j = 0; j < nk; j++) s[j] *= z[j];
                }
                if (!fused) nk_amx_row_to_bf16(s, nkp, p);
            }
            if (dp) nk_dp_matmul(mq, Dv32, nkp, Pa, BK, (const uint32_t *)Vp, O, Dv32, true);
            else nk_amx_matmul(mp, Dv32, nkp, Pa, BK, Vp, O, Dv32, true);
        }
        for (int64_t i = 0; i < mq; i++) nk_sdpa_store_row(c, b, h, q0 + i, O + i * Dv32, mrow[i], lrow[i]);
    }
    if (!dp) nk_amx_session_end();
}

static bool nk_is4d(const nk_tensor *t) {
    int64_t n;
    return t != NULL && nk_tensor_check(t, &n) == NK_SUCCESS && t->ndim == 4;
}

/* Validates shapes and fills the shared part of the context. */
static nk_status nk_sdpa_setup(nk_sdpa_ctx *c, const nk_sdpa_args *a, const nk_tensor *out, const nk_tensor *lse) {
    memset(c, 0, sizeof *c);
    if (a == NULL || !nk_is4d(a->q) || !nk_is4d(a->k) || !nk_is4d(a->v) || !nk_is4d(out)) return NK_INVALID;
    int64_t n;
    if (lse == NULL || nk_tensor_check(lse, &n) != NK_SUCCESS || lse->ndim != 3) return NK_INVALID;
    const nk_tensor *q = a->q, *k = a->k, *v = a->v;
    if (!nk_attn_float_dtype(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype || out->dtype != q->dtype)
        return NK_UNSUPPORTED;
    if (lse->dtype != NK_F32) return NK_UNSUPPORTED;
    c->a = a;
    c->B = q->sizes[0];
    c->Hq = q->sizes[1];
    c->Lq = q->sizes[2];
    c->D = q->sizes[3];
    c->Hkv = k->sizes[1];
    c->Lk = k->sizes[2];
    c->Dv = v->sizes[3];
    if (k->sizes[0] != c->B || v->sizes[0] != c->B || v->sizes[1] != c->Hkv || v->sizes[2] != c->Lk ||
        k->sizes[3] != c->D)
        return NK_INVALID;
    if (c->Hkv == 0 ? c->Hq != 0 : c->Hq % c->Hkv != 0) return NK_INVALID;
    const int64_t osz[4] = {c->B, c->Hq, c->Lq, c->Dv};
    for (int d = 0; d < 4; d++)
        if (out->sizes[d] != osz[d]) return NK_INVALID;
    if (lse->sizes[0] != c->B || lse->sizes[1] != c->Hq || lse->sizes[2] != c->Lq) return NK_INVALID;
    if (a->mask != NULL) {
        if (!nk_is4d(a->mask)) return NK_INVALID;
        const int64_t msz[4] = {c->B, c->Hq, c->Lq, c->Lk};
        for (int d = 0; d < 4; d++)
            if (a->mask->sizes[d] != msz[d]) return NK_INVALID;
        const nk_dtype md = a->mask->dtype;
        if (md != NK_BOOL && md != NK_F32 && md != NK_BF16 && md != NK_F16 && md != NK_F64) return NK_UNSUPPORTED;
        c->mask_bool = md == NK_BOOL;
        c->mask_f32 = nk_cast_get(NK_F32, md);
    }
    if (!(a->dropout_p >= 0.0 && a->dropout_p <= 1.0)) return NK_INVALID;
    c->group = c->Hkv == 0 ? 1 : c->Hq / c->Hkv;
    c->Dp = nk_round16(c->D);
    c->Dvp = nk_round16(c->Dv);
    c->nqb = (c->Lq + NK_ATTN_BQ - 1) / NK_ATTN_BQ;
    c->es = nk_dtype_size(q->dtype);
    c->to_f32 = nk_cast_get(NK_F32, q->dtype);
    c->from_f32 = nk_cast_get(q->dtype, NK_F32);
    c->keep = 1.0 - a->dropout_p;
    c->keep_scale = c->keep > 0.0 ? (float)(1.0 / c->keep) : 0.f;
    c->simd = nk_attn_simd_get();
    c->Dvn = (c->Dv + c->simd->n_align - 1) / c->simd->n_align * c->simd->n_align;
    c->bk = c->simd->gemm_pk != NULL ? NK_ATTN_BK_PK : NK_ATTN_BK;
    c->out = out;
    c->lse = lse;
    atomic_init(&c->failed, 0);
    return NK_SUCCESS;
}

nk_status nk_sdpa_forward(const nk_sdpa_args *a, const nk_tensor *out, const nk_tensor *lse) {
    nk_sdpa_ctx c;
    nk_status st = nk_sdpa_setup(&c, a, out, lse);
    if (st != NK_SUCCESS) return st;
    const int64_t tasks = c.B * c.Hq * c.nqb;
    if (tasks == 0 || c.Dv + c.D < 0) return NK_SUCCESS;
    /* Tiles pay off from a few dozen query rows (prefill); decode rows stay on the vector path. */
    const bool tiles = a->q->dtype == NK_BF16 && c.Lq >= 16 && c.D > 0 && nk_gemm_dpbf16_available() &&
                       (nk_gemm_bf16_on_amx() || nk_gemm_bf16_packed_on_dp());
    c.dp = tiles && !nk_gemm_bf16_on_amx();
    size_t ktcap = 0, vpcap = 0;
    if (!tiles && c.Lq >= 4 && c.Lk > 0 && c.D > 0) {
        /* K transposed once for every query block; a copy of K in fp32 (padded), skipped past 1 GiB. */
        c.nkb = (c.Lk + c.bk - 1) / c.bk;
        const double bytes = (double)c.B * (double)c.Hkv * (double)c.nkb * (double)c.Dp * (double)c.bk * 4.0;
        if (bytes <= (double)(1u << 30)) c.kt = nk_attn_big_get(0, (size_t)(bytes / 4.0), &ktcap);
        const double vbytes = (double)c.B * (double)c.Hkv * (double)c.nkb * (double)c.Dvn * (double)c.bk * 4.0;
        if (c.kt != NULL && c.simd->gemm_pk != NULL && c.Dv > 0 && vbytes <= (double)(1u << 30))
            c.vp = nk_attn_big_get(1, (size_t)(vbytes / 4.0), &vpcap);
        if (c.kt != NULL) nk_parallel_for(c.B * c.Hkv * c.nkb, 1, nk_sdpa_pack_range, &c);
    }
    if (!atomic_load(&c.failed)) nk_parallel_for(tasks, 1, tiles ? nk_sdpa_fwd_tiles_range : nk_sdpa_fwd_range, &c);
    nk_attn_big_put(0, c.kt, ktcap);
    nk_attn_big_put(1, c.vp, vpcap);
    return atomic_load(&c.failed) ? NK_INVALID : NK_SUCCESS;
}

/* ---- backward --------------------------------------------------------------------------------- */

static void nk_sdpa_bwd_range(void *ctx, int64_t begin, int64_t end) {
    nk_sdpa_ctx *c = (nk_sdpa_ctx *)ctx;
    const nk_sdpa_args *a = c->a;
    const nk_attn_simd *simd = c->simd;
    const int64_t Dp = c->Dp, Dvp = c->Dvp, BQ = NK_ATTN_BQ, BK = NK_ATTN_BK, Lk = c->Lk;
    const float scale = (float)a->scale;
    float *dKacc = nk_attn_alloc((size_t)(Lk * Dp));
    float *dVacc = nk_attn_alloc((size_t)(Lk * Dvp));
    float *Qs = nk_attn_alloc((size_t)(BQ * Dp));
    float *dO = nk_attn_alloc((size_t)(BQ * Dvp));
    float *dQ = nk_attn_alloc((size_t)(BQ * Dp));
    float *S = nk_attn_alloc((size_t)(BQ * BK));
    float *dP = nk_attn_alloc((size_t)(BQ * BK));
    float *PT = nk_attn_alloc((size_t)(BK * BQ));
    float *dST = nk_attn_alloc((size_t)(BK * BQ));
    float *Kt = nk_attn_alloc((size_t)(Dp * BK));
    float *Kr = nk_attn_alloc((size_t)(BK * Dp));
    float *Vt = nk_attn_alloc((size_t)(Dvp * BK));
    const int64_t tmpn = 2 * BK + 2 * BQ + (Dvp > Dp ? Dvp : Dp);
    float *tmp = nk_attn_alloc((size_t)tmpn);
    if (!dKacc || !dVacc || !Qs || !dO || !dQ || !S || !dP || !PT || !dST || !Kt || !Kr || !Vt || !tmp) {
        atomic_store(&c->failed, 1);
        goto done;
    }
    float *z = tmp + BK, *Di = tmp + 2 * BK, *L = Di + BQ, *row = L + BQ;
    const nk_tensor *q = a->q, *k = a->k, *v = a->v, *go = c->grad_out, *out = c->out, *lse = c->lse;
    for (int64_t t = begin; t < end; t++) {
        const int64_t b = t / c->Hkv, hk = t % c->Hkv;
        memset(dKacc, 0, sizeof(float) * (size_t)(Lk * Dp));
        memset(dVacc, 0, sizeof(float) * (size_t)(Lk * Dvp));
        for (int64_t h = hk * c->group; h < (hk + 1) * c->group; h++) {
            for (int64_t q0 = 0; q0 < c->Lq; q0 += BQ) {
                const int64_t mq = c->Lq - q0 < BQ ? c->Lq - q0 : BQ;
                for (int64_t i = 0; i < mq; i++) {
                    float *qr = Qs + i * Dp;
                    nk_load_row(c, qr, nk_at(q, c->es, b, h, q0 + i), q->strides[3], c->D, Dp);
                    for (int64_t d = 0; d < c->D; d++) qr[d] *= scale;
                    float *g = dO + i * Dvp;
                    nk_load_row(c, g, nk_at(go, c->es, b, h, q0 + i), go->strides[3], c->Dv, Dvp);
                    nk_load_row(c, row, nk_at(out, c->es, b, h, q0 + i), out->strides[3], c->Dv, c->Dv);
                    float di = 0.f;
                    for (int64_t d = 0; d < c->Dv; d++) di += g[d] * row[d];
                    Di[i] = di;
                    L[i] = *((const float *)lse->data + b * lse->strides[0] + h * lse->strides[1] +
                             (q0 + i) * lse->strides[2]);
                }
                memset(dQ, 0, sizeof(float) * (size_t)(mq * Dp));
                const int64_t kend = a->causal ? (Lk < q0 + mq ? Lk : q0 + mq) : Lk;
                for (int64_t k0 = 0; k0 < kend; k0 += BK) {
                    const int64_t nk = kend - k0 < BK ? kend - k0 : BK, nkp = nk_round16(nk);
                    for (int64_t j = 0; j < nkp; j++) {
                        float *kr = Kr + j * Dp;
                        nk_load_row(c, kr, nk_at(k, c->es, b, hk, k0 + j), k->strides[3], j < nk ? c->D : 0, Dp);
                        for (int64_t d = 0; d < Dp; d++) Kt[d * nkp + j] = kr[d];
                        nk_load_row(c, row, nk_at(v, c->es, b, hk, k0 + j), v->strides[3], j < nk ? c->Dv : 0, Dvp);
                        for (int64_t d = 0; d < Dvp; d++) Vt[d * nkp + j] = row[d];
                    }
                    memset(S, 0, sizeof(float) * (size_t)(mq * nkp));
                    simd->gemm_acc(mq, nkp, Dp, Qs, Dp, Kt, nkp, S, nkp);
                    memset(dP, 0, sizeof(float) * (size_t)(mq * nkp));
                    simd->gemm_acc(mq, nkp, Dvp, dO, Dvp, Vt, nkp, dP, nkp);
                    for (int64_t i = 0; i < mq; i++) {
                        float *s = S + i * nkp, *dp = dP + i * nkp;
                        nk_mask_row(c, s, tmp, b, h, q0 + i, k0, nk, nkp);
                        if (L[i] == -INFINITY) {
                            memset(s, 0, sizeof(float) * (size_t)nkp);
                        } else {
                            simd->row_exp(s, nkp, L[i]);
                        }
                        if (a->dropout_p > 0.0) {
                            nk_dropout_row(c, z, b, h, q0 + i, k0, nk);
                        } else {
                            for (int64_t j = 0; j < nk; j++) z[j] = 1.f;
                        }
                        for (int64_t j = 0; j < nk; j++) {
                            const float p = s[j];
                            const float ds = p * (dp[j] * z[j] - Di[i]);
                            PT[j * mq + i] = p * z[j];
                            dST[j * mq + i] = ds;
                            s[j] = ds;
                        }
                        for (int64_t j = nk; j < nkp; j++) s[j] = 0.f;
                        if (c->dmask != NULL && nk > 0) {
                            const nk_tensor *dm = c->dmask;
                            float *dst = (float *)dm->data + b * dm->strides[0] + h * dm->strides[1] +
                                         (q0 + i) * dm->strides[2] + k0 * dm->strides[3];
                            for (int64_t j = 0; j < nk; j++) dst[j * dm->strides[3]] = s[j];
                        }
                    }
                    simd->gemm_acc(nk, Dvp, mq, PT, mq, dO, Dvp, dVacc + k0 * Dvp, Dvp);
                    simd->gemm_acc(mq, Dp, nkp, S, nkp, Kr, Dp, dQ, Dp);
                    simd->gemm_acc(nk, Dp, mq, dST, mq, Qs, Dp, dKacc + k0 * Dp, Dp);
                }
                for (int64_t i = 0; i < mq; i++) {
                    float *r = dQ + i * Dp;
                    for (int64_t d = 0; d < c->D; d++) r[d] *= scale;
                    if (c->D > 0)
                        c->from_f32((char *)nk_at(c->dq, c->es, b, h, q0 + i), c->dq->strides[3], r, 1, c->D);
                }
            }
            /* Causal rows past the last key and keys past kend got no gradient: zero dmask there. */
            if (c->dmask != NULL && a->causal) {
                const nk_tensor *dm = c->dmask;
                for (int64_t i = 0; i < c->Lq; i++)
                    for (int64_t j = i + 1; j < Lk; j++)
                        ((float *)dm->data)[b * dm->strides[0] + h * dm->strides[1] + i * dm->strides[2] +
                                            j * dm->strides[3]] = 0.f;
            }
        }
        for (int64_t j = 0; j < Lk; j++) {
            if (c->D > 0)
                c->from_f32((char *)nk_at(c->dk, c->es, b, hk, j), c->dk->strides[3], dKacc + j * Dp, 1, c->D);
            if (c->Dv > 0)
                c->from_f32((char *)nk_at(c->dv, c->es, b, hk, j), c->dv->strides[3], dVacc + j * Dvp, 1, c->Dv);
        }
    }
done:
    free(dKacc);
    free(dVacc);
    free(Qs);
    free(dO);
    free(dQ);
    free(S);
    free(dP);
    free(PT);
    free(dST);
    free(Kt);
    free(Kr);
    free(Vt);
    free(tmp);
}

static bool nk_same_sizes(const nk_tensor *a, const nk_tensor *b) {
    int64_t n;
    return a != NULL && nk_tensor_check(a, &n) == NK_SUCCESS && nk_same_shape(a, b);
}

nk_status nk_sdpa_backward(const nk_sdpa_args *a, const nk_tensor *out, const nk_tensor *lse,
                           const nk_tensor *grad_out, const nk_tensor *dq, const nk_tensor *dk,
                           const nk_tensor *dv, const nk_tensor *dmask) {
    nk_sdpa_ctx c;
    nk_status st = nk_sdpa_setup(&c, a, out, lse);
    if (st != NK_SUCCESS) return st;
    if (!nk_same_sizes(grad_out, out) || !nk_same_sizes(dq, a->q) || !nk_same_sizes(dk, a->k) ||
        !nk_same_sizes(dv, a->v))
        return NK_INVALID;
    if (grad_out->dtype != a->q->dtype || dq->dtype != a->q->dtype || dk->dtype != a->q->dtype ||
        dv->dtype != a->q->dtype)
        return NK_UNSUPPORTED;
    if (dmask != NULL) {
        int64_t n;
        const int64_t msz[4] = {c.B, c.Hq, c.Lq, c.Lk};
        if (nk_tensor_check(dmask, &n) != NK_SUCCESS || dmask->ndim != 4) return NK_INVALID;
        for (int d = 0; d < 4; d++)
            if (dmask->sizes[d] != msz[d]) return NK_INVALID;
        if (dmask->dtype != NK_F32) return NK_UNSUPPORTED;
    }
    c.grad_out = grad_out;
    c.dq = dq;
    c.dk = dk;
    c.dv = dv;
    c.dmask = dmask;
    /* With no keys every gradient is zero, and dq is never visited by the key loop. */
    if (c.Lk == 0 && c.D > 0) {
        nk_scalar zero = {.is_float = true, .f = 0.0};
        nk_fill(dq, zero);
    }
    const int64_t tasks = c.B * c.Hkv;
    if (tasks == 0) return NK_SUCCESS;
    nk_parallel_for(tasks, 1, nk_sdpa_bwd_range, &c);
    return atomic_load(&c.failed) ? NK_INVALID : NK_SUCCESS;
}
