/*
 * elementwise_f32.h - the float32 loops of the element-wise ops, written once in plain C and compiled
 * once per instruction set: elementwise_f32_<isa>.c sets the target (GCC pragma), NK_VM_FMA and
 * NK_EW_TABLE, then includes this file. The loops are simple enough for GCC to vectorise at that
 * target; the formulas follow PyTorch's CPU kernels so results agree to rounding.
 */
#include "elementwise_internal.h"
#include "vecmath.h"

#define NK_EW_F(name) nk_ew_f32_##name

/* out[i] = expr(v) */
#define NK_EW_DEF1(name, expr)                                                                     \
    static int NK_EW_F(name)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {    \
        float *o = (float *)o_;                                                                    \
        const float *x = (const float *)in[0];                                                     \
        (void)A;                                                                                   \
        for (int64_t i = 0; i < n; i++) {                                                          \
            const float v = x[i];                                                                  \
            o[i] = (expr);                                                                         \
        }                                                                                          \
        return 0;                                                                                  \
    }
/* out[i] = expr(a, b) with type otype (float, or uint8_t for predicates) */
/* Also the variants with one operand the same value all row long (in[1] or in[0] one element): a
 * column-broadcast operand (h * rsqrt(var), var of shape [rows, 1]) without replicating it per row. */
#define NK_EW_DEF2(name, otype, expr)                                                              \
    static int NK_EW_F(name)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {    \
        otype *o = (otype *)o_;                                                                    \
        const float *x = (const float *)in[0], *y = (const float *)in[1];                         \
        (void)A;                                                                                   \
        for (int64_t i = 0; i < n; i++) {                                                          \
            const float a = x[i], b = y[i];                                                        \
            o[i] = (expr);                                                                         \
        }                                                                                          \
        return 0;                                                                                  \
    }                                                                                              \
    __attribute__((unused)) static int NK_EW_F(name##_vs)(void *o_, const void *const *in, int64_t n, \
                                                         const nk_ew_args *A) {                    \
        otype *o = (otype *)o_;                                                                    \
        const float *x = (const float *)in[0], b = *(const float *)in[1];                         \
        (void)A;                                                                                   \
        for (int64_t i = 0; i < n; i++) {                                                          \
            const float a = x[i];                                                                  \
            o[i] = (expr);                                                                         \
        }                                                                                          \
        return 0;                                                                                  \
    }                                                                                              \
    __attribute__((unused)) static int NK_EW_F(name##_sv)(void *o_, const void *const *in, int64_t n, \
                                                         const nk_ew_args *A) {                    \
        otype *o = (otype *)o_;                                                                    \
        const float a = *(const float *)in[0], *y = (const float *)in[1];                         \
        (void)A;                                                                                   \
        for (int64_t i = 0; i < n; i++) {                                                          \
            const float b = y[i];                                                                  \
            o[i] = (expr);                                                                         \
        }                                                                                          \
        return 0;                                                                                  \
    }

#define NK_SQRT1_2F 0.707106781186547524f
#define NK_GELU_BETAF 0.797884560802865355f  /* sqrt(2) * 2/sqrt(pi) * 0.5 */
#define NK_GELU_KAPPAF 0.044715f
#define NK_GELU_PDFF 0.398942280401432678f   /* 2/sqrt(pi) * sqrt(1/2) * 0.5 */

static inline float nk_ew_gelu_tanh(float x) {
    const float inner = NK_GELU_BETAF * (x + NK_GELU_KAPPAF * (x * x * x));
    return 0.5f * x * (1.0f + nk_vm_tanh(inner));
}

static inline float nk_ew_gelu_tanh_bwd(float dy, float x) {
    const float x_sq = x * x;
    const float inner = NK_GELU_BETAF * (x + NK_GELU_KAPPAF * (x_sq * x));
    const float t = nk_vm_tanh(inner);
    const float left = 0.5f * x;
    const float left_derivative = 0.5f * (1.0f + t);
    const float inner_derivative = NK_GELU_BETAF * (1.0f + 3.0f * NK_GELU_KAPPAF * x_sq);
    const float right_derivative = left * (1.0f - t * t) * inner_derivative;
    return dy * (left_derivative + right_derivative);
}

static inline float nk_ew_gelu_bwd(float dy, float x) {
    const float cdf = 0.5f * (1.0f + nk_vm_erf(x * NK_SQRT1_2F));
    const float pdf = NK_GELU_PDFF * nk_vm_exp(x * x * -0.5f);
    return dy * (cdf + x * pdf);
}

