/*
 * test_gemm.c - nk_gemm against a double-precision triple loop: every micro-kernel family the CPU
 * has, every dtype, odd sizes on both paths (skinny and packed), transposed / strided / batched
 * operands, alpha/beta with in-place and broadcast self, K = 0, empty outputs, NaN in an output that
 * beta = 0 must not read, and bad descriptors. bf16 also on shapes around the blocking of the
 * vdpbf16ps kernels (12 x 32 tile, 256-deep blocks, 144-row blocks, k pairs with an odd k).
 */
#include "gemm_internal.h"
#include "neuron_kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_checks;
static int g_failures;

#define CHECK_MSG(cond, ...)                                                                   \
    do {                                                                                       \
        g_checks++;                                                                            \
        if (!(cond)) {                                                                         \
            g_failures++;                                                                      \
            if (g_failures <= 30) {                                                            \
                fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);       \
                fprintf(stderr, __VA_ARGS__);                                                  \
                fprintf(stderr, "\n");                                                         \
            }                                                                                  \
        }                                                                                      \
    } while (0)

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static double get(const void *base, nk_dtype dt, int64_t off) {
    switch (dt) {
    case NK_F32: return ((const float *)base)[off];
    case NK_F64: return ((const double *)base)[off];
    case NK_BF16: return nk_bf16_to_f32(((const uint16_t *)base)[off]);
    case NK_F16: return nk_f16_to_f32(((const uint16_t *)base)[off]);
    default: return NAN;
    }
}

static void set(void *base, nk_dtype dt, int64_t off, double v) {
    switch (dt) {
    case NK_F32: ((float *)base)[off] = (float)v; break;
    case NK_F64: ((double *)base)[off] = v; break;
    case NK_BF16: ((uint16_t *)base)[off] = nk_f32_to_bf16((float)v); break;
    case NK_F16: ((uint16_t *)base)[off] = nk_f32_to_f16((float)v); break;
    default: break;
    }
}

/* A [batch?] x rows x cols matrix in its own buffer with the given layout. */
typedef enum layout { ROW, COL, STRIDED, BCAST_ROWS } layout;

typedef struct mat {
    void *buf;
    int64_t count; /* elements allocated */
    nk_tensor t;
} mat;

static mat mat_make(nk_dtype dt, int64_t batch, int64_t rows, int64_t cols, layout lay, bool batched, int64_t bstride_mul) {
    mat m;
    memset(&m, 0, sizeof m);
    int64_t s0, s1, per;
    switch (lay) {
    case COL: s0 = 1, s1 = rows, per = rows * cols; break;
    case STRIDED: s0 = 2 * cols + 3, s1 = 2, per = rows * (2 * cols + 3); break;  /* every other column, padded rows */
    case BCAST_ROWS: s0 = 0, s1 = 1, per = cols; break;                              /* a bias: one row for all */
    default: s0 = cols, s1 = 1, per = rows * cols; break;
    }
    if (per == 0) per = 1;
    const int64_t bs = per * bstride_mul; /* bstride_mul 0: every batch entry is the same matrix */
    m.count = (batched ? (batch - 1) * bs : 0) + per + 1;
    m.buf = calloc((size_t)m.count, 8);
    m.t.data = m.buf;
    m.t.dtype = dt;
    if (batched) {
        m.t.ndim = 3;
        m.t.sizes[0] = batch, m.t.sizes[1] = rows, m.t.sizes[2] = cols;
        m.t.strides[0] = bs, m.t.strides[1] = s0, m.t.strides[2] = s1;
    } else {
        m.t.ndim = 2;
        m.t.sizes[0] = rows, m.t.sizes[1] = cols;
        m.t.strides[0] = s0, m.t.strides[1] = s1;
    }
    for (int64_t i = 0; i < m.count; i++) set(m.buf, dt, i, frand());
    return m;
}

static int64_t off3(const nk_tensor *t, int64_t b, int64_t i, int64_t j) {
    const int o = t->ndim - 2;
    return (o ? b * t->strides[0] : 0) + i * t->strides[o] + j * t->strides[o + 1];
}

typedef struct gcase {
    nk_dtype dt;
    int64_t batch, m, n, k;
    layout la, lb, lc;
    bool batched;
    int64_t b_bmul; /* batch stride multiplier of b (0: broadcast) */
    double alpha, beta;
    int self_mode; /* 0: NULL (out in place), 1: separate full self, 2: broadcast row self */
    bool nan_out;  /* fill out with NaN first (only meaningful with beta == 0) */
} gcase;

static double tol_of(nk_dtype dt) {
    switch (dt) {
    case NK_BF16: return 1.0 / 128;
    case NK_F16: return 1.0 / 1024;
    case NK_F32: return 1e-5;
    default: return 1e-12;
    }
}

