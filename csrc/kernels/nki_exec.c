/*
 * nki_exec.c - replays a traced NKI kernel (see nkx_run in neuron_kernels.h) on the kernel library.
 *
 * The tracer (nki/_compile.py) has already decided everything that depends only on shapes: which PSUM
 * matmuls accumulate, where fp32 staging is needed, which arena bytes each tile uses. What is left here is
 * turning operands into library descriptors and calling the library, so replay costs one library call per
 * step instead of a numpy round trip per instruction; and running the fused groups the tracer marked
 * (NKX_FUSE_NEXT) a few rows at a time through the library's vector loops (nkx_group below).
 */
#include "neuron_kernels.h"
#include "elementwise_internal.h"
#include "reduce_simd.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/*
 * Joined groups: the tracer sets NKX_JOIN_NEXT on the last step of a fused group (up to NKX_JOIN_MAX in a row)
 * when the next instruction starts a fused group that shares no bytes with this one (the tiles of an rmsnorm's
 * 128-row tiles, each its own group): the executor then runs the row blocks of all of them in one parallel
 * region, one fork/join of the pool per call instead of one per tile. Mirrored in nki/_compile.py.
 */
#define NKX_JOIN_NEXT ((int32_t)1 << 29)
#define NKX_JOIN_MAX 16

NK_SIMD_FN(float, nk_sum_cascade, (const float *x, int64_t n), (x, n))
NK_SIMD_FN(float, nk_sum_sq_cascade, (const float *x, int64_t n), (x, n))
NK_SIMD_FN(float, nk_max, (const float *x, int64_t n, int is_max), (x, n, is_max))


void nkx_layout(int64_t out[3]) {
    out[0] = (int64_t)sizeof(nkx_instr);
    out[1] = (int64_t)sizeof(nkx_operand);
    out[2] = (int64_t)offsetof(nkx_instr, o);
}

static nk_status nkx_tensor(const nkx_operand *o, void *const *bases, int64_t nbases, nk_tensor *t) {
    if (o->region < 0 || o->region >= nbases || o->ndim < 0 || o->ndim > NKX_MAX_DIMS ||
        o->dtype < 0 || o->dtype >= NK_DTYPE_COUNT)
        return NK_INVALID;
    memset(t, 0, sizeof *t);
    t->data = (char *)bases[o->region] + o->offset;
    t->dtype = (nk_dtype)o->dtype;
    t->ndim = o->ndim;
    for (int32_t d = 0; d < o->ndim; d++) {
        t->sizes[d] = o->sizes[d];
        t->strides[d] = o->strides[d];
    }
    return NK_SUCCESS;
}

/* Element-wise iterator over operands of one shape: fastest dim first, byte strides, fp32 compute. */
static nk_status nkx_ew(nk_ew_iter *it, const nk_tensor *ts, int nops) {
    memset(it, 0, sizeof *it);
    const int32_t nd = ts[0].ndim;
    it->ndim = nd;
    it->nops = nops;
    it->common = NK_F32;
    for (int k = 0; k < nops; k++) {
        if (ts[k].ndim != nd) return NK_INVALID;
        it->data[k] = ts[k].data;
        it->dtype[k] = ts[k].dtype;
        const int64_t es = (int64_t)nk_dtype_size(ts[k].dtype);
        for (int32_t d = 0; d < nd; d++) {
            if (ts[k].sizes[d] != ts[0].sizes[d]) return NK_INVALID;
            it->strides[k][nd - 1 - d] = ts[k].strides[d] * es;
        }
    }
    for (int32_t d = 0; d < nd; d++) it->sizes[nd - 1 - d] = ts[0].sizes[d];
    /* Coalesce: drop size-1 dims and merge dims every operand walks contiguously, so a [128, 1] tile is one
     * run of 128 elements rather than 128 runs of one (each run is a call of the vector loop). */
    int32_t m = 0;
    for (int32_t d = 0; d < nd; d++) {
        if (it->sizes[d] == 1) continue;
        bool merge = m > 0;
        for (int k = 0; k < nops && merge; k++)
            merge = it->strides[k][d] == it->strides[k][m - 1] * it->sizes[m - 1];
        if (merge) {
            it->sizes[m - 1] *= it->sizes[d];
            continue;
        }
        it->sizes[m] = it->sizes[d];
        for (int k = 0; k < nops; k++) it->strides[k][m] = it->strides[k][d];
        m++;
    }
    if (m == 0 && nd > 0) {  /* every dim 1: one element */
        m = 1;
        it->sizes[0] = 1;
        for (int k = 0; k < nops; k++) it->strides[k][0] = 0;
    }
    it->ndim = m;
    return NK_SUCCESS;
}

/* A condition element: nonzero (NaN included, as numpy's != 0). */
static bool nkx_nonzero(const char *p, nk_dtype t) {
    switch (t) {
    case NK_BOOL:
    case NK_U8:
    case NK_I8: return *(const uint8_t *)p != 0;
    case NK_I16:
    case NK_U16:
    case NK_F16: return (*(const uint16_t *)p & (t == NK_F16 ? 0x7FFFu : 0xFFFFu)) != 0;
    case NK_BF16: return (*(const uint16_t *)p & 0x7FFFu) != 0;
    case NK_I32:
    case NK_U32: return *(const uint32_t *)p != 0;
    case NK_F32: return *(const float *)p != 0.0f || *(const float *)p != *(const float *)p;
    case NK_I64: return *(const int64_t *)p != 0;
    case NK_F64: return *(const double *)p != 0.0 || *(const double *)p != *(const double *)p;
    default: return false;
    }
}

/* select / where / affine_select: element by element (kernels use them on masks and small tiles). */
static nk_status nkx_copy_if(const nkx_instr *in, void *const *bases, int64_t nbases) {
    if (in->nops != 3) return NK_INVALID;
    nk_tensor t[3];
    for (int k = 0; k < 3; k++) {
        const nk_status s = nkx_tensor(&in->o[k], bases, nbases, &t[k]);
        if (s != NK_SUCCESS) return s;
        if (t[k].ndim != t[0].ndim) return NK_INVALID;
        for (int32_t d = 0; d < t[0].ndim; d++)
            if (t[k].sizes[d] != t[0].sizes[d] || t[k].sizes[d] < 0) return NK_INVALID;
    }
    const nk_dtype d0 = t[0].dtype, d2 = t[2].dtype;
    const bool fl0 = d0 == NK_F32 || d0 == NK_BF16 || d0 == NK_F16, fl2 = d2 == NK_F32 || d2 == NK_BF16 || d2 == NK_F16;
    if (!(fl0 && fl2) && d0 != d2) return NK_INVALID;
    int64_t n = 1;
    for (int32_t d = 0; d < t[0].ndim; d++) n *= t[0].sizes[d];
    int64_t es[3], idx[NK_MAX_DIMS] = {0};
    for (int k = 0; k < 3; k++) es[k] = (int64_t)nk_dtype_size(t[k].dtype);
    for (int64_t i = 0; i < n; i++) {
        char *p[3];
        for (int k = 0; k < 3; k++) {
            p[k] = (char *)t[k].data;
            for (int32_t d = 0; d < t[0].ndim; d++) p[k] += idx[d] * t[k].strides[d] * es[k];
        }
        if (nkx_nonzero(p[1], t[1].dtype)) {
            if (d0 == d2)
                memcpy(p[0], p[2], (size_t)es[0]);
            else
                nk_store_f32(p[0], d0, nk_load_f32(p[2], d2));
        }
        for (int32_t d = t[0].ndim - 1; d >= 0; d--) {
            if (++idx[d] < t[0].sizes[d]) break;
            idx[d] = 0;
        }
    }
    return NK_SUCCESS;
}

static nk_status nkx_int(const nkx_instr *in, void *const *bases, int64_t nbases);

static nk_status nkx_step(const nkx_instr *in, void *const *bases, int64_t nbases) {
    nk_tensor t[3];
    if (in->nops < 1 || in->nops > 3) return NK_INVALID;
    for (int k = 0; k < in->nops; k++) {
        nk_status s = nkx_tensor(&in->o[k], bases, nbases, &t[k]);
        if (s != NK_SUCCESS) return s;
    }
    nk_ew_iter it;
    nk_ew_params p;
    memset(&p, 0, sizeof p);
    p.alpha.is_float = true;
    p.alpha.f = 1.0;
    switch ((nkx_kind)in->kind) {
    case NKX_FILL: {
        nk_scalar v = {.is_float = true, .f = in->value, .i = 0};
        return nk_fill(&t[0], v);
    }
    case NKX_COPY:
        if (in->nops != 2) return NK_INVALID;
        return nk_copy(&t[0], &t[1]);
    case NKX_UNARY: {
        if (in->nops != 2) return NK_INVALID;
        nk_status s = nkx_ew(&it, t, 2);
        return s != NK_SUCCESS ? s : nk_unary((nk_unary_op)in->op, &it, &p);
    }
    case NKX_BINARY: {
        if (in->nops != 3) return NK_INVALID;
        nk_status s = nkx_ew(&it, t, 3);
        if (s != NK_SUCCESS) return s;
        if (in->op == NK_ADD) p.alpha.f = in->value;  /* subtract is a + (-1) * b: exact */
        return nk_binary((nk_binary_op)in->op, &it, &p);
    }
    case NKX_GEMM:
        if (in->nops != 3) return NK_INVALID;
        return nk_gemm(&t[0], &t[1], &t[2], NULL, 1.0, (in->flags & 1) ? 1.0 : 0.0);
    case NKX_COPY_IF:
        return nkx_copy_if(in, bases, nbases);
    case NKX_INT:
        return nkx_int(in, bases, nbases);
    case NKX_REDUCE:
        if (in->nops != 2) return NK_INVALID;
        return nk_reduce(&t[0], &t[1], (uint64_t)(uint32_t)(in->flags & ~(NKX_FUSE_NEXT | NKX_JOIN_NEXT)),
                         (nk_reduce_op)in->op);
    default:
        return NK_INVALID;
    }
}

