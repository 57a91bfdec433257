/*
 * test_conv.c - nk_im2col against the definition written out directly, and nk_col2im as its adjoint:
 * <im2col(x), y> == <x, col2im(y)> for every geometry (strides, padding, dilation, a strided image,
 * an empty output), in fp32, bf16 and fp16.
 */
#include "neuron_kernels.h"
#include "nk_test.h"
#include "nk_test_values.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void run(nk_dtype dt, int64_t C, int64_t H, int64_t W, const int64_t k[2], const int64_t s[2], const int64_t p[2],
                const int64_t d[2], int64_t wpad) {
    const int64_t eh = H + 2 * p[0] - d[0] * (k[0] - 1) - 1, ew = W + 2 * p[1] - d[1] * (k[1] - 1) - 1;
    const int64_t OH = eh < 0 ? 0 : eh / s[0] + 1, OW = ew < 0 ? 0 : ew / s[1] + 1;
    const int64_t rows = C * k[0] * k[1], cols = OH * OW;
    const size_t es = dt == NK_F32 ? 4 : 2;
    /* The image is a view with row stride W + wpad (a slice of a wider tensor). */
    const int64_t ld = W + wpad;
    void *img = calloc((size_t)(C * H * ld + 1), es), *col = calloc((size_t)(rows * cols + 1), es);
    void *img2 = calloc((size_t)(C * H * ld + 1), es), *y = calloc((size_t)(rows * cols + 1), es);
    for (int64_t c = 0; c < C; c++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t w = 0; w < W; w++) put(img, dt, (c * H + h) * ld + w, val(c * 1000 + h * 31 + w));
    for (int64_t i = 0; i < rows * cols; i++) put(y, dt, i, val(i * 3 + 1));
    const int64_t isz[3] = {C, H, W}, ist[3] = {H * ld, ld, 1}, csz[2] = {rows, cols}, cst[2] = {cols, 1};
    nk_tensor ti = mk(img, dt, 3, isz, ist), tc = mk(col, dt, 2, csz, cst);
    nk_tensor ti2 = mk(img2, dt, 3, isz, ist), ty = mk(y, dt, 2, csz, cst);
    CHECK(nk_im2col(&tc, &ti, k, s, p, d) == NK_SUCCESS);
    int bad = 0;
    for (int64_t c = 0; c < C; c++)
        for (int64_t i = 0; i < k[0]; i++)
            for (int64_t j = 0; j < k[1]; j++)
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++) {
                        const int64_t yy = oh * s[0] - p[0] + i * d[0], xx = ow * s[1] - p[1] + j * d[1];
                        const float want = (yy < 0 || yy >= H || xx < 0 || xx >= W) ? 0.f : get(img, dt, (c * H + yy) * ld + xx);
                        const int64_t r = (c * k[0] + i) * k[1] + j;
                        if (get(col, dt, r * cols + oh * OW + ow) != want) bad++;
                    }
    CHECK(bad == 0);
    /* adjoint: sum(im2col(img) * y) == sum(img * col2im(y)), both exact in double for these values */
    CHECK(nk_col2im(&ti2, &ty, k, s, p, d) == NK_SUCCESS);
    double lhs = 0, rhs = 0;
    for (int64_t i = 0; i < rows * cols; i++) lhs += (double)get(col, dt, i) * get(y, dt, i);
    for (int64_t c = 0; c < C; c++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t w = 0; w < W; w++) {
                const int64_t at = (c * H + h) * ld + w;
                rhs += (double)get(img, dt, at) * get(img2, dt, at);
            }
    CHECK(fabs(lhs - rhs) <= 1e-9 * (1.0 + fabs(lhs)));
    /* the padding columns of the strided image are never written */
    int touched = 0;
    for (int64_t c = 0; c < C; c++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t w = W; w < ld; w++) touched += get(img2, dt, (c * H + h) * ld + w) != 0.f;
    CHECK(touched == 0);
    free(img), free(col), free(img2), free(y);
}

int main(void) {
    const nk_dtype dts[] = {NK_F32, NK_BF16, NK_F16};
    const int64_t geo[][8] = {
        /* kh kw sh sw ph pw dh dw */
        {3, 3, 1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 0, 0, 1, 1}, {3, 2, 2, 1, 0, 1, 1, 1},
        {2, 3, 2, 3, 1, 2, 2, 1}, {5, 5, 1, 1, 2, 2, 1, 1}, {3, 3, 2, 2, 1, 1, 2, 2},
        {7, 7, 1, 1, 0, 0, 1, 1}, /* larger than the 5x6 image: an empty output */
    };
    for (size_t t = 0; t < 3; t++)
        for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++)
            for (int64_t wpad = 0; wpad <= 3; wpad += 3) run(dts[t], 3, 5, 6, geo[g], geo[g] + 2, geo[g] + 4, geo[g] + 6, wpad);
    /* bad geometry and a mismatched col */
    float a[8], b[8];
    const int64_t isz[3] = {1, 2, 2}, ist[3] = {4, 2, 1}, csz[2] = {4, 1}, cst[2] = {1, 1}, bad[2] = {3, 1};
    const int64_t k2[2] = {2, 2}, one[2] = {1, 1}, zero[2] = {0, 0}, neg[2] = {0, -1};
    nk_tensor ti = mk(a, NK_F32, 3, isz, ist), tc = mk(b, NK_F32, 2, csz, cst), tb = mk(b, NK_F32, 2, bad, cst);
    CHECK(nk_im2col(&tc, &ti, k2, one, zero, one) == NK_SUCCESS);
    CHECK(nk_im2col(&tb, &ti, k2, one, zero, one) == NK_INVALID);
    CHECK(nk_im2col(&tc, &ti, k2, zero, zero, one) == NK_INVALID);
    CHECK(nk_col2im(&ti, &tc, k2, one, neg, one) == NK_INVALID);
    nk_tensor ii = mk(a, NK_I32, 3, isz, ist), ci = mk(b, NK_I32, 2, csz, cst);
    CHECK(nk_col2im(&ii, &ci, k2, one, zero, one) == NK_UNSUPPORTED);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
