/*
 * kernels_internal.h - helpers shared by the kernel sources (and the C unit tests). Not installed,
 * not part of the contract with the ATen binding: only neuron_kernels.h is.
 */
#ifndef NEURON_KERNELS_INTERNAL_H
#define NEURON_KERNELS_INTERNAL_H

#include "neuron_kernels.h"

#include <math.h>
#include <string.h>

/* ---- bit casts (memcpy: the only aliasing-safe way in C; compilers turn it into a register move) ---- */

static inline uint32_t nk_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float nk_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/*
 * IEEE half <-> float. These are the FP16 library algorithms that c10::Half uses, so results (including
 * the canonical NaN 0x7E00 with the sign kept) match PyTorch bit for bit. They are branch-free so the
 * copy loops auto-vectorise. They rely on float arithmetic rounding to nearest-even without
 * flush-to-zero, which is the C default environment.
 */
static inline float nk_f16_to_f32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & UINT32_C(0x80000000);
    const uint32_t two_w = w + w;
    /* Normal halves: shift exponent+mantissa into float position, then rescale the exponent bias. */
    const uint32_t exp_offset = UINT32_C(0xE0) << 23;
    const float normalized = nk_f32_from_bits((two_w >> 4) + exp_offset) * 0x1.0p-112f;
    /* Subnormal halves: place the mantissa under a 0.5 exponent and subtract 0.5 exactly. */
    const uint32_t magic_mask = UINT32_C(126) << 23;
    const float denormalized = nk_f32_from_bits((two_w >> 17) | magic_mask) - 0.5f;
    const uint32_t denormalized_cutoff = UINT32_C(1) << 27;
    /* Mask select rather than ?: so GCC if-converts and vectorises the loops using this. */
    const uint32_t is_denormal = 0u - (uint32_t)(two_w < denormalized_cutoff);
    const uint32_t result =
        sign | (nk_f32_bits(denormalized) & is_denormal) | (nk_f32_bits(normalized) & ~is_denormal);
    return nk_f32_from_bits(result);
}

static inline uint16_t nk_f32_to_f16(float f) {
    /* Scaling up then down makes the FPU perform the round-to-nearest-even (and the overflow to
     * infinity) at half precision; the bias trick then extracts the rounded bits. */
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = nk_f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & UINT32_C(0x80000000);
    const uint32_t exp_bits_in = shl1_w & UINT32_C(0xFF000000);
    const uint32_t bias = exp_bits_in < UINT32_C(0x71000000) ? UINT32_C(0x71000000) : exp_bits_in;
    base = nk_f32_from_bits((bias >> 1) + UINT32_C(0x07800000)) + base;
    const uint32_t bits = nk_f32_bits(base);
    const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
    const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
    const uint32_t nonsign = exp_bits + mantissa_bits;
    const uint32_t is_nan = 0u - (uint32_t)(shl1_w > UINT32_C(0xFF000000));
    return (uint16_t)((sign >> 16) | (UINT32_C(0x7E00) & is_nan) | (nonsign & ~is_nan));
}

static inline float nk_bf16_to_f32(uint16_t b) {
    return nk_f32_from_bits((uint32_t)b << 16);
}

