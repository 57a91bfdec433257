/*
 * reduce_simd.h - float-row building blocks of the reduction, softmax, norm and loss kernels.
 *
 * Every kernel of this family converts a row (any float dtype, any stride) into a float buffer on the
 * stack, works on contiguous floats, and converts back on store. So the SIMD code below only ever sees
 * float arrays. It is written with GCC vector extensions (16 floats per vector): the bodies are
 * always_inline and instantiated per ISA by NK_SIMD_FN, so the same source becomes AVX-512 (one zmm),
 * AVX2 (two ymm) or baseline SSE2 code, chosen at run time by nk_reduce_isa().
 */
#ifndef NEURON_REDUCE_SIMD_H
#define NEURON_REDUCE_SIMD_H

#include "kernels_internal.h"

#include <float.h>

#pragma GCC diagnostic ignored "-Wpsabi"

#define NK_AI static inline __attribute__((always_inline))
#define NK_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define NK_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))

/* 2: AVX-512, 1: AVX2+FMA, 0: baseline. */
int nk_reduce_isa(void);

/* Rows are processed in chunks of this many floats (16 KiB of stack). */
#define NK_CHUNK 4096

typedef float nk_v16f __attribute__((vector_size(64)));
typedef int32_t nk_v16i __attribute__((vector_size(64)));
typedef uint32_t nk_v16u __attribute__((vector_size(64)));
typedef uint16_t nk_v16h __attribute__((vector_size(32)));

NK_AI nk_v16f nk_vload(const float *p) {
    nk_v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}
NK_AI void nk_vstore(float *p, nk_v16f v) { memcpy(p, &v, sizeof v); }
NK_AI nk_v16f nk_vsplat(float f) { return (nk_v16f){f, f, f, f, f, f, f, f, f, f, f, f, f, f, f, f}; }
NK_AI nk_v16i nk_vbits(nk_v16f v) {
    nk_v16i i;
    memcpy(&i, &v, sizeof i);
    return i;
}
NK_AI nk_v16f nk_vfloat(nk_v16i i) {
    nk_v16f v;
    memcpy(&v, &i, sizeof v);
    return v;
}
/* m ? a : b for a comparison mask m (all ones / zeros per lane). */
NK_AI nk_v16f nk_vsel(nk_v16i m, nk_v16f a, nk_v16f b) { return nk_vfloat((m & nk_vbits(a)) | (~m & nk_vbits(b))); }
NK_AI float nk_vhsum(nk_v16f v) {
    /* Pairwise, so the lane order does not bias the rounding. */
    float t[16];
    nk_vstore(t, v);
    for (int w = 8; w >= 1; w >>= 1)
        for (int l = 0; l < w; l++) t[l] += t[l + w];
    return t[0];
}

/*
 * exp for float lanes: x = n*ln2 + r, |r| <= ln2/2, e^r by its degree-7 Taylor polynomial (truncation
 * below 1e-8 relative), times 2^n built in the exponent bits. Max error ~2 ulp. x > 88.72 gives inf,
 * x < -87.34 gives 0 (PyTorch would give a subnormal), NaN stays NaN.
 */
#define NK_EXP_BODY(T, SPLAT, BITS, FLOAT, SEL, LT, GT, NE, x, out)                                     \
    do {                                                                                                 \
        T xc_ = SEL(LT(x, SPLAT(-86.5f)), SPLAT(-86.5f), x);                                              \
        xc_ = SEL(GT(xc_, SPLAT(88.7f)), SPLAT(88.7f), xc_);                                              \
        T t_ = xc_ * SPLAT(1.44269504088896341f) + SPLAT(12582912.0f);                                    \
        T n_ = t_ - SPLAT(12582912.0f);                                                                   \
        T r_ = xc_ - n_ * SPLAT(0.693359375f);                                                            \
        r_ = r_ + n_ * SPLAT(2.12194440e-4f);                                                             \
        T p_ = SPLAT(1.0f / 5040.0f);                                                                     \
        p_ = p_ * r_ + SPLAT(1.0f / 720.0f);                                                              \
        p_ = p_ * r_ + SPLAT(1.0f / 120.0f);                                                              \
        p_ = p_ * r_ + SPLAT(1.0f / 24.0f);                                                               \
        p_ = p_ * r_ + SPLAT(1.0f / 6.0f);                                                                \
        p_ = p_ * r_ + SPLAT(0.5f);                                                                       \
        p_ = p_ * r_ + SPLAT(1.0f);                                                                       \
        p_ = p_ * r_ + SPLAT(1.0f);                                                                       \
        T s_ = FLOAT(((BITS(t_) - BITS(SPLAT(12582912.0f))) + 126u) << 23);                               \
        T e_ = p_ * s_ * SPLAT(2.0f);                                                                     \
        e_ = SEL(GT(x, SPLAT(88.72283f)), SPLAT(INFINITY), e_);                                           \
        e_ = SEL(LT(x, SPLAT(-87.33654f)), SPLAT(0.0f), e_);                                              \
        out = SEL(NE(x, x), x, e_);                                                                       \
    } while (0)

