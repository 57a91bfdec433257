/*
 * index.c - indexing kernels: index_select, index_copy, index_add, gather, scatter, embedding backward.
 *
 * Slice-wise ops (index_select/copy/add) fix the indexed dimension and hand the remaining strided
 * slice to the copy kernel or to a typed row loop, so any layout works and contiguous slices become
 * memcpy. Element-wise ops (gather/scatter) walk the index tensor row by row with precomputed offsets.
 * Every index is validated before the first write, so an error leaves the destination untouched.
 */
#include "kernels_internal.h"

#include <stdlib.h>

static bool nk_index_dtype_ok(const nk_tensor *index) {
    return index->dtype == NK_I64 || index->dtype == NK_I32;
}

static int64_t nk_index_at(const nk_tensor *index, int64_t off) {
    if (index->dtype == NK_I64) return ((const int64_t *)index->data)[off];
    return ((const int32_t *)index->data)[off];
}

/* A 1-D (or 0-d) index: element i. */
static int64_t nk_index_1d(const nk_tensor *index, int64_t i) {
    return nk_index_at(index, index->ndim == 0 ? 0 : i * index->strides[0]);
}

/* Checks every element of a 1-D index against [0, size). */
static nk_status nk_index_check_1d(const nk_tensor *index, int64_t n, int64_t size, int64_t *bad) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t v = nk_index_1d(index, i);
        if (v < 0 || v >= size) {
            if (bad) *bad = v;
            return NK_INVALID;
        }
    }
    return NK_SUCCESS;
}

/* t with dimension dim fixed at position p (the dimension removed). */
static nk_tensor nk_slice_at(const nk_tensor *t, int32_t dim, int64_t p) {
    nk_tensor s;
    memset(&s, 0, sizeof s);
    s.dtype = t->dtype;
    s.ndim = t->ndim - 1;
    s.data = (char *)t->data + p * t->strides[dim] * (int64_t)nk_dtype_size(t->dtype);
    for (int32_t d = 0, o = 0; d < t->ndim; d++) {
        if (d == dim) continue;
        s.sizes[o] = t->sizes[d];
        s.strides[o] = t->strides[d];
        o++;
    }
    return s;
}

/* Shared validation of the slice ops: dst and src agree on every dim but `dim`, where src (or dst,
 * for index_select) has numel(index) entries. */
static nk_status nk_slice_op_check(const nk_tensor *indexed, const nk_tensor *other, int32_t dim,
                                   const nk_tensor *index, int64_t *n_out) {
    int64_t n1, n2, ni;
    if (nk_tensor_check(indexed, &n1) || nk_tensor_check(other, &n2) || nk_tensor_check(index, &ni))
        return NK_INVALID;
    if (!nk_index_dtype_ok(index)) return NK_UNSUPPORTED;
    if (index->ndim > 1 || indexed->ndim != other->ndim || indexed->dtype != other->dtype) return NK_INVALID;
    if (indexed->ndim == 0) {
        /* A scalar behaves as a 1-element vector. */
        if (ni != 1) return NK_INVALID;
        *n_out = 1;
        return NK_SUCCESS;
    }
    if (dim < 0 || dim >= indexed->ndim) return NK_INVALID;
    for (int32_t d = 0; d < indexed->ndim; d++)
        if (d != dim && indexed->sizes[d] != other->sizes[d]) return NK_INVALID;
    if (other->sizes[dim] != ni) return NK_INVALID;
    *n_out = ni;
    return NK_SUCCESS;
}

/* Scalars become 1-D of size 1 so slicing works uniformly. */
static nk_tensor nk_as_1d(const nk_tensor *t) {
    nk_tensor r = *t;
    if (t->ndim == 0) {
        r.ndim = 1;
        r.sizes[0] = 1;
        r.strides[0] = 1;
    }
    return r;
}

typedef struct nk_select_ctx {
    nk_tensor dst, src, index;
    int32_t dim;
} nk_select_ctx;

static void nk_index_select_range(void *ctx, int64_t b, int64_t e) {
    const nk_select_ctx *c = (const nk_select_ctx *)ctx;
    for (int64_t i = b; i < e; i++) {
        const nk_tensor d = nk_slice_at(&c->dst, c->dim, i);
        const nk_tensor s = nk_slice_at(&c->src, c->dim, nk_index_1d(&c->index, i));
        nk_copy(&d, &s);
    }
}

