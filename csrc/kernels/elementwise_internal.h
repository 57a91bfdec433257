/*
 * elementwise_internal.h - what elementwise.c shares with the per-ISA float32 loop files.
 *
 * An op runs on blocks of contiguous, already converted operands: float for the float16/bfloat16/
 * float32 common dtypes, double for float64, int64 for bool and the signed integers up to int64; bool
 * operands (where's condition, masked_fill's mask) and predicate results are uint8 0/1.
 */
#ifndef NEURON_ELEMENTWISE_INTERNAL_H
#define NEURON_ELEMENTWISE_INTERNAL_H

#include "kernels_internal.h"

/* Scalar arguments widened to each compute type. */
enum { NK_ARG_ALPHA = 0, NK_ARG_VALUE, NK_ARG_LO, NK_ARG_HI, NK_ARG_COUNT };
typedef struct nk_ew_args {
    float f32[NK_ARG_COUNT];
    double f64[NK_ARG_COUNT];
    int64_t i64[NK_ARG_COUNT];
    int32_t reduced; /* NK_BF16 / NK_F16 when that is the common dtype (for ops that round inside), else -1 */
} nk_ew_args;

/* out[i] = op(in[0][i], in[1][i], ...) for i < n; returns 0, or 1 for an integer division by zero. */
typedef int (*nk_ew_fn)(void *out, const void *const *in, int64_t n, const nk_ew_args *a);

/* One flat numbering of the unary, binary and ternary ops. */
#define NK_EW_UNARY(op) ((int)(op))
#define NK_EW_BINARY(op) ((int)NK_UNARY_COUNT + (int)(op))
#define NK_EW_TERNARY(op) ((int)NK_UNARY_COUNT + (int)NK_BINARY_COUNT + (int)(op))
#define NK_EW_OP_COUNT ((int)NK_UNARY_COUNT + (int)NK_BINARY_COUNT + (int)NK_TERNARY_COUNT)

/* Elements per block when operands go through conversion buffers (op functions themselves take any n:
 * rows whose operands are all usable in place are passed whole). */
#define NK_EW_BLOCK 512

typedef struct nk_ew_f32_table {
    const char *isa;
    nk_ew_fn fn[NK_EW_OP_COUNT];
    /* Contiguous conversions between float and the 16-bit float storage types (PyTorch's rounding). */
    /* Optional binary ops with in[1] (vs) or in[0] (sv) one value for the whole call (NULL: none). */
    nk_ew_fn vs[NK_BINARY_COUNT];
    nk_ew_fn sv[NK_BINARY_COUNT];
    void (*from_bf16)(float *dst, const uint16_t *src, int64_t n);
    void (*to_bf16)(uint16_t *dst, const float *src, int64_t n);
    void (*from_f16)(float *dst, const uint16_t *src, int64_t n);
    void (*to_f16)(uint16_t *dst, const float *src, int64_t n);
    /* Optional: the op on contiguous bfloat16 operands straight to a contiguous bfloat16 result, any n,
     * converting in registers (the blocked path's float buffers cost more than add or mul themselves). */
    nk_ew_fn bf16[NK_EW_OP_COUNT];
    /* Optional: those binary ops with the other operand one float (vs: in[1], sv: in[0]). */
    nk_ew_fn bf16_vs[NK_BINARY_COUNT];
    nk_ew_fn bf16_sv[NK_BINARY_COUNT];
} nk_ew_f32_table;

extern const nk_ew_f32_table nk_ew_f32_generic;
#if defined(__x86_64__) && defined(__GNUC__)
#define NK_EW_HAVE_X86 1
extern const nk_ew_f32_table nk_ew_f32_avx2;
extern const nk_ew_f32_table nk_ew_f32_avx512;
/* nk_ew_f32_avx512 with vcvtneps2bf16 for the bfloat16 rounding (CPUs with AVX512_BF16). */
extern const nk_ew_f32_table nk_ew_f32_avx512bf16;
#endif

/* The table for this machine (runtime dispatch, chosen once). */
const nk_ew_f32_table *nk_ew_f32_select(void);

#endif /* NEURON_ELEMENTWISE_INTERNAL_H */
