/*
 * test_rnn.c - the fused LSTM/GRU cells against a double-precision reference written here: forward values,
 * and backward against central differences of that reference (so the gradient formulas are checked
 * independently of the kernel's), with strided gate matrices, with and without biases, in bf16, and the
 * shape/dtype errors.
 */
#include "nk_test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

enum { B = 3, H = 5 };

static double sig(double x) { return 1.0 / (1.0 + exp(-x)); }

/* Reference LSTM cell of row r: writes hy[H], cy[H]. ig/hg row-major [B, 4H]. */
static void ref_lstm(const double *ig, const double *hg, const double *cx, const double *bi, const double *bh, int r,
                     double *hy, double *cy) {
    for (int j = 0; j < H; j++) {
        double g[4];
        for (int k = 0; k < 4; k++) {
            int c = k * H + j;
            g[k] = ig[r * 4 * H + c] + hg[r * 4 * H + c] + (bi ? bi[c] : 0) + (bh ? bh[c] : 0);
        }
        double c = sig(g[1]) * cx[r * H + j] + sig(g[0]) * tanh(g[2]);
        cy[j] = c;
        hy[j] = sig(g[3]) * tanh(c);
    }
}

static void ref_gru(const double *ig, const double *hg, const double *hx, const double *bi, const double *bh, int r,
                    double *hy) {
    for (int j = 0; j < H; j++) {
        int cr = j, cz = H + j, cn = 2 * H + j;
        double rg = sig(ig[r * 3 * H + cr] + (bi ? bi[cr] : 0) + hg[r * 3 * H + cr] + (bh ? bh[cr] : 0));
        double zg = sig(ig[r * 3 * H + cz] + (bi ? bi[cz] : 0) + hg[r * 3 * H + cz] + (bh ? bh[cz] : 0));
        double n = tanh(ig[r * 3 * H + cn] + (bi ? bi[cn] : 0) + rg * (hg[r * 3 * H + cn] + (bh ? bh[cn] : 0)));
        hy[j] = n + zg * (hx[r * H + j] - n);
    }
}

static double frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((*s >> 8) & 0xffff) / 32768.0 - 1.0;
}

/* A [rows, cols] float matrix stored column-major (strides {1, rows}) when transposed. */
static nk_tensor mat(float *d, int64_t rows, int64_t cols, bool transposed) {
    const int64_t sz[2] = {rows, cols}, st[2] = {1, rows};
    return mk(d, NK_F32, 2, sz, transposed ? st : NULL);
}

static void put(float *d, const double *v, int64_t rows, int64_t cols, bool transposed) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) d[transposed ? c * rows + r : r * cols + c] = (float)v[r * cols + c];
}

