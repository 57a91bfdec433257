/*
 * test_conv_winograd.c - nk_conv3x3_winograd against a direct convolution in double: odd image sizes (not
 * multiples of the 4x4 output tile), odd channel counts, padding 0/1/2, input and output in contiguous,
 * channels-last and strided-view layouts, with and without bias, batches, 0-size and bad arguments; on
 * one thread and on the pool.
 */
#include "neuron_kernels.h"
#include "nk_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xFFFF) / 32768.f - 1.f; /* [-1, 1) */
}

/* Strides of a 4-D [d0, d1, d2, d3] tensor laid out in the order perm (outermost first) with `gap` extra
 * elements after each innermost run (a strided view); returns the elements spanned. */
static int64_t layout(const int64_t sizes[4], const int perm[4], int64_t gap, int64_t strides[4]) {
    int64_t st = 1;
    for (int k = 3; k >= 0; k--) {
        const int d = perm[k];
        strides[d] = st;
        st *= sizes[d] + (k == 3 ? gap : 0);
    }
    return st;
}

static void run(int64_t N, int64_t C, int64_t H, int64_t W, int64_t OC, int64_t ph, int64_t pw, int in_layout,
                int out_layout, bool with_bias) {
    static const int perms[3][4] = {{0, 1, 2, 3}, {0, 2, 3, 1}, {1, 0, 3, 2}};
    const int64_t OH = H + 2 * ph - 2, OW = W + 2 * pw - 2;
    const int64_t isz[4] = {N, C, H, W}, osz[4] = {N, OC, OH, OW}, wsz[4] = {OC, C, 3, 3};
    int64_t ist[4], ost[4], wst[4] = {C * 9, 9, 3, 1};
    const int64_t ispan = layout(isz, perms[in_layout], in_layout == 2 ? 3 : 0, ist);
    const int64_t ospan = layout(osz, perms[out_layout], out_layout == 2 ? 2 : 0, ost);
    float *in = malloc((size_t)(ispan + 1) * sizeof(float)), *out = malloc((size_t)(ospan + 1) * sizeof(float));
    float *w = malloc((size_t)(OC * C * 9 + 1) * sizeof(float)), *b = malloc((size_t)(OC + 1) * sizeof(float));
    uint64_t s = (uint64_t)(N * 1000003 + C * 1009 + H * 101 + W * 7 + OC + ph * 13 + pw * 17);
    for (int64_t i = 0; i < ispan; i++) in[i] = rnd(&s);
    for (int64_t i = 0; i < OC * C * 9; i++) w[i] = rnd(&s);
    for (int64_t i = 0; i < OC; i++) b[i] = rnd(&s);
    const float sentinel = 1234.5f;
    for (int64_t i = 0; i < ospan; i++) out[i] = sentinel;
    nk_tensor ti = mk(in, NK_F32, 4, isz, ist), to = mk(out, NK_F32, 4, osz, ost), tw = mk(w, NK_F32, 4, wsz, wst);
    const int64_t bsz[1] = {OC};
    nk_tensor tbias = mk(b, NK_F32, 1, bsz, NULL);
    const int64_t pad[2] = {ph, pw};
    CHECK(nk_conv3x3_winograd(&to, &ti, &tw, with_bias ? &tbias : NULL, pad) == NK_SUCCESS);
    double worst = 0;
    int64_t written = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OC; o++)
            for (int64_t y = 0; y < OH; y++)
                for (int64_t x = 0; x < OW; x++) {
                    double ref = with_bias ? b[o] : 0.0;
                    for (int64_t c = 0; c < C; c++)
                        for (int64_t i = 0; i < 3; i++)
                            for (int64_t j = 0; j < 3; j++) {
                                const int64_t yy = y + i - ph, xx = x + j - pw;
                                if (yy < 0 || yy >= H || xx < 0 || xx >= W) continue;
                                ref += (double)w[(o * C + c) * 9 + i * 3 + j] *
                                       in[n * ist[0] + c * ist[1] + yy * ist[2] + xx * ist[3]];
                            }
                    const float got = out[n * ost[0] + o * ost[1] + y * ost[2] + x * ost[3]];
                    /* inputs in [-1, 1): the result's scale is sqrt(9 C); F(4, 3) loses a few bits of it */
                    const double tol = 1e-5 * (1.0 + sqrt(9.0 * (double)C)) * 8;
                    const double err = fabs(got - ref);
                    if (err > worst) worst = err;
                    CHECK_MSG(err <= tol, "N%ld C%ld %ldx%ld OC%ld pad %ld,%ld in%d out%d bias%d at [%ld,%ld,%ld,%ld]: %g vs %g",
                              (long)N, (long)C, (long)H, (long)W, (long)OC, (long)ph, (long)pw, in_layout, out_layout,
                              (int)with_bias, (long)n, (long)o, (long)y, (long)x, got, ref);
                    written++;
                }
    /* nothing outside the output's elements is written (the gaps of a strided output) */
    int64_t untouched = 0;
    for (int64_t i = 0; i < ospan; i++) untouched += out[i] == sentinel;
    CHECK_MSG(untouched == ospan - written, "%ld elements outside the output were written", (long)(ospan - written - untouched));
    free(in), free(out), free(w), free(b);
}

