/*
 * conv.c - the data movement of a 2-D convolution lowered to GEMM: im2col gathers the receptive fields
 * of one image into a matrix, so the convolution is one product with the weight (gemm.c); col2im is its
 * adjoint, turning the gradient of that matrix back into the gradient of the image.
 *
 * col2im is written as a gather: each input element sums the (at most kh*kw) matrix entries that read
 * it and is written once, so no zeroing pass and no atomics between threads.
 */
#include "kernels_internal.h"

typedef struct conv_geom {
    int64_t C, H, W, OH, OW;
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
} conv_geom;

static bool geom_of(conv_geom *g, const nk_tensor *img, const nk_tensor *col, const int64_t kernel[2],
                    const int64_t stride[2], const int64_t padding[2], const int64_t dilation[2]) {
    if (img->ndim != 3 || col->ndim != 2) return false;
    *g = (conv_geom){.C = img->sizes[0], .H = img->sizes[1], .W = img->sizes[2], .kh = kernel[0], .kw = kernel[1],
                     .sh = stride[0], .sw = stride[1], .ph = padding[0], .pw = padding[1], .dh = dilation[0],
                     .dw = dilation[1]};
    if (g->kh <= 0 || g->kw <= 0 || g->sh <= 0 || g->sw <= 0 || g->dh <= 0 || g->dw <= 0 || g->ph < 0 || g->pw < 0)
        return false;
    const int64_t eh = g->H + 2 * g->ph - g->dh * (g->kh - 1) - 1, ew = g->W + 2 * g->pw - g->dw * (g->kw - 1) - 1;
    g->OH = eh < 0 ? 0 : eh / g->sh + 1;
    g->OW = ew < 0 ? 0 : ew / g->sw + 1;
    /* col is [C*kh*kw, OH*OW], rows contiguous. */
    return col->sizes[0] == g->C * g->kh * g->kw && col->sizes[1] == g->OH * g->OW && col->strides[1] == 1;
}

static inline float load_as_f32(const char *p, nk_dtype dt) {
    switch (dt) {
    case NK_BF16: return nk_bf16_to_f32(*(const uint16_t *)p);
    case NK_F16: return nk_f16_to_f32(*(const uint16_t *)p);
    default: return *(const float *)p;
    }
}

static inline void store_from_f32(char *p, nk_dtype dt, float v) {
    switch (dt) {
    case NK_BF16: *(uint16_t *)p = nk_f32_to_bf16(v); break;
    case NK_F16: *(uint16_t *)p = nk_f32_to_f16(v); break;
    default: *(float *)p = v; break;
    }
}

static inline float round_to(float v, nk_dtype dt) {
    return dt == NK_BF16 ? nk_bf16_to_f32(nk_f32_to_bf16(v)) : nk_f16_to_f32(nk_f32_to_f16(v));
}

typedef struct conv_ctx {
    conv_geom g;
    const nk_tensor *img, *col;
    size_t es;
} conv_ctx;

/* The checks both entry points share: arguments present, descriptors valid, geometry consistent. */
static nk_status conv_setup(conv_ctx *x, const nk_tensor *img, const nk_tensor *col, const int64_t kernel[2],
                            const int64_t stride[2], const int64_t padding[2], const int64_t dilation[2]) {
    if (col == NULL || img == NULL || kernel == NULL || stride == NULL || padding == NULL || dilation == NULL)
        return NK_INVALID;
    int64_t n;
    nk_status st;
    if ((st = nk_tensor_check(col, &n)) || (st = nk_tensor_check(img, &n))) return st;
    *x = (conv_ctx){.img = img, .col = col, .es = nk_dtype_size(img->dtype)};
    return geom_of(&x->g, img, col, kernel, stride, padding, dilation) ? NK_SUCCESS : NK_INVALID;
}

