/*
 * test_index.c - indexing kernels against direct reference loops on small strided tensors.
 */
#include "kernels_internal.h"
#include "neuron_kernels.h"
#include "nk_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_index_select(void) {
    /* src [4,3] float viewed transposed: element (i,j) at i + 4*j. */
    float src[12];
    for (int i = 0; i < 12; i++) src[i] = (float)i;
    const int64_t ss[2] = {4, 3}, sst[2] = {1, 4};
    nk_tensor ts = mk(src, NK_F32, 2, ss, sst);
    int32_t idx[5] = {3, 0, 3, 1, 2};
    const int64_t n5 = 5;
    nk_tensor ti = mk(idx, NK_I32, 1, &n5, NULL);
    float dst[15];
    const int64_t ds[2] = {5, 3};
    nk_tensor td = mk(dst, NK_F32, 2, ds, NULL);
    int64_t bad = INT64_MIN;
    CHECK_MSG(nk_index_select(&td, &ts, 0, &ti, &bad) == NK_SUCCESS, "select dim0");
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 3; j++) CHECK_MSG(dst[i * 3 + j] == src[idx[i] + 4 * j], "select (%d,%d)", i, j);
    /* dim 1 */
    int64_t idx2[2] = {2, 2};
    const int64_t n2 = 2;
    nk_tensor ti2 = mk(idx2, NK_I64, 1, &n2, NULL);
    float dst2[8];
    const int64_t ds2[2] = {4, 2};
    nk_tensor td2 = mk(dst2, NK_F32, 2, ds2, NULL);
    CHECK_MSG(nk_index_select(&td2, &ts, 1, &ti2, &bad) == NK_SUCCESS, "select dim1");
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++) CHECK_MSG(dst2[i * 2 + j] == src[i + 4 * 2], "select1 (%d,%d)", i, j);
    idx[4] = 4;
    CHECK_MSG(nk_index_select(&td, &ts, 0, &ti, &bad) == NK_INVALID && bad == 4, "out of range -> bad=4");
    idx[4] = -1;
    bad = INT64_MIN;
    CHECK_MSG(nk_index_select(&td, &ts, 0, &ti, &bad) == NK_INVALID && bad == -1, "negative is out of range");
    float f16 = 0;
    const int64_t one = 1;
    nk_tensor tf = mk(&f16, NK_F32, 1, &one, NULL);
    CHECK_MSG(nk_index_select(&td, &ts, 0, &tf, &bad) == NK_UNSUPPORTED, "float index");
}

static void test_index_copy_add(void) {
    int64_t dst[12] = {0};
    const int64_t ds[3] = {2, 3, 2};
    nk_tensor td = mk(dst, NK_I64, 3, ds, NULL);
    int64_t src[8];
    for (int i = 0; i < 8; i++) src[i] = i + 1;
    const int64_t ss[3] = {2, 2, 2};
    nk_tensor ts = mk(src, NK_I64, 3, ss, NULL);
    int64_t idx[2] = {2, 0};
    const int64_t n2 = 2;
    nk_tensor ti = mk(idx, NK_I64, 1, &n2, NULL);
    int64_t bad = INT64_MIN;
    CHECK_MSG(nk_index_copy(&td, 1, &ti, &ts, &bad) == NK_SUCCESS, "index_copy");
    for (int a = 0; a < 2; a++)
        for (int k = 0; k < 2; k++)
            for (int c = 0; c < 2; c++)
                CHECK_MSG(dst[a * 6 + idx[k] * 2 + c] == src[a * 4 + k * 2 + c], "copy %d %d %d", a, k, c);
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 2; c++) CHECK_MSG(dst[a * 6 + 1 * 2 + c] == 0, "untouched row");
    /* index_add with a duplicate: both slices accumulate. */
    idx[0] = 1;
    idx[1] = 1;
    const nk_scalar alpha = {.is_float = false, .i = 3};
    CHECK_MSG(nk_index_add(&td, 1, &ti, &ts, alpha, &bad) == NK_SUCCESS, "index_add");
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 2; c++)
            CHECK_MSG(dst[a * 6 + 2 + c] == 3 * (src[a * 4 + c] + src[a * 4 + 2 + c]), "add %d %d", a, c);
    /* An out-of-range index anywhere leaves dst untouched. */
    int64_t before[12];
    memcpy(before, dst, sizeof dst);
    idx[0] = 0;
    idx[1] = 3;
    CHECK_MSG(nk_index_copy(&td, 1, &ti, &ts, &bad) == NK_INVALID && bad == 3, "copy oob");
    CHECK_MSG(memcmp(before, dst, sizeof dst) == 0, "copy oob untouched");
}