static void run_case(const gcase *gc, const char *isa) {
    const nk_dtype dt = gc->dt;
    mat a = mat_make(dt, gc->batch, gc->m, gc->k, gc->la, gc->batched, 1);
    mat b = mat_make(dt, gc->batch, gc->k, gc->n, gc->lb, gc->batched, gc->b_bmul);
    mat c = mat_make(dt, gc->batch, gc->m, gc->n, gc->lc, gc->batched, 1);
    mat s = {0};
    if (gc->self_mode == 1) s = mat_make(dt, gc->batch, gc->m, gc->n, ROW, gc->batched, 1);
    if (gc->self_mode == 2) s = mat_make(dt, gc->batch, gc->m, gc->n, BCAST_ROWS, gc->batched, 0);
    if (gc->nan_out)
        for (int64_t i = 0; i < c.count; i++) set(c.buf, dt, i, NAN);
    /* A copy of the output buffer: elements outside the view must stay untouched. */
    void *before = malloc((size_t)c.count * 8);
    memcpy(before, c.buf, (size_t)c.count * 8);
    const nk_tensor *selfp = gc->self_mode ? &s.t : NULL;
    const nk_tensor *sref = gc->self_mode ? &s.t : &c.t;
    const void *sbuf = gc->self_mode ? s.buf : before;

    nk_status st = nk_gemm(&c.t, &a.t, &b.t, selfp, gc->alpha, gc->beta);
    CHECK_MSG(st == NK_SUCCESS, "status %d", (int)st);
    const double tol = tol_of(dt);
    int bad = 0;
    for (int64_t bi = 0; bi < gc->batch && bad < 3; bi++)
        for (int64_t i = 0; i < gc->m && bad < 3; i++)
            for (int64_t j = 0; j < gc->n && bad < 3; j++) {
                double sum = 0.0, mag = 0.0;
                for (int64_t p = 0; p < gc->k; p++) {
                    const double x = get(a.buf, dt, off3(&a.t, bi, i, p)) * get(b.buf, dt, off3(&b.t, bi, p, j));
                    sum += x;
                    mag += fabs(x);
                }
                double ref = gc->alpha * sum;
                mag = fabs(gc->alpha) * mag;
                if (gc->beta != 0.0) {
                    const double sv = get(sbuf, dt, off3(sref, bi, i, j));
                    ref += gc->beta * sv;
                    mag += fabs(gc->beta * sv);
                }
                const double got = get(c.buf, dt, off3(&c.t, bi, i, j));
                const bool ok = fabs(got - ref) <= tol * (mag + fabs(ref)) + 1e-30;
                if (!ok) bad++;
                CHECK_MSG(ok, "isa %s %s b%lld m%lld n%lld k%lld la%d lb%d lc%d a=%g b=%g self%d at [%lld,%lld,%lld]: got %.9g want %.9g",
                          isa, nk_dtype_name(dt), (long long)gc->batch, (long long)gc->m, (long long)gc->n,
                          (long long)gc->k, gc->la, gc->lb, gc->lc, gc->alpha, gc->beta, gc->self_mode,
                          (long long)bi, (long long)i, (long long)j, got, ref);
            }
    /* Elements of the output buffer outside the view are untouched. */
    if (gc->lc == STRIDED && gc->m > 0 && gc->n > 0) {
        const int64_t es = (int64_t)nk_dtype_size(dt);
        int64_t touched_outside = 0;
        char *mark = calloc((size_t)c.count, 1);
        for (int64_t bi = 0; bi < gc->batch; bi++)
            for (int64_t i = 0; i < gc->m; i++)
                for (int64_t j = 0; j < gc->n; j++) mark[off3(&c.t, bi, i, j)] = 1;
        for (int64_t q = 0; q < c.count; q++)
            if (!mark[q] && memcmp((char *)c.buf + q * es, (char *)before + q * es, (size_t)es) != 0) touched_outside++;
        CHECK_MSG(touched_outside == 0, "%lld elements outside the output view changed", (long long)touched_outside);
        free(mark);
    }
    free(before);
    free(a.buf);
    free(b.buf);
    free(c.buf);
    free(s.buf);
}

static const int64_t SIZES[][3] = {
    /* m, n, k */
    {1, 1, 1},     {1, 17, 63},  {3, 129, 17},  {16, 33, 40},  {17, 63, 129}, {63, 17, 3},
    {129, 129, 63}, {200, 5, 70}, {1, 300, 517}, {8, 70, 33},   {13, 40, 300}, {45, 100, 300},
};

/* bf16 only: edges of the pair-packed kernels (m, n, k around 12, 32, 256, 144; odd k; skinny rows 9..16),
 * of the AVX2 skinny kernel's pair order (k = 15, 16, 17, 47 and a long row with a 7-value tail) and of the
 * few-rows AMX path (m 8..32 with whole and partial 32-deep steps, 32-row weight blocks and
 * 256-column sub-blocks). */
