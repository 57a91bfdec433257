/*
 * test_reduce.c - unit tests for the reduction, softmax, norm and nll_loss kernels against plain
 * reference loops in double: odd sizes (SIMD tails), strides (transposed and negative), 0-size,
 * NaN propagation, f32/bf16/f16/f64 and integer dtypes.
 */
#include "neuron_kernels.h"
#include "reduce_simd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_checks, g_failures;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        g_checks++;                                                                        \
        if (!(cond)) {                                                                     \
            g_failures++;                                                                  \
            if (g_failures <= 40) {                                                        \
                fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);   \
                fprintf(stderr, __VA_ARGS__);                                              \
                fprintf(stderr, "\n");                                                     \
            }                                                                              \
        }                                                                                  \
    } while (0)

static uint64_t g_rng = 0x1234567;
static double rnd(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) / 9007199254740992.0 * 4.0 - 2.0;
}

static nk_tensor tensor(void *data, nk_dtype t, int32_t ndim, const int64_t *sizes, const int64_t *strides) {
    nk_tensor x;
    memset(&x, 0, sizeof x);
    x.data = data;
    x.dtype = t;
    x.ndim = ndim;
    for (int32_t d = 0; d < ndim; d++) {
        x.sizes[d] = sizes[d];
        x.strides[d] = strides[d];
    }
    return x;
}

/* Element i of a buffer of dtype t as double, and back. */
static double get(const void *p, nk_dtype t, int64_t i) {
    switch (t) {
    case NK_F32: return ((const float *)p)[i];
    case NK_F64: return ((const double *)p)[i];
    case NK_BF16: return nk_bf16_to_f32(((const uint16_t *)p)[i]);
    case NK_F16: return nk_f16_to_f32(((const uint16_t *)p)[i]);
    case NK_I32: return ((const int32_t *)p)[i];
    case NK_I64: return (double)((const int64_t *)p)[i];
    case NK_U8:
    case NK_BOOL: return ((const uint8_t *)p)[i];
    default: return 0;
    }
}
static void set(void *p, nk_dtype t, int64_t i, double v) {
    switch (t) {
    case NK_F32: ((float *)p)[i] = (float)v; break;
    case NK_F64: ((double *)p)[i] = v; break;
    case NK_BF16: ((uint16_t *)p)[i] = nk_f32_to_bf16((float)v); break;
    case NK_F16: ((uint16_t *)p)[i] = nk_f32_to_f16((float)v); break;
    case NK_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case NK_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case NK_U8:
    case NK_BOOL: ((uint8_t *)p)[i] = (uint8_t)v; break;
    default: break;
    }
}

static double tol(nk_dtype t) {
    return t == NK_BF16 ? 2e-2 : t == NK_F16 ? 2e-3 : t == NK_F32 ? 2e-5 : 1e-10;
}

static bool near(double got, double want, nk_dtype t) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return fabs(got - want) <= tol(t) * (1 + fabs(want));
}

static const nk_dtype FLOATS[] = {NK_F32, NK_BF16, NK_F16, NK_F64};

