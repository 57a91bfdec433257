/*
 * reduce.c - sum, mean, amax/amin, max/min with indices, any/all, logsumexp, var/std and cumsum.
 *
 * A reduction is planned once: dims of size 1 are dropped, reduced dims are (except for index-returning
 * reductions) sorted by stride and merged, so the innermost reduced dim becomes the "row"; kept dims
 * are merged where input and output strides allow. Each output then folds its reduction space, a list
 * of rows, into a small state. Rows of f32/bf16/f16 are converted chunk-wise into float buffers and
 * reduced with the SIMD kernels of reduce_simd.h; f64 and integer rows use scalar double/int64 loops.
 * Many outputs run in parallel over outputs; few large outputs split their reduction space over the
 * threads and combine the partial states in order. A float sum over one outer dim of a tensor whose
 * innermost kept dim is contiguous (a bias gradient, sum(0) of a matrix) adds whole row segments into
 * per-column cascades instead (nk_colsum), in the order PyTorch's CPU sums such columns.
 */
#include "reduce_simd.h"

#include <stdatomic.h>
#include <stdlib.h>

int nk_reduce_isa(void) {
    static atomic_int level = -1;
    int l = atomic_load_explicit(&level, memory_order_relaxed);
    if (l < 0) {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
            l = 2;
        else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
            l = 1;
        else
            l = 0;
        atomic_store_explicit(&level, l, memory_order_relaxed);
    }
    return l;
}

NK_SIMD_FN(int, nk_rgather, (float *dst, const char *src, int64_t n, int64_t s, nk_dtype t), (dst, src, n, s, t))
NK_SIMD_FN(double, nk_sum, (const float *x, int64_t n), (x, n))
NK_SIMD_FN(float, nk_sum_cascade, (const float *x, int64_t n), (x, n))
NK_SIMD_FN(float, nk_sum_cascade_bf16, (const uint16_t *x, int64_t n), (x, n))
NK_SIMD_FN(void, nk_sum_cascade2, (const void *x, const void *y, int64_t n, int bf16, float *out), (x, y, n, bf16, out))
NK_SIMD_FN(void, nk_colsum, (const char *in, nk_dtype t, int64_t rows, int64_t rs, int64_t ncols, float *out),
           (in, t, rows, rs, ncols, out))
NK_SIMD_FN(double, nk_sumsqdev, (const float *x, int64_t n, float c), (x, n, c))
NK_SIMD_FN(float, nk_maxidx, (const float *x, int64_t n, int is_max, int64_t *idx), (x, n, is_max, idx))
NK_SIMD_FN(float, nk_max, (const float *x, int64_t n, int is_max), (x, n, is_max))
NK_SIMD_FN(float, nk_max_bf16, (const uint16_t *x, int64_t n, int is_max), (x, n, is_max))
NK_SIMD_FN(double, nk_expsub, (float *dst, const float *x, int64_t n, float c), (dst, x, n, c))

/* ---- plans ---- */

typedef enum nk_rkind {
    NK_RK_SUM,     /* v (float inputs) or i (integer accumulation) */
    NK_RK_MAX,     /* v, idx; n = 0 while empty */
    NK_RK_MIN,
    NK_RK_MOMENTS, /* n, v = mean, m2 */
    NK_RK_SUMEXP,  /* v = sum(exp(x - c)) */
    NK_RK_ANY,     /* i */
    NK_RK_ALL,
} nk_rkind;

typedef struct nk_rstate {
    double v, m2;
    int64_t n, idx, i;
} nk_rstate;

typedef struct nk_rplan {
    int32_t nk, nr;
    int64_t ksize[NK_MAX_DIMS], kin[NK_MAX_DIMS], kout[NK_MAX_DIMS];
    int64_t rsize[NK_MAX_DIMS], rin[NK_MAX_DIMS]; /* reduced dims outside the row, outer first */
    int64_t row_n, row_s;                         /* the row: innermost reduced dim */
    int64_t nout, nrows, nred;
    const char *in;
    const nk_tensor *out; /* the output whose strides are kout */
    nk_dtype it;
    int64_t isz;
    bool int_acc; /* sum in int64 */
} nk_rplan;

typedef struct nk_rctx {
    const nk_rplan *p;
    nk_rkind kind;
    double c;         /* SUMEXP shift */
    bool values_only; /* MAX/MIN: the index is not wanted (amax, amin, logsumexp's shift) */
} nk_rctx;

