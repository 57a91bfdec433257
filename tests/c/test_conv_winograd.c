/*
 * test_conv_winograd.c - nk_conv3x3_winograd against a direct convolution in double: odd image sizes (not
 * multiples of the 4x4 output tile), odd channel counts, padding 0/1/2, input and output in contiguous,
 * channels-last and strided-view layouts, with and without bias, batches, 0-size and bad arguments; on
 * one thread and on the pool. bf16/fp16: the reference is the double convolution of the same rounded values,
 * and the result must be within one rounding of it (fp32 Winograd, one rounding at the store). The split
 * entry points (weight transformed once) give the same bits as the one-call form.
 */
#include "neuron_kernels.h"
#include "nk_test.h"
#include "kernels_internal.h"

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

static float get(const void *p, int64_t i, nk_dtype dt);

static size_t esize(nk_dtype dt) {
    return dt == NK_F32 ? 4 : 2;
}

/* Rounds v to dt and stores it at element i of p; returns the rounded value. */
static float put(void *p, int64_t i, float v, nk_dtype dt) {
    if (dt == NK_BF16) ((uint16_t *)p)[i] = nk_f32_to_bf16(v);
    else if (dt == NK_F16) ((uint16_t *)p)[i] = nk_f32_to_f16(v);
    else ((float *)p)[i] = v;
    return get(p, i, dt);
}

static float get(const void *p, int64_t i, nk_dtype dt) {
    if (dt == NK_BF16) return nk_bf16_to_f32(((const uint16_t *)p)[i]);
    if (dt == NK_F16) return nk_f16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static void run_dt(int64_t N, int64_t C, int64_t H, int64_t W, int64_t OC, int64_t ph, int64_t pw, int in_layout,
                   int out_layout, bool with_bias, nk_dtype dt) {
    static const int perms[3][4] = {{0, 1, 2, 3}, {0, 2, 3, 1}, {1, 0, 3, 2}};
    const int64_t OH = H + 2 * ph - 2, OW = W + 2 * pw - 2;
    const int64_t isz[4] = {N, C, H, W}, osz[4] = {N, OC, OH, OW}, wsz[4] = {OC, C, 3, 3};
    int64_t ist[4], ost[4], wst[4] = {C * 9, 9, 3, 1};
    const int64_t ispan = layout(isz, perms[in_layout], in_layout == 2 ? 3 : 0, ist);
    const int64_t ospan = layout(osz, perms[out_layout], out_layout == 2 ? 2 : 0, ost);
    const size_t es = esize(dt);
    char *in = malloc((size_t)(ispan + 1) * es), *out = malloc((size_t)(ospan + 1) * es);
    char *out2 = malloc((size_t)(ospan + 1) * es);
    char *w = malloc((size_t)(OC * C * 9 + 1) * es), *b = malloc((size_t)(OC + 1) * es);
    uint64_t s = (uint64_t)(N * 1000003 + C * 1009 + H * 101 + W * 7 + OC + ph * 13 + pw * 17);
    for (int64_t i = 0; i < ispan; i++) put(in, i, rnd(&s), dt);
    for (int64_t i = 0; i < OC * C * 9; i++) put(w, i, rnd(&s), dt);
    for (int64_t i = 0; i < OC; i++) put(b, i, rnd(&s), dt);
    const float sentinel = 1232.f; /* exact in bf16 and fp16 */
    for (int64_t i = 0; i < ospan; i++) put(out, i, sentinel, dt), put(out2, i, sentinel, dt);
    nk_tensor ti = mk(in, dt, 4, isz, ist), to = mk(out, dt, 4, osz, ost), tw = mk(w, dt, 4, wsz, wst);
    nk_tensor to2 = mk(out2, dt, 4, osz, ost);
    const int64_t bsz[1] = {OC};
    nk_tensor tbias = mk(b, dt, 1, bsz, NULL);
    const int64_t pad[2] = {ph, pw};
    CHECK(nk_conv3x3_winograd(&to, &ti, &tw, with_bias ? &tbias : NULL, pad) == NK_SUCCESS);
    /* the split form: same bits */
    const size_t ub = nk_conv3x3_winograd_weight_bytes(OC, C);
    void *u = aligned_alloc(64, (ub + 63) & ~(size_t)63);
    CHECK(nk_conv3x3_winograd_weight(u, ub, &tw) == NK_SUCCESS);
    CHECK(nk_conv3x3_winograd_pretransformed(&to2, &ti, u, ub, with_bias ? &tbias : NULL, pad) == NK_SUCCESS);
    CHECK_MSG(memcmp(out, out2, (size_t)ospan * es) == 0, "pretransformed differs: N%ld C%ld OC%ld dt%d", (long)N,
              (long)C, (long)OC, (int)dt);
    free(u);
    int64_t written = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OC; o++)
            for (int64_t y = 0; y < OH; y++)
                for (int64_t x = 0; x < OW; x++) {
                    double ref = with_bias ? get(b, o, dt) : 0.0;
                    for (int64_t c = 0; c < C; c++)
                        for (int64_t i = 0; i < 3; i++)
                            for (int64_t j = 0; j < 3; j++) {
                                const int64_t yy = y + i - ph, xx = x + j - pw;
                                if (yy < 0 || yy >= H || xx < 0 || xx >= W) continue;
                                ref += (double)get(w, (o * C + c) * 9 + i * 3 + j, dt) *
                                       get(in, n * ist[0] + c * ist[1] + yy * ist[2] + xx * ist[3], dt);
                            }
                    const float got = get(out, n * ost[0] + o * ost[1] + y * ost[2] + x * ost[3], dt);
                    /* inputs in [-1, 1): the result's scale is sqrt(9 C); F(4, 3) loses a few bits of it; a
                     * bf16/fp16 output adds one rounding (half an ulp: 2^-9 / 2^-12 relative) */
                    double tol = 1e-5 * (1.0 + sqrt(9.0 * (double)C)) * 8;
                    if (dt != NK_F32) tol += fabs(ref) * (dt == NK_BF16 ? 0x1p-8 : 0x1p-11);
                    const double err = fabs(got - ref);
                    CHECK_MSG(err <= tol, "dt%d N%ld C%ld %ldx%ld OC%ld pad %ld,%ld in%d out%d bias%d at [%ld,%ld,%ld,%ld]: %g vs %g",
                              (int)dt, (long)N, (long)C, (long)H, (long)W, (long)OC, (long)ph, (long)pw, in_layout,
                              out_layout, (int)with_bias, (long)n, (long)o, (long)y, (long)x, got, ref);
                    written++;
                }
    /* nothing outside the output's elements is written (the gaps of a strided output) */
    int64_t untouched = 0;
    for (int64_t i = 0; i < ospan; i++) untouched += get(out, i, dt) == sentinel;
    CHECK_MSG(untouched == ospan - written, "dt%d out%d: %ld elements outside the output were written", (int)dt, out_layout, (long)(ospan - written - untouched));
    free(in), free(out), free(out2), free(w), free(b);
}

