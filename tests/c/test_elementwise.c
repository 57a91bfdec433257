/*
 * test_elementwise.c - nk_unary / nk_binary / nk_ternary against a scalar double-precision reference:
 * every ISA table, odd sizes, strides, broadcasting, 0-size, mixed dtypes, integer division by zero,
 * and the accuracy of the vector math (in ulps against libm in double).
 */
#include "elementwise_internal.h"
#include "neuron_kernels.h"
#include "vecmath.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_checks, g_failures;
#define CHECK_MSG(cond, ...)                                                                   \
    do {                                                                                       \
        g_checks++;                                                                            \
        if (!(cond)) {                                                                         \
            if (++g_failures <= 40) {                                                          \
                fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);       \
                fprintf(stderr, __VA_ARGS__);                                                  \
                fprintf(stderr, "\n");                                                         \
            }                                                                                  \
        }                                                                                      \
    } while (0)

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double frand(double lo, double hi) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return lo + (hi - lo) * (double)(g_rng >> 11) / 9007199254740992.0;
}

/* ulp distance between floats (sign-magnitude to ordered ints). */
static int64_t ulp_diff(float a, float b) {
    if (isnan(a) && isnan(b)) return 0;
    if (isnan(a) || isnan(b)) return INT64_MAX;
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0) ia = INT32_MIN - ia;
    if (ib < 0) ib = INT32_MIN - ib;
    return llabs((long long)ia - (long long)ib);
}

/* ---- vector math accuracy ---- */

static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static void check_vm(const char *name, float (*f)(float), double (*ref)(double), double lo, double hi, int64_t max_ulp,
                     double abs_tol) {
    int64_t worst = 0;
    float worst_x = 0;
    for (int i = 0; i < 200000; i++) {
        const float x = (float)frand(lo, hi);
        const float got = f(x);
        const float want = (float)ref((double)x);
        int64_t u = ulp_diff(got, want);
        if (fabs((double)got - (double)want) <= abs_tol) u = 0;
        if (u > worst) {
            worst = u;
            worst_x = x;
        }
    }
    CHECK_MSG(worst <= max_ulp, "%s: %lld ulp at x=%.9g (got %.9g want %.9g)", name, (long long)worst, worst_x,
              f(worst_x), (float)ref(worst_x));
}

static void test_vecmath(void) {
    check_vm("exp", nk_vm_exp, exp, -103, 88.7, 2, 0);
    check_vm("exp small", nk_vm_exp, exp, -1, 1, 2, 0);
    /* log is correctly rounded: 0 ulp from the double result rounded to float. */
    check_vm("log", nk_vm_log, log, 1e-30, 1e30, 0, 0);
    check_vm("log near 1", nk_vm_log, log, 0.5, 2, 0, 0);
    check_vm("log small", nk_vm_log, log, 1e-6, 1e-3, 0, 0);
    check_vm("log mid", nk_vm_log, log, 1, 1000, 0, 0);
    check_vm("tanh", nk_vm_tanh, tanh, -10, 10, 3, 0);
    check_vm("tanh small", nk_vm_tanh, tanh, -0.7, 0.7, 3, 0);
    check_vm("sigmoid", nk_vm_sigmoid, ref_sigmoid, -80, 30, 3, 0);
    check_vm("erf small", nk_vm_erf, erf, -1, 1, 3, 0);
    check_vm("erf", nk_vm_erf, erf, -6, 6, 3, 2e-7);
    check_vm("sin", nk_vm_sin, sin, -10, 10, 3, 1e-7);
    check_vm("cos", nk_vm_cos, cos, -100, 100, 3, 1e-7);
    check_vm("sin wide", nk_vm_sin, sin, -8000, 8000, 4, 1e-6);
    /* Specials. */
    CHECK_MSG(isinf(nk_vm_exp(INFINITY)) && nk_vm_exp(-INFINITY) == 0.0f && isnan(nk_vm_exp(NAN)), "exp specials");
    CHECK_MSG(isinf(nk_vm_exp(100.0f)) && nk_vm_exp(-110.0f) == 0.0f, "exp range");
    CHECK_MSG(nk_vm_log(0.0f) == -INFINITY && isnan(nk_vm_log(-1.0f)) && nk_vm_log(INFINITY) == INFINITY &&
                  isnan(nk_vm_log(NAN)) && nk_vm_log(1.0f) == 0.0f,
              "log specials");
    CHECK_MSG(ulp_diff(nk_vm_log(1e-45f), (float)log((double)1e-45f)) == 0, "log subnormal %g", nk_vm_log(1e-45f));
    CHECK_MSG(nk_vm_tanh(INFINITY) == 1.0f && nk_vm_tanh(-INFINITY) == -1.0f && isnan(nk_vm_tanh(NAN)), "tanh specials");
    CHECK_MSG(nk_vm_erf(INFINITY) == 1.0f && nk_vm_erf(-INFINITY) == -1.0f && isnan(nk_vm_erf(NAN)), "erf specials");
}