static nk_status nk_rplan_init(nk_rplan *p, const nk_tensor *in, const nk_tensor *out, uint64_t dims, bool sort) {
    int64_t numel;
    nk_status st = nk_tensor_check(in, &numel);
    if (st != NK_SUCCESS) return st;
    if (out != NULL) {
        int64_t on;
        if ((st = nk_tensor_check(out, &on)) != NK_SUCCESS) return st;
        if (out->ndim != in->ndim) return NK_INVALID;
    }
    if (in->ndim < 64 && (dims >> in->ndim) != 0) return NK_INVALID;
    memset(p, 0, sizeof *p);
    p->in = in->data;
    p->out = out;
    p->it = in->dtype;
    p->isz = (int64_t)nk_dtype_size(in->dtype);
    int64_t rs[NK_MAX_DIMS], ri[NK_MAX_DIMS];
    int32_t nr = 0;
    for (int32_t d = 0; d < in->ndim; d++) {
        const bool red = (dims >> d) & 1u;
        if (out != NULL && out->sizes[d] != (red ? 1 : in->sizes[d])) return NK_INVALID;
        if (in->sizes[d] == 1) continue;
        if (red) {
            rs[nr] = in->sizes[d];
            ri[nr++] = in->strides[d];
        } else {
            /* Merge with the previous kept dim when it is its outer continuation in both tensors. */
            const int64_t os = out != NULL ? out->strides[d] : 0;
            if (p->nk > 0 && p->kin[p->nk - 1] == in->strides[d] * in->sizes[d] &&
                p->kout[p->nk - 1] == os * in->sizes[d]) {
                p->ksize[p->nk - 1] *= in->sizes[d];
                p->kin[p->nk - 1] = in->strides[d];
                p->kout[p->nk - 1] = os;
            } else {
                p->ksize[p->nk] = in->sizes[d];
                p->kin[p->nk] = in->strides[d];
                p->kout[p->nk++] = os;
            }
        }
    }
    if (sort) {
        /* Largest |stride| first so the row is the most contiguous dim; stable insertion sort. */
        for (int32_t a = 1; a < nr; a++) {
            const int64_t s = rs[a], t = ri[a];
            int32_t b = a - 1;
            while (b >= 0 && llabs(ri[b]) < llabs(t)) {
                rs[b + 1] = rs[b];
                ri[b + 1] = ri[b];
                b--;
            }
            rs[b + 1] = s;
            ri[b + 1] = t;
        }
    }
    /* Merge adjacent reduced dims (also keeps the logical order for index-returning reductions). */
    int32_t m = 0;
    for (int32_t a = 0; a < nr; a++) {
        if (m > 0 && ri[m - 1] == ri[a] * rs[a]) {
            rs[m - 1] *= rs[a];
            ri[m - 1] = ri[a];
        } else {
            rs[m] = rs[a];
            ri[m++] = ri[a];
        }
    }
    if (m == 0) {
        p->row_n = numel == 0 ? 0 : 1;
        p->row_s = 0;
    } else {
        p->row_n = rs[m - 1];
        p->row_s = ri[m - 1];
        for (int32_t a = 0; a < m - 1; a++) {
            p->rsize[a] = rs[a];
            p->rin[a] = ri[a];
        }
        p->nr = m - 1;
    }
    p->nrows = 1;
    for (int32_t a = 0; a < p->nr; a++) p->nrows *= p->rsize[a];
    p->nred = p->nrows * p->row_n;
    p->nout = 1;
    for (int32_t a = 0; a < p->nk; a++) p->nout *= p->ksize[a];
    /* An empty kept dim: no outputs. An empty reduced dim: outputs with an empty reduction. */
    for (int32_t d = 0; d < in->ndim; d++)
        if (in->sizes[d] == 0 && !((dims >> d) & 1u)) p->nout = 0;
    if (numel == 0 && p->nout > 0) p->nred = 0, p->row_n = 0;
    return NK_SUCCESS;
}

/* Element offsets of output o in the input and in the output. */
static void nk_rplan_offsets(const nk_rplan *p, int64_t o, int64_t *in_off, int64_t *out_off) {
    int64_t a = 0, b = 0;
    for (int32_t d = p->nk - 1; d >= 0; d--) {
        const int64_t q = o % p->ksize[d];
        o /= p->ksize[d];
        a += q * p->kin[d];
        b += q * p->kout[d];
    }
    *in_off = a;
    if (out_off) *out_off = b;
}

static int64_t nk_rplan_row_offset(const nk_rplan *p, int64_t r) {
    int64_t a = 0;
    for (int32_t d = p->nr - 1; d >= 0; d--) {
        a += (r % p->rsize[d]) * p->rin[d];
        r /= p->rsize[d];
    }
    return a;
}

/* ---- states ---- */

static void nk_rstate_init(nk_rstate *s, nk_rkind k) {
    memset(s, 0, sizeof *s);
    if (k == NK_RK_ALL) s->i = 1;
}

/* Folds b (which follows a in the reduction order) into a. */
static void nk_rstate_combine(nk_rstate *a, const nk_rstate *b, nk_rkind k) {
    switch (k) {
    case NK_RK_SUM:
    case NK_RK_SUMEXP:
        a->v += b->v;
        a->i = (int64_t)((uint64_t)a->i + (uint64_t)b->i);
        break;
    case NK_RK_MAX:
    case NK_RK_MIN:
        if (b->n == 0) break;
        if (a->n == 0) {
            *a = *b;
            break;
        }
        if (a->v != a->v) break;
        if (b->v != b->v || (k == NK_RK_MAX ? b->v > a->v : b->v < a->v)) {
            a->v = b->v;
            a->idx = b->idx;
        }
        a->n += b->n;
        break;
    case NK_RK_MOMENTS: {
        if (b->n == 0) break;
        if (a->n == 0) {
            *a = *b;
            break;
        }
        const double n = (double)(a->n + b->n);
        const double delta = b->v - a->v;
        a->v += delta * (double)b->n / n;
        a->m2 += b->m2 + delta * delta * (double)a->n * (double)b->n / n;
        a->n += b->n;
        break;
    }
    case NK_RK_ANY: a->i = a->i || b->i; break;
    case NK_RK_ALL: a->i = a->i && b->i; break;
    }
}

/* ---- rows ---- */