#define NK_VLT(a, b) ((a) < (b))
#define NK_VGT(a, b) ((a) > (b))
#define NK_VNE(a, b) ((a) != (b))
NK_AI nk_v16f nk_vexp(nk_v16f x) {
    nk_v16f out;
    NK_EXP_BODY(nk_v16f, nk_vsplat, nk_vbits, nk_vfloat, nk_vsel, NK_VLT, NK_VGT, NK_VNE, x, out);
    return out;
}

NK_AI float nk_sid(float f) { return f; }
/* Unsigned, so the exponent shift of a NaN's garbage is defined behaviour. */
NK_AI uint32_t nk_sbits(float f) { return nk_f32_bits(f); }
NK_AI float nk_sfloat(uint32_t i) { return nk_f32_from_bits(i); }
#define NK_SSEL(c, a, b) ((c) ? (a) : (b))
/* The scalar twin, bit-identical to a lane of nk_vexp. */
static inline float nk_exp_f32(float x) {
    float out;
    NK_EXP_BODY(float, nk_sid, nk_sbits, nk_sfloat, NK_SSEL, NK_VLT, NK_VGT, NK_VNE, x, out);
    return out;
}

/* ---- dtype <-> float rows ---- */

NK_AI nk_v16f nk_vload_bf16(const uint16_t *p) {
    nk_v16h h;
    memcpy(&h, p, sizeof h);
    nk_v16u w = __builtin_convertvector(h, nk_v16u) << 16;
    return nk_vfloat((nk_v16i)w);
}

/* nk_f16_to_f32, lane-wise. */
NK_AI nk_v16f nk_vload_f16(const uint16_t *p) {
    nk_v16h h;
    memcpy(&h, p, sizeof h);
    const nk_v16u w = __builtin_convertvector(h, nk_v16u) << 16;
    const nk_v16u sign = w & 0x80000000u;
    const nk_v16u two_w = w + w;
    const nk_v16f normalized = nk_vfloat((nk_v16i)((two_w >> 4) + (0xE0u << 23))) * nk_vsplat(0x1.0p-112f);
    const nk_v16f denormalized = nk_vfloat((nk_v16i)((two_w >> 17) | (126u << 23))) - nk_vsplat(0.5f);
    const nk_v16i is_denormal = (nk_v16i)(two_w < (1u << 27));
    const nk_v16i r = (nk_v16i)sign | (nk_vbits(denormalized) & is_denormal) | (nk_vbits(normalized) & ~is_denormal);
    return nk_vfloat(r);
}

/* nk_f32_to_bf16 (round to nearest even, NaN -> 0x7FC0), lane-wise. */
NK_AI void nk_vstore_bf16(uint16_t *p, nk_v16f f) {
    const nk_v16u u = (nk_v16u)nk_vbits(f);
    const nk_v16u rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const nk_v16u is_nan = (nk_v16u)((u & 0x7FFFFFFFu) > 0x7F800000u);
    const nk_v16u r = (is_nan & 0x7FC0u) | (~is_nan & rounded);
    nk_v16h h = __builtin_convertvector(r, nk_v16h);
    memcpy(p, &h, sizeof h);
}

/* nk_f32_to_f16, lane-wise. */
NK_AI void nk_vstore_f16(uint16_t *p, nk_v16f f) {
    const nk_v16u w = (nk_v16u)nk_vbits(f);
    nk_v16f base = (nk_vfloat((nk_v16i)(w & 0x7FFFFFFFu)) * nk_vsplat(0x1.0p+112f)) * nk_vsplat(0x1.0p-110f);
    const nk_v16u shl1_w = w + w;
    const nk_v16u sign = w & 0x80000000u;
    const nk_v16u exp_bits_in = shl1_w & 0xFF000000u;
    const nk_v16u small = (nk_v16u)(exp_bits_in < 0x71000000u);
    const nk_v16u bias = (small & 0x71000000u) | (~small & exp_bits_in);
    base = nk_vfloat((nk_v16i)((bias >> 1) + 0x07800000u)) + base;
    const nk_v16u bits = (nk_v16u)nk_vbits(base);
    const nk_v16u nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    const nk_v16u is_nan = (nk_v16u)(shl1_w > 0xFF000000u);
    const nk_v16u r = (sign >> 16) | (0x7E00u & is_nan) | (nonsign & ~is_nan);
    nk_v16h h = __builtin_convertvector(r, nk_v16h);
    memcpy(p, &h, sizeof h);
}

