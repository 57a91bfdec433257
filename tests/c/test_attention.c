/*
 * test_attention.c - nk_sdpa_forward/backward against a naive double-precision reference that
 * materialises the full score matrix (written independently of the blocked kernels).
 */
#include "gemm_internal.h"
#include "kernels_internal.h"
#include "nk_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 88172645463325252ull;
static double frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

static nk_tensor t4(void *data, nk_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d) {
    nk_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.ndim = 4;
    const int64_t s[4] = {a, b, c, d};
    int64_t st = 1;
    for (int i = 3; i >= 0; i--) {
        t.sizes[i] = s[i];
        t.strides[i] = st;
        st *= s[i];
    }
    return t;
}

static nk_tensor t3(float *data, int64_t a, int64_t b, int64_t c) {
    nk_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = NK_F32;
    t.ndim = 3;
    t.sizes[0] = a;
    t.sizes[1] = b;
    t.sizes[2] = c;
    t.strides[2] = 1;
    t.strides[1] = c;
    t.strides[0] = b * c;
    return t;
}

typedef struct cfg {
    int64_t B, Hq, Hkv, Lq, Lk, D, Dv;
    bool causal;
    int mask; /* 0 none, 1 float [Lq,Lk] broadcast over B,H, 2 bool [B,1,1,Lk] */
    double p;
    nk_dtype dt;
} cfg;

static double mask_at(const cfg *c, const float *fm, const uint8_t *bm, int64_t b, int64_t i, int64_t j) {
    if (c->mask == 1) return fm[i * c->Lk + j];
    if (c->mask == 2) return bm[b * c->Lk + j] ? 0.0 : -INFINITY;
    return 0.0;
}

static float from_dt(const void *p, int64_t i, nk_dtype dt) {
    if (dt == NK_F32) return ((const float *)p)[i];
    if (dt == NK_BF16) return nk_bf16_to_f32(((const uint16_t *)p)[i]);
    return nk_f16_to_f32(((const uint16_t *)p)[i]);
}

static void to_dt(void *p, int64_t i, nk_dtype dt, float v) {
    if (dt == NK_F32) ((float *)p)[i] = v;
    else if (dt == NK_BF16) ((uint16_t *)p)[i] = nk_f32_to_bf16(v);
    else ((uint16_t *)p)[i] = nk_f32_to_f16(v);
}