static const int64_t SIZES_BF16[][3] = {
    {150, 70, 257}, {24, 64, 512}, {37, 45, 513}, {11, 300, 65}, {16, 7, 1001}, {9, 100, 95},
    {145, 33, 31},  {5, 1, 77},    {1, 33, 2},    {14, 41, 64},  {300, 20, 33}, {40, 290, 3},
    {32, 97, 96},   {17, 600, 512}, {25, 31, 33}, {8, 64, 32},  {33, 40, 64},
    {1, 13, 16},    {3, 7, 15},    {2, 19, 47},   {4, 9, 17},   {1, 50, 2055},
};

static void run_isa(const char *isa) {
    const nk_dtype dts[] = {NK_F32, NK_BF16, NK_F16, NK_F64};
    const layout lays[] = {ROW, COL, STRIDED};
    for (size_t d = 0; d < 4; d++)
        for (size_t si = 0; si < sizeof SIZES / sizeof SIZES[0]; si++)
            for (size_t la = 0; la < 3; la++)
                for (size_t lb = 0; lb < 3; lb++) {
                    gcase gc = {.dt = dts[d], .batch = 1, .m = SIZES[si][0], .n = SIZES[si][1], .k = SIZES[si][2],
                                .la = lays[la], .lb = lays[lb], .lc = lays[(la + lb + si) % 3], .alpha = 1.0, .beta = 0.0};
                    /* Vary alpha/beta/self with the case index so every combination appears. */
                    switch ((si + la * 3 + lb) % 5) {
                    case 1: gc.alpha = 0.5, gc.nan_out = true; break;
                    case 2: gc.beta = 1.0; break;                           /* in place */
                    case 3: gc.alpha = -2.0, gc.beta = 0.5, gc.self_mode = 1; break;
                    case 4: gc.alpha = 1.5, gc.beta = 1.0, gc.self_mode = 2; break; /* bias row */
                    default: break;
                    }
                    run_case(&gc, isa);
                }
    for (size_t si = 0; si < sizeof SIZES_BF16 / sizeof SIZES_BF16[0]; si++)
        for (size_t la = 0; la < 3; la++)
            for (size_t lb = 0; lb < 3; lb++) {
                gcase gc = {.dt = NK_BF16, .batch = 1, .m = SIZES_BF16[si][0], .n = SIZES_BF16[si][1],
                            .k = SIZES_BF16[si][2], .la = lays[la], .lb = lays[lb], .lc = lays[(la + 2 * lb + si) % 3],
                            .alpha = 1.0, .beta = 0.0};
                switch ((si + la + lb) % 4) {
                case 1: gc.alpha = 0.5, gc.nan_out = true; break;
                case 2: gc.alpha = 1.5, gc.beta = 1.0, gc.self_mode = 2; break;
                case 3: gc.alpha = -2.0, gc.beta = 0.5, gc.self_mode = 1; break;
                default: break;
                }
                run_case(&gc, isa);
            }
    /* Past the AVX-512 blocking (mc 144, nc 512, kc 256), with edges: the row-block packers (A stored
     * i-contiguous, B n-contiguous) fill several blocks of panels. */
    for (size_t d = 0; d < 2; d++)
        for (int la = 0; la < 2; la++) {
            gcase gc = {.dt = d ? NK_BF16 : NK_F32, .batch = 1, .m = 157, .n = 531, .k = 270, .la = la ? COL : ROW,
                        .lb = ROW, .lc = ROW, .alpha = 1.0, .beta = la ? 0.5 : 0.0, .self_mode = la};
            run_case(&gc, isa);
        }
    /* Batched, b broadcast over the batch, transposed operands. */
    for (size_t d = 0; d < 4; d++)
        for (int64_t bmul = 0; bmul <= 1; bmul++) {
            const int64_t shapes[][3] = {{1, 40, 33}, {5, 37, 20}, {30, 20, 70}, {40, 3, 9}};
            for (size_t si = 0; si < 4; si++) {
                gcase gc = {.dt = dts[d], .batch = 3, .m = shapes[si][0], .n = shapes[si][1], .k = shapes[si][2],
                            .la = si % 2 ? COL : ROW, .lb = si / 2 ? COL : ROW, .lc = ROW, .batched = true,
                            .b_bmul = bmul, .alpha = 1.0, .beta = si == 2 ? 0.25 : 0.0, .self_mode = si == 2 ? 1 : 0};
                run_case(&gc, isa);
            }
        }
    /* B just above half the L3, so the micro-kernels prefetch it while they compute (stream_b): once
     * per micro-kernel that prefetches, on 2 threads (the reference product takes seconds under ASan). */
    const bool dp = strcmp(isa, "avx512bf16") == 0, wide = strcmp(isa, "avx512") == 0;
    if (nk_threads_get() == 2 && (dp || wide || strcmp(isa, "avx2") == 0)) {
        long long kib = 0;
        FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
        if (f != NULL) {
            if (fscanf(f, "%lldK", &kib) != 1) kib = 0;
            fclose(f);
        }
        const double bytes = 0.6 * (double)(kib > 0 ? kib << 10 : 32ll << 20);
        /* k-contiguous B (a weight) for each kernel, an n-contiguous one on AVX-512 too. */
        for (int i = 0; i < (wide ? 2 : 1); i++) {
            const nk_dtype dt = dp ? NK_BF16 : NK_F32;
            const int64_t k = 40 + i, n = (int64_t)(bytes / (double)(k * (int64_t)nk_dtype_size(dt)));
            gcase gc = {.dt = dt, .batch = 1, .m = 17, .n = n, .k = k, .la = ROW, .lb = i ? ROW : COL, .lc = ROW,
                        .alpha = 1.0, .beta = 0.0};
            run_case(&gc, isa);
        }
    }
    /* K = 0: out = beta * self; and 0 x N, M x 0 outputs. */
    for (size_t d = 0; d < 4; d++) {
        gcase k0 = {.dt = dts[d], .batch = 1, .m = 5, .n = 7, .k = 0, .la = ROW, .lb = ROW, .lc = ROW,
                    .alpha = 3.0, .beta = 0.5, .self_mode = 1};
        run_case(&k0, isa);
        k0.beta = 0.0, k0.nan_out = true, k0.self_mode = 0;
        run_case(&k0, isa);
        gcase e1 = {.dt = dts[d], .batch = 1, .m = 0, .n = 7, .k = 4, .la = ROW, .lb = ROW, .lc = ROW, .alpha = 1.0};
        run_case(&e1, isa);
        gcase e2 = {.dt = dts[d], .batch = 2, .m = 3, .n = 0, .k = 4, .la = ROW, .lb = ROW, .lc = ROW, .batched = true,
                    .b_bmul = 1, .alpha = 1.0};
        run_case(&e2, isa);
    }
}