int main(void) {
    const int64_t shapes[][5] = {
        /* N C H W OC */
        {1, 3, 5, 7, 5}, {2, 5, 9, 6, 3}, {1, 17, 13, 11, 17}, {1, 1, 3, 3, 1}, {3, 2, 4, 4, 7},
        {1, 8, 16, 16, 16}, {1, 32, 20, 19, 13}, {1, 64, 8, 12, 70},
    };
    for (int threads = 1; threads <= 2; threads++) {
        nk_threads_set(threads);
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
            for (int64_t p = 0; p <= 2; p++)
                for (int lay = 0; lay < 3; lay++) {
                    const int64_t *s = shapes[k];
                    if (s[2] + 2 * p < 3 || s[3] + 2 * p < 3) continue;
                    run(s[0], s[1], s[2], s[3], s[4], p, p, lay, (lay + k) % 3, (k + p) % 2 == 0);
                }
        run(2, 5, 7, 9, 6, 1, 2, 0, 1, true); /* unequal padding */
        run(1, 4, 6, 5, 3, 2, 0, 2, 0, false);
    }
    /* 0-size: no images, no output channels, no input channels (the bias alone) */
    run(0, 3, 5, 5, 4, 1, 1, 0, 0, true);
    run(1, 3, 5, 5, 0, 1, 1, 0, 0, true);
    run(1, 0, 5, 5, 4, 1, 1, 0, 0, true);
    run(2, 0, 6, 3, 3, 0, 1, 1, 1, false);
    /* bad arguments */
    float a[64] = {0}, o[64], w[64] = {0};
    const int64_t isz[4] = {1, 1, 4, 4}, osz[4] = {1, 1, 2, 2}, wsz[4] = {1, 1, 3, 3}, bad[4] = {1, 1, 3, 2};
    const int64_t zero[2] = {0, 0}, neg[2] = {-1, 0};
    nk_tensor ti = mk(a, NK_F32, 4, isz, NULL), to = mk(o, NK_F32, 4, osz, NULL), tw = mk(w, NK_F32, 4, wsz, NULL);
    nk_tensor tbad = mk(o, NK_F32, 4, bad, NULL), ti16 = mk(a, NK_F16, 4, isz, NULL);
    CHECK(nk_conv3x3_winograd(&to, &ti, &tw, NULL, zero) == NK_SUCCESS);
    CHECK(nk_conv3x3_winograd(&tbad, &ti, &tw, NULL, zero) == NK_INVALID);
    CHECK(nk_conv3x3_winograd(&to, &ti, &tw, NULL, neg) == NK_INVALID);
    CHECK(nk_conv3x3_winograd(&to, &ti16, &tw, NULL, zero) == NK_UNSUPPORTED);
    CHECK(nk_conv3x3_winograd(&to, &ti, &tw, NULL, NULL) == NK_INVALID);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
