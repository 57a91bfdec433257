/*
 * rnn.c - the fused LSTM and GRU cells (PyTorch's _thnn_fused_lstm_cell / _thnn_fused_gru_cell and their
 * backward). PyTorch sends every recurrent network on a non-CPU device through these cells and has no
 * CPU kernel for them, so without them nn.LSTM/GRU and their cells cannot run on the device at all.
 *
 * One task per batch row: a row's gates are contiguous in H, rows are independent. Math in fp32,
 * each stored value rounded once to its dtype.
 */
#include "neuron_kernels.h"

#include <math.h>

#include "kernels_internal.h"

static inline float rnn_load(const nk_tensor *t, int64_t r, int64_t c) {
    const char *p = (const char *)t->data + (r * t->strides[0] + c * t->strides[1]) * (int64_t)nk_dtype_size(t->dtype);
    switch (t->dtype) {
    case NK_F32: return *(const float *)p;
    case NK_BF16: return nk_bf16_to_f32(*(const uint16_t *)p);
    default: return nk_f16_to_f32(*(const uint16_t *)p);
    }
}

static inline void rnn_store(const nk_tensor *t, int64_t r, int64_t c, float v) {
    char *p = (char *)t->data + (r * t->strides[0] + c * t->strides[1]) * (int64_t)nk_dtype_size(t->dtype);
    switch (t->dtype) {
    case NK_F32: *(float *)p = v; break;
    case NK_BF16: *(uint16_t *)p = nk_f32_to_bf16(v); break;
    default: *(uint16_t *)p = nk_f32_to_f16(v); break;
    }
}

/* A bias [G*H] (or NULL: 0) at column c. */
static inline float rnn_bias(const nk_tensor *b, int64_t c) {
    if (b == NULL) return 0.f;
    nk_tensor row = *b;
    row.strides[1] = b->strides[0];
    return rnn_load(&row, 0, c);
}

static inline float rnn_sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

/* t is a [rows, cols] matrix of dtype dt (NULL allowed when optional). */
static bool rnn_matrix(const nk_tensor *t, int64_t rows, int64_t cols, nk_dtype dt, bool optional) {
    if (t == NULL) return optional;
    return t->data != NULL && t->dtype == dt && t->ndim == 2 && t->sizes[0] == rows && t->sizes[1] == cols;
}

static bool rnn_vector(const nk_tensor *t, int64_t n, nk_dtype dt) {
    return t == NULL || (t->dtype == dt && t->ndim == 1 && t->sizes[0] == n);
}

static bool rnn_dtype_ok(nk_dtype dt) { return dt == NK_F32 || dt == NK_BF16 || dt == NK_F16; }

typedef struct rnn_ctx {
    const nk_tensor *a[8];
    int64_t H;
} rnn_ctx;

/* ---- LSTM ---- */

static void lstm_fwd_range(void *vctx, int64_t begin, int64_t end) {
    const rnn_ctx *x = vctx;
    const nk_tensor *hy = x->a[0], *cy = x->a[1], *ws = x->a[2], *ig = x->a[3], *hg = x->a[4], *cx = x->a[5];
    const nk_tensor *bi = x->a[6], *bh = x->a[7];
    const int64_t H = x->H;
    for (int64_t r = begin; r < end; r++) {
        for (int64_t j = 0; j < H; j++) {
            float g4[4];
            for (int k = 0; k < 4; k++) {
                const int64_t c = k * H + j;
                g4[k] = rnn_load(ig, r, c) + rnn_load(hg, r, c) + rnn_bias(bi, c) + rnn_bias(bh, c);
            }
            const float i = rnn_sigmoid(g4[0]), f = rnn_sigmoid(g4[1]), g = tanhf(g4[2]), o = rnn_sigmoid(g4[3]);
            const float c_new = f * rnn_load(cx, r, j) + i * g;
            rnn_store(cy, r, j, c_new);
            rnn_store(hy, r, j, o * tanhf(c_new));
            rnn_store(ws, r, j, i);
            rnn_store(ws, r, H + j, f);
            rnn_store(ws, r, 2 * H + j, g);
            rnn_store(ws, r, 3 * H + j, o);
        }
    }
}