/* ---- kernels against a reference ---- */

static double load(const void *base, nk_dtype dt, int64_t i) {
    switch (dt) {
    case NK_BOOL: case NK_U8: return ((const uint8_t *)base)[i];
    case NK_I8: return ((const int8_t *)base)[i];
    case NK_I16: return ((const int16_t *)base)[i];
    case NK_I32: return ((const int32_t *)base)[i];
    case NK_I64: return (double)((const int64_t *)base)[i];
    case NK_F16: return nk_f16_to_f32(((const uint16_t *)base)[i]);
    case NK_BF16: return nk_bf16_to_f32(((const uint16_t *)base)[i]);
    case NK_F32: return ((const float *)base)[i];
    case NK_F64: return ((const double *)base)[i];
    default: return 0;
    }
}

static void store(void *base, nk_dtype dt, int64_t i, double v) {
    switch (dt) {
    case NK_BOOL: ((uint8_t *)base)[i] = v != 0; break;
    case NK_U8: ((uint8_t *)base)[i] = (uint8_t)(int64_t)v; break;
    case NK_I8: ((int8_t *)base)[i] = (int8_t)(int64_t)v; break;
    case NK_I16: ((int16_t *)base)[i] = (int16_t)(int64_t)v; break;
    case NK_I32: ((int32_t *)base)[i] = (int32_t)(int64_t)v; break;
    case NK_I64: ((int64_t *)base)[i] = (int64_t)v; break;
    case NK_F16: ((uint16_t *)base)[i] = nk_f32_to_f16((float)v); break;
    case NK_BF16: ((uint16_t *)base)[i] = nk_f32_to_bf16((float)v); break;
    case NK_F32: ((float *)base)[i] = (float)v; break;
    case NK_F64: ((double *)base)[i] = v; break;
    default: break;
    }
}

static bool is_float(nk_dtype t) { return t == NK_F16 || t == NK_BF16 || t == NK_F32 || t == NK_F64; }

/* Tolerance of a result of dtype t computed in float vs the double reference. */
static bool close_to(double got, double want, nk_dtype t) {
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    const double rtol = t == NK_BF16 ? 1.6e-2 : t == NK_F16 ? 2e-3 : t == NK_F32 ? 2e-6 : t == NK_F64 ? 1e-12 : 0;
    const double atol = t == NK_BF16 ? 1e-2 : t == NK_F16 ? 1e-3 : t == NK_F32 ? 1e-6 : t == NK_F64 ? 1e-12 : 0;
    return fabs(got - want) <= atol + rtol * fabs(want);
}

static double ref_unary(nk_unary_op op, double x, const nk_ew_params *p) {
    switch (op) {
    case NK_NEG: return -x;
    case NK_ABS: return fabs(x);
    case NK_EXP: return exp(x);
    case NK_LOG: return log(x);
    case NK_SQRT: return sqrt(x);
    case NK_RSQRT: return 1 / sqrt(x);
    case NK_RECIPROCAL: return 1 / x;
    case NK_SIN: return sin(x);
    case NK_COS: return cos(x);
    case NK_TANH: return tanh(x);
    case NK_SIGMOID: return 1 / (1 + exp(-x));
    case NK_SILU: return x / (1 + exp(-x));
    case NK_GELU: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    case NK_GELU_TANH: return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case NK_RELU: return x > 0 ? x : 0;
    case NK_CLAMP: return fmin(fmax(x, p->lo.f), p->hi.f);
    case NK_POW_SCALAR: return pow(x, p->value.f);
    default: return NAN;
    }
}

/*
 * Runs a unary op on an [rows, cols] input with a given column stride (elements) and dtype, output
 * contiguous of dtype od, and compares with the reference.
 */
