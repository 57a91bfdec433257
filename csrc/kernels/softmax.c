/*
 * softmax.c - softmax and log_softmax along one dim, and their backward.
 *
 * Each line along `dim` is a row: gathered into a float buffer (or used in place when it is
 * contiguous f32), reduced (max, sum of exp) and written back. PyTorch's order of operations is kept:
 * softmax = exp(x - max) * (1 / sum), log_softmax = x - max - log(sum). Rows longer than a chunk are
 * streamed in three passes instead of being buffered.
 */
#include "reduce_simd.h"

NK_SIMD_FN(int, nk_rgather, (float *dst, const char *src, int64_t n, int64_t s, nk_dtype t), (dst, src, n, s, t))
NK_SIMD_FN(int, nk_rscatter, (char *dst, int64_t s, nk_dtype t, const float *src, int64_t n), (dst, s, t, src, n))
NK_SIMD_FN(float, nk_max, (const float *x, int64_t n, int is_max), (x, n, is_max))
NK_SIMD_FN(double, nk_sum, (const float *x, int64_t n), (x, n))
NK_SIMD_FN(double, nk_dot, (const float *a, const float *b, int64_t n), (a, b, n))
NK_SIMD_FN(double, nk_expsub, (float *dst, const float *x, int64_t n, float c), (dst, x, n, c))
NK_SIMD_FN(int, nk_axpb, (float *dst, const float *x, int64_t n, float a, float b), (dst, x, n, a, b))

NK_SIMD_FN(int, nk_smbwd, (float *dst, const float *y, const float *g, int64_t n, float d), (dst, y, g, n, d))

NK_SIMD_FN(int, nk_lsmbwd, (float *dst, const float *y, const float *g, int64_t n, float s), (dst, y, g, n, s))

/* A line of a tensor along dim: its start and stride in bytes. */
typedef struct nk_line {
    char *p;
    int64_t s; /* elements */
    nk_dtype t;
} nk_line;

typedef struct nk_sm_job {
    const nk_tensor *ops[3];
    int32_t nops, dim;
    int64_t len;
    bool log;
    bool round_sum; /* log_softmax over the last dim of bf16/fp16: the CPU's roundings (nk_lsm_shift) */
} nk_sm_job;

/*
 * PyTorch's CPU log_softmax over the last dim of a bf16/fp16 tensor keeps the row's sum of
 * exponentials and its log in the tensor's dtype (rounded twice) and computes (x - max) - log_sum in
 * fp32, rounding once at the store; other dims and dtypes keep everything in fp32. nk_lsm_shift: the
 * log-sum to subtract from x - max, rounded that way when round_sum is set.
 */
static float nk_round_to(nk_dtype t, float v) {
    double buf;
    nk_store_f32((char *)&buf, t, v);
    return nk_load_f32((const char *)&buf, t);
}

static float nk_lsm_shift(const nk_sm_job *j, double s) {
    if (!j->round_sum) return logf((float)s);
    const nk_dtype t = j->ops[1]->dtype;
    return nk_round_to(t, logf(nk_round_to(t, (float)s)));
}

/* y = log_softmax of x given its max m and shift ls, associated as the CPU does for the rounded case. */
static void nk_lsm_apply(const nk_sm_job *j, float *y, const float *x, int64_t n, float m, float ls) {
    if (j->round_sum) {
        nk_axpb(y, x, n, 1.0f, -m);
        nk_axpb(y, y, n, 1.0f, -ls);
    } else {
        nk_axpb(y, x, n, 1.0f, -m - ls);
    }
}

static void nk_sm_lines(const nk_sm_job *j, int64_t l, nk_line *lines) {
    const nk_tensor *t0 = j->ops[0];
    for (int32_t k = 0; k < j->nops; k++) {
        const nk_tensor *t = j->ops[k];
        int64_t rem = l, off = 0;
        for (int32_t d = t0->ndim - 1; d >= 0; d--) {
            if (d == j->dim) continue;
            off += (rem % t0->sizes[d]) * t->strides[d];
            rem /= t0->sizes[d];
        }
        lines[k].p = (char *)t->data + off * (int64_t)nk_dtype_size(t->dtype);
        lines[k].s = t->strides[j->dim];
        lines[k].t = t->dtype;
    }
}