static inline float nk_load_f32(const char *p, nk_dtype t) {
    switch (t) {
    case NK_F32: return *(const float *)p;
    case NK_BF16: return nk_bf16_to_f32(*(const uint16_t *)p);
    case NK_F16: return nk_f16_to_f32(*(const uint16_t *)p);
    case NK_F64: return (float)*(const double *)p;
    default: return 0.0f;
    }
}

static inline void nk_store_f32(char *p, nk_dtype t, float v) {
    switch (t) {
    case NK_F32: *(float *)p = v; break;
    case NK_BF16: *(uint16_t *)p = nk_f32_to_bf16(v); break;
    case NK_F16: *(uint16_t *)p = nk_f32_to_f16(v); break;
    case NK_F64: *(double *)p = v; break;
    default: break;
    }
}

static inline bool nk_is_half_or_float(nk_dtype t) { return t == NK_F32 || t == NK_BF16 || t == NK_F16; }

/* dst[0..n) = (float) src[i*s] for a float dtype t (f32, bf16, f16). */
NK_AI int nk_rgather_body(float *dst, const char *src, int64_t n, int64_t s, nk_dtype t) {
    int64_t i = 0;
    if (s == 1 && t == NK_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return 0;
    }
    if (s == 1 && t == NK_BF16) {
        for (; i + 16 <= n; i += 16) nk_vstore(dst + i, nk_vload_bf16((const uint16_t *)src + i));
    } else if (s == 1 && t == NK_F16) {
        for (; i + 16 <= n; i += 16) nk_vstore(dst + i, nk_vload_f16((const uint16_t *)src + i));
    }
    const size_t es = nk_dtype_size(t);
    for (; i < n; i++) dst[i] = nk_load_f32(src + i * s * (int64_t)es, t);
    return 0;
}

/* dst[i*s] = (t) src[i], rounding like PyTorch. */
NK_AI int nk_rscatter_body(char *dst, int64_t s, nk_dtype t, const float *src, int64_t n) {
    int64_t i = 0;
    if (s == 1 && t == NK_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return 0;
    }
    if (s == 1 && t == NK_BF16) {
        for (; i + 16 <= n; i += 16) nk_vstore_bf16((uint16_t *)dst + i, nk_vload(src + i));
    } else if (s == 1 && t == NK_F16) {
        for (; i + 16 <= n; i += 16) nk_vstore_f16((uint16_t *)dst + i, nk_vload(src + i));
    }
    const size_t es = nk_dtype_size(t);
    for (; i < n; i++) nk_store_f32(dst + i * s * (int64_t)es, t, src[i]);
    return 0;
}

/* ---- float-row kernels ---- */

/* Sum in float lanes (4 accumulators), the result in double. */
NK_AI double nk_sum_body(const float *x, int64_t n) {
    nk_v16f a0 = nk_vsplat(0), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 += nk_vload(x + i);
        a1 += nk_vload(x + i + 16);
        a2 += nk_vload(x + i + 32);
        a3 += nk_vload(x + i + 48);
    }
    for (; i + 16 <= n; i += 16) a0 += nk_vload(x + i);
    double s = (double)nk_vhsum((a0 + a1) + (a2 + a3));
    for (; i < n; i++) s += x[i];
    return s;
}

/*
 * Sum in float with PyTorch's CPU summation order (8-lane vectors as its reduction kernels use,
 * 4 interleaved vector accumulators, a 4-level cascade flushing every 2^k vector groups, the scalar
 * tail first and the lanes added one by one), so sums and means of contiguous rows round exactly like
 * PyTorch's. The 8-lane vectors still compile to full-width SIMD on every ISA.
 */
typedef float nk_v8f __attribute__((vector_size(32)));
NK_AI nk_v8f nk_vload8(const float *p) {
    nk_v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}