/* c10::BFloat16's round_to_nearest_even: NaN becomes the positive quiet NaN 0x7FC0. */
static inline uint16_t nk_f32_to_bf16(float f) {
    const uint32_t u = nk_f32_bits(f);
    const uint32_t rounded = (u + UINT32_C(0x7FFF) + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(((u & UINT32_C(0x7FFFFFFF)) > UINT32_C(0x7F800000)) ? UINT32_C(0x7FC0) : rounded);
}

/* An integer or bool element widened to int64 (bool as 0/1; uint64 reinterpreted); 0 for a float dtype. */
static inline int64_t nk_load_i64(const char *p, nk_dtype t) {
    switch (t) {
    case NK_BOOL: return *(const uint8_t *)p != 0;
    case NK_U8: return *(const uint8_t *)p;
    case NK_I8: return *(const int8_t *)p;
    case NK_I16: return *(const int16_t *)p;
    case NK_I32: return *(const int32_t *)p;
    case NK_I64: return *(const int64_t *)p;
    case NK_U16: return *(const uint16_t *)p;
    case NK_U32: return *(const uint32_t *)p;
    case NK_U64: return (int64_t)*(const uint64_t *)p;
    default: return 0;
    }
}

/* ---- descriptors ---- */

bool nk_dtype_valid(nk_dtype t);
/* Validates a descriptor and returns its element count; NK_INVALID for NULL, a bad dtype, ndim out of
 * [0, NK_MAX_DIMS], a negative size, an element count overflowing int64, or NULL data with numel > 0. */
nk_status nk_tensor_check(const nk_tensor *t, int64_t *numel);
bool nk_same_shape(const nk_tensor *a, const nk_tensor *b);

/*
 * An inner loop: dst[i*dst_stride] = (dst type) src[i*src_stride] for i < n, strides in elements.
 * For the same dtype it is a raw element copy (bit patterns kept, as PyTorch's same-dtype copy).
 */
typedef void (*nk_cast_fn)(void *dst, int64_t dst_stride, const void *src, int64_t src_stride, int64_t n);
nk_cast_fn nk_cast_get(nk_dtype dst, nk_dtype src);

/* One element of any dtype. The cast loops write through typed pointers, so a temporary element must
 * be accessed through the member of matching type (nk_elem_ptr) to respect C's aliasing rules. */
typedef union nk_elem {
    uint8_t u8;
    int8_t i8;
    int16_t i16;
    uint16_t u16;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    float f32;
    double f64;
} nk_elem;
void *nk_elem_ptr(nk_elem *e, nk_dtype t);

/* dst[i*dst_stride] = *value (elsize bytes) for i < n. */
void nk_fill_row(void *dst, int64_t dst_stride, const void *value, size_t elsize, int64_t n);

/*
 * Row iteration over one or two operands of equal shape. Dims of size 1 are dropped and adjacent dims
 * merged where every operand's strides allow it, so the innermost row is as long as possible. With
 * reorder (element-wise kernels whose order does not matter) negative strides of operand 0 are flipped
 * and dims sorted by operand 0's stride; without it logical row-major order is preserved (RNG).
 */
#define NK_ITER_MAX_OPS 2
typedef struct nk_iter {
    int32_t ndim;  /* >= 1: a scalar becomes one dim of size 1 */
    int32_t nops;
    int64_t sizes[NK_MAX_DIMS];
    int64_t strides[NK_ITER_MAX_OPS][NK_MAX_DIMS];
    char *base[NK_ITER_MAX_OPS];
    int64_t elsize[NK_ITER_MAX_OPS];
    int64_t rows;  /* number of innermost rows */
    int64_t idx[NK_MAX_DIMS];
    int64_t off[NK_ITER_MAX_OPS]; /* element offset of the current row's first element */
} nk_iter;

/* Operands must be valid, equally shaped and non-empty. */
void nk_iter_init(nk_iter *it, int32_t nops, const nk_tensor *const ops[], bool reorder);

static inline char *nk_iter_ptr(const nk_iter *it, int32_t op) {
    return it->base[op] + it->off[op] * it->elsize[op];
}

static inline int64_t nk_iter_inner_size(const nk_iter *it) {
    return it->sizes[it->ndim - 1];
}

static inline int64_t nk_iter_inner_stride(const nk_iter *it, int32_t op) {
    return it->strides[op][it->ndim - 1];
}

static inline void nk_iter_next_row(nk_iter *it) {
    for (int32_t d = it->ndim - 2; d >= 0; d--) {
        for (int32_t op = 0; op < it->nops; op++) it->off[op] += it->strides[op][d];
        if (++it->idx[d] < it->sizes[d]) return;
        for (int32_t op = 0; op < it->nops; op++) it->off[op] -= it->strides[op][d] * it->sizes[d];
        it->idx[d] = 0;
    }
}

/* ---- RNG ---- */

#define NK_PHILOX_M0 UINT32_C(0xD2511F53)
#define NK_PHILOX_M1 UINT32_C(0xCD9E8D57)
#define NK_PHILOX_W0 UINT32_C(0x9E3779B9)
#define NK_PHILOX_W1 UINT32_C(0xBB67AE85)

/* One Philox4x32-10 block (Random123 definition). */
void nk_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* Word p of the stream for seed (see neuron_kernels.h); slow, for tests and single draws. */
uint32_t nk_philox_word(uint64_t seed, uint64_t p);

/* Test hook (conv_direct.c): run nk_conv2d_few_out's blocks on the named family ("avx512", "avx2",
 * "generic"; "best" or NULL: the CPU's best); false if the CPU lacks it. */
bool nk_conv_few_isa_force(const char *name);

#endif /* NEURON_KERNELS_INTERNAL_H */
