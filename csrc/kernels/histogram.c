/*
 * histogram.c - nk_histc_int: torch.histc of an integer tensor.
 *
 * PyTorch's CPU histc takes only floating inputs, but accelerator code (Mixture-of-Experts routing in
 * Transformers) counts integer expert ids with histc on every non-CPU device, as CUDA allows. The bin
 * rule is CUDA's, in exact integer arithmetic: bin = (v - min) * bins / (max - min), the top edge
 * belonging to the last bin; values outside [min, max] are not counted.
 */
#include "kernels_internal.h"

/* Narrowing wraps (two's complement), as a C++ cast of the count to the histogram dtype does. */
static void nk_store_int(char *p, nk_dtype dt, int64_t v) {
    switch (dt) {
    case NK_U8: *(uint8_t *)p = (uint8_t)v; break;
    case NK_I8: *(int8_t *)p = (int8_t)(uint8_t)v; break;
    case NK_I16: *(int16_t *)p = (int16_t)(uint16_t)v; break;
    case NK_I32: *(int32_t *)p = (int32_t)(uint32_t)v; break;
    default: *(int64_t *)p = v; break;
    }
}

/* Calls fn on every element of t in row-major order (any strides, including 0 and negative). */
typedef void (*nk_elem_fn)(void *ctx, const char *p);
static void nk_for_each(const nk_tensor *t, nk_elem_fn fn, void *ctx) {
    int64_t idx[NK_MAX_DIMS] = {0};
    const int64_t n = nk_tensor_numel(t);
    const size_t es = nk_dtype_size(t->dtype);
    const char *p = (const char *)t->data;
    for (int64_t k = 0; k < n; ++k) {
        fn(ctx, p);
        for (int32_t d = t->ndim - 1; d >= 0; --d) {
            if (++idx[d] < t->sizes[d]) {
                p += t->strides[d] * (int64_t)es;
                break;
            }
            p -= t->strides[d] * (int64_t)es * (t->sizes[d] - 1);
            idx[d] = 0;
        }
    }
}

typedef struct {
    nk_dtype dtype;
    int64_t lo, hi;
} nk_minmax_ctx;

static void nk_minmax_elem(void *vctx, const char *p) {
    nk_minmax_ctx *c = vctx;
    int64_t v = nk_load_i64(p, c->dtype);
    if (v < c->lo) c->lo = v;
    if (v > c->hi) c->hi = v;
}

typedef struct {
    nk_dtype dtype;
    int64_t min, max, bins;
    int64_t *counts;
} nk_histc_ctx;

static void nk_histc_elem(void *vctx, const char *p) {
    nk_histc_ctx *c = vctx;
    int64_t v = nk_load_i64(p, c->dtype);
    if (v < c->min || v > c->max)
        return;
    /* 128-bit product: (v - min) * bins cannot overflow. */
    int64_t bin = (int64_t)((((__int128)v - c->min) * c->bins) / ((__int128)c->max - c->min));
    if (bin == c->bins)
        bin = c->bins - 1;
    c->counts[bin]++;
}

static bool nk_is_histc_int(nk_dtype dt) {
    return dt == NK_U8 || dt == NK_I8 || dt == NK_I16 || dt == NK_I32 || dt == NK_I64;
}

nk_status nk_histc_int(const nk_tensor *hist, const nk_tensor *src, int64_t min, int64_t max, int64_t *counts) {
    if (!nk_is_histc_int(src->dtype) || hist->dtype != src->dtype)
        return NK_UNSUPPORTED;
    if (hist->ndim != 1 || hist->sizes[0] < 1 || src->ndim > NK_MAX_DIMS || src->ndim < 0 || min > max)
        return NK_INVALID;
    for (int32_t d = 0; d < src->ndim; ++d)
        if (src->sizes[d] < 0)
            return NK_INVALID;
    const int64_t bins = hist->sizes[0];
    if (min == max && nk_tensor_numel(src) > 0) {
        nk_minmax_ctx mm = {src->dtype, INT64_MAX, INT64_MIN};
        nk_for_each(src, nk_minmax_elem, &mm);
        min = mm.lo;
        max = mm.hi;
    }
    if (min == max) {
        if (min > INT64_MIN)
            min -= 1;
        if (max < INT64_MAX)
            max += 1;
    }
    memset(counts, 0, (size_t)bins * sizeof *counts);
    nk_histc_ctx c = {src->dtype, min, max, bins, counts};
    if (nk_tensor_numel(src) > 0)
        nk_for_each(src, nk_histc_elem, &c);
    const size_t es = nk_dtype_size(hist->dtype);
    for (int64_t b = 0; b < bins; ++b)
        nk_store_int((char *)hist->data + b * hist->strides[0] * (int64_t)es, hist->dtype, counts[b]);
    return NK_SUCCESS;
}