/* Integer and f64 rows: scalar loops per dtype. X(name, type, to-double) */
#define NK_SCALAR_DTYPES(X)                                  \
    X(b8, uint8_t, (double)(x != 0))                         \
    X(u8, uint8_t, (double)x)                                \
    X(i8, int8_t, (double)x)                                 \
    X(i16, int16_t, (double)x)                               \
    X(i32, int32_t, (double)x)                               \
    X(i64, int64_t, (double)x)                               \
    X(u16, uint16_t, (double)x)                              \
    X(u32, uint32_t, (double)x)                              \
    X(u64, uint64_t, (double)x)                              \
    X(f64, double, x)                                        \
    X(f32, float, (double)x)                                 \
    X(bf16, uint16_t, (double)nk_bf16_to_f32(x))             \
    X(f16, uint16_t, (double)nk_f16_to_f32(x))

#define NK_SCALAR_ROW(name, type, conv)                                                                      \
    static void nk_row_##name(const nk_rctx *c, const char *base, int64_t n, int64_t s, int64_t pos,        \
                              nk_rstate *st) {                                                              \
        const type *p = (const type *)base;                                                                 \
        switch (c->kind) {                                                                                  \
        case NK_RK_SUM:                                                                                     \
            if (c->p->int_acc) {                                                                            \
                uint64_t acc = (uint64_t)st->i;                                                             \
                for (int64_t j = 0; j < n; j++) {                                                           \
                    const type x = p[j * s];                                                                \
                    acc += (uint64_t)(int64_t)x;                                                            \
                }                                                                                           \
                st->i = (int64_t)acc;                                                                       \
            } else {                                                                                        \
                double acc = 0;                                                                             \
                for (int64_t j = 0; j < n; j++) {                                                           \
                    const type x = p[j * s];                                                                \
                    acc += conv;                                                                            \
                }                                                                                           \
                st->v += acc;                                                                               \
            }                                                                                               \
            break;                                                                                          \
        case NK_RK_SUMEXP: {                                                                                \
            double acc = 0;                                                                                 \
            for (int64_t j = 0; j < n; j++) {                                                               \
                const type x = p[j * s];                                                                    \
                acc += exp((conv) - c->c);                                                          \
            }                                                                                               \
            st->v += acc;                                                                                   \
            break;                                                                                          \
        }                                                                                                   \
        case NK_RK_MAX:                                                                                     \
        case NK_RK_MIN: {                                                                                   \
            const bool mx = c->kind == NK_RK_MAX;                                                           \
            for (int64_t j = 0; j < n; j++) {                                                               \
                if (st->n > 0 && st->v != st->v) break;                                                     \
                const type x = p[j * s];                                                                    \
                const double v = conv;                                                                      \
                if (st->n == 0 || v != v || (mx ? v > st->v : v < st->v)) {                                \
                    st->v = v;                                                                              \
                    st->idx = pos + j;                                                                      \
                }                                                                                           \
                st->n++;                                                                                    \
            }                                                                                               \
            break;                                                                                          \
        }                                                                                                   \
        case NK_RK_MOMENTS: {                                                                               \
            double mean = 0;                                                                                \
            for (int64_t j = 0; j < n; j++) {                                                               \
                const type x = p[j * s];                                                                    \
                mean += conv;                                                                               \
            }                                                                                               \
            mean /= (double)n;                                                                              \
            double m2 = 0;                                                                                  \
            for (int64_t j = 0; j < n; j++) {                                                               \
                const type x = p[j * s];                                                                    \
                const double d = (conv) - mean;                                                             \
                m2 += d * d;                                                                                \
            }                                                                                               \
            const nk_rstate r = {.v = mean, .m2 = m2, .n = n};                                              \
            nk_rstate_combine(st, &r, NK_RK_MOMENTS);                                                       \
            break;                                                                                          \
        }                                                                                                   \
        case NK_RK_ANY:                                                                                     \
            for (int64_t j = 0; j < n && !st->i; j++) {                                                     \
                const type x = p[j * s];                                                                    \
                st->i = (conv) != 0;                                                                        \
            }                                                                                               \
            break;                                                                                          \
        case NK_RK_ALL:                                                                                     \
            for (int64_t j = 0; j < n && st->i; j++) {                                                      \
                const type x = p[j * s];                                                                    \
                st->i = (conv) != 0;                                                                        \
            }                                                                                               \
            break;                                                                                          \
        }                                                                                                   \
    }
NK_SCALAR_DTYPES(NK_SCALAR_ROW)

