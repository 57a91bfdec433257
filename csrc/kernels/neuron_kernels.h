/*
 * neuron_kernels.h - the TorchNeuron kernel library (C11). The only public header of csrc/kernels.
 *
 * Kernels take tensor descriptors (data pointer, dtype, sizes, strides in elements) and never allocate
 * device memory. Results match PyTorch's CPU kernels: same casting rules, same rounding
 * (round-to-nearest-even for float -> bfloat16/half), NaN propagated.
 */
#ifndef NEURON_KERNELS_H
#define NEURON_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nk_status {
    NK_SUCCESS = 0,
    NK_INVALID = 2,      /* bad descriptor: too many dims, negative size, shape mismatch */
    NK_UNSUPPORTED = 15, /* dtype (or dtype pair) not implemented: the caller falls back or raises */
    NK_NO_MEMORY = 17,   /* host scratch memory could not be allocated */
    NK_NEG_INT_POWER = 33, /* an integer to a negative integer power (numpy raises ValueError): the caller raises */
} nk_status;

typedef enum nk_dtype {
    NK_BOOL = 0,
    NK_U8,
    NK_I8,
    NK_I16,
    NK_I32,
    NK_I64,
    NK_F16,
    NK_BF16,
    NK_F32,
    NK_F64,
    NK_U16,
    NK_U32,
    NK_U64,
    NK_DTYPE_COUNT
} nk_dtype;

#define NK_MAX_DIMS 16

typedef struct nk_tensor {
    void *data;                     /* address of element [0,...,0] (storage offset already applied) */
    nk_dtype dtype;
    int32_t ndim;                   /* 0 = scalar */
    int64_t sizes[NK_MAX_DIMS];
    int64_t strides[NK_MAX_DIMS];   /* in elements; 0 for broadcast dimensions; may be negative */
} nk_tensor;

size_t nk_dtype_size(nk_dtype t);
const char *nk_dtype_name(nk_dtype t);
int64_t nk_tensor_numel(const nk_tensor *t);

/* A scalar as PyTorch passes it: the kernel converts it to the destination dtype. */
typedef struct nk_scalar {
    bool is_float;  /* true: use f, else i */
    double f;
    int64_t i;
} nk_scalar;

/*
 * dst[...] = (dst dtype) src[...]. src has dst's ndim and sizes; a broadcast source has stride 0 in
 * the expanded dims. Any pair of dtypes above. Overlap between dst and src is not allowed unless they
 * are the same memory with the same layout.
 */
nk_status nk_copy(const nk_tensor *dst, const nk_tensor *src);
/* dst[...] = value converted to dst's dtype. */
nk_status nk_fill(const nk_tensor *dst, nk_scalar value);

/*
 * Random numbers from a Philox4x32-10 counter-based generator keyed by seed.
 * The generator's stream is a sequence of 32-bit words; word p is lane p % 4 of the block with counter
 * p / 4. A kernel filling n elements that needs w words per element uses words offset + i*w ... in
 * logical row-major order of dst, and advances *offset by n*w rounded up to a multiple of 4. So a
 * result depends only on (seed, offset, shape), never on strides or threads, and a slice of a tensor
 * drawn at offset + k equals the corresponding slice of the whole.
 * Words per element: uniform/bernoulli/random(range <= 2^32) 1 (2 for float64 and for larger ranges);
 * normal 2 (Box-Muller, one value per pair).
 * Float dtypes only for uniform/normal/bernoulli-with-probability-tensor; random accepts every dtype.
 */
nk_status nk_rng_uniform(const nk_tensor *dst, uint64_t seed, uint64_t *offset, double from, double to);
nk_status nk_rng_normal(const nk_tensor *dst, uint64_t seed, uint64_t *offset, double mean, double std);
/* dst = (u < p) for a scalar p; dst may be any dtype (bool, ints, floats). */
nk_status nk_rng_bernoulli(const nk_tensor *dst, uint64_t seed, uint64_t *offset, double p);
/* dst = (u < p[...]); p is broadcast to dst (stride 0 dims) and is a float dtype. */
nk_status nk_rng_bernoulli_tensor(const nk_tensor *dst, const nk_tensor *p, uint64_t seed, uint64_t *offset);
/* Integers uniform in [from, from + range) (range >= 1), converted to dst's dtype. For floats PyTorch's
 * random_() without bounds uses range 2^mantissa+1; the caller passes that range. */
nk_status nk_rng_random(const nk_tensor *dst, uint64_t seed, uint64_t *offset, int64_t from, uint64_t range);
/* dst (1-D, n elements, int/float dtype) = a uniformly random permutation of 0..n-1 (Fisher-Yates). */
nk_status nk_rng_randperm(const nk_tensor *dst, int64_t n, uint64_t seed, uint64_t *offset);

/* ---- matrix multiplication (gemm.c and its per-ISA micro-kernels) ------------------------------ */
/*
 * out = beta * self + alpha * (a @ b), with fp32 accumulation and one rounding to the output dtype.
 * Either all of out [M, N], a [M, K], b [K, N] are 2-D, or all are 3-D with a leading batch dim
 * (any batch strides, 0 included). Any row/column strides: transposed views need no copy. self has
 * out's shape (a broadcast bias has stride 0 where it is expanded) or is NULL, meaning out itself
 * (in-place accumulation). beta == 0 never reads self, so NaN there does not propagate; K == 0 gives
 * beta * self. out must not overlap a, b or (unless it is self) self.
 * Dtypes: F32, BF16, F16 (all operands alike); F64 on a plain loop. Others: NK_UNSUPPORTED.
 */
