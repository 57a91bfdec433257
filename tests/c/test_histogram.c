/*
 * test_histogram.c - nk_histc_int against a direct count written from the rule (CUDA's histc for integers).
 */
#include "neuron_kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_checks, g_failures;
#define CHECK(cond)                                                                     \
    do {                                                                                \
        g_checks++;                                                                     \
        if (!(cond)) {                                                                  \
            g_failures++;                                                               \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);    \
        }                                                                               \
    } while (0)

static nk_tensor vec(void *data, nk_dtype dt, int64_t n, int64_t stride) {
    nk_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.ndim = 1;
    t.sizes[0] = n;
    t.strides[0] = stride;
    return t;
}

/* Reference: bins counted one value at a time with plain arithmetic. */
static void reference(const int64_t *v, int64_t n, int64_t bins, int64_t lo, int64_t hi, int64_t *out) {
    if (lo == hi && n > 0) {
        lo = hi = v[0];
        for (int64_t i = 1; i < n; ++i) {
            if (v[i] < lo) lo = v[i];
            if (v[i] > hi) hi = v[i];
        }
    }
    if (lo == hi) {
        lo--;
        hi++;
    }
    for (int64_t b = 0; b < bins; ++b) out[b] = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (v[i] < lo || v[i] > hi) continue;
        int64_t b = (v[i] - lo) * bins / (hi - lo);
        out[b < bins ? b : bins - 1]++;
    }
}

static void test_int32_and_int64(void) {
    int64_t vals[37];
    int32_t v32[37];
    for (int i = 0; i < 37; ++i) {
        vals[i] = (i * 7919) % 23 - 5;
        v32[i] = (int32_t)vals[i];
    }
    const int64_t cases[][3] = {{8, 0, 7}, {3, -5, 17}, {5, 0, 0}, {1, 2, 9}, {11, -100, 100}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        int64_t bins = cases[c][0], lo = cases[c][1], hi = cases[c][2];
        int64_t ref[16], counts[16], h64[16];
        int32_t h32[32];
        reference(vals, 37, bins, lo, hi, ref);
        nk_tensor src64 = vec(vals, NK_I64, 37, 1), hist64 = vec(h64, NK_I64, bins, 1);
        CHECK(nk_histc_int(&hist64, &src64, lo, hi, counts) == NK_SUCCESS);
        for (int64_t b = 0; b < bins; ++b) CHECK(h64[b] == ref[b]);
        /* int32 with a strided histogram: the gaps stay untouched */
        for (int i = 0; i < 32; ++i) h32[i] = -1;
        nk_tensor src32 = vec(v32, NK_I32, 37, 1), hist32 = vec(h32, NK_I32, bins, 2);
        CHECK(nk_histc_int(&hist32, &src32, lo, hi, counts) == NK_SUCCESS);
        for (int64_t b = 0; b < bins; ++b) {
            CHECK(h32[2 * b] == ref[b]);
            CHECK(h32[2 * b + 1] == -1);
        }
    }
}

static void test_strided_source_and_small_types(void) {
    /* a 3x4 int8 matrix read transposed (strides 1, 4), negative values */
    int8_t m[12] = {-3, 0, 2, 5, 1, 1, -1, 4, 6, 0, 3, 2};
    int64_t flat[12];
    for (int i = 0; i < 12; ++i) flat[i] = m[i];
    nk_tensor src;
    memset(&src, 0, sizeof src);
    src.data = m;
    src.dtype = NK_I8;
    src.ndim = 2;
    src.sizes[0] = 4;
    src.sizes[1] = 3;
    src.strides[0] = 1;
    src.strides[1] = 4;
    int8_t h[4];
    int64_t counts[4], ref[4];
    nk_tensor hist = vec(h, NK_I8, 4, 1);
    CHECK(nk_histc_int(&hist, &src, -2, 5, counts) == NK_SUCCESS);
    reference(flat, 12, 4, -2, 5, ref); /* order does not matter for counts */
    for (int b = 0; b < 4; ++b) CHECK(h[b] == ref[b]);
    /* uint8: values above 127 stay positive */
    uint8_t u[5] = {0, 200, 255, 128, 7};
    uint8_t hu[2];
    nk_tensor su = vec(u, NK_U8, 5, 1), hh = vec(hu, NK_U8, 2, 1);
    CHECK(nk_histc_int(&hh, &su, 0, 255, counts) == NK_SUCCESS);
    CHECK(hu[0] == 2 && hu[1] == 3);
}

static void test_errors_and_empty(void) {
    int32_t v[3] = {1, 2, 3}, h[4];
    int64_t counts[4];
    float f[3] = {0};
    nk_tensor src = vec(v, NK_I32, 3, 1), hist = vec(h, NK_I32, 4, 1);
    CHECK(nk_histc_int(&hist, &src, 5, 1, counts) == NK_INVALID);
    nk_tensor fsrc = vec(f, NK_F32, 3, 1);
    CHECK(nk_histc_int(&hist, &fsrc, 0, 1, counts) == NK_UNSUPPORTED);
    nk_tensor h64 = vec(h, NK_I64, 2, 1);
    CHECK(nk_histc_int(&h64, &src, 0, 1, counts) == NK_UNSUPPORTED);
    nk_tensor empty = vec(NULL, NK_I32, 0, 1);
    CHECK(nk_histc_int(&hist, &empty, 0, 0, counts) == NK_SUCCESS);
    for (int b = 0; b < 4; ++b) CHECK(h[b] == 0);
    nk_tensor zero_bins = vec(h, NK_I32, 0, 1);
    CHECK(nk_histc_int(&zero_bins, &src, 0, 3, counts) == NK_INVALID);
    /* extreme range: no overflow in (v - min) * bins */
    int64_t big[3] = {INT64_MIN / 2, 0, INT64_MAX / 2};
    int64_t hb[3];
    nk_tensor sb = vec(big, NK_I64, 3, 1), hbt = vec(hb, NK_I64, 3, 1);
    CHECK(nk_histc_int(&hbt, &sb, INT64_MIN / 2, INT64_MAX / 2, counts) == NK_SUCCESS);
    CHECK(hb[0] == 1 && hb[1] == 1 && hb[2] == 1);
}

int main(void) {
    test_int32_and_int64();
    test_strided_source_and_small_types();
    test_errors_and_empty();
    printf("test_histogram: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