/* f32/bf16/f16 rows through float chunks. Float sums stay in float within a chunk. */
static void nk_row_float(const nk_rctx *c, const char *base, int64_t n, int64_t s, int64_t pos, nk_rstate *st) {
    const nk_dtype t = c->p->it;
    const int64_t es = c->p->isz;
    if (c->kind == NK_RK_ANY || c->kind == NK_RK_ALL) {
        if (t == NK_F32) nk_row_f32(c, base, n, s, pos, st);
        else if (t == NK_BF16) nk_row_bf16(c, base, n, s, pos, st);
        else nk_row_f16(c, base, n, s, pos, st);
        return;
    }
    float buf[NK_CHUNK];
    /* Contiguous f32 rows are read in place, whole (so sums keep PyTorch's order); others in chunks. */
    const int64_t chunk = (t == NK_F32 && s == 1) ? n : NK_CHUNK;
    for (int64_t j = 0; j < n; j += chunk) {
        const int64_t len = n - j < chunk ? n - j : chunk;
        const char *src = base + j * s * es;
        const float *x = buf;
        if (c->kind == NK_RK_SUM && t == NK_BF16 && s == 1) {
            /* Widened while summed: the same chunks and order, the chunk never stored. */
            st->v += nk_sum_cascade_bf16((const uint16_t *)src, len);
            continue;
        }
        if ((c->kind == NK_RK_MAX || c->kind == NK_RK_MIN) && c->values_only && t == NK_BF16 && s == 1) {
            nk_rstate r = {.n = len, .v = nk_max_bf16((const uint16_t *)src, len, c->kind == NK_RK_MAX)};
            nk_rstate_combine(st, &r, c->kind);
            continue;
        }
        if (t == NK_F32 && s == 1) x = (const float *)src;
        else nk_rgather(buf, src, len, s, t);
        switch (c->kind) {
        case NK_RK_SUM: st->v += s == 1 ? nk_sum_cascade(x, len) : nk_sum_cascade1(x, len); break;
        case NK_RK_SUMEXP: st->v += nk_expsub(NULL, x, len, (float)c->c); break;
        case NK_RK_MAX:
        case NK_RK_MIN: {
            nk_rstate r = {.n = len};
            if (c->values_only) {
                /* Without the index: half the instructions, and memory-bound again on long rows. */
                r.v = nk_max(x, len, c->kind == NK_RK_MAX);
            } else {
                r.v = nk_maxidx(x, len, c->kind == NK_RK_MAX, &r.idx);
                r.idx += pos + j;
            }
            nk_rstate_combine(st, &r, c->kind);
            break;
        }
        case NK_RK_MOMENTS: {
            /* Deviations from the float-rounded mean mf; sum((x-m)^2) = sum((x-mf)^2) - n(m-mf)^2. */
            const double md = nk_sum(x, len) / (double)len;
            const float mf = (float)md;
            const double m2 = nk_sumsqdev(x, len, mf) - (double)len * (md - mf) * (md - mf);
            const nk_rstate r = {.v = md, .m2 = m2 < 0 ? 0 : m2, .n = len}; /* NaN stays */
            nk_rstate_combine(st, &r, NK_RK_MOMENTS);
            break;
        }
        default: break;
        }
    }
}

typedef void (*nk_row_fn)(const nk_rctx *, const char *, int64_t, int64_t, int64_t, nk_rstate *);

static nk_row_fn nk_row_get(nk_dtype t) {
    switch (t) {
    case NK_F32:
    case NK_BF16:
    case NK_F16: return nk_row_float;
    case NK_F64: return nk_row_f64;
    case NK_BOOL: return nk_row_b8;
    case NK_U8: return nk_row_u8;
    case NK_I8: return nk_row_i8;
    case NK_I16: return nk_row_i16;
    case NK_I32: return nk_row_i32;
    case NK_I64: return nk_row_i64;
    case NK_U16: return nk_row_u16;
    case NK_U32: return nk_row_u32;
    case NK_U64: return nk_row_u64;
    default: return NULL;
    }
}

/* Folds positions [b, e) of the reduction space of the output at input offset `base` into st. */
static void nk_fold(const nk_rctx *c, int64_t base, int64_t b, int64_t e, nk_rstate *st) {
    const nk_rplan *p = c->p;
    if (p->row_n == 0) return;
    const nk_row_fn row = nk_row_get(p->it);
    int64_t r = b / p->row_n, j = b % p->row_n;
    while (b < e) {
        int64_t len = p->row_n - j < e - b ? p->row_n - j : e - b;
        /* SIMD lane indices are int32. */
        if (len > (INT64_C(1) << 30)) len = INT64_C(1) << 30;
        const int64_t off = base + nk_rplan_row_offset(p, r) + j * p->row_s;
        row(c, p->in + off * p->isz, len, p->row_s, b, st);
        b += len;
        j += len;
        if (j == p->row_n) {
            j = 0;
            r++;
        }
    }
}

/* ---- drivers ---- */

typedef struct nk_split_job {
    const nk_rctx *c;
    int64_t base, chunk, nred;
    nk_rstate *parts;
} nk_split_job;

static void nk_split_run(void *ctx, int64_t b, int64_t e) {
    nk_split_job *j = ctx;
    for (int64_t q = b; q < e; q++) {
        nk_rstate_init(&j->parts[q], j->c->kind);
        const int64_t lo = q * j->chunk, hi = lo + j->chunk < j->nred ? lo + j->chunk : j->nred;
        nk_fold(j->c, j->base, lo, hi, &j->parts[q]);
    }
}

#define NK_SPLIT_MAX 64
#define NK_GRAIN 32768 /* elements worth a task */

/* The whole reduction of one output, split over the threads when it is large. */
static void nk_reduce_one(const nk_rctx *c, int64_t base, nk_rstate *st) {
    const int64_t nred = c->p->nred;
    const int threads = nk_threads_get();
    nk_rstate_init(st, c->kind);
    if (threads <= 1 || nred < 4 * NK_GRAIN) {
        nk_fold(c, base, 0, nred, st);
        return;
    }
    int64_t parts = nred / NK_GRAIN;
    if (parts > NK_SPLIT_MAX) parts = NK_SPLIT_MAX;
    if (parts > 4 * threads) parts = 4 * threads;
    nk_rstate states[NK_SPLIT_MAX];
    nk_split_job job = {.c = c, .base = base, .chunk = (nred + parts - 1) / parts, .nred = nred, .parts = states};
    parts = (nred + job.chunk - 1) / job.chunk;
    nk_parallel_for(parts, 1, nk_split_run, &job);
    for (int64_t q = 0; q < parts; q++) nk_rstate_combine(st, &states[q], c->kind);
}

/* What to do with each finished output. */
typedef void (*nk_emit_fn)(void *ctx, int64_t o, const nk_rstate *st);

