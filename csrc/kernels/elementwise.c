/*
 * elementwise.c - nk_unary / nk_binary / nk_ternary: the N-d loop, dtype conversion and threading
 * around the per-op block functions (float32 ones in elementwise_f32.h, per ISA; float64 and int64
 * ones here, in plain C).
 *
 * Work is split over the flattened element range; each chunk walks rows of the fastest dim in blocks
 * of NK_EW_BLOCK elements. An operand already in the compute type and contiguous is used in place;
 * any other is converted into a block buffer first (strided, broadcast or another dtype), and the
 * result is converted back the same way. So the common contiguous float32 case never copies (and such
 * a row goes to the op in one call), and bfloat16/float16 are widened once, computed in float and
 * rounded once, as PyTorch's CPU kernels do. For all-bfloat16 contiguous rows an ISA table may have a
 * fused op that does the same widening and rounding in registers, with no buffers.
 */
#include "elementwise_internal.h"

#include <stdatomic.h>

/* ---- the table for this CPU ---- */

const nk_ew_f32_table *nk_ew_f32_select(void) {
    static const nk_ew_f32_table *_Atomic chosen;
    const nk_ew_f32_table *t = atomic_load_explicit(&chosen, memory_order_acquire);
    if (t) return t;
    t = &nk_ew_f32_generic;
#ifdef NK_EW_HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        t = __builtin_cpu_supports("avx512bf16") ? &nk_ew_f32_avx512bf16 : &nk_ew_f32_avx512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        t = &nk_ew_f32_avx2;
#endif
    atomic_store_explicit(&chosen, t, memory_order_release);
    return t;
}

const char *nk_ew_isa(void) {
    return nk_ew_f32_select()->isa;
}

/* ---- float64 ops ---- */

/* One loop body per (element type, arity); the op is the expression. Used for float64 and int64. */
#define NK_EW_UNARY_LOOP(prefix, T, name, expr)                                                    \
    static int nk_ew_##prefix##_##name(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) { \
        T *o = (T *)o_;                                                                            \
        const T *x = (const T *)in[0];                                                             \
        (void)A;                                                                                   \
        for (int64_t i = 0; i < n; i++) {                                                          \
            const T v = x[i];                                                                      \
            o[i] = (expr);                                                                         \
        }                                                                                          \
        return 0;                                                                                  \
    }
#define NK_EW_BINARY_LOOP(prefix, T, name, otype, expr)                                            \
    static int nk_ew_##prefix##_##name(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) { \
        otype *o = (otype *)o_;                                                                    \
        const T *x = (const T *)in[0], *y = (const T *)in[1];                                      \
        (void)A;                                                                                   \
        for (int64_t i = 0; i < n; i++) {                                                          \
            const T a = x[i], b = y[i];                                                            \
            o[i] = (expr);                                                                         \
        }                                                                                          \
        return 0;                                                                                  \
    }
#define NK_EW_D1(name, expr) NK_EW_UNARY_LOOP(f64, double, name, expr)
#define NK_EW_D2(name, otype, expr) NK_EW_BINARY_LOOP(f64, double, name, otype, expr)

#define NK_SQRT1_2 0.70710678118654752440
#define NK_GELU_BETA 0.79788456080286535588  /* sqrt(2) * 2/sqrt(pi) * 0.5 */
#define NK_GELU_KAPPA 0.044715
#define NK_GELU_PDF 0.39894228040143267794   /* 2/sqrt(pi) * sqrt(1/2) * 0.5 */

static double nk_ew_maxd(double a, double b) {
    return (a != a || b != b) ? (a != a ? a : b) : (a < b ? b : a);
}
static double nk_ew_mind(double a, double b) {
    return (a != a || b != b) ? (a != a ? a : b) : (b < a ? b : a);
}
static double nk_ew_gelu_tanhd(double x) {
    const double inner = NK_GELU_BETA * (x + NK_GELU_KAPPA * (x * x * x));
    return 0.5 * x * (1.0 + tanh(inner));
}
static double nk_ew_gelu_tanh_bwdd(double dy, double x) {
    const double x_sq = x * x;
    const double t = tanh(NK_GELU_BETA * (x + NK_GELU_KAPPA * (x_sq * x)));
    const double left_derivative = 0.5 * (1.0 + t);
    const double right_derivative = 0.5 * x * (1.0 - t * t) * (NK_GELU_BETA * (1.0 + 3.0 * NK_GELU_KAPPA * x_sq));
    return dy * (left_derivative + right_derivative);
}
static double nk_ew_gelu_bwdd(double dy, double x) {
    const double cdf = 0.5 * (1.0 + erf(x * NK_SQRT1_2));
    const double pdf = NK_GELU_PDF * exp(x * x * -0.5);
    return dy * (cdf + x * pdf);
}
static double nk_ew_silu_bwdd(double dy, double x) {
    const double s = 1.0 / (1.0 + exp(-x));
    return dy * s * (1.0 + x * (1.0 - s));
}
static double nk_ew_div_floord(double a, double b) {
    if (b == 0.0) return a / b;
    const double mod = fmod(a, b);
    double div = (a - mod) / b;
    if (mod != 0.0 && (b < 0.0) != (mod < 0.0)) div -= 1.0;
    if (div == 0.0) return copysign(0.0, a / b);
    double r = floor(div);
    if (div - r > 0.5) r += 1.0;
    return r;
}