static void run(int64_t N, int64_t C, int64_t H, int64_t W, int64_t OC, int64_t ph, int64_t pw, int in_layout,
                int out_layout, bool with_bias) {
    run_dt(N, C, H, W, OC, ph, pw, in_layout, out_layout, with_bias, NK_F32);
    run_dt(N, C, H, W, OC, ph, pw, in_layout, out_layout, with_bias, NK_BF16);
    run_dt(N, C, H, W, OC, ph, pw, in_layout, out_layout, with_bias, NK_F16);
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
    nk_tensor tbad = mk(o, NK_F32, 4, bad, NULL), ti16 = mk(a, NK_F16, 4, isz, NULL), ti64 = mk(a, NK_F64, 4, isz, NULL);
    CHECK(nk_conv3x3_winograd(&to, &ti, &tw, NULL, zero) == NK_SUCCESS);
    CHECK(nk_conv3x3_winograd(&tbad, &ti, &tw, NULL, zero) == NK_INVALID);
    CHECK(nk_conv3x3_winograd(&to, &ti, &tw, NULL, neg) == NK_INVALID);
    CHECK(nk_conv3x3_winograd(&to, &ti16, &tw, NULL, zero) == NK_UNSUPPORTED);
    CHECK(nk_conv3x3_winograd(&to, &ti, &tw, NULL, NULL) == NK_INVALID);
    CHECK(nk_conv3x3_winograd(&to, &ti64, &tw, NULL, zero) == NK_UNSUPPORTED);
    /* a transformed weight is refused for other channel counts, a short or misaligned buffer */
    const size_t ub = nk_conv3x3_winograd_weight_bytes(1, 1);
    char *u = aligned_alloc(64, (ub + 127) & ~(size_t)63);
    CHECK(nk_conv3x3_winograd_weight(u, ub - 1, &tw) == NK_INVALID);
    CHECK(nk_conv3x3_winograd_weight(u + 4, ub, &tw) == NK_INVALID);
    CHECK(nk_conv3x3_winograd_weight(u, ub, &tw) == NK_SUCCESS);
    CHECK(nk_conv3x3_winograd_pretransformed(&to, &ti, u, ub, NULL, zero) == NK_SUCCESS);
    const int64_t isz2[4] = {1, 2, 4, 4};
    nk_tensor ti2 = mk(a, NK_F32, 4, isz2, NULL);
    CHECK(nk_conv3x3_winograd_pretransformed(&to, &ti2, u, ub, NULL, zero) == NK_INVALID);
    CHECK(nk_conv3x3_winograd_pretransformed(&to, &ti, u, ub - 1, NULL, zero) == NK_INVALID);
    u[0] ^= 1;
    CHECK(nk_conv3x3_winograd_pretransformed(&to, &ti, u, ub, NULL, zero) == NK_INVALID);
    free(u);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