/*
 * A traced kernel is many small steps (one [128, F] tile each). Each library call that goes parallel costs a
 * fork/join of the pool, and on a shared host a join can wait a scheduler time slice for a worker without a
 * core: a ViT MLP kernel of 666 steps (288 GEMMs of 128 x 197 x 128, ~30 us each) replayed in 770-950 ms
 * that way, against 90-130 ms for the single-threaded numpy interpreter. So runs of steps below these sizes
 * execute inside one serial region (nk_parallel_for of one item: nested calls run on the caller), and only
 * steps large enough to amortize a join use the pool.
 */
#define NKX_PARALLEL_ELEMS ((int64_t)1 << 18)
#define NKX_PARALLEL_MACS ((int64_t)1 << 23)

/* Work of an element-wise step or reduce, in adds. */
static int64_t nkx_work(const nkx_instr *in) {
    const nkx_operand *o = &in->o[in->kind == NKX_REDUCE && in->nops > 1 ? 1 : 0];
    int64_t n = 1;
    for (int32_t d = 0; d < o->ndim && d < NKX_MAX_DIMS; d++) n *= o->sizes[d];
    if (in->kind == NKX_UNARY)  /* exp, tanh, ...: ~8x the work of an add per element */
        n *= 8;
    return n;
}

static bool nkx_large(const nkx_instr *in) {
    if (in->kind == NKX_GEMM && in->nops == 3 && in->o[1].ndim == 2 && in->o[0].ndim >= 1)
        return nkx_work(in) * in->o[1].sizes[1] >= NKX_PARALLEL_MACS;
    return nkx_work(in) >= NKX_PARALLEL_ELEMS;
}

/* A fused group is one pass: its steps' work adds up (an rmsnorm tile's four [128, 1024] steps go parallel). */
static bool nkx_group_large(const nkx_instr *ins, int64_t n) {
    int64_t w = 0;
    for (int64_t k = 0; k < n; k++) {
        if (nkx_large(&ins[k])) return true;
        w += nkx_work(&ins[k]);
    }
    return w >= NKX_PARALLEL_ELEMS;
}

static nk_status nkx_group(const nkx_instr *ins, int64_t n, void *const *bases, int64_t nbases, bool inner,
                           int64_t *failed_at);
static int64_t nkx_group_end(const nkx_instr *ins, int64_t i, int64_t n);

typedef struct nkx_serial_ctx {
    const nkx_instr *ins;
    int64_t begin, end;
    void *const *bases;
    int64_t nbases;
    nk_status status;
    int64_t failed;
} nkx_serial_ctx;

static void nkx_serial_run(void *ctx_, int64_t b, int64_t e) {
    (void)b;
    (void)e;
    nkx_serial_ctx *c = ctx_;
    for (int64_t i = c->begin; i < c->end;) {
        const int64_t g = nkx_group_end(c->ins, i, c->end);
        nk_status s;
        int64_t at = 0;
        if (g - i > 1)
            s = nkx_group(&c->ins[i], g - i, c->bases, c->nbases, true, &at);
        else
            s = nkx_step(&c->ins[i], c->bases, c->nbases);
        if (s != NK_SUCCESS) {
            c->status = s;
            c->failed = i + at;
            return;
        }
        i = g;
    }
}

/*
 * The fused executor. The row-blocked replay through the library (one nk_binary/nk_unary/nk_reduce call per
 * step per block of rows) measured slower than whole-tile steps: each call re-derives its iterator, picks its
 * loops and may fork the pool, which costs more than the L2 traffic it saves. Here a group is prepared once
 * per replay (each step's vector loop, operand addresses, coalesced dims for a block of rows), and a block of
 * rows then runs every step back to back on the element-wise tables' loops, NKX_RUN elements per call:
 * conversion buffers and the block's rows of every tile stay in L1, and a step costs one indirect call per run.
 * The loops, conversions and row reductions are the library's own, so results are bitwise those of the
 * unfused replay.
 */
#define NKX_FUSE_MAX 32         /* steps prepared at once; a longer group runs as consecutive groups */
#define NKX_FUSE_ELEMS 2048     /* elements per row block of a group's widest step (8 KiB of fp32) */
#define NKX_RUN 2048            /* elements per call of a vector loop: a row block in one call */
#define NKX_SLOTS 16            /* scratch tiles of one group */
#define NKX_SCRATCH 65536       /* bytes of scratch tiles per worker (a group needing more uses the arena) */

typedef struct nkx_it {
    int32_t ndim, nops;
    int64_t sizes[NKX_MAX_DIMS];        /* fastest dim first */
    int64_t strides[3][NKX_MAX_DIMS];   /* bytes */
} nkx_it;

typedef struct nkx_fstep {
    int32_t kind, op, nops;
    bool pred;                          /* the loop writes 0/1 bytes (comparisons, logical ops) */
    bool empty;
    nk_dtype dt[3];
    char *row0[3];                      /* row 0 of each operand */
    int64_t row_bytes[3];
    int32_t slot[3];                    /* scratch tile of the operand, -1: memory */
    int64_t soff[3];                    /* its bytes into the worker's scratch for the block's first row */
    nkx_it full, tail;                  /* element-wise: block rows / the last block's rows; reduce: one row */
    nk_ew_fn fn, vs, sv;
    int32_t sop;                        /* nkx_scalar_op's case for short fp32 runs, -1: none */
    nk_ew_args args;
    int64_t count;                      /* reduce: elements per row */
    bool folded;                        /* a square whose only reader, the next step's sum, squares its input */
    bool sq;                            /* a sum of the squares of its source (the folded step's input) */
} nkx_fstep;

typedef struct nkx_fgroup {
    const nk_ew_f32_table *tab;
    int32_t n;
    int64_t rows, block;
    nkx_fstep s[NKX_FUSE_MAX];
} nkx_fgroup;

/* Operand k of f for rows from r0 on (its row r at the result + (r - r0) * row_bytes[k]). */
static inline char *nkx_rowp(const nkx_fstep *f, int k, int64_t r0, char *scratch) {
    return f->slot[k] >= 0 ? scratch + f->soff[k] : f->row0[k] + r0 * f->row_bytes[k];
}

static bool nkx_float_dtype(int32_t t) { return t == NK_F32 || t == NK_BF16 || t == NK_F16; }

/* Size-1 dims dropped, dims every operand walks contiguously merged: fewer, longer runs. */
static void nkx_it_coalesce(nkx_it *it) {
    int32_t m = 0;
    for (int32_t d = 0; d < it->ndim; d++) {
        if (it->sizes[d] == 1) continue;
        bool merge = m > 0;
        for (int k = 0; k < it->nops && merge; k++)
            merge = it->strides[k][d] == it->strides[k][m - 1] * it->sizes[m - 1];
        if (merge) {
            it->sizes[m - 1] *= it->sizes[d];
            continue;
        }
        it->sizes[m] = it->sizes[d];
        for (int k = 0; k < it->nops; k++) it->strides[k][m] = it->strides[k][d];
        m++;
    }
    if (m == 0) {
        m = 1;
        it->sizes[0] = 1;
        for (int k = 0; k < it->nops; k++) it->strides[k][0] = 0;
    }
    it->ndim = m;
}

/* Operands k0..nops-1 of in over dims d0.. (dim 0 counted as `rows` rows), fastest first. */
static void nkx_it_init(nkx_it *it, const nkx_instr *in, int k0, int32_t d0, int64_t rows) {
    const nkx_operand *ref = &in->o[k0];
    const int32_t nd = ref->ndim - d0;
    memset(it, 0, sizeof *it);
    it->ndim = nd;
    it->nops = in->nops - k0;
    for (int32_t d = 0; d < nd; d++) it->sizes[nd - 1 - d] = d + d0 == 0 ? rows : ref->sizes[d + d0];
    for (int k = 0; k < it->nops; k++) {
        const nkx_operand *o = &in->o[k0 + k];
        const int64_t es = (int64_t)nk_dtype_size((nk_dtype)o->dtype);
        for (int32_t d = 0; d < nd; d++) it->strides[k][nd - 1 - d] = o->strides[d + d0] * es;
    }
    nkx_it_coalesce(it);
}

/*
 * NKX_INT (see neuron_kernels.h): integer tiles with the interpreter's numpy semantics. A run of up to
 * NKX_IRUN elements of each operand is read into int64 / float / double buffers, computed, and stored with
 * the interpreter's encoding, so a destination that is also a source (the same view) is read before written.
 */
#define NKX_IRUN 256

static bool nkx_int_dtype(int32_t t) {
    return t == NK_I8 || t == NK_I16 || t == NK_I32 || t == NK_I64 || t == NK_U8 || t == NK_U16 || t == NK_U32;
}

static int nkx_int_bits(nk_dtype t) {
    switch (t) {
    case NK_I8: case NK_U8: case NK_BOOL: return 8;
    case NK_I16: case NK_U16: return 16;
    case NK_I32: case NK_U32: return 32;
    default: return 64;
    }
}