nk_status nk_gemm(const nk_tensor *out, const nk_tensor *a, const nk_tensor *b, const nk_tensor *self, double alpha,
                  double beta);
/*
 * 2-D convolution as GEMM. img is one image [C, H, W] (any strides), col a [C*kh*kw, OH*OW] matrix with
 * unit column stride, OH/OW from PyTorch's output-size rule. im2col: col[(c*kh + i)*kw + j, oh*OW + ow] =
 * img[c, oh*sh - ph + i*dh, ow*sw - pw + j*dw], 0 in the padding (any dtype of one element size).
 * col2im, its adjoint: img = the sum of the col entries that read each element (F32, BF16, F16; col of
 * img's dtype, summed tap by tap in that dtype as PyTorch's CPU kernel does, or F32, rounded once).
 * Both NK_INVALID on a shape mismatch.
 */
nk_status nk_im2col(const nk_tensor *col, const nk_tensor *img, const int64_t kernel[2], const int64_t stride[2],
                    const int64_t padding[2], const int64_t dilation[2]);
nk_status nk_col2im(const nk_tensor *img, const nk_tensor *col, const int64_t kernel[2], const int64_t stride[2],
                    const int64_t padding[2], const int64_t dilation[2]);
/*
 * out = conv2d(in, weight) + bias for a 3x3 kernel, stride 1, dilation 1, zero padding `padding` (rows, cols),
 * by Winograd's F(4x4, 3x3) (conv_winograd.c). in [N, C, H, W], weight [OC, C, 3, 3], out [N, OC, H + 2*ph - 2,
 * W + 2*pw - 2], bias [OC] or NULL; any strides (channels-last and permuted views need no copy). One dtype
 * for all of them, F32, BF16 or F16 (else NK_UNSUPPORTED): bf16/fp16 are widened to fp32, computed in fp32 and
 * rounded once into out. NK_INVALID on a shape mismatch; NK_NO_MEMORY without host scratch (the transformed
 * weight, 36 * OC * C floats, and a block of transformed tiles per thread). Not bit-equal to a direct
 * convolution: the transforms add a rounding error that grows with the values' spread (see DEVELOPING.md).
 */
nk_status nk_conv3x3_winograd(const nk_tensor *out, const nk_tensor *in, const nk_tensor *weight,
                              const nk_tensor *bias, const int64_t padding[2]);
/*
 * The same convolution split in two, for a weight used by many calls: nk_conv3x3_winograd_weight transforms
 * weight [OC, C, 3, 3] (F32/BF16/F16, any strides) into u, a 64-byte aligned buffer of at least
 * nk_conv3x3_winograd_weight_bytes(OC, C) bytes (fp32 values plus a header naming the shape and micro-kernel);
 * nk_conv3x3_winograd_pretransformed then runs on it for in/out/bias of one float dtype (any of the three,
 * whatever the weight's was). A u made for other channel counts or another micro-kernel family: NK_INVALID.
 * Results equal nk_conv3x3_winograd's bit for bit.
 */
size_t nk_conv3x3_winograd_weight_bytes(int64_t oc, int64_t c);
nk_status nk_conv3x3_winograd_weight(void *u, size_t bytes, const nk_tensor *weight);
nk_status nk_conv3x3_winograd_pretransformed(const nk_tensor *out, const nk_tensor *in, const void *u, size_t bytes,
                                             const nk_tensor *bias, const int64_t padding[2]);
/*
 * out = conv2d(in, weight) + bias, stride 1, any kernel size, zero padding and dilation (rows, cols), directly
 * (conv_direct.c): for few output channels (a VAE's conv_out, 128 -> 3), where a GEMM's operand would be only
 * OC rows tall. in [N, C, H, W], weight [OC, C, kh, kw], out [N, OC, OH, OW], bias [OC] or NULL, any strides;
 * one dtype, F32/BF16/F16 (else NK_UNSUPPORTED), summed in fp32 and rounded once. NK_INVALID on a shape
 * mismatch, NK_NO_MEMORY without host scratch (the weight in fp32, a few rows per task).
 */
nk_status nk_conv2d_few_out(const nk_tensor *out, const nk_tensor *in, const nk_tensor *weight,
                            const nk_tensor *bias, const int64_t padding[2], const int64_t dilation[2]);
/* The micro-kernel family in use ("avx512", "avx2", "generic"). */
const char *nk_gemm_isa_name(void);
/* Measured fp32 FMA throughput of this machine on all pool threads (GFLOP/s): a register-only FMA
 * loop, the ceiling a GEMM can approach. 0 when no SIMD FMA is available. Takes ~0.1 s. */
double nk_fma_peak_gflops(void);
/* Measured bf16 multiply-add throughput on all pool threads (GFLOP/s, 2 per product) on the instruction the
 * bf16 GEMM uses here: AMX tiles, else AVX512-BF16 dot products where they outrun the FMAs, else the fp32
 * FMA peak (the products widen into the fp32 kernels); *method (if not NULL) names it ("amx", "avx512_bf16",
 * "fp32_fma", or "none" with 0 where the CPU has no bf16 instruction). Takes ~0.1 s. */
double nk_bf16_peak_gflops(const char **method);