nk_status nk_index_select(const nk_tensor *dst, const nk_tensor *src, int32_t dim, const nk_tensor *index,
                          int64_t *bad) {
    int64_t n;
    nk_status st = nk_slice_op_check(src, dst, dim, index, &n);
    if (st != NK_SUCCESS) return st;
    nk_select_ctx c = {.dst = nk_as_1d(dst), .src = nk_as_1d(src), .index = *index, .dim = src->ndim ? dim : 0};
    if ((st = nk_index_check_1d(index, n, c.src.sizes[c.dim], bad)) != NK_SUCCESS) return st;
    if (nk_tensor_numel(dst) == 0) return NK_SUCCESS;
    const int64_t slice = nk_tensor_numel(dst) / n;
    nk_parallel_for(n, slice >= 4096 ? 1 : 4096 / slice + 1, nk_index_select_range, &c);
    return NK_SUCCESS;
}

nk_status nk_index_copy(const nk_tensor *dst, int32_t dim, const nk_tensor *index, const nk_tensor *src,
                        int64_t *bad) {
    int64_t n;
    nk_status st = nk_slice_op_check(dst, src, dim, index, &n);
    if (st != NK_SUCCESS) return st;
    const nk_tensor d1 = nk_as_1d(dst), s1 = nk_as_1d(src);
    const int32_t dm = dst->ndim ? dim : 0;
    if ((st = nk_index_check_1d(index, n, d1.sizes[dm], bad)) != NK_SUCCESS) return st;
    if (nk_tensor_numel(src) == 0) return NK_SUCCESS;
    /* In order, so the last of duplicate indices wins as on the CPU. */
    for (int64_t i = 0; i < n; i++) {
        const nk_tensor d = nk_slice_at(&d1, dm, nk_index_1d(index, i));
        const nk_tensor s = nk_slice_at(&s1, dm, i);
        st = nk_copy(&d, &s);
        if (st != NK_SUCCESS) return st;
    }
    return NK_SUCCESS;
}

/* ---- typed accumulation ------------------------------------------------------------------------ */

/* d[i*ds] += alpha * s[i*ss] in the dtype's arithmetic (half types through float, rounded back). */
static void nk_axpy_row(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, nk_dtype dt, double af,
                        int64_t ai) {
#define NK_AXPY_INT(T)                                                              \
    for (int64_t i = 0; i < n; i++) ((T *)d)[i * ds] += (T)(ai * ((const T *)s)[i * ss]); \
    break;
    switch (dt) {
    case NK_F32: {
        const float a = (float)af;
        for (int64_t i = 0; i < n; i++) ((float *)d)[i * ds] += a * ((const float *)s)[i * ss];
        break;
    }
    case NK_F64:
        for (int64_t i = 0; i < n; i++) ((double *)d)[i * ds] += af * ((const double *)s)[i * ss];
        break;
    case NK_BF16: {
        const float a = (float)af;
        uint16_t *dp = (uint16_t *)d;
        const uint16_t *sp = (const uint16_t *)s;
        for (int64_t i = 0; i < n; i++)
            dp[i * ds] = nk_f32_to_bf16(nk_bf16_to_f32(dp[i * ds]) + a * nk_bf16_to_f32(sp[i * ss]));
        break;
    }
    case NK_F16: {
        const float a = (float)af;
        uint16_t *dp = (uint16_t *)d;
        const uint16_t *sp = (const uint16_t *)s;
        for (int64_t i = 0; i < n; i++)
            dp[i * ds] = nk_f32_to_f16(nk_f16_to_f32(dp[i * ds]) + a * nk_f16_to_f32(sp[i * ss]));
        break;
    }
    case NK_I64: NK_AXPY_INT(int64_t)
    case NK_I32: NK_AXPY_INT(int32_t)
    case NK_I16: NK_AXPY_INT(int16_t)
    case NK_I8: NK_AXPY_INT(int8_t)
    case NK_U8: NK_AXPY_INT(uint8_t)
    default: break;
    }
#undef NK_AXPY_INT
}