typedef struct nk_out_job {
    const nk_rctx *c;
    nk_emit_fn emit;
    void *ectx;
} nk_out_job;

/* Sums of contiguous rows, one per output, two at a time (nk_sum_cascade2): the sums nk_fold gives,
 * for f32 rows and bf16 rows of one chunk. The two rows are half the range apart, two sequential
 * streams: neighbouring rows, interleaved 128 bytes at a time inside the same pages, halved the speed
 * of rows read from DRAM. Returns the first output not done. */
static int64_t nk_out_sum_pairs(const nk_out_job *j, int64_t b, int64_t e) {
    const nk_rplan *p = j->c->p;
    const bool bf16 = p->it == NK_BF16;
    if (j->c->kind != NK_RK_SUM || p->nr != 0 || p->row_s != 1 || p->nk != 1 || p->row_n < 32 ||
        !(p->it == NK_F32 || (bf16 && p->row_n <= NK_CHUNK)))
        return b;
    const int64_t step = p->kin[0] * p->isz, half = (e - b) / 2;
    for (int64_t o = b; o < b + half; o++) {
        const char *x = p->in + o * step;
        float s[2];
        nk_sum_cascade2(x, x + half * step, p->row_n, bf16, s);
        for (int q = 0; q < 2; q++) {
            const nk_rstate st = {.v = 0.0 + (double)s[q]};
            j->emit(j->ectx, o + q * half, &st);
        }
    }
    return b + 2 * half;
}

static void nk_out_run(void *ctx, int64_t b, int64_t e) {
    nk_out_job *j = ctx;
    const nk_rplan *p = j->c->p;
    for (int64_t o = nk_out_sum_pairs(j, b, e); o < e; o++) {
        int64_t base;
        if (p->nk == 1) base = o * p->kin[0];
        else nk_rplan_offsets(p, o, &base, NULL);
        nk_rstate st;
        nk_rstate_init(&st, j->c->kind);
        nk_fold(j->c, base, 0, j->c->p->nred, &st);
        j->emit(j->ectx, o, &st);
    }
}

static void nk_reduce_all(const nk_rctx *c, nk_emit_fn emit, void *ectx) {
    const nk_rplan *p = c->p;
    const int threads = nk_threads_get();
    if (p->nout >= 2 * threads || p->nred < 4 * NK_GRAIN) {
        int64_t grain = NK_GRAIN / (p->nred > 0 ? p->nred : 1);
        nk_out_job job = {.c = c, .emit = emit, .ectx = ectx};
        nk_parallel_for(p->nout, grain < 1 ? 1 : grain, nk_out_run, &job);
        return;
    }
    for (int64_t o = 0; o < p->nout; o++) {
        int64_t base;
        nk_rplan_offsets(p, o, &base, NULL);
        nk_rstate st;
        nk_reduce_one(c, base, &st);
        emit(ectx, o, &st);
    }
}

/* ---- stores ---- */

static void nk_store_f64_as(char *dst, nk_dtype t, double v) {
    nk_cast_get(t, NK_F64)(dst, 1, &v, 1, 1);
}

static void nk_store_i64_as(char *dst, nk_dtype t, int64_t v) {
    nk_cast_get(t, NK_I64)(dst, 1, &v, 1, 1);
}

typedef struct nk_emit_ctx {
    const nk_rplan *p;
    const nk_tensor *out, *out2; /* out2: indices (arg) or mean (var) */
    nk_reduce_op op;
    double correction;
    bool take_sqrt;
    float c;
    nk_cast_fn store; /* double -> out's dtype, looked up once (nk_emit_reduce) */
} nk_emit_ctx;

static char *nk_out_ptr(const nk_rplan *p, const nk_tensor *t, int64_t o) {
    /* Kept dims of the plan use the first output's strides; other outputs index from their own. */
    if (t == p->out && p->nk == 1) return (char *)t->data + o * p->kout[0] * (int64_t)nk_dtype_size(t->dtype);
    int64_t off = 0;
    int64_t rem = o;
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        if (t->sizes[d] == 1) continue;
        off += (rem % t->sizes[d]) * t->strides[d];
        rem /= t->sizes[d];
    }
    return (char *)t->data + off * (int64_t)nk_dtype_size(t->dtype);
}

static bool nk_dtype_is_float(nk_dtype t) { return t == NK_F32 || t == NK_BF16 || t == NK_F16 || t == NK_F64; }
static bool nk_dtype_exact_in_double(nk_dtype t) {
    return t == NK_BOOL || t == NK_U8 || t == NK_I8 || t == NK_I16 || t == NK_I32 || t == NK_U16 || t == NK_U32;
}

static void nk_emit_reduce(void *ctx, int64_t o, const nk_rstate *st) {
    const nk_emit_ctx *e = ctx;
    char *dst = nk_out_ptr(e->p, e->out, o);
    const nk_dtype ot = e->out->dtype;
    switch (e->op) {
    case NK_REDUCE_SUM:
        if (e->p->int_acc) nk_store_i64_as(dst, ot, st->i);
        else e->store(dst, 1, &st->v, 1, 1);
        break;
    case NK_REDUCE_MEAN:
        if (e->p->int_acc) {
            nk_store_i64_as(dst, ot, st->i / (e->p->nred ? e->p->nred : 1));
        } else if (ot == NK_F64) {
            nk_store_f64_as(dst, ot, st->v / (double)e->p->nred);
        } else {
            /* PyTorch sums into float, then divides in float. */
            const double m = (double)((float)st->v / (float)e->p->nred);
            e->store(dst, 1, &m, 1, 1);
        }
        break;
    case NK_REDUCE_AMAX:
    case NK_REDUCE_AMIN: e->store(dst, 1, &st->v, 1, 1); break;
    case NK_REDUCE_ANY:
    case NK_REDUCE_ALL: nk_store_i64_as(dst, ot, st->i != 0); break;
    case NK_REDUCE_LOGSUMEXP: break; /* two passes: see nk_reduce */
    }
}