/* ---- recurrent cells (rnn.c) --------------------------------------------------------------------- */
/*
 * PyTorch's fused LSTM and GRU cells on [B, G*H] gate matrices (any strides), biases [G*H] or NULL. All
 * operands of one dtype (F32, BF16, F16; others NK_UNSUPPORTED); math in fp32, each output rounded once.
 * LSTM: gates = ig + hg + bi + bh in chunks i, f, g, o; i, f, o sigmoid, g tanh; cy = f*cx + i*g,
 *   hy = o*tanh(cy); ws [B, 4H] holds the activated gates. Backward: grad_gates [B, 4H] (before the
 *   activations) and grad_cx from grad_hy and grad_cy (either NULL: zero), cx, cy and ws.
 * GRU: chunks r, z, n: r, z = sigmoid(ig + bi + hg + bh), n = tanh(ig_n + bi_n + r*(hg_n + bh_n)),
 *   hy = n + z*(hx - n); ws [B, 5H] holds r, z, n, hx, hg_n + bh_n. Backward: grad_ig, grad_hg [B, 3H]
 *   and grad_hx from grad_hy and ws.
 * NK_INVALID on a shape or dtype mismatch.
 */
nk_status nk_lstm_cell(const nk_tensor *hy, const nk_tensor *cy, const nk_tensor *ws, const nk_tensor *ig,
                       const nk_tensor *hg, const nk_tensor *cx, const nk_tensor *bi, const nk_tensor *bh);
nk_status nk_lstm_cell_backward(const nk_tensor *grad_gates, const nk_tensor *grad_cx, const nk_tensor *grad_hy,
                                const nk_tensor *grad_cy, const nk_tensor *cx, const nk_tensor *cy,
                                const nk_tensor *ws);
nk_status nk_gru_cell(const nk_tensor *hy, const nk_tensor *ws, const nk_tensor *ig, const nk_tensor *hg,
                      const nk_tensor *hx, const nk_tensor *bi, const nk_tensor *bh);
nk_status nk_gru_cell_backward(const nk_tensor *grad_ig, const nk_tensor *grad_hg, const nk_tensor *grad_hx,
                               const nk_tensor *grad_hy, const nk_tensor *ws);

/* ---- elementwise: unary, binary, activations and their backward (elementwise.c) ------------------ */

/*
 * Operands of an element-wise op after broadcasting, laid out as PyTorch's TensorIterator does:
 * operand 0 is the output, then the inputs; dims are ordered fastest first; strides are in BYTES
 * (0 for a broadcast dim, may be negative). Operands may have different dtypes: every input is first
 * converted to `common` (PyTorch's common dtype), the op computes in float for float16/bfloat16/float32,
 * double for float64 and int64 for bool/uint8/int8/int16/int32/int64, and the result is rounded to
 * `common` (bool for predicates) and then converted to the output's dtype. Other common dtypes return
 * NK_UNSUPPORTED. The output may be the same memory as an input with the same layout (in-place ops),
 * never a partial overlap.
 */
#define NK_EW_MAX_OPS 4
typedef struct nk_ew_iter {
    int32_t ndim;                           /* 0 = a single element */
    int32_t nops;                           /* output + inputs */
    int64_t sizes[NK_MAX_DIMS];
    void *data[NK_EW_MAX_OPS];
    nk_dtype dtype[NK_EW_MAX_OPS];
    int64_t strides[NK_EW_MAX_OPS][NK_MAX_DIMS];
    nk_dtype common;
} nk_ew_iter;

/*
 * Scalar arguments, already converted by the caller as PyTorch does (e.g. to the common dtype), so the
 * kernel only widens them to the compute type.
 */
typedef struct nk_ew_params {
    nk_scalar alpha;   /* NK_ADD: a + alpha * b, fused as PyTorch's CPU kernel */
    nk_scalar value;   /* b of a binary op given without operand b (nops == 2); pow exponent; fill value
                          of NK_MASKED_FILL; threshold of NK_THRESHOLD_BACKWARD */
    nk_scalar lo, hi;  /* NK_CLAMP bounds, used when has_lo / has_hi */
    bool has_lo, has_hi;
} nk_ew_params;

typedef enum nk_unary_op {
    NK_NEG = 0,
    NK_ABS,
    NK_EXP,
    NK_LOG,
    NK_SQRT,
    NK_RSQRT,
    NK_RECIPROCAL,
    NK_SIN,
    NK_COS,
    NK_TANH,
    NK_SIGMOID,
    NK_SILU,
    NK_GELU,           /* x * Phi(x), with erf */
    NK_GELU_TANH,      /* the tanh approximation */
    NK_RELU,
    NK_CLAMP,          /* bounds from params; NaN propagates */
    NK_POW_SCALAR,     /* x ** params.value */
    NK_LOGICAL_NOT,    /* predicate */
    NK_BITWISE_NOT,    /* integers; use NK_LOGICAL_NOT for bool */
    NK_UNARY_COUNT
} nk_unary_op;

typedef enum nk_binary_op {
    NK_ADD = 0,        /* a + alpha * b */
    NK_MUL,
    NK_DIV,            /* true division (float common dtype) */
    NK_DIV_TRUNC,
    NK_DIV_FLOOR,
    NK_EQ, NK_NE, NK_LT, NK_LE, NK_GT, NK_GE,               /* predicates */
    NK_LOGICAL_AND, NK_LOGICAL_OR, NK_LOGICAL_XOR,          /* predicates */
    NK_BITWISE_AND, NK_BITWISE_OR, NK_BITWISE_XOR,          /* bool and integers */
    NK_POW,
    NK_MAXIMUM, NK_MINIMUM,                                  /* NaN propagates */
    NK_MASKED_FILL,         /* (a, mask) -> mask ? params.value : a; mask is read as bool */
    NK_SILU_BACKWARD,       /* (grad, x) */
    NK_GELU_BACKWARD,       /* (grad, x) */
    NK_GELU_TANH_BACKWARD,  /* (grad, x) */
    NK_SIGMOID_BACKWARD,    /* (grad, y) with y = sigmoid(x) */
    NK_TANH_BACKWARD,       /* (grad, y) with y = tanh(x) */
    NK_THRESHOLD_BACKWARD,  /* (x, grad) -> x <= params.value ? 0 : grad */
    NK_BINARY_COUNT
} nk_binary_op;

