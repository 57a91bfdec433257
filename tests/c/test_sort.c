/*
 * test_sort.c - sort, topk, nonzero, tril/triu and arange against direct reference loops: strided and
 * 0-size tensors, ties, NaN and signed zeros.
 */
#include "kernels_internal.h"
#include "neuron_kernels.h"
#include "nk_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 88172645463325252ull;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* The reference order on doubles: ascending, NaN last, -0.0 == 0.0; stable by position. */
static int ref_cmp(double a, double b) {
    const bool na = a != a, nb = b != b;
    if (na || nb) return na == nb ? 0 : (na ? 1 : -1);
    return a < b ? -1 : (a > b ? 1 : 0);
}

/* Reference stable sort of positions by x (n small): insertion sort. */
static void ref_sort(const double *x, int64_t n, bool desc, int64_t *pos) {
    for (int64_t i = 0; i < n; i++) pos[i] = i;
    for (int64_t i = 1; i < n; i++) {
        const int64_t v = pos[i];
        int64_t j = i;
        while (j > 0) {
            const int c = ref_cmp(x[pos[j - 1]], x[v]);
            if (desc ? c >= 0 : c <= 0) break;
            pos[j] = pos[j - 1];
            j--;
        }
        pos[j] = v;
    }
}

static double pick(int kind) {
    /* Few distinct values so ties are frequent; some NaN and signed zeros. */
    const uint64_t r = rnd() % 12;
    if (kind && r == 0) return NAN;
    if (kind && r == 1) return -0.0;
    if (kind && r == 2) return 0.0;
    if (kind && r == 3) return -INFINITY;
    return (double)(int64_t)(rnd() % 7) - 3.0 + (kind ? 0.5 : 0.0);
}

/* Sorts a [rows, n] float tensor viewed transposed (dim 0 of a column-major buffer) and checks every
 * slice against the reference, for f32 and f64 and both directions; also topk for every k. */
static void test_sort_float(int64_t rows, int64_t n) {
    double *ref = malloc(sizeof(double) * (size_t)(rows * n + 1));
    float *x32 = malloc(sizeof(float) * (size_t)(rows * n + 1));
    float *v32 = malloc(sizeof(float) * (size_t)(rows * n + 1));
    int64_t *ix = malloc(sizeof(int64_t) * (size_t)(rows * n + 1));
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)(n + 1));
    for (int64_t i = 0; i < rows * n; i++) {
        ref[i] = pick(1);
        x32[i] = (float)ref[i];
    }
    /* Logical [n, rows] with dim 0 the sorted one: element (p, r) at r * n + p. */
    const int64_t sz[2] = {n, rows}, st[2] = {1, n};
    nk_tensor in = mk(x32, NK_F32, 2, sz, st);
    for (int desc = 0; desc < 2; desc++) {
        nk_tensor tv = mk(v32, NK_F32, 2, sz, NULL), ti = mk(ix, NK_I64, 2, sz, NULL);
        CHECK_MSG(nk_sort(&tv, &ti, &in, 0, desc) == NK_SUCCESS, "sort %lld", (long long)n);
        for (int64_t r = 0; r < rows; r++) {
            ref_sort(ref + r * n, n, desc, pos);
            for (int64_t p = 0; p < n; p++) {
                const int64_t got = ix[p * rows + r];
                CHECK_MSG(got == pos[p], "sort idx n=%lld r=%lld p=%lld got %lld want %lld desc=%d", (long long)n,
                          (long long)r, (long long)p, (long long)got, (long long)pos[p], desc);
                CHECK_MSG(memcmp(&v32[p * rows + r], &x32[r * n + pos[p]], 4) == 0, "sort value bits");
            }
        }
        for (int64_t k = 0; k <= n; k += (n > 40 && k >= 3 ? n / 7 + 1 : 1)) {
            const int64_t ksz[2] = {k, rows};
            nk_tensor kv = mk(v32, NK_F32, 2, ksz, NULL), ki = mk(ix, NK_I64, 2, ksz, NULL);
            CHECK_MSG(nk_topk(&kv, &ki, &in, 0, k, desc) == NK_SUCCESS, "topk");
            for (int64_t r = 0; r < rows; r++) {
                ref_sort(ref + r * n, n, desc, pos);
                for (int64_t p = 0; p < k; p++)
                    CHECK_MSG(ix[p * rows + r] == pos[p], "topk k=%lld n=%lld r=%lld p=%lld", (long long)k,
                              (long long)n, (long long)r, (long long)p);
            }
        }
    }
    /* f64, contiguous, indices only. */
    nk_tensor in64 = mk(ref, NK_F64, 2, (const int64_t[]){rows, n}, NULL);
    nk_tensor ti = mk(ix, NK_I64, 2, (const int64_t[]){rows, n}, NULL);
    CHECK_MSG(nk_sort(NULL, &ti, &in64, 1, true) == NK_SUCCESS, "sort f64");
    for (int64_t r = 0; r < rows; r++) {
        ref_sort(ref + r * n, n, true, pos);
        for (int64_t p = 0; p < n; p++) CHECK_MSG(ix[r * n + p] == pos[p], "sort f64 idx");
    }
    free(ref);
    free(x32);
    free(v32);
    free(ix);
    free(pos);
}