static void test_lstm(bool bias, bool transposed) {
    unsigned s = 7;
    double ig[B * 4 * H], hg[B * 4 * H], cx[B * H], bi[4 * H], bh[4 * H], wh[B * H], wc[B * H];
    for (int i = 0; i < B * 4 * H; i++) ig[i] = frand(&s), hg[i] = frand(&s);
    for (int i = 0; i < B * H; i++) cx[i] = frand(&s), wh[i] = frand(&s), wc[i] = frand(&s);
    for (int i = 0; i < 4 * H; i++) bi[i] = frand(&s), bh[i] = frand(&s);
    float fig[B * 4 * H], fhg[B * 4 * H], fcx[B * H], fbi[4 * H], fbh[4 * H], fwh[B * H], fwc[B * H];
    float hy[B * H], cy[B * H], ws[B * 4 * H], gg[B * 4 * H], gcx[B * H];
    put(fig, ig, B, 4 * H, transposed), put(fhg, hg, B, 4 * H, false), put(fcx, cx, B, H, false);
    put(fwh, wh, B, H, false), put(fwc, wc, B, H, false);
    for (int i = 0; i < 4 * H; i++) fbi[i] = (float)bi[i], fbh[i] = (float)bh[i];
    const int64_t bsz[1] = {4 * H};
    nk_tensor tig = mat(fig, B, 4 * H, transposed), thg = mat(fhg, B, 4 * H, false), tcx = mat(fcx, B, H, false);
    nk_tensor thy = mat(hy, B, H, false), tcy = mat(cy, B, H, false), tws = mat(ws, B, 4 * H, false);
    nk_tensor tbi = mk(fbi, NK_F32, 1, bsz, NULL), tbh = mk(fbh, NK_F32, 1, bsz, NULL);
    CHECK(nk_lstm_cell(&thy, &tcy, &tws, &tig, &thg, &tcx, bias ? &tbi : NULL, bias ? &tbh : NULL) == NK_SUCCESS);
    for (int r = 0; r < B; r++) {
        double rh[H], rc[H];
        ref_lstm(ig, hg, cx, bias ? bi : NULL, bias ? bh : NULL, r, rh, rc);
        for (int j = 0; j < H; j++)
            CHECK_MSG(fabs(hy[r * H + j] - rh[j]) < 1e-5 && fabs(cy[r * H + j] - rc[j]) < 1e-5, "lstm fwd r%d j%d", r, j);
    }
    /* backward of L = sum(wh*hy + wc*cy) against central differences in the gates and in cx */
    nk_tensor tgg = mat(gg, B, 4 * H, false), tgcx = mat(gcx, B, H, false);
    nk_tensor twh = mat(fwh, B, H, false), twc = mat(fwc, B, H, false);
    CHECK(nk_lstm_cell_backward(&tgg, &tgcx, &twh, &twc, &tcx, &tcy, &tws) == NK_SUCCESS);
    const double eps = 1e-6;
    for (int r = 0; r < B; r++) {
        for (int c = 0; c < 4 * H + H; c++) {
            double *v = c < 4 * H ? &ig[r * 4 * H + c] : &cx[r * H + c - 4 * H], save = *v, lp = 0, lm = 0, rh[H], rc[H];
            *v = save + eps;
            ref_lstm(ig, hg, cx, bias ? bi : NULL, bias ? bh : NULL, r, rh, rc);
            for (int j = 0; j < H; j++) lp += wh[r * H + j] * rh[j] + wc[r * H + j] * rc[j];
            *v = save - eps;
            ref_lstm(ig, hg, cx, bias ? bi : NULL, bias ? bh : NULL, r, rh, rc);
            for (int j = 0; j < H; j++) lm += wh[r * H + j] * rh[j] + wc[r * H + j] * rc[j];
            *v = save;
            double num = (lp - lm) / (2 * eps), got = c < 4 * H ? gg[r * 4 * H + c] : gcx[r * H + c - 4 * H];
            CHECK_MSG(fabs(num - got) < 1e-4, "lstm bwd r%d c%d: %g vs %g", r, c, got, num);
        }
    }
    /* grad_cy absent: the same as zeros */
    float z[B * H] = {0}, gg2[B * 4 * H], gcx2[B * H];
    nk_tensor tz = mat(z, B, H, false), tgg2 = mat(gg2, B, 4 * H, false), tgcx2 = mat(gcx2, B, H, false);
    CHECK(nk_lstm_cell_backward(&tgg, &tgcx, &twh, &tz, &tcx, &tcy, &tws) == NK_SUCCESS);
    CHECK(nk_lstm_cell_backward(&tgg2, &tgcx2, &twh, NULL, &tcx, &tcy, &tws) == NK_SUCCESS);
    CHECK(memcmp(gg, gg2, sizeof gg) == 0 && memcmp(gcx, gcx2, sizeof gcx) == 0);
}