typedef struct nk_lse_job {
    nk_rctx c;
    const nk_emit_ctx *e;
} nk_lse_job;

static void nk_lse_run(void *ctx, int64_t b, int64_t e) {
    nk_lse_job *j = ctx;
    for (int64_t o = b; o < e; o++) {
        int64_t base;
        nk_rplan_offsets(j->c.p, o, &base, NULL);
        char *dst = nk_out_ptr(j->c.p, j->e->out, o);
        /* The max over the row, in the input's precision. */
        nk_rctx cm = j->c;
        cm.kind = NK_RK_MAX;
        cm.values_only = true;
        nk_rstate st;
        nk_rstate_init(&st, NK_RK_MAX);
        nk_fold(&cm, base, 0, j->c.p->nred, &st);
        const double m = isinf(st.v) ? 0.0 : st.v;
        nk_rctx cs = j->c;
        cs.kind = NK_RK_SUMEXP;
        cs.c = m;
        nk_rstate s2;
        nk_rstate_init(&s2, NK_RK_SUMEXP);
        nk_fold(&cs, base, 0, j->c.p->nred, &s2);
        nk_store_f64_as(dst, j->e->out->dtype, log(s2.v) + m);
    }
}

/* ---- float sums over an outer dim into contiguous columns ---- */

/*
 * PyTorch's CPU sums such columns 4 vectors of 8 floats at a time, each column a cascade over all its
 * rows (nk_colsum). Columns past the last whole group of 32 (of 4 when there are fewer columns than one
 * input vector: 8 floats, or 16 half-precision values summed into their own dtype) are summed as a row:
 * 4 interleaved streams of rows, each a cascade, the leftover rows added to the first, then the streams
 * in order. This is that second order, for one column.
 */
static float nk_colsum_ilp4(const char *in, nk_dtype t, int64_t rows, int64_t rs) {
    const int64_t groups = rows / 4;
    int64_t lg = 0;
    while ((INT64_C(1) << lg) < groups) lg++;
    const int64_t power = lg / 4 > 4 ? lg / 4 : 4, step = INT64_C(1) << power, mask = step - 1;
    float acc[4][4] = {{0}};
    int64_t i = 0;
    while (i + step <= groups) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < 4; k++) acc[0][k] += nk_load_f32(in + (4 * i + k) * rs, t);
        for (int l = 1; l < 4; l++) {
            for (int k = 0; k < 4; k++) {
                acc[l][k] += acc[l - 1][k];
                acc[l - 1][k] = 0;
            }
            if ((i & (mask << (l * power))) != 0) break;
        }
    }
    for (; i < groups; i++)
        for (int k = 0; k < 4; k++) acc[0][k] += nk_load_f32(in + (4 * i + k) * rs, t);
    float part[4];
    for (int k = 0; k < 4; k++) part[k] = ((acc[0][k] + acc[1][k]) + acc[2][k]) + acc[3][k];
    for (int64_t r = groups * 4; r < rows; r++) part[0] += nk_load_f32(in + r * rs, t);
    return ((part[0] + part[1]) + part[2]) + part[3];
}

typedef struct nk_col_job {
    const nk_rplan *p;
    const nk_emit_ctx *e;
    int64_t cols;    /* the contiguous kept dim */
    int64_t tiles;   /* blocks of NK_COLTILE columns per outer output */
    int64_t cascade; /* columns [0, cascade) take the cascade of nk_colsum, the rest nk_colsum_ilp4 */
} nk_col_job;

static void nk_col_run(void *ctx, int64_t b, int64_t e) {
    const nk_col_job *j = ctx;
    const nk_rplan *p = j->p;
    float sums[NK_COLTILE];
    for (int64_t task = b; task < e; task++) {
        const int64_t o0 = (task / j->tiles) * j->cols, c0 = (task % j->tiles) * NK_COLTILE;
        const int64_t c1 = c0 + NK_COLTILE < j->cols ? c0 + NK_COLTILE : j->cols;
        int64_t base;
        nk_rplan_offsets(p, o0 + c0, &base, NULL);
        const char *src = p->in + base * p->isz;
        const int64_t rs = p->row_s * p->isz;
        const int64_t na = (c1 < j->cascade ? c1 : j->cascade) - c0;
        if (na > 0) nk_colsum(src, p->it, p->row_n, rs, na, sums);
        for (int64_t c = na > 0 ? na : 0; c < c1 - c0; c++) sums[c] = nk_colsum_ilp4(src + c * p->isz, p->it, p->row_n, rs);
        for (int64_t c = 0; c < c1 - c0; c++) {
            /* PyTorch adds the sum into a zero-filled output: -0 becomes +0. */
            const nk_rstate st = {.v = (double)(0.0f + sums[c])};
            nk_emit_reduce((void *)j->e, o0 + c0 + c, &st);
        }
    }
}

