/*
 * nki_exec.c - replays a traced NKI kernel (see nkx_run in neuron_kernels.h) on the kernel library.
 *
 * The tracer (nki/_compile.py) has already decided everything that depends only on shapes: which PSUM
 * matmuls accumulate, where fp32 staging is needed, which arena bytes each tile uses. What is left here is
 * turning operands into library descriptors and calling the library, so replay costs one library call per
 * step instead of a numpy round trip per instruction.
 */
#include "neuron_kernels.h"

#include <stddef.h>
#include <string.h>

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
        return nk_reduce(&t[0], &t[1], (uint64_t)(uint32_t)in->flags, (nk_reduce_op)in->op);
    default:
        return NK_INVALID;
    }
}

nk_status nkx_run(const nkx_instr *ins, int64_t n, void *const *bases, int64_t nbases, int64_t *failed_at) {
    for (int64_t i = 0; i < n; i++) {
        nk_status s = nkx_step(&ins[i], bases, nbases);
        if (s != NK_SUCCESS) {
            if (failed_at) *failed_at = i;
            return s;
        }
    }
    if (failed_at) *failed_at = -1;
    return NK_SUCCESS;
}
