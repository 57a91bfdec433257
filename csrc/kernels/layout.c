/*
 * layout.c - ops whose result depends on element positions rather than on values alone: nonzero,
 * tril/triu and arange.
 *
 * nonzero visits the input in logical row-major order, as the CPU kernel does, so its coordinates come
 * out in the same order. It splits that order into parts: each part is counted, a prefix sum gives the
 * first output row of each part, and the parts then write their rows independently.
 */
#include "kernels_internal.h"

#include <stdlib.h>

/* ---- nonzero ------------------------------------------------------------------------------------ */

#define NK_NZ_MAX_PARTS 256

/*
 * Counts a row's nonzeros and, when pos is not NULL, stores their positions in the row. A float is
 * nonzero unless its bits other than the sign are all zero (NaN counts, -0.0 does not). The two loops
 * keep the counting pass free of stores.
 */
static int64_t nk_row_scan(const char *p, int64_t stride, int64_t n, nk_dtype dt, int64_t *pos) {
    int64_t c = 0;
#define NK_SCAN(T, MASK)                                                                    \
    if (pos == NULL) {                                                                      \
        for (int64_t i = 0; i < n; i++) c += (((const T *)p)[i * stride] & (MASK)) != 0;    \
    } else {                                                                                \
        for (int64_t i = 0; i < n; i++) {                                                   \
            pos[c] = i;                                                                     \
            c += (((const T *)p)[i * stride] & (MASK)) != 0;                                \
        }                                                                                   \
    }                                                                                       \
    break;
    switch (dt) {
    case NK_BOOL: case NK_U8: case NK_I8: NK_SCAN(uint8_t, 0xFFu)
    case NK_I16: case NK_U16: NK_SCAN(uint16_t, 0xFFFFu)
    case NK_F16: case NK_BF16: NK_SCAN(uint16_t, 0x7FFFu)
    case NK_I32: case NK_U32: NK_SCAN(uint32_t, 0xFFFFFFFFu)
    case NK_F32: NK_SCAN(uint32_t, 0x7FFFFFFFu)
    case NK_I64: case NK_U64: NK_SCAN(uint64_t, UINT64_MAX)
    case NK_F64: NK_SCAN(uint64_t, UINT64_C(0x7FFFFFFFFFFFFFFF))
    default: break;
    }
#undef NK_SCAN
    return c;
}

/* The input seen as rows: all dims but the last are "outer"; a 0-d input is one row of one element. */
typedef struct nk_nz_job {
    const nk_tensor *in, *out;
    int32_t nd;                 /* in->ndim */
    int64_t row_len, rows;
    int64_t inner_stride;
    int64_t parts, rows_per_part;
    int64_t counts[NK_NZ_MAX_PARTS]; /* per part; then the first output row of each part */
    int64_t *scratch;           /* one row of positions per part (parts * row_len), for the writes */
    bool write;
} nk_nz_job;

static void nk_nz_unravel(const nk_nz_job *j, int64_t r, int64_t *idx, int64_t *off) {
    *off = 0;
    for (int32_t d = j->nd - 2; d >= 0; d--) {
        idx[d] = r % j->in->sizes[d];
        r /= j->in->sizes[d];
        *off += idx[d] * j->in->strides[d];
    }
}

static void nk_nz_run(void *ctx, int64_t pb, int64_t pe) {
    nk_nz_job *j = (nk_nz_job *)ctx;
    const nk_tensor *in = j->in;
    const int64_t es = (int64_t)nk_dtype_size(in->dtype);
    for (int64_t part = pb; part < pe; part++) {
        const int64_t rb = part * j->rows_per_part;
        const int64_t re = rb + j->rows_per_part < j->rows ? rb + j->rows_per_part : j->rows;
        if (rb >= re) {
            if (!j->write) j->counts[part] = 0;
            continue;
        }
        int64_t idx[NK_MAX_DIMS] = {0};
        int64_t off;
        nk_nz_unravel(j, rb, idx, &off);
        int64_t count = 0, orow = j->write ? j->counts[part] : 0;
        int64_t *pos = j->write ? j->scratch + part * j->row_len : NULL;
        const nk_tensor *out = j->out;
        for (int64_t r = rb; r < re; r++) {
            const char *p = (const char *)in->data + off * es;
            if (!j->write) {
                count += nk_row_scan(p, j->inner_stride, j->row_len, in->dtype, NULL);
            } else {
                const int64_t c = nk_row_scan(p, j->inner_stride, j->row_len, in->dtype, pos);
                for (int64_t q = 0; q < c; q++, orow++) {
                    int64_t *o = (int64_t *)out->data + orow * out->strides[0];
                    for (int32_t d = 0; d + 1 < j->nd; d++) o[d * out->strides[1]] = idx[d];
                    if (j->nd > 0) o[(j->nd - 1) * out->strides[1]] = pos[q];
                }
            }
            /* Next row: the outer coordinates as an odometer. */
            for (int32_t d = j->nd - 2; d >= 0; d--) {
                off += in->strides[d];
                if (++idx[d] < in->sizes[d]) break;
                off -= in->strides[d] * in->sizes[d];
                idx[d] = 0;
            }
        }
        if (!j->write) j->counts[part] = count;
    }
}