static void run_unary(nk_unary_op op, nk_dtype it, nk_dtype od, int64_t rows, int64_t cols, int64_t cstride,
                      double lo, double hi, const nk_ew_params *p) {
    const size_t ies = nk_dtype_size(it), oes = nk_dtype_size(od);
    const int64_t in_n = rows * cols * cstride + 1, out_n = rows * cols + 1;
    unsigned char *x = calloc((size_t)in_n, ies), *y = calloc((size_t)out_n, oes);
    for (int64_t i = 0; i < in_n; i++) store(x, it, i, frand(lo, hi));
    nk_ew_iter e;
    memset(&e, 0, sizeof e);
    e.ndim = 2;
    e.nops = 2;
    e.sizes[0] = cols;
    e.sizes[1] = rows;
    e.data[0] = y;
    e.data[1] = x;
    e.dtype[0] = od;
    e.dtype[1] = it;
    e.common = it;
    e.strides[0][0] = (int64_t)oes;
    e.strides[0][1] = cols * (int64_t)oes;
    e.strides[1][0] = cstride * (int64_t)ies;
    e.strides[1][1] = cols * cstride * (int64_t)ies;
    nk_status st = nk_unary(op, &e, p);
    CHECK_MSG(st == NK_SUCCESS, "unary %d status %d", op, st);
    int bad = 0;
    for (int64_t r = 0; r < rows && st == NK_SUCCESS; r++)
        for (int64_t c = 0; c < cols; c++) {
            const double xv = load(x, it, (r * cols + c) * cstride);
            double want = ref_unary(op, xv, p);
            if (!is_float(od)) want = (double)(int64_t)want;
            const double got = load(y, od, r * cols + c);
            if (!close_to(got, want, is_float(od) ? od : NK_I64) && bad++ < 3)
                CHECK_MSG(0, "unary %d %s->%s x=%.9g got %.9g want %.9g", op, nk_dtype_name(it), nk_dtype_name(od),
                          xv, got, want);
        }
    g_checks++;
    free(x);
    free(y);
}

static double ref_binary(nk_binary_op op, double a, double b, double alpha) {
    switch (op) {
    case NK_ADD: return a + alpha * b;
    case NK_MUL: return a * b;
    case NK_DIV: return a / b;
    case NK_DIV_TRUNC: return trunc(a / b);
    case NK_DIV_FLOOR: return floor(a / b);
    case NK_EQ: return a == b;
    case NK_NE: return a != b;
    case NK_LT: return a < b;
    case NK_LE: return a <= b;
    case NK_GT: return a > b;
    case NK_GE: return a >= b;
    case NK_LOGICAL_AND: return a != 0 && b != 0;
    case NK_LOGICAL_OR: return a != 0 || b != 0;
    case NK_LOGICAL_XOR: return (a != 0) != (b != 0);
    case NK_BITWISE_AND: return (double)((int64_t)a & (int64_t)b);
    case NK_BITWISE_OR: return (double)((int64_t)a | (int64_t)b);
    case NK_BITWISE_XOR: return (double)((int64_t)a ^ (int64_t)b);
    case NK_MAXIMUM: return fmax(a, b);
    case NK_MINIMUM: return fmin(a, b);
    case NK_SIGMOID_BACKWARD: return a * (1 - b) * b;
    case NK_TANH_BACKWARD: return a * (1 - b * b);
    case NK_SILU_BACKWARD: {
        const double s = 1 / (1 + exp(-b));
        return a * s * (1 + b * (1 - s));
    }
    case NK_GELU_BACKWARD:
        return a * (0.5 * (1 + erf(b / sqrt(2.0))) + b * exp(-0.5 * b * b) / sqrt(2 * M_PI));
    default: return NAN;
    }
}

/*
 * a: [rows, cols] with column stride astride (dtype at); b: [cols] broadcast over rows (stride 0 in the
 * row dim), or a true scalar when bcast_all; out contiguous od. common given.
 */