NK_AI float nk_sum_cascade_body(const float *x, int64_t n) {
    const int64_t nvec = n / 8, groups = nvec / 4;
    int64_t lg = 0;
    while ((INT64_C(1) << lg) < groups) lg++;
    const int64_t power = lg / 4 > 4 ? lg / 4 : 4, step = INT64_C(1) << power, mask = step - 1;
    nk_v8f acc[4][4];
    memset(acc, 0, sizeof acc);
    const nk_v8f zero = {0};
    int64_t i = 0;
    while (i + step <= groups) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < 4; k++) acc[0][k] += nk_vload8(x + (i * 4 + k) * 8);
        for (int l = 1; l < 4; l++) {
            for (int k = 0; k < 4; k++) {
                acc[l][k] += acc[l - 1][k];
                acc[l - 1][k] = zero;
            }
            if ((i & (mask << (l * power))) != 0) break;
        }
    }
    for (; i < groups; i++)
        for (int k = 0; k < 4; k++) acc[0][k] += nk_vload8(x + (i * 4 + k) * 8);
    for (int l = 1; l < 4; l++)
        for (int k = 0; k < 4; k++) acc[0][k] += acc[l][k];
    for (int64_t v = groups * 4; v < nvec; v++) acc[0][0] += nk_vload8(x + v * 8);
    nk_v8f tot = acc[0][0];
    for (int k = 1; k < 4; k++) tot += acc[0][k];
    float s = 0;
    for (int64_t e = nvec * 8; e < n; e++) s += x[e];
    float lanes[8];
    memcpy(lanes, &tot, sizeof lanes);
    for (int l = 0; l < 8; l++) s += lanes[l];
    return s;
}

/* The same cascade over single elements: PyTorch's order for a strided (outer) reduction. */
static inline float nk_sum_cascade1(const float *x, int64_t n) {
    int64_t lg = 0;
    while ((INT64_C(1) << lg) < n) lg++;
    const int64_t power = lg / 4 > 4 ? lg / 4 : 4, step = INT64_C(1) << power, mask = step - 1;
    float acc[4] = {0, 0, 0, 0};
    int64_t i = 0;
    while (i + step <= n) {
        for (int64_t j = 0; j < step; j++, i++) acc[0] += x[i];
        for (int l = 1; l < 4; l++) {
            acc[l] += acc[l - 1];
            acc[l - 1] = 0;
            if ((i & (mask << (l * power))) != 0) break;
        }
    }
    for (; i < n; i++) acc[0] += x[i];
    return ((acc[0] + acc[1]) + acc[2]) + acc[3];
}

/* Sum of (x - c)^2. */
NK_AI double nk_sumsqdev_body(const float *x, int64_t n, float c) {
    nk_v16f a0 = nk_vsplat(0), a1 = a0;
    const nk_v16f vc = nk_vsplat(c);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        nk_v16f d0 = nk_vload(x + i) - vc, d1 = nk_vload(x + i + 16) - vc;
        a0 += d0 * d0;
        a1 += d1 * d1;
    }
    for (; i + 16 <= n; i += 16) {
        nk_v16f d = nk_vload(x + i) - vc;
        a0 += d * d;
    }
    double s = (double)nk_vhsum(a0 + a1);
    for (; i < n; i++) s += (double)((x[i] - c) * (x[i] - c));
    return s;
}

/* Sum of a[i]*b[i]. */
NK_AI double nk_dot_body(const float *a, const float *b, int64_t n) {
    nk_v16f a0 = nk_vsplat(0), a1 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 += nk_vload(a + i) * nk_vload(b + i);
        a1 += nk_vload(a + i + 16) * nk_vload(b + i + 16);
    }
    for (; i + 16 <= n; i += 16) a0 += nk_vload(a + i) * nk_vload(b + i);
    double s = (double)nk_vhsum(a0 + a1);
    for (; i < n; i++) s += (double)(a[i] * b[i]);
    return s;
}

/*
 * Max (or min) with the index of its first occurrence; a NaN wins (the first NaN). Each lane keeps
 * its best value and the index where it saw it; a strictly better value or a first NaN replaces it.
 */