static nk_status nk_nz_plan(nk_nz_job *j, const nk_tensor *in) {
    int64_t n;
    if (nk_tensor_check(in, &n) != NK_SUCCESS) return NK_INVALID;
    memset(j, 0, sizeof *j);
    j->in = in;
    j->nd = in->ndim;
    j->row_len = in->ndim ? in->sizes[in->ndim - 1] : 1;
    j->inner_stride = in->ndim ? in->strides[in->ndim - 1] : 0;
    j->rows = j->row_len ? n / j->row_len : 0;
    const int64_t want_rows = j->row_len >= 16384 ? 1 : 16384 / (j->row_len ? j->row_len : 1);
    int64_t parts = j->rows ? (j->rows + want_rows - 1) / want_rows : 0;
    const int64_t max_parts = (int64_t)nk_threads_get() * 4 < NK_NZ_MAX_PARTS ? (int64_t)nk_threads_get() * 4
                                                                               : NK_NZ_MAX_PARTS;
    if (parts > max_parts) parts = max_parts;
    j->parts = parts;
    j->rows_per_part = parts ? (j->rows + parts - 1) / parts : 0;
    return NK_SUCCESS;
}

nk_status nk_nonzero_count(const nk_tensor *in, int64_t *count) {
    nk_nz_job j;
    nk_status st = nk_nz_plan(&j, in);
    if (st != NK_SUCCESS) return st;
    *count = 0;
    nk_parallel_for(j.parts, 1, nk_nz_run, &j);
    for (int64_t p = 0; p < j.parts; p++) *count += j.counts[p];
    return NK_SUCCESS;
}

nk_status nk_nonzero(const nk_tensor *out, const nk_tensor *in) {
    nk_nz_job j;
    nk_status st = nk_nz_plan(&j, in);
    if (st != NK_SUCCESS) return st;
    int64_t no;
    if (nk_tensor_check(out, &no) != NK_SUCCESS || out->dtype != NK_I64 || out->ndim != 2 ||
        out->sizes[1] != in->ndim)
        return NK_INVALID;
    j.out = out;
    nk_parallel_for(j.parts, 1, nk_nz_run, &j);
    int64_t total = 0;
    for (int64_t p = 0; p < j.parts; p++) {
        const int64_t c = j.counts[p];
        j.counts[p] = total;
        total += c;
    }
    if (total != out->sizes[0]) return NK_INVALID;
    if (total == 0 || in->ndim == 0) return NK_SUCCESS;
    j.scratch = (int64_t *)malloc((size_t)(j.parts * j.row_len) * sizeof(int64_t));
    if (j.scratch == NULL) return NK_NO_MEMORY;
    j.write = true;
    nk_parallel_for(j.parts, 1, nk_nz_run, &j);
    free(j.scratch);
    return NK_SUCCESS;
}

/* ---- tril / triu -------------------------------------------------------------------------------- */

typedef struct nk_tri_job {
    const nk_tensor *out, *in;
    int64_t M, N, k, es;
    bool upper, in_place;
} nk_tri_job;