static void run_binary(nk_binary_op op, nk_dtype at, nk_dtype bt, nk_dtype od, nk_dtype common, int64_t rows,
                       int64_t cols, int64_t astride, bool bcast_all, double lo, double hi, double alpha) {
    const size_t aes = nk_dtype_size(at), bes = nk_dtype_size(bt), oes = nk_dtype_size(od);
    const int64_t an = rows * cols * astride + 1, bn = cols + 1, on = rows * cols + 1;
    unsigned char *a = calloc((size_t)an, aes), *b = calloc((size_t)bn, bes), *y = calloc((size_t)on, oes);
    for (int64_t i = 0; i < an; i++) store(a, at, i, is_float(at) ? frand(lo, hi) : floor(frand(lo, hi)));
    for (int64_t i = 0; i < bn; i++) {
        double v = is_float(bt) ? frand(lo, hi) : floor(frand(lo, hi));
        if ((op == NK_DIV_TRUNC || op == NK_DIV_FLOOR) && v == 0) v = 3;
        store(b, bt, i, v);
    }
    nk_ew_iter e;
    memset(&e, 0, sizeof e);
    e.ndim = 2;
    e.nops = 3;
    e.sizes[0] = cols;
    e.sizes[1] = rows;
    e.data[0] = y;
    e.data[1] = a;
    e.data[2] = b;
    e.dtype[0] = od;
    e.dtype[1] = at;
    e.dtype[2] = bt;
    e.common = common;
    e.strides[0][0] = (int64_t)oes;
    e.strides[0][1] = cols * (int64_t)oes;
    e.strides[1][0] = astride * (int64_t)aes;
    e.strides[1][1] = cols * astride * (int64_t)aes;
    e.strides[2][0] = bcast_all ? 0 : (int64_t)bes;
    e.strides[2][1] = 0;
    nk_ew_params p;
    memset(&p, 0, sizeof p);
    if (is_float(common)) {
        p.alpha.is_float = true;
        p.alpha.f = alpha;
    } else {
        p.alpha.i = (int64_t)alpha;
    }
    nk_status st = nk_binary(op, &e, &p);
    CHECK_MSG(st == NK_SUCCESS, "binary %d status %d", op, st);
    const bool pred = op >= NK_EQ && op <= NK_LOGICAL_XOR;
    int bad = 0;
    for (int64_t r = 0; r < rows && st == NK_SUCCESS; r++)
        for (int64_t c = 0; c < cols; c++) {
            /* Inputs as the kernel sees them: converted to the common dtype first. */
            double av = load(a, at, (r * cols + c) * astride), bv = load(b, bt, bcast_all ? 0 : c);
            unsigned char tmp[8];
            store(tmp, common, 0, av);
            av = load(tmp, common, 0);
            store(tmp, common, 0, bv);
            bv = load(tmp, common, 0);
            double want = ref_binary(op, av, bv, alpha);
            if (op == NK_DIV_TRUNC && (common == NK_BF16 || common == NK_F16)) {
                /* PyTorch rounds the quotient to the reduced dtype before truncating. */
                store(tmp, common, 0, av / bv);
                want = trunc(load(tmp, common, 0));
            }
            if (!pred) {
                store(tmp, common, 0, want);
                want = load(tmp, common, 0);
            }
            store(tmp, od, 0, want);
            want = load(tmp, od, 0);
            const double got = load(y, od, r * cols + c);
            const nk_dtype tol = pred || !is_float(common) ? NK_I64 : common;
            if (!close_to(got, want, tol) && bad++ < 3)
                CHECK_MSG(0, "binary %d (%s,%s)->%s common %s a=%.9g b=%.9g got %.9g want %.9g", op, nk_dtype_name(at),
                          nk_dtype_name(bt), nk_dtype_name(od), nk_dtype_name(common), av, bv, got, want);
        }
    g_checks++;
    free(a);
    free(b);
    free(y);
}

static void test_unary(void) {
    static const nk_dtype fl[] = {NK_F32, NK_BF16, NK_F16, NK_F64};
    static const int64_t shapes[][3] = {{1, 1, 1}, {3, 17, 1}, {5, 1031, 1}, {4, 33, 3}, {2, 700, 2}};
    nk_ew_params p;
    memset(&p, 0, sizeof p);
    for (size_t d = 0; d < sizeof fl / sizeof fl[0]; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t R = shapes[s][0], C = shapes[s][1], S = shapes[s][2];
            for (int op = NK_NEG; op <= NK_RELU; op++) {
                double lo = -8, hi = 8;
                if (op == NK_LOG || op == NK_SQRT || op == NK_RSQRT) lo = 0.01;
                if (fl[d] == NK_F16 && op == NK_EXP) hi = 10;
                run_unary((nk_unary_op)op, fl[d], fl[d], R, C, S, lo, hi, &p);
            }
            p.has_lo = p.has_hi = true;
            p.lo.is_float = p.hi.is_float = true;
            p.lo.f = -0.5;
            p.hi.f = 0.75;
            run_unary(NK_CLAMP, fl[d], fl[d], R, C, S, -2, 2, &p);
            p.value.is_float = true;
            const double exps[] = {2, 3, -2, 0.5, -0.5, -1, 1.7};
            for (int k = 0; k < 7; k++) {
                p.value.f = exps[k];
                run_unary(NK_POW_SCALAR, fl[d], fl[d], R, C, S, 0.1, 3, &p);
            }
            memset(&p, 0, sizeof p);
        }
    /* Integer input, float output (exp of an int tensor computes in float). */
    nk_ew_params none;
    memset(&none, 0, sizeof none);
    run_unary(NK_NEG, NK_I32, NK_I32, 3, 100, 1, -1000, 1000, &none);
    run_unary(NK_ABS, NK_I8, NK_I8, 3, 100, 2, -100, 100, &none);
}

