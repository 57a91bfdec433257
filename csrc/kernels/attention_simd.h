/*
 * attention_simd.h - the fp32 inner loops of attention (and of anything else needing a small
 * accumulate-GEMM, an exp row or a max row), written once with GCC vector extensions and compiled
 * once per instruction set: the including file defines NK_SFX(name) (a per-ISA suffix) and NK_TGT
 * (the function attribute, e.g. __attribute__((target("avx512f")))) before each inclusion. A 64-byte
 * vector becomes one zmm register under AVX-512, two ymm under AVX2 and four xmm on baseline x86-64.
 *
 * NK_GEMM_ROWS: rows of the GEMM register tile (2*rows vector accumulators must fit the register file).
 * NK_ATTN_OWN_PRODUCTS: only the row functions; the including file writes the products and the table.
 * Contract for every function here: row lengths that are vectors (n, N) are multiples of 16.
 */

typedef float nk_v16f __attribute__((vector_size(64)));
typedef int32_t nk_v16i __attribute__((vector_size(64)));
/* Unaligned, aliasing-safe views for loads and stores from plain float arrays. */
typedef float nk_v16f_u __attribute__((vector_size(64), aligned(4), may_alias));
typedef float nk_v8f __attribute__((vector_size(32)));
typedef float nk_v4f __attribute__((vector_size(16)));
typedef int32_t nk_v8i __attribute__((vector_size(32)));

#ifndef NK_ATTN_SIMD_ONCE
#define NK_ATTN_SIMD_ONCE
#define NK_VLOAD(p) (*(const nk_v16f_u *)(const void *)(p))
#define NK_VSTORE(p, v) (*(nk_v16f_u *)(void *)(p) = (v))
#endif

NK_TGT static inline nk_v16f NK_SFX(nk_vsplat)(float x) {
    return (nk_v16f){0} + x;
}

NK_TGT static inline nk_v16f NK_SFX(nk_vselect)(nk_v16i mask, nk_v16f a, nk_v16f b) {
    return (nk_v16f)(((nk_v16i)a & mask) | ((nk_v16i)b & ~mask));
}

/*
 * exp(x) for 16 lanes: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for exactness), exp(r) by a
 * degree-6 Taylor polynomial (relative error < 3e-7, a few ulp), 2^n added to the exponent bits.
 * exp(-inf) = 0 and values below the float range flush to 0 like expf; NaN stays NaN.
 */