typedef enum nk_ternary_op {
    NK_WHERE = 0,      /* (cond, a, b) -> cond ? a : b; cond is read as bool */
    NK_CLAMP_TENSOR,   /* (x, lo, hi) -> NaN if any is NaN, else min(max(x, lo), hi) */
    NK_TERNARY_COUNT
} nk_ternary_op;

/* NK_INVALID: bad iterator (operand count, dims, dtypes); NK_UNSUPPORTED: the op has no kernel for the
 * common dtype; NK_DIV_BY_ZERO: integer division by zero (PyTorch raises ZeroDivisionError). Work is
 * split over nk_parallel_for. */
#define NK_DIV_BY_ZERO ((nk_status)16)
nk_status nk_unary(nk_unary_op op, const nk_ew_iter *it, const nk_ew_params *p);
nk_status nk_binary(nk_binary_op op, const nk_ew_iter *it, const nk_ew_params *p);
nk_status nk_ternary(nk_ternary_op op, const nk_ew_iter *it, const nk_ew_params *p);
/* The instruction set the float kernels use: "avx512", "avx2" or "generic". */
const char *nk_ew_isa(void);

/* ---- reductions, softmax and norms (reduce.c, norm.c) ---------------------------------------------- */
/*
 * Reductions. `out` has in's ndim with size 1 in every reduced dim (bit d of `dims` set; a keepdim view of
 * the result) and in's size elsewhere; any strides. Float inputs (f32/bf16/f16) accumulate in float blocks
 * combined in double, f64 in double, integer sums in int64 (wrapping). NaN propagates through max/min/sum;
 * any/all treat NaN as true. Empty reductions are left to the caller (PyTorch raises for max/min of nothing).
 * dtypes: sum/mean: float in -> float out, or integer/bool in -> integer out; amax/amin: float or integers up
 * to 32 bits, out of in's dtype; logsumexp/var: float only; any/all: every dtype, out bool or uint8.
 */
typedef enum nk_reduce_op {
    NK_REDUCE_SUM = 0,
    NK_REDUCE_MEAN,      /* sum rounded to the accumulation type, then divided by the count */
    NK_REDUCE_AMAX,
    NK_REDUCE_AMIN,
    NK_REDUCE_ANY,
    NK_REDUCE_ALL,
    NK_REDUCE_LOGSUMEXP, /* log(sum(exp(x - m))) + m, m the max (0 when it is infinite) */
} nk_reduce_op;
nk_status nk_reduce(const nk_tensor *out, const nk_tensor *in, uint64_t dims, nk_reduce_op op);
/* Max (or min) with the index of its first occurrence (of the first NaN, if any) over `dims` taken in
 * logical row-major order; values and/or indices (int64) may be NULL. Float dtypes. */
nk_status nk_reduce_arg(const nk_tensor *values, const nk_tensor *indices, const nk_tensor *in, uint64_t dims,
                        bool is_max);
/* Variance sum((x - mean)^2) / max(0, n - correction), its square root when take_sqrt; mean (may be
 * NULL) receives the mean. Float dtypes, outputs of in's dtype. */
nk_status nk_reduce_var(const nk_tensor *var, const nk_tensor *mean, const nk_tensor *in, uint64_t dims,
                        double correction, bool take_sqrt);
/* Inclusive prefix sum along dim; out has in's shape. Floats accumulate in double, integers in int64;
 * the output dtype may differ (float out for a float in, integer out for an integer in). */
nk_status nk_cumsum(const nk_tensor *out, const nk_tensor *in, int32_t dim);

/* softmax / log_softmax along dim; out has in's shape, dtype f32/bf16/f16 (out may be f32 for a half
 * input: half_to_float). */
nk_status nk_softmax(const nk_tensor *out, const nk_tensor *in, int32_t dim, bool log);
/* grad_in = y * (g - sum(g * y)) for softmax, g - exp(y) * sum(g) for log_softmax, y the forward
 * output. */
nk_status nk_softmax_backward(const nk_tensor *grad_in, const nk_tensor *grad_out, const nk_tensor *out,
                              int32_t dim, bool log);

/*
 * Norms over contiguous [M, N] rows (layer/RMS) or [N, C, HxW] blocks (group). x/y/dx/dy f32, bf16 or
 * f16; weight/bias (optional: NULL) of x's dtype or f32; mean/rstd of x's dtype or f32, M (or N*group)
 * elements. Statistics in float: mean, rstd = 1/sqrt(var + eps) with the biased variance.
 */
nk_status nk_layer_norm(const nk_tensor *y, const nk_tensor *mean, const nk_tensor *rstd, const nk_tensor *x,
                        const nk_tensor *weight, const nk_tensor *bias, int64_t M, int64_t N, double eps);
/* dx, dweight, dbias may be NULL (not wanted). */
nk_status nk_layer_norm_backward(const nk_tensor *dx, const nk_tensor *dweight, const nk_tensor *dbias,
                                 const nk_tensor *dy, const nk_tensor *x, const nk_tensor *mean,
                                 const nk_tensor *rstd, const nk_tensor *weight, int64_t M, int64_t N);