static bool nk_axpy_dtype_ok(nk_dtype dt) {
    switch (dt) {
    case NK_F32: case NK_F64: case NK_BF16: case NK_F16: case NK_I64: case NK_I32: case NK_I16: case NK_I8:
    case NK_U8:
        return true;
    default:
        return false;
    }
}

/* dst += alpha * src over two equally shaped strided tensors. */
static void nk_axpy_tensor(const nk_tensor *dst, const nk_tensor *src, double af, int64_t ai) {
    if (nk_tensor_numel(dst) == 0) return;
    const nk_tensor *const ops[2] = {dst, src};
    nk_iter it;
    nk_iter_init(&it, 2, ops, true);
    const int64_t inner = nk_iter_inner_size(&it);
    for (int64_t r = 0; r < it.rows; r++) {
        nk_axpy_row(nk_iter_ptr(&it, 0), nk_iter_inner_stride(&it, 0), nk_iter_ptr(&it, 1),
                    nk_iter_inner_stride(&it, 1), inner, dst->dtype, af, ai);
        nk_iter_next_row(&it);
    }
}

static void nk_scalar_parts(nk_scalar v, double *af, int64_t *ai) {
    *af = v.is_float ? v.f : (double)v.i;
    *ai = v.is_float ? (int64_t)v.f : v.i;
}

nk_status nk_index_add(const nk_tensor *dst, int32_t dim, const nk_tensor *index, const nk_tensor *src,
                       nk_scalar alpha, int64_t *bad) {
    int64_t n;
    nk_status st = nk_slice_op_check(dst, src, dim, index, &n);
    if (st != NK_SUCCESS) return st;
    if (!nk_axpy_dtype_ok(dst->dtype)) return NK_UNSUPPORTED;
    const nk_tensor d1 = nk_as_1d(dst), s1 = nk_as_1d(src);
    const int32_t dm = dst->ndim ? dim : 0;
    if ((st = nk_index_check_1d(index, n, d1.sizes[dm], bad)) != NK_SUCCESS) return st;
    double af;
    int64_t ai;
    nk_scalar_parts(alpha, &af, &ai);
    for (int64_t i = 0; i < n; i++) {
        const nk_tensor d = nk_slice_at(&d1, dm, nk_index_1d(index, i));
        const nk_tensor s = nk_slice_at(&s1, dm, i);
        nk_axpy_tensor(&d, &s, af, ai);
    }
    return NK_SUCCESS;
}

/* ---- gather / scatter ------------------------------------------------------------------------- */

/*
 * Walks every element of `index` (shape = the iteration shape) in row-major order. For element p the
 * "direct" tensor is addressed at p and the "indexed" tensor at p with p[dim] replaced by index[p].
 */
typedef struct nk_gs_walk {
    const nk_tensor *index, *direct, *indexed;
    int32_t dim;
} nk_gs_walk;

typedef void (*nk_gs_fn)(void *ctx, char *direct, char *indexed);

/* Every index value against the indexed tensor's size along dim. */
static nk_status nk_gs_check(const nk_tensor *index, const nk_tensor *indexed, int32_t dim, int64_t *bad) {
    const int32_t nd = index->ndim;
    int64_t n = nk_tensor_numel(index);
    if (n == 0) return NK_SUCCESS;
    int64_t idx[NK_MAX_DIMS] = {0};
    int64_t off = 0;
    const int64_t size = nd == 0 ? 1 : indexed->sizes[dim];
    for (int64_t e = 0; e < n; e++) {
        const int64_t v = nk_index_at(index, off);
        if (v < 0 || v >= size) {
            if (bad) *bad = v;
            return NK_INVALID;
        }
        for (int32_t d = nd - 1; d >= 0; d--) {
            off += index->strides[d];
            if (++idx[d] < index->sizes[d]) break;
            off -= index->strides[d] * index->sizes[d];
            idx[d] = 0;
        }
    }
    return NK_SUCCESS;
}