NK_AI float nk_maxidx_body(const float *x, int64_t n, int is_max, int64_t *idx) {
    if (n < 16) {
        float best = x[0];
        int64_t bi = 0;
        for (int64_t i = 1; i < n; i++) {
            const float v = x[i];
            if (best != best) break;
            if (v != v || (is_max ? v > best : v < best)) {
                best = v;
                bi = i;
            }
        }
        *idx = bi;
        return best;
    }
    nk_v16f bv = nk_vload(x);
    const nk_v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    nk_v16i bi = lane;
    int64_t i = 16;
    /* Lane indices are int32: the caller splits rows longer than 2^30. */
    for (; i + 16 <= n; i += 16) {
        const nk_v16f v = nk_vload(x + i);
        const nk_v16i better = is_max ? (v > bv) : (v < bv);
        const nk_v16i take = better | ((v != v) & (bv == bv));
        bv = nk_vsel(take, v, bv);
        bi = (take & (lane + (int32_t)i)) | (~take & bi);
    }
    float tv[16];
    int32_t ti[16];
    nk_vstore(tv, bv);
    memcpy(ti, &bi, sizeof ti);
    float best = tv[0];
    int64_t besti = ti[0];
    for (int l = 1; l < 16; l++) {
        const float v = tv[l];
        const bool bn = best != best, vn = v != v;
        bool take;
        if (bn || vn)
            take = vn && (!bn || ti[l] < besti);
        else
            take = (is_max ? v > best : v < best) || (v == best && ti[l] < besti);
        if (take) {
            best = v;
            besti = ti[l];
        }
    }
    for (; i < n && best == best; i++) {
        const float v = x[i];
        if (v != v || (is_max ? v > best : v < best)) {
            best = v;
            besti = i;
        }
    }
    *idx = besti;
    return best;
}

/* Max (or min) value only, NaN propagating. */
NK_AI float nk_max_body(const float *x, int64_t n, int is_max) {
    nk_v16f b0 = nk_vsplat(is_max ? -INFINITY : INFINITY), b1 = b0;
    nk_v16i nan = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const nk_v16f v0 = nk_vload(x + i), v1 = nk_vload(x + i + 16);
        nan |= (v0 != v0) | (v1 != v1);
        b0 = nk_vsel(is_max ? (v0 > b0) : (v0 < b0), v0, b0);
        b1 = nk_vsel(is_max ? (v1 > b1) : (v1 < b1), v1, b1);
    }
    b0 = nk_vsel(is_max ? (b1 > b0) : (b1 < b0), b1, b0);
    for (; i + 16 <= n; i += 16) {
        const nk_v16f v = nk_vload(x + i);
        nan |= v != v;
        b0 = nk_vsel(is_max ? (v > b0) : (v < b0), v, b0);
    }
    float t[16];
    int32_t tn[16];
    nk_vstore(t, b0);
    memcpy(tn, &nan, sizeof tn);
    float best = is_max ? -INFINITY : INFINITY;
    bool any_nan = false;
    for (int l = 0; l < 16; l++) {
        any_nan |= tn[l] != 0;
        if (is_max ? t[l] > best : t[l] < best) best = t[l];
    }
    for (; i < n; i++) {
        any_nan |= x[i] != x[i];
        if (is_max ? x[i] > best : x[i] < best) best = x[i];
    }
    return any_nan ? NAN : best;
}

/* dst[i] = exp(x[i] - c) (dst may be x); returns the sum in double. */
NK_AI double nk_expsub_body(float *dst, const float *x, int64_t n, float c) {
    nk_v16f a0 = nk_vsplat(0);
    const nk_v16f vc = nk_vsplat(c);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const nk_v16f e = nk_vexp(nk_vload(x + i) - vc);
        if (dst) nk_vstore(dst + i, e);
        a0 += e;
    }
    double s = (double)nk_vhsum(a0);
    for (; i < n; i++) {
        const float e = nk_exp_f32(x[i] - c);
        if (dst) dst[i] = e;
        s += e;
    }
    return s;
}

/* dst[i] = x[i] * a + b */
NK_AI int nk_axpb_body(float *dst, const float *x, int64_t n, float a, float b) {
    const nk_v16f va = nk_vsplat(a), vb = nk_vsplat(b);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) nk_vstore(dst + i, nk_vload(x + i) * va + vb);
    for (; i < n; i++) dst[i] = x[i] * a + b;
    return 0;
}

/*
 * Instantiates `name` for the three ISAs from name##_body and a dispatcher `name`. `params` is the
 * parenthesised parameter list, `args` the matching argument list.
 */
#define NK_SIMD_FN(ret, name, params, args)                                   \
    static NK_TARGET_AVX512 ret name##_avx512 params { return name##_body args; } \
    static NK_TARGET_AVX2 ret name##_avx2 params { return name##_body args; }     \
    static ret name##_base params { return name##_body args; }                    \
    static inline ret name params {                                               \
        const int isa_ = nk_reduce_isa();                                         \
        return isa_ == 2 ? name##_avx512 args : isa_ == 1 ? name##_avx2 args : name##_base args; \
    }

#endif /* NEURON_REDUCE_SIMD_H */