/* A [R, C] matrix stored transposed when `trans` (column-major), reduced over dim `rd` (0 or 1). */
static void test_reduce_matrix(nk_dtype t, int64_t R, int64_t C, bool trans, int rd) {
    const size_t es = nk_dtype_size(t);
    double *ref = malloc(sizeof(double) * (size_t)(R * C + 1));
    char *buf = malloc(es * (size_t)(R * C + 1));
    for (int64_t i = 0; i < R * C; i++) {
        set(buf, t, i, rnd());
        ref[i] = get(buf, t, i);
    }
    if (R * C > 3) {
        set(buf, t, 3, NAN); /* a NaN in one row/column */
        ref[3] = NAN;
    }
    int64_t sizes[2] = {R, C}, strides[2] = {trans ? 1 : C, trans ? R : 1};
    nk_tensor in = tensor(buf, t, 2, sizes, strides);
    const int64_t nout = rd == 0 ? C : R, nred = rd == 0 ? R : C;
    void *out = malloc(es * (size_t)(nout + 1)), *out2 = malloc(sizeof(int64_t) * (size_t)(nout + 1));
    int64_t osz[2] = {rd == 0 ? 1 : R, rd == 0 ? C : 1}, ost[2] = {rd == 0 ? 0 : 1, rd == 0 ? 1 : 0};
    nk_tensor o = tensor(out, t, 2, osz, ost), oi = tensor(out2, NK_I64, 2, osz, ost);
    const uint64_t dims = 1u << rd;
#define ELEM(q, k) (rd == 0 ? ref[(k) * (trans ? 1 : C) + (q) * (trans ? R : 1)] : ref[(q) * (trans ? 1 : C) + (k) * (trans ? R : 1)])
    for (int op = 0; op < 4; op++) {
        static const nk_reduce_op ops[] = {NK_REDUCE_SUM, NK_REDUCE_MEAN, NK_REDUCE_AMAX, NK_REDUCE_LOGSUMEXP};
        nk_status st = nk_reduce(&o, &in, dims, ops[op]);
        CHECK(st == NK_SUCCESS, "reduce op %d dtype %s", op, nk_dtype_name(t));
        for (int64_t q = 0; q < nout; q++) {
            double s = 0, m = -INFINITY;
            bool nan = false;
            for (int64_t k = 0; k < nred; k++) {
                const double v = ELEM(q, k);
                s += v;
                nan |= isnan(v);
                if (v > m) m = v;
            }
            if (nan) m = NAN;
            double want = s;
            if (ops[op] == NK_REDUCE_MEAN) want = s / (double)nred;
            if (ops[op] == NK_REDUCE_AMAX) want = m;
            if (ops[op] == NK_REDUCE_LOGSUMEXP) {
                double e = 0;
                for (int64_t k = 0; k < nred; k++) e += exp(ELEM(q, k) - m);
                want = log(e) + m;
            }
            const double got = get(out, t, q);
            CHECK(near(got, want, t), "op %d %s R=%lld C=%lld trans=%d rd=%d q=%lld got %g want %g", op,
                  nk_dtype_name(t), (long long)R, (long long)C, trans, rd, (long long)q, got, want);
        }
    }
    /* max with index: first occurrence, NaN wins. */
    CHECK(nk_reduce_arg(&o, &oi, &in, dims, true) == NK_SUCCESS, "arg");
    for (int64_t q = 0; q < nout; q++) {
        int64_t bi = 0;
        for (int64_t k = 1; k < nred; k++) {
            const double b = ELEM(q, bi), v = ELEM(q, k);
            if (isnan(b)) break;
            if (isnan(v) || v > b) bi = k;
        }
        CHECK(((int64_t *)out2)[q] == bi, "argmax %s q=%lld got %lld want %lld", nk_dtype_name(t), (long long)q,
              (long long)((int64_t *)out2)[q], (long long)bi);
    }
    /* var with correction 1 */
    CHECK(nk_reduce_var(&o, NULL, &in, dims, 1.0, false) == NK_SUCCESS, "var");
    for (int64_t q = 0; q < nout; q++) {
        double mu = 0, m2 = 0;
        for (int64_t k = 0; k < nred; k++) mu += ELEM(q, k);
        mu /= (double)nred;
        for (int64_t k = 0; k < nred; k++) m2 += (ELEM(q, k) - mu) * (ELEM(q, k) - mu);
        const double want = m2 / (double)(nred - 1); /* 0/0 = nan, x/0 = inf, as PyTorch */
        CHECK(near(get(out, t, q), want, t), "var %s q=%lld got %g want %g", nk_dtype_name(t), (long long)q,
              get(out, t, q), want);
    }
#undef ELEM
    free(ref);
    free(buf);
    free(out);
    free(out2);
}