static nk_status nk_gs_validate(const nk_tensor *index, const nk_tensor *direct, const nk_tensor *indexed,
                                int32_t dim, bool direct_same_shape) {
    int64_t n;
    if (nk_tensor_check(index, &n) || (direct && nk_tensor_check(direct, &n)) || nk_tensor_check(indexed, &n))
        return NK_INVALID;
    if (!nk_index_dtype_ok(index)) return NK_UNSUPPORTED;
    const int32_t nd = index->ndim;
    if (indexed->ndim != nd || (direct && direct->ndim != nd)) return NK_INVALID;
    if (nd > 0 && (dim < 0 || dim >= nd)) return NK_INVALID;
    for (int32_t d = 0; d < nd; d++) {
        if (d != dim && index->sizes[d] > indexed->sizes[d]) return NK_INVALID;
        if (direct && (direct_same_shape ? direct->sizes[d] != index->sizes[d] : direct->sizes[d] < index->sizes[d]))
            return NK_INVALID;
    }
    if (direct && direct->dtype != indexed->dtype) return NK_INVALID;
    return NK_SUCCESS;
}

static void nk_gs_walk_run(const nk_gs_walk *w, nk_gs_fn fn, void *ctx) {
    const nk_tensor *index = w->index, *a = w->direct, *b = w->indexed;
    const int32_t nd = index->ndim;
    const int64_t n = nk_tensor_numel(index);
    const int64_t ea = a ? (int64_t)nk_dtype_size(a->dtype) : 0, eb = (int64_t)nk_dtype_size(b->dtype);
    int64_t idx[NK_MAX_DIMS] = {0};
    int64_t oi = 0, oa = 0, ob = 0; /* ob excludes dim */
    const int64_t bs = nd == 0 ? 0 : b->strides[w->dim];
    for (int64_t e = 0; e < n; e++) {
        const int64_t v = nk_index_at(index, oi);
        fn(ctx, a ? (char *)a->data + oa * ea : NULL, (char *)b->data + (ob + v * bs) * eb);
        for (int32_t d = nd - 1; d >= 0; d--) {
            oi += index->strides[d];
            if (a) oa += a->strides[d];
            if (d != w->dim) ob += b->strides[d];
            if (++idx[d] < index->sizes[d]) break;
            oi -= index->strides[d] * index->sizes[d];
            if (a) oa -= a->strides[d] * index->sizes[d];
            if (d != w->dim) ob -= b->strides[d] * index->sizes[d];
            idx[d] = 0;
        }
    }
}

typedef struct nk_gs_ctx {
    size_t es;
    nk_dtype dt;
    const void *value; /* scalar value for scatter without src, already in dt */
    double af;
    int64_t ai;
} nk_gs_ctx;

static void nk_gather_fn(void *ctx, char *direct, char *indexed) {
    memcpy(direct, indexed, ((nk_gs_ctx *)ctx)->es);
}

static void nk_scatter_fn(void *ctx, char *direct, char *indexed) {
    nk_gs_ctx *c = (nk_gs_ctx *)ctx;
    memcpy(indexed, direct ? direct : (const char *)c->value, c->es);
}

static void nk_scatter_add_fn(void *ctx, char *direct, char *indexed) {
    nk_gs_ctx *c = (nk_gs_ctx *)ctx;
    nk_axpy_row(indexed, 1, direct ? direct : (const char *)c->value, 1, 1, c->dt, 1.0, 1);
}

nk_status nk_gather(const nk_tensor *dst, const nk_tensor *src, int32_t dim, const nk_tensor *index, int64_t *bad) {
    nk_status st = nk_gs_validate(index, dst, src, dim, true);
    if (st != NK_SUCCESS) return st;
    if ((st = nk_gs_check(index, src, dim, bad)) != NK_SUCCESS) return st;
    nk_gs_ctx c = {.es = nk_dtype_size(dst->dtype), .dt = dst->dtype};
    const nk_gs_walk w = {.index = index, .direct = dst, .indexed = src, .dim = dim};
    nk_gs_walk_run(&w, nk_gather_fn, &c);
    return NK_SUCCESS;
}