static void test_binary(void) {
    static const nk_dtype fl[] = {NK_F32, NK_BF16, NK_F16, NK_F64};
    static const int64_t shapes[][3] = {{1, 1, 1}, {3, 17, 1}, {7, 1031, 1}, {4, 33, 3}, {2, 600, 2}};
    for (size_t d = 0; d < 4; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t R = shapes[s][0], C = shapes[s][1], S = shapes[s][2];
            for (int op = NK_ADD; op <= NK_LOGICAL_XOR; op++) {
                const nk_dtype od = (op >= NK_EQ) ? NK_BOOL : fl[d];
                run_binary((nk_binary_op)op, fl[d], fl[d], od, fl[d], R, C, S, false, -4, 4, 1.0);
                run_binary((nk_binary_op)op, fl[d], fl[d], od, fl[d], R, C, S, true, -4, 4, 1.0);
            }
            run_binary(NK_ADD, fl[d], fl[d], fl[d], fl[d], R, C, S, false, -4, 4, 2.5);
            for (int op = NK_MAXIMUM; op <= NK_MINIMUM; op++)
                run_binary((nk_binary_op)op, fl[d], fl[d], fl[d], fl[d], R, C, S, false, -4, 4, 1.0);
            for (int op = NK_SILU_BACKWARD; op <= NK_TANH_BACKWARD; op++)
                if (op != NK_GELU_TANH_BACKWARD)
                    run_binary((nk_binary_op)op, fl[d], fl[d], fl[d], fl[d], R, C, S, false, -4, 4, 1.0);
        }
    /* Mixed dtypes: an int tensor and a float scalar (common float), bf16 with a float32 scalar
     * (rounded to bf16 first), a float result stored to float64, a predicate stored to float. */
    run_binary(NK_ADD, NK_I32, NK_F32, NK_F32, NK_F32, 5, 77, 1, true, -50, 50, 1.0);
    run_binary(NK_MUL, NK_BF16, NK_F32, NK_BF16, NK_BF16, 5, 77, 1, true, -5, 5, 1.0);
    run_binary(NK_ADD, NK_F32, NK_F32, NK_F64, NK_F32, 5, 77, 2, false, -5, 5, 1.0);
    run_binary(NK_LT, NK_F32, NK_F32, NK_F32, NK_F32, 5, 77, 2, false, -5, 5, 1.0);
    /* Integers. */
    static const nk_dtype in[] = {NK_I64, NK_I32, NK_I16, NK_I8, NK_U8};
    for (size_t d = 0; d < 5; d++) {
        const double lo = in[d] == NK_U8 ? 0 : -100, hi = 100;
        for (int op = NK_ADD; op <= NK_BITWISE_XOR; op++) {
            if (op == NK_DIV) continue;
            const nk_dtype od = (op >= NK_EQ && op <= NK_LOGICAL_XOR) ? NK_BOOL : in[d];
            run_binary((nk_binary_op)op, in[d], in[d], od, in[d], 3, 301, 1, false, lo, hi, 1.0);
            run_binary((nk_binary_op)op, in[d], in[d], od, in[d], 3, 301, 2, true, lo, hi, 1.0);
        }
        run_binary(NK_ADD, in[d], in[d], in[d], in[d], 3, 301, 1, false, lo, hi, 3.0);
    }
    /* int32 wrap-around in the narrow type. */
    run_binary(NK_MUL, NK_I32, NK_I32, NK_I32, NK_I32, 2, 100, 1, false, 1e5, 3e5, 1.0);
}

