/* dtype.c - dtype properties and descriptor validation. */
#include "kernels_internal.h"

static const size_t nk_dtype_sizes[NK_DTYPE_COUNT] = {
    [NK_BOOL] = 1, [NK_U8] = 1, [NK_I8] = 1,   [NK_I16] = 2,  [NK_I32] = 4,  [NK_I64] = 8, [NK_F16] = 2,
    [NK_BF16] = 2, [NK_F32] = 4, [NK_F64] = 8, [NK_U16] = 2, [NK_U32] = 4, [NK_U64] = 8,
};

/* PyTorch's Python spellings (torch.float16 ...), since these names end up in user-facing errors. */
static const char *const nk_dtype_names[NK_DTYPE_COUNT] = {
    [NK_BOOL] = "bool",   [NK_U8] = "uint8",     [NK_I8] = "int8",     [NK_I16] = "int16",
    [NK_I32] = "int32",   [NK_I64] = "int64",    [NK_F16] = "float16", [NK_BF16] = "bfloat16",
    [NK_F32] = "float32", [NK_F64] = "float64",  [NK_U16] = "uint16",  [NK_U32] = "uint32",
    [NK_U64] = "uint64",
};

bool nk_dtype_valid(nk_dtype t) {
    /* The enum's signedness is implementation-defined; compare as int so both bounds are checked. */
    return (int)t >= 0 && (int)t < (int)NK_DTYPE_COUNT;
}

size_t nk_dtype_size(nk_dtype t) {
    return nk_dtype_valid(t) ? nk_dtype_sizes[t] : 0;
}

const char *nk_dtype_name(nk_dtype t) {
    return nk_dtype_valid(t) ? nk_dtype_names[t] : "unknown";
}

/* Returns -1 for a descriptor that has no well-defined element count (bad ndim, negative size,
 * overflow), so callers that only want a count need not run the full check. */
int64_t nk_tensor_numel(const nk_tensor *t) {
    if (t == NULL || t->ndim < 0 || t->ndim > NK_MAX_DIMS) return -1;
    int64_t n = 1;
    bool zero = false;
    for (int32_t d = 0; d < t->ndim; d++) {
        const int64_t s = t->sizes[d];
        if (s < 0) return -1;
        if (s == 0) zero = true;
        /* Keep multiplying non-zero sizes to detect overflow even when a later size is 0: such a
         * shape is still nonsense as a descriptor. */
        if (s > 0 && n > INT64_MAX / s) return -1;
        if (s > 0) n *= s;
    }
    return zero ? 0 : n;
}

nk_status nk_tensor_check(const nk_tensor *t, int64_t *numel) {
    if (t == NULL || !nk_dtype_valid(t->dtype)) return NK_INVALID;
    const int64_t n = nk_tensor_numel(t);
    if (n < 0) return NK_INVALID;
    if (n > 0 && t->data == NULL) return NK_INVALID;
    *numel = n;
    return NK_SUCCESS;
}

bool nk_same_shape(const nk_tensor *a, const nk_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int32_t d = 0; d < a->ndim; d++)
        if (a->sizes[d] != b->sizes[d]) return false;
    return true;
}