NK_TGT static inline nk_v16f NK_SFX(nk_vexp)(nk_v16f x) {
    const nk_v16f lo = NK_SFX(nk_vsplat)(-87.33654f), hi = NK_SFX(nk_vsplat)(88.72283f);
    const nk_v16i under = x < lo;
    const nk_v16i nan = x != x;
    nk_v16f xc = NK_SFX(nk_vselect)(under, lo, x);
    xc = NK_SFX(nk_vselect)(xc > hi, hi, xc);
    xc = NK_SFX(nk_vselect)(nan, NK_SFX(nk_vsplat)(0.f), xc);
    const nk_v16f magic = NK_SFX(nk_vsplat)(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    const nk_v16f n = (xc * 1.44269504088896341f + magic) - magic;
    nk_v16f r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    nk_v16f p = NK_SFX(nk_vsplat)(1.f / 720.f);
    p = p * r + 1.f / 120.f;
    p = p * r + 1.f / 24.f;
    p = p * r + 1.f / 6.f;
    p = p * r + 0.5f;
    p = p * r + 1.f;
    p = p * r + 1.f;
    /* n in [-126, 128]: scale in two halves so 2^128 (x near the top of the range) does not overflow
     * the exponent field before the multiply. */
    const nk_v16i ni = __builtin_convertvector(n, nk_v16i);
    const nk_v16i n1 = ni >> 1, n2 = ni - n1;
    const nk_v16f s1 = (nk_v16f)((n1 + 127) << 23), s2 = (nk_v16f)((n2 + 127) << 23);
    nk_v16f y = p * s1 * s2;
    y = NK_SFX(nk_vselect)(under, NK_SFX(nk_vsplat)(0.f), y);
    return NK_SFX(nk_vselect)(nan, x, y);
}

/* Horizontal sum and max by halving (a tree, not 16 dependent scalar steps). */
NK_TGT static inline float NK_SFX(nk_vhsum)(nk_v16f v) {
    const nk_v8f a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                     __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    const nk_v4f b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

NK_TGT static float NK_SFX(nk_row_max)(const float *s, int64_t n) {
    nk_v16f m = NK_SFX(nk_vsplat)(-INFINITY);
    for (int64_t j = 0; j < n; j += 16) {
        const nk_v16f v = NK_VLOAD(s + j);
        /* v != v keeps a NaN, as PyTorch's max does. */
        m = NK_SFX(nk_vselect)((v > m) | (v != v), v, m);
    }
    const nk_v8f lo = __builtin_shufflevector(m, m, 0, 1, 2, 3, 4, 5, 6, 7);
    const nk_v8f hi = __builtin_shufflevector(m, m, 8, 9, 10, 11, 12, 13, 14, 15);
    const nk_v8f a = (nk_v8f)(((nk_v8i)hi & ((hi > lo) | (hi != hi))) | ((nk_v8i)lo & ~((hi > lo) | (hi != hi))));
    float r = a[0];
    for (int k = 1; k < 8; k++) r = (a[k] > r || a[k] != a[k]) ? a[k] : r;
    return r;
}

/* s[j] = exp(s[j] - m); returns the sum. */
NK_TGT static float NK_SFX(nk_row_exp_sum)(float *s, int64_t n, float m) {
    nk_v16f acc = NK_SFX(nk_vsplat)(0.f);
    for (int64_t j = 0; j < n; j += 16) {
        const nk_v16f e = NK_SFX(nk_vexp)(NK_VLOAD(s + j) - m);
        NK_VSTORE(s + j, e);
        acc += e;
    }
    return NK_SFX(nk_vhsum)(acc);
}

/* s[j] = exp(s[j] - m) without a sum (backward: m is the saved log-sum-exp). */
NK_TGT static void NK_SFX(nk_row_exp)(float *s, int64_t n, float m) {
    for (int64_t j = 0; j < n; j += 16) NK_VSTORE(s + j, NK_SFX(nk_vexp)(NK_VLOAD(s + j) - m));
}

#ifndef NK_ATTN_OWN_PRODUCTS /* the including file supplies the two products and the table */
/*
 * C[M,N] += A[M,K] * B[K,N], all fp32 row-major with leading dimensions in elements; N % 16 == 0.
 * Tiles of R rows x 2 vectors keep 2R accumulators in registers while A's elements are broadcast.
 */
#define NK_GEMM_TILE(R, V)                                                                       \
    do {                                                                                         \
        nk_v16f acc[R][V];                                                                       \
        for (int r_ = 0; r_ < (R); r_++)                                                         \
            for (int v_ = 0; v_ < (V); v_++) acc[r_][v_] = NK_VLOAD(C + (i + r_) * ldc + j + 16 * v_); \
        for (int64_t k = 0; k < K; k++) {                                                        \
            nk_v16f b_[V];                                                                       \
            for (int v_ = 0; v_ < (V); v_++) b_[v_] = NK_VLOAD(B + k * ldb + j + 16 * v_);       \
            for (int r_ = 0; r_ < (R); r_++) {                                                   \
                const nk_v16f a_ = NK_SFX(nk_vsplat)(A[(i + r_) * lda + k]);                     \
                for (int v_ = 0; v_ < (V); v_++) acc[r_][v_] += a_ * b_[v_];                     \
            }                                                                                    \
        }                                                                                        \
        for (int r_ = 0; r_ < (R); r_++)                                                         \
            for (int v_ = 0; v_ < (V); v_++) NK_VSTORE(C + (i + r_) * ldc + j + 16 * v_, acc[r_][v_]); \
    } while (0)

NK_TGT static void NK_SFX(nk_gemm_acc)(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                                       const float *B, int64_t ldb, float *C, int64_t ldc) {
    int64_t i = 0;
    for (; i + NK_GEMM_ROWS <= M; i += NK_GEMM_ROWS) {
        int64_t j = 0;
        for (; j + 32 <= N; j += 32) NK_GEMM_TILE(NK_GEMM_ROWS, 2);
        for (; j < N; j += 16) NK_GEMM_TILE(NK_GEMM_ROWS, 1);
    }
    for (; i + 4 <= M; i += 4) {
        int64_t j = 0;
        for (; j + 32 <= N; j += 32) NK_GEMM_TILE(4, 2);
        for (; j < N; j += 16) NK_GEMM_TILE(4, 1);
    }
    for (; i < M; i++) {
        int64_t j = 0;
        for (; j + 64 <= N; j += 64) NK_GEMM_TILE(1, 4);
        for (; j < N; j += 16) NK_GEMM_TILE(1, 1);
    }
}

/* s[j] = dot(q, K[j,:]) for j < n (q and K rows of length d, a multiple of 16; K row stride ldk):
 * the single-query (decode) form, which reads K in place instead of transposing it. */
NK_TGT static void NK_SFX(nk_gemv_dots)(int64_t n, int64_t d, const float *q, const float *K, int64_t ldk,
                                        float *s) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        nk_v16f a0 = NK_SFX(nk_vsplat)(0.f), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t k = 0; k < d; k += 16) {
            const nk_v16f qv = NK_VLOAD(q + k);
            a0 += qv * NK_VLOAD(K + (j + 0) * ldk + k);
            a1 += qv * NK_VLOAD(K + (j + 1) * ldk + k);
            a2 += qv * NK_VLOAD(K + (j + 2) * ldk + k);
            a3 += qv * NK_VLOAD(K + (j + 3) * ldk + k);
        }
        s[j] = NK_SFX(nk_vhsum)(a0);
        s[j + 1] = NK_SFX(nk_vhsum)(a1);
        s[j + 2] = NK_SFX(nk_vhsum)(a2);
        s[j + 3] = NK_SFX(nk_vhsum)(a3);
    }
    for (; j < n; j++) {
        nk_v16f a0 = NK_SFX(nk_vsplat)(0.f);
        for (int64_t k = 0; k < d; k += 16) a0 += NK_VLOAD(q + k) * NK_VLOAD(K + j * ldk + k);
        s[j] = NK_SFX(nk_vhsum)(a0);
    }
}

static const nk_attn_simd NK_SFX(nk_attn_simd_table) = {
    .gemm_acc = NK_SFX(nk_gemm_acc),
    .gemv_dots = NK_SFX(nk_gemv_dots),
    .row_max = NK_SFX(nk_row_max),
    .row_exp_sum = NK_SFX(nk_row_exp_sum),
    .row_exp = NK_SFX(nk_row_exp),
};
#undef NK_GEMM_TILE
#endif