static void test_gru(bool bias) {
    unsigned s = 11;
    double ig[B * 3 * H], hg[B * 3 * H], hx[B * H], bi[3 * H], bh[3 * H], w[B * H];
    for (int i = 0; i < B * 3 * H; i++) ig[i] = frand(&s), hg[i] = frand(&s);
    for (int i = 0; i < B * H; i++) hx[i] = frand(&s), w[i] = frand(&s);
    for (int i = 0; i < 3 * H; i++) bi[i] = frand(&s), bh[i] = frand(&s);
    float fig[B * 3 * H], fhg[B * 3 * H], fhx[B * H], fbi[3 * H], fbh[3 * H], fw[B * H];
    float hy[B * H], ws[B * 5 * H], gig[B * 3 * H], ghg[B * 3 * H], ghx[B * H];
    put(fig, ig, B, 3 * H, false), put(fhg, hg, B, 3 * H, true), put(fhx, hx, B, H, false), put(fw, w, B, H, false);
    for (int i = 0; i < 3 * H; i++) fbi[i] = (float)bi[i], fbh[i] = (float)bh[i];
    const int64_t bsz[1] = {3 * H};
    nk_tensor tig = mat(fig, B, 3 * H, false), thg = mat(fhg, B, 3 * H, true), thx = mat(fhx, B, H, false);
    nk_tensor thy = mat(hy, B, H, false), tws = mat(ws, B, 5 * H, false), tw = mat(fw, B, H, false);
    nk_tensor tbi = mk(fbi, NK_F32, 1, bsz, NULL), tbh = mk(fbh, NK_F32, 1, bsz, NULL);
    CHECK(nk_gru_cell(&thy, &tws, &tig, &thg, &thx, bias ? &tbi : NULL, bias ? &tbh : NULL) == NK_SUCCESS);
    for (int r = 0; r < B; r++) {
        double rh[H];
        ref_gru(ig, hg, hx, bias ? bi : NULL, bias ? bh : NULL, r, rh);
        for (int j = 0; j < H; j++) CHECK_MSG(fabs(hy[r * H + j] - rh[j]) < 1e-5, "gru fwd r%d j%d", r, j);
    }
    nk_tensor tgig = mat(gig, B, 3 * H, false), tghg = mat(ghg, B, 3 * H, false), tghx = mat(ghx, B, H, false);
    CHECK(nk_gru_cell_backward(&tgig, &tghg, &tghx, &tw, &tws) == NK_SUCCESS);
    const double eps = 1e-6;
    for (int r = 0; r < B; r++) {
        for (int c = 0; c < 7 * H; c++) {  /* ig (3H), hg (3H), hx (H) */
            double *v = c < 3 * H ? &ig[r * 3 * H + c] : c < 6 * H ? &hg[r * 3 * H + c - 3 * H] : &hx[r * H + c - 6 * H];
            double save = *v, lp = 0, lm = 0, rh[H];
            *v = save + eps;
            ref_gru(ig, hg, hx, bias ? bi : NULL, bias ? bh : NULL, r, rh);
            for (int j = 0; j < H; j++) lp += w[r * H + j] * rh[j];
            *v = save - eps;
            ref_gru(ig, hg, hx, bias ? bi : NULL, bias ? bh : NULL, r, rh);
            for (int j = 0; j < H; j++) lm += w[r * H + j] * rh[j];
            *v = save;
            double num = (lp - lm) / (2 * eps);
            double got = c < 3 * H ? gig[r * 3 * H + c] : c < 6 * H ? ghg[r * 3 * H + c - 3 * H] : ghx[r * H + c - 6 * H];
            CHECK_MSG(fabs(num - got) < 1e-4, "gru bwd r%d c%d: %g vs %g", r, c, got, num);
        }
    }
}