/* y = x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps) (f32). */
nk_status nk_rms_norm(const nk_tensor *y, const nk_tensor *rstd, const nk_tensor *x, const nk_tensor *weight,
                      int64_t M, int64_t N, double eps);
nk_status nk_rms_norm_backward(const nk_tensor *dx, const nk_tensor *dweight, const nk_tensor *dy,
                               const nk_tensor *x, const nk_tensor *rstd, const nk_tensor *weight, int64_t M,
                               int64_t N);
nk_status nk_group_norm(const nk_tensor *y, const nk_tensor *mean, const nk_tensor *rstd, const nk_tensor *x,
                        const nk_tensor *weight, const nk_tensor *bias, int64_t N, int64_t C, int64_t HxW,
                        int64_t group, double eps);
nk_status nk_group_norm_backward(const nk_tensor *dx, const nk_tensor *dweight, const nk_tensor *dbias,
                                 const nk_tensor *dy, const nk_tensor *x, const nk_tensor *mean,
                                 const nk_tensor *rstd, const nk_tensor *weight, int64_t N, int64_t C,
                                 int64_t HxW, int64_t group);

/*
 * Negative log likelihood over input [N, C] (or [C]) of a float dtype, target [N] (or []) int64,
 * weight [C] (NULL: ones). reduction 0 none (out [N]), 1 mean, 2 sum (out []); total_weight [] the sum
 * of the weights of non-ignored targets. A target outside [0, C) other than ignore_index returns
 * NK_INVALID with it in *bad_target.
 */
nk_status nk_nll_loss(const nk_tensor *out, const nk_tensor *total_weight, const nk_tensor *input,
                      const nk_tensor *target, const nk_tensor *weight, int32_t reduction, int64_t ignore_index,
                      int64_t *bad_target);
/* grad_input [N, C] (written entirely) from grad_output ([N] for none, [] otherwise). */
nk_status nk_nll_loss_backward(const nk_tensor *grad_input, const nk_tensor *grad_output, const nk_tensor *target,
                               const nk_tensor *weight, int32_t reduction, int64_t ignore_index,
                               const nk_tensor *total_weight, int64_t *bad_target);

/* ---- attention, indexing and losses (attention.c, index.c) ----------------------------------------- */

/*
 * Scaled dot-product attention, blockwise with an online softmax (no Lq x Lk score matrix).
 * q [B,Hq,Lq,D], k [B,Hkv,Lk,D], v [B,Hkv,Lk,Dv]: one float dtype (f32, bf16, f16), any strides;
 * Hq is a multiple of Hkv and query head h reads key/value head h / (Hq/Hkv) (grouped-query attention
 * without copies). Computation is in fp32.
 * mask: NULL or a 4-D tensor of sizes [B,Hq,Lq,Lk] (broadcast dims have stride 0): bool (true = attend)
 * or a float dtype added to the scores. causal: query i attends keys j <= i (top-left aligned, as
 * PyTorch's tril mask). Rows with no key to attend give zeros (and lse = -inf).
 * Dropout (p > 0) keeps a probability with Philox word w = offset + ((b*Hq + h)*Lq + i)*Lk + j of the
 * stream for seed when w * 2^-32 < 1 - p, scaling kept ones by 1/(1-p); the caller advances its offset
 * by B*Hq*Lq*Lk rounded up to 4. The backward regenerates the same mask from (seed, offset).
 */
typedef struct nk_sdpa_args {
    const nk_tensor *q, *k, *v;
    const nk_tensor *mask; /* may be NULL */
    double scale;
    bool causal;
    double dropout_p;
    uint64_t seed, offset;
} nk_sdpa_args;
/* out [B,Hq,Lq,Dv] in q's dtype; lse [B,Hq,Lq] float32: log of the softmax normaliser (scores scaled). */
nk_status nk_sdpa_forward(const nk_sdpa_args *a, const nk_tensor *out, const nk_tensor *lse);
/* Gradients from the forward's out and lse. dq/dk/dv shaped like q/k/v (q's dtype); dmask NULL or a
 * float32 [B,Hq,Lq,Lk] tensor receiving the gradient of the scores (that of an additive float mask
 * before it is summed over its broadcast dims). Recomputes scores blockwise. */
nk_status nk_sdpa_backward(const nk_sdpa_args *a, const nk_tensor *out, const nk_tensor *lse,
                           const nk_tensor *grad_out, const nk_tensor *dq, const nk_tensor *dk,
                           const nk_tensor *dv, const nk_tensor *dmask);

/*
 * Indexing (index.c). Index tensors are int32 or int64, any strides; `dim` is already wrapped.
 * Indices must lie in [0, size): a kernel that meets one outside returns NK_INVALID with *bad set to
 * it (the caller initialises *bad to INT64_MIN, so a descriptor error leaves it unchanged). Indices
 * are all checked before anything is written. Source and destination have the same dtype.
 */
/* dst = src.index_select(dim, index): dst.sizes = src.sizes with dim replaced by numel(index);
 * index is 1-D or a scalar. */
nk_status nk_index_select(const nk_tensor *dst, const nk_tensor *src, int32_t dim, const nk_tensor *index,
                          int64_t *bad);
/* dst.index_copy_(dim, index, src): slice i of src along dim goes to slice index[i] of dst (a later
 * duplicate wins). */
nk_status nk_index_copy(const nk_tensor *dst, int32_t dim, const nk_tensor *index, const nk_tensor *src,
                        int64_t *bad);
/* dst.index_add_(dim, index, src, alpha=alpha): duplicates accumulate in index order. Float and
 * integer dtypes (not bool); integer dtypes use alpha converted to int64. */