nk_status nk_scatter(const nk_tensor *dst, int32_t dim, const nk_tensor *index, const nk_tensor *src,
                     nk_scalar value, bool accumulate, int64_t *bad) {
    nk_status st = nk_gs_validate(index, src, dst, dim, false);
    if (st != NK_SUCCESS) return st;
    if (accumulate && !nk_axpy_dtype_ok(dst->dtype)) return NK_UNSUPPORTED;
    if ((st = nk_gs_check(index, dst, dim, bad)) != NK_SUCCESS) return st;
    nk_elem v;
    if (src == NULL) {
        /* The value converted with the copy rules (a double or an int64 cast to dst's dtype). */
        nk_cast_fn cast = nk_cast_get(dst->dtype, value.is_float ? NK_F64 : NK_I64);
        if (value.is_float) {
            cast(nk_elem_ptr(&v, dst->dtype), 1, &value.f, 1, 1);
        } else {
            cast(nk_elem_ptr(&v, dst->dtype), 1, &value.i, 1, 1);
        }
    }
    nk_gs_ctx c = {.es = nk_dtype_size(dst->dtype), .dt = dst->dtype, .value = nk_elem_ptr(&v, dst->dtype)};
    const nk_gs_walk w = {.index = index, .direct = src, .indexed = dst, .dim = dim};
    nk_gs_walk_run(&w, accumulate ? nk_scatter_add_fn : nk_scatter_fn, &c);
    return NK_SUCCESS;
}

/* ---- embedding backward ----------------------------------------------------------------------- */

nk_status nk_embedding_backward(const nk_tensor *gw, const nk_tensor *grad, const nk_tensor *indices,
                                int64_t padding_idx, bool scale_by_freq, int64_t *bad) {
    int64_t n1, n2, ni;
    if (nk_tensor_check(gw, &n1) || nk_tensor_check(grad, &n2) || nk_tensor_check(indices, &ni)) return NK_INVALID;
    if (!nk_index_dtype_ok(indices)) return NK_UNSUPPORTED;
    if (gw->ndim != 2 || grad->ndim != 2 || indices->ndim != 1 || grad->sizes[0] != ni ||
        grad->sizes[1] != gw->sizes[1] || grad->dtype != gw->dtype)
        return NK_INVALID;
    const nk_dtype dt = gw->dtype;
    if (dt != NK_F32 && dt != NK_F64 && dt != NK_BF16 && dt != NK_F16) return NK_UNSUPPORTED;
    const int64_t V = gw->sizes[0];
    nk_status st = nk_index_check_1d(indices, ni, V, bad);
    if (st != NK_SUCCESS) return st;
    int64_t *counts = NULL;
    if (scale_by_freq && ni > 0) {
        counts = (int64_t *)calloc((size_t)(V > 0 ? V : 1), sizeof(int64_t));
        if (counts == NULL) return NK_INVALID;
        for (int64_t i = 0; i < ni; i++) counts[nk_index_1d(indices, i)]++;
    }
    const nk_scalar zero = {.is_float = true, .f = 0.0};
    nk_fill(gw, zero);
    /* Float accumulation per row: half types accumulate in float like the CPU kernel's opmath. */
    const int64_t D = gw->sizes[1];
    const size_t es = nk_dtype_size(dt);
    for (int64_t i = 0; i < ni; i++) {
        const int64_t r = nk_index_1d(indices, i);
        if (r == padding_idx) continue;
        const double scale = counts ? 1.0 / (double)counts[r] : 1.0;
        nk_axpy_row((char *)gw->data + r * gw->strides[0] * (int64_t)es, gw->strides[1],
                    (const char *)grad->data + i * grad->strides[0] * (int64_t)es, grad->strides[1], D, dt, scale, 1);
    }
    free(counts);
    return NK_SUCCESS;
}

/* ---- cat -------------------------------------------------------------------------------------- */

nk_status nk_cat(const nk_tensor *dst, const nk_tensor *const *srcs, int64_t n, int32_t dim) {
    int64_t nd;
    if (nk_tensor_check(dst, &nd) != NK_SUCCESS || dst->ndim < 1 || dim < 0 || dim >= dst->ndim || n < 0)
        return NK_INVALID;
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        const nk_tensor *s = srcs[i];
        int64_t ns;
        if (nk_tensor_check(s, &ns) != NK_SUCCESS || s->ndim != dst->ndim) return NK_INVALID;
        for (int32_t d = 0; d < dst->ndim; d++)
            if (d != dim && s->sizes[d] != dst->sizes[d]) return NK_INVALID;
        total += s->sizes[dim];
    }
    if (total != dst->sizes[dim]) return NK_INVALID;
    const int64_t es = (int64_t)nk_dtype_size(dst->dtype);
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        nk_tensor part = *dst;
        part.sizes[dim] = srcs[i]->sizes[dim];
        part.data = (char *)dst->data + off * dst->strides[dim] * es;
        off += part.sizes[dim];
        if (nk_tensor_numel(&part) == 0) continue;
        const nk_status st = nk_copy(&part, srcs[i]);
        if (st != NK_SUCCESS) return st;
    }
    return NK_SUCCESS;
}