static inline float nk_ew_silu_bwd(float dy, float x) {
    const float s = nk_vm_sigmoid(x);
    return dy * s * (1.0f + x * (1.0f - s));
}

/* NaN-propagating max/min (std::max order for equal values). */
static inline float nk_ew_maxf(float a, float b) {
    float r = a < b ? b : a;
    r = a != a ? a : r;
    return b != b ? b : r;
}
static inline float nk_ew_minf(float a, float b) {
    float r = b < a ? b : a;
    r = a != a ? a : r;
    return b != b ? b : r;
}

NK_EW_DEF1(neg, -v)
NK_EW_DEF1(abs, fabsf(v))
NK_EW_DEF1(log, nk_vm_log(v))
NK_EW_DEF1(sqrt, __builtin_sqrtf(v))
NK_EW_DEF1(rsqrt, 1.0f / __builtin_sqrtf(v))
NK_EW_DEF1(reciprocal, 1.0f / v)
NK_EW_DEF1(tanh, nk_vm_tanh(v))
NK_EW_DEF1(sigmoid, nk_vm_sigmoid(v))
#if defined(__AVX512F__)
#include <immintrin.h>
/* e^a for the silu denominator. The same reduction and polynomial as nk_vm_exp, but 2^n applied by
 * vscalefps, which over/underflows (to inf, subnormals, 0) and propagates NaN by itself; the clamp
 * keeps the reduction sane for huge |a|, low enough that e^-inf is exactly 0 (min/max return the second operand for NaN, so a NaN
 * argument passes through). */
static inline __m512 nk_ew_v_exp(__m512 a) {
    a = _mm512_max_ps(_mm512_set1_ps(-110.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), a));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(a, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), a);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    const __m512 z = _mm512_mul_ps(r, r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, z, r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* x / (1 + e^-x) with a true division: a reciprocal estimate plus a Newton step is faster but an ulp
 * off the CPU's quotient, and in training that ulp, through Adam's normalised steps, moved logits past
 * the float32 tolerance after one update. */
static inline __m512 nk_ew_v_silu(__m512 x) {
    const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), nk_ew_v_exp(_mm512_sub_ps(_mm512_setzero_ps(), x)));
    return _mm512_div_ps(x, d);
}

static inline __mmask16 nk_ew_tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

/* exp through vscalefps: nk_vm_exp's reduction and polynomial, with 2^n applied in one rounding where
 * nk_vm_exp multiplies by 2^(n/2) (exact) and then 2^(n - n/2) (one rounding): the same bits, in about half the
 * instructions (exp is most of a softmax row). Its clamp to -110 rather than -104 changes nothing: e^-104 already
 * rounds to 0. A NaN comes back as itself, as from nk_vm_exp (checked over every float input). */
static int NK_EW_F(exp)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    float *o = (float *)o_;
    const float *x = (const float *)in[0];
    (void)A;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        _mm512_storeu_ps(o + i, _mm512_mask_mov_ps(nk_ew_v_exp(v), _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v));
    }
    if (i < n) {
        const __mmask16 m = nk_ew_tail_mask(n - i);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        _mm512_mask_storeu_ps(o + i, m,
                              _mm512_mask_mov_ps(nk_ew_v_exp(v), _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v));
    }
    return 0;
}

static int NK_EW_F(silu)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    float *o = (float *)o_;
    const float *x = (const float *)in[0];
    (void)A;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(o + i, nk_ew_v_silu(_mm512_loadu_ps(x + i)));
    if (i < n) {
        const __mmask16 m = nk_ew_tail_mask(n - i);
        _mm512_mask_storeu_ps(o + i, m, nk_ew_v_silu(_mm512_maskz_loadu_ps(m, x + i)));
    }
    return 0;
}
#else
NK_EW_DEF1(exp, nk_vm_exp(v))
/* silu's float formula; the fused bfloat16 silu of the AVX2 table uses it too. */
static inline float nk_ew_silu(float v) { return v / (1.0f + nk_vm_exp(-v)); }
NK_EW_DEF1(silu, nk_ew_silu(v))
#endif
NK_EW_DEF1(gelu, v * 0.5f * (1.0f + nk_vm_erf(v * NK_SQRT1_2F)))
NK_EW_DEF1(gelu_tanh, nk_ew_gelu_tanh(v))
NK_EW_DEF1(relu, v != v ? v : (v > 0.0f ? v : 0.0f))