static void run(const cfg *c) {
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, Lq = c->Lq, Lk = c->Lk, D = c->D, Dv = c->Dv;
    const size_t es = nk_dtype_size(c->dt);
    const int64_t nq = B * Hq * Lq * D, nk = B * Hkv * Lk * D, nv = B * Hkv * Lk * Dv, no = B * Hq * Lq * Dv;
    void *q = malloc(es * (size_t)(nq + 1)), *k = malloc(es * (size_t)(nk + 1)), *v = malloc(es * (size_t)(nv + 1));
    void *o = malloc(es * (size_t)(no + 1)), *go = malloc(es * (size_t)(no + 1));
    void *dq = malloc(es * (size_t)(nq + 1)), *dk = malloc(es * (size_t)(nk + 1)), *dv = malloc(es * (size_t)(nv + 1));
    float *lse = malloc(sizeof(float) * (size_t)(B * Hq * Lq + 1));
    float *fm = malloc(sizeof(float) * (size_t)(Lq * Lk + 1));
    uint8_t *bm = malloc((size_t)(B * Lk + 1));
    float *dmask = malloc(sizeof(float) * (size_t)(B * Hq * Lq * Lk + 1));
    for (int64_t i = 0; i < nq; i++) to_dt(q, i, c->dt, (float)frand());
    for (int64_t i = 0; i < nk; i++) to_dt(k, i, c->dt, (float)frand());
    for (int64_t i = 0; i < nv; i++) to_dt(v, i, c->dt, (float)frand());
    for (int64_t i = 0; i < no; i++) to_dt(go, i, c->dt, (float)frand());
    for (int64_t i = 0; i < Lq * Lk; i++) fm[i] = frand() > 0.8 ? -INFINITY : (float)frand();
    for (int64_t i = 0; i < B * Lk; i++) bm[i] = frand() > -0.6;
    if (B * Lk > 0) bm[0] = 0;

    nk_tensor tq = t4(q, c->dt, B, Hq, Lq, D), tk = t4(k, c->dt, B, Hkv, Lk, D), tv = t4(v, c->dt, B, Hkv, Lk, Dv);
    nk_tensor to = t4(o, c->dt, B, Hq, Lq, Dv), tgo = t4(go, c->dt, B, Hq, Lq, Dv);
    nk_tensor tdq = t4(dq, c->dt, B, Hq, Lq, D), tdk = t4(dk, c->dt, B, Hkv, Lk, D), tdv = t4(dv, c->dt, B, Hkv, Lk, Dv);
    nk_tensor tl = t3(lse, B, Hq, Lq);
    nk_tensor tdm = t4(dmask, NK_F32, B, Hq, Lq, Lk);
    nk_tensor tm;
    if (c->mask == 1) { /* [Lq, Lk] broadcast: strides 0 on B and H */
        tm = t4(fm, NK_F32, B, Hq, Lq, Lk);
        tm.strides[0] = tm.strides[1] = 0;
    } else if (c->mask == 2) { /* [B, 1, 1, Lk] */
        tm = t4(bm, NK_BOOL, B, Hq, Lq, Lk);
        tm.strides[0] = Lk;
        tm.strides[1] = tm.strides[2] = 0;
    }
    const double scale = 1.0 / sqrt((double)(D > 0 ? D : 1));
    nk_sdpa_args a = {.q = &tq, .k = &tk, .v = &tv, .mask = c->mask ? &tm : NULL, .scale = scale,
                      .causal = c->causal, .dropout_p = c->p, .seed = 1234, .offset = 8};
    nk_status st = nk_sdpa_forward(&a, &to, &tl);
    CHECK_MSG(st == NK_SUCCESS, "forward status %d", (int)st);
    st = nk_sdpa_backward(&a, &to, &tl, &tgo, &tdq, &tdk, &tdv, c->mask == 1 ? &tdm : NULL);
    CHECK_MSG(st == NK_SUCCESS, "backward status %d", (int)st);

    const double tol = c->dt == NK_F32 ? 2e-4 : (c->dt == NK_BF16 ? 3e-2 : 5e-3);
    const double keep = 1.0 - c->p, ks = keep > 0 ? 1.0 / keep : 0.0;
    double *P = malloc(sizeof(double) * (size_t)(Lk + 1)), *Z = malloc(sizeof(double) * (size_t)(Lk + 1));
    double *dP = malloc(sizeof(double) * (size_t)(Lk + 1));
    double *rdk = calloc((size_t)(nk + 1), sizeof(double)), *rdv = calloc((size_t)(nv + 1), sizeof(double));
    double maxerr = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / (Hq / Hkv);
            for (int64_t i = 0; i < Lq; i++) {
                const int64_t qrow = ((b * Hq + h) * Lq + i) * D, orow = ((b * Hq + h) * Lq + i) * Dv;
                double mx = -INFINITY;
                for (int64_t j = 0; j < Lk; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < D; d++)
                        s += (double)from_dt(q, qrow + d, c->dt) * from_dt(k, ((b * Hkv + hk) * Lk + j) * D + d, c->dt);
                    s = s * scale + mask_at(c, fm, bm, b, i, j);
                    if (c->causal && j > i) s = -INFINITY;
                    P[j] = s;
                    if (s > mx) mx = s;
                    const uint64_t w = 8 + (uint64_t)(((b * Hq + h) * Lq + i) * Lk + j);
                    Z[j] = c->p > 0 ? ((double)nk_philox_word(1234, w) * 0x1.0p-32 < keep ? ks : 0.0) : 1.0;
                }
                double sum = 0;
                for (int64_t j = 0; j < Lk; j++) {
                    P[j] = mx == -INFINITY ? 0.0 : exp(P[j] - mx);
                    sum += P[j];
                }
                for (int64_t j = 0; j < Lk; j++) P[j] = sum > 0 ? P[j] / sum : 0.0;
                const double rl = sum > 0 ? mx + log(sum) : -INFINITY;
                const float gl = lse[(b * Hq + h) * Lq + i];
                CHECK_MSG(rl == -INFINITY ? gl == -INFINITY : fabs(gl - rl) < 1e-3 * (1 + fabs(rl)), "lse %g vs %g", gl, rl);
                double Di = 0;
                for (int64_t d = 0; d < Dv; d++) {
                    double r = 0;
                    for (int64_t j = 0; j < Lk; j++)
                        r += P[j] * Z[j] * from_dt(v, ((b * Hkv + hk) * Lk + j) * Dv + d, c->dt);
                    const double got = from_dt(o, orow + d, c->dt);
                    const double err = fabs(got - r);
                    if (err > maxerr) maxerr = err;
                    CHECK_MSG(err <= tol * (1 + fabs(r)), "out[%lld,%lld,%lld,%lld] %g vs %g", (long long)b,
                              (long long)h, (long long)i, (long long)d, got, r);
                    Di += r * from_dt(go, orow + d, c->dt);
                }
                for (int64_t j = 0; j < Lk; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < Dv; d++)
                        s += (double)from_dt(go, orow + d, c->dt) * from_dt(v, ((b * Hkv + hk) * Lk + j) * Dv + d, c->dt);
                    dP[j] = P[j] * (s * Z[j] - Di);
                    for (int64_t d = 0; d < Dv; d++)
                        rdv[((b * Hkv + hk) * Lk + j) * Dv + d] += P[j] * Z[j] * from_dt(go, orow + d, c->dt);
                    for (int64_t d = 0; d < D; d++)
                        rdk[((b * Hkv + hk) * Lk + j) * D + d] += dP[j] * scale * from_dt(q, qrow + d, c->dt);
                    if (c->mask == 1) {
                        const float g = dmask[((b * Hq + h) * Lq + i) * Lk + j];
                        CHECK_MSG(fabs(g - dP[j]) <= tol * 5 * (1 + fabs(dP[j])), "dmask %g vs %g", g, dP[j]);
                    }
                }
                for (int64_t d = 0; d < D; d++) {
                    double r = 0;
                    for (int64_t j = 0; j < Lk; j++) r += dP[j] * scale * from_dt(k, ((b * Hkv + hk) * Lk + j) * D + d, c->dt);
                    const double got = from_dt(dq, qrow + d, c->dt);
                    CHECK_MSG(fabs(got - r) <= tol * 5 * (1 + fabs(r)), "dq %g vs %g", got, r);
                }
            }
        }
    for (int64_t i = 0; i < nk; i++)
        CHECK_MSG(fabs(from_dt(dk, i, c->dt) - rdk[i]) <= tol * 5 * (1 + fabs(rdk[i])), "dk[%lld] %g vs %g",
                  (long long)i, from_dt(dk, i, c->dt), rdk[i]);
    for (int64_t i = 0; i < nv; i++)
        CHECK_MSG(fabs(from_dt(dv, i, c->dt) - rdv[i]) <= tol * 5 * (1 + fabs(rdv[i])), "dv[%lld] %g vs %g",
                  (long long)i, from_dt(dv, i, c->dt), rdv[i]);
    free(q); free(k); free(v); free(o); free(go); free(dq); free(dk); free(dv); free(lse); free(fm); free(bm);
    free(dmask); free(P); free(Z); free(dP); free(rdk); free(rdv);
}