static void test_sort_types(void) {
    /* int8 with negatives, bf16, f16, bool, uint64 above 2^63. */
    int8_t a[9] = {3, -128, 127, 0, -1, 3, -128, 5, 0};
    int64_t ix[9], pos[9];
    double ref[9];
    for (int i = 0; i < 9; i++) ref[i] = a[i];
    const int64_t n9 = 9;
    nk_tensor t = mk(a, NK_I8, 1, &n9, NULL), ti = mk(ix, NK_I64, 1, &n9, NULL);
    int8_t v[9];
    nk_tensor tv = mk(v, NK_I8, 1, &n9, NULL);
    CHECK_MSG(nk_sort(&tv, &ti, &t, 0, false) == NK_SUCCESS, "i8");
    ref_sort(ref, 9, false, pos);
    for (int i = 0; i < 9; i++) CHECK_MSG(ix[i] == pos[i] && v[i] == a[pos[i]], "i8 %d", i);

    uint16_t h[9], hb[9];
    const float hf[9] = {1.5f, -2.0f, NAN, -0.0f, 0.0f, 65504.0f, -INFINITY, 1.5f, 1e-7f};
    for (int i = 0; i < 9; i++) {
        h[i] = nk_f32_to_f16(hf[i]);
        hb[i] = nk_f32_to_bf16(hf[i]);
        ref[i] = hf[i];
    }
    for (int bf = 0; bf < 2; bf++) {
        uint16_t out[9];
        nk_tensor th = mk(bf ? hb : h, bf ? NK_BF16 : NK_F16, 1, &n9, NULL), to = mk(out, th.dtype, 1, &n9, NULL);
        for (int desc = 0; desc < 2; desc++) {
            CHECK_MSG(nk_sort(&to, &ti, &th, 0, desc) == NK_SUCCESS, "half");
            double r16[9];
            for (int i = 0; i < 9; i++) r16[i] = bf ? nk_bf16_to_f32(hb[i]) : nk_f16_to_f32(h[i]);
            ref_sort(r16, 9, desc, pos);
            for (int i = 0; i < 9; i++) CHECK_MSG(ix[i] == pos[i], "half bf=%d desc=%d %d", bf, desc, i);
        }
    }
    uint64_t u[4] = {UINT64_MAX, 1, UINT64_C(1) << 63, 0};
    const int64_t n4 = 4;
    nk_tensor tu = mk(u, NK_U64, 1, &n4, NULL), tu_i = mk(ix, NK_I64, 1, &n4, NULL);
    CHECK_MSG(nk_sort(NULL, &tu_i, &tu, 0, false) == NK_SUCCESS, "u64");
    CHECK_MSG(ix[0] == 3 && ix[1] == 1 && ix[2] == 2 && ix[3] == 0, "u64 order");
    uint8_t b[6] = {1, 0, 1, 1, 0, 0};
    const int64_t n6 = 6;
    nk_tensor tb = mk(b, NK_BOOL, 1, &n6, NULL), tb_i = mk(ix, NK_I64, 1, &n6, NULL);
    CHECK_MSG(nk_sort(NULL, &tb_i, &tb, 0, true) == NK_SUCCESS, "bool");
    const int64_t want[6] = {0, 2, 3, 1, 4, 5};
    for (int i = 0; i < 6; i++) CHECK_MSG(ix[i] == want[i], "bool desc %d", i);

    /* 0-d input, 0-size slices, bad k / dim. */
    float s = 2.0f, sv = 0;
    int64_t si = -1;
    nk_tensor t0 = mk(&s, NK_F32, 0, NULL, NULL), v0 = mk(&sv, NK_F32, 0, NULL, NULL), i0 = mk(&si, NK_I64, 0, NULL, NULL);
    CHECK_MSG(nk_sort(&v0, &i0, &t0, 0, false) == NK_SUCCESS && sv == 2.0f && si == 0, "0-d");
    const int64_t z[2] = {3, 0};
    nk_tensor te = mk(NULL, NK_F32, 2, z, NULL), tie = mk(NULL, NK_I64, 2, z, NULL);
    CHECK_MSG(nk_sort(&te, &tie, &te, 1, false) == NK_SUCCESS, "empty dim");
    CHECK_MSG(nk_topk(&te, &tie, &te, 1, 1, true) == NK_INVALID, "k > size");
    CHECK_MSG(nk_sort(&te, &tie, &te, 2, false) == NK_INVALID, "bad dim");
    CHECK_MSG(nk_sort(&tv, &tb_i, &t, 0, false) == NK_INVALID, "shape mismatch");
}