nk_status nk_index_add(const nk_tensor *dst, int32_t dim, const nk_tensor *index, const nk_tensor *src,
                       nk_scalar alpha, int64_t *bad);
/* dst = src.gather(dim, index): dst and index have one shape; index.size(d) <= src.size(d) for d != dim. */
nk_status nk_gather(const nk_tensor *dst, const nk_tensor *src, int32_t dim, const nk_tensor *index, int64_t *bad);
/* dst.scatter_(dim, index, src) (src != NULL) or with a scalar value (src == NULL); accumulate adds
 * instead of assigning (scatter_add_, reduce="sum"/"add"). Elements are visited in index order, so a
 * later duplicate wins when assigning. */
nk_status nk_scatter(const nk_tensor *dst, int32_t dim, const nk_tensor *index, const nk_tensor *src,
                     nk_scalar value, bool accumulate, int64_t *bad);
/* grad_weight [V, D] = embedding backward of grad [N, D] for indices [N]: rows of index padding_idx
 * are skipped; with scale_by_freq each row is divided by the count of its index. grad_weight is
 * overwritten (zeroed first). Float dtypes. */
nk_status nk_embedding_backward(const nk_tensor *grad_weight, const nk_tensor *grad, const nk_tensor *indices,
                                int64_t padding_idx, bool scale_by_freq, int64_t *bad);
/*
 * Advanced indexing with n adjacent index tensors (int32/int64, one shape B, broadcast with stride 0)
 * on dims first .. first+n-1 of self. The indexed view has shape self[:first] + B + self[first+n:]:
 * element (pre, b, post) is self[pre, i0[b], ..., i(n-1)[b], post]. Negative indices count from the
 * end; one outside [-size, size) gives NK_INVALID with it in *bad and its dim of self in *bad_dim,
 * before anything is written.
 * nk_index_gather: dst (the indexed shape) = self[...]. nk_index_put: self[...] = values (the indexed
 * shape, may broadcast with stride 0), in row-major order of the indexed shape, so the last duplicate
 * wins; accumulate adds instead (dtypes of nk_index_add) in that order.
 */
nk_status nk_index_gather(const nk_tensor *dst, const nk_tensor *src, int32_t first, int32_t n,
                          const nk_tensor *const *indices, int64_t *bad, int32_t *bad_dim);
nk_status nk_index_put(const nk_tensor *dst, const nk_tensor *values, int32_t first, int32_t n,
                       const nk_tensor *const *indices, bool accumulate, int64_t *bad, int32_t *bad_dim);
/* dst = cat(srcs, dim): srcs[i] fills dst's slices along dim in order, converted to dst's dtype;
 * every source has dst's sizes except along dim (sizes there sum to dst's). Sources must not overlap
 * dst. */
nk_status nk_cat(const nk_tensor *dst, const nk_tensor *const *srcs, int64_t n, int32_t dim);

/* ---- sorting and position-dependent ops (sort.c, layout.c) ---------------------------------------- */
/*
 * Sort along dim (any dtype): values (in's dtype) and/or indices (int64) have in's shape; either may be
 * NULL; neither may overlap in. The order is that of PyTorch's stable sort: NaN after everything when
 * ascending and before everything when descending, all NaNs equal, -0.0 equal to 0.0, equal elements
 * in input order. Values keep their bit patterns. A 0-d in needs dim 0.
 */
nk_status nk_sort(const nk_tensor *values, const nk_tensor *indices, const nk_tensor *in, int32_t dim,
                  bool descending);
/* nk_sort with the tie order of the CPU's non-stable sort for dtypes it sorts with the C++ library's
 * introsort (all but float32/float64/int32/int64, which it sorts with a vectorised quicksort): the same
 * values in the same order as nk_sort, equal elements arranged as that algorithm leaves them. */
nk_status nk_sort_unstable(const nk_tensor *values, const nk_tensor *indices, const nk_tensor *in, int32_t dim,
                           bool descending);
/* The first k results of nk_sort (descending when largest), so always sorted, ties in input order:
 * outputs have in's shape with k along dim (0 <= k <= size). */
nk_status nk_topk(const nk_tensor *values, const nk_tensor *indices, const nk_tensor *in, int32_t dim, int64_t k,
                  bool largest);
/* Number of nonzero elements (a float is zero when +0.0 or -0.0; NaN is nonzero); any dtype. */
nk_status nk_nonzero_count(const nk_tensor *in, int64_t *count);
/* out [count, in.ndim] int64 (any strides): the coordinates of in's nonzeros in row-major order.
 * NK_INVALID when count differs from nk_nonzero_count's. */
nk_status nk_nonzero(const nk_tensor *out, const nk_tensor *in);
/* out = tril(in, k) (upper: triu) over the last two dims; out and in have one shape and dtype (any) and
 * are either separate or the same memory with the same layout (in place). */
nk_status nk_triangle(const nk_tensor *out, const nk_tensor *in, int64_t k, bool upper);
/* out (1-D, any dtype) [i] = start + i * step computed in int64 (wrapping), converted to out's dtype. */
nk_status nk_arange(const nk_tensor *out, int64_t start, int64_t step);
/* out (bool, elements' shape) = whether each element equals some element of test (invert: does not);
 * elements and test share one dtype; NaN equals nothing, -0.0 equals 0.0. */
nk_status nk_isin(const nk_tensor *out, const nk_tensor *elements, const nk_tensor *test, bool invert);