static void test_special_cases(void) {
    /* 0-size: nothing touched, success. */
    nk_ew_iter e;
    memset(&e, 0, sizeof e);
    float dummy = 7;
    e.ndim = 2;
    e.nops = 2;
    e.sizes[0] = 0;
    e.sizes[1] = 5;
    e.data[0] = e.data[1] = &dummy;
    e.dtype[0] = e.dtype[1] = e.common = NK_F32;
    CHECK_MSG(nk_unary(NK_EXP, &e, NULL) == NK_SUCCESS && dummy == 7, "0-size");
    /* 0-dim (one element). */
    float x = 1.0f, y = 0;
    memset(&e, 0, sizeof e);
    e.nops = 2;
    e.data[0] = &y;
    e.data[1] = &x;
    e.dtype[0] = e.dtype[1] = e.common = NK_F32;
    CHECK_MSG(nk_unary(NK_EXP, &e, NULL) == NK_SUCCESS && fabsf(y - 2.7182817f) < 1e-6f, "0-dim exp %g", y);
    /* Unsupported common dtype and bad descriptors. */
    e.common = NK_U32;
    CHECK_MSG(nk_unary(NK_EXP, &e, NULL) == NK_UNSUPPORTED, "u32 unsupported");
    e.common = NK_F32;
    e.nops = 3;
    CHECK_MSG(nk_unary(NK_EXP, &e, NULL) == NK_INVALID, "operand count");
    e.nops = 2;
    CHECK_MSG(nk_unary((nk_unary_op)99, &e, NULL) == NK_INVALID, "bad op");
    e.common = NK_I64;
    CHECK_MSG(nk_unary(NK_EXP, &e, NULL) == NK_UNSUPPORTED, "exp on int64 compute");
    /* Integer division by zero. */
    int32_t a[5] = {1, 2, 3, 4, 5}, b[5] = {1, 1, 0, 1, 1}, q[5];
    memset(&e, 0, sizeof e);
    e.ndim = 1;
    e.nops = 3;
    e.sizes[0] = 5;
    e.data[0] = q;
    e.data[1] = a;
    e.data[2] = b;
    e.dtype[0] = e.dtype[1] = e.dtype[2] = e.common = NK_I32;
    for (int k = 0; k < 3; k++) e.strides[k][0] = 4;
    CHECK_MSG(nk_binary(NK_DIV_FLOOR, &e, NULL) == NK_DIV_BY_ZERO, "div by zero");
    /* Floor division signs. */
    int32_t fa[4] = {7, -7, 7, -7}, fb[4] = {2, 2, -2, -2}, fq[4];
    e.sizes[0] = 4;
    e.data[0] = fq;
    e.data[1] = fa;
    e.data[2] = fb;
    CHECK_MSG(nk_binary(NK_DIV_FLOOR, &e, NULL) == NK_SUCCESS && fq[0] == 3 && fq[1] == -4 && fq[2] == -4 && fq[3] == 3,
              "floor div %d %d %d %d", fq[0], fq[1], fq[2], fq[3]);
    /* where with a broadcast bool condition, masked_fill in place, scalar b, NaN propagation. */
    float wa[6] = {1, 2, 3, 4, 5, 6}, wb[6] = {-1, -2, -3, -4, -5, -6}, wo[6];
    uint8_t cond[3] = {1, 0, 1};
    memset(&e, 0, sizeof e);
    e.ndim = 2;
    e.nops = 4;
    e.sizes[0] = 3;
    e.sizes[1] = 2;
    e.data[0] = wo;
    e.data[1] = cond;
    e.data[2] = wa;
    e.data[3] = wb;
    e.dtype[0] = e.dtype[2] = e.dtype[3] = e.common = NK_F32;
    e.dtype[1] = NK_BOOL;
    e.strides[0][0] = e.strides[2][0] = e.strides[3][0] = 4;
    e.strides[0][1] = e.strides[2][1] = e.strides[3][1] = 12;
    e.strides[1][0] = 1;
    e.strides[1][1] = 0;
    CHECK_MSG(nk_ternary(NK_WHERE, &e, NULL) == NK_SUCCESS && wo[0] == 1 && wo[1] == -2 && wo[2] == 3 && wo[3] == 4 &&
                  wo[4] == -5 && wo[5] == 6,
              "where");
    nk_ew_params p;
    memset(&p, 0, sizeof p);
    p.value.is_float = true;
    p.value.f = 9.5;
    memset(&e, 0, sizeof e);
    e.ndim = 1;
    e.nops = 3;
    e.sizes[0] = 3;
    e.data[0] = e.data[1] = wa;
    e.data[2] = cond;
    e.dtype[0] = e.dtype[1] = e.common = NK_F32;
    e.dtype[2] = NK_BOOL;
    e.strides[0][0] = e.strides[1][0] = 4;
    e.strides[2][0] = 1;
    CHECK_MSG(nk_binary(NK_MASKED_FILL, &e, &p) == NK_SUCCESS && wa[0] == 9.5f && wa[1] == 2 && wa[2] == 9.5f,
              "masked_fill in place");
    float na[3] = {NAN, 1, INFINITY}, nb[3] = {0, NAN, -INFINITY}, no[3];
    memset(&e, 0, sizeof e);
    e.ndim = 1;
    e.nops = 3;
    e.sizes[0] = 3;
    e.data[0] = no;
    e.data[1] = na;
    e.data[2] = nb;
    e.dtype[0] = e.dtype[1] = e.dtype[2] = e.common = NK_F32;
    for (int k = 0; k < 3; k++) e.strides[k][0] = 4;
    CHECK_MSG(nk_binary(NK_MAXIMUM, &e, NULL) == NK_SUCCESS && isnan(no[0]) && isnan(no[1]) && no[2] == INFINITY,
              "maximum NaN");
    CHECK_MSG(nk_binary(NK_ADD, &e, NULL) == NK_SUCCESS && isnan(no[0]) && isnan(no[1]) && isnan(no[2]), "add NaN/inf");
    e.nops = 2;
    p.value.f = 2.0;
    CHECK_MSG(nk_binary(NK_MUL, &e, &p) == NK_SUCCESS && isnan(no[0]) && no[1] == 2 && no[2] == INFINITY, "scalar b");
}