static void test_reductions(void) {
    /* {300, 1100}: column sums over several cascade levels, more columns than one block, a ragged tail. */
    static const int64_t sizes[][2] = {{1, 1}, {3, 5}, {7, 33}, {2, 1000}, {17, 4}, {1, 5000}, {300, 1100}};
    for (size_t f = 0; f < sizeof FLOATS / sizeof FLOATS[0]; f++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (int trans = 0; trans < 2; trans++)
                for (int rd = 0; rd < 2; rd++) test_reduce_matrix(FLOATS[f], sizes[s][0], sizes[s][1], trans, rd);
    /* Integer sums accumulate in int64 and wrap. */
    int32_t xi[5] = {INT32_MAX, INT32_MAX, -3, 4, 5};
    int64_t n5 = 5, s1 = 1, one = 1, s0 = 0, sum = 0;
    nk_tensor in = tensor(xi, NK_I32, 1, &n5, &s1), out = tensor(&sum, NK_I64, 1, &one, &s0);
    CHECK(nk_reduce(&out, &in, 1, NK_REDUCE_SUM) == NK_SUCCESS, "int sum");
    CHECK(sum == 2 * (int64_t)INT32_MAX + 6, "int sum %lld", (long long)sum);
    /* Negative stride (a flipped view): data pointer at the last element. */
    float xf[6] = {1, 2, 3, 4, 5, 6}, amax = 0;
    int64_t n6 = 6, sneg = -1, idx = -1;
    nk_tensor flip = tensor(xf + 5, NK_F32, 1, &n6, &sneg), o1 = tensor(&amax, NK_F32, 1, &one, &s0);
    nk_tensor oi = tensor(&idx, NK_I64, 1, &one, &s0);
    CHECK(nk_reduce_arg(&o1, &oi, &flip, 1, true) == NK_SUCCESS && amax == 6 && idx == 0, "flip argmax %g %lld",
          amax, (long long)idx);
    /* any/all: NaN is true, -0.0 false. */
    float xa[3] = {-0.0f, NAN, 0.0f};
    uint8_t b = 7;
    int64_t n3 = 3;
    nk_tensor ina = tensor(xa, NK_F32, 1, &n3, &s1), ob = tensor(&b, NK_BOOL, 1, &one, &s0);
    CHECK(nk_reduce(&ob, &ina, 1, NK_REDUCE_ANY) == NK_SUCCESS && b == 1, "any");
    CHECK(nk_reduce(&ob, &ina, 1, NK_REDUCE_ALL) == NK_SUCCESS && b == 0, "all");
    /* 0-size reduction: sum 0, any false; amax refuses. */
    int64_t n0 = 0;
    float fsum = 5;
    nk_tensor empty = tensor(xf, NK_F32, 1, &n0, &s1), of = tensor(&fsum, NK_F32, 1, &one, &s0);
    CHECK(nk_reduce(&of, &empty, 1, NK_REDUCE_SUM) == NK_SUCCESS && fsum == 0, "empty sum %g", fsum);
    CHECK(nk_reduce(&of, &empty, 1, NK_REDUCE_AMAX) == NK_INVALID, "empty amax");
    /* Shape mismatch and bad dims are rejected. */
    int64_t two = 2;
    nk_tensor bad = tensor(&fsum, NK_F32, 1, &two, &s1);
    CHECK(nk_reduce(&bad, &in, 1, NK_REDUCE_SUM) == NK_INVALID, "bad out");
    CHECK(nk_reduce(&out, &in, 2, NK_REDUCE_SUM) == NK_INVALID, "bad dims");
    /* amax/amin of integers up to 32 bits are exact; int64 (beyond a double's mantissa) is left to the
     * caller. */
    int32_t im = 0;
    nk_tensor oim = tensor(&im, NK_I32, 1, &one, &s0);
    CHECK(nk_reduce(&oim, &in, 1, NK_REDUCE_AMAX) == NK_SUCCESS && im == INT32_MAX, "int32 amax %d", im);
    xi[2] = INT32_MIN;
    CHECK(nk_reduce(&oim, &in, 1, NK_REDUCE_AMIN) == NK_SUCCESS && im == INT32_MIN, "int32 amin %d", im);
    int8_t xb[4] = {-128, 127, 3, -5}, bm = 0;
    nk_tensor inb = tensor(xb, NK_I8, 1, &(int64_t){4}, &s1), obm = tensor(&bm, NK_I8, 1, &one, &s0);
    CHECK(nk_reduce(&obm, &inb, 1, NK_REDUCE_AMIN) == NK_SUCCESS && bm == -128, "int8 amin %d", bm);
    int64_t l[2] = {INT64_MAX, INT64_MAX - 1}, lm = 0;
    nk_tensor inl = tensor(l, NK_I64, 1, &two, &s1), olm = tensor(&lm, NK_I64, 1, &one, &s0);
    CHECK(nk_reduce(&olm, &inl, 1, NK_REDUCE_AMAX) == NK_UNSUPPORTED, "int64 amax");
}

static void test_cumsum(void) {
    for (size_t f = 0; f < 4; f++) {
        const nk_dtype t = FLOATS[f];
        const size_t es = nk_dtype_size(t);
        int64_t sz[2] = {5, 37}, st[2] = {1, 5};
        char *in = malloc(es * 185), *out = malloc(es * 185);
        for (int i = 0; i < 185; i++) set(in, t, i, rnd());
        nk_tensor a = tensor(in, t, 2, sz, st), b = tensor(out, t, 2, sz, st);
        CHECK(nk_cumsum(&b, &a, 1) == NK_SUCCESS, "cumsum");
        for (int r = 0; r < 5; r++) {
            double acc = 0;
            for (int k = 0; k < 37; k++) {
                acc += get(in, t, r + 5 * k);
                CHECK(near(get(out, t, r + 5 * k), acc, t), "cumsum %s", nk_dtype_name(t));
            }
        }
        free(in);
        free(out);
    }
}

static void test_softmax(void) {
    static const int64_t lens[] = {1, 7, 16, 33, 1000, 5000};
    for (size_t f = 0; f < 3; f++) {
        const nk_dtype t = FLOATS[f];
        const size_t es = nk_dtype_size(t);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int64_t n = lens[li];
            for (int lg = 0; lg < 2; lg++) {
                /* [3, n] softmax over dim 1, and the transposed layout over dim 0 of [n, 3]. */
                for (int trans = 0; trans < 2; trans++) {
                    char *in = malloc(es * (size_t)(3 * n)), *out = malloc(es * (size_t)(3 * n));
                    char *g = malloc(es * (size_t)(3 * n)), *gi = malloc(es * (size_t)(3 * n));
                    for (int64_t i = 0; i < 3 * n; i++) {
                        set(in, t, i, rnd() * 5);
                        set(g, t, i, rnd());
                    }
                    if (n > 3) set(in, t, 2, NAN); /* row 0 (or column 2) becomes NaN */
                    int64_t sz[2], stv[2];
                    int32_t dim;
                    if (!trans) {
                        sz[0] = 3, sz[1] = n, stv[0] = n, stv[1] = 1, dim = 1;
                    } else {
                        sz[0] = n, sz[1] = 3, stv[0] = 1, stv[1] = n, dim = 0;
                    }
                    nk_tensor a = tensor(in, t, 2, sz, stv), b = tensor(out, t, 2, sz, stv);
                    CHECK(nk_softmax(&b, &a, dim, lg) == NK_SUCCESS, "softmax");
                    nk_tensor gt = tensor(g, t, 2, sz, stv), git = tensor(gi, t, 2, sz, stv);
                    CHECK(nk_softmax_backward(&git, &gt, &b, dim, lg) == NK_SUCCESS, "softmax bwd");
                    /* rows are contiguous blocks of n in memory in both layouts */
                    for (int64_t r = 0; r < 3; r++) {
                        const int64_t o = r * n;
                        double m = -INFINITY, s = 0;
                        bool nan = false;
                        for (int64_t k = 0; k < n; k++) {
                            const double v = get(in, t, o + k);
                            nan |= isnan(v);
                            if (v > m) m = v;
                        }
                        if (nan) m = NAN;
                        for (int64_t k = 0; k < n; k++) s += exp(get(in, t, o + k) - m);
                        double dot = 0;
                        for (int64_t k = 0; k < n; k++) {
                            const double y = get(out, t, o + k), gg = get(g, t, o + k);
                            dot += lg ? gg : gg * y;
                        }
                        for (int64_t k = 0; k < n; k++) {
                            const double x = get(in, t, o + k);
                            const double want = lg ? x - m - log(s) : exp(x - m) / s;
                            CHECK(near(get(out, t, o + k), want, t), "softmax %s n=%lld log=%d trans=%d got %g want %g",
                                  nk_dtype_name(t), (long long)n, lg, trans, get(out, t, o + k), want);
                            const double y = get(out, t, o + k), gg = get(g, t, o + k);
                            const double wg = lg ? gg - exp(y) * dot : y * (gg - dot);
                            CHECK(near(get(gi, t, o + k), wg, t) || fabs(get(gi, t, o + k) - wg) < 4 * tol(t) * (1 + fabs(dot)),
                                  "softmax bwd %s n=%lld got %g want %g", nk_dtype_name(t), (long long)n,
                                  get(gi, t, o + k), wg);
                        }
                    }
                    free(in);
                    free(out);
                    free(g);
                    free(gi);
                }
            }
        }
    }
    /* 0-size and f64 (left to the caller). */
    int64_t z[2] = {0, 5}, zs[2] = {5, 1};
    float dummy;
    nk_tensor e = tensor(&dummy, NK_F32, 2, z, zs);
    CHECK(nk_softmax(&e, &e, 1, false) == NK_SUCCESS, "empty softmax");
    double d[2];
    int64_t two = 2, one = 1;
    nk_tensor dd = tensor(d, NK_F64, 1, &two, &one);
    CHECK(nk_softmax(&dd, &dd, 0, false) == NK_UNSUPPORTED, "f64 softmax");
}