/* sin/cos: the vector path covers |x| <= NK_VM_TRIG_MAX; a block with a larger (or non-finite)
 * value goes through libm element by element. Checked first, so in-place blocks still see x. */
#define NK_EW_DEF_TRIG(name, vmfn, libfn)                                                          \
    static void NK_EW_F(name##_block)(float *o, const float *x, int64_t n) {                      \
        int wide = 0;                                                                              \
        for (int64_t i = 0; i < n; i++) wide |= !(fabsf(x[i]) <= NK_VM_TRIG_MAX);                  \
        if (wide) {                                                                                \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const float v = x[i];                                                              \
                o[i] = fabsf(v) <= NK_VM_TRIG_MAX ? vmfn(v) : libfn(v);                            \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) o[i] = vmfn(x[i]);                                     \
        }                                                                                          \
    }                                                                                              \
    /* Per block, so one wide value sends only its own block through libm. */                     \
    static int NK_EW_F(name)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {    \
        (void)A;                                                                                   \
        for (int64_t b = 0; b < n; b += NK_EW_BLOCK)                                               \
            NK_EW_F(name##_block)((float *)o_ + b, (const float *)in[0] + b,                       \
                                  n - b < NK_EW_BLOCK ? n - b : NK_EW_BLOCK);                      \
        return 0;                                                                                  \
    }
NK_EW_DEF_TRIG(sin, nk_vm_sin, sinf)
NK_EW_DEF_TRIG(cos, nk_vm_cos, cosf)

static int NK_EW_F(clamp)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    float *o = (float *)o_;
    const float *x = (const float *)in[0];
    const float lo = A->f32[NK_ARG_LO], hi = A->f32[NK_ARG_HI]; /* -inf / +inf when absent */
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        const float r = v < lo ? lo : v; /* NaN compares false and stays */
        o[i] = r > hi ? hi : r;
    }
    return 0;
}

/* x ** e: PyTorch's special exponents, else pow in double (std::pow(float, double)). */
static int NK_EW_F(pow_scalar)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    float *o = (float *)o_;
    const float *x = (const float *)in[0];
    const double e = A->f64[NK_ARG_VALUE];
    /* PyTorch's CPU forms x*x*x and 1/(x*x) of bfloat16 in bfloat16 arithmetic, rounding the square. */
    const bool bf16 = A->reduced == NK_BF16;
    if (e == 2.0) {
        for (int64_t i = 0; i < n; i++) o[i] = x[i] * x[i];
    } else if (e == 3.0 && bf16) {
        for (int64_t i = 0; i < n; i++) o[i] = nk_bf16_to_f32(nk_f32_to_bf16(x[i] * x[i])) * x[i];
    } else if (e == 3.0) {
        for (int64_t i = 0; i < n; i++) o[i] = x[i] * x[i] * x[i];
    } else if (e == -2.0 && bf16) {
        for (int64_t i = 0; i < n; i++) o[i] = 1.0f / nk_bf16_to_f32(nk_f32_to_bf16(x[i] * x[i]));
    } else if (e == -2.0) {
        for (int64_t i = 0; i < n; i++) o[i] = 1.0f / (x[i] * x[i]);
    } else if (e == 0.5) {
        for (int64_t i = 0; i < n; i++) o[i] = __builtin_sqrtf(x[i]);
    } else if (e == -0.5) {
        for (int64_t i = 0; i < n; i++) o[i] = 1.0f / __builtin_sqrtf(x[i]);
    } else if (e == -1.0) {
        for (int64_t i = 0; i < n; i++) o[i] = 1.0f / x[i];
    } else {
        for (int64_t i = 0; i < n; i++) o[i] = (float)pow((double)x[i], e);
    }
    return 0;
}

static int NK_EW_F(logical_not)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    uint8_t *o = (uint8_t *)o_;
    const float *x = (const float *)in[0];
    (void)A;
    for (int64_t i = 0; i < n; i++) o[i] = (uint8_t)(x[i] == 0.0f);
    return 0;
}

static int NK_EW_F(add)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    float *o = (float *)o_;
    const float *x = (const float *)in[0], *y = (const float *)in[1];
    const float alpha = A->f32[NK_ARG_ALPHA];
    if (alpha == 1.0f) {
        for (int64_t i = 0; i < n; i++) o[i] = x[i] + y[i];
    } else {
        /* Fused, as PyTorch's CPU kernel (fmadd), also for bfloat16/float16 (rounded once after). */
        for (int64_t i = 0; i < n; i++) o[i] = __builtin_fmaf(alpha, y[i], x[i]);
    }
    return 0;
}