static void test_gather_scatter(void) {
    float src[12];
    for (int i = 0; i < 12; i++) src[i] = (float)(i * 10);
    const int64_t ss[2] = {3, 4};
    nk_tensor ts = mk(src, NK_F32, 2, ss, NULL);
    int64_t idx[6] = {3, 0, 1, 1, 2, 3};
    const int64_t is[2] = {3, 2};
    nk_tensor ti = mk(idx, NK_I64, 2, is, NULL);
    float out[6];
    nk_tensor to = mk(out, NK_F32, 2, is, NULL);
    int64_t bad = INT64_MIN;
    CHECK_MSG(nk_gather(&to, &ts, 1, &ti, &bad) == NK_SUCCESS, "gather");
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) CHECK_MSG(out[i * 2 + j] == src[i * 4 + idx[i * 2 + j]], "gather %d %d", i, j);
    /* scatter_add into dim 1 with duplicates in row 1 */
    float dst[12] = {0};
    nk_tensor td = mk(dst, NK_F32, 2, ss, NULL);
    const nk_scalar none = {0};
    CHECK_MSG(nk_scatter(&td, 1, &ti, &to, none, true, &bad) == NK_SUCCESS, "scatter_add");
    float ref[12] = {0};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) ref[i * 4 + idx[i * 2 + j]] += out[i * 2 + j];
    CHECK_MSG(memcmp(ref, dst, sizeof ref) == 0, "scatter_add values");
    const nk_scalar v = {.is_float = true, .f = -2.5};
    int32_t idx0[6] = {2, 0, 1, 1, 0, 2};
    nk_tensor ti0 = mk(idx0, NK_I32, 2, is, NULL);
    CHECK_MSG(nk_scatter(&td, 0, &ti0, NULL, v, false, &bad) == NK_SUCCESS, "scatter value");
    /* dim 0: element (i,j) goes to row idx0[i][j], column j */
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) CHECK_MSG(dst[idx0[i * 2 + j] * 4 + j] == -2.5f, "value %d %d", i, j);
    CHECK_MSG(dst[3] == ref[3], "column 3 untouched");
    bad = INT64_MIN;
    CHECK_MSG(nk_scatter(&td, 0, &ti, NULL, v, false, &bad) == NK_INVALID && bad == 3, "scatter oob (3 rows)");
}

static void test_embedding_backward(void) {
    float grad[8] = {1, 2, 3, 4, 5, 6, 7, 8}; /* 4 rows of 2 */
    const int64_t gs[2] = {4, 2};
    nk_tensor tg = mk(grad, NK_F32, 2, gs, NULL);
    int64_t ids[4] = {2, 0, 2, 1};
    const int64_t n4 = 4;
    nk_tensor ti = mk(ids, NK_I64, 1, &n4, NULL);
    float gw[6] = {9, 9, 9, 9, 9, 9};
    const int64_t ws[2] = {3, 2};
    nk_tensor tw = mk(gw, NK_F32, 2, ws, NULL);
    int64_t bad = INT64_MIN;
    CHECK_MSG(nk_embedding_backward(&tw, &tg, &ti, 1, true, &bad) == NK_SUCCESS, "embedding backward");
    const float ref[6] = {3, 4, 0, 0, (1 + 5) / 2.f, (2 + 6) / 2.f};
    for (int i = 0; i < 6; i++) CHECK_MSG(gw[i] == ref[i], "gw[%d] %g vs %g", i, gw[i], ref[i]);
}