/* Runs the sum as column sums when it is one (see above); false: not this layout. */
static bool nk_colsum_try(const nk_rplan *p, const nk_tensor *out, const nk_emit_ctx *e) {
    if (p->int_acc || !nk_is_half_or_float(p->it) || !nk_is_half_or_float(out->dtype)) return false;
    if (p->nr != 0 || p->nk < 1 || p->kin[p->nk - 1] != 1 || p->row_s <= 0 || p->row_n < 1 || p->nout == 0) return false;
    const int64_t cols = p->ksize[p->nk - 1];
    const int64_t vec = p->it != NK_F32 && out->dtype == p->it ? 16 : 8;
    nk_col_job job = {.p = p, .e = e, .cols = cols, .tiles = (cols + NK_COLTILE - 1) / NK_COLTILE};
    job.cascade = cols >= vec ? cols / 32 * 32 : cols / 4 * 4;
    const int64_t tasks = (p->nout / cols) * job.tiles;
    const int64_t per_task = p->row_n * (cols < NK_COLTILE ? cols : NK_COLTILE);
    const int64_t grain = NK_GRAIN / per_task;
    nk_parallel_for(tasks, grain < 1 ? 1 : grain, nk_col_run, &job);
    return true;
}

nk_status nk_reduce(const nk_tensor *out, const nk_tensor *in, uint64_t dims, nk_reduce_op op) {
    nk_rplan p;
    nk_status st = nk_rplan_init(&p, in, out, dims, true);
    if (st != NK_SUCCESS) return st;
    const bool fin = nk_dtype_is_float(in->dtype), fout = nk_dtype_is_float(out->dtype);
    nk_rctx c = {.p = &p};
    switch (op) {
    case NK_REDUCE_SUM:
    case NK_REDUCE_MEAN:
        if (fout) {
            if (op == NK_REDUCE_MEAN && !fin) return NK_UNSUPPORTED;
            if (!fin && in->dtype == NK_U64) return NK_UNSUPPORTED;
        } else {
            if (fin || op == NK_REDUCE_MEAN) return NK_UNSUPPORTED;
            p.int_acc = true;
        }
        /* A float input summed into another float dtype: PyTorch casts first (e.g. f32 -> f64 sums
         * in double, f64 -> f32 rounds each element first). Only same-width-class pairs here. */
        if (fin && fout && in->dtype != out->dtype && !(out->dtype == NK_F32 && in->dtype != NK_F64))
            return NK_UNSUPPORTED;
        c.kind = NK_RK_SUM;
        break;
    case NK_REDUCE_AMAX:
    case NK_REDUCE_AMIN:
        /* The state is a double: exact for floats and for integers of up to 32 bits. */
        if (!(fin || nk_dtype_exact_in_double(in->dtype)) || out->dtype != in->dtype) return NK_UNSUPPORTED;
        if (p.nred == 0 && p.nout > 0) return NK_INVALID;
        c.kind = op == NK_REDUCE_AMAX ? NK_RK_MAX : NK_RK_MIN;
        c.values_only = true;
        break;
    case NK_REDUCE_ANY:
    case NK_REDUCE_ALL:
        if (out->dtype != NK_BOOL && out->dtype != NK_U8) return NK_UNSUPPORTED;
        c.kind = op == NK_REDUCE_ANY ? NK_RK_ANY : NK_RK_ALL;
        break;
    case NK_REDUCE_LOGSUMEXP: {
        if (!fin || out->dtype != in->dtype) return NK_UNSUPPORTED;
        nk_emit_ctx e = {.p = &p, .out = out, .op = op};
        nk_lse_job job = {.c = c, .e = &e};
        int64_t grain = NK_GRAIN / (p.nred > 0 ? p.nred : 1);
        if (p.nred == 0) {
            /* log(0) = -inf for every output. */
            for (int64_t o = 0; o < p.nout; o++) nk_store_f64_as(nk_out_ptr(&p, out, o), out->dtype, -INFINITY);
            return NK_SUCCESS;
        }
        nk_parallel_for(p.nout, grain < 1 ? 1 : grain, nk_lse_run, &job);
        return NK_SUCCESS;
    }
    default: return NK_INVALID;
    }
    nk_emit_ctx e = {.p = &p, .out = out, .op = op, .store = nk_cast_get(out->dtype, NK_F64)};
    if (c.kind == NK_RK_SUM && nk_colsum_try(&p, out, &e)) return NK_SUCCESS;
    nk_reduce_all(&c, nk_emit_reduce, &e);
    return NK_SUCCESS;
}

/* ---- index-returning max/min ---- */

static void nk_emit_arg(void *ctx, int64_t o, const nk_rstate *st) {
    const nk_emit_ctx *e = ctx;
    if (e->out) nk_store_f64_as(nk_out_ptr(e->p, e->out, o), e->out->dtype, st->v);
    if (e->out2) *(int64_t *)nk_out_ptr(e->p, e->out2, o) = st->idx;
}

nk_status nk_reduce_arg(const nk_tensor *values, const nk_tensor *indices, const nk_tensor *in, uint64_t dims,
                        bool is_max) {
    const nk_tensor *shape = values ? values : indices;
    if (shape == NULL) return NK_INVALID;
    nk_rplan p;
    nk_status st = nk_rplan_init(&p, in, shape, dims, false);
    if (st != NK_SUCCESS) return st;
    if (values && indices && !nk_same_shape(values, indices)) return NK_INVALID;
    if (!nk_dtype_is_float(in->dtype)) return NK_UNSUPPORTED;
    if (values && values->dtype != in->dtype) return NK_UNSUPPORTED;
    if (indices && indices->dtype != NK_I64) return NK_UNSUPPORTED;
    if (p.nred == 0 && p.nout > 0) return NK_INVALID;
    nk_rctx c = {.p = &p, .kind = is_max ? NK_RK_MAX : NK_RK_MIN};
    nk_emit_ctx e = {.p = &p, .out = values, .out2 = indices};
    nk_reduce_all(&c, nk_emit_arg, &e);
    return NK_SUCCESS;
}

