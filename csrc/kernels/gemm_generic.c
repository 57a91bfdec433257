/*
 * gemm_generic.c - portable C micro-kernels of the GEMM (any CPU; the compiler vectorises what it can).
 */
#include "gemm_internal.h"

#define GEN_MR 4
#define GEN_NR 16

static void ukr_generic(int64_t kc, const float *pa, const float *pb, float *c, int64_t ldc, bool accumulate,
                        nk_gemm_prefetch *pf) {
    (void)pf; /* the walk is a hint: skipping it changes no result */
    float acc[GEN_MR][GEN_NR] = {{0}};
    for (int64_t k = 0; k < kc; k++) {
        const float *a = pa + k * GEN_MR;
        const float *b = pb + k * GEN_NR;
        for (int i = 0; i < GEN_MR; i++)
            for (int j = 0; j < GEN_NR; j++) acc[i][j] += a[i] * b[j];
    }
    for (int i = 0; i < GEN_MR; i++)
        for (int j = 0; j < GEN_NR; j++) c[i * ldc + j] = accumulate ? c[i * ldc + j] + acc[i][j] : acc[i][j];
}

/* One element of B as fp32. */
static inline float load_elem(const void *b, nk_dtype dt, int64_t off) {
    switch (dt) {
    case NK_BF16: return nk_bf16_to_f32(((const uint16_t *)b)[off]);
    case NK_F16: return nk_f16_to_f32(((const uint16_t *)b)[off]);
    default: return ((const float *)b)[off];
    }
}

void nk_gemm_skinny_kcontig_generic(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                                    nk_dtype dt, int64_t ldb, float *c, int64_t ldc) {
    float col[256];
    for (int64_t j = 0; j < n; j++) {
        for (int64_t i = 0; i < m; i++) c[i * ldc + j] = 0.f;
        /* Convert the column once in chunks, then reuse it for every row. */
        for (int64_t k0 = 0; k0 < k; k0 += 256) {
            const int64_t kn = k - k0 < 256 ? k - k0 : 256;
            for (int64_t p = 0; p < kn; p++) col[p] = load_elem(b, dt, j * ldb + k0 + p);
            for (int64_t i = 0; i < m; i++) {
                const float *ar = a + i * lda + k0;
                float s = 0.f;
                for (int64_t p = 0; p < kn; p++) s += ar[p] * col[p];
                c[i * ldc + j] += s;
            }
        }
    }
}

void nk_gemm_skinny_ncontig_generic(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                                    nk_dtype dt, int64_t ldb, float *c, int64_t ldc) {
    float row[256];
    for (int64_t j0 = 0; j0 < n; j0 += 256) {
        const int64_t nn = n - j0 < 256 ? n - j0 : 256;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < nn; j++) c[i * ldc + j0 + j] = 0.f;
        for (int64_t p = 0; p < k; p++) {
            for (int64_t j = 0; j < nn; j++) row[j] = load_elem(b, dt, p * ldb + j0 + j);
            for (int64_t i = 0; i < m; i++) {
                const float av = a[i * lda + p];
                float *cr = c + i * ldc + j0;
                for (int64_t j = 0; j < nn; j++) cr[j] += av * row[j];
            }
        }
    }
}

const nk_gemm_isa nk_gemm_isa_generic = {
    .name = "generic",
    .mr = GEN_MR,
    .nr = GEN_NR,
    .ukr = ukr_generic,
    .pack_a_kcontig = NULL,
    .pack_b_kcontig = NULL,
    .skinny_kcontig = nk_gemm_skinny_kcontig_generic,
    .skinny_ncontig = nk_gemm_skinny_ncontig_generic,
};