static void test_norms(void) {
    static const int64_t Ns[] = {1, 7, 33, 768, 2500};
    for (size_t f = 0; f < 3; f++) {
        const nk_dtype t = FLOATS[f];
        const size_t es = nk_dtype_size(t);
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
            const int64_t M = 3, N = Ns[ni];
            char *x = malloc(es * (size_t)(M * N)), *y = malloc(es * (size_t)(M * N)), *w = malloc(es * (size_t)N);
            char *b = malloc(es * (size_t)N), *dy = malloc(es * (size_t)(M * N)), *dx = malloc(es * (size_t)(M * N));
            char *dw = malloc(es * (size_t)N), *db = malloc(es * (size_t)N);
            float mean[3], rstd[3];
            for (int64_t i = 0; i < M * N; i++) {
                set(x, t, i, rnd() * 2 + 1);
                set(dy, t, i, rnd());
            }
            for (int64_t i = 0; i < N; i++) {
                set(w, t, i, rnd());
                set(b, t, i, rnd());
            }
            int64_t mn = M * N, s1 = 1, m3 = M;
            nk_tensor X = tensor(x, t, 1, &mn, &s1), Y = tensor(y, t, 1, &mn, &s1), W = tensor(w, t, 1, &N, &s1);
            nk_tensor B = tensor(b, t, 1, &N, &s1), MU = tensor(mean, NK_F32, 1, &m3, &s1);
            nk_tensor RS = tensor(rstd, NK_F32, 1, &m3, &s1), DY = tensor(dy, t, 1, &mn, &s1);
            nk_tensor DX = tensor(dx, t, 1, &mn, &s1), DW = tensor(dw, t, 1, &N, &s1), DB = tensor(db, t, 1, &N, &s1);
            for (int rms = 0; rms < 2; rms++) {
                nk_status st = rms ? nk_rms_norm(&Y, &RS, &X, &W, M, N, 1e-5)
                                   : nk_layer_norm(&Y, &MU, &RS, &X, &W, &B, M, N, 1e-5);
                CHECK(st == NK_SUCCESS, "norm fwd");
                st = rms ? nk_rms_norm_backward(&DX, &DW, &DY, &X, &RS, &W, M, N)
                         : nk_layer_norm_backward(&DX, &DW, &DB, &DY, &X, &MU, &RS, &W, M, N);
                CHECK(st == NK_SUCCESS, "norm bwd");
                double rdw[2500] = {0}, rdb[2500] = {0};
                for (int64_t r = 0; r < M; r++) {
                    double mu = 0, var = 0;
                    for (int64_t k = 0; k < N; k++) mu += get(x, t, r * N + k);
                    mu = rms ? 0 : mu / (double)N;
                    for (int64_t k = 0; k < N; k++) var += (get(x, t, r * N + k) - mu) * (get(x, t, r * N + k) - mu);
                    var /= (double)N;
                    const double rs = 1 / sqrt(var + 1e-5);
                    CHECK(near(rstd[r], rs, NK_F32) || fabs(rstd[r] - rs) < 1e-4 * rs, "rstd %g %g", rstd[r], rs);
                    double sg = 0, sgx = 0;
                    for (int64_t k = 0; k < N; k++) {
                        const double xh = (get(x, t, r * N + k) - mu) * rs;
                        const double want = xh * get(w, t, k) + (rms ? 0 : get(b, t, k));
                        CHECK(near(get(y, t, r * N + k), want, t), "norm %s rms=%d N=%lld got %g want %g", nk_dtype_name(t),
                              rms, (long long)N, get(y, t, r * N + k), want);
                        const double g = get(dy, t, r * N + k) * get(w, t, k);
                        sg += g;
                        sgx += g * xh;
                        rdw[k] += get(dy, t, r * N + k) * xh;
                        rdb[k] += get(dy, t, r * N + k);
                    }
                    for (int64_t k = 0; k < N; k++) {
                        const double xh = (get(x, t, r * N + k) - mu) * rs;
                        const double g = get(dy, t, r * N + k) * get(w, t, k);
                        const double want = rs * (g - (rms ? 0 : sg / (double)N) - xh * sgx / (double)N);
                        CHECK(near(get(dx, t, r * N + k), want, t) ||
                                  fabs(get(dx, t, r * N + k) - want) < 8 * tol(t) * (1 + fabs(sgx) / (double)N * rs),
                              "norm dx %s rms=%d N=%lld got %g want %g", nk_dtype_name(t), rms, (long long)N,
                              get(dx, t, r * N + k), want);
                    }
                }
                for (int64_t k = 0; k < N; k++) {
                    CHECK(near(get(dw, t, k), rdw[k], t), "dw %s", nk_dtype_name(t));
                    if (!rms) CHECK(near(get(db, t, k), rdb[k], t), "db %s", nk_dtype_name(t));
                }
            }
            /* group norm: [1, 3 channels, N] in 3 groups equals a per-row layer norm with per-channel affine */
            float gm[3], gr[3];
            nk_tensor GM = tensor(gm, NK_F32, 1, &m3, &s1), GR = tensor(gr, NK_F32, 1, &m3, &s1);
            nk_tensor W3 = tensor(w, t, 1, &m3, &s1), B3 = tensor(b, t, 1, &m3, &s1);
            if (N >= 3) {
                CHECK(nk_group_norm(&Y, &GM, &GR, &X, &W3, &B3, 1, 3, N, 3, 1e-5) == NK_SUCCESS, "gn");
                for (int64_t r = 0; r < 3; r++) {
                    double mu = 0, var = 0;
                    for (int64_t k = 0; k < N; k++) mu += get(x, t, r * N + k);
                    mu /= (double)N;
                    for (int64_t k = 0; k < N; k++) var += (get(x, t, r * N + k) - mu) * (get(x, t, r * N + k) - mu);
                    const double rs = 1 / sqrt(var / (double)N + 1e-5);
                    for (int64_t k = 0; k < N; k++) {
                        const double want = (get(x, t, r * N + k) - mu) * rs * get(w, t, r) + get(b, t, r);
                        CHECK(near(get(y, t, r * N + k), want, t), "gn %s got %g want %g", nk_dtype_name(t),
                              get(y, t, r * N + k), want);
                    }
                }
                CHECK(nk_group_norm_backward(&DX, NULL, NULL, &DY, &X, &GM, &GR, &W3, 1, 3, N, 3) == NK_SUCCESS, "gnb");
            }
            free(x), free(y), free(w), free(b), free(dy), free(dx), free(dw), free(db);
        }
    }
}