static bool ref_nonzero(const float *x, int64_t i) {
    return x[i] != 0.0f || x[i] != x[i];
}

/* nk_sort_unstable on int16 rows: the values in order, the indices a permutation that reads them, up
 * to 16 elements the insertion sort's (stable) order; heavy ties, sorted and reversed rows of every
 * length around the thresholds, so partitions, the heap sort and both insertion passes run (ASan). */
static void test_sort_unstable(void) {
    const int64_t lens[] = {0, 1, 2, 15, 16, 17, 33, 100, 1000, 5000};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int64_t n = lens[li];
        int16_t *x = malloc(sizeof(int16_t) * (size_t)(n + 1)), *v = malloc(sizeof(int16_t) * (size_t)(n + 1));
        int64_t *ix = malloc(sizeof(int64_t) * (size_t)(n + 1)), *pos = malloc(sizeof(int64_t) * (size_t)(n + 1));
        double *ref = malloc(sizeof(double) * (size_t)(n + 1));
        uint8_t *seen = malloc((size_t)(n + 1));
        for (int pattern = 0; pattern < 3; pattern++) {
            for (int64_t i = 0; i < n; i++) {
                x[i] = (int16_t)(pattern == 0 ? (int64_t)(rnd() % 5) : pattern == 1 ? i / 3 : (n - i) / 3);
                ref[i] = x[i];
            }
            for (int desc = 0; desc < 2; desc++) {
                nk_tensor in = mk(x, NK_I16, 1, &n, NULL), tv = mk(v, NK_I16, 1, &n, NULL), ti = mk(ix, NK_I64, 1, &n, NULL);
                CHECK_MSG(nk_sort_unstable(&tv, &ti, &in, 0, desc) == NK_SUCCESS, "unstable %lld", (long long)n);
                ref_sort(ref, n, desc, pos);
                memset(seen, 0, (size_t)(n + 1));
                bool ok = true;
                for (int64_t i = 0; i < n; i++) {
                    ok &= ix[i] >= 0 && ix[i] < n && !seen[ix[i]];
                    if (ix[i] >= 0 && ix[i] < n) seen[ix[i]] = 1;
                    ok &= v[i] == x[pos[i]] && (ix[i] < 0 || ix[i] >= n || v[i] == x[ix[i]]);
                    if (n <= 16) ok &= ix[i] == pos[i];
                }
                CHECK_MSG(ok, "unstable n=%lld pattern %d desc %d", (long long)n, pattern, desc);
            }
        }
        free(x);
        free(v);
        free(ix);
        free(pos);
        free(ref);
        free(seen);
    }
}