/* ---- variance ---- */

static void nk_emit_var(void *ctx, int64_t o, const nk_rstate *st) {
    const nk_emit_ctx *e = ctx;
    const double denom = (double)st->n - e->correction;
    double v = st->m2 / (denom > 0 ? denom : 0.0);
    if (e->take_sqrt) v = sqrt(v);
    if (e->out) nk_store_f64_as(nk_out_ptr(e->p, e->out, o), e->out->dtype, v);
    if (e->out2) nk_store_f64_as(nk_out_ptr(e->p, e->out2, o), e->out2->dtype, st->n ? st->v : NAN);
}

nk_status nk_reduce_var(const nk_tensor *var, const nk_tensor *mean, const nk_tensor *in, uint64_t dims,
                        double correction, bool take_sqrt) {
    const nk_tensor *shape = var ? var : mean;
    if (shape == NULL) return NK_INVALID;
    nk_rplan p;
    nk_status st = nk_rplan_init(&p, in, shape, dims, true);
    if (st != NK_SUCCESS) return st;
    if (var && mean && !nk_same_shape(var, mean)) return NK_INVALID;
    if (!nk_dtype_is_float(in->dtype)) return NK_UNSUPPORTED;
    if ((var && var->dtype != in->dtype) || (mean && mean->dtype != in->dtype)) return NK_UNSUPPORTED;
    nk_rctx c = {.p = &p, .kind = NK_RK_MOMENTS};
    nk_emit_ctx e = {.p = &p, .out = var, .out2 = mean, .correction = correction, .take_sqrt = take_sqrt};
    nk_reduce_all(&c, nk_emit_var, &e);
    return NK_SUCCESS;
}

/* ---- cumsum ---- */

static double nk_load_f64(const char *p, nk_dtype t) {
    switch (t) {
    case NK_F64: return *(const double *)p;
    case NK_F32: return *(const float *)p;
    case NK_BF16: return nk_bf16_to_f32(*(const uint16_t *)p);
    case NK_F16: return nk_f16_to_f32(*(const uint16_t *)p);
    default: return 0;
    }
}

typedef struct nk_cumsum_job {
    const nk_tensor *out, *in;
    int32_t dim;
    int64_t n; /* lines */
    bool fl;
} nk_cumsum_job;

static void nk_cumsum_run(void *ctx, int64_t b, int64_t e) {
    const nk_cumsum_job *j = ctx;
    const nk_tensor *in = j->in, *out = j->out;
    const int64_t ies = (int64_t)nk_dtype_size(in->dtype), oes = (int64_t)nk_dtype_size(out->dtype);
    const int64_t len = in->sizes[j->dim];
    for (int64_t l = b; l < e; l++) {
        int64_t rem = l, ioff = 0, ooff = 0;
        for (int32_t d = in->ndim - 1; d >= 0; d--) {
            if (d == j->dim) continue;
            const int64_t q = rem % in->sizes[d];
            rem /= in->sizes[d];
            ioff += q * in->strides[d];
            ooff += q * out->strides[d];
        }
        const char *ip = (const char *)in->data + ioff * ies;
        char *op = (char *)out->data + ooff * oes;
        const int64_t is = in->strides[j->dim] * ies, os = out->strides[j->dim] * oes;
        if (j->fl) {
            double acc = 0;
            for (int64_t k = 0; k < len; k++) {
                acc += nk_load_f64(ip + k * is, in->dtype);
                nk_store_f64_as(op + k * os, out->dtype, acc);
            }
        } else {
            uint64_t acc = 0;
            for (int64_t k = 0; k < len; k++) {
                acc += (uint64_t)nk_load_i64(ip + k * is, in->dtype);
                nk_store_i64_as(op + k * os, out->dtype, (int64_t)acc);
            }
        }
    }
}

nk_status nk_cumsum(const nk_tensor *out, const nk_tensor *in, int32_t dim) {
    int64_t n, on;
    nk_status st;
    if ((st = nk_tensor_check(in, &n)) != NK_SUCCESS || (st = nk_tensor_check(out, &on)) != NK_SUCCESS) return st;
    if (!nk_same_shape(in, out)) return NK_INVALID;
    if (in->ndim == 0) {
        nk_tensor a = *in, b = *out;
        a.ndim = b.ndim = 1;
        a.sizes[0] = b.sizes[0] = 1;
        a.strides[0] = b.strides[0] = 1;
        return dim == 0 ? nk_cumsum(&b, &a, 0) : NK_INVALID;
    }
    if (dim < 0 || dim >= in->ndim) return NK_INVALID;
    const bool fin = nk_dtype_is_float(in->dtype), fout = nk_dtype_is_float(out->dtype);
    if (fin != fout) return NK_UNSUPPORTED;
    if (fin && in->dtype != out->dtype && !(out->dtype == NK_F64 || (out->dtype == NK_F32 && in->dtype != NK_F64)))
        return NK_UNSUPPORTED;
    if (n == 0) return NK_SUCCESS;
    nk_cumsum_job job = {.out = out, .in = in, .dim = dim, .n = n / in->sizes[dim], .fl = fin};
    int64_t grain = NK_GRAIN / in->sizes[dim];
    nk_parallel_for(job.n, grain < 1 ? 1 : grain, nk_cumsum_run, &job);
    return NK_SUCCESS;
}