/* v wrapped to T's width (two's complement, as numpy's integer loops). */
static inline int64_t nkx_wrap(int64_t v, nk_dtype t) {
    switch (t) {
    case NK_I8: return (int8_t)(uint8_t)(uint64_t)v;
    case NK_U8: return (uint8_t)(uint64_t)v;
    case NK_I16: return (int16_t)(uint16_t)(uint64_t)v;
    case NK_U16: return (uint16_t)(uint64_t)v;
    case NK_I32: return (int32_t)(uint32_t)(uint64_t)v;
    case NK_U32: return (uint32_t)(uint64_t)v;
    default: return v;
    }
}

static inline float nkx_fget(const char *p, nk_dtype t) {
    return nk_is_half_or_float(t) ? nk_load_f32(p, t) : (float)nk_load_i64(p, t);
}

static inline double nkx_dget(const char *p, nk_dtype t) {
    return nk_is_half_or_float(t) ? (double)nk_load_f32(p, t) : (double)nk_load_i64(p, t);
}

/* The interpreter's bf16 encoding: round to nearest even; a NaN keeps its sign and top payload bits, quieted. */
static inline uint16_t nkx_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (f != f) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline void nkx_fput(char *p, nk_dtype t, float v) {
    if (t == NK_BF16)
        *(uint16_t *)p = nkx_bf16(v);
    else
        nk_store_f32(p, t, v);
}

static inline void nkx_iput(char *p, nk_dtype t, int64_t v) {
    switch (t) {
    case NK_BOOL: *(uint8_t *)p = v != 0; break;
    case NK_U8:
    case NK_I8: *(uint8_t *)p = (uint8_t)(uint64_t)v; break;
    case NK_I16:
    case NK_U16: *(uint16_t *)p = (uint16_t)(uint64_t)v; break;
    case NK_I32:
    case NK_U32: *(uint32_t *)p = (uint32_t)(uint64_t)v; break;
    case NK_I64: *(int64_t *)p = v; break;
    default: nkx_fput(p, t, (float)v); break;  /* int64 -> fp32 rounds to nearest, then to the float dtype */
    }
}

/* numpy's float64 -> float16 cast: one rounding to nearest even (no double rounding through fp32: the fp32
 * step rounds to odd, which keeps the sticky bit), a NaN keeps its sign and top payload bits. */