static void test_errors(void) {
    float a[6] = {0}, b[6] = {0}, c[6] = {0};
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s22[2] = {2, 2};
    nk_tensor ta = {.data = a, .dtype = NK_F32, .ndim = 2}, tb = ta, tc = ta;
    memcpy(ta.sizes, s23, sizeof s23), ta.strides[0] = 3, ta.strides[1] = 1;
    memcpy(tb.sizes, s32, sizeof s32), tb.strides[0] = 2, tb.strides[1] = 1;
    memcpy(tc.sizes, s22, sizeof s22), tc.strides[0] = 2, tc.strides[1] = 1;
    tb.data = b, tc.data = c;
    CHECK_MSG(nk_gemm(&tc, &ta, &tb, NULL, 1.0, 0.0) == NK_SUCCESS, "valid");
    nk_tensor bad = tb;
    bad.sizes[0] = 2;
    CHECK_MSG(nk_gemm(&tc, &ta, &bad, NULL, 1.0, 0.0) == NK_INVALID, "k mismatch");
    bad = ta;
    bad.ndim = 1;
    CHECK_MSG(nk_gemm(&tc, &bad, &tb, NULL, 1.0, 0.0) == NK_INVALID, "1-D");
    bad = tc;
    bad.dtype = NK_I32;
    nk_tensor ai = ta, bi = tb;
    ai.dtype = NK_I32, bi.dtype = NK_I32;
    CHECK_MSG(nk_gemm(&bad, &ai, &bi, NULL, 1.0, 0.0) == NK_UNSUPPORTED, "int32");
    ai.dtype = NK_BF16;
    CHECK_MSG(nk_gemm(&tc, &ai, &tb, NULL, 1.0, 0.0) == NK_UNSUPPORTED, "mixed dtypes");
    CHECK_MSG(nk_gemm(NULL, &ta, &tb, NULL, 1.0, 0.0) == NK_INVALID, "NULL out");
}

int main(void) {
    const char *isas[] = {"amx", "avx512bf16", "avx512", "avx2", "generic"};
    for (int threads = 1; threads <= 2; threads++) {
        nk_threads_set(threads);
        for (int i = 0; i < 5; i++) {
            if (!nk_gemm_isa_force(isas[i])) {
                printf("isa %s: not available on this CPU, skipped\n", isas[i]);
                continue;
            }
            run_isa(isas[i]);
        }
    }
    test_errors();
    printf("fma peak: %.1f GFLOP/s on %d threads (%s); AMX bf16: %s; AVX512-BF16: %s\n", nk_fma_peak_gflops(),
           nk_threads_get(), nk_gemm_isa_name(), nk_gemm_amx_available() ? "yes" : "no",
           nk_gemm_dpbf16_available() ? "yes" : "no");
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