nk_status nk_lstm_cell(const nk_tensor *hy, const nk_tensor *cy, const nk_tensor *ws, const nk_tensor *ig,
                       const nk_tensor *hg, const nk_tensor *cx, const nk_tensor *bi, const nk_tensor *bh) {
    if (ig == NULL || cx == NULL || ig->ndim != 2 || cx->ndim != 2) return NK_INVALID;
    const nk_dtype dt = ig->dtype;
    const int64_t B = cx->sizes[0], H = cx->sizes[1];
    if (!rnn_dtype_ok(dt)) return NK_UNSUPPORTED;
    if (!rnn_matrix(ig, B, 4 * H, dt, false) || !rnn_matrix(hg, B, 4 * H, dt, false) ||
        !rnn_matrix(cx, B, H, dt, false) || !rnn_matrix(hy, B, H, dt, false) || !rnn_matrix(cy, B, H, dt, false) ||
        !rnn_matrix(ws, B, 4 * H, dt, false) || !rnn_vector(bi, 4 * H, dt) || !rnn_vector(bh, 4 * H, dt))
        return NK_INVALID;
    if (B == 0 || H == 0) return NK_SUCCESS;
    rnn_ctx x = {{hy, cy, ws, ig, hg, cx, bi, bh}, H};
    nk_parallel_for(B, H >= 1024 ? 1 : 1024 / H + 1, lstm_fwd_range, &x);
    return NK_SUCCESS;
}

static void lstm_bwd_range(void *vctx, int64_t begin, int64_t end) {
    const rnn_ctx *x = vctx;
    const nk_tensor *gg = x->a[0], *gcx = x->a[1], *ghy = x->a[2], *gcy = x->a[3], *cx = x->a[4], *cy = x->a[5];
    const nk_tensor *ws = x->a[6];
    const int64_t H = x->H;
    for (int64_t r = begin; r < end; r++) {
        for (int64_t j = 0; j < H; j++) {
            const float i = rnn_load(ws, r, j), f = rnn_load(ws, r, H + j), g = rnn_load(ws, r, 2 * H + j);
            const float o = rnn_load(ws, r, 3 * H + j);
            const float dh = ghy ? rnn_load(ghy, r, j) : 0.f, dc_in = gcy ? rnn_load(gcy, r, j) : 0.f;
            const float tc = tanhf(rnn_load(cy, r, j));
            const float dc = dc_in + dh * o * (1.f - tc * tc);
            rnn_store(gg, r, j, dc * g * i * (1.f - i));
            rnn_store(gg, r, H + j, dc * rnn_load(cx, r, j) * f * (1.f - f));
            rnn_store(gg, r, 2 * H + j, dc * i * (1.f - g * g));
            rnn_store(gg, r, 3 * H + j, dh * tc * o * (1.f - o));
            rnn_store(gcx, r, j, dc * f);
        }
    }
}

nk_status nk_lstm_cell_backward(const nk_tensor *grad_gates, const nk_tensor *grad_cx, const nk_tensor *grad_hy,
                                const nk_tensor *grad_cy, const nk_tensor *cx, const nk_tensor *cy,
                                const nk_tensor *ws) {
    if (cx == NULL || cx->ndim != 2) return NK_INVALID;
    const nk_dtype dt = cx->dtype;
    const int64_t B = cx->sizes[0], H = cx->sizes[1];
    if (!rnn_dtype_ok(dt)) return NK_UNSUPPORTED;
    if (!rnn_matrix(grad_gates, B, 4 * H, dt, false) || !rnn_matrix(grad_cx, B, H, dt, false) ||
        !rnn_matrix(grad_hy, B, H, dt, true) || !rnn_matrix(grad_cy, B, H, dt, true) ||
        !rnn_matrix(cy, B, H, dt, false) || !rnn_matrix(ws, B, 4 * H, dt, false))
        return NK_INVALID;
    if (B == 0 || H == 0) return NK_SUCCESS;
    rnn_ctx x = {{grad_gates, grad_cx, grad_hy, grad_cy, cx, cy, ws, NULL}, H};
    nk_parallel_for(B, H >= 1024 ? 1 : 1024 / H + 1, lstm_bwd_range, &x);
    return NK_SUCCESS;
}

/* ---- GRU ---- */