static int NK_EW_F(add_vs)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    float *o = (float *)o_;
    const float *x = (const float *)in[0], b = *(const float *)in[1];
    const float alpha = A->f32[NK_ARG_ALPHA];
    if (alpha == 1.0f) {
        for (int64_t i = 0; i < n; i++) o[i] = x[i] + b;
    } else {
        for (int64_t i = 0; i < n; i++) o[i] = __builtin_fmaf(alpha, b, x[i]);
    }
    return 0;
}

static int NK_EW_F(add_sv)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    float *o = (float *)o_;
    const float a = *(const float *)in[0], *y = (const float *)in[1];
    const float alpha = A->f32[NK_ARG_ALPHA];
    if (alpha == 1.0f) {
        for (int64_t i = 0; i < n; i++) o[i] = a + y[i];
    } else {
        for (int64_t i = 0; i < n; i++) o[i] = __builtin_fmaf(alpha, y[i], a);
    }
    return 0;
}

NK_EW_DEF2(mul, float, a * b)
NK_EW_DEF2(div, float, a / b)
/* For bfloat16/float16 PyTorch rounds the quotient to that type before truncating. */
static int NK_EW_F(div_trunc)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    float *o = (float *)o_;
    const float *x = (const float *)in[0], *y = (const float *)in[1];
    if (A->reduced == NK_BF16) {
        for (int64_t i = 0; i < n; i++) o[i] = truncf(nk_bf16_to_f32(nk_f32_to_bf16(x[i] / y[i])));
    } else if (A->reduced == NK_F16) {
        for (int64_t i = 0; i < n; i++) o[i] = truncf(nk_f16_to_f32(nk_f32_to_f16(x[i] / y[i])));
    } else {
        for (int64_t i = 0; i < n; i++) o[i] = truncf(x[i] / y[i]);
    }
    return 0;
}
NK_EW_DEF2(eq, uint8_t, (uint8_t)(a == b))
NK_EW_DEF2(ne, uint8_t, (uint8_t)(a != b))
NK_EW_DEF2(lt, uint8_t, (uint8_t)(a < b))
NK_EW_DEF2(le, uint8_t, (uint8_t)(a <= b))
NK_EW_DEF2(gt, uint8_t, (uint8_t)(a > b))
NK_EW_DEF2(ge, uint8_t, (uint8_t)(a >= b))
NK_EW_DEF2(logical_and, uint8_t, (uint8_t)((a != 0.0f) & (b != 0.0f)))
NK_EW_DEF2(logical_or, uint8_t, (uint8_t)((a != 0.0f) | (b != 0.0f)))
NK_EW_DEF2(logical_xor, uint8_t, (uint8_t)((a != 0.0f) ^ (b != 0.0f)))
NK_EW_DEF2(pow, float, powf(a, b))
NK_EW_DEF2(maximum, float, nk_ew_maxf(a, b))
NK_EW_DEF2(minimum, float, nk_ew_minf(a, b))
NK_EW_DEF2(silu_backward, float, nk_ew_silu_bwd(a, b))
NK_EW_DEF2(gelu_backward, float, nk_ew_gelu_bwd(a, b))
NK_EW_DEF2(gelu_tanh_backward, float, nk_ew_gelu_tanh_bwd(a, b))
NK_EW_DEF2(sigmoid_backward, float, a * (1.0f - b) * b)
NK_EW_DEF2(tanh_backward, float, a * (1.0f - b * b))

/* Python's floor division (c10::div_floor_floating): fmod-based, so it is exact. */
static int NK_EW_F(div_floor)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    float *o = (float *)o_;
    const float *x = (const float *)in[0], *y = (const float *)in[1];
    (void)A;
    for (int64_t i = 0; i < n; i++) {
        const float a = x[i], b = y[i];
        if (b == 0.0f) {
            o[i] = a / b;
            continue;
        }
        const float mod = fmodf(a, b);
        float div = (a - mod) / b;
        if (mod != 0.0f && (b < 0.0f) != (mod < 0.0f)) div -= 1.0f;
        float r;
        if (div != 0.0f) {
            r = floorf(div);
            if (div - r > 0.5f) r += 1.0f;
        } else {
            r = copysignf(0.0f, a / b);
        }
        o[i] = r;
    }
    return 0;
}