static inline uint16_t nkx_d2h(double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    if ((u & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull) {
        uint16_t h = (uint16_t)(0x7C00u + ((u & 0x000FFFFFFFFFFFFFull) >> 42));
        if (h == 0x7C00u) h++;
        return (uint16_t)(((u >> 48) & 0x8000u) | h);
    }
    float f = (float)v;
    if (fabs((double)f) > fabs(v)) f = nextafterf(f, 0.0f);  /* truncate toward zero */
    if ((double)f != v) {
        uint32_t b;
        memcpy(&b, &f, 4);
        b |= 1u;  /* inexact: odd */
        memcpy(&f, &b, 4);
    }
    return nk_f32_to_f16(f);
}

/* A float value into t: floats rounded, integers rounded to nearest even, saturated, NaN as 0; bool != 0. */
static inline void nkx_dput(char *p, nk_dtype t, double v) {
    if (t == NK_F16) {
        *(uint16_t *)p = nkx_d2h(v);
        return;
    }
    if (nk_is_half_or_float(t)) {
        nkx_fput(p, t, (float)v);
        return;
    }
    if (t == NK_BOOL) {
        *(uint8_t *)p = v != 0.0 || v != v;
        return;
    }
    double lo, hi;
    switch (t) {
    case NK_I8: lo = -128.0, hi = 127.0; break;
    case NK_U8: lo = 0.0, hi = 255.0; break;
    case NK_I16: lo = -32768.0, hi = 32767.0; break;
    case NK_U16: lo = 0.0, hi = 65535.0; break;
    case NK_I32: lo = -2147483648.0, hi = 2147483647.0; break;
    case NK_U32: lo = 0.0, hi = 4294967295.0; break;
    default: lo = -9223372036854775808.0, hi = 9223372036854775808.0; break;  /* 2^63 saturates to 2^63 - 1 */
    }
    int64_t r;
    if (v != v)
        r = 0;
    else if (v <= lo)
        r = t == NK_I64 ? INT64_MIN : (int64_t)lo;
    else if (v >= hi)
        r = t == NK_I64 ? INT64_MAX : (int64_t)hi;
    else
        r = (int64_t)__builtin_rint(v);
    nkx_iput(p, t, r);
}

/* The six compares, the same in the int64 and the double domain. */
#define NKX_COMPARE_CASES(a, b)                                                                            \
    case NKX_I_EQ: return (a) == (b);                                                                      \
    case NKX_I_NE: return (a) != (b);                                                                      \
    case NKX_I_LT: return (a) < (b);                                                                       \
    case NKX_I_LE: return (a) <= (b);                                                                      \
    case NKX_I_GT: return (a) > (b);                                                                       \
    case NKX_I_GE: return (a) >= (b);

static inline int64_t nkx_iop2(int32_t op, int64_t a, int64_t b, nk_dtype t) {
    const uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
    const int bits = nkx_int_bits(t);
    switch (op) {
    case NKX_I_CAST: return a;
    case NKX_I_ADD: return nkx_wrap((int64_t)(ua + ub), t);
    case NKX_I_SUB: return nkx_wrap((int64_t)(ua - ub), t);
    case NKX_I_MUL: return nkx_wrap((int64_t)(ua * ub), t);
    case NKX_I_MAX: return a < b ? b : a;
    case NKX_I_MIN: return b < a ? b : a;
    case NKX_I_AND: return a & b;
    case NKX_I_OR: return a | b;
    case NKX_I_XOR: return a ^ b;
    case NKX_I_SHL: return b >= 0 && b < bits ? nkx_wrap((int64_t)(ua << b), t) : 0;
    case NKX_I_SHR: return b >= 0 && b < bits ? a >> b : (a < 0 ? -1 : 0);
    NKX_COMPARE_CASES(a, b)
    case NKX_I_LAND: return a != 0 && b != 0;
    case NKX_I_LOR: return a != 0 || b != 0;
    case NKX_I_LXOR: return (a != 0) != (b != 0);
    case NKX_I_NEG: return nkx_wrap((int64_t)(0u - ua), t);
    case NKX_I_ABS: return nkx_wrap(a < 0 ? (int64_t)(0u - ua) : a, t);
    case NKX_I_INVERT: return nkx_wrap(~a, t);
    case NKX_I_LNOT: return a == 0;
    case NKX_I_POW: {  /* b >= 0 (checked before the step writes); a power of a in T's ring: any order wraps alike */
        uint64_t r = 1, x = ua;
        for (uint64_t e = ub; e; e >>= 1) {
            if (e & 1u) r *= x;
            x *= x;
        }
        return nkx_wrap((int64_t)r, t);
    }
    /* numpy: 0 for a zero divisor (a RuntimeWarning there) and for x % -1 (INT_MIN % -1 overflows in C) */
    case NKX_I_MOD:
        if (b == 0 || b == -1) return 0;
        {
            const int64_t r = a % b;
            return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
        }
    case NKX_I_FMOD: return (b == 0 || b == -1) ? 0 : a % b;
    case NKX_I_CEIL: case NKX_I_FLOOR: case NKX_I_TRUNC: return a;
    case NKX_I_SIGN: return (a > 0) - (a < 0);
    case NKX_I_SQUARE: return nkx_wrap((int64_t)(ua * ua), t);
    default: return 0;
    }
}

/* fp32 arithmetic (numpy's float32 loops; maximum/minimum propagate the first NaN as numpy's scalar loop). */
static inline float nkx_fop2(int32_t op, float a, float b) {
    switch (op) {
    case NKX_I_CAST: return a;
    case NKX_I_ADD: return a + b;
    case NKX_I_SUB: return a - b;
    case NKX_I_MUL: return a * b;
    case NKX_I_MAX: return (a >= b || a != a) ? a : b;
    case NKX_I_MIN: return (a <= b || a != a) ? a : b;
    case NKX_I_NEG: return -a;
    case NKX_I_ABS: return fabsf(a);
    default: return NAN;
    }
}

/* Compares and logical ops in double (exact for every operand the tracer sends here). */
static inline int64_t nkx_dop2(int32_t op, double a, double b) {
    switch (op) {
    NKX_COMPARE_CASES(a, b)
    case NKX_I_LAND: return (a != 0.0 || a != a) && (b != 0.0 || b != b);
    case NKX_I_LOR: return (a != 0.0 || a != a) || (b != 0.0 || b != b);
    case NKX_I_LXOR: return (a != 0.0 || a != a) != (b != 0.0 || b != b);
    case NKX_I_LNOT: return a == 0.0;
    default: return 0;
    }
}

/* v rounded to the float compute type T (NK_F16, NK_F32 or NK_F64). */
static inline double nkx_round_t(double v, int32_t t) {
    if (t == NK_F64) return v;
    if (t == NK_F32) return (double)(float)v;
    return (double)nk_f16_to_f32(nkx_d2h(v));
}

/* numpy's remainder (npy_divmod's modulus): fmod, moved to the divisor's sign; NaN for a zero divisor. */
static inline double nkx_dmod(double a, double b) {
    double m = fmod(a, b);
    if (b == 0.0) return m;
    if (m != 0.0) {
        if ((b < 0.0) != (m < 0.0)) m += b;
    } else {
        m = copysign(0.0, b);
    }
    return m;
}

static inline float nkx_smod(float a, float b) {
    float m = fmodf(a, b);
    if (b == 0.0f) return m;
    if (m != 0.0f) {
        if ((b < 0.0f) != (m < 0.0f)) m += b;
    } else {
        m = copysignf(0.0f, b);
    }
    return m;
}

/* The math ops in float (T = fp32, or fp16, whose numpy loops compute in float and round the result once). */
static inline float nkx_smath(int32_t op, float a, float b) {
    switch (op) {
    case NKX_I_EXP: return expf(a);
    case NKX_I_LOG: return logf(a);
    case NKX_I_TANH: return tanhf(a);
    case NKX_I_SIN: return sinf(a);
    case NKX_I_COS: return cosf(a);
    case NKX_I_TAN: return tanf(a);
    case NKX_I_ATAN: return atanf(a);
    case NKX_I_CEIL: return ceilf(a);
    case NKX_I_FLOOR: return floorf(a);
    case NKX_I_TRUNC: return truncf(a);
    case NKX_I_SIGN: return a > 0.0f ? 1.0f : a < 0.0f ? -1.0f : a;
    case NKX_I_SQUARE: return a * a;
    case NKX_I_RELU: return (a >= 0.0f || a != a) ? a : 0.0f;
    case NKX_I_POW: return powf(a, b);
    case NKX_I_MOD: return nkx_smod(a, b);
    case NKX_I_FMOD: return fmodf(a, b);
    default: return NAN;
    }
}

static inline double nkx_dmath(int32_t op, double a, double b) {
    switch (op) {
    case NKX_I_EXP: return exp(a);
    case NKX_I_LOG: return log(a);
    case NKX_I_TANH: return tanh(a);
    case NKX_I_SIN: return sin(a);
    case NKX_I_COS: return cos(a);
    case NKX_I_TAN: return tan(a);
    case NKX_I_ATAN: return atan(a);
    case NKX_I_CEIL: return ceil(a);
    case NKX_I_FLOOR: return floor(a);
    case NKX_I_TRUNC: return trunc(a);
    case NKX_I_SIGN: return a > 0.0 ? 1.0 : a < 0.0 ? -1.0 : a;
    case NKX_I_SQUARE: return a * a;
    case NKX_I_RELU: return (a >= 0.0 || a != a) ? a : 0.0;
    case NKX_I_POW: return pow(a, b);
    case NKX_I_MOD: return nkx_dmod(a, b);
    case NKX_I_FMOD: return fmod(a, b);
    default: return NAN;
    }
}

static bool nkx_iop_math(int32_t op) { return op >= NKX_I_EXP && op <= NKX_I_FMOD; }

/* The float ops in T: each operation computed in double and rounded once to T (for T = fp16 or fp32 that is
 * the correctly rounded division / square root, as numpy's float16 and float32 loops give). The math ops call
 * <math.h>: the double functions for T = fp64, the float ones for fp32 and fp16. */
static inline double nkx_flop(int32_t op, double a, double b, int32_t t) {
    switch (op) {
    case NKX_I_DIV: return nkx_round_t(a / b, t);
    case NKX_I_SQRT: return nkx_round_t(sqrt(a), t);
    case NKX_I_RSQRT: return nkx_round_t(1.0 / nkx_round_t(sqrt(a), t), t);
    case NKX_I_RECIP: return nkx_round_t(1.0 / a, t);
    case NKX_I_CAST: return a;
    default:
        if (!nkx_iop_math(op)) return NAN;
        /* a and b are already T's values: exact in float for T = fp16 / fp32 */
        if (t == NK_F64) return nkx_dmath(op, a, b);
        return nkx_round_t((double)nkx_smath(op, (float)a, (float)b), t);
    }
}

static bool nkx_iop_float(int32_t op) { return (op >= NKX_I_DIV && op <= NKX_I_RECIP) || nkx_iop_math(op); }

static bool nkx_iop_unary(int32_t op) {
    return op == NKX_I_CAST || op == NKX_I_NEG || op == NKX_I_ABS || op == NKX_I_INVERT || op == NKX_I_LNOT ||
           op == NKX_I_SQRT || op == NKX_I_RSQRT || op == NKX_I_RECIP || (op >= NKX_I_EXP && op <= NKX_I_RELU);
}

/* numpy's pairwise sum of float64 values (a reduction's inner loop): 8 accumulators up to 128 values, halves
 * (cut at a multiple of 8) above, a plain loop below 8. */
static double nkx_pairwise(const double *a, int64_t n) {
    if (n < 8) {
        double r = 0.0;
        for (int64_t i = 0; i < n; i++) r += a[i];
        return r;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        int64_t i = 8;
        for (; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return nkx_pairwise(a, n2) + nkx_pairwise(a + n2, n - n2);
}

#define NKX_NP_BUFSIZE 8192 /* numpy's casting buffer: a reduction converted to float64 sums this many at a time */

/* NKX_I_RSUM / RMAX / RMIN / RMEAN (neuron_kernels.h): element by element over each output's reduced block. */
static nk_status nkx_int_reduce(const nkx_instr *in, void *const *bases, int64_t nbases) {
    const int32_t op = in->op, dom = in->flags & 0xFF;
    const uint32_t axes = ((uint32_t)in->flags >> NKX_I_AXES_SHIFT) & 0x3Fu;
    const bool neg = (in->flags & NKX_I_NEGATE) != 0;
    if (in->nops != 2 || (in->flags & (NKX_I_SCALAR | NKX_I_REVERSE))) return NK_INVALID;
    if (op == NKX_I_RMEAN ? (dom != NK_F64) : !(nkx_int_dtype(dom) || (dom == NK_BOOL && op != NKX_I_RSUM)))
        return NK_INVALID;
    nk_tensor t[2];
    for (int k = 0; k < 2; k++) {
        const nk_status s = nkx_tensor(&in->o[k], bases, nbases, &t[k]);
        if (s != NK_SUCCESS) return s;
    }
    const int32_t nd = t[1].ndim;
    if (t[0].ndim != nd || !(nkx_int_dtype(t[1].dtype) || t[1].dtype == NK_BOOL) || t[0].dtype == NK_F64 ||
        t[0].dtype == NK_U64 || (axes >> nd) != 0)
        return NK_INVALID;
    int64_t rsz[NKX_MAX_DIMS], osz[NKX_MAX_DIMS], cnt = 1;
    for (int32_t d = 0; d < nd; d++) {
        const bool r = (axes >> d) & 1u;
        if (t[1].sizes[d] < 0 || t[0].sizes[d] != (r ? 1 : t[1].sizes[d])) return NK_INVALID;
        rsz[d] = r ? t[1].sizes[d] : 1;
        osz[d] = r ? 1 : t[1].sizes[d];
        cnt *= rsz[d];
    }
    for (int32_t d = 0; d < nd; d++)
        if (osz[d] == 0) return NK_SUCCESS;
    if (cnt == 0 && op != NKX_I_RSUM) return NK_INVALID;  /* numpy has no max of nothing; a mean would be 0/0 */
    const int64_t e0 = (int64_t)nk_dtype_size(t[0].dtype), e1 = (int64_t)nk_dtype_size(t[1].dtype);
    const bool pw = op == NKX_I_RMEAN && (in->flags & NKX_I_PAIRWISE);
    double *buf = NULL;
    if (pw) {
        buf = (double *)malloc(sizeof(double) * NKX_NP_BUFSIZE);
        if (buf == NULL) return NK_NO_MEMORY;
    }
    int64_t oi[NKX_MAX_DIMS] = {0};
    for (;;) {
        const char *base = (const char *)t[1].data;
        char *q = (char *)t[0].data;
        for (int32_t d = 0; d < nd; d++) {
            base += oi[d] * t[1].strides[d] * e1;
            q += oi[d] * t[0].strides[d] * e0;
        }
        uint64_t sum = 0;
        int64_t best = 0, nb = 0;
        double dsum = 0.0;
        int64_t ri[NKX_MAX_DIMS] = {0};
        for (int64_t k = 0; k < cnt; k++) {
            const char *p = base;
            for (int32_t d = 0; d < nd; d++) p += ri[d] * t[1].strides[d] * e1;
            const int64_t v = nk_load_i64(p, t[1].dtype);
            if (pw) {
                buf[nb++] = (double)v;
                if (nb == NKX_NP_BUFSIZE || k == cnt - 1) {
                    dsum += nkx_pairwise(buf, nb);
                    nb = 0;
                }
            } else if (op == NKX_I_RSUM || op == NKX_I_RMEAN)
                sum += (uint64_t)v;
            else if (k == 0 || (op == NKX_I_RMAX ? v > best : v < best))
                best = v;
            for (int32_t d = nd - 1; d >= 0; d--) {
                if (++ri[d] < rsz[d]) break;
                ri[d] = 0;
            }
        }
        if (op == NKX_I_RMEAN) {
            const double m = (pw ? dsum : (double)(int64_t)sum) / (double)cnt;
            nkx_dput(q, t[0].dtype, neg ? -m : m);
        } else {
            int64_t r = op == NKX_I_RSUM ? nkx_wrap((int64_t)sum, (nk_dtype)dom) : best;
            if (neg) r = nkx_wrap((int64_t)(0u - (uint64_t)r), (nk_dtype)dom);
            nkx_iput(q, t[0].dtype, r);
        }
        int32_t d = nd - 1;
        for (; d >= 0; d--) {
            if (++oi[d] < osz[d]) break;
            oi[d] = 0;
        }
        if (d < 0) {
            free(buf);
            return NK_SUCCESS;
        }
    }
}

/* numpy raises before an integer power with a negative exponent stores anything: so does the step. */
static bool nkx_pow_exponents_ok(const nkx_it *it, const nkx_instr *in, const nk_tensor *t, char *const *p0,
                                 bool rev) {
    const int k = rev ? 1 : 2;  /* the exponent: o2 or the value, or o1 when the operands swap */
    if (k >= in->nops) return !(in->value < 0.0);
    if (t[k].dtype != NK_I8 && t[k].dtype != NK_I16 && t[k].dtype != NK_I32 && t[k].dtype != NK_I64) return true;
    const char *p = p0[k];
    int64_t idx[NKX_MAX_DIMS] = {0};
    for (;;) {
        for (int64_t j = 0; j < it->sizes[0]; j++)
            if (nk_load_i64(p + j * it->strides[k][0], t[k].dtype) < 0) return false;
        int32_t d = 1;
        for (; d < it->ndim; d++) {
            p += it->strides[k][d];
            if (++idx[d] < it->sizes[d]) break;
            p -= it->strides[k][d] * it->sizes[d];
            idx[d] = 0;
        }
        if (d >= it->ndim) return true;
    }
}

static nk_status nkx_int(const nkx_instr *in, void *const *bases, int64_t nbases) {
    const int32_t op = in->op, dom = in->flags & 0xFF;
    if (op >= NKX_I_RSUM && op <= NKX_I_RMEAN) return nkx_int_reduce(in, bases, nbases);
    const bool scalar = (in->flags & NKX_I_SCALAR) != 0, rev = (in->flags & NKX_I_REVERSE) != 0;
    const bool unary = nkx_iop_unary(op);
    if (op < 0 || op >= NKX_I_COUNT || in->nops != (unary || scalar ? 2 : 3) || (unary && scalar))
        return NK_INVALID;
    const bool cmp = (op >= NKX_I_EQ && op <= NKX_I_LXOR) || op == NKX_I_LNOT;
    /* a cast through float64 (or fp16): numpy's where / select result dtype, then o0's encoding */
    /* numpy keeps an integer dtype for these (np.square wraps, np.ceil of an integer is itself) */
    const bool ibin = (op == NKX_I_POW || op == NKX_I_MOD || op == NKX_I_FMOD || op == NKX_I_CEIL ||
                       op == NKX_I_FLOOR || op == NKX_I_TRUNC || op == NKX_I_SIGN || op == NKX_I_SQUARE) &&
                      nkx_int_dtype(dom);
    const bool flt = !ibin && (nkx_iop_float(op) || (op == NKX_I_CAST && (dom == NK_F64 || dom == NK_F16)));
    if (flt) {
        if (dom != NK_F16 && dom != NK_F32 && dom != NK_F64) return NK_INVALID;
    } else if (nkx_int_dtype(dom)) {
        if (nkx_iop_math(op) && !ibin) return NK_INVALID;
    } else if (dom == NK_F32) {
        if (cmp || op == NKX_I_INVERT || (op >= NKX_I_AND && op <= NKX_I_SHR)) return NK_INVALID;
    } else if (dom == NK_F64) {
        if (!cmp) return NK_INVALID;
    } else {
        return NK_INVALID;
    }
    if (scalar && nkx_int_dtype(dom) && !(in->value >= -9007199254740992.0 && in->value <= 9007199254740992.0))
        return NK_INVALID;
    nk_tensor t[3];
    for (int k = 0; k < in->nops; k++) {
        const nk_status s = nkx_tensor(&in->o[k], bases, nbases, &t[k]);
        if (s != NK_SUCCESS) return s;
        if (t[k].dtype == NK_F64 || t[k].dtype == NK_U64 || t[k].ndim != t[0].ndim) return NK_INVALID;
        for (int32_t d = 0; d < t[0].ndim; d++)
            if (t[k].sizes[d] != t[0].sizes[d] || t[k].sizes[d] < 0) return NK_INVALID;
        /* an integer compute type holds its operands: no float operand */
        if (k > 0 && nkx_int_dtype(dom) && !nkx_int_dtype(t[k].dtype) && t[k].dtype != NK_BOOL) return NK_INVALID;
    }
    nkx_it it;
    nkx_it_init(&it, in, 0, 0, t[0].ndim ? t[0].sizes[0] : 1);
    for (int32_t d = 0; d < it.ndim; d++)
        if (it.sizes[d] == 0) return NK_SUCCESS;
    const nk_dtype dt0 = t[0].dtype, dt1 = t[1].dtype, dt2 = in->nops > 2 ? t[2].dtype : dt1;
    const int64_t iv = nkx_int_dtype(dom) ? (int64_t)in->value : 0;
    const float fv = (float)in->value;
    const double dv = in->value;
    int64_t ia[NKX_IRUN], ib[NKX_IRUN], ir[NKX_IRUN];
    double dr[NKX_IRUN];
    char *p[3];
    int64_t idx[NKX_MAX_DIMS] = {0};
    for (int k = 0; k < in->nops; k++) p[k] = (char *)t[k].data;
    const int64_t s0 = it.strides[0][0], s1 = it.strides[1][0], s2 = in->nops > 2 ? it.strides[2][0] : 0;
    if (ibin && op == NKX_I_POW && !nkx_pow_exponents_ok(&it, in, t, p, rev)) return NK_NEG_INT_POWER;
    for (;;) {
        for (int64_t j = 0; j < it.sizes[0]; j += NKX_IRUN) {
            const int64_t n = it.sizes[0] - j < NKX_IRUN ? it.sizes[0] - j : NKX_IRUN;
            const char *q1 = p[1] + j * s1, *q2 = in->nops > 2 ? p[2] + j * s2 : NULL;
            char *q0 = p[0] + j * s0;
            bool as_int = true;
            if (flt) {
                as_int = false;
                const double bv = nkx_round_t(dv, dom);
                for (int64_t i = 0; i < n; i++) {
                    const double a = nkx_round_t(nkx_dget(q1 + i * s1, dt1), dom);
                    const double b = q2 ? nkx_round_t(nkx_dget(q2 + i * s2, dt2), dom) : bv;
                    dr[i] = rev ? nkx_flop(op, b, a, dom) : nkx_flop(op, a, b, dom);
                }
            } else if (nkx_int_dtype(dom)) {
                for (int64_t i = 0; i < n; i++) ia[i] = nk_load_i64(q1 + i * s1, dt1);
                if (q2)
                    for (int64_t i = 0; i < n; i++) ib[i] = nk_load_i64(q2 + i * s2, dt2);
                else
                    for (int64_t i = 0; i < n; i++) ib[i] = iv;
                const nk_dtype tt = (nk_dtype)dom;
                if (rev)
                    for (int64_t i = 0; i < n; i++) ir[i] = nkx_iop2(op, ib[i], ia[i], tt);
                else
                    for (int64_t i = 0; i < n; i++) ir[i] = nkx_iop2(op, ia[i], ib[i], tt);
            } else if (dom == NK_F32) {
                as_int = false;
                for (int64_t i = 0; i < n; i++) {
                    const float a = nkx_fget(q1 + i * s1, dt1), b = q2 ? nkx_fget(q2 + i * s2, dt2) : fv;
                    dr[i] = (double)(rev ? nkx_fop2(op, b, a) : nkx_fop2(op, a, b));
                }
            } else {
                for (int64_t i = 0; i < n; i++) {
                    const double a = nkx_dget(q1 + i * s1, dt1), b = q2 ? nkx_dget(q2 + i * s2, dt2) : dv;
                    ir[i] = rev ? nkx_dop2(op, b, a) : nkx_dop2(op, a, b);
                }
            }
            if (as_int)
                for (int64_t i = 0; i < n; i++) nkx_iput(q0 + i * s0, dt0, ir[i]);
            else
                for (int64_t i = 0; i < n; i++) nkx_dput(q0 + i * s0, dt0, dr[i]);
        }
        int32_t d = 1;
        for (; d < it.ndim; d++) {
            for (int k = 0; k < in->nops; k++) p[k] += it.strides[k][d];
            if (++idx[d] < it.sizes[d]) break;
            for (int k = 0; k < in->nops; k++) p[k] -= it.strides[k][d] * it.sizes[d];
            idx[d] = 0;
        }
        if (d >= it.ndim) return NK_SUCCESS;
    }
}

static bool nkx_unary_fusable(int32_t op) { return op >= NK_NEG && op <= NK_RELU; }
static bool nkx_binary_fusable(int32_t op) {
    return op == NK_ADD || op == NK_MUL || op == NK_DIV || op == NK_DIV_TRUNC || op == NK_DIV_FLOOR ||
           (op >= NK_EQ && op <= NK_LOGICAL_XOR) || op == NK_POW || op == NK_MAXIMUM || op == NK_MINIMUM;
}

static nk_status nkx_fstep_init(nkx_fstep *f, const nk_ew_f32_table *tab, const nkx_instr *in, void *const *bases,
                                int64_t nbases, int64_t rows, int64_t block) {
    memset(f, 0, sizeof *f);
    f->kind = in->kind;
    f->op = in->op;
    f->nops = in->nops;
    f->slot[0] = f->slot[1] = f->slot[2] = -1;
    const int need = in->kind == NKX_BINARY ? 3 : 2;
    if ((in->kind != NKX_COPY && in->kind != NKX_UNARY && in->kind != NKX_BINARY && in->kind != NKX_REDUCE) ||
        in->nops != need)
        return NK_INVALID;
    for (int k = 0; k < in->nops; k++) {
        const nkx_operand *o = &in->o[k];
        if (o->region < 0 || o->region >= nbases || o->ndim < 1 || o->ndim > NKX_MAX_DIMS ||
            !nkx_float_dtype(o->dtype) || o->sizes[0] != rows)
            return NK_INVALID;
        for (int32_t d = 0; d < o->ndim; d++)
            if (o->sizes[d] < 0) return NK_INVALID;
        f->dt[k] = (nk_dtype)o->dtype;
        f->row0[k] = (char *)bases[o->region] + o->offset;
        f->row_bytes[k] = o->strides[0] * (int64_t)nk_dtype_size(f->dt[k]);
    }
    if (in->kind == NKX_REDUCE) {
        const nkx_operand *dst = &in->o[0], *src = &in->o[1];
        const uint32_t dims = (uint32_t)(in->flags & ~(NKX_FUSE_NEXT | NKX_JOIN_NEXT));
        if ((dims & 1u) || in->op < NK_REDUCE_SUM || in->op > NK_REDUCE_AMIN) return NK_INVALID;
        int64_t per_dst = 1;
        for (int32_t d = 1; d < dst->ndim; d++) per_dst *= dst->sizes[d];
        if (per_dst != 1) return NK_INVALID;
        for (int32_t d = 1; d < src->ndim; d++)
            if (src->sizes[d] > 1 && !(dims >> d & 1u)) return NK_INVALID;
        nkx_it_init(&f->full, in, 1, 1, 1);
        f->count = 1;
        for (int32_t d = 1; d < src->ndim; d++) f->count *= src->sizes[d];
        /* nk_reduce refuses the max of nothing */
        if (f->count == 0 && rows > 0 && in->op >= NK_REDUCE_AMAX) return NK_INVALID;
        return NK_SUCCESS;
    }
    for (int k = 1; k < in->nops; k++) {
        if (in->o[k].ndim != in->o[0].ndim) return NK_INVALID;
        for (int32_t d = 0; d < in->o[0].ndim; d++)
            if (in->o[k].sizes[d] != in->o[0].sizes[d]) return NK_INVALID;
    }
    for (int32_t d = 1; d < in->o[0].ndim; d++) f->empty = f->empty || in->o[0].sizes[d] == 0;
    f->args.f32[NK_ARG_ALPHA] = 1.0f;
    f->args.f64[NK_ARG_ALPHA] = 1.0;
    f->args.f32[NK_ARG_LO] = -INFINITY;
    f->args.f64[NK_ARG_LO] = -INFINITY;
    f->args.f32[NK_ARG_HI] = INFINITY;
    f->args.f64[NK_ARG_HI] = INFINITY;
    f->args.reduced = -1;
    if (in->kind == NKX_UNARY) {
        if (!nkx_unary_fusable(in->op)) return NK_INVALID;
        f->fn = tab->fn[NK_EW_UNARY(in->op)];
    } else if (in->kind == NKX_BINARY) {
        if (!nkx_binary_fusable(in->op)) return NK_INVALID;
        f->fn = tab->fn[NK_EW_BINARY(in->op)];
        f->vs = tab->vs[in->op];
        f->sv = tab->sv[in->op];
        f->pred = in->op >= NK_EQ && in->op <= NK_LOGICAL_XOR;
        if (in->op == NK_ADD) {
            f->args.f32[NK_ARG_ALPHA] = (float)in->value;
            f->args.f64[NK_ARG_ALPHA] = in->value;
        }
    }
    if (in->kind != NKX_COPY && f->fn == NULL) return NK_INVALID;
    f->sop = -1;
    bool all_f32 = true;
    for (int k = 0; k < in->nops; k++) all_f32 = all_f32 && f->dt[k] == NK_F32;
    if (all_f32 && in->kind == NKX_UNARY &&
        (in->op == NK_NEG || in->op == NK_ABS || in->op == NK_SQRT || in->op == NK_RSQRT ||
         in->op == NK_RECIPROCAL || in->op == NK_RELU))
        f->sop = NK_EW_UNARY(in->op);
    if (all_f32 && in->kind == NKX_BINARY &&
        (in->op == NK_ADD || in->op == NK_MUL || in->op == NK_DIV || in->op == NK_MAXIMUM || in->op == NK_MINIMUM))
        f->sop = NK_EW_BINARY(in->op);
    nkx_it_init(&f->full, in, 0, 0, block);
    nkx_it_init(&f->tail, in, 0, 0, rows % block ? rows % block : block);
    return NK_SUCCESS;
}

/* n elements at q (byte stride s) as floats: in place when they already are contiguous floats, else in buf. */
static const float *nkx_load(const nk_ew_f32_table *tab, float *buf, const char *q, int64_t s, nk_dtype t,
                             int64_t n) {
    if (t == NK_F32 && s == 4) return (const float *)q;
    if (t == NK_BF16 && s == 2) {
        tab->from_bf16(buf, (const uint16_t *)q, n);
    } else if (t == NK_F16 && s == 2) {
        tab->from_f16(buf, (const uint16_t *)q, n);
    } else {
        for (int64_t i = 0; i < n; i++) buf[i] = nk_load_f32(q + i * s, t);
    }
    return buf;
}

/* n floats rounded to t into q (byte stride s). */
static void nkx_store(const nk_ew_f32_table *tab, char *q, int64_t s, nk_dtype t, const float *v, int64_t n) {
    if (t == NK_F32 && s == 4) {
        if ((const void *)q != (const void *)v) memmove(q, v, (size_t)n * sizeof(float));
    } else if (t == NK_BF16 && s == 2) {
        tab->to_bf16((uint16_t *)q, v, n);
    } else if (t == NK_F16 && s == 2) {
        tab->to_f16((uint16_t *)q, v, n);
    } else {
        for (int64_t i = 0; i < n; i++) nk_store_f32(q + i * s, t, v[i]);
    }
}

/*
 * The ops whose vector loop is one correctly rounded IEEE operation per element (or a select), so a scalar
 * expression gives the same bits: a [128, 1] step of a row block (a run of a few elements) then costs no
 * indirect call and no operand staging.
 */
static inline float nkx_scalar_op(int32_t sop, float a, float b, float alpha) {
    switch (sop) {
    case NK_EW_UNARY(NK_NEG): return -a;
    case NK_EW_UNARY(NK_ABS): return fabsf(a);
    case NK_EW_UNARY(NK_SQRT): return __builtin_sqrtf(a);
    case NK_EW_UNARY(NK_RSQRT): return 1.0f / __builtin_sqrtf(a);
    case NK_EW_UNARY(NK_RECIPROCAL): return 1.0f / a;
    case NK_EW_UNARY(NK_RELU): return a != a ? a : (a > 0.0f ? a : 0.0f);
    case NK_EW_BINARY(NK_ADD): return alpha == 1.0f ? a + b : __builtin_fmaf(alpha, b, a);
    case NK_EW_BINARY(NK_MUL): return a * b;
    case NK_EW_BINARY(NK_DIV): return a / b;
    case NK_EW_BINARY(NK_MAXIMUM): {
        float r = a < b ? b : a;
        r = a != a ? a : r;
        return b != b ? b : r;
    }
    case NK_EW_BINARY(NK_MINIMUM): {
        float r = b < a ? b : a;
        r = a != a ? a : r;
        return b != b ? b : r;
    }
    default: return NAN;
    }
}

#define NKX_SHORT 16  /* runs up to this long take nkx_scalar_op */

/* One run of n elements of an element-wise step: p[k] its operands' first elements, s[k] their byte strides. */
static void nkx_ew_span(const nk_ew_f32_table *tab, const nkx_fstep *f, char *const *p, const int64_t *s,
                        int64_t n, float *buf) {
    if (f->sop >= 0 && n <= NKX_SHORT) {
        const float alpha = f->args.f32[NK_ARG_ALPHA];
        for (int64_t i = 0; i < n; i++) {
            const float a = *(const float *)(p[1] + i * s[1]);
            const float b = f->nops > 2 ? *(const float *)(p[2] + i * s[2]) : 0.0f;
            *(float *)(p[0] + i * s[0]) = nkx_scalar_op(f->sop, a, b, alpha);
        }
        return;
    }
    float *ob = buf, *ib[2] = {buf + NKX_RUN, buf + 2 * NKX_RUN};
    uint8_t pb[NKX_RUN];
    const int64_t es0 = (int64_t)nk_dtype_size(f->dt[0]);
    for (int64_t j = 0; j < n; j += NKX_RUN) {
        const int64_t len = n - j < NKX_RUN ? n - j : NKX_RUN;
        char *q0 = p[0] + j * s[0];
        if (f->kind == NKX_COPY && f->dt[0] == f->dt[1]) {  /* same dtype: the bytes, as nk_copy */
            const char *q1 = p[1] + j * s[1];
            if (s[0] == es0 && s[1] == es0)
                memmove(q0, q1, (size_t)(len * es0));
            else
                for (int64_t i = 0; i < len; i++) memmove(q0 + i * s[0], q1 + i * s[1], (size_t)es0);
            continue;
        }
        const void *in[2] = {NULL, NULL};
        bool one[2] = {false, false};
        float sc[2] = {0.0f, 0.0f};
        for (int k = 1; k < f->nops; k++) {
            const char *q = p[k] + j * s[k];
            if (s[k] == 0) {
                sc[k - 1] = nk_load_f32(q, f->dt[k]);
                one[k - 1] = true;
                in[k - 1] = &sc[k - 1];
            } else {
                in[k - 1] = nkx_load(tab, ib[k - 1], q, s[k], f->dt[k], len);
            }
        }
        nk_ew_fn fn = f->fn;
        if (f->kind == NKX_BINARY && one[1] && !one[0] && f->vs) {
            fn = f->vs;
        } else if (f->kind == NKX_BINARY && one[0] && !one[1] && f->sv) {
            fn = f->sv;
        } else {
            for (int k = 0; k < f->nops - 1; k++) {
                if (!one[k]) continue;
                for (int64_t i = 0; i < len; i++) ib[k][i] = sc[k];
                in[k] = ib[k];
            }
        }
        if (f->kind == NKX_COPY) {
            nkx_store(tab, q0, s[0], f->dt[0], (const float *)in[0], len);
            continue;
        }
        if (f->pred) {
            fn(pb, in, len, &f->args);
            for (int64_t i = 0; i < len; i++) ob[i] = (float)pb[i];
            nkx_store(tab, q0, s[0], f->dt[0], ob, len);
        } else if (f->dt[0] == NK_F32 && s[0] == 4) {
            fn(q0, in, len, &f->args);
        } else {
            fn(ob, in, len, &f->args);
            nkx_store(tab, q0, s[0], f->dt[0], ob, len);
        }
    }
}

static void nkx_ew_rows(const nk_ew_f32_table *tab, const nkx_fstep *f, const nkx_it *it, int64_t r0, float *buf,
                        char *scratch) {
    char *p[3];
    int64_t idx[NKX_MAX_DIMS] = {0}, s0[3];
    for (int k = 0; k < f->nops; k++) {
        p[k] = nkx_rowp(f, k, r0, scratch);
        s0[k] = it->strides[k][0];
    }
    for (;;) {
        nkx_ew_span(tab, f, p, s0, it->sizes[0], buf);
        int32_t d = 1;
        for (; d < it->ndim; d++) {
            for (int k = 0; k < f->nops; k++) p[k] += it->strides[k][d];
            if (++idx[d] < it->sizes[d]) break;
            for (int k = 0; k < f->nops; k++) p[k] -= it->strides[k][d] * it->sizes[d];
            idx[d] = 0;
        }
        if (d >= it->ndim) return;
    }
}

/* Rows r0..r0+cnt of a reduce: each row's free elements (the iterator `full`) into its one destination value,
 * with nk_reduce's loops and rounding (float sums of a contiguous row in PyTorch's order, mean = the float sum
 * divided in float, max/min NaN-propagating). */
static void nkx_reduce_rows(const nk_ew_f32_table *tab, const nkx_fstep *f, int64_t r0, int64_t cnt, float *buf,
                            char *scratch) {
    const nkx_it *it = &f->full;
    const bool mx = f->op == NK_REDUCE_AMAX || f->op == NK_REDUCE_AMIN;
    char *const src0 = nkx_rowp(f, 1, r0, scratch), *const dst0 = nkx_rowp(f, 0, r0, scratch);
    for (int64_t r = 0; r < cnt; r++) {
        const char *p = src0 + r * f->row_bytes[1];
        int64_t idx[NKX_MAX_DIMS] = {0};
        double acc = 0.0;
        float best = f->op == NK_REDUCE_AMAX ? -INFINITY : INFINITY;
        bool nan = false;
        const int64_t n0 = f->count ? it->sizes[0] : 0, s = it->strides[0][0];
        /* one chunk per contiguous f32 run (nk_reduce sums such a row whole), NKX_RUN-element chunks otherwise */
        const int64_t chunk = f->dt[1] == NK_F32 && s == 4 ? n0 : NKX_RUN;
        for (;;) {
            for (int64_t j = 0; j < n0; j += chunk) {
                const int64_t len = n0 - j < chunk ? n0 - j : chunk;
                const float *x = nkx_load(tab, buf, p + j * s, s, f->dt[1], len);
                if (mx) {
                    const float v = nk_max(x, len, f->op == NK_REDUCE_AMAX);
                    nan = nan || v != v;
                    if (f->op == NK_REDUCE_AMAX ? v > best : v < best) best = v;
                } else {
                    acc += (double)(f->sq ? nk_sum_sq_cascade(x, len) : nk_sum_cascade(x, len));
                }
            }
            int32_t d = 1;
            for (; d < it->ndim; d++) {
                p += it->strides[0][d];
                if (++idx[d] < it->sizes[d]) break;
                p -= it->strides[0][d] * it->sizes[d];
                idx[d] = 0;
            }
            if (d >= it->ndim || n0 == 0) break;
        }
        float v;
        if (mx)
            v = nan ? NAN : best;
        else if (f->op == NK_REDUCE_MEAN)
            v = (float)acc / (float)f->count;
        else
            v = (float)acc;
        nk_store_f32(dst0 + r * f->row_bytes[0], f->dt[0], v);
    }
}

static void nkx_fgroup_run(void *ctx, int64_t b, int64_t e) {
    const nkx_fgroup *g = ctx;
    float buf[3 * NKX_RUN];
    _Alignas(64) char scratch[NKX_SCRATCH];
    for (int64_t blk = b; blk < e; blk++) {
        const int64_t r0 = blk * g->block;
        const int64_t cnt = r0 + g->block <= g->rows ? g->block : g->rows - r0;
        for (int32_t k = 0; k < g->n; k++) {
            const nkx_fstep *f = &g->s[k];
            if (f->folded) continue;
            if (f->kind == NKX_REDUCE)
                nkx_reduce_rows(g->tab, f, r0, cnt, buf, scratch);
            else if (!f->empty)
                nkx_ew_rows(g->tab, f, cnt == g->block ? &f->full : &f->tail, r0, buf, scratch);
        }
    }
}

/*
 * Scratch tiles: the tracer tags (operand pad = slot + 1) the operands of an on-chip tile that only this group
 * touches, so no step outside it reads what the group writes there. Such a tile never needs its arena bytes:
 * each block of rows lives in the worker's scratch instead (block * row bytes), which keeps the group's
 * intermediates in L1 and spares their write-back (measured: writing dead [128, 1024] intermediates to the
 * arena cost as much as the passes fusion saved). Every operand of a slot must address rows of one byte
 * stride, each row's bytes within one stride of the lowest operand offset; a group whose slots do not fit in
 * NKX_SCRATCH runs on the arena, where the same operands are valid too.
 */
static nk_status nkx_slots(nkx_fgroup *g, const nkx_instr *gi, int64_t *failed_at) {
    int64_t lo[NKX_SLOTS], stride[NKX_SLOTS], off[NKX_SLOTS];
    bool used[NKX_SLOTS] = {false};
    for (int32_t k = 0; k < g->n; k++) {
        for (int q = 0; q < gi[k].nops; q++) {
            const nkx_operand *o = &gi[k].o[q];
            if (o->pad == 0) continue;
            const int32_t sl = o->pad - 1;
            if (sl < 0 || sl >= NKX_SLOTS || o->region != 0 || g->s[k].row_bytes[q] <= 0) {
                *failed_at = k;
                return NK_INVALID;
            }
            if (!used[sl] || o->offset < lo[sl]) lo[sl] = o->offset;
            if (used[sl] && stride[sl] != g->s[k].row_bytes[q]) {
                *failed_at = k;
                return NK_INVALID;
            }
            used[sl] = true;
            stride[sl] = g->s[k].row_bytes[q];
        }
    }
    int64_t top = 0;
    for (int sl = 0; sl < NKX_SLOTS; sl++) {
        if (!used[sl]) continue;
        off[sl] = top;
        top += (g->block * stride[sl] + 63) / 64 * 64;
    }
    for (int32_t k = 0; k < g->n; k++) {
        for (int q = 0; q < gi[k].nops; q++) {
            const nkx_operand *o = &gi[k].o[q];
            if (o->pad == 0) continue;
            const int32_t sl = o->pad - 1;
            /* the row's last byte, from the operand's offset */
            int64_t end = (int64_t)nk_dtype_size((nk_dtype)o->dtype);
            for (int32_t d = 1; d < o->ndim; d++) {
                if (o->strides[d] < 0) {
                    *failed_at = k;
                    return NK_INVALID;
                }
                if (o->sizes[d] > 0) end += (o->sizes[d] - 1) * o->strides[d] * (int64_t)nk_dtype_size((nk_dtype)o->dtype);
            }
            if (o->offset - lo[sl] + end > stride[sl]) {
                *failed_at = k;
                return NK_INVALID;
            }
            if (top <= NKX_SCRATCH) {
                g->s[k].slot[q] = sl;
                g->s[k].soff[q] = off[sl] + o->offset - lo[sl];
            }
        }
    }
    return NK_SUCCESS;
}

/*
 * Folded squares: a step t = x * x into a scratch tile whose only reader is the next step, a sum (or mean) of
 * each contiguous fp32 row of t, runs as that sum over the squares of x's rows (nk_sum_sq_cascade: each square
 * rounded to float, then the same cascade), as nk_dot does for the native rms_norm: t is never written and read
 * back, and x is read once. The same bits as the two steps.
 */
static bool nkx_same_free(const nkx_operand *a, const nkx_operand *b) {
    if (a->ndim != b->ndim) return false;
    for (int32_t d = 1; d < a->ndim; d++)
        if (a->sizes[d] != b->sizes[d] || (a->sizes[d] > 1 && a->strides[d] != b->strides[d])) return false;
    return true;
}

static void nkx_folds_find(nkx_fgroup *g, const nkx_instr *gi) {
    for (int32_t k = 0; k + 1 < g->n; k++) {
        nkx_fstep *f = &g->s[k], *r = &g->s[k + 1];
        if (f->kind != NKX_BINARY || f->op != NK_MUL || f->folded || f->slot[0] < 0 || f->empty) continue;
        if (f->dt[0] != NK_F32 || f->dt[1] != NK_F32 || f->dt[2] != NK_F32) continue;
        if (f->slot[1] != f->slot[2] || f->row_bytes[1] != f->row_bytes[2] ||
            (f->slot[1] >= 0 ? f->soff[1] != f->soff[2] : f->row0[1] != f->row0[2]) ||
            !nkx_same_free(&gi[k].o[1], &gi[k].o[2]) || !nkx_same_free(&gi[k].o[1], &gi[k].o[0]))
            continue;
        if (r->kind != NKX_REDUCE || (r->op != NK_REDUCE_SUM && r->op != NK_REDUCE_MEAN) || r->sq) continue;
        if (r->slot[1] != f->slot[0] || r->soff[1] != f->soff[0] || r->row_bytes[1] != f->row_bytes[0] ||
            !nkx_same_free(&gi[k + 1].o[1], &gi[k].o[0]))
            continue;
        /* one contiguous fp32 run per row: the whole row goes to one cascade, as in nkx_reduce_rows */
        if (r->count == 0 || r->full.ndim != 1 || r->full.strides[0][0] != 4 || r->dt[1] != NK_F32) continue;
        bool alone = true;
        for (int32_t m = 0; m < g->n && alone; m++)
            for (int q = 0; q < g->s[m].nops && alone; q++)
                if (g->s[m].slot[q] == f->slot[0] && !(m == k && q == 0) && !(m == k + 1 && q == 1)) alone = false;
        if (!alone) continue;
        f->folded = true;
        r->sq = true;
        r->slot[1] = f->slot[1];
        r->soff[1] = f->soff[1];
        r->row0[1] = f->row0[1];
        r->row_bytes[1] = f->row_bytes[1];
    }
}

/* Prepares the part gi[0..m) of a fused group of n steps: each step's loops and operands, the scratch slots. */
static nk_status nkx_group_prepare(nkx_fgroup *g, const nkx_instr *gi, int64_t m, int64_t n, void *const *bases,
                                   int64_t nbases, int64_t *failed_at) {
    if (gi[0].nops < 1 || gi[0].o[0].ndim < 1 || gi[0].o[0].ndim > NKX_MAX_DIMS) {
        *failed_at = 0;
        return NK_INVALID;
    }
    const int64_t rows = gi[0].o[0].sizes[0];
    int64_t per_row = 1;
    for (int64_t k = 0; k < m; k++) {
        for (int32_t q = 0; q < gi[k].nops && q < 3; q++) {
            int64_t e = 1;
            for (int32_t d = 1; d < gi[k].o[q].ndim && d < NKX_MAX_DIMS; d++) e *= gi[k].o[q].sizes[d];
            if (e > per_row) per_row = e;
        }
    }
    int64_t block = NKX_FUSE_ELEMS / per_row;
    if (block < 1) block = 1;
    g->tab = nk_ew_f32_select();
    g->n = (int32_t)m;
    g->rows = rows;
    g->block = block;
    for (int64_t k = 0; k < m; k++) {
        const nk_status s = nkx_fstep_init(&g->s[k], g->tab, &gi[k], bases, nbases, rows, block);
        if (s != NK_SUCCESS) {
            *failed_at = k;
            return s;
        }
    }
    /* a split group's scratch tiles would have to outlive their part: those stay on the arena */
    if (n > NKX_FUSE_MAX) return NK_SUCCESS;
    const nk_status s = nkx_slots(g, gi, failed_at);
    static int fold = -1;  /* NKX_FOLD=0: no folded squares (the A/B reference) */
    if (fold < 0) fold = getenv("NKX_FOLD") == NULL || strcmp(getenv("NKX_FOLD"), "0") != 0;
    if (s == NK_SUCCESS && fold) nkx_folds_find(g, gi);
    return s;
}

static int64_t nkx_group_blocks(const nkx_fgroup *g) { return g->rows > 0 ? (g->rows + g->block - 1) / g->block : 0; }

/* Runs the fused group ins[0..n) (see NKX_FUSE_NEXT); *failed_at: the offending step on NK_INVALID. */
static nk_status nkx_group(const nkx_instr *ins, int64_t n, void *const *bases, int64_t nbases, bool inner,
                           int64_t *failed_at) {
    for (int64_t g0 = 0; g0 < n; g0 += NKX_FUSE_MAX) {
        const int64_t m = n - g0 < NKX_FUSE_MAX ? n - g0 : NKX_FUSE_MAX;
        const nkx_instr *gi = ins + g0;
        nkx_fgroup g;
        const nk_status s = nkx_group_prepare(&g, gi, m, n, bases, nbases, failed_at);
        if (s != NK_SUCCESS) {
            *failed_at += g0;
            return s;
        }
        const int64_t nblocks = nkx_group_blocks(&g);
        if (nblocks == 0) continue;
        if (nkx_group_large(gi, m) && !inner)
            nk_parallel_for(nblocks, 1, nkx_fgroup_run, &g);
        else
            nkx_fgroup_run(&g, 0, nblocks);
    }
    return NK_SUCCESS;
}

static int64_t nkx_group_end(const nkx_instr *ins, int64_t i, int64_t n);

typedef struct nkx_joined {
    nkx_fgroup *g;
    int32_t n;
    int64_t first[NKX_JOIN_MAX + 1];  /* the joined block index of each group's first block */
} nkx_joined;

static void nkx_joined_run(void *ctx, int64_t b, int64_t e) {
    const nkx_joined *j = ctx;
    int32_t k = 0;
    for (int64_t x = b; x < e; x++) {
        while (x >= j->first[k + 1]) k++;
        nkx_fgroup_run(&j->g[k], x - j->first[k], x - j->first[k] + 1);
    }
}

/* The groups starting at ins[i] joined by NKX_JOIN_NEXT, in one parallel region; *end: the step after them.
 * NK_UNSUPPORTED (nothing run) when fewer than two groups join or together they are too small for the pool. */
static nk_status nkx_join(const nkx_instr *ins, int64_t i, int64_t n, void *const *bases, int64_t nbases,
                          int64_t *end, int64_t *failed_at) {
    int64_t starts[NKX_JOIN_MAX + 1], work = 0;
    int32_t ng = 0;
    int64_t j = i;
    for (;;) {
        const int64_t g = nkx_group_end(ins, j, n);
        if (g - j < 2 || g - j > NKX_FUSE_MAX) break;
        starts[ng++] = j;
        starts[ng] = g;
        for (int64_t k = j; k < g; k++) work += nkx_work(&ins[k]);
        j = g;
        if (ng == NKX_JOIN_MAX || !(ins[g - 1].flags & NKX_JOIN_NEXT) || g >= n) break;
    }
    if (ng < 2 || work < NKX_PARALLEL_ELEMS) return NK_UNSUPPORTED;
    nkx_joined jn;
    jn.g = malloc(sizeof(nkx_fgroup) * (size_t)ng);
    if (jn.g == NULL) return NK_UNSUPPORTED;
    jn.n = ng;
    jn.first[0] = 0;
    for (int32_t k = 0; k < ng; k++) {
        const int64_t m = starts[k + 1] - starts[k];
        int64_t at = 0;
        const nk_status s = nkx_group_prepare(&jn.g[k], &ins[starts[k]], m, m, bases, nbases, &at);
        if (s != NK_SUCCESS) {
            free(jn.g);
            *failed_at = starts[k] + at;
            return s;
        }
        jn.first[k + 1] = jn.first[k] + nkx_group_blocks(&jn.g[k]);
    }
    for (int32_t k = ng + 1; k <= NKX_JOIN_MAX; k++) jn.first[k] = INT64_MAX;
    if (jn.first[ng] > 0) nk_parallel_for(jn.first[ng], 1, nkx_joined_run, &jn);
    free(jn.g);
    *end = starts[ng];
    return NK_SUCCESS;
}

static int64_t nkx_group_end(const nkx_instr *ins, int64_t i, int64_t n) {
    int64_t j = i;
    while (j + 1 < n && (ins[j].flags & NKX_FUSE_NEXT)) j++;
    return j + 1;
}

nk_status nkx_run(const nkx_instr *ins, int64_t n, void *const *bases, int64_t nbases, int64_t *failed_at) {
    int64_t i = 0;
    while (i < n) {
        int64_t g = nkx_group_end(ins, i, n);
        if (g - i > 1 && (ins[g - 1].flags & NKX_JOIN_NEXT)) {
            int64_t end = i, at = -1;
            const nk_status s = nkx_join(ins, i, n, bases, nbases, &end, &at);
            if (s == NK_SUCCESS) {
                i = end;
                continue;
            }
            if (s != NK_UNSUPPORTED) {
                if (failed_at) *failed_at = at;
                return s;
            }
        }
        if (g - i > 1) {
            if (nkx_group_large(&ins[i], g - i)) {
                int64_t at = 0;
                nk_status s = nkx_group(&ins[i], g - i, bases, nbases, false, &at);
                if (s != NK_SUCCESS) {
                    if (failed_at) *failed_at = i + at;
                    return s;
                }
                i = g;
                continue;
            }
        }
        if (nkx_large(&ins[i])) {
            nk_status s = nkx_step(&ins[i], bases, nbases);
            if (s != NK_SUCCESS) {
                if (failed_at) *failed_at = i;
                return s;
            }
            i++;
            continue;
        }
        int64_t j = nkx_group_end(ins, i, n);
        while (j < n && !nkx_large(&ins[j])) {
            const int64_t g2 = nkx_group_end(ins, j, n);
            if (g2 - j > 1 && nkx_group_large(&ins[j], g2 - j)) break;
            j = g2;
        }
        nkx_serial_ctx c = {ins, i, j, bases, nbases, NK_SUCCESS, -1};
        nk_parallel_for(1, 1, nkx_serial_run, &c);
        if (c.status != NK_SUCCESS) {
            if (failed_at) *failed_at = c.failed;
            return c.status;
        }
        i = j;
    }
    if (failed_at) *failed_at = -1;
    return NK_SUCCESS;
}