static void gru_fwd_range(void *vctx, int64_t begin, int64_t end) {
    const rnn_ctx *x = vctx;
    const nk_tensor *hy = x->a[0], *ws = x->a[1], *ig = x->a[2], *hg = x->a[3], *hx = x->a[4];
    const nk_tensor *bi = x->a[5], *bh = x->a[6];
    const int64_t H = x->H;
    for (int64_t r = begin; r < end; r++) {
        for (int64_t j = 0; j < H; j++) {
            const int64_t cr = j, cz = H + j, cn = 2 * H + j;
            const float rg = rnn_sigmoid(rnn_load(ig, r, cr) + rnn_bias(bi, cr) + rnn_load(hg, r, cr) + rnn_bias(bh, cr));
            const float zg = rnn_sigmoid(rnn_load(ig, r, cz) + rnn_bias(bi, cz) + rnn_load(hg, r, cz) + rnn_bias(bh, cz));
            const float hn = rnn_load(hg, r, cn) + rnn_bias(bh, cn);
            const float ng = tanhf(rnn_load(ig, r, cn) + rnn_bias(bi, cn) + rg * hn);
            const float h = rnn_load(hx, r, j);
            rnn_store(hy, r, j, ng + zg * (h - ng));
            rnn_store(ws, r, j, rg);
            rnn_store(ws, r, H + j, zg);
            rnn_store(ws, r, 2 * H + j, ng);
            rnn_store(ws, r, 3 * H + j, h);
            rnn_store(ws, r, 4 * H + j, hn);
        }
    }
}

nk_status nk_gru_cell(const nk_tensor *hy, const nk_tensor *ws, const nk_tensor *ig, const nk_tensor *hg,
                      const nk_tensor *hx, const nk_tensor *bi, const nk_tensor *bh) {
    if (hx == NULL || hx->ndim != 2) return NK_INVALID;
    const nk_dtype dt = hx->dtype;
    const int64_t B = hx->sizes[0], H = hx->sizes[1];
    if (!rnn_dtype_ok(dt)) return NK_UNSUPPORTED;
    if (!rnn_matrix(ig, B, 3 * H, dt, false) || !rnn_matrix(hg, B, 3 * H, dt, false) ||
        !rnn_matrix(hy, B, H, dt, false) || !rnn_matrix(ws, B, 5 * H, dt, false) || !rnn_vector(bi, 3 * H, dt) ||
        !rnn_vector(bh, 3 * H, dt))
        return NK_INVALID;
    if (B == 0 || H == 0) return NK_SUCCESS;
    rnn_ctx x = {{hy, ws, ig, hg, hx, bi, bh, NULL}, H};
    nk_parallel_for(B, H >= 1024 ? 1 : 1024 / H + 1, gru_fwd_range, &x);
    return NK_SUCCESS;
}

static void gru_bwd_range(void *vctx, int64_t begin, int64_t end) {
    const rnn_ctx *x = vctx;
    const nk_tensor *gig = x->a[0], *ghg = x->a[1], *ghx = x->a[2], *ghy = x->a[3], *ws = x->a[4];
    const int64_t H = x->H;
    for (int64_t r = begin; r < end; r++) {
        for (int64_t j = 0; j < H; j++) {
            const float rg = rnn_load(ws, r, j), zg = rnn_load(ws, r, H + j), ng = rnn_load(ws, r, 2 * H + j);
            const float h = rnn_load(ws, r, 3 * H + j), hn = rnn_load(ws, r, 4 * H + j);
            const float dh = rnn_load(ghy, r, j);
            const float dn = dh * (1.f - zg) * (1.f - ng * ng);
            const float dz = dh * (h - ng) * zg * (1.f - zg);
            const float dr = dn * hn * rg * (1.f - rg);
            rnn_store(gig, r, j, dr);
            rnn_store(gig, r, H + j, dz);
            rnn_store(gig, r, 2 * H + j, dn);
            rnn_store(ghg, r, j, dr);
            rnn_store(ghg, r, H + j, dz);
            rnn_store(ghg, r, 2 * H + j, dn * rg);
            rnn_store(ghx, r, j, dh * zg);
        }
    }
}

nk_status nk_gru_cell_backward(const nk_tensor *grad_ig, const nk_tensor *grad_hg, const nk_tensor *grad_hx,
                               const nk_tensor *grad_hy, const nk_tensor *ws) {
    if (grad_hy == NULL || grad_hy->ndim != 2) return NK_INVALID;
    const nk_dtype dt = grad_hy->dtype;
    const int64_t B = grad_hy->sizes[0], H = grad_hy->sizes[1];
    if (!rnn_dtype_ok(dt)) return NK_UNSUPPORTED;
    if (!rnn_matrix(grad_ig, B, 3 * H, dt, false) || !rnn_matrix(grad_hg, B, 3 * H, dt, false) ||
        !rnn_matrix(grad_hx, B, H, dt, false) || !rnn_matrix(ws, B, 5 * H, dt, false))
        return NK_INVALID;
    if (B == 0 || H == 0) return NK_SUCCESS;
    rnn_ctx x = {{grad_ig, grad_hg, grad_hx, grad_hy, ws, NULL, NULL, NULL}, H};
    nk_parallel_for(B, H >= 1024 ? 1 : 1024 / H + 1, gru_bwd_range, &x);
    return NK_SUCCESS;
}
