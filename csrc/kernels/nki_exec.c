/*
 * nki_exec.c - replays a traced NKI kernel (see nkx_run in neuron_kernels.h) on the kernel library.
 *
 * The tracer (nki/_compile.py) has already decided everything that depends only on shapes: which PSUM
 * matmuls accumulate, where fp32 staging is needed, which arena bytes each tile uses. What is left here is
 * turning operands into library descriptors and calling the library, so replay costs one library call per
 * step instead of a numpy round trip per instruction.
 */
#include "neuron_kernels.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#define NKX_FUSE_NEXT ((int32_t)1 << 30)  /* see nkx_group */

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
    case NKX_REDUCE:
        if (in->nops != 2) return NK_INVALID;
        return nk_reduce(&t[0], &t[1], (uint64_t)(uint32_t)(in->flags & ~NKX_FUSE_NEXT), (nk_reduce_op)in->op);
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
/*
 * Fused groups: the tracer marks a run of element-wise steps (and reduces along free dims) whose operands share
 * partition rows (row r of each step touches only row r of the others) with NKX_FUSE_NEXT on every step but the
 * last. Such a group is replayed a block of rows at a time, every step on that block before the next block, so
 * the intermediates of a [128, F] tile stay in L1 instead of each step streaming the whole tile through L2. The
 * steps themselves, their math order and their rounding on each store are unchanged: results are bitwise equal.
 */
#define NKX_FUSE_CHUNK ((int64_t)32768)

#define NKX_PARALLEL_ELEMS ((int64_t)1 << 18)
#define NKX_PARALLEL_MACS ((int64_t)1 << 23)

static bool nkx_large(const nkx_instr *in) {
    const nkx_operand *o = &in->o[in->kind == NKX_REDUCE && in->nops > 1 ? 1 : 0];
    int64_t n = 1;
    for (int32_t d = 0; d < o->ndim && d < NKX_MAX_DIMS; d++) n *= o->sizes[d];
    if (in->kind == NKX_GEMM && in->nops == 3 && in->o[1].ndim == 2)
        return n * in->o[1].sizes[1] >= NKX_PARALLEL_MACS;
    if (in->kind == NKX_UNARY)  /* exp, tanh, ...: ~8x the work of an add per element */
        n *= 8;
    return n >= NKX_PARALLEL_ELEMS;
}

static nk_status nkx_group(const nkx_instr *ins, int64_t n, void *const *bases, int64_t nbases, bool inner);
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
        if (g - i > 1)
            s = nkx_group(&c->ins[i], g - i, c->bases, c->nbases, true);
        else
            s = nkx_step(&c->ins[i], c->bases, c->nbases);
        if (s != NK_SUCCESS) {
            c->status = s;
            c->failed = i;
            return;
        }
        i = g;
    }
}

typedef struct nkx_group_ctx {
    const nkx_instr *ins;
    int64_t n, rows, block;
    void *const *bases;
    int64_t nbases;
    nk_status status;
} nkx_group_ctx;

static void nkx_group_run(void *ctx_, int64_t b, int64_t e) {
    nkx_group_ctx *c = ctx_;
    for (int64_t blk = b; blk < e; blk++) {
        const int64_t r0 = blk * c->block;
        const int64_t cnt = r0 + c->block <= c->rows ? c->block : c->rows - r0;
        for (int64_t k = 0; k < c->n; k++) {
            nkx_instr in = c->ins[k];
            for (int32_t q = 0; q < in.nops && q < 3; q++) {
                nkx_operand *o = &in.o[q];
                if (o->ndim < 1 || o->dtype < 0 || o->dtype >= NK_DTYPE_COUNT) continue;
                o->offset += r0 * o->strides[0] * (int64_t)nk_dtype_size((nk_dtype)o->dtype);
                o->sizes[0] = cnt;
            }
            nk_status s = nkx_step(&in, c->bases, c->nbases);
            if (s != NK_SUCCESS) {
                c->status = s;
                return;
            }
        }
    }
}

/* Runs the fused group ins[0..n) (see NKX_FUSE_NEXT); the tracer guarantees every operand has rows rows. */
static nk_status nkx_group(const nkx_instr *ins, int64_t n, void *const *bases, int64_t nbases, bool inner) {
    const int64_t rows = ins[0].o[0].ndim >= 1 ? ins[0].o[0].sizes[0] : 1;
    int64_t per_row = 1;
    bool large = false;
    for (int64_t k = 0; k < n; k++) {
        large = large || nkx_large(&ins[k]);
        for (int32_t q = 0; q < ins[k].nops && q < 3; q++) {
            int64_t m = 1;
            for (int32_t d = 1; d < ins[k].o[q].ndim && d < NKX_MAX_DIMS; d++) m *= ins[k].o[q].sizes[d];
            if (m > per_row) per_row = m;
        }
    }
    int64_t block = NKX_FUSE_CHUNK / per_row;
    if (block < 1) block = 1;
    const int64_t nblocks = rows > 0 ? (rows + block - 1) / block : 0;
    nkx_group_ctx c = {ins, n, rows, block, bases, nbases, NK_SUCCESS};
    if (large && !inner)
        nk_parallel_for(nblocks, 1, nkx_group_run, &c);
    else
        nkx_group_run(&c, 0, nblocks);
    return c.status;
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
        if (g - i > 1) {
            bool large = false;
            for (int64_t k = i; k < g; k++) large = large || nkx_large(&ins[k]);
            if (large) {
                nk_status s = nkx_group(&ins[i], g - i, bases, nbases, false);
                if (s != NK_SUCCESS) {
                    if (failed_at) *failed_at = i;
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
            bool big = false;
            for (int64_t k = j; k < g2; k++) big = big || nkx_large(&ins[k]);
            if (big) break;
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