/* ---- advanced indexing: x[i0, i1, ...] and its assignment ------------------------------------- */

/* src (or dst) offsets, in elements, of every position b of the broadcast index shape, after wrapping
 * negative indices; NK_INVALID with the index and its dim when one is out of range. */
static nk_status nk_adv_offsets(const nk_tensor *self, int32_t first, int32_t n, const nk_tensor *const *indices,
                                int64_t nb, int64_t *offs, int64_t *bad, int32_t *bad_dim) {
    const nk_tensor *i0 = indices[0];
    for (int64_t b = 0; b < nb; b++) offs[b] = 0;
    for (int32_t k = 0; k < n; k++) {
        const nk_tensor *ix = indices[k];
        const int64_t size = self->sizes[first + k], stride = self->strides[first + k];
        int64_t idx[NK_MAX_DIMS] = {0}, off = 0;
        for (int64_t b = 0; b < nb; b++) {
            int64_t v = nk_index_at(ix, off);
            if (v < -size || v >= size) {
                if (bad) *bad = v;
                if (bad_dim) *bad_dim = first + k;
                return NK_INVALID;
            }
            if (v < 0) v += size;
            offs[b] += v * stride;
            for (int32_t d = i0->ndim - 1; d >= 0; d--) {
                off += ix->strides[d];
                if (++idx[d] < ix->sizes[d]) break;
                off -= ix->strides[d] * ix->sizes[d];
                idx[d] = 0;
            }
        }
    }
    return NK_SUCCESS;
}

/* Checks shapes: indexed [pre..., B..., post...] against self [pre..., n indexed dims, post...]. */
static nk_status nk_adv_check(const nk_tensor *self, const nk_tensor *indexed, int32_t first, int32_t n,
                              const nk_tensor *const *indices, int64_t *nb) {
    int64_t c;
    if (nk_tensor_check(self, &c) || nk_tensor_check(indexed, &c) || n < 1 || first < 0 || first + n > self->ndim)
        return NK_INVALID;
    const int32_t bd = indices[0]->ndim;
    if (indexed->ndim != self->ndim - n + bd || indexed->dtype != self->dtype) return NK_INVALID;
    for (int32_t k = 0; k < n; k++) {
        if (nk_tensor_check(indices[k], &c)) return NK_INVALID;
        if (!nk_index_dtype_ok(indices[k])) return NK_UNSUPPORTED;
        if (!nk_same_shape(indices[k], indices[0])) return NK_INVALID;
    }
    *nb = nk_tensor_numel(indices[0]);
    for (int32_t d = 0; d < first; d++)
        if (indexed->sizes[d] != self->sizes[d]) return NK_INVALID;
    for (int32_t d = 0; d < bd; d++)
        if (indexed->sizes[first + d] != indices[0]->sizes[d]) return NK_INVALID;
    for (int32_t d = first + n; d < self->ndim; d++)
        if (indexed->sizes[d - n + bd] != self->sizes[d]) return NK_INVALID;
    return NK_SUCCESS;
}

typedef struct nk_adv_job {
    const nk_tensor *self, *indexed;
    int32_t first, n, bd;
    int64_t nb, npre;
    const int64_t *offs;
    nk_tensor self_post, indexed_post; /* the post dims; data set per block */
    int64_t post_numel;
    bool put, accumulate;
} nk_adv_job;