NK_EW_D1(neg, -v)
NK_EW_D1(abs, fabs(v))
NK_EW_D1(exp, exp(v))
NK_EW_D1(log, log(v))
NK_EW_D1(sqrt, sqrt(v))
NK_EW_D1(rsqrt, 1.0 / sqrt(v))
NK_EW_D1(reciprocal, 1.0 / v)
NK_EW_D1(sin, sin(v))
NK_EW_D1(cos, cos(v))
NK_EW_D1(tanh, tanh(v))
NK_EW_D1(sigmoid, 1.0 / (1.0 + exp(-v)))
NK_EW_D1(silu, v / (1.0 + exp(-v)))
NK_EW_D1(gelu, v * 0.5 * (1.0 + erf(v * NK_SQRT1_2)))
NK_EW_D1(gelu_tanh, nk_ew_gelu_tanhd(v))
NK_EW_D1(relu, v != v ? v : (v > 0.0 ? v : 0.0))
NK_EW_D1(clamp, (v < A->f64[NK_ARG_LO] ? A->f64[NK_ARG_LO] : v) > A->f64[NK_ARG_HI]
                    ? A->f64[NK_ARG_HI] : (v < A->f64[NK_ARG_LO] ? A->f64[NK_ARG_LO] : v))
NK_EW_D1(pow_scalar, A->f64[NK_ARG_VALUE] == 2.0 ? v * v
                   : A->f64[NK_ARG_VALUE] == 3.0 ? v * v * v
                   : A->f64[NK_ARG_VALUE] == -2.0 ? 1.0 / (v * v)
                   : A->f64[NK_ARG_VALUE] == 0.5 ? sqrt(v)
                   : A->f64[NK_ARG_VALUE] == -0.5 ? 1.0 / sqrt(v)
                   : A->f64[NK_ARG_VALUE] == -1.0 ? 1.0 / v
                   : pow(v, A->f64[NK_ARG_VALUE]))
static int nk_ew_f64_logical_not(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    uint8_t *o = (uint8_t *)o_;
    const double *x = (const double *)in[0];
    (void)A;
    for (int64_t i = 0; i < n; i++) o[i] = (uint8_t)(x[i] == 0.0);
    return 0;
}
NK_EW_D2(add, double, fma(A->f64[NK_ARG_ALPHA], b, a))
NK_EW_D2(mul, double, a * b)
NK_EW_D2(div, double, a / b)
NK_EW_D2(div_trunc, double, trunc(a / b))
NK_EW_D2(div_floor, double, nk_ew_div_floord(a, b))
NK_EW_D2(eq, uint8_t, (uint8_t)(a == b))
NK_EW_D2(ne, uint8_t, (uint8_t)(a != b))
NK_EW_D2(lt, uint8_t, (uint8_t)(a < b))
NK_EW_D2(le, uint8_t, (uint8_t)(a <= b))
NK_EW_D2(gt, uint8_t, (uint8_t)(a > b))
NK_EW_D2(ge, uint8_t, (uint8_t)(a >= b))
NK_EW_D2(logical_and, uint8_t, (uint8_t)((a != 0.0) & (b != 0.0)))
NK_EW_D2(logical_or, uint8_t, (uint8_t)((a != 0.0) | (b != 0.0)))
NK_EW_D2(logical_xor, uint8_t, (uint8_t)((a != 0.0) ^ (b != 0.0)))
NK_EW_D2(pow, double, pow(a, b))
NK_EW_D2(maximum, double, nk_ew_maxd(a, b))
NK_EW_D2(minimum, double, nk_ew_mind(a, b))
NK_EW_D2(silu_backward, double, nk_ew_silu_bwdd(a, b))
NK_EW_D2(gelu_backward, double, nk_ew_gelu_bwdd(a, b))
NK_EW_D2(gelu_tanh_backward, double, nk_ew_gelu_tanh_bwdd(a, b))
NK_EW_D2(sigmoid_backward, double, a * (1.0 - b) * b)
NK_EW_D2(tanh_backward, double, a * (1.0 - b * b))
NK_EW_D2(threshold_backward, double, a <= A->f64[NK_ARG_VALUE] ? 0.0 : b)
static int nk_ew_f64_masked_fill(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    double *o = (double *)o_;
    const double *x = (const double *)in[0];
    const uint8_t *m = (const uint8_t *)in[1];
    for (int64_t i = 0; i < n; i++) o[i] = m[i] ? A->f64[NK_ARG_VALUE] : x[i];
    return 0;
}
static int nk_ew_f64_where(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    double *o = (double *)o_;
    const uint8_t *c = (const uint8_t *)in[0];
    const double *x = (const double *)in[1], *y = (const double *)in[2];
    (void)A;
    for (int64_t i = 0; i < n; i++) o[i] = c[i] ? x[i] : y[i];
    return 0;
}
static int nk_ew_f64_clamp_tensor(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    double *o = (double *)o_;
    const double *x = (const double *)in[0], *l = (const double *)in[1], *h = (const double *)in[2];
    (void)A;
    for (int64_t i = 0; i < n; i++) o[i] = nk_ew_mind(nk_ew_maxd(x[i], l[i]), h[i]);
    return 0;
}

/* ---- int64 ops (bool and signed integers up to int64, widened; results wrap like the narrow type) ---- */