static void test_nll(void) {
    float x[12];
    for (int i = 0; i < 12; i++) x[i] = (float)rnd();
    int64_t tg[4] = {0, 2, -100, 1}, sz[2] = {4, 3}, st[2] = {3, 1}, n4 = 4, s1 = 1, s0 = 0, one = 1, bad = 0;
    float w[3] = {0.5f, 2.0f, 1.5f}, out, tw;
    int64_t n3 = 3;
    nk_tensor in = tensor(x, NK_F32, 2, sz, st), t = tensor(tg, NK_I64, 1, &n4, &s1), W = tensor(w, NK_F32, 1, &n3, &s1);
    nk_tensor o = tensor(&out, NK_F32, 0, &one, &s0), T = tensor(&tw, NK_F32, 0, &one, &s0);
    CHECK(nk_nll_loss(&o, &T, &in, &t, &W, 1, -100, &bad) == NK_SUCCESS, "nll");
    const double want_tw = 0.5 + 1.5 + 2.0;
    const double want = -(0.5 * x[0] + 1.5 * x[5] + 2.0 * x[10]) / want_tw;
    CHECK(near(tw, want_tw, NK_F32) && near(out, want, NK_F32), "nll %g %g", out, want);
    float gi[12], go = 2.0f;
    nk_tensor GI = tensor(gi, NK_F32, 2, sz, st), GO = tensor(&go, NK_F32, 0, &one, &s0);
    CHECK(nk_nll_loss_backward(&GI, &GO, &t, &W, 1, -100, &T, &bad) == NK_SUCCESS, "nll bwd");
    CHECK(near(gi[0], -0.5 * 2 / want_tw, NK_F32) && gi[1] == 0 && gi[6] == 0 && near(gi[10], -2.0 * 2 / want_tw, NK_F32),
          "nll bwd values");
    tg[2] = 3;
    CHECK(nk_nll_loss(&o, &T, &in, &t, &W, 1, -100, &bad) == NK_INVALID && bad == 3, "nll bad target");
}

static void test_exp(void) {
    /* The polynomial exp against libm over the range softmax uses, plus the special values. */
    float worst = 0;
    /* Below -86.5 results are within 3e-38 of the (subnormal-range) truth, not within ulps. */
    for (float x = -89.0f; x < -86.5f; x += 0.0137f) CHECK(fabs(nk_exp_f32(x) - exp((double)x)) < 3e-38, "tiny exp");
    for (float x = -86.5f; x < 88.7f; x += 0.0137f) {
        const double want = exp((double)x);
        const float got = nk_exp_f32(x);
        const float rel = (float)(fabs(got - want) / want);
        if (rel > worst) worst = rel;
    }
    CHECK(worst < 4e-7f, "exp max rel err %g", worst);
    CHECK(nk_exp_f32(INFINITY) == INFINITY && nk_exp_f32(-INFINITY) == 0 &&
              isnan(nk_exp_f32(NAN)) && nk_exp_f32(0) == 1,
          "exp specials");
}

int main(void) {
    for (int threads = 1; threads <= 2; threads++) {
        nk_threads_set(threads);
        test_reductions();
        test_cumsum();
        test_softmax();
        test_norms();
        test_nll();
    }
    test_exp();
    printf("test_reduce: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