/* Block r = (pre, b): the post-dims block of self at (pre, offs[b]) and of indexed at (pre, b). */
static void nk_adv_block(const nk_adv_job *j, int64_t r) {
    const nk_tensor *s = j->self, *x = j->indexed;
    int64_t b = r % j->nb, pre = r / j->nb, so = j->offs[b], xo = 0;
    for (int32_t d = j->bd - 1; d >= 0; d--) {
        xo += (b % x->sizes[j->first + d]) * x->strides[j->first + d];
        b /= x->sizes[j->first + d];
    }
    for (int32_t d = j->first - 1; d >= 0; d--) {
        const int64_t c = pre % s->sizes[d];
        pre /= s->sizes[d];
        so += c * s->strides[d];
        xo += c * x->strides[d];
    }
    const int64_t es = (int64_t)nk_dtype_size(s->dtype);
    char *sp = (char *)s->data + so * es, *xp = (char *)x->data + xo * es;
    if (j->post_numel == 1) {
        if (!j->put) memcpy(xp, sp, (size_t)es);
        else if (!j->accumulate) memcpy(sp, xp, (size_t)es);
        else nk_axpy_row(sp, 1, xp, 1, 1, s->dtype, 1.0, 1);
        return;
    }
    nk_tensor sb = j->self_post, xb = j->indexed_post;
    sb.data = sp;
    xb.data = xp;
    if (!j->put) nk_copy(&xb, &sb);
    else if (!j->accumulate) nk_copy(&sb, &xb);
    else nk_axpy_tensor(&sb, &xb, 1.0, 1);
}

static void nk_adv_run(void *ctx, int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) nk_adv_block((const nk_adv_job *)ctx, r);
}

static nk_status nk_adv(const nk_tensor *self, const nk_tensor *indexed, int32_t first, int32_t n,
                        const nk_tensor *const *indices, bool put, bool accumulate, int64_t *bad, int32_t *bad_dim) {
    int64_t nb;
    nk_status st = nk_adv_check(self, indexed, first, n, indices, &nb);
    if (st != NK_SUCCESS) return st;
    if (accumulate && !nk_axpy_dtype_ok(self->dtype)) return NK_UNSUPPORTED;
    nk_adv_job j;
    memset(&j, 0, sizeof j);
    j.self = self;
    j.indexed = indexed;
    j.first = first;
    j.n = n;
    j.bd = indices[0]->ndim;
    j.nb = nb;
    j.put = put;
    j.accumulate = accumulate;
    j.npre = 1;
    for (int32_t d = 0; d < first; d++) j.npre *= self->sizes[d];
    j.post_numel = 1;
    j.self_post.dtype = j.indexed_post.dtype = self->dtype;
    for (int32_t d = first + n; d < self->ndim; d++) {
        const int32_t p = j.self_post.ndim++;
        j.self_post.sizes[p] = j.indexed_post.sizes[p] = self->sizes[d];
        j.self_post.strides[p] = self->strides[d];
        j.indexed_post.strides[p] = indexed->strides[d - n + j.bd];
        j.post_numel *= self->sizes[d];
    }
    j.indexed_post.ndim = j.self_post.ndim;
    int64_t *offs = (int64_t *)malloc((size_t)(nb > 0 ? nb : 1) * sizeof(int64_t));
    if (offs == NULL) return NK_NO_MEMORY;
    /* Every index is checked (even when the result is empty, as the CPU does) before any write. */
    st = nk_adv_offsets(self, first, n, indices, nb, offs, bad, bad_dim);
    j.offs = offs;
    if (st == NK_SUCCESS && nb > 0 && j.npre > 0 && j.post_numel > 0) {
        const int64_t blocks = j.npre * nb;
        if (put) {
            /* In order: with duplicate indices the last assignment wins and sums are taken in order. */
            nk_adv_run(&j, 0, blocks);
        } else {
            nk_parallel_for(blocks, j.post_numel >= 4096 ? 1 : 4096 / j.post_numel, nk_adv_run, &j);
        }
    }
    free(offs);
    return st;
}

nk_status nk_index_gather(const nk_tensor *dst, const nk_tensor *src, int32_t first, int32_t n,
                          const nk_tensor *const *indices, int64_t *bad, int32_t *bad_dim) {
    return nk_adv(src, dst, first, n, indices, false, false, bad, bad_dim);
}

nk_status nk_index_put(const nk_tensor *dst, const nk_tensor *values, int32_t first, int32_t n,
                       const nk_tensor *const *indices, bool accumulate, int64_t *bad, int32_t *bad_dim) {
    return nk_adv(dst, values, first, n, indices, true, accumulate, bad, bad_dim);
}
