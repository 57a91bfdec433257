/*
 * attention_simd.h - the fp32 inner loops of attention (and of anything else needing a small
 * accumulate-GEMM, an exp row or a max row), written once with GCC vector extensions and compiled
 * once per instruction set: the including file defines NK_SFX(name) (a per-ISA suffix) and NK_TGT
 * (the function attribute, e.g. __attribute__((target("avx512f")))) before each inclusion. A 64-byte
 * vector becomes one zmm register under AVX-512, two ymm under AVX2 and four xmm on baseline x86-64.
 *
 * NK_GEMM_ROWS: rows of the GEMM register tile (2*rows vector accumulators must fit the register file).
 * NK_ATTN_OWN_PRODUCTS: only the row functions; the including file writes the products and the table.
 * NK_ATTN_OWN_ROWS: nor the row functions (max, exp, sums); the including file writes them too.
 * Contract for every function here: row lengths that are vectors (n, N) are multiples of 16.
 */

typedef float nk_v16f __attribute__((vector_size(64)));
typedef int32_t nk_v16i __attribute__((vector_size(64)));
/* Unaligned, aliasing-safe views for loads and stores from plain float arrays. */
typedef float nk_v16f_u __attribute__((vector_size(64), aligned(4), may_alias));
typedef float nk_v8f __attribute__((vector_size(32)));
typedef float nk_v4f __attribute__((vector_size(16)));
typedef int32_t nk_v8i __attribute__((vector_size(32)));

typedef uint32_t nk_v16u __attribute__((vector_size(64)));
typedef uint32_t nk_v16w_u __attribute__((vector_size(64), aligned(2), may_alias));

#ifndef NK_ATTN_SIMD_ONCE
#define NK_ATTN_SIMD_ONCE
#define NK_VLOAD(p) (*(const nk_v16f_u *)(const void *)(p))
#define NK_VSTORE(p, v) (*(nk_v16f_u *)(void *)(p) = (v))
#endif

/* A broadcast: not written as {0} + x, which GCC must keep as an add (0 + -0 is +0) before the
 * broadcast, doubling the cost of every broadcast in the GEMM loop. */
NK_TGT static inline nk_v16f NK_SFX(nk_vsplat)(float x) {
    return (nk_v16f){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}

NK_TGT static inline nk_v16f NK_SFX(nk_vselect)(nk_v16i mask, nk_v16f a, nk_v16f b) {
    return (nk_v16f)(((nk_v16i)a & mask) | ((nk_v16i)b & ~mask));
}

/* exp(r) for |r| <= ln2/2: the degree-6 Taylor polynomial of every exponential below. */
NK_TGT static inline nk_v16f NK_SFX(nk_vexp_poly)(nk_v16f r) {
    nk_v16f p = NK_SFX(nk_vsplat)(1.f / 720.f);
    p = p * r + 1.f / 120.f;
    p = p * r + 1.f / 24.f;
    p = p * r + 1.f / 6.f;
    p = p * r + 0.5f;
    p = p * r + 1.f;
    return p * r + 1.f;
}

/*
 * exp(x) for 16 lanes: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for exactness), exp(r) by a
 * degree-6 Taylor polynomial (relative error < 3e-7, a few ulp), 2^n added to the exponent bits.
 * exp(-inf) = 0 and values below the float range flush to 0 like expf; NaN stays NaN.
 */
#ifdef NK_ATTN_AVX512_EXP
/* The same polynomial with AVX-512's vscalefps doing the 2^n step: it saturates to inf on overflow and
 * keeps NaN (max(lo, x) keeps a NaN x too); inputs below the float range give exactly 0, as expf
 * flushes them (and no denormal results, which cost microcode assists). */
NK_TGT static inline nk_v16f NK_SFX(nk_vexp)(nk_v16f x) {
    const __m512 lo = _mm512_set1_ps(-87.33654f);
    const __mmask16 under = _mm512_cmp_ps_mask((__m512)x, lo, _CMP_LT_OQ);
    const __m512 xc = _mm512_min_ps(_mm512_set1_ps(88.72283f), _mm512_max_ps(lo, (__m512)x)); /* NaN second */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    nk_v16f r = (nk_v16f)xc - (nk_v16f)n * 0.693359375f;
    r = r - (nk_v16f)n * -2.12194440e-4f;
    const nk_v16f p = NK_SFX(nk_vexp_poly)(r);
    return (nk_v16f)_mm512_maskz_scalef_ps((__mmask16)~under, (__m512)p, n);
}
#else
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
    const nk_v16f p = NK_SFX(nk_vexp_poly)(r);
    /* n in [-126, 128]: scale in two halves so 2^128 (x near the top of the range) does not overflow
     * the exponent field before the multiply. */
    const nk_v16i ni = __builtin_convertvector(n, nk_v16i);
    const nk_v16i n1 = ni >> 1, n2 = ni - n1;
    const nk_v16f s1 = (nk_v16f)((n1 + 127) << 23), s2 = (nk_v16f)((n2 + 127) << 23);
    nk_v16f y = p * s1 * s2;
    y = NK_SFX(nk_vselect)(under, NK_SFX(nk_vsplat)(0.f), y);
    return NK_SFX(nk_vselect)(nan, x, y);
}
#endif