static void nk_tri_run(void *ctx, int64_t b, int64_t e) {
    const nk_tri_job *j = (const nk_tri_job *)ctx;
    const nk_tensor *out = j->out, *in = j->in;
    const int32_t nd = out->ndim;
    const int64_t os = out->strides[nd - 1], is = in->strides[nd - 1], es = j->es;
    for (int64_t r = b; r < e; r++) {
        /* Row r: matrix r / M, row i = r % M. */
        int64_t i = r % j->M, m = r / j->M, oo = i * out->strides[nd - 2], io = i * in->strides[nd - 2];
        for (int32_t d = nd - 3; d >= 0; d--) {
            const int64_t c = m % out->sizes[d];
            m /= out->sizes[d];
            oo += c * out->strides[d];
            io += c * in->strides[d];
        }
        char *o = (char *)out->data + oo * es;
        const char *s = (const char *)in->data + io * es;
        /* Kept columns [lo, hi): tril keeps j <= i + k, triu keeps j >= i + k. */
        int64_t lo, hi;
        const int64_t edge = i + j->k; /* k is clamped, so no overflow */
        if (j->upper) {
            lo = edge < 0 ? 0 : (edge > j->N ? j->N : edge);
            hi = j->N;
        } else {
            lo = 0;
            hi = edge + 1 < 0 ? 0 : (edge + 1 > j->N ? j->N : edge + 1);
        }
        if (!j->in_place) {
            if (os == 1 && is == 1) {
                memcpy(o + lo * es, s + lo * es, (size_t)((hi - lo) * es));
            } else {
                for (int64_t c = lo; c < hi; c++) memcpy(o + c * os * es, s + c * is * es, (size_t)es);
            }
        }
        /* Zero is all-zero bits in every dtype. */
        if (os == 1) {
            memset(o, 0, (size_t)(lo * es));
            memset(o + hi * es, 0, (size_t)((j->N - hi) * es));
        } else {
            for (int64_t c = 0; c < lo; c++) memset(o + c * os * es, 0, (size_t)es);
            for (int64_t c = hi; c < j->N; c++) memset(o + c * os * es, 0, (size_t)es);
        }
    }
}

nk_status nk_triangle(const nk_tensor *out, const nk_tensor *in, int64_t k, bool upper) {
    int64_t no, ni;
    if (nk_tensor_check(out, &no) != NK_SUCCESS || nk_tensor_check(in, &ni) != NK_SUCCESS) return NK_INVALID;
    if (out->ndim < 2 || !nk_same_shape(out, in) || out->dtype != in->dtype) return NK_INVALID;
    if (no == 0) return NK_SUCCESS;
    nk_tri_job j = {.out = out, .in = in, .upper = upper, .es = (int64_t)nk_dtype_size(out->dtype)};
    j.M = out->sizes[out->ndim - 2];
    j.N = out->sizes[out->ndim - 1];
    /* Beyond these bounds every row keeps everything or nothing. */
    j.k = k < -j.M - 1 ? -j.M - 1 : (k > j.N + 1 ? j.N + 1 : k);
    j.in_place = out->data == in->data;
    if (j.in_place) {
        for (int32_t d = 0; d < out->ndim; d++)
            if (out->strides[d] != in->strides[d] && out->sizes[d] > 1) return NK_INVALID;
    }
    const int64_t rows = no / j.N;
    nk_parallel_for(rows, j.N >= 4096 ? 1 : 4096 / j.N, nk_tri_run, &j);
    return NK_SUCCESS;
}

/* ---- arange ------------------------------------------------------------------------------------- */

typedef struct nk_arange_job {
    const nk_tensor *out;
    int64_t start, step;
    nk_cast_fn cast;
} nk_arange_job;

static void nk_arange_run(void *ctx, int64_t b, int64_t e) {
    const nk_arange_job *j = (const nk_arange_job *)ctx;
    const int64_t es = (int64_t)nk_dtype_size(j->out->dtype), st = j->out->strides[0];
    int64_t buf[256];
    for (int64_t i = b; i < e; i += 256) {
        const int64_t n = e - i < 256 ? e - i : 256;
        /* Unsigned arithmetic: wraps like the CPU kernel's int64 instead of overflowing. */
        for (int64_t q = 0; q < n; q++)
            buf[q] = (int64_t)((uint64_t)j->start + (uint64_t)(i + q) * (uint64_t)j->step);
        j->cast((char *)j->out->data + i * st * es, st, buf, 1, n);
    }
}

nk_status nk_arange(const nk_tensor *out, int64_t start, int64_t step) {
    int64_t n;
    if (nk_tensor_check(out, &n) != NK_SUCCESS || out->ndim != 1) return NK_INVALID;
    nk_arange_job j = {.out = out, .start = start, .step = step, .cast = nk_cast_get(out->dtype, NK_I64)};
    if (j.cast == NULL) return NK_UNSUPPORTED;
    nk_parallel_for(n, 16384, nk_arange_run, &j);
    return NK_SUCCESS;
}
