/*
 * test_conv_direct.c - nk_conv2d_few_out (few output channels, stride 1) against the definition summed in
 * double: kernel sizes, padding, dilation, 1-8 output channels, rows narrower and wider than a vector block,
 * several images, a strided input, a channels-last output, no bias; fp32, bf16 and fp16. The values are small
 * multiples of 1/4, so fp32 sums are exact and bf16/fp16 outputs are the exact sum rounded once.
 */
#include "neuron_kernels.h"
#include "nk_test.h"
#include "nk_test_values.h"
#include "kernels_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void run(nk_dtype dt, int64_t N, int64_t C, int64_t OC, int64_t H, int64_t W, int64_t kh, int64_t kw,
                const int64_t p[2], const int64_t d[2], int64_t wpad, bool cl_out, bool with_bias) {
    const int64_t OH = H + 2 * p[0] - d[0] * (kh - 1), OW = W + 2 * p[1] - d[1] * (kw - 1);
    const size_t es = dt == NK_F32 ? 4 : 2;
    const int64_t ld = W + wpad; /* the image's row stride: a slice of a wider one */
    void *in = calloc((size_t)(N * C * H * ld + 1), es), *wt = calloc((size_t)(OC * C * kh * kw + 1), es);
    void *b = calloc((size_t)OC + 1, es), *out = calloc((size_t)(N * OC * (OH > 0 ? OH : 0) * (OW > 0 ? OW : 0) + 1), es);
    for (int64_t i = 0; i < N * C * H * ld; i++) put(in, dt, i, val(i));
    for (int64_t i = 0; i < OC * C * kh * kw; i++) put(wt, dt, i, val(i * 7 + 3));
    for (int64_t i = 0; i < OC; i++) put(b, dt, i, val(i * 5 + 2));
    const int64_t isz[4] = {N, C, H, W}, ist[4] = {C * H * ld, H * ld, ld, 1};
    const int64_t wsz[4] = {OC, C, kh, kw}, wst[4] = {C * kh * kw, kh * kw, kw, 1};
    const int64_t osz[4] = {N, OC, OH, OW};
    int64_t ost[4] = {OC * OH * OW, OH * OW, OW, 1};
    if (cl_out) ost[0] = OH * OW * OC, ost[1] = 1, ost[2] = OW * OC, ost[3] = OC;
    const int64_t bsz[1] = {OC}, bst[1] = {1};
    nk_tensor ti = mk(in, dt, 4, isz, ist), tw = mk(wt, dt, 4, wsz, wst), to = mk(out, dt, 4, osz, ost);
    nk_tensor tb = mk(b, dt, 1, bsz, bst);
    CHECK(nk_conv2d_few_out(&to, &ti, &tw, with_bias ? &tb : NULL, p, d) == NK_SUCCESS);
    const double tol = dt == NK_F32 ? 0.0 : (dt == NK_BF16 ? 1.0 / 256 : 1.0 / 1024);
    int bad = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OC; o++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    double want = with_bias ? get(b, dt, o) : 0.0;
                    for (int64_t c = 0; c < C; c++)
                        for (int64_t i = 0; i < kh; i++)
                            for (int64_t j = 0; j < kw; j++) {
                                const int64_t y = oh - p[0] + i * d[0], x = ow - p[1] + j * d[1];
                                if (y < 0 || y >= H || x < 0 || x >= W) continue;
                                want += (double)get(in, dt, ((n * C + c) * H + y) * ld + x) *
                                        get(wt, dt, ((o * C + c) * kh + i) * kw + j);
                            }
                    const double got = get(out, dt, n * ost[0] + o * ost[1] + oh * ost[2] + ow * ost[3]);
                    if (fabs(got - want) > tol * fabs(want)) bad++;
                }
    CHECK_MSG(bad == 0, "dt %d N%lld C%lld OC%lld %lldx%lld k%lldx%lld: %d wrong", (int)dt, (long long)N,
              (long long)C, (long long)OC, (long long)H, (long long)W, (long long)kh, (long long)kw, bad);
    free(in), free(wt), free(b), free(out);
}

int main(void) {
    const nk_dtype dts[] = {NK_F32, NK_BF16, NK_F16};
    const int64_t p11[2] = {1, 1}, p00[2] = {0, 0}, p23[2] = {2, 3}, d11[2] = {1, 1}, d21[2] = {2, 1}, d13[2] = {1, 3};
    /* every vector family this CPU can run: the best first, then each narrower one */
    const char *const isas[] = {"best", "avx2", "generic"};
    for (size_t t = 0; t < 3 * 3; t++) {
        if (t % 3 == 0 && !nk_conv_few_isa_force(isas[t / 3])) {
            t += 2;
            continue;
        }
        const nk_dtype dt = dts[t % 3];
        run(dt, 1, 5, 3, 9, 13, 3, 3, p11, d11, 0, false, true);
        run(dt, 2, 3, 8, 7, 70, 3, 3, p11, d11, 3, false, true);   /* 70 columns: vector blocks and a tail */
        run(dt, 1, 4, 5, 12, 33, 5, 3, p23, d21, 0, true, false);  /* dilated, asymmetric padding, channels-last out */
        run(dt, 2, 6, 1, 6, 40, 1, 4, p00, d13, 2, true, true);
        run(dt, 1, 2, 4, 3, 3, 2, 2, p00, d11, 0, false, true);    /* a 2x2 output */
        run(dt, 1, 16, 2, 20, 17, 3, 3, p11, d11, 1, false, true); /* more rows than a task's row block */
    }
    nk_conv_few_isa_force("best");
    /* shape mismatch, bad dtype */
    float a[64] = {0}, o[64];
    const int64_t sz[4] = {1, 1, 3, 3}, st[4] = {9, 9, 3, 1}, wsz[4] = {1, 1, 3, 3}, osz[4] = {1, 1, 2, 2}, ost[4] = {4, 4, 2, 1};
    nk_tensor ti = mk(a, NK_F32, 4, sz, st), tw = mk(a, NK_F32, 4, wsz, st), to = mk(o, NK_F32, 4, osz, ost);
    CHECK(nk_conv2d_few_out(&to, &ti, &tw, NULL, p11, d11) == NK_INVALID);
    CHECK(nk_conv2d_few_out(&to, &ti, &tw, NULL, p00, d11) == NK_INVALID); /* 1x1 out, not 2x2 */
    const int64_t one[4] = {1, 1, 1, 1};
    nk_tensor t1 = mk(o, NK_F32, 4, one, ost);
    CHECK(nk_conv2d_few_out(&t1, &ti, &tw, NULL, p00, d11) == NK_SUCCESS && o[0] == 0.f);
    nk_tensor ii = mk(a, NK_I32, 4, sz, st), wi = mk(a, NK_I32, 4, wsz, st), oi = mk(o, NK_I32, 4, one, ost);
    CHECK(nk_conv2d_few_out(&oi, &ii, &wi, NULL, p00, d11) == NK_UNSUPPORTED);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