/* Horizontal sum and max by halving (a tree, not 16 dependent scalar steps). */
NK_TGT static inline float NK_SFX(nk_vhsum)(nk_v16f v) {
    const nk_v8f a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                     __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    const nk_v4f b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

/* max(a, b) per lane, a NaN in b kept (v != v), as PyTorch's max keeps NaNs. */
NK_TGT static inline nk_v16f NK_SFX(nk_vmax_nan)(nk_v16f a, nk_v16f b) {
    return NK_SFX(nk_vselect)((b > a) | (b != b), b, a);
}

/* Horizontal max by halving: the upper half folded onto the lower four times (lanes past the half
 * repeat it and are ignored). */
NK_TGT static inline float NK_SFX(nk_vhmax)(nk_v16f m) {
    m = NK_SFX(nk_vmax_nan)(m, __builtin_shufflevector(m, m, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    m = NK_SFX(nk_vmax_nan)(m, __builtin_shufflevector(m, m, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7));
    m = NK_SFX(nk_vmax_nan)(m, __builtin_shufflevector(m, m, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3));
    m = NK_SFX(nk_vmax_nan)(m, __builtin_shufflevector(m, m, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1));
    return m[0];
}

/* The horizontal sums of a[0..16) as one vector, lane r = sum of a[r]: four levels of pairwise folds
 * (8 + 4 + 2 + 1 shuffle pairs) instead of 16 separate reductions. After level one, x[p] holds 8
 * partial sums of rows 2p and 2p+1 in its halves; after two, y[p] 4 each of rows 4p..4p+3; after
 * three, z[p] 2 each of rows 8p..8p+7. */
NK_TGT static inline nk_v16f NK_SFX(nk_vhsum16)(const nk_v16f a[16]) {
    nk_v16f x[8], y[4], z[2];
    for (int p = 0; p < 8; p++)
        x[p] = __builtin_shufflevector(a[2 * p], a[2 * p + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(a[2 * p], a[2 * p + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    for (int p = 0; p < 4; p++)
        y[p] = __builtin_shufflevector(x[2 * p], x[2 * p + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(x[2 * p], x[2 * p + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int p = 0; p < 2; p++)
        z[p] = __builtin_shufflevector(y[2 * p], y[2 * p + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               __builtin_shufflevector(y[2 * p], y[2 * p + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return __builtin_shufflevector(z[0], z[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(z[0], z[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

#ifndef NK_ATTN_OWN_ROWS /* the including file supplies the row functions */
#ifdef NK_ATTN_AVX512_EXP
/* A NaN anywhere makes the maximum NaN, found by an unordered-compare mask beside a plain max (two
 * instructions per vector, in two independent chains) instead of the NaN-keeping max's compares and blend
 * in one chain. */
NK_TGT static float NK_SFX(nk_row_max)(const float *s, int64_t n) {
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
    __mmask16 u = 0;
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        const __m512 v0 = _mm512_loadu_ps(s + j), v1 = _mm512_loadu_ps(s + j + 16);
        m0 = _mm512_max_ps(m0, v0);
        m1 = _mm512_max_ps(m1, v1);
        u |= _mm512_cmp_ps_mask(v0, v1, _CMP_UNORD_Q);
    }
    if (j < n) {
        const __m512 v0 = _mm512_loadu_ps(s + j);
        m0 = _mm512_max_ps(m0, v0);
        u |= _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q);
    }
    if (u != 0) return NAN;
    return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}
#else
NK_TGT static float NK_SFX(nk_row_max)(const float *s, int64_t n) {
    nk_v16f m = NK_SFX(nk_vsplat)(-INFINITY);
    for (int64_t j = 0; j < n; j += 16) m = NK_SFX(nk_vmax_nan)(m, NK_VLOAD(s + j));
    return NK_SFX(nk_vhmax)(m);
}
#endif

/* s[j] *= scale; returns the maximum of the scaled row. */
NK_TGT static float NK_SFX(nk_row_scale_max)(float *s, int64_t n, float scale) {
    nk_v16f m = NK_SFX(nk_vsplat)(-INFINITY);
    for (int64_t j = 0; j < n; j += 16) {
        const nk_v16f v = NK_VLOAD(s + j) * scale;
        NK_VSTORE(s + j, v);
        m = NK_SFX(nk_vmax_nan)(m, v);
    }
    return NK_SFX(nk_vhmax)(m);
}

#ifdef NK_ATTN_AVX512_EXP
/*
 * exp of the softmax's arguments (a score minus its row maximum: <= 0 or NaN) in 10 instructions where
 * nk_vexp takes 13: no clamp on the overflow side (vscalefps saturates anyway), ln2 in one float (the
 * error, |n| * 2e-9 relative, falls on values of 2^n: absolutely below 1e-9 of the row's largest
 * probability), and the underflow side only as the zeroing mask (below -87.34 gives exactly 0, -inf too;
 * a NaN is kept and flows through).
 */
NK_TGT static inline nk_v16f NK_SFX(nk_vexp_softmax)(nk_v16f x) {
    const __mmask16 keep = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(-87.33654f), _CMP_NLT_UQ);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps((__m512)x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const nk_v16f r = x - (nk_v16f)n * 0.693147180559945309f;
    const nk_v16f p = NK_SFX(nk_vexp_poly)(r);
    return (nk_v16f)_mm512_maskz_scalef_ps(keep, (__m512)p, n);
}
#endif

/* s[j] = exp(s[j] - m); returns the sum. */
NK_TGT static float NK_SFX(nk_row_exp_sum)(float *s, int64_t n, float m) {
    nk_v16f acc = NK_SFX(nk_vsplat)(0.f);
    for (int64_t j = 0; j < n; j += 16) {
#ifdef NK_ATTN_AVX512_EXP
        const nk_v16f e = NK_SFX(nk_vexp_softmax)(NK_VLOAD(s + j) - m);
#else
        const nk_v16f e = NK_SFX(nk_vexp)(NK_VLOAD(s + j) - m);
#endif
        NK_VSTORE(s + j, e);
        acc += e;
    }
    return NK_SFX(nk_vhsum)(acc);
}

/* For each row r < rows of S (row stride ld, n columns): S[r][j] = exp(S[r][j] - m[r]) and sum[r] its
 * sum; a row whose m[r] is -inf (nothing to attend) becomes zeros with sum 0. One call per block keeps
 * the constants in registers and lets the exponentials of neighbouring rows overlap. */
NK_TGT static void NK_SFX(nk_rows_exp_sum)(float *S, int64_t ld, int64_t rows, int64_t n, const float *m,
                                           float *sum) {
    for (int64_t r = 0; r < rows; r++) {
        float *s = S + r * ld;
        if (m[r] == -INFINITY) {
            for (int64_t j = 0; j < n; j += 16) NK_VSTORE(s + j, NK_SFX(nk_vsplat)(0.f));
            sum[r] = 0.f;
        } else {
            sum[r] = NK_SFX(nk_row_exp_sum)(s, n, m[r]);
        }
    }
}

/* out[r] = exp(a[r] - b[r]) for r < n (n a multiple of 16). */
NK_TGT static void NK_SFX(nk_vec_exp_diff)(const float *a, const float *b, float *out, int64_t n) {
    for (int64_t r = 0; r < n; r += 16) NK_VSTORE(out + r, NK_SFX(nk_vexp)(NK_VLOAD(a + r) - NK_VLOAD(b + r)));
}

/* s[j] = exp(s[j] - m) without a sum (backward: m is the saved log-sum-exp). */
NK_TGT static void NK_SFX(nk_row_exp)(float *s, int64_t n, float m) {
    for (int64_t j = 0; j < n; j += 16) NK_VSTORE(s + j, NK_SFX(nk_vexp)(NK_VLOAD(s + j) - m));
}

#endif /* NK_ATTN_OWN_ROWS */

#ifndef NK_ATTN_OWN_PRODUCTS /* the including file supplies the two products and the table */
/*
 * C[M,N] += A[M,K] * B[K,N], all fp32 row-major with leading dimensions in elements; N % 16 == 0.
 * Tiles of R rows x 2 vectors keep 2R accumulators in registers while A's elements are broadcast.
 */
#define NK_GEMM_TILE_B(R, V, BLOAD)                                                              \
    do {                                                                                         \
        nk_v16f acc[R][V];                                                                       \
        for (int r_ = 0; r_ < (R); r_++)                                                         \
            for (int v_ = 0; v_ < (V); v_++) acc[r_][v_] = NK_VLOAD(C + (i + r_) * ldc + j + 16 * v_); \
        for (int64_t k = 0; k < K; k++) {                                                        \
            nk_v16f b_[V];                                                                       \
            for (int v_ = 0; v_ < (V); v_++) b_[v_] = BLOAD(B + k * ldb + j + 16 * v_);          \
            for (int r_ = 0; r_ < (R); r_++) {                                                   \
                const nk_v16f a_ = NK_SFX(nk_vsplat)(A[(i + r_) * lda + k]);                     \
                for (int v_ = 0; v_ < (V); v_++) acc[r_][v_] += a_ * b_[v_];                     \
            }                                                                                    \
        }                                                                                        \
        for (int r_ = 0; r_ < (R); r_++)                                                         \
            for (int v_ = 0; v_ < (V); v_++) NK_VSTORE(C + (i + r_) * ldc + j + 16 * v_, acc[r_][v_]); \
    } while (0)

#define NK_GEMM_TILE(R, V) NK_GEMM_TILE_B(R, V, NK_VLOAD)

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
    for (; j + 16 <= n; j += 16) {
        nk_v16f a[16];
        for (int r = 0; r < 16; r++) a[r] = NK_SFX(nk_vsplat)(0.f);
        for (int64_t k = 0; k < d; k += 16) {
            const nk_v16f qv = NK_VLOAD(q + k);
            for (int r = 0; r < 16; r++) a[r] += qv * NK_VLOAD(K + (j + r) * ldk + k);
        }
        NK_VSTORE(s + j, NK_SFX(nk_vhsum16)(a));
    }
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

/*
 * The two products with key/value rows in bf16, read in place. A 32-bit word of a bf16 row holds
 * elements 2i (low half) and 2i+1 (high half), so (w << 16) and (w & 0xFFFF0000) are their fp32 values:
 * one instruction widens 16 values, but into even and odd lanes. The query (for dots) is therefore
 * given deinterleaved and the output rows (for the product with V) come out deinterleaved, per
 * 32-element chunk: elements 0, 2, .., 30 then 1, 3, .., 31 (nk_deinterleave32 / nk_interleave32).
 * Row lengths (d, N) are multiples of 32.
 */
#define NK_BF16_EVEN(w) ((nk_v16f)((w) << 16))
#define NK_BF16_ODD(w) ((nk_v16f)((w) & 0xFFFF0000u))
#define NK_VLOAD_W(p) (*(const nk_v16w_u *)(const void *)(p))

#define NK_GEMM_TILE_BF16(R, V)                                                                  \
    do {                                                                                         \
        nk_v16f acc[R][2 * (V)];                                                                 \
        for (int r_ = 0; r_ < (R); r_++)                                                         \
            for (int v_ = 0; v_ < 2 * (V); v_++) acc[r_][v_] = NK_VLOAD(C + (i + r_) * ldc + j + 16 * v_); \
        for (int64_t k = 0; k < K; k++) {                                                        \
            nk_v16f be_[V], bo_[V];                                                              \
            for (int v_ = 0; v_ < (V); v_++) {                                                   \
                const nk_v16u w_ = NK_VLOAD_W(B + k * ldb + j + 32 * v_);                        \
                be_[v_] = NK_BF16_EVEN(w_);                                                      \
                bo_[v_] = NK_BF16_ODD(w_);                                                       \
            }                                                                                    \
            for (int r_ = 0; r_ < (R); r_++) {                                                   \
                const nk_v16f a_ = NK_SFX(nk_vsplat)(A[(i + r_) * lda + k]);                     \
                for (int v_ = 0; v_ < (V); v_++) {                                               \
                    acc[r_][2 * v_] += a_ * be_[v_];                                             \
                    acc[r_][2 * v_ + 1] += a_ * bo_[v_];                                         \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int r_ = 0; r_ < (R); r_++)                                                         \
            for (int v_ = 0; v_ < 2 * (V); v_++) NK_VSTORE(C + (i + r_) * ldc + j + 16 * v_, acc[r_][v_]); \
    } while (0)

/* C[M, N] (deinterleaved rows) += A[M, K] (fp32) * B[K, N] (bf16 rows). */
NK_TGT static void NK_SFX(nk_gemm_acc_bf16)(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                                            const uint16_t *B, int64_t ldb, float *C, int64_t ldc) {
    int64_t i = 0;
    for (; i + 4 <= M; i += 4)
        for (int64_t j = 0; j < N; j += 32) NK_GEMM_TILE_BF16(4, 1);
    for (; i < M; i++) {
        int64_t j = 0;
        for (; j + 64 <= N; j += 64) NK_GEMM_TILE_BF16(1, 2);
        for (; j < N; j += 32) NK_GEMM_TILE_BF16(1, 1);
    }
}

/* s[j] = dot(q, K[j, :]) for j < n, q deinterleaved (fp32), K rows bf16. */
NK_TGT static void NK_SFX(nk_gemv_dots_bf16)(int64_t n, int64_t d, const float *q, const uint16_t *K, int64_t ldk,
                                             float *s) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        nk_v16f a[16];
        for (int r = 0; r < 16; r++) a[r] = NK_SFX(nk_vsplat)(0.f);
        for (int64_t k = 0; k < d; k += 32) {
            const nk_v16f qe = NK_VLOAD(q + k), qo = NK_VLOAD(q + k + 16);
            for (int r = 0; r < 16; r++) {
                const nk_v16u w = NK_VLOAD_W(K + (j + r) * ldk + k);
                a[r] += qe * NK_BF16_EVEN(w); /* two statements: two FMAs, not a multiply and an add */
                a[r] += qo * NK_BF16_ODD(w);
            }
        }
        NK_VSTORE(s + j, NK_SFX(nk_vhsum16)(a));
    }
    for (; j < n; j++) {
        nk_v16f a0 = NK_SFX(nk_vsplat)(0.f);
        for (int64_t k = 0; k < d; k += 32) {
            const nk_v16u w = NK_VLOAD_W(K + j * ldk + k);
            a0 += NK_VLOAD(q + k) * NK_BF16_EVEN(w);
            a0 += NK_VLOAD(q + k + 16) * NK_BF16_ODD(w);
        }
        s[j] = NK_SFX(nk_vhsum)(a0);
    }
}
#undef NK_GEMM_TILE_BF16
#undef NK_BF16_EVEN
#undef NK_BF16_ODD
#undef NK_VLOAD_W

static const nk_attn_simd NK_SFX(nk_attn_simd_table) = {
    .gemm_acc = NK_SFX(nk_gemm_acc),
    .gemv_dots = NK_SFX(nk_gemv_dots),
    .gemm_acc_bf16 = NK_SFX(nk_gemm_acc_bf16),
    .gemv_dots_bf16 = NK_SFX(nk_gemv_dots_bf16),
    .row_max = NK_SFX(nk_row_max),
    .row_scale_max = NK_SFX(nk_row_scale_max),
    .rows_exp_sum = NK_SFX(nk_rows_exp_sum),
    .vec_exp_diff = NK_SFX(nk_vec_exp_diff),
    .row_exp_sum = NK_SFX(nk_row_exp_sum),
    .row_exp = NK_SFX(nk_row_exp),
    .n_align = 16,
#ifdef NK_ATTN_GEMM_PK
    .gemm_pk = NK_ATTN_GEMM_PK,
#endif
#ifdef NK_ATTN_TRANSPOSE16
    .transpose16 = NK_ATTN_TRANSPOSE16,
#endif
};
#undef NK_GEMM_TILE
#undef NK_GEMM_TILE_B
#endif