static void test_all_isas(void (*fn)(void)) {
    /* The driver picks the best table; check that the others give the same results on this CPU. */
    const nk_ew_f32_table *best = nk_ew_f32_select();
    printf("elementwise ISA: %s\n", best->isa);
    fn();
#ifdef NK_EW_HAVE_X86
    const nk_ew_f32_table *tables[3] = {&nk_ew_f32_generic, &nk_ew_f32_avx2, &nk_ew_f32_avx512};
    const bool ok[3] = {true, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
                        __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")};
    float x[1000], y[3][1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)frand(-20, 20);
    const void *in[1] = {x};
    nk_ew_args a;
    memset(&a, 0, sizeof a);
    for (int op = NK_EXP; op <= NK_GELU_TANH; op++) {
        for (int t = 0; t < 3; t++)
            if (ok[t]) tables[t]->fn[NK_EW_UNARY(op)](y[t], in, 1000, &a);
        for (int t = 1; t < 3; t++) {
            if (!ok[t]) continue;
            int64_t worst = 0;
            for (int i = 0; i < 1000; i++) {
                int64_t u = ulp_diff(y[t][i], y[0][i]);
                if (fabsf(y[t][i] - y[0][i]) <= 1e-6f) u = 0;
                if (u > worst) worst = u;
            }
            CHECK_MSG(worst <= 4, "op %d: %s vs generic %lld ulp", op, tables[t]->isa, (long long)worst);
        }
    }
#endif
}

/* The AVX-512 exp (vscalefps) against the AVX2 table's (nk_vm_exp with FMA, the same reduction and polynomial):
 * the same bits, NaN payloads included, over a spread of all 2^32 bit patterns and every tail length. */
static void test_exp_avx512_bits(void) {
#ifdef NK_EW_HAVE_X86
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
          __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
        printf("no avx512: exp bits not checked\n");
        return;
    }
    enum { B = 4096 };
    static float x[B], a[B], b[B];
    const void *in[1] = {x};
    nk_ew_args args;
    memset(&args, 0, sizeof args);
    int64_t bad = 0;
    for (uint64_t base = 0; base < (UINT64_C(1) << 32); base += UINT64_C(4093) * B) {
        for (int i = 0; i < B; i++) {
            const uint32_t u = (uint32_t)(base + (uint64_t)i * 4093u);
            memcpy(&x[i], &u, 4);
        }
        for (int n = B - 15; n <= B; n++) { /* the masked tails */
            nk_ew_f32_avx512.fn[NK_EW_UNARY(NK_EXP)](a, in, n, &args);
            nk_ew_f32_avx2.fn[NK_EW_UNARY(NK_EXP)](b, in, n, &args);
            for (int i = n > 64 ? n - 64 : 0; i < n; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
            if (n == B) for (int i = 0; i < B - 64; i++) bad += memcmp(&a[i], &b[i], 4) != 0;
        }
    }
    CHECK_MSG(bad == 0, "avx512 exp differs from nk_vm_exp in %lld values", (long long)bad);
#endif
}

/* The AVX512_BF16 table: its float -> bfloat16 conversion and fused all-bfloat16 ops must give the
 * generic table's bits (subnormals, NaN, ties, every tail length). */
static void test_bf16_table(void) {
#ifdef NK_EW_HAVE_X86
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
          __builtin_cpu_supports("avx512bf16"))) {
        printf("no avx512bf16: bf16 table not checked\n");
        return;
    }
    const nk_ew_f32_table *t = &nk_ew_f32_avx512bf16, *g = &nk_ew_f32_generic;
    enum { N = 1037 };
    static const uint32_t special[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7F800000u, 0xFF800000u,
                                       0x00000001u, 0x80000001u, 0x007FFFFFu, 0x00008000u, 0x00018000u,
                                       0x80000000u, 0u, 0x7F7FFFFFu, 0x3F808000u, 0x3F818000u, 0x3F807FFFu};
    static float f[N];
    static uint16_t got[N], want[N], a16[N], b16[N];
    for (int i = 0; i < N; i++) {
        uint32_t u = (uint32_t)(frand(0, 4294967295.0));
        if (i % 3 == 0) u = special[(i / 3) % (int)(sizeof special / sizeof special[0])];
        memcpy(&f[i], &u, sizeof u);
    }
    for (int64_t n = 0; n <= 40; n++) {
        memset(got, 0xAB, sizeof got);
        t->to_bf16(got, f + 3, n);
        g->to_bf16(want, f + 3, n);
        CHECK_MSG(memcmp(got, want, (size_t)n * 2) == 0 && got[n] == 0xABAB, "to_bf16 n=%lld", (long long)n);
    }
    t->to_bf16(got, f, N);
    g->to_bf16(want, f, N);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += got[i] != want[i];
    CHECK_MSG(bad == 0, "to_bf16: %d mismatches", bad);
    /* Fused ops against widen / generic op / round. */
    g->to_bf16(a16, f, N);
    for (int i = 0; i < N; i++) f[i] = (float)frand(-30, 30) * (i % 7 == 0 ? 1e-38f : 1.0f);
    g->to_bf16(b16, f, N);
    static float fa[N], fb[N], fo[N];
    g->from_bf16(fa, a16, N);
    g->from_bf16(fb, b16, N);
    const int ops[] = {NK_EW_BINARY(NK_ADD), NK_EW_BINARY(NK_MUL), NK_EW_BINARY(NK_DIV), NK_EW_UNARY(NK_SILU)};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        CHECK_MSG(t->bf16[ops[k]] != NULL, "fused op %d missing", ops[k]);
        if (!t->bf16[ops[k]]) continue;
        for (int alpha_case = 0; alpha_case < 2; alpha_case++) {
            nk_ew_args a;
            memset(&a, 0, sizeof a);
            a.f32[NK_ARG_ALPHA] = alpha_case ? -0.37f : 1.0f;
            a.reduced = NK_BF16;
            const void *in16[2] = {a16, b16}, *in32[2] = {fa, fb};
            for (int64_t n = 1; n <= N; n += n < 40 ? 1 : 331) {
                t->bf16[ops[k]](got, in16, n, &a);
                t->fn[ops[k]](fo, in32, n, &a);
                g->to_bf16(want, fo, n);
                bad = 0;
                for (int64_t i = 0; i < n; i++) {
                    const bool nan_g = (got[i] & 0x7FFF) > 0x7F80, nan_w = (want[i] & 0x7FFF) > 0x7F80;
                    bad += nan_g != nan_w || (!nan_w && got[i] != want[i]);
                }
                CHECK_MSG(bad == 0, "fused op %d alpha %d n=%lld: %d mismatches", ops[k], alpha_case, (long long)n, bad);
            }
        }
    }
#endif
}

int main(void) {
    test_vecmath();
    test_bf16_table();
    test_exp_avx512_bits();
    test_all_isas(test_unary);
    test_binary();
    test_special_cases();
    nk_threads_set(2);
    test_binary(); /* again with the pool */
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