static void test_nonzero(void) {
    /* [5, 7, 300] viewed with dims 0 and 2 swapped: row-major order of the view is not memory order. */
    const int64_t A = 5, B = 7, C = 300, total = A * B * C;
    float *x = malloc(sizeof(float) * (size_t)total);
    for (int64_t i = 0; i < total; i++) {
        const uint64_t r = rnd() % 10;
        x[i] = r == 0 ? NAN : (r == 1 ? -0.0f : (r < 5 ? 0.0f : (float)r));
    }
    const int64_t vs[3] = {C, B, A}, vst[3] = {1, C, B * C};
    nk_tensor in = mk(x, NK_F32, 3, vs, vst);
    int64_t count = -1;
    CHECK_MSG(nk_nonzero_count(&in, &count) == NK_SUCCESS, "count");
    int64_t want = 0;
    for (int64_t i = 0; i < total; i++) want += ref_nonzero(x, i);
    CHECK_MSG(count == want, "count %lld want %lld", (long long)count, (long long)want);
    /* out transposed: [count, 3] with strides (1, count). */
    int64_t *out = malloc(sizeof(int64_t) * (size_t)(3 * count + 1));
    nk_tensor to = mk(out, NK_I64, 2, (const int64_t[]){count, 3}, (const int64_t[]){1, count});
    CHECK_MSG(nk_nonzero(&to, &in) == NK_SUCCESS, "nonzero");
    int64_t row = 0;
    for (int64_t c = 0; c < C; c++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t a = 0; a < A; a++) {
                if (!ref_nonzero(x, a * B * C + b * C + c)) continue;
                CHECK_MSG(row < count && out[row] == c && out[row + count] == b && out[row + 2 * count] == a,
                          "nonzero row %lld", (long long)row);
                row++;
            }
    nk_tensor bad = mk(out, NK_I64, 2, (const int64_t[]){count - 1, 3}, NULL);
    CHECK_MSG(nk_nonzero(&bad, &in) == NK_INVALID, "wrong count");
    /* 0-d and integer/bool/half inputs. */
    int32_t s = 7;
    nk_tensor t0 = mk(&s, NK_I32, 0, NULL, NULL);
    CHECK_MSG(nk_nonzero_count(&t0, &count) == NK_SUCCESS && count == 1, "0-d");
    nk_tensor o0 = mk(out, NK_I64, 2, (const int64_t[]){1, 0}, NULL);
    CHECK_MSG(nk_nonzero(&o0, &t0) == NK_SUCCESS, "0-d write");
    uint16_t hb[4] = {0x8000, 0x0000, 0x7FC0, 0x0001};
    const int64_t n4 = 4;
    nk_tensor th = mk(hb, NK_BF16, 1, &n4, NULL);
    CHECK_MSG(nk_nonzero_count(&th, &count) == NK_SUCCESS && count == 2, "bf16 count");
    nk_tensor o1 = mk(out, NK_I64, 2, (const int64_t[]){2, 1}, NULL);
    CHECK_MSG(nk_nonzero(&o1, &th) == NK_SUCCESS && out[0] == 2 && out[1] == 3, "bf16 positions");
    nk_tensor te = mk(NULL, NK_F32, 2, (const int64_t[]){0, 4}, NULL);
    CHECK_MSG(nk_nonzero_count(&te, &count) == NK_SUCCESS && count == 0, "empty");
    free(x);
    free(out);
}

static void test_triangle(void) {
    /* [2, 5, 4] int16 source read transposed in the last two dims. */
    int16_t src[40], out[40];
    for (int i = 0; i < 40; i++) src[i] = (int16_t)(i + 1);
    const int64_t sz[3] = {2, 4, 5}, sst[3] = {20, 1, 4};
    nk_tensor in = mk(src, NK_I16, 3, sz, sst), to = mk(out, NK_I16, 3, sz, NULL);
    for (int upper = 0; upper < 2; upper++) {
        for (int64_t k = -7; k <= 7; k++) {
            memset(out, 0x5A, sizeof out);
            CHECK_MSG(nk_triangle(&to, &in, k, upper) == NK_SUCCESS, "triangle");
            for (int b = 0; b < 2; b++)
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 5; j++) {
                        const bool keep = upper ? j - i >= k : j - i <= k;
                        const int16_t want = keep ? src[b * 20 + i + 4 * j] : 0;
                        CHECK_MSG(out[b * 20 + i * 5 + j] == want, "tri upper=%d k=%lld (%d,%d,%d)", upper,
                                  (long long)k, b, i, j);
                    }
        }
    }
    /* In place, with extreme k. */
    double m[6] = {1, 2, 3, 4, 5, 6};
    nk_tensor tm = mk(m, NK_F64, 2, (const int64_t[]){2, 3}, NULL);
    CHECK_MSG(nk_triangle(&tm, &tm, INT64_MAX, false) == NK_SUCCESS && m[5] == 6, "tril keep all");
    CHECK_MSG(nk_triangle(&tm, &tm, 0, true) == NK_SUCCESS && m[3] == 0 && m[4] == 5 && m[0] == 1, "triu in place");
    CHECK_MSG(nk_triangle(&tm, &tm, INT64_MIN, false) == NK_SUCCESS && m[0] == 0 && m[5] == 0, "tril keep none");
    CHECK_MSG(nk_triangle(&tm, &tm, 0, true) == NK_SUCCESS, "all zero");
    nk_tensor t1 = mk(m, NK_F64, 1, (const int64_t[]){6}, NULL);
    CHECK_MSG(nk_triangle(&t1, &t1, 0, true) == NK_INVALID, "1-d");
}