/* Arithmetic in uint64: signed overflow is undefined in C, wrapping is what PyTorch's integer ops give. */
#define NK_WRAP(expr) ((int64_t)(uint64_t)(expr))

static int64_t nk_ew_powi(int64_t a, int64_t b) {
    if (b < 0) {
        if (a == 1) return 1;
        if (a == -1) return (b % 2) ? -1 : 1;
        return 0;
    }
    uint64_t r = 1, base = (uint64_t)a;
    while (b) {
        if (b & 1) r *= base;
        b /= 2;
        base *= base;
    }
    return (int64_t)r;
}

#define NK_EW_I1(name, expr) NK_EW_UNARY_LOOP(i64, int64_t, name, expr)
#define NK_EW_I2(name, otype, expr) NK_EW_BINARY_LOOP(i64, int64_t, name, otype, expr)

NK_EW_I1(neg, NK_WRAP(0u - (uint64_t)v))
NK_EW_I1(abs, v < 0 ? NK_WRAP(0u - (uint64_t)v) : v)
NK_EW_I1(relu, v > 0 ? v : 0)
NK_EW_I1(clamp, (v < A->i64[NK_ARG_LO] ? A->i64[NK_ARG_LO] : v) > A->i64[NK_ARG_HI]
                    ? A->i64[NK_ARG_HI] : (v < A->i64[NK_ARG_LO] ? A->i64[NK_ARG_LO] : v))
NK_EW_I1(pow_scalar, nk_ew_powi(v, A->i64[NK_ARG_VALUE]))
NK_EW_I1(bitwise_not, ~v)
static int nk_ew_i64_logical_not(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    uint8_t *o = (uint8_t *)o_;
    const int64_t *x = (const int64_t *)in[0];
    (void)A;
    for (int64_t i = 0; i < n; i++) o[i] = (uint8_t)(x[i] == 0);
    return 0;
}
NK_EW_I2(add, int64_t, NK_WRAP((uint64_t)a + (uint64_t)A->i64[NK_ARG_ALPHA] * (uint64_t)b))
NK_EW_I2(mul, int64_t, NK_WRAP((uint64_t)a * (uint64_t)b))
NK_EW_I2(eq, uint8_t, (uint8_t)(a == b))
NK_EW_I2(ne, uint8_t, (uint8_t)(a != b))
NK_EW_I2(lt, uint8_t, (uint8_t)(a < b))
NK_EW_I2(le, uint8_t, (uint8_t)(a <= b))
NK_EW_I2(gt, uint8_t, (uint8_t)(a > b))
NK_EW_I2(ge, uint8_t, (uint8_t)(a >= b))
NK_EW_I2(logical_and, uint8_t, (uint8_t)((a != 0) & (b != 0)))
NK_EW_I2(logical_or, uint8_t, (uint8_t)((a != 0) | (b != 0)))
NK_EW_I2(logical_xor, uint8_t, (uint8_t)((a != 0) ^ (b != 0)))
NK_EW_I2(bitwise_and, int64_t, a & b)
NK_EW_I2(bitwise_or, int64_t, a | b)
NK_EW_I2(bitwise_xor, int64_t, a ^ b)
NK_EW_I2(pow, int64_t, nk_ew_powi(a, b))
NK_EW_I2(maximum, int64_t, a < b ? b : a)
NK_EW_I2(minimum, int64_t, b < a ? b : a)
NK_EW_I2(threshold_backward, int64_t, a <= A->i64[NK_ARG_VALUE] ? 0 : b)

/* Integer division: a zero divisor is an error (PyTorch raises ZeroDivisionError); -1 is special
 * because INT64_MIN / -1 overflows. */
