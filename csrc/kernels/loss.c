/*
 * loss.c - negative log likelihood (the second half of cross_entropy), forward and backward.
 *
 * Work is one gather per sample, so the kernels are scalar; sums run in double, which is at least as
 * accurate as PyTorch's float cascade and equal within float rounding.
 */
#include "reduce_simd.h"

enum { NK_RED_NONE = 0, NK_RED_MEAN = 1, NK_RED_SUM = 2 };

static double nk_ld(const nk_tensor *t, int64_t off) {
    const char *p = (const char *)t->data + off * (int64_t)nk_dtype_size(t->dtype);
    switch (t->dtype) {
    case NK_F64: return *(const double *)p;
    case NK_F32: return *(const float *)p;
    case NK_BF16: return nk_bf16_to_f32(*(const uint16_t *)p);
    case NK_F16: return nk_f16_to_f32(*(const uint16_t *)p);
    default: return 0;
    }
}

static void nk_st(const nk_tensor *t, int64_t off, double v) {
    char *p = (char *)t->data + off * (int64_t)nk_dtype_size(t->dtype);
    nk_cast_get(t->dtype, NK_F64)(p, 1, &v, 1, 1);
}

static bool nk_is_float(nk_dtype t) { return t == NK_F32 || t == NK_BF16 || t == NK_F16 || t == NK_F64; }

/* Shapes: input [N, C] or [C]; target [N] or []; returns N, C and the strides. */
static nk_status nk_nll_shapes(const nk_tensor *input, const nk_tensor *target, const nk_tensor *weight,
                               int64_t *N, int64_t *C, int64_t *sn, int64_t *sc, int64_t *ts) {
    int64_t n;
    nk_status st;
    if ((st = nk_tensor_check(input, &n)) || (st = nk_tensor_check(target, &n))) return st;
    if (input->ndim == 2) {
        *N = input->sizes[0];
        *C = input->sizes[1];
        *sn = input->strides[0];
        *sc = input->strides[1];
        if (target->ndim != 1 || target->sizes[0] != *N) return NK_INVALID;
        *ts = target->strides[0];
    } else if (input->ndim == 1) {
        *N = 1;
        *C = input->sizes[0];
        *sn = 0;
        *sc = input->strides[0];
        if (target->ndim != 0) return NK_INVALID;
        *ts = 0;
    } else {
        return NK_INVALID;
    }
    if (target->dtype != NK_I64) return NK_UNSUPPORTED;
    if (weight) {
        if ((st = nk_tensor_check(weight, &n))) return st;
        if (n != *C || weight->ndim != 1) return NK_INVALID;
        if (!nk_is_float(weight->dtype)) return NK_UNSUPPORTED;
    }
    if (!nk_is_float(input->dtype)) return NK_UNSUPPORTED;
    return NK_SUCCESS;
}

nk_status nk_nll_loss(const nk_tensor *out, const nk_tensor *total_weight, const nk_tensor *input,
                      const nk_tensor *target, const nk_tensor *weight, int32_t reduction, int64_t ignore_index,
                      int64_t *bad_target) {
    int64_t N, C, sn, sc, ts, n;
    nk_status st = nk_nll_shapes(input, target, weight, &N, &C, &sn, &sc, &ts);
    if (st != NK_SUCCESS) return st;
    if ((st = nk_tensor_check(out, &n)) || (st = nk_tensor_check(total_weight, &n))) return st;
    if (!nk_is_float(out->dtype) || !nk_is_float(total_weight->dtype)) return NK_UNSUPPORTED;
    const int64_t *tg = target->data;
    const int64_t ws = weight ? weight->strides[0] : 0;
    const bool none = reduction == NK_RED_NONE && input->ndim == 2;
    if (none && (out->ndim != 1 || out->sizes[0] != N)) return NK_INVALID;
    if (!none && nk_tensor_numel(out) != 1) return NK_INVALID;
    /* Validate every target first, so a bad one leaves the outputs untouched. */
    for (int64_t i = 0; i < N; i++) {
        const int64_t t = tg[i * ts];
        if (t != ignore_index && (t < 0 || t >= C)) {
            *bad_target = t;
            return NK_INVALID;
        }
    }
    double loss = 0, tw = 0;
    for (int64_t i = 0; i < N; i++) {
        const int64_t t = tg[i * ts];
        double l = 0;
        if (t != ignore_index) {
            const double w = weight ? nk_ld(weight, t * ws) : 1.0;
            l = -w * nk_ld(input, i * sn + t * sc);
            tw += w;
        }
        if (none) nk_st(out, i * out->strides[0], l);
        else loss += l;
    }
    if (!none) {
        /* PyTorch rounds both sums to the output dtype before dividing. */
        if (reduction == NK_RED_MEAN) {
            if (out->dtype == NK_F64) loss = loss / tw;
            else loss = (double)((float)loss / (float)tw);
        }
        nk_st(out, 0, loss);
    }
    nk_st(total_weight, 0, none ? 0.0 : tw);
    return NK_SUCCESS;
}

nk_status nk_nll_loss_backward(const nk_tensor *grad_input, const nk_tensor *grad_output, const nk_tensor *target,
                               const nk_tensor *weight, int32_t reduction, int64_t ignore_index,
                               const nk_tensor *total_weight, int64_t *bad_target) {
    int64_t N, C, sn, sc, ts, n;
    nk_status st = nk_nll_shapes(grad_input, target, weight, &N, &C, &sn, &sc, &ts);
    if (st != NK_SUCCESS) return st;
    if ((st = nk_tensor_check(grad_output, &n)) || (st = nk_tensor_check(total_weight, &n))) return st;
    if (!nk_is_float(grad_output->dtype) || !nk_is_float(total_weight->dtype)) return NK_UNSUPPORTED;
    const bool none = reduction == NK_RED_NONE && grad_input->ndim == 2;
    if (none && (grad_output->ndim != 1 || grad_output->sizes[0] != N)) return NK_INVALID;
    if (!none && nk_tensor_numel(grad_output) != 1) return NK_INVALID;
    const int64_t *tg = target->data;
    for (int64_t i = 0; i < N; i++) {
        const int64_t t = tg[i * ts];
        if (t != ignore_index && (t < 0 || t >= C)) {
            *bad_target = t;
            return NK_INVALID;
        }
    }
    /* Zero the whole gradient, then write one element per sample. */
    nk_scalar zero = {.is_float = true, .f = 0.0};
    if ((st = nk_fill(grad_input, zero)) != NK_SUCCESS) return st;
    const int64_t ws = weight ? weight->strides[0] : 0;
    double g = none ? 0 : nk_ld(grad_output, 0);
    if (!none && reduction == NK_RED_MEAN) g = g / nk_ld(total_weight, 0);
    for (int64_t i = 0; i < N; i++) {
        const int64_t t = tg[i * ts];
        if (t == ignore_index) continue;
        const double w = weight ? nk_ld(weight, t * ws) : 1.0;
        const double gi = none ? nk_ld(grad_output, i * grad_output->strides[0]) : g;
        nk_st(grad_input, i * sn + t * sc, -w * gi);
    }
    return NK_SUCCESS;
}