static inline char *nk_line_at(const nk_line *l, int64_t i) {
    return l->p + i * l->s * (int64_t)nk_dtype_size(l->t);
}

static inline bool nk_line_f32(const nk_line *l) { return l->t == NK_F32 && l->s == 1; }

/* Forward: ops[0] = out, ops[1] = in. */
static void nk_softmax_run(void *ctx, int64_t b, int64_t e) {
    const nk_sm_job *j = ctx;
    const int64_t n = j->len;
    float buf[NK_CHUNK];
    for (int64_t l = b; l < e; l++) {
        nk_line ln[2];
        nk_sm_lines(j, l, ln);
        const nk_line *out = &ln[0], *in = &ln[1];
        if (n <= NK_CHUNK) {
            const float *x = buf;
            if (nk_line_f32(in)) x = (const float *)in->p;
            else nk_rgather(buf, in->p, n, in->s, in->t);
            const float m = nk_max(x, n, 1);
            float *y = nk_line_f32(out) ? (float *)out->p : buf;
            if (j->log) {
                nk_lsm_apply(j, y, x, n, m, nk_lsm_shift(j, nk_expsub(NULL, x, n, m)));
            } else {
                const double s = nk_expsub(y, x, n, m);
                nk_axpb(y, y, n, 1.0f / (float)s, 0.0f);
            }
            if (y == buf) nk_rscatter(out->p, out->s, out->t, buf, n);
            continue;
        }
        /* Long rows: max, sum of exp, then the outputs, one chunk at a time. */
        float m = -INFINITY;
        bool nan = false;
        for (int64_t i = 0; i < n; i += NK_CHUNK) {
            const int64_t c = n - i < NK_CHUNK ? n - i : NK_CHUNK;
            nk_rgather(buf, nk_line_at(in, i), c, in->s, in->t);
            const float cm = nk_max(buf, c, 1);
            if (cm != cm) nan = true;
            else if (cm > m) m = cm;
        }
        if (nan) m = NAN;
        double s = 0;
        for (int64_t i = 0; i < n; i += NK_CHUNK) {
            const int64_t c = n - i < NK_CHUNK ? n - i : NK_CHUNK;
            nk_rgather(buf, nk_line_at(in, i), c, in->s, in->t);
            s += nk_expsub(NULL, buf, c, m);
        }
        const float ls = nk_lsm_shift(j, s), inv = 1.0f / (float)s;
        for (int64_t i = 0; i < n; i += NK_CHUNK) {
            const int64_t c = n - i < NK_CHUNK ? n - i : NK_CHUNK;
            nk_rgather(buf, nk_line_at(in, i), c, in->s, in->t);
            if (j->log) {
                nk_lsm_apply(j, buf, buf, c, m, ls);
            } else {
                nk_expsub(buf, buf, c, m);
                nk_axpb(buf, buf, c, inv, 0.0f);
            }
            nk_rscatter(nk_line_at(out, i), out->s, out->t, buf, c);
        }
    }
}