/* ---- histogram (histogram.c) ------------------------------------------------------------------ */
/*
 * torch.histc of an integer tensor (uint8, int8, int16, int32, int64) into hist (1-D, bins elements, the
 * same dtype, any stride), with CUDA's rules: min == max means the data's range, widened by 1 each side
 * when still empty; bin = (v - min) * bins / (max - min) in exact integer arithmetic, v == max in the last
 * bin, values outside [min, max] ignored. counts is a caller workspace of bins int64 values.
 * NK_UNSUPPORTED for other dtypes, NK_INVALID for min > max or a bad hist.
 */
nk_status nk_histc_int(const nk_tensor *hist, const nk_tensor *src, int64_t min, int64_t max, int64_t *counts);

/* ---- NKI kernel executor (nki_exec.c) ------------------------------------------------------------ */
/*
 * Replays the instruction list the `nki` package traced from an NKI kernel (one list per kernel, grid and
 * argument shapes/dtypes/strides). Python decomposes every NKI instruction into these steps (temporaries,
 * fp32 staging, accumulate flags resolved at trace time), so the executor is a loop over library calls.
 * Operands address memory as bases[region] + offset (bytes), with element strides; regions are the
 * executor's on-chip arena, the constant pool, the kernel's arguments and the HBM tensors it allocates.
 * Layout shared with nki/_compile.py (checked there against nkx_layout()).
 */
#define NKX_MAX_DIMS 6
typedef struct nkx_operand {
    int32_t region;
    int32_t dtype;                   /* nk_dtype */
    int32_t ndim;
    int32_t pad;                     /* in a fused group: 1 + the scratch slot of a tile only the group touches */
    int64_t offset;                  /* bytes from bases[region] */
    int64_t sizes[NKX_MAX_DIMS];
    int64_t strides[NKX_MAX_DIMS];   /* elements */
} nkx_operand;

typedef enum nkx_kind {
    NKX_FILL = 0,    /* o0 = value (already representable in o0's dtype) */
    NKX_COPY,        /* o0 = (o0 dtype) o1, same sizes (o1 may broadcast with stride 0) */
    NKX_UNARY,       /* o0 = op(o1), op an nk_unary_op, computed in fp32 */
    NKX_BINARY,      /* o0 = op(o1, o2), op an nk_binary_op (NK_ADD with alpha = value), computed in fp32 */
    NKX_GEMM,        /* o0 [M, N] f32 = (flags & 1 ? o0 : 0) + o1 [M, K] @ o2 [K, N], all f32 */
    NKX_REDUCE,      /* o0 (o1's ndim, 1 in reduced dims) = op(o1) over the dims of bitmask flags */
    NKX_COPY_IF,     /* o0 = o1 != 0 ? (o0 dtype) o2 : o0, same sizes (select, where: o0 holds the false side) */
    NKX_INT,         /* o0 = op(o1[, o2 or value]), op an nkx_iop, with the nki interpreter's (numpy's) integer rules */
    NKX_KIND_COUNT
} nkx_kind;

/*
 * NKX_INT: integer arithmetic, compares and casts. flags bits 0-7 name the compute type T, the type numpy
 * computes in: an integer nk_dtype (operands, which T holds exactly, are read as integers; results wrap to T's
 * width), NK_F32 (operands rounded to fp32, one fp32 operation) or NK_F64 (compares in double). NKX_I_SCALAR:
 * the second operand is value (already T's value); NKX_I_REVERSE: the operands swap. The result is stored as
 * the interpreter encodes it: to an integer o0 wrapped (from an integer) or rounded to nearest even with
 * saturation and NaN as 0 (from a float); to a float o0 rounded to nearest even; to bool as != 0. Compares and
 * logical ops give 0/1. Shifts follow numpy: a count outside [0, bits of T) gives 0 (<<) or the sign (>>).
 * The float ops (NKX_I_DIV: true division, NKX_I_SQRT, NKX_I_RSQRT: 1 / sqrt, NKX_I_RECIP: 1 / x) take T =
 * NK_F16, NK_F32 or NK_F64 (numpy's result dtype, e.g. float64 for int32 / int32, float16 for sqrt of int8):
 * the operands are converted to T, every operation is rounded to T (computed in double, then rounded once to
 * T: for a division or square root that is T's correctly rounded result), and a double result stored to fp16
 * is rounded once (numpy's float64 -> float16 cast), to bf16 through fp32 (the interpreter's encoding).
 * NKX_I_CAST with T = NK_F64 or NK_F16 converts o1 to T, then stores it with o0's encoding.
 * NKX_I_EXP .. NKX_I_RELU (unary) and NKX_I_POW with a float T are <math.h>'s double functions rounded to T;
 * for T = NK_F16 the value goes through fp32 first, as numpy's float16 loops compute in float. Transcendentals
 * are within a few ulps of numpy's own loops, the rest (ceil, floor, trunc, sign, square, relu) bitwise.
 * NKX_I_MOD / NKX_I_FMOD with a float T are numpy's remainder (the sign of the divisor) and fmod (the sign of
 * the dividend) computed in T (fp16 through fp32), bitwise; a zero divisor gives NaN. With an integer T:
 * NKX_I_POW is numpy's wrapping integer power, and a negative exponent anywhere in the operand fails the step
 * with NK_NEG_INT_POWER before anything is written; NKX_I_MOD / NKX_I_FMOD give 0 for a zero divisor;
 * NKX_I_CEIL / FLOOR / TRUNC keep the value, NKX_I_SIGN is -1/0/1, NKX_I_SQUARE wraps (numpy keeps the dtype).
 */