static int nk_ew_i64_div_trunc(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    int64_t *o = (int64_t *)o_;
    const int64_t *x = (const int64_t *)in[0], *y = (const int64_t *)in[1];
    (void)A;
    for (int64_t i = 0; i < n; i++) {
        const int64_t a = x[i], b = y[i];
        if (b == 0) return 1;
        o[i] = b == -1 ? NK_WRAP(0u - (uint64_t)a) : a / b;
    }
    return 0;
}
static int nk_ew_i64_div_floor(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    int64_t *o = (int64_t *)o_;
    const int64_t *x = (const int64_t *)in[0], *y = (const int64_t *)in[1];
    (void)A;
    for (int64_t i = 0; i < n; i++) {
        const int64_t a = x[i], b = y[i];
        if (b == 0) return 1;
        if (b == -1) {
            o[i] = NK_WRAP(0u - (uint64_t)a);
            continue;
        }
        const int64_t q = a / b, r = a % b;
        o[i] = (r != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
    }
    return 0;
}
static int nk_ew_i64_masked_fill(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    int64_t *o = (int64_t *)o_;
    const int64_t *x = (const int64_t *)in[0];
    const uint8_t *m = (const uint8_t *)in[1];
    for (int64_t i = 0; i < n; i++) o[i] = m[i] ? A->i64[NK_ARG_VALUE] : x[i];
    return 0;
}
static int nk_ew_i64_where(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    int64_t *o = (int64_t *)o_;
    const uint8_t *c = (const uint8_t *)in[0];
    const int64_t *x = (const int64_t *)in[1], *y = (const int64_t *)in[2];
    (void)A;
    for (int64_t i = 0; i < n; i++) o[i] = c[i] ? x[i] : y[i];
    return 0;
}
static int nk_ew_i64_clamp_tensor(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    int64_t *o = (int64_t *)o_;
    const int64_t *x = (const int64_t *)in[0], *l = (const int64_t *)in[1], *h = (const int64_t *)in[2];
    (void)A;
    for (int64_t i = 0; i < n; i++) {
        const int64_t v = x[i] < l[i] ? l[i] : x[i];
        o[i] = v > h[i] ? h[i] : v;
    }
    return 0;
}

#define U(op) NK_EW_UNARY(op)
#define B(op) NK_EW_BINARY(op)
#define T(op) NK_EW_TERNARY(op)

static const nk_ew_fn nk_ew_f64_fns[NK_EW_OP_COUNT] = {
    [U(NK_NEG)] = nk_ew_f64_neg, [U(NK_ABS)] = nk_ew_f64_abs, [U(NK_EXP)] = nk_ew_f64_exp,
    [U(NK_LOG)] = nk_ew_f64_log, [U(NK_SQRT)] = nk_ew_f64_sqrt, [U(NK_RSQRT)] = nk_ew_f64_rsqrt,
    [U(NK_RECIPROCAL)] = nk_ew_f64_reciprocal, [U(NK_SIN)] = nk_ew_f64_sin, [U(NK_COS)] = nk_ew_f64_cos,
    [U(NK_TANH)] = nk_ew_f64_tanh, [U(NK_SIGMOID)] = nk_ew_f64_sigmoid, [U(NK_SILU)] = nk_ew_f64_silu,
    [U(NK_GELU)] = nk_ew_f64_gelu, [U(NK_GELU_TANH)] = nk_ew_f64_gelu_tanh, [U(NK_RELU)] = nk_ew_f64_relu,
    [U(NK_CLAMP)] = nk_ew_f64_clamp, [U(NK_POW_SCALAR)] = nk_ew_f64_pow_scalar,
    [U(NK_LOGICAL_NOT)] = nk_ew_f64_logical_not,
    [B(NK_ADD)] = nk_ew_f64_add, [B(NK_MUL)] = nk_ew_f64_mul, [B(NK_DIV)] = nk_ew_f64_div,
    [B(NK_DIV_TRUNC)] = nk_ew_f64_div_trunc, [B(NK_DIV_FLOOR)] = nk_ew_f64_div_floor,
    [B(NK_EQ)] = nk_ew_f64_eq, [B(NK_NE)] = nk_ew_f64_ne, [B(NK_LT)] = nk_ew_f64_lt, [B(NK_LE)] = nk_ew_f64_le,
    [B(NK_GT)] = nk_ew_f64_gt, [B(NK_GE)] = nk_ew_f64_ge, [B(NK_LOGICAL_AND)] = nk_ew_f64_logical_and,
    [B(NK_LOGICAL_OR)] = nk_ew_f64_logical_or, [B(NK_LOGICAL_XOR)] = nk_ew_f64_logical_xor,
    [B(NK_POW)] = nk_ew_f64_pow, [B(NK_MAXIMUM)] = nk_ew_f64_maximum, [B(NK_MINIMUM)] = nk_ew_f64_minimum,
    [B(NK_MASKED_FILL)] = nk_ew_f64_masked_fill, [B(NK_SILU_BACKWARD)] = nk_ew_f64_silu_backward,
    [B(NK_GELU_BACKWARD)] = nk_ew_f64_gelu_backward, [B(NK_GELU_TANH_BACKWARD)] = nk_ew_f64_gelu_tanh_backward,
    [B(NK_SIGMOID_BACKWARD)] = nk_ew_f64_sigmoid_backward, [B(NK_TANH_BACKWARD)] = nk_ew_f64_tanh_backward,
    [B(NK_THRESHOLD_BACKWARD)] = nk_ew_f64_threshold_backward,
    [T(NK_WHERE)] = nk_ew_f64_where, [T(NK_CLAMP_TENSOR)] = nk_ew_f64_clamp_tensor,
};

static const nk_ew_fn nk_ew_i64_fns[NK_EW_OP_COUNT] = {
    [U(NK_NEG)] = nk_ew_i64_neg, [U(NK_ABS)] = nk_ew_i64_abs, [U(NK_RELU)] = nk_ew_i64_relu,
    [U(NK_CLAMP)] = nk_ew_i64_clamp, [U(NK_POW_SCALAR)] = nk_ew_i64_pow_scalar,
    [U(NK_LOGICAL_NOT)] = nk_ew_i64_logical_not, [U(NK_BITWISE_NOT)] = nk_ew_i64_bitwise_not,
    [B(NK_ADD)] = nk_ew_i64_add, [B(NK_MUL)] = nk_ew_i64_mul, [B(NK_DIV_TRUNC)] = nk_ew_i64_div_trunc,
    [B(NK_DIV_FLOOR)] = nk_ew_i64_div_floor, [B(NK_EQ)] = nk_ew_i64_eq, [B(NK_NE)] = nk_ew_i64_ne,
    [B(NK_LT)] = nk_ew_i64_lt, [B(NK_LE)] = nk_ew_i64_le, [B(NK_GT)] = nk_ew_i64_gt, [B(NK_GE)] = nk_ew_i64_ge,
    [B(NK_LOGICAL_AND)] = nk_ew_i64_logical_and, [B(NK_LOGICAL_OR)] = nk_ew_i64_logical_or,
    [B(NK_LOGICAL_XOR)] = nk_ew_i64_logical_xor, [B(NK_BITWISE_AND)] = nk_ew_i64_bitwise_and,
    [B(NK_BITWISE_OR)] = nk_ew_i64_bitwise_or, [B(NK_BITWISE_XOR)] = nk_ew_i64_bitwise_xor,
    [B(NK_POW)] = nk_ew_i64_pow, [B(NK_MAXIMUM)] = nk_ew_i64_maximum, [B(NK_MINIMUM)] = nk_ew_i64_minimum,
    [B(NK_MASKED_FILL)] = nk_ew_i64_masked_fill, [B(NK_THRESHOLD_BACKWARD)] = nk_ew_i64_threshold_backward,
    [T(NK_WHERE)] = nk_ew_i64_where, [T(NK_CLAMP_TENSOR)] = nk_ew_i64_clamp_tensor,
};

/* Inputs per op, predicates (uint8 result) and inputs read as bool. */
typedef struct nk_ew_trait {
    uint8_t nin, pred, bool_in;
} nk_ew_trait;

static nk_ew_trait nk_ew_trait_of(int op) {
    nk_ew_trait t = {1, 0, 0};
    if (op >= T(0)) {
        t.nin = 3;
        if (op == T(NK_WHERE)) t.bool_in = 1;
        return t;
    }
    if (op >= B(0)) {
        t.nin = 2;
        t.pred = (op >= B(NK_EQ) && op <= B(NK_LOGICAL_XOR));
        if (op == B(NK_MASKED_FILL)) t.bool_in = 2;
        return t;
    }
    t.pred = op == U(NK_LOGICAL_NOT);
    return t;
}

/* ---- the driver ---- */

typedef struct nk_ew_ctx {
    const nk_ew_iter *it;
    const nk_ew_f32_table *f32;
    nk_ew_fn fn;
    nk_ew_args args;
    nk_dtype cdt;      /* compute dtype: F32, F64 or I64 */
    nk_dtype common;
    nk_ew_trait tr;
    int nin_ops;       /* inputs present in the iterator */
    bool scalar_b;     /* binary op without operand b: b = args value */
    bool direct;       /* every operand's dtype is the compute dtype (rows may be used in place) */
    nk_ew_fn bf16_fn;  /* the fused bfloat16 op, when every operand is bfloat16 */
    nk_ew_fn vs_fn, sv_fn; /* the binary op with b (vs) or a (sv) one value per row, or NULL */
    nk_ew_fn bf16_vs_fn, bf16_sv_fn; /* the same fused on bfloat16 (every operand bfloat16) */
    atomic_int failed;
} nk_ew_ctx;

typedef struct nk_ew_bufs {
    _Alignas(64) unsigned char in[3][NK_EW_BLOCK * 8];
    _Alignas(64) unsigned char out[NK_EW_BLOCK * 8];
    _Alignas(64) unsigned char tmp[NK_EW_BLOCK * 8];
} nk_ew_bufs;

static void nk_ew_to_cdt(const nk_ew_ctx *c, void *dst, nk_dtype dt, const char *src, int64_t se, int64_t m) {
    if (se == 1 && c->cdt == NK_F32 && dt == NK_BF16)
        c->f32->from_bf16((float *)dst, (const uint16_t *)src, m);
    else if (se == 1 && c->cdt == NK_F32 && dt == NK_F16)
        c->f32->from_f16((float *)dst, (const uint16_t *)src, m);
    else
        nk_cast_get(c->cdt, dt)(dst, 1, src, se, m);
}

/* Input k (1-based operand index) of a block as a contiguous compute-typed (or bool) array. */
static const void *nk_ew_load_strided(const nk_ew_ctx *c, int k, const char *p, int64_t sb, int64_t m, void *buf, void *tmp) {
    const nk_dtype dt = c->it->dtype[k];
    const int64_t se = sb / (int64_t)nk_dtype_size(dt);
    if (c->tr.bool_in & (1u << (k - 1))) {
        if (dt == NK_BOOL && se == 1) return p;
        nk_cast_get(NK_BOOL, dt)(buf, 1, p, se, m);
        return buf;
    }
    if (dt == c->common) {
        if (dt == c->cdt && se == 1) return p;
        nk_ew_to_cdt(c, buf, dt, p, se, m);
        return buf;
    }
    /* Another dtype (e.g. a CPU scalar): to the common dtype first, as PyTorch converts inputs. */
    nk_cast_get(c->common, dt)(tmp, 1, p, se, m);
    nk_ew_to_cdt(c, buf, c->common, tmp, 1, m);
    return buf;
}

/* buf[1..m) = buf[0], for an element of `size` bytes; typed loops from index 0 (aligned full vectors)
 * so they vectorise. This runs once per row of a column-broadcast operand, at up to a block per row,
 * which with 16-byte stores cost more than the op on the row: wider stores where the CPU has them. */
#define NK_EW_SPLAT_BODY                                                                           \
    if (size == 8) {                                                                               \
        int64_t *b = (int64_t *)buf;                                                               \
        const int64_t v = b[0];                                                                    \
        for (int64_t i = 0; i < m; i++) b[i] = v;                                                  \
    } else if (size == 4) {                                                                        \
        uint32_t *b = (uint32_t *)buf;                                                             \
        const uint32_t v = b[0];                                                                   \
        for (int64_t i = 0; i < m; i++) b[i] = v;                                                  \
    } else {                                                                                       \
        uint8_t *b = (uint8_t *)buf;                                                               \
        memset(b + 1, b[0], (size_t)(m - 1));                                                      \
    }
static void nk_ew_splat_base(void *buf, size_t size, int64_t m) { NK_EW_SPLAT_BODY }
#ifdef NK_EW_HAVE_X86
__attribute__((target("avx2"))) static void nk_ew_splat_avx2(void *buf, size_t size, int64_t m) { NK_EW_SPLAT_BODY }
#endif
static void nk_ew_splat(const nk_ew_ctx *c, void *buf, size_t size, int64_t m) {
#ifdef NK_EW_HAVE_X86
    /* Every table but the generic one implies AVX2. */
    if (c->f32 != &nk_ew_f32_generic) {
        nk_ew_splat_avx2(buf, size, m);
        return;
    }
#endif
    (void)c;
    nk_ew_splat_base(buf, size, m);
}

/* A broadcast operand (stride 0) is converted once and replicated: the strided conversion loop costs
 * several times the op itself (e.g. h * rsqrt(var) with var of shape [rows, 1]). */
static const void *nk_ew_load(const nk_ew_ctx *c, int k, const char *p, int64_t sb, int64_t m, void *buf, void *tmp) {
    if (sb != 0 || m <= 1) return nk_ew_load_strided(c, k, p, sb, m, buf, tmp);
    const void *one = nk_ew_load_strided(c, k, p, 0, 1, buf, tmp);
    const bool as_bool = (c->tr.bool_in & (1u << (k - 1))) != 0;
    const size_t size = as_bool ? 1 : nk_dtype_size(c->cdt);
    if (one != buf) memcpy(buf, one, size);
    nk_ew_splat(c, buf, size, m);
    return buf;
}

static void nk_ew_store(const nk_ew_ctx *c, char *p, int64_t sb, const void *res, int64_t m, void *tmp) {
    const nk_dtype od = c->it->dtype[0];
    const int64_t se = sb / (int64_t)nk_dtype_size(od);
    if (c->tr.pred) {
        nk_cast_get(od, NK_BOOL)(p, se, res, 1, m);
    } else if (od == c->common || c->common == c->cdt) {
        if (se == 1 && c->cdt == NK_F32 && od == NK_BF16)
            c->f32->to_bf16((uint16_t *)p, (const float *)res, m);
        else if (se == 1 && c->cdt == NK_F32 && od == NK_F16)
            c->f32->to_f16((uint16_t *)p, (const float *)res, m);
        else
            nk_cast_get(od, c->cdt)(p, se, res, 1, m);
    } else {
        nk_cast_get(c->common, c->cdt)(tmp, 1, res, 1, m);
        nk_cast_get(od, c->common)(p, se, tmp, 1, m);
    }
}

static void nk_ew_row(nk_ew_ctx *c, nk_ew_bufs *B, char *const ptr[], const int64_t sb[], int64_t n) {
    const nk_ew_iter *it = c->it;
    const nk_dtype od = it->dtype[0];
    const int64_t osz = (int64_t)nk_dtype_size(od);
    const bool direct_out = sb[0] == osz && (c->tr.pred ? od == NK_BOOL : (od == c->cdt && od == c->common));
    const void *in[3] = {NULL, NULL, NULL};
    if (c->scalar_b) in[1] = B->in[1]; /* filled once per chunk */
    /* Every operand usable in place (or, for a fused bfloat16 op, every operand contiguous bfloat16):
     * the whole row in one call, without the per-block bookkeeping. */
    if (c->direct || (c->bf16_fn && sb[0] == 2)) {
        bool whole = true;
        for (int k = 1; k <= c->nin_ops && whole; k++) {
            const bool as_bool = (c->tr.bool_in & (1u << (k - 1))) != 0;
            whole = sb[k] == (c->bf16_fn ? 2 : as_bool ? 1 : (int64_t)nk_dtype_size(c->cdt));
            in[k - 1] = ptr[k];
        }
        if (whole && (c->bf16_fn || direct_out)) {
            if ((c->bf16_fn ? c->bf16_fn : c->fn)(ptr[0], in, n, &c->args) != 0)
                atomic_store_explicit(&c->failed, 1, memory_order_relaxed);
            return;
        }
    }
    /* One operand of a binary op the same value all row long (a column broadcast): that value once,
     * and the op's variant that reads it as a scalar, instead of replicating it over a block. */
    const int sk = c->nin_ops != 2 || (sb[1] == 0) == (sb[2] == 0) ? 0 : sb[2] == 0 ? 2 : 1;
    const nk_ew_fn sfn = sk == 2 ? c->vs_fn : sk == 1 ? c->sv_fn : NULL;
    nk_ew_fn fn = c->fn;
    if (sfn != NULL) {
        const int other = 3 - sk;
        /* A float operand is read where it is; others are converted (one element). */
        in[sk - 1] = c->it->dtype[sk] == NK_F32 ? (const void *)ptr[sk]
                                                : nk_ew_load_strided(c, sk, ptr[sk], 0, 1, B->in[sk - 1], B->tmp);
        const nk_ew_fn bfn = sk == 2 ? c->bf16_vs_fn : c->bf16_sv_fn;
        if (bfn != NULL && sb[other] == 2 && sb[0] == 2) {
            in[other - 1] = ptr[other];
            (void)bfn(ptr[0], in, n, &c->args);
            return;
        }
        const bool in_place = c->it->dtype[other] == c->cdt && c->common == c->cdt &&
                              sb[other] == (int64_t)nk_dtype_size(c->cdt);
        if (in_place && direct_out) {
            in[other - 1] = ptr[other];
            (void)sfn(ptr[0], in, n, &c->args); /* float ops: no status to report */
            return;
        }
        fn = sfn; /* the blocks below convert the other operand and the result only */
    }
    for (int64_t off = 0; off < n; off += NK_EW_BLOCK) {
        const int64_t m = n - off < NK_EW_BLOCK ? n - off : NK_EW_BLOCK;
        for (int k = 1; k <= c->nin_ops; k++) {
            /* A broadcast operand (stride 0) is the same value all row long: convert it once. */
            if (k == sk && sfn != NULL) continue;
            if (sb[k] == 0 && off > 0) continue;
            const int64_t mm = sb[k] == 0 ? (n < NK_EW_BLOCK ? n : NK_EW_BLOCK) : m;
            in[k - 1] = nk_ew_load(c, k, ptr[k] + off * sb[k], sb[k], mm, B->in[k - 1], B->tmp);
        }
        char *op = ptr[0] + off * sb[0];
        void *res = direct_out ? (void *)op : (void *)B->out;
        if (fn(res, in, m, &c->args) != 0) {
            atomic_store_explicit(&c->failed, 1, memory_order_relaxed);
            return;
        }
        if (!direct_out) nk_ew_store(c, op, sb[0], res, m, B->tmp);
    }
}

static void nk_ew_chunk(void *ctx, int64_t begin, int64_t end) {
    nk_ew_ctx *c = (nk_ew_ctx *)ctx;
    const nk_ew_iter *it = c->it;
    nk_ew_bufs bufs;
    if (c->scalar_b) {
        /* The scalar b, converted once for the whole chunk. */
        for (int64_t i = 0; i < NK_EW_BLOCK; i++) {
            if (c->cdt == NK_F32) ((float *)bufs.in[1])[i] = c->args.f32[NK_ARG_VALUE];
            else if (c->cdt == NK_F64) ((double *)bufs.in[1])[i] = c->args.f64[NK_ARG_VALUE];
            else ((int64_t *)bufs.in[1])[i] = c->args.i64[NK_ARG_VALUE];
        }
    }
    const int32_t nd = it->ndim > 0 ? it->ndim : 1;
    int64_t sizes[NK_MAX_DIMS], idx[NK_MAX_DIMS];
    for (int32_t d = 0; d < nd; d++) sizes[d] = it->ndim > 0 ? it->sizes[d] : 1;
    int64_t rem = begin;
    for (int32_t d = 0; d < nd; d++) {
        idx[d] = rem % sizes[d];
        rem /= sizes[d];
    }
    int64_t sb[NK_EW_MAX_OPS];
    for (int k = 0; k < it->nops; k++) sb[k] = it->ndim > 0 ? it->strides[k][0] : 0;
    int64_t pos = begin;
    while (pos < end) {
        int64_t n = sizes[0] - idx[0];
        if (n > end - pos) n = end - pos;
        char *ptr[NK_EW_MAX_OPS];
        for (int k = 0; k < it->nops; k++) {
            char *p = (char *)it->data[k];
            for (int32_t d = 0; d < it->ndim; d++) p += idx[d] * it->strides[k][d];
            ptr[k] = p;
        }
        nk_ew_row(c, &bufs, ptr, sb, n);
        if (atomic_load_explicit(&c->failed, memory_order_relaxed)) return;
        pos += n;
        idx[0] += n;
        for (int32_t d = 0; d + 1 < nd && idx[d] == sizes[d]; d++) {
            idx[d] = 0;
            idx[d + 1]++;
        }
    }
}

static bool nk_ew_compute_dtype(nk_dtype common, nk_dtype *cdt) {
    switch (common) {
    case NK_F16: case NK_BF16: case NK_F32: *cdt = NK_F32; return true;
    case NK_F64: *cdt = NK_F64; return true;
    case NK_BOOL: case NK_U8: case NK_I8: case NK_I16: case NK_I32: case NK_I64: *cdt = NK_I64; return true;
    default: return false;
    }
}

static void nk_ew_widen(const nk_scalar *s, nk_ew_args *a, int slot) {
    const double f = s->is_float ? s->f : (double)s->i;
    a->f32[slot] = (float)f;
    a->f64[slot] = f;
    /* Float values for integer ops were converted by the caller; truncate defensively in range. */
    a->i64[slot] = s->is_float ? ((f >= -9223372036854775808.0 && f < 9223372036854775808.0) ? (int64_t)f : 0) : s->i;
}

/* Validates and returns the element count, or -1. */
static int64_t nk_ew_check(const nk_ew_iter *it, int nops_expected, int nops_alt) {
    if (it == NULL || (it->nops != nops_expected && it->nops != nops_alt)) return -1;
    if (it->ndim < 0 || it->ndim > NK_MAX_DIMS || it->nops > NK_EW_MAX_OPS) return -1;
    if (!nk_dtype_valid(it->common)) return -1;
    int64_t numel = 1;
    for (int32_t d = 0; d < it->ndim; d++) {
        if (it->sizes[d] < 0) return -1;
        if (it->sizes[d] > 0 && numel > INT64_MAX / it->sizes[d]) return -1;
        numel *= it->sizes[d];
    }
    for (int k = 0; k < it->nops; k++) {
        if (!nk_dtype_valid(it->dtype[k])) return -1;
        if (numel > 0 && it->data[k] == NULL) return -1;
        const int64_t es = (int64_t)nk_dtype_size(it->dtype[k]);
        for (int32_t d = 0; d < it->ndim; d++)
            if (it->strides[k][d] % es != 0) return -1;
    }
    return numel;
}

static nk_status nk_ew_run(int op, const nk_ew_iter *it, const nk_ew_params *p, int nin) {
    const int64_t numel = nk_ew_check(it, nin + 1, nin == 2 ? 2 : nin + 1);
    if (numel < 0) return NK_INVALID;
    nk_ew_ctx c;
    memset(&c, 0, sizeof c);
    c.it = it;
    c.tr = nk_ew_trait_of(op);
    c.common = it->common;
    c.nin_ops = it->nops - 1;
    c.scalar_b = nin == 2 && it->nops == 2;
    if (c.scalar_b && c.tr.bool_in) return NK_INVALID;
    if (!nk_ew_compute_dtype(c.common, &c.cdt)) return NK_UNSUPPORTED;
    for (int k = 0; k < it->nops; k++) {
        nk_dtype cd;
        const bool bool_operand = k > 0 && (c.tr.bool_in & (1u << (k - 1)));
        if (!bool_operand && !nk_ew_compute_dtype(it->dtype[k], &cd)) return NK_UNSUPPORTED;
    }
    c.f32 = nk_ew_f32_select();
    c.fn = c.cdt == NK_F32 ? c.f32->fn[op] : c.cdt == NK_F64 ? nk_ew_f64_fns[op] : nk_ew_i64_fns[op];
    if (c.fn == NULL) return NK_UNSUPPORTED;
    c.direct = !c.scalar_b && c.common == c.cdt;
    bool all_bf16 = !c.scalar_b && c.common == NK_BF16 && !c.tr.pred && it->dtype[0] == NK_BF16;
    for (int k = 1; k < it->nops; k++) {
        const bool bool_operand = (c.tr.bool_in & (1u << (k - 1))) != 0;
        c.direct = c.direct && (bool_operand ? it->dtype[k] == NK_BOOL : it->dtype[k] == c.cdt);
        all_bf16 = all_bf16 && !bool_operand && it->dtype[k] == NK_BF16;
    }
    c.bf16_fn = all_bf16 ? c.f32->bf16[op] : NULL;
    if (c.cdt == NK_F32 && c.tr.nin == 2 && !c.scalar_b && !c.tr.bool_in) {
        c.vs_fn = c.f32->vs[op - B(0)];
        c.sv_fn = c.f32->sv[op - B(0)];
        if (all_bf16) {
            c.bf16_vs_fn = c.f32->bf16_vs[op - B(0)];
            c.bf16_sv_fn = c.f32->bf16_sv[op - B(0)];
        }
    }
    if (numel == 0) return NK_SUCCESS;

    nk_ew_params none;
    memset(&none, 0, sizeof none);
    none.alpha.i = 1;
    if (p == NULL) p = &none;
    nk_ew_widen(&p->alpha, &c.args, NK_ARG_ALPHA);
    nk_ew_widen(&p->value, &c.args, NK_ARG_VALUE);
    nk_ew_widen(&p->lo, &c.args, NK_ARG_LO);
    nk_ew_widen(&p->hi, &c.args, NK_ARG_HI);
    if (!p->has_lo) {
        c.args.f32[NK_ARG_LO] = -INFINITY;
        c.args.f64[NK_ARG_LO] = -INFINITY;
        c.args.i64[NK_ARG_LO] = INT64_MIN;
    }
    if (!p->has_hi) {
        c.args.f32[NK_ARG_HI] = INFINITY;
        c.args.f64[NK_ARG_HI] = INFINITY;
        c.args.i64[NK_ARG_HI] = INT64_MAX;
    }
    c.args.reduced = (c.common == NK_BF16 || c.common == NK_F16) ? (int32_t)c.common : -1;
    atomic_init(&c.failed, 0);

    /* ~32K elements per chunk: below that a thread hand-off costs more than it saves. */
    nk_parallel_for(numel, 32768, nk_ew_chunk, &c);
    return atomic_load(&c.failed) ? NK_DIV_BY_ZERO : NK_SUCCESS;
}

nk_status nk_unary(nk_unary_op op, const nk_ew_iter *it, const nk_ew_params *p) {
    if ((int)op < 0 || op >= NK_UNARY_COUNT) return NK_INVALID;
    return nk_ew_run(U(op), it, p, 1);
}

nk_status nk_binary(nk_binary_op op, const nk_ew_iter *it, const nk_ew_params *p) {
    if ((int)op < 0 || op >= NK_BINARY_COUNT) return NK_INVALID;
    return nk_ew_run(B(op), it, p, 2);
}

nk_status nk_ternary(nk_ternary_op op, const nk_ew_iter *it, const nk_ew_params *p) {
    if ((int)op < 0 || op >= NK_TERNARY_COUNT) return NK_INVALID;
    return nk_ew_run(T(op), it, p, 3);
}