/* Backward: ops[0] = grad_in, ops[1] = grad_out, ops[2] = out. */
static void nk_softmax_bwd_run(void *ctx, int64_t b, int64_t e) {
    const nk_sm_job *j = ctx;
    const int64_t n = j->len;
    float gb[NK_CHUNK / 2], yb[NK_CHUNK / 2];
    const int64_t chunk = NK_CHUNK / 2;
    for (int64_t l = b; l < e; l++) {
        nk_line ln[3];
        nk_sm_lines(j, l, ln);
        const nk_line *gi = &ln[0], *go = &ln[1], *y = &ln[2];
        /* The row reduction: sum(g * y) or sum(g). */
        double red = 0;
        for (int64_t i = 0; i < n; i += chunk) {
            const int64_t c = n - i < chunk ? n - i : chunk;
            const float *g = gb, *yy = yb;
            if (nk_line_f32(go)) g = (const float *)nk_line_at(go, i);
            else nk_rgather(gb, nk_line_at(go, i), c, go->s, go->t);
            if (j->log) {
                red += nk_sum(g, c);
            } else {
                if (nk_line_f32(y)) yy = (const float *)nk_line_at(y, i);
                else nk_rgather(yb, nk_line_at(y, i), c, y->s, y->t);
                red += nk_dot(g, yy, c);
            }
        }
        const float r = (float)red;
        for (int64_t i = 0; i < n; i += chunk) {
            const int64_t c = n - i < chunk ? n - i : chunk;
            const float *g = gb, *yy = yb;
            if (nk_line_f32(go)) g = (const float *)nk_line_at(go, i);
            else nk_rgather(gb, nk_line_at(go, i), c, go->s, go->t);
            if (nk_line_f32(y)) yy = (const float *)nk_line_at(y, i);
            else nk_rgather(yb, nk_line_at(y, i), c, y->s, y->t);
            float *dst = nk_line_f32(gi) ? (float *)nk_line_at(gi, i) : gb;
            if (j->log) nk_lsmbwd(dst, yy, g, c, r);
            else nk_smbwd(dst, yy, g, c, r);
            if (dst == gb) nk_rscatter(nk_line_at(gi, i), gi->s, gi->t, gb, c);
        }
    }
}

static nk_status nk_softmax_launch(nk_sm_job *j, nk_range_fn fn) {
    const nk_tensor *t0 = j->ops[0];
    for (int32_t k = 0; k < j->nops; k++) {
        int64_t n;
        nk_status st = nk_tensor_check(j->ops[k], &n);
        if (st != NK_SUCCESS) return st;
        if (!nk_same_shape(j->ops[k], t0)) return NK_INVALID;
        if (!nk_is_half_or_float(j->ops[k]->dtype)) return NK_UNSUPPORTED;
    }
    nk_tensor tmp[3];
    if (t0->ndim == 0) {
        /* A scalar is a row of one element. */
        if (j->dim != 0) return NK_INVALID;
        for (int32_t k = 0; k < j->nops; k++) {
            tmp[k] = *j->ops[k];
            tmp[k].ndim = 1;
            tmp[k].sizes[0] = 1;
            tmp[k].strides[0] = 1;
            j->ops[k] = &tmp[k];
        }
        t0 = j->ops[0];
    }
    if (j->dim < 0 || j->dim >= t0->ndim) return NK_INVALID;
    const int64_t numel = nk_tensor_numel(t0);
    if (numel == 0) return NK_SUCCESS;
    j->len = t0->sizes[j->dim];
    const int64_t lines = numel / j->len;
    /* An exp per element: a line of a few hundred is already worth a thread hand-off. */
    int64_t grain = 2048 / j->len;
    nk_parallel_for(lines, grain < 1 ? 1 : grain, fn, j);
    return NK_SUCCESS;
}

nk_status nk_softmax(const nk_tensor *out, const nk_tensor *in, int32_t dim, bool log) {
    if (out == NULL || in == NULL) return NK_INVALID;
    if (nk_is_half_or_float(in->dtype) && out->dtype != in->dtype && out->dtype != NK_F32) return NK_UNSUPPORTED;
    nk_sm_job j = {.ops = {out, in}, .nops = 2, .dim = dim, .log = log};
    if (log && (in->dtype == NK_BF16 || in->dtype == NK_F16) && out->dtype == in->dtype && dim == in->ndim - 1)
        j.round_sum = true;
    return nk_softmax_launch(&j, nk_softmax_run);
}

nk_status nk_softmax_backward(const nk_tensor *grad_in, const nk_tensor *grad_out, const nk_tensor *out,
                              int32_t dim, bool log) {
    if (grad_in == NULL || grad_out == NULL || out == NULL) return NK_INVALID;
    nk_sm_job j = {.ops = {grad_in, grad_out, out}, .nops = 3, .dim = dim, .log = log};
    return nk_softmax_launch(&j, nk_softmax_bwd_run);
}