static void test_arange(void) {
    float f[7];
    nk_tensor tf = mk(f, NK_F32, 1, (const int64_t[]){4}, (const int64_t[]){2});
    CHECK_MSG(nk_arange(&tf, -3, 5) == NK_SUCCESS, "arange f32");
    for (int i = 0; i < 4; i++) CHECK_MSG(f[2 * i] == (float)(-3 + 5 * i), "arange f32 %d", i);
    int8_t c[300];
    nk_tensor tc = mk(c, NK_I8, 1, (const int64_t[]){300}, NULL);
    CHECK_MSG(nk_arange(&tc, 100, 1) == NK_SUCCESS, "arange i8");
    for (int i = 0; i < 300; i++) CHECK_MSG(c[i] == (int8_t)(uint8_t)(100 + i), "arange i8 wraps %d", i);
    int64_t big[3];
    nk_tensor tb = mk(big, NK_I64, 1, (const int64_t[]){3}, NULL);
    CHECK_MSG(nk_arange(&tb, INT64_MAX, -(INT64_MAX / 2)) == NK_SUCCESS && big[2] == 1, "arange i64 large step");
    nk_tensor t2 = mk(big, NK_I64, 2, (const int64_t[]){1, 3}, NULL);
    CHECK_MSG(nk_arange(&t2, 0, 1) == NK_INVALID, "arange 2-d");
}


static void test_isin(void) {
    float el[8] = {1.0f, -0.0f, NAN, 2.5f, 3.0f, -7.0f, 0.0f, 1e30f};
    float te[5] = {NAN, 0.0f, 3.0f, 1.0f, 3.0f};
    uint8_t out[8];
    const int64_t n8 = 8, n5 = 5;
    nk_tensor tel = mk(el, NK_F32, 1, &n8, NULL), tt = mk(te, NK_F32, 1, &n5, NULL), to = mk(out, NK_BOOL, 1, &n8, NULL);
    const uint8_t want[8] = {1, 1, 0, 0, 1, 0, 1, 0};
    for (int inv = 0; inv < 2; inv++) {
        CHECK_MSG(nk_isin(&to, &tel, &tt, inv) == NK_SUCCESS, "isin f32");
        for (int i = 0; i < 8; i++) CHECK_MSG(out[i] == (want[i] ^ inv), "isin f32 %d inv %d", i, inv);
    }
    /* int64 with the extremes (their keys are the largest and smallest) against a strided 2-d test. */
    int64_t a[6] = {INT64_MAX, INT64_MIN, 0, -1, 5, INT64_MAX};
    int64_t t[6] = {INT64_MAX, 9, 0, 9, 9, 9};
    const int64_t n6 = 6;
    nk_tensor ta = mk(a, NK_I64, 2, (const int64_t[]){2, 3}, NULL);
    nk_tensor tt2 = mk(t, NK_I64, 2, (const int64_t[]){2, 2}, (const int64_t[]){1, 2});  /* t[0], t[2], t[1], t[3] */
    uint8_t o2[6];
    nk_tensor to2 = mk(o2, NK_BOOL, 2, (const int64_t[]){2, 3}, NULL);
    CHECK_MSG(nk_isin(&to2, &ta, &tt2, false) == NK_SUCCESS, "isin i64");
    const uint8_t w2[6] = {1, 0, 1, 0, 0, 1};
    for (int i = 0; i < 6; i++) CHECK_MSG(o2[i] == w2[i], "isin i64 %d", i);
    (void)n6;
    nk_tensor tempty = mk(NULL, NK_I64, 1, (const int64_t[]){0}, NULL);
    CHECK_MSG(nk_isin(&to2, &ta, &tempty, true) == NK_SUCCESS && o2[0] == 1 && o2[5] == 1, "isin empty test");
    CHECK_MSG(nk_isin(&to2, &ta, &tt, false) == NK_INVALID, "isin dtype mismatch");
}

int main(void) {
    nk_threads_set(3);
    const int64_t shapes[][2] = {{1, 1}, {3, 5}, {4, 23}, {2, 24}, {3, 25}, {5, 97}, {2, 1000}, {40, 3}, {7, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) test_sort_float(shapes[s][0], shapes[s][1]);
    test_sort_types();
    test_sort_unstable();
    test_nonzero();
    test_triangle();
    test_arange();
    test_isin();
    nk_threads_set(1);
    test_nonzero();
    printf("test_sort: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
