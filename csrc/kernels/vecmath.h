/*
 * vecmath.h - float32 exp, log, tanh, erf, sin, cos written for the auto-vectoriser.
 *
 * Every function is straight-line code: both sides of a case are computed and the result chosen by a
 * select, integer/float reinterpretation goes through memcpy, and rounding uses the 1.5 * 2^23 trick,
 * so GCC turns a loop calling them into SIMD code for whatever target the including file is compiled
 * for (see elementwise_f32.h). Accuracy (checked against double-precision libm in the C tests): log
 * correctly rounded (evaluated in double), exp and sigmoid within 2 ulp, tanh within 3, erf within 3
 * (absolute 2e-7 for |x| > 1), sin/cos within 3 ulp of the reduced argument for |x| <= NK_VM_TRIG_MAX;
 * callers use libm beyond that.
 *
 * Including files define NK_VM_FMA(a, b, c) (fused where the target has FMA, a * b + c otherwise).
 */
#ifndef NEURON_VECMATH_H
#define NEURON_VECMATH_H

#include "kernels_internal.h"

#ifndef NK_VM_FMA
#define NK_VM_FMA(a, b, c) ((a) * (b) + (c))
#endif

#define NK_VM_TRIG_MAX 8192.0f

static inline float nk_vm_rint(float v) {
    /* Adding 1.5 * 2^23 pushes the fraction bits out under round-to-nearest-even (|v| < 2^22). */
    return (v + 12582912.0f) - 12582912.0f;
}

static inline float nk_vm_exp(float x) {
    /* e^x = 2^n e^r with n = rint(x / ln2), |r| <= ln2 / 2; ln2 split in two so n * hi is exact. */
    float xc = x == x ? x : 0.0f;
    xc = xc < -104.0f ? -104.0f : xc;
    xc = xc > 89.0f ? 89.0f : xc;
    const float n = nk_vm_rint(xc * 1.44269504088896341f);
    float r = NK_VM_FMA(n, -0.693359375f, xc);
    r = NK_VM_FMA(n, 2.12194440e-4f, r);
    const float z = r * r;
    float p = 1.9875691500e-4f;
    p = NK_VM_FMA(p, r, 1.3981999507e-3f);
    p = NK_VM_FMA(p, r, 8.3334519073e-3f);
    p = NK_VM_FMA(p, r, 4.1665795894e-2f);
    p = NK_VM_FMA(p, r, 1.6666665459e-1f);
    p = NK_VM_FMA(p, r, 5.0000001201e-1f);
    p = NK_VM_FMA(p, z, r) + 1.0f;
    /* 2^n as two normal factors: n spans [-150, 128], beyond one float exponent field. */
    const int32_t ni = (int32_t)n;
    const int32_t n1 = ni >> 1, n2 = ni - n1;
    const float s1 = nk_f32_from_bits((uint32_t)(n1 + 127) << 23);
    const float s2 = nk_f32_from_bits((uint32_t)(n2 + 127) << 23);
    const float res = p * s1 * s2;
    return x == x ? res : x;
}

static inline float nk_vm_log(float x) {
    /* Correctly rounded: x = 2^k m with m in [sqrt(1/2), sqrt(2)) split in float, then log(m) = 2 atanh(s)
     * with s = f / (2 + f), f = m - 1 (exact), summed in double to s^19 (truncation < 3e-17 relative) and
     * rounded once. A float evaluation was within 1-2 ulp, PyTorch's CPU log (Sleef) is within 1; either
     * error, summed over many terms of a gradient (d x**y / dy = x**y log x summed over a broadcast
     * dimension), came out several times larger than the float64 answer allows. */
    const bool sub = x < 1.17549435e-38f; /* subnormal (also zero/negative: overridden below) */
    const float xs = sub ? x * 8388608.0f : x;
    const uint32_t u = nk_f32_bits(xs);
    const int32_t e = (int32_t)((u >> 23) & 0xffu) - 127;
    float m = nk_f32_from_bits((u & 0x007fffffu) | 0x3f800000u);
    const bool big = m > 1.41421356f;
    m = big ? m * 0.5f : m;
    const float k = (float)e + (big ? 1.0f : 0.0f) - (sub ? 23.0f : 0.0f);
    const double f = (double)m - 1.0;
    const double s = f / (2.0 + f);
    const double z = s * s;
    double p = 1.0 / 19.0;
    p = p * z + 1.0 / 17.0;
    p = p * z + 1.0 / 15.0;
    p = p * z + 1.0 / 13.0;
    p = p * z + 1.0 / 11.0;
    p = p * z + 1.0 / 9.0;
    p = p * z + 1.0 / 7.0;
    p = p * z + 1.0 / 5.0;
    p = p * z + 1.0 / 3.0;
    const double s2 = s + s;
    const double lm = s2 + s2 * z * p;
    float r = (float)((double)k * 0.69314718055994530942 + lm);
    r = x == 0.0f ? -INFINITY : r;
    r = x < 0.0f ? NAN : r;
    r = x == INFINITY ? x : r;
    return x == x ? r : x;
}