typedef enum nkx_iop {
    NKX_I_CAST = 0, NKX_I_ADD, NKX_I_SUB, NKX_I_MUL, NKX_I_MAX, NKX_I_MIN, NKX_I_AND, NKX_I_OR, NKX_I_XOR,
    NKX_I_SHL, NKX_I_SHR, NKX_I_EQ, NKX_I_NE, NKX_I_LT, NKX_I_LE, NKX_I_GT, NKX_I_GE, NKX_I_LAND, NKX_I_LOR,
    NKX_I_LXOR, NKX_I_NEG, NKX_I_ABS, NKX_I_INVERT, NKX_I_LNOT, NKX_I_DIV, NKX_I_SQRT, NKX_I_RSQRT, NKX_I_RECIP,
    NKX_I_RSUM, NKX_I_RMAX, NKX_I_RMIN, NKX_I_RMEAN, NKX_I_EXP, NKX_I_LOG, NKX_I_TANH, NKX_I_SIN, NKX_I_COS,
    NKX_I_TAN, NKX_I_ATAN, NKX_I_CEIL, NKX_I_FLOOR, NKX_I_TRUNC, NKX_I_SIGN, NKX_I_SQUARE, NKX_I_RELU, NKX_I_POW,
    NKX_I_MOD, NKX_I_FMOD, NKX_I_COUNT
} nkx_iop;
#define NKX_I_SCALAR (1 << 8)
#define NKX_I_REVERSE (1 << 9)
/*
 * Integer reductions: o0 (o1's ndim, 1 in the reduced dims) = op(o1) over the dims of bitmask
 * (flags >> NKX_I_AXES_SHIFT) & 0x3F, o1 an integer or bool tile. NKX_I_RSUM wraps the sum to T (numpy's result
 * dtype: np.sum gives int64, np.add.reduce the input's dtype; the order cannot matter), NKX_I_RMAX / RMIN are
 * exact, NKX_I_RMEAN (T = NK_F64) is the exact sum in double over the count (the tracer sends it only where
 * the sum is exact in double). NKX_I_NEGATE negates the result in T (wrapping). Stored with o0's encoding.
 */
#define NKX_I_NEGATE (1 << 10)
/* NKX_I_RMEAN of values a double may not sum exactly (int64): each value converted to double and summed in
 * numpy's order for a reduction over trailing dims (pairwise within each 8192-value buffer, the buffers in
 * turn), so the same bits as np.mean; the tracer sends it only for trailing reduced dims. */
#define NKX_I_PAIRWISE (1 << 11)
#define NKX_I_AXES_SHIFT 16

/*
 * Fused groups: the tracer sets NKX_FUSE_NEXT in flags on every step of a run but the last when the run's
 * steps are element-wise (COPY, UNARY, BINARY on f32/bf16/f16) or reduce every free dim into one value per
 * row (REDUCE), all over the same number of rows (dim 0), with row r of each step depending only on row r of
 * the others. The executor then evaluates the run a few rows at a time, every step on those rows before the
 * next rows, so a row's intermediates stay in L1. A run that breaks these rules fails with NK_INVALID.
 */
#define NKX_FUSE_NEXT ((int32_t)1 << 30)

typedef struct nkx_instr {
    int32_t kind;                    /* nkx_kind */
    int32_t op;
    int32_t nops;
    int32_t flags;                   /* kind's flags, | NKX_FUSE_NEXT */
    double value;
    nkx_operand o[3];
} nkx_instr;

/* Runs ins[0..n); on failure returns the status and sets *failed_at to the instruction's index. */
nk_status nkx_run(const nkx_instr *ins, int64_t n, void *const *bases, int64_t nbases, int64_t *failed_at);
/* sizeof(nkx_instr), sizeof(nkx_operand) and offsetof(nkx_instr, o): the Python side checks its layout. */
void nkx_layout(int64_t out[3]);

/* ---- threads ---------------------------------------------------------------------------------- */
/*
 * One pool for the whole library. Workers spin briefly after a job (the next op usually follows at
 * once), then sleep on a futex, so an idle pool costs nothing. It serves the C tests and any host
 * without another pool; inside PyTorch the binding hands the work to PyTorch's (nk_parallel_set_runner).
 */
typedef void (*nk_range_fn)(void *ctx, int64_t begin, int64_t end);
/* Total threads including the caller (>= 1); 1 runs everything on the caller. Default: 1. */
void nk_threads_set(int n);
int nk_threads_get(void);
/* Calls fn(ctx, b, e) over disjoint chunks covering [0, n), each at least `grain` long (except the
 * last), on the pool and the calling thread; returns when all chunks are done. Calls made from inside
 * a chunk run serially on that thread. */
void nk_parallel_for(int64_t n, int64_t grain, nk_range_fn fn, void *ctx);
/*
 * Hands nk_parallel_for to another pool: run(n, grain, fn, ctx) must have the contract above (and run
 * nested calls serially), threads() give its thread count, which nk_threads_get then reports. The binding
 * installs PyTorch's intra-op pool, which also runs PyTorch's CPU kernels and the C++ kernels
 * torch.compile generates: with two pools, each one's threads spin after its jobs while the other's
 * want the cores (a compiled decode spent a fifth of its time so). NULL, NULL: this library's pool.
 */
typedef void (*nk_parallel_run_fn)(int64_t n, int64_t grain, nk_range_fn fn, void *ctx);
void nk_parallel_set_runner(nk_parallel_run_fn run, int (*threads)(void));

#ifdef __cplusplus
}
#endif
#endif /* NEURON_KERNELS_H */