static int NK_EW_F(masked_fill)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    float *o = (float *)o_;
    const float *x = (const float *)in[0];
    const uint8_t *m = (const uint8_t *)in[1];
    const float v = A->f32[NK_ARG_VALUE];
    for (int64_t i = 0; i < n; i++) o[i] = m[i] ? v : x[i];
    return 0;
}

static int NK_EW_F(threshold_backward)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    float *o = (float *)o_;
    const float *x = (const float *)in[0], *g = (const float *)in[1];
    const float t = A->f32[NK_ARG_VALUE];
    for (int64_t i = 0; i < n; i++) o[i] = x[i] <= t ? 0.0f : g[i];
    return 0;
}

static int NK_EW_F(where)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    float *o = (float *)o_;
    const uint8_t *c = (const uint8_t *)in[0];
    const float *x = (const float *)in[1], *y = (const float *)in[2];
    (void)A;
    for (int64_t i = 0; i < n; i++) o[i] = c[i] ? x[i] : y[i];
    return 0;
}

static int NK_EW_F(clamp_tensor)(void *o_, const void *const *in, int64_t n, const nk_ew_args *A) {
    float *o = (float *)o_;
    const float *x = (const float *)in[0], *l = (const float *)in[1], *h = (const float *)in[2];
    (void)A;
    for (int64_t i = 0; i < n; i++) o[i] = nk_ew_minf(nk_ew_maxf(x[i], l[i]), h[i]);
    return 0;
}

static void NK_EW_F(from_bf16)(float *d, const uint16_t *s, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = nk_bf16_to_f32(s[i]);
}
static void NK_EW_F(to_bf16)(uint16_t *d, const float *s, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = nk_f32_to_bf16(s[i]);
}
static void NK_EW_F(from_f16)(float *d, const uint16_t *s, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = nk_f16_to_f32(s[i]);
}
static void NK_EW_F(to_f16)(uint16_t *d, const float *s, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = nk_f32_to_f16(s[i]);
}

/* The table, with the float -> bfloat16 conversion as a parameter (an ISA file may define a second
 * table for a CPU with a native conversion instruction). */