/* bf16 operands: each output is the fp32 result rounded once (within a bf16 ulp of it). */
static void test_bf16(void) {
    unsigned s = 3;
    uint16_t ig[B * 4 * H], hg[B * 4 * H], cx[B * H], hy[B * H], cy[B * H], ws[B * 4 * H];
    float fig[B * 4 * H], fhg[B * 4 * H], fcx[B * H], fhy[B * H], fcy[B * H], fws[B * 4 * H];
    for (int i = 0; i < B * 4 * H; i++) {
        fig[i] = (float)frand(&s), fhg[i] = (float)frand(&s);
        uint32_t u;
        memcpy(&u, &fig[i], 4), u &= 0xffff0000u, memcpy(&fig[i], &u, 4), ig[i] = (uint16_t)(u >> 16);
        memcpy(&u, &fhg[i], 4), u &= 0xffff0000u, memcpy(&fhg[i], &u, 4), hg[i] = (uint16_t)(u >> 16);
    }
    for (int i = 0; i < B * H; i++) {
        fcx[i] = (float)frand(&s);
        uint32_t u;
        memcpy(&u, &fcx[i], 4), u &= 0xffff0000u, memcpy(&fcx[i], &u, 4), cx[i] = (uint16_t)(u >> 16);
    }
    const int64_t g[2] = {B, 4 * H}, h[2] = {B, H};
    nk_tensor a = mk(hy, NK_BF16, 2, h, NULL), b = mk(cy, NK_BF16, 2, h, NULL), c = mk(ws, NK_BF16, 2, g, NULL);
    nk_tensor d = mk(ig, NK_BF16, 2, g, NULL), e = mk(hg, NK_BF16, 2, g, NULL), f = mk(cx, NK_BF16, 2, h, NULL);
    CHECK(nk_lstm_cell(&a, &b, &c, &d, &e, &f, NULL, NULL) == NK_SUCCESS);
    nk_tensor a2 = mk(fhy, NK_F32, 2, h, NULL), b2 = mk(fcy, NK_F32, 2, h, NULL), c2 = mk(fws, NK_F32, 2, g, NULL);
    nk_tensor d2 = mk(fig, NK_F32, 2, g, NULL), e2 = mk(fhg, NK_F32, 2, g, NULL), f2 = mk(fcx, NK_F32, 2, h, NULL);
    CHECK(nk_lstm_cell(&a2, &b2, &c2, &d2, &e2, &f2, NULL, NULL) == NK_SUCCESS);
    for (int i = 0; i < B * H; i++) {
        uint32_t u = (uint32_t)hy[i] << 16;
        float v;
        memcpy(&v, &u, 4);
        CHECK_MSG(fabsf(v - fhy[i]) <= fabsf(fhy[i]) / 128 + 1e-6f, "bf16 hy %d: %g vs %g", i, v, fhy[i]);
    }
}

static void test_errors(void) {
    float buf[64] = {0};
    const int64_t g[2] = {2, 8}, h[2] = {2, 2}, bad[2] = {2, 7}, b3[1] = {5};
    nk_tensor tg = mk(buf, NK_F32, 2, g, NULL), th = mk(buf, NK_F32, 2, h, NULL), tb = mk(buf, NK_F32, 2, bad, NULL);
    nk_tensor tbias = mk(buf, NK_F32, 1, b3, NULL), ti = mk(buf, NK_I32, 2, h, NULL);
    CHECK(nk_lstm_cell(&th, &th, &tg, &tb, &tg, &th, NULL, NULL) == NK_INVALID);     /* gates not [B, 4H] */
    CHECK(nk_lstm_cell(&th, &th, &tg, &tg, &tg, &th, &tbias, NULL) == NK_INVALID);   /* bias not [4H] */
    nk_tensor tgi = mk(buf, NK_I32, 2, g, NULL);
    CHECK(nk_lstm_cell(&ti, &ti, &tgi, &tgi, &tgi, &ti, NULL, NULL) == NK_UNSUPPORTED); /* int32 */
    CHECK(nk_gru_cell_backward(&tg, &tg, &th, &th, &tg) == NK_INVALID);              /* ws not [B, 5H] */
    const int64_t e4[2] = {0, 8}, e1[2] = {0, 2};                                    /* an empty batch */
    nk_tensor eg = mk(buf, NK_F32, 2, e4, NULL), eh = mk(buf, NK_F32, 2, e1, NULL);
    CHECK(nk_lstm_cell(&eh, &eh, &eg, &eg, &eg, &eh, NULL, NULL) == NK_SUCCESS);
}

int main(void) {
    for (int bias = 0; bias < 2; bias++) {
        test_lstm(bias, false);
        test_lstm(bias, true);
        test_gru(bias);
    }
    test_bf16();
    test_errors();
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