static inline float nk_vm_tanh(float x) {
    const float a = fabsf(x);
    /* |x| < 0.55: odd Maclaurin series up to x^19 (each term < 0.13 of the previous one). */
    const float z = x * x;
    float p = -2.391291142e-04f;
    p = NK_VM_FMA(p, z, 5.900274409e-04f);
    p = NK_VM_FMA(p, z, -1.455834387e-03f);
    p = NK_VM_FMA(p, z, 3.592128037e-03f);
    p = NK_VM_FMA(p, z, -8.863235530e-03f);
    p = NK_VM_FMA(p, z, 2.186948854e-02f);
    p = NK_VM_FMA(p, z, -5.396825397e-02f);
    p = NK_VM_FMA(p, z, 1.333333333e-01f);
    p = NK_VM_FMA(p, z, -3.333333333e-01f);
    const float small = NK_VM_FMA(p * z, x, x);
    /* Otherwise 1 - 2 / (e^{2|x|} + 1); exp overflows to inf for large |x|, giving exactly 1. */
    const float big = 1.0f - 2.0f / (nk_vm_exp(2.0f * a) + 1.0f);
    const float r = a < 0.55f ? small : copysignf(big, x);
    return x == x ? r : x;
}

static inline float nk_vm_sigmoid(float x) {
    return 1.0f / (1.0f + nk_vm_exp(-x));
}

static inline float nk_vm_erf(float x) {
    const float a = fabsf(x);
    /* |x| < 1: Maclaurin series 2/sqrt(pi) sum (-1)^k x^(2k+1) / (k! (2k+1)) up to x^23: relative
     * accuracy near 0, where 1 - (...) forms would cancel. */
    const float z = x * x;
    float p = -1.229055530e-09f;
    p = NK_VM_FMA(p, z, 1.480719282e-08f);
    p = NK_VM_FMA(p, z, -1.636584469e-07f);
    p = NK_VM_FMA(p, z, 1.646211437e-06f);
    p = NK_VM_FMA(p, z, -1.492565036e-05f);
    p = NK_VM_FMA(p, z, 1.205533298e-04f);
    p = NK_VM_FMA(p, z, -8.548327023e-04f);
    p = NK_VM_FMA(p, z, 5.223977625e-03f);
    p = NK_VM_FMA(p, z, -2.686617065e-02f);
    p = NK_VM_FMA(p, z, 1.128379167e-01f);
    p = NK_VM_FMA(p, z, -3.761263890e-01f);
    const float small = x * NK_VM_FMA(p, z, 1.128379167e+00f);
    /* |x| >= 1: 1 - t P(t) e^{-x^2} with t = 1 / (1 + 0.3275911 |x|) (absolute error < 1.5e-7, the
     * same formula PyTorch's CPU erf uses). */
    const float t = 1.0f / NK_VM_FMA(0.3275911f, a, 1.0f);
    float q = 1.061405429f;
    q = NK_VM_FMA(q, t, -1.453152027f);
    q = NK_VM_FMA(q, t, 1.421413741f);
    q = NK_VM_FMA(q, t, -0.284496736f);
    q = NK_VM_FMA(q, t, 0.254829592f);
    const float big = 1.0f - q * t * nk_vm_exp(-a * a);
    const float r = a < 1.0f ? small : copysignf(big, x);
    return x == x ? r : x;
}

/*
 * sin and cos for |x| <= NK_VM_TRIG_MAX: reduce by the nearest even multiple q of pi/4 (pi/4 in three
 * parts, so q * part is exact for the first two), then a sine or cosine polynomial on [-pi/4, pi/4]
 * chosen by the octant. Larger or non-finite |x| give NaN here; callers use libm for those.
 */
static inline float nk_vm_trig(float x, int32_t shift) {
    const float a = fabsf(x);
    const bool ok = a <= NK_VM_TRIG_MAX;
    const float ac = ok ? a : 0.0f;
    int32_t q = (int32_t)(ac * 1.27323954473516f);
    q = (q + 1) & ~1;
    const float y = (float)q;
    float r = NK_VM_FMA(y, -0.78515625f, ac);
    r = NK_VM_FMA(y, -2.4187564849853515625e-4f, r);
    r = NK_VM_FMA(y, -3.77489497744594108e-8f, r);
    const float z = r * r;
    float sp = -1.9515295891e-4f;
    sp = NK_VM_FMA(sp, z, 8.3321608736e-3f);
    sp = NK_VM_FMA(sp, z, -1.6666654611e-1f);
    const float s = NK_VM_FMA(sp * z, r, r);
    float cp = 2.443315711809948e-5f;
    cp = NK_VM_FMA(cp, z, -1.388731625493765e-3f);
    cp = NK_VM_FMA(cp, z, 4.166664568298827e-2f);
    const float c = NK_VM_FMA(cp * z, z, NK_VM_FMA(-0.5f, z, 1.0f));
    /* Octant (q / 2 + shift) mod 4 of the reduced argument: sin, cos, -sin, -cos. shift = 1 turns
     * sin into cos: cos(a) = sin(a + pi/2). */
    const int32_t oct = ((q >> 1) + shift) & 3;
    const float v = (oct & 1) ? c : s;
    const uint32_t neg = (uint32_t)(oct >> 1) << 31;
    return ok ? nk_f32_from_bits(nk_f32_bits(v) ^ neg) : NAN;
}

static inline float nk_vm_sin(float x) {
    /* sin is odd: compute on |x| and give the sign of x back. */
    const float r = nk_vm_trig(x, 0);
    return x < 0.0f ? -r : r;
}

static inline float nk_vm_cos(float x) {
    return nk_vm_trig(x, 1);
}

#endif /* NEURON_VECMATH_H */