static void test_advanced(void) {
    /* self [4, 5, 3] float, transposed in its first two dims: logical (a, b, c) at b*12 + a*3 + c. */
    float self[60];
    for (int i = 0; i < 60; i++) self[i] = (float)i;
    const int64_t ss[3] = {4, 5, 3}, sst[3] = {3, 12, 1};
    nk_tensor ts = mk(self, NK_F32, 3, ss, sst);
    /* Indices on dims 1 and 2, broadcast [2, 3]: i1 [2, 1] expanded, i2 [3] expanded (stride 0). */
    int64_t i1[2] = {4, -5};
    int32_t i2[3] = {2, 0, -1};
    const int64_t bs[2] = {2, 3};
    nk_tensor ti1 = mk(i1, NK_I64, 2, bs, (const int64_t[]){1, 0});
    nk_tensor ti2 = mk(i2, NK_I32, 2, bs, (const int64_t[]){0, 1});
    const nk_tensor *idx[2] = {&ti1, &ti2};
    float out[4 * 6];
    const int64_t os[3] = {4, 2, 3};
    nk_tensor to = mk(out, NK_F32, 3, os, NULL);
    int64_t bad = INT64_MIN;
    int32_t bad_dim = -1;
    CHECK_MSG(nk_index_gather(&to, &ts, 1, 2, idx, &bad, &bad_dim) == NK_SUCCESS, "adv gather");
    for (int a = 0; a < 4; a++)
        for (int p = 0; p < 2; p++)
            for (int q = 0; q < 3; q++) {
                const int64_t b = (i1[p] + 5) % 5, c = (i2[q] + 3) % 3;
                CHECK_MSG(out[a * 6 + p * 3 + q] == self[b * 12 + a * 3 + c], "adv gather (%d,%d,%d)", a, p, q);
            }
    /* put with accumulate and duplicates: self[:, [1, 1, 3]] += v[4, 3, 3] (broadcast over dim 0). */
    int64_t j1[3] = {1, 1, 3};
    const int64_t n3 = 3;
    nk_tensor tj = mk(j1, NK_I64, 1, &n3, NULL);
    const nk_tensor *jdx[1] = {&tj};
    float v[9];
    for (int i = 0; i < 9; i++) v[i] = (float)(i + 1) * 0.5f;
    nk_tensor tv = mk(v, NK_F32, 3, (const int64_t[]){4, 3, 3}, (const int64_t[]){0, 3, 1});
    float before[60];
    memcpy(before, self, sizeof self);
    CHECK_MSG(nk_index_put(&ts, &tv, 1, 1, jdx, true, &bad, &bad_dim) == NK_SUCCESS, "adv put acc");
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 5; b++)
            for (int c = 0; c < 3; c++) {
                float want = before[b * 12 + a * 3 + c];
                for (int k = 0; k < 3; k++)
                    if (j1[k] == b) want += v[k * 3 + c];
                CHECK_MSG(self[b * 12 + a * 3 + c] == want, "adv put acc (%d,%d,%d)", a, b, c);
            }
    /* put without accumulate: the last duplicate wins. */
    CHECK_MSG(nk_index_put(&ts, &tv, 1, 1, jdx, false, &bad, &bad_dim) == NK_SUCCESS, "adv put");
    for (int a = 0; a < 4; a++)
        for (int c = 0; c < 3; c++) CHECK_MSG(self[1 * 12 + a * 3 + c] == v[3 + c], "adv put last wins");
    /* Out of range anywhere: nothing written, bad index and dim reported. */
    memcpy(before, self, sizeof self);
    j1[2] = 5;
    CHECK_MSG(nk_index_put(&ts, &tv, 1, 1, jdx, false, &bad, &bad_dim) == NK_INVALID && bad == 5 && bad_dim == 1,
              "adv oob");
    j1[2] = -6;
    CHECK_MSG(nk_index_gather(&(nk_tensor){0}, &ts, 1, 1, jdx, &bad, &bad_dim) == NK_INVALID, "adv bad dst");
    nk_tensor to2 = mk(out, NK_F32, 3, (const int64_t[]){4, 3, 3}, NULL);
    CHECK_MSG(nk_index_gather(&to2, &ts, 1, 1, jdx, &bad, &bad_dim) == NK_INVALID && bad == -6, "adv oob neg");
    CHECK_MSG(memcmp(before, self, sizeof self) == 0, "adv oob untouched");
    /* A 0-d index on a 1-d tensor (scalar result), and an empty index. */
    int64_t z = -1;
    nk_tensor tz = mk(&z, NK_I64, 0, NULL, NULL);
    const nk_tensor *zdx[1] = {&tz};
    double d[3] = {1, 2, 3}, r = 0;
    nk_tensor td = mk(d, NK_F64, 1, &n3, NULL), tr = mk(&r, NK_F64, 0, NULL, NULL);
    CHECK_MSG(nk_index_gather(&tr, &td, 0, 1, zdx, &bad, &bad_dim) == NK_SUCCESS && r == 3, "0-d index");
    const int64_t zero = 0;
    nk_tensor te = mk(NULL, NK_I64, 1, &zero, NULL), tre = mk(NULL, NK_F64, 1, &zero, NULL);
    const nk_tensor *edx[1] = {&te};
    CHECK_MSG(nk_index_gather(&tre, &td, 0, 1, edx, &bad, &bad_dim) == NK_SUCCESS, "empty index");
    uint8_t bl[3] = {0, 1, 0};
    nk_tensor tb = mk(bl, NK_BOOL, 1, &n3, NULL);
    CHECK_MSG(nk_index_put(&tb, &tb, 0, 1, jdx, true, &bad, &bad_dim) == NK_UNSUPPORTED, "bool accumulate");
}

int main(void) {
    nk_threads_set(2);
    test_index_select();
    test_index_copy_add();
    test_gather_scatter();
    test_embedding_backward();
    test_advanced();
    printf("test_index: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