/* Rows [begin, end) of col: row r = (c, i, j) reads channel c shifted by kernel tap (i, j). */
static void im2col_range(void *vctx, int64_t begin, int64_t end) {
    const conv_ctx *x = vctx;
    const conv_geom *g = &x->g;
    const size_t es = x->es;
    const int64_t isc = x->img->strides[0], ish = x->img->strides[1], isw = x->img->strides[2];
    for (int64_t r = begin; r < end; r++) {
        const int64_t c = r / (g->kh * g->kw), i = r / g->kw % g->kh, j = r % g->kw;
        char *dst = (char *)x->col->data + r * x->col->strides[0] * (int64_t)es;
        const char *src = (const char *)x->img->data + c * isc * (int64_t)es;
        for (int64_t oh = 0; oh < g->OH; oh++) {
            const int64_t y = oh * g->sh - g->ph + i * g->dh;
            char *d = dst + oh * g->OW * (int64_t)es;
            if (y < 0 || y >= g->H) {
                memset(d, 0, (size_t)g->OW * es);
                continue;
            }
            const char *s = src + y * ish * (int64_t)es;
            for (int64_t ow = 0; ow < g->OW; ow++) {
                const int64_t xx = ow * g->sw - g->pw + j * g->dw;
                if (xx < 0 || xx >= g->W) memset(d + ow * (int64_t)es, 0, es);
                else memcpy(d + ow * (int64_t)es, s + xx * isw * (int64_t)es, es);
            }
        }
    }
}

nk_status nk_im2col(const nk_tensor *col, const nk_tensor *img, const int64_t kernel[2], const int64_t stride[2],
                    const int64_t padding[2], const int64_t dilation[2]) {
    conv_ctx x;
    nk_status st = conv_setup(&x, img, col, kernel, stride, padding, dilation);
    if (st != NK_SUCCESS) return st;
    if (img->dtype != col->dtype) return NK_INVALID;
    const int64_t rows = col->sizes[0];
    if (rows == 0 || col->sizes[1] == 0) return NK_SUCCESS;
    nk_parallel_for(rows, (x.g.OH * x.g.OW) < 4096 ? 4096 / (x.g.OH * x.g.OW) + 1 : 1, im2col_range, &x);
    return NK_SUCCESS;
}

/* Channels [begin, end) of the image: each element sums the col entries that im2col copied from it. */
static void col2im_range(void *vctx, int64_t begin, int64_t end) {
    const conv_ctx *x = vctx;
    const conv_geom *g = &x->g;
    const nk_dtype dt = x->img->dtype, cdt = x->col->dtype;
    const size_t es = x->es, ces = nk_dtype_size(cdt);
    const int64_t isc = x->img->strides[0], ish = x->img->strides[1], isw = x->img->strides[2];
    const int64_t crs = x->col->strides[0];
    /* A bf16/fp16 col is summed as PyTorch's CPU kernel does (col2im adding into the image in its own
     * dtype, taps in the same order), so the results are the CPU's; an fp32 col is rounded once. */
    const bool round_each = cdt == dt && dt != NK_F32;
    for (int64_t c = begin; c < end; c++) {
        for (int64_t y = 0; y < g->H; y++) {
            for (int64_t xx = 0; xx < g->W; xx++) {
                float acc = 0.f;
                for (int64_t i = 0; i < g->kh; i++) {
                    const int64_t ty = y + g->ph - i * g->dh; /* = oh * sh */
                    if (ty < 0 || ty % g->sh != 0) continue;
                    const int64_t oh = ty / g->sh;
                    if (oh >= g->OH) continue;
                    for (int64_t j = 0; j < g->kw; j++) {
                        const int64_t tx = xx + g->pw - j * g->dw;
                        if (tx < 0 || tx % g->sw != 0) continue;
                        const int64_t ow = tx / g->sw;
                        if (ow >= g->OW) continue;
                        const int64_t r = (c * g->kh + i) * g->kw + j;
                        acc += load_as_f32((const char *)x->col->data + (r * crs + oh * g->OW + ow) * (int64_t)ces, cdt);
                        if (round_each) acc = round_to(acc, dt);
                    }
                }
                store_from_f32((char *)x->img->data + (c * isc + y * ish + xx * isw) * (int64_t)es, dt, acc);
            }
        }
    }
}

nk_status nk_col2im(const nk_tensor *img, const nk_tensor *col, const int64_t kernel[2], const int64_t stride[2],
                    const int64_t padding[2], const int64_t dilation[2]) {
    conv_ctx x;
    nk_status st = conv_setup(&x, img, col, kernel, stride, padding, dilation);
    if (st != NK_SUCCESS) return st;
    if (img->dtype != NK_F32 && img->dtype != NK_BF16 && img->dtype != NK_F16) return NK_UNSUPPORTED;
    if (col->dtype != img->dtype && col->dtype != NK_F32) return NK_UNSUPPORTED;
    if (x.g.C == 0 || x.g.H == 0 || x.g.W == 0) return NK_SUCCESS;
    nk_parallel_for(x.g.C, 1, col2im_range, &x);
    return NK_SUCCESS;
}