static void test_invalid(void) {
    float buf[64] = {0};
    nk_tensor q = t4(buf, NK_F32, 1, 3, 2, 4), k = t4(buf, NK_F32, 1, 2, 2, 4), v = t4(buf, NK_F32, 1, 2, 2, 4);
    nk_tensor o = t4(buf, NK_F32, 1, 3, 2, 4), l = t3(buf, 1, 3, 2);
    nk_sdpa_args a = {.q = &q, .k = &k, .v = &v, .scale = 1.0};
    CHECK_MSG(nk_sdpa_forward(&a, &o, &l) == NK_INVALID, "Hq not a multiple of Hkv");
    nk_tensor q64 = t4(buf, NK_F64, 1, 2, 2, 4);
    nk_tensor o64 = t4(buf, NK_F64, 1, 2, 2, 4);
    a.q = &q64;
    CHECK_MSG(nk_sdpa_forward(&a, &o64, &l) == NK_UNSUPPORTED, "float64");
}

int main(void) {
    nk_threads_set(2);
    const cfg cases[] = {
        {1, 2, 2, 5, 7, 8, 8, false, 0, 0.0, NK_F32},
        {2, 4, 2, 70, 130, 80, 80, true, 0, 0.0, NK_F32},    /* GQA, causal, several blocks, D=80 */
        {1, 3, 1, 1, 150, 64, 64, false, 2, 0.0, NK_F32},     /* decode, bool mask [B,1,1,Lk] */
        {2, 2, 2, 3, 67, 32, 48, false, 2, 0.0, NK_F32},      /* Dv != D, few rows (gemv path) */
        {1, 2, 1, 66, 66, 96, 96, false, 1, 0.0, NK_F32},     /* float mask with -inf, broadcast */
        {1, 2, 2, 20, 9, 24, 24, true, 0, 0.0, NK_F32},       /* causal with Lq > Lk */
        {1, 2, 2, 9, 20, 16, 16, true, 1, 0.3, NK_F32},       /* dropout + mask + causal */
        /* wide heads: the products' contraction runs in several passes over K (and N = 272) */
        {1, 2, 1, 70, 90, 200, 272, true, 0, 0.0, NK_F32},
        {1, 2, 1, 33, 40, 64, 64, true, 0, 0.0, NK_BF16},
        /* bf16 prefill runs on AMX tiles where the CPU has them; the same cases again below without. */
        {2, 4, 2, 70, 130, 80, 80, true, 0, 0.0, NK_BF16},   /* GQA, causal, several blocks, D=80 */
        {1, 3, 1, 1, 150, 64, 64, false, 2, 0.0, NK_BF16},   /* decode: key/value rows read as bf16 */
        {2, 2, 2, 17, 67, 32, 48, false, 2, 0.0, NK_BF16},   /* Dv != D */
        {2, 2, 2, 3, 67, 32, 64, false, 2, 0.0, NK_BF16},    /* few rows: dots and values from bf16 rows */
        {1, 4, 2, 5, 100, 64, 64, true, 0, 0.0, NK_BF16},    /* vector path, values from bf16 rows */
        {1, 2, 1, 66, 66, 96, 96, false, 1, 0.0, NK_BF16},   /* float mask with -inf, broadcast */
        {1, 2, 2, 20, 9, 24, 24, true, 0, 0.0, NK_BF16},     /* causal with Lq > Lk */
        {1, 2, 2, 19, 20, 16, 16, true, 1, 0.3, NK_BF16},    /* dropout + mask + causal */
        {1, 2, 1, 70, 90, 200, 272, false, 0, 0.0, NK_BF16},  /* wide heads */
        /* causal over several 256-key blocks with a partial last one: rows cut short inside a block */
        {1, 2, 1, 600, 600, 64, 64, true, 0, 0.0, NK_BF16},
        {1, 1, 1, 300, 530, 32, 32, true, 0, 0.0, NK_BF16},  /* Lk > Lq: later keys past every row */
        {1, 2, 2, 5, 40, 128, 128, false, 2, 0.0, NK_F16},
        /* head dims that are not a multiple of 16: the 8-wide strips of the AVX2 products and the
         * contraction over D real dims only (row counts past a 12- and 6-row tile, partial key blocks) */
        {1, 2, 1, 77, 70, 40, 40, false, 0, 0.0, NK_F32},
        {1, 2, 2, 70, 77, 72, 72, true, 0, 0.0, NK_F32},
        {1, 1, 1, 65, 66, 80, 80, false, 1, 0.0, NK_F32},
        {1, 2, 1, 23, 35, 20, 20, false, 2, 0.0, NK_F32},
        {1, 1, 1, 19, 33, 8, 8, true, 0, 0.0, NK_F32},
        {1, 1, 1, 17, 18, 1, 1, false, 0, 0.0, NK_F32},
        {1, 1, 1, 31, 29, 40, 24, false, 0, 0.3, NK_F32},     /* Dv != D, dropout */
        {1, 1, 1, 64, 130, 512, 512, false, 0, 0.0, NK_F32},  /* wide head */
        {1, 2, 1, 77, 70, 40, 40, true, 0, 0.0, NK_F16},
        {1, 2, 1, 77, 70, 40, 40, false, 1, 0.0, NK_BF16},
        /* the dot products' row tiles (12, 8, 4) past a 64-row block, head dims 40 and 80 */
        {2, 2, 1, 77, 300, 80, 80, false, 0, 0.0, NK_BF16},
        {1, 3, 3, 135, 90, 40, 40, true, 0, 0.0, NK_BF16},
        {1, 1, 1, 66, 33, 8, 8, false, 0, 0.0, NK_BF16},
        {1, 1, 1, 4, 0, 8, 8, false, 0, 0.0, NK_F32},          /* no keys */
        {1, 1, 1, 0, 5, 8, 8, false, 0, 0.0, NK_F32},          /* no queries */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run(&cases[i]);
    /* bf16 on each other path this CPU has: AVX512-BF16 dot products (the default without AMX), and rows
     * widened to fp32 FMAs. */
    const char *const others[] = {"avx512bf16", "avx512"};
    for (int o = 0; o < 2; o++)
        if (nk_gemm_isa_force(others[o]))
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
                if (cases[i].dt == NK_BF16) run(&cases[i]);
    if (!nk_gemm_isa_force("amx") && !nk_gemm_isa_force("avx512bf16")) nk_gemm_isa_force("avx512");
    nk_threads_set(1);
    run(&cases[1]);
    test_invalid();
    printf("test_attention: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