#define NK_EW_TABLE_INIT(isa_name, to_bf16_fn, ...) { \
    .isa = isa_name, \
    .fn = { \
        [NK_EW_UNARY(NK_NEG)] = NK_EW_F(neg), \
        [NK_EW_UNARY(NK_ABS)] = NK_EW_F(abs), \
        [NK_EW_UNARY(NK_EXP)] = NK_EW_F(exp), \
        [NK_EW_UNARY(NK_LOG)] = NK_EW_F(log), \
        [NK_EW_UNARY(NK_SQRT)] = NK_EW_F(sqrt), \
        [NK_EW_UNARY(NK_RSQRT)] = NK_EW_F(rsqrt), \
        [NK_EW_UNARY(NK_RECIPROCAL)] = NK_EW_F(reciprocal), \
        [NK_EW_UNARY(NK_SIN)] = NK_EW_F(sin), \
        [NK_EW_UNARY(NK_COS)] = NK_EW_F(cos), \
        [NK_EW_UNARY(NK_TANH)] = NK_EW_F(tanh), \
        [NK_EW_UNARY(NK_SIGMOID)] = NK_EW_F(sigmoid), \
        [NK_EW_UNARY(NK_SILU)] = NK_EW_F(silu), \
        [NK_EW_UNARY(NK_GELU)] = NK_EW_F(gelu), \
        [NK_EW_UNARY(NK_GELU_TANH)] = NK_EW_F(gelu_tanh), \
        [NK_EW_UNARY(NK_RELU)] = NK_EW_F(relu), \
        [NK_EW_UNARY(NK_CLAMP)] = NK_EW_F(clamp), \
        [NK_EW_UNARY(NK_POW_SCALAR)] = NK_EW_F(pow_scalar), \
        [NK_EW_UNARY(NK_LOGICAL_NOT)] = NK_EW_F(logical_not), \
        [NK_EW_BINARY(NK_ADD)] = NK_EW_F(add), \
        [NK_EW_BINARY(NK_MUL)] = NK_EW_F(mul), \
        [NK_EW_BINARY(NK_DIV)] = NK_EW_F(div), \
        [NK_EW_BINARY(NK_DIV_TRUNC)] = NK_EW_F(div_trunc), \
        [NK_EW_BINARY(NK_DIV_FLOOR)] = NK_EW_F(div_floor), \
        [NK_EW_BINARY(NK_EQ)] = NK_EW_F(eq), \
        [NK_EW_BINARY(NK_NE)] = NK_EW_F(ne), \
        [NK_EW_BINARY(NK_LT)] = NK_EW_F(lt), \
        [NK_EW_BINARY(NK_LE)] = NK_EW_F(le), \
        [NK_EW_BINARY(NK_GT)] = NK_EW_F(gt), \
        [NK_EW_BINARY(NK_GE)] = NK_EW_F(ge), \
        [NK_EW_BINARY(NK_LOGICAL_AND)] = NK_EW_F(logical_and), \
        [NK_EW_BINARY(NK_LOGICAL_OR)] = NK_EW_F(logical_or), \
        [NK_EW_BINARY(NK_LOGICAL_XOR)] = NK_EW_F(logical_xor), \
        [NK_EW_BINARY(NK_POW)] = NK_EW_F(pow), \
        [NK_EW_BINARY(NK_MAXIMUM)] = NK_EW_F(maximum), \
        [NK_EW_BINARY(NK_MINIMUM)] = NK_EW_F(minimum), \
        [NK_EW_BINARY(NK_MASKED_FILL)] = NK_EW_F(masked_fill), \
        [NK_EW_BINARY(NK_SILU_BACKWARD)] = NK_EW_F(silu_backward), \
        [NK_EW_BINARY(NK_GELU_BACKWARD)] = NK_EW_F(gelu_backward), \
        [NK_EW_BINARY(NK_GELU_TANH_BACKWARD)] = NK_EW_F(gelu_tanh_backward), \
        [NK_EW_BINARY(NK_SIGMOID_BACKWARD)] = NK_EW_F(sigmoid_backward), \
        [NK_EW_BINARY(NK_TANH_BACKWARD)] = NK_EW_F(tanh_backward), \
        [NK_EW_BINARY(NK_THRESHOLD_BACKWARD)] = NK_EW_F(threshold_backward), \
        [NK_EW_TERNARY(NK_WHERE)] = NK_EW_F(where), \
        [NK_EW_TERNARY(NK_CLAMP_TENSOR)] = NK_EW_F(clamp_tensor), \
    }, \
    .vs = { \
        [NK_ADD] = NK_EW_F(add_vs), [NK_MUL] = NK_EW_F(mul_vs), [NK_DIV] = NK_EW_F(div_vs), \
        [NK_EQ] = NK_EW_F(eq_vs), [NK_NE] = NK_EW_F(ne_vs), [NK_LT] = NK_EW_F(lt_vs), [NK_LE] = NK_EW_F(le_vs), \
        [NK_GT] = NK_EW_F(gt_vs), [NK_GE] = NK_EW_F(ge_vs), [NK_POW] = NK_EW_F(pow_vs), \
        [NK_MAXIMUM] = NK_EW_F(maximum_vs), [NK_MINIMUM] = NK_EW_F(minimum_vs), \
    }, \
    .sv = { \
        [NK_ADD] = NK_EW_F(add_sv), [NK_MUL] = NK_EW_F(mul_sv), [NK_DIV] = NK_EW_F(div_sv), \
        [NK_EQ] = NK_EW_F(eq_sv), [NK_NE] = NK_EW_F(ne_sv), [NK_LT] = NK_EW_F(lt_sv), [NK_LE] = NK_EW_F(le_sv), \
        [NK_GT] = NK_EW_F(gt_sv), [NK_GE] = NK_EW_F(ge_sv), [NK_POW] = NK_EW_F(pow_sv), \
        [NK_MAXIMUM] = NK_EW_F(maximum_sv), [NK_MINIMUM] = NK_EW_F(minimum_sv), \
    }, \
    .from_bf16 = NK_EW_F(from_bf16), \
    .to_bf16 = to_bf16_fn, \
    .from_f16 = NK_EW_F(from_f16), \
    .to_f16 = NK_EW_F(to_f16), \
    __VA_ARGS__ \
}

#ifndef NK_EW_OWN_TABLE /* the including file defines the table, with ops of its own */
const nk_ew_f32_table NK_EW_TABLE = NK_EW_TABLE_INIT(NK_EW_ISA_NAME, NK_EW_F(to_bf16), .bf16 = {NULL});
#endif
