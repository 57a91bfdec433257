/*
 * test_kernels.c - unit tests for csrc/kernels (copy, fill, RNG).
 *
 * Expected conversion results come from a reference written independently of the kernels: generic
 * IEEE encode/decode with frexp/ldexp/nearbyint and explicit integer rounding, no shared code.
 */
#include "kernels_internal.h"
#include "nk_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const nk_dtype ALL_DTYPES[NK_DTYPE_COUNT] = {NK_BOOL, NK_U8,  NK_I8,  NK_I16, NK_I32, NK_I64, NK_F16,
                                                    NK_BF16, NK_F32, NK_F64, NK_U16, NK_U32, NK_U64};

static bool is_float_dtype(nk_dtype t) {
    return t == NK_F16 || t == NK_BF16 || t == NK_F32 || t == NK_F64;
}

static nk_tensor make_1d(void *data, nk_dtype dt, int64_t n, int64_t stride) {
    return mk(data, dt, 1, &n, &stride);
}

/* ------------------------------------------------------------------------------------------------ */
/* Reference conversions                                                                            */
/* ------------------------------------------------------------------------------------------------ */

static double ref_decode_float(uint32_t bits, int ebits, int mbits) {
    const uint32_t sign = (bits >> (ebits + mbits)) & 1u;
    const uint32_t e = (bits >> mbits) & ((1u << ebits) - 1);
    const uint32_t m = bits & ((1u << mbits) - 1);
    const int bias = (1 << (ebits - 1)) - 1;
    double v;
    if (e == (1u << ebits) - 1)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, 1 - bias - mbits);
    else
        v = ldexp((double)(m | (1u << mbits)), (int)e - bias - mbits);
    return sign ? -v : v;
}

/* Round a double (not NaN) to the format with nearest-even; returns the bit pattern. */
static uint32_t ref_encode_float(double v, int ebits, int mbits) {
    const uint32_t sign = signbit(v) ? 1u << (ebits + mbits) : 0;
    const uint32_t inf = ((1u << ebits) - 1) << mbits;
    const double a = fabs(v);
    const int bias = (1 << (ebits - 1)) - 1;
    const int emin = 1 - bias, emax = bias;
    if (isinf(a)) return sign | inf;
    if (a == 0) return sign;
    int e;
    frexp(a, &e);
    e -= 1; /* a = m * 2^e, m in [1, 2) */
    if (e < emin) e = emin;
    const double q = ldexp(a, mbits - e); /* a in units of the quantum */
    uint64_t r = (uint64_t)nearbyint(q);
    if (r >= (UINT64_C(2) << mbits)) {
        r >>= 1;
        e += 1;
    }
    if (e > emax) return sign | inf;
    if (r < (UINT64_C(1) << mbits)) return sign | (uint32_t)r; /* subnormal or zero */
    return sign | ((uint32_t)(e + bias) << mbits) | (uint32_t)(r - (UINT64_C(1) << mbits));
}

/* An integer rounded to nearest-even with (mbits+1) significant bits, as an exact double. */
static double ref_round_int(bool negative, uint64_t mag, int mbits) {
    int len = 0;
    while (len < 64 && (mag >> len) != 0) len++;
    double v;
    if (len <= mbits + 1) {
        v = (double)mag;
    } else {
        int shift = len - (mbits + 1);
        uint64_t q = mag >> shift;
        const uint64_t rem = mag & ((UINT64_C(1) << shift) - 1);
        const uint64_t half = UINT64_C(1) << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        v = ldexp((double)q, shift);
    }
    return negative ? -v : v;
}

typedef enum { RV_INT, RV_UINT, RV_FLT } rv_kind;
typedef struct ref_val {
    rv_kind kind;
    int64_t i;
    uint64_t u;
    double d;
    bool from_f64;
} ref_val;

static ref_val ref_load(nk_dtype t, const void *p) {
    ref_val v;
    memset(&v, 0, sizeof v);
    uint8_t u8;
    int8_t i8;
    uint16_t u16;
    int16_t i16;
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f;
    switch (t) {
    case NK_BOOL: memcpy(&u8, p, 1); v.kind = RV_INT; v.i = u8 != 0; break;
    case NK_U8: memcpy(&u8, p, 1); v.kind = RV_UINT; v.u = u8; break;
    case NK_I8: memcpy(&i8, p, 1); v.kind = RV_INT; v.i = i8; break;
    case NK_I16: memcpy(&i16, p, 2); v.kind = RV_INT; v.i = i16; break;
    case NK_I32: memcpy(&i32, p, 4); v.kind = RV_INT; v.i = i32; break;
    case NK_I64: memcpy(&i64, p, 8); v.kind = RV_INT; v.i = i64; break;
    case NK_U16: memcpy(&u16, p, 2); v.kind = RV_UINT; v.u = u16; break;
    case NK_U32: memcpy(&u32, p, 4); v.kind = RV_UINT; v.u = u32; break;
    case NK_U64: memcpy(&u64, p, 8); v.kind = RV_UINT; v.u = u64; break;
    case NK_F16: memcpy(&u16, p, 2); v.kind = RV_FLT; v.d = ref_decode_float(u16, 5, 10); break;
    case NK_BF16: memcpy(&u16, p, 2); v.kind = RV_FLT; v.d = ref_decode_float(u16, 8, 7); break;
    case NK_F32: memcpy(&f, p, 4); v.kind = RV_FLT; v.d = f; break;
    case NK_F64: memcpy(&v.d, p, 8); v.kind = RV_FLT; v.from_f64 = true; break;
    default: break;
    }
    return v;
}

/* The value as PyTorch holds it in float before producing half/bfloat16/float (a double). */
static double ref_float_value(ref_val v) {
    if (v.kind == RV_INT) return ref_round_int(v.i < 0, v.i < 0 ? 0 - (uint64_t)v.i : (uint64_t)v.i, 23);
    if (v.kind == RV_UINT) return ref_round_int(false, v.u, 23);
    if (isnan(v.d)) return v.d;
    if (v.from_f64) return ref_decode_float(ref_encode_float(v.d, 8, 23), 8, 23);
    return v.d;
}

/* Writes the expected dst element into out (nk_dtype_size(t) bytes). Returns false when the
 * conversion has no defined result (none at present; kept so callers stay general). */
static bool ref_store(nk_dtype t, ref_val v, void *out) {
    size_t sz = nk_dtype_size(t);
    if (t == NK_BOOL) {
        uint8_t b = v.kind == RV_INT ? v.i != 0 : v.kind == RV_UINT ? v.u != 0 : v.d != 0;
        memcpy(out, &b, 1);
        return true;
    }
    if (t == NK_F64) {
        double d;
        if (v.kind == RV_INT)
            d = ref_round_int(v.i < 0, v.i < 0 ? 0 - (uint64_t)v.i : (uint64_t)v.i, 52);
        else if (v.kind == RV_UINT)
            d = ref_round_int(false, v.u, 52);
        else
            d = v.d;
        memcpy(out, &d, 8);
        return true;
    }
    if (t == NK_F32 || t == NK_F16 || t == NK_BF16) {
        const double fv = ref_float_value(v);
        if (t == NK_F32) {
            uint32_t bits = isnan(fv) ? UINT32_C(0x7FC00000) : ref_encode_float(fv, 8, 23);
            memcpy(out, &bits, 4);
        } else if (t == NK_F16) {
            uint16_t bits = isnan(fv) ? (uint16_t)(0x7E00 | (signbit(fv) ? 0x8000 : 0)) : (uint16_t)ref_encode_float(fv, 5, 10);
            memcpy(out, &bits, 2);
        } else {
            uint16_t bits = isnan(fv) ? 0x7FC0 : (uint16_t)ref_encode_float(fv, 8, 7);
            memcpy(out, &bits, 2);
        }
        return true;
    }
    /* integer destinations */
    uint64_t bits;
    if (v.kind == RV_INT) {
        bits = (uint64_t)v.i;
    } else if (v.kind == RV_UINT) {
        bits = v.u;
    } else {
        /* x86 semantics: truncate; out of the conversion's range (or NaN) gives INT_MIN of the
         * conversion width, which is 32 bits for int8/16/32 and 64 bits otherwise. */
        const double tr = trunc(v.d);
        const double two63 = 9223372036854775808.0, two31 = 2147483648.0;
        const bool narrow = t == NK_I8 || t == NK_I16 || t == NK_I32;
        if (narrow)
            bits = (tr >= -two31 && tr < two31) ? (uint64_t)(int64_t)tr : (uint64_t)(int64_t)INT32_MIN;
        else if (t == NK_U64 && tr >= two63 && tr < 2 * two63)
            bits = (uint64_t)(tr - two63) + (UINT64_C(1) << 63);
        else
            bits = (tr >= -two63 && tr < two63) ? (uint64_t)(int64_t)tr : UINT64_C(1) << 63;
    }
    /* little-endian low bytes = two's complement wrap */
    for (size_t k = 0; k < sz; k++) ((uint8_t *)out)[k] = (uint8_t)(bits >> (8 * k));
    return true;
}

/* Compare a kernel result with the expected element; float32/64 NaNs compare as NaN-ness. */
static bool same_element(nk_dtype t, const void *got, const void *want) {
    if (t == NK_F32) {
        float a, b;
        memcpy(&a, got, 4);
        memcpy(&b, want, 4);
        if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    }
    if (t == NK_F64) {
        double a, b;
        memcpy(&a, got, 8);
        memcpy(&b, want, 8);
        if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    }
    return memcmp(got, want, nk_dtype_size(t)) == 0;
}

static void format_element(nk_dtype t, const void *p, char *buf, size_t n) {
    uint64_t bits = 0;
    memcpy(&bits, p, nk_dtype_size(t));
    ref_val v = ref_load(t, p);
    if (v.kind == RV_FLT)
        snprintf(buf, n, "%.17g (0x%llx)", v.d, (unsigned long long)bits);
    else if (v.kind == RV_INT)
        snprintf(buf, n, "%lld", (long long)v.i);
    else
        snprintf(buf, n, "%llu", (unsigned long long)v.u);
}

/* ------------------------------------------------------------------------------------------------ */
/* Source values                                                                                    */
/* ------------------------------------------------------------------------------------------------ */

static const double FLOAT_VALUES[] = {
    0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 127.0, 1e-3, 1e10, -1e10, NAN, -NAN, INFINITY, -INFINITY,
    65504.0, 65519.0, 65520.0, 70000.0, 300.0, -129.0, 255.0, 256.0, 3e9, 0.5, 1.5, -0.7,
    16777217.0, 1.0 + 0x1p-8, 1.0 + 3 * 0x1p-8, 0x1p-24, 0x1p-25, 3 * 0x1p-25, 6e-8, 1e-45, 3.4e38, 1e300,
    -1e300, 0x1p-14, 0x1.ffcp-15, 1.0 + 0x1p-11, 1.0 + 3 * 0x1p-11, 0x1.fffffe0000001p-1, 4294967295.0,
    9.3e18, -9.2e18, 1.0000000596046448,
};
#define N_FLOAT_VALUES (sizeof FLOAT_VALUES / sizeof FLOAT_VALUES[0])

static const uint64_t INT_VALUES[] = {
    0, 1, UINT64_MAX /* -1 */, 127, (uint64_t)-128, 255, 256, 300, (uint64_t)-129, 65535, 65536,
    (uint64_t)-32769, 2147483647, (uint64_t)-2147483648LL, 16777217, 16777219, (UINT64_C(1) << 53) + 1,
    UINT64_C(0x7FFFFFFFFFFFFFFF), UINT64_C(0x8000000000000000), UINT64_C(0x8000008000000001),
    UINT64_C(0x8000018000000000), 4294967295u, 0x00FFFFFF, 0x01000001, 2049, 2051, 257, 259,
};
#define N_INT_VALUES (sizeof INT_VALUES / sizeof INT_VALUES[0])

static const uint8_t BOOL_BYTES[] = {0, 1, 2, 255, 0, 128};

/* Fills n elements of dtype t at p with the test values for t (cycled). Floats are encoded with the
 * reference encoder so the source itself does not depend on the kernels. */
static void fill_source_values(nk_dtype t, void *p, int64_t n, int64_t phase) {
    size_t sz = nk_dtype_size(t);
    for (int64_t k = 0; k < n; k++) {
        uint8_t *e = (uint8_t *)p + k * (int64_t)sz;
        const int64_t j = k + phase;
        if (t == NK_BOOL) {
            e[0] = BOOL_BYTES[j % (int64_t)sizeof BOOL_BYTES];
        } else if (is_float_dtype(t)) {
            const double v = FLOAT_VALUES[j % (int64_t)N_FLOAT_VALUES];
            if (t == NK_F64) {
                memcpy(e, &v, 8);
            } else if (t == NK_F32) {
                uint32_t b = isnan(v) ? (signbit(v) ? 0xFFC00000u : 0x7FC00000u) : ref_encode_float(v, 8, 23);
                memcpy(e, &b, 4);
            } else if (t == NK_F16) {
                uint16_t b = isnan(v) ? (signbit(v) ? 0xFE00 : 0x7E00)
                                      : (uint16_t)ref_encode_float(ref_decode_float(ref_encode_float(v, 8, 23), 8, 23), 5, 10);
                memcpy(e, &b, 2);
            } else {
                uint16_t b = isnan(v) ? (signbit(v) ? 0xFFC0 : 0x7FC0)
                                      : (uint16_t)ref_encode_float(ref_decode_float(ref_encode_float(v, 8, 23), 8, 23), 8, 7);
                memcpy(e, &b, 2);
            }
        } else {
            const uint64_t v = INT_VALUES[j % (int64_t)N_INT_VALUES];
            for (size_t b = 0; b < sz; b++) e[b] = (uint8_t)(v >> (8 * b));
        }
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Copy tests                                                                                       */
/* ------------------------------------------------------------------------------------------------ */

/* Element-wise comparison of dst against src through the reference (both 1-D views). */
static int compare_1d(nk_dtype dt, const uint8_t *dst, int64_t dstride, nk_dtype st, const uint8_t *src,
                      int64_t sstride, int64_t n, const char *what) {
    int bad = 0;
    const int64_t dsz = (int64_t)nk_dtype_size(dt), ssz = (int64_t)nk_dtype_size(st);
    for (int64_t k = 0; k < n; k++) {
        uint8_t want[8];
        const uint8_t *s = src + k * sstride * ssz;
        const uint8_t *d = dst + k * dstride * dsz;
        if (dt == st)
            memcpy(want, s, (size_t)dsz); /* same dtype: a raw copy, as PyTorch's memcpy path */
        else if (!ref_store(dt, ref_load(st, s), want))
            continue;
        if (!same_element(dt, d, want)) {
            char a[64], b[64], c[64];
            format_element(st, s, a, sizeof a);
            format_element(dt, d, b, sizeof b);
            format_element(dt, want, c, sizeof c);
            CHECK_MSG(0, "%s %s->%s: src %s gave %s, want %s", what, nk_dtype_name(st), nk_dtype_name(dt), a, b, c);
            bad++;
        } else {
            g_checks++;
        }
    }
    return bad;
}

static void test_copy_all_pairs(void) {
    enum { N = 101 }; /* long enough for vector bodies and tails */
    static uint8_t src[N * 8 * 3], dst[N * 8 * 3];
    for (int a = 0; a < NK_DTYPE_COUNT; a++) {
        for (int b = 0; b < NK_DTYPE_COUNT; b++) {
            const nk_dtype dt = ALL_DTYPES[a], st = ALL_DTYPES[b];
            const int64_t dsz = (int64_t)nk_dtype_size(dt);
            /* contiguous */
            fill_source_values(st, src, N, 0);
            memset(dst, 0xAB, sizeof dst);
            nk_tensor d = make_1d(dst, dt, N, 1), s = make_1d(src, st, N, 1);
            CHECK(nk_copy(&d, &s) == NK_SUCCESS);
            compare_1d(dt, dst, 1, st, src, 1, N, "contiguous");

            /* strided source (stride 3) into reversed destination (stride -2) */
            uint8_t packed[N * 8];
            fill_source_values(st, packed, N, 7);
            const int64_t ssz = (int64_t)nk_dtype_size(st);
            for (int64_t k = 0; k < N; k++) memcpy(src + 3 * k * ssz, packed + k * ssz, (size_t)ssz);
            memset(dst, 0xAB, sizeof dst);
            d = make_1d(dst + 2 * (N - 1) * dsz, dt, N, -2);
            s = make_1d(src, st, N, 3);
            CHECK(nk_copy(&d, &s) == NK_SUCCESS);
            compare_1d(dt, dst + 2 * (N - 1) * dsz, -2, st, src, 3, N, "strided");
            for (int64_t k = 0; k < 2 * N - 1; k++) /* untouched odd slots keep the sentinel */
                if (k % 2 == 1) CHECK(dst[k * dsz] == 0xAB);

            /* every value broadcast (stride 0) over a row of 9 */
            for (int64_t k = 0; k < (int64_t)N_FLOAT_VALUES; k++) {
                memset(dst, 0xAB, sizeof dst);
                d = make_1d(dst, dt, 9, 1);
                s = make_1d(packed + k * ssz, st, 9, 0);
                CHECK(nk_copy(&d, &s) == NK_SUCCESS);
                compare_1d(dt, dst, 1, st, packed + k * ssz, 0, 9, "broadcast");
            }
        }
    }
}

/* Exhaustive and random checks of the float <-> half/bfloat16 paths against the reference. */
static uint64_t test_rng_state = 0x9E3779B97F4A7C15u;
static uint32_t xorshift32(void) {
    test_rng_state ^= test_rng_state << 13;
    test_rng_state ^= test_rng_state >> 7;
    test_rng_state ^= test_rng_state << 17;
    return (uint32_t)(test_rng_state >> 16);
}

static void test_half_bf16_exhaustive(void) {
    enum { NH = 65536, NR = 1 << 20 };
    uint16_t *h = malloc(NH * sizeof *h);
    float *f = malloc((size_t)(3 * NH + NR) * sizeof *f);
    uint16_t *out = malloc((size_t)(3 * NH + NR) * sizeof *out);
    for (int k = 0; k < NH; k++) h[k] = (uint16_t)k;

    for (int fmt = 0; fmt < 2; fmt++) {
        const nk_dtype ht = fmt == 0 ? NK_F16 : NK_BF16;
        const int eb = fmt == 0 ? 5 : 8, mb = fmt == 0 ? 10 : 7;
        /* widening: every pattern */
        nk_tensor hs = make_1d(h, ht, NH, 1), fd = make_1d(f, NK_F32, NH, 1);
        CHECK(nk_copy(&fd, &hs) == NK_SUCCESS);
        int bad = 0;
        for (int k = 0; k < NH; k++) {
            const double want = ref_decode_float((uint32_t)k, eb, mb);
            const bool ok = isnan(want) ? isnan(f[k]) : ((double)f[k] == want && !signbit(f[k]) == !signbit(want));
            if (!ok && bad++ < 5) CHECK_MSG(0, "%s 0x%04x -> float %g, want %g", nk_dtype_name(ht), k, f[k], want);
        }
        CHECK_MSG(bad == 0, "%d widening mismatches for %s", bad, nk_dtype_name(ht));

        /* narrowing: every representable value, every midpoint between neighbours, midpoints +- 1 ulp,
         * plus random float bit patterns */
        int64_t m = 0;
        for (int k = 0; k < NH; k++) {
            const double v = ref_decode_float((uint32_t)k, eb, mb);
            f[m++] = (float)v;
            const double next = ref_decode_float((uint32_t)k + 1 < NH ? (uint32_t)k + 1 : (uint32_t)k, eb, mb);
            if (!isnan(v) && !isinf(v) && !isnan(next) && !isinf(next) && ((k + 1) & ((1 << (eb + mb)) - 1)) != 0) {
                const float mid = (float)((v + next) / 2);
                f[m++] = mid;
                f[m++] = nextafterf(mid, INFINITY);
            }
        }
        for (int k = 0; k < NR; k++) f[m++] = nk_f32_from_bits(xorshift32());
        nk_tensor fs = make_1d(f, NK_F32, m, 1), hd = make_1d(out, ht, m, 1);
        CHECK(nk_copy(&hd, &fs) == NK_SUCCESS);
        bad = 0;
        for (int64_t k = 0; k < m; k++) {
            uint16_t want;
            ref_val v = {.kind = RV_FLT, .d = f[k]};
            ref_store(ht, v, &want);
            if (out[k] != want && bad++ < 5)
                CHECK_MSG(0, "float %a (0x%08x) -> %s 0x%04x, want 0x%04x", f[k], nk_f32_bits(f[k]), nk_dtype_name(ht), out[k], want);
        }
        CHECK_MSG(bad == 0, "%d narrowing mismatches for %s", bad, nk_dtype_name(ht));
        g_checks += (int)m;
    }

    /* explicit spot values, written out so a reader can see the rules */
    struct { float in; uint16_t h, b; } spots[] = {
        {1.0f, 0x3C00, 0x3F80},
        {65504.0f, 0x7BFF, 0x4780},
        {65519.0f, 0x7BFF, 0x4780},         /* below the half midpoint: stays finite */
        {65520.0f, 0x7C00, 0x4780},         /* midpoint to 2^16 rounds to even = inf */
        {0x1p-24f, 0x0001, 0x3380},         /* smallest half subnormal */
        {0x1p-25f, 0x0000, 0x3300},         /* tie between 0 and 2^-24: even is 0 */
        {0x1.8p-24f, 0x0002, 0x33C0},       /* 1.5 * 2^-24 -> tie -> even (2 * 2^-24) */
        {0x1p-14f, 0x0400, 0x3880},         /* smallest half normal */
        {1.0f + 0x1p-8f, 0x3C04, 0x3F80},   /* bf16 tie: down to even */
        {1.0f + 0x3p-8f, 0x3C0C, 0x3F82},   /* bf16 tie: up to even */
        {1.0f + 0x1p-11f, 0x3C00, 0x3F80},  /* half tie: down to even */
        {1.0f + 0x3p-11f, 0x3C02, 0x3F80},  /* half tie: up to even */
        {-0.0f, 0x8000, 0x8000},
        {INFINITY, 0x7C00, 0x7F80},
        {-INFINITY, 0xFC00, 0xFF80},
        {NAN, 0x7E00, 0x7FC0},
        {-NAN, 0xFE00, 0x7FC0},
        {3.4e38f, 0x7C00, 0x7F80},          /* rounds past the bf16 max: inf */
    };
    const int ns = (int)(sizeof spots / sizeof spots[0]);
    float in[32];
    uint16_t oh[32], ob[32];
    for (int k = 0; k < ns; k++) in[k] = spots[k].in;
    nk_tensor fs = make_1d(in, NK_F32, ns, 1), hd = make_1d(oh, NK_F16, ns, 1), bd = make_1d(ob, NK_BF16, ns, 1);
    CHECK(nk_copy(&hd, &fs) == NK_SUCCESS);
    CHECK(nk_copy(&bd, &fs) == NK_SUCCESS);
    for (int k = 0; k < ns; k++) {
        CHECK_MSG(oh[k] == spots[k].h, "half(%a) = 0x%04x, want 0x%04x", spots[k].in, oh[k], spots[k].h);
        CHECK_MSG(ob[k] == spots[k].b, "bf16(%a) = 0x%04x, want 0x%04x", spots[k].in, ob[k], spots[k].b);
    }

    /* double -> half goes through float: 1 + 2^-11 + 2^-30 is just above the half tie as a double, but
     * rounds to exactly the tie in float, which then rounds to even. */
    double dd = 1.0 + 0x1p-11 + 0x1p-30;
    uint16_t hh;
    nk_tensor ds = make_1d(&dd, NK_F64, 1, 1), hd1 = make_1d(&hh, NK_F16, 1, 1);
    CHECK(nk_copy(&hd1, &ds) == NK_SUCCESS);
    CHECK_MSG(hh == 0x3C00, "double->half double rounding: 0x%04x", hh);
    free(h);
    free(f);
    free(out);
}

/* Generic layout test: allocates buffers covering the given strides, copies, checks every logical
 * element and that memory outside dst's elements is untouched. */
static void check_copy_layout(nk_dtype dt, nk_dtype st, int32_t ndim, const int64_t *sizes, const int64_t *sstr,
                              const int64_t *dstr, const char *what) {
    int64_t numel = 1, smin = 0, smax = 0, dmin = 0, dmax = 0;
    for (int32_t d = 0; d < ndim; d++) {
        numel *= sizes[d];
        if (sizes[d] == 0) continue;
        const int64_t se = (sizes[d] - 1) * sstr[d], de = (sizes[d] - 1) * dstr[d];
        if (se < 0) smin += se; else smax += se;
        if (de < 0) dmin += de; else dmax += de;
    }
    const int64_t ssz = (int64_t)nk_dtype_size(st), dsz = (int64_t)nk_dtype_size(dt);
    const int64_t slen = smax - smin + 1, dlen = dmax - dmin + 1;
    uint8_t *sbuf = malloc((size_t)(slen * ssz)), *dbuf = malloc((size_t)(dlen * dsz));
    uint8_t *mark = calloc((size_t)dlen, 1);
    fill_source_values(st, sbuf, slen, 3);
    memset(dbuf, 0xCD, (size_t)(dlen * dsz));
    nk_tensor s = mk(sbuf + (-smin) * ssz, st, ndim, sizes, sstr);
    nk_tensor d = mk(dbuf + (-dmin) * dsz, dt, ndim, sizes, dstr);
    CHECK_MSG(nk_copy(&d, &s) == NK_SUCCESS, "%s", what);
    int64_t idx[NK_MAX_DIMS] = {0};
    int bad = 0;
    for (int64_t k = 0; k < numel; k++) {
        int64_t so = -smin, dof = -dmin;
        for (int32_t q = 0; q < ndim; q++) {
            so += idx[q] * sstr[q];
            dof += idx[q] * dstr[q];
        }
        mark[dof] = 1;
        uint8_t want[8];
        bool defined = true;
        if (dt == st)
            memcpy(want, sbuf + so * ssz, (size_t)ssz);
        else
            defined = ref_store(dt, ref_load(st, sbuf + so * ssz), want);
        if (defined && !same_element(dt, dbuf + dof * dsz, want)) bad++;
        for (int32_t q = ndim - 1; q >= 0; q--) {
            if (++idx[q] < sizes[q]) break;
            idx[q] = 0;
        }
    }
    for (int64_t k = 0; k < dlen; k++)
        if (!mark[k])
            for (int64_t b = 0; b < dsz; b++) bad += dbuf[k * dsz + b] != 0xCD;
    CHECK_MSG(bad == 0, "%s %s->%s: %d mismatches", what, nk_dtype_name(st), nk_dtype_name(dt), bad);
    free(sbuf);
    free(dbuf);
    free(mark);
}

static void test_copy_layouts(void) {
    struct layout {
        const char *name;
        int32_t ndim;
        int64_t sizes[NK_MAX_DIMS], sstr[NK_MAX_DIMS], dstr[NK_MAX_DIMS];
    } cases[] = {
        {"contiguous 3x5x7", 3, {3, 5, 7}, {35, 7, 1}, {35, 7, 1}},
        {"transposed src", 3, {3, 5, 7}, {1, 3, 15}, {35, 7, 1}},
        {"transposed dst", 3, {3, 5, 7}, {35, 7, 1}, {1, 3, 15}},
        {"permuted both", 3, {3, 5, 7}, {7, 21, 1}, {5, 1, 15}},
        {"negative src", 3, {3, 5, 7}, {-35, 7, -1}, {35, 7, 1}},
        {"negative dst", 3, {3, 5, 7}, {35, 7, 1}, {-1, -3, -15}},
        {"flipped both", 3, {3, 5, 7}, {-35, -7, -1}, {-35, -7, -1}},
        {"broadcast inner", 3, {3, 5, 7}, {5, 1, 0}, {35, 7, 1}},
        {"broadcast outer", 3, {3, 5, 7}, {0, 7, 1}, {35, 7, 1}},
        {"broadcast middle", 3, {3, 5, 7}, {7, 0, 1}, {35, 7, 1}},
        {"broadcast all", 3, {3, 5, 7}, {0, 0, 0}, {35, 7, 1}},
        {"strided both", 3, {3, 5, 7}, {140, 28, 4}, {1, 9, 45}},
        {"size-1 dims", 5, {1, 3, 1, 5, 1}, {999, 5, -7, 1, 3}, {123, 5, 77, 1, -5}},
        {"inner size 1 rows", 2, {40, 1}, {3, 1}, {1, 1}},
        {"mergeable 4d", 4, {2, 3, 4, 5}, {60, 20, 5, 1}, {120, 40, 10, 2}},
        {"0-dim", 0, {0}, {0}, {0}},
        {"16 dims", 16, {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2},
         {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768},
         {32768, 16384, 8192, 4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1}},
        {"long row", 1, {1000}, {-1}, {1}},
        {"tiled transpose 70x45", 2, {70, 45}, {1, 70}, {45, 1}},
        {"tiled transpose batched", 3, {3, 40, 50}, {2000, 1, 40}, {2000, 50, 1}},
        {"tiled transpose gaps", 3, {2, 33, 65}, {1, 2, 66}, {4400, 67, 1}},
    };
    const int nc = (int)(sizeof cases / sizeof cases[0]);
    for (int c = 0; c < nc; c++)
        for (int a = 0; a < NK_DTYPE_COUNT; a++)
            for (int b = 0; b < NK_DTYPE_COUNT; b++)
                check_copy_layout(ALL_DTYPES[a], ALL_DTYPES[b], cases[c].ndim, cases[c].sizes, cases[c].sstr,
                                  cases[c].dstr, cases[c].name);
}

static void test_copy_edge_cases(void) {
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {0};
    int64_t sz[NK_MAX_DIMS + 1] = {2, 4}, st[NK_MAX_DIMS + 1] = {4, 1};
    nk_tensor d = mk(b, NK_F32, 2, sz, st), s = mk(a, NK_F32, 2, sz, st);

    /* 0-size: no-op, NULL data allowed */
    int64_t zs[3] = {3, 0, 5}, zst[3] = {0, 5, 1};
    nk_tensor z1 = mk(NULL, NK_F32, 3, zs, zst), z2 = mk(NULL, NK_BF16, 3, zs, zst);
    CHECK(nk_copy(&z1, &z2) == NK_SUCCESS);
    CHECK(nk_fill(&z1, (nk_scalar){.is_float = true, .f = 1.0}) == NK_SUCCESS);
    CHECK(nk_tensor_numel(&z1) == 0);

    /* invalid descriptors */
    nk_tensor bad = d;
    bad.ndim = NK_MAX_DIMS + 1;
    CHECK(nk_copy(&bad, &s) == NK_INVALID);
    CHECK(nk_fill(&bad, (nk_scalar){0}) == NK_INVALID);
    bad.ndim = -1;
    CHECK(nk_copy(&bad, &s) == NK_INVALID);
    CHECK(nk_tensor_numel(&bad) == -1);
    bad = d;
    bad.sizes[1] = -4;
    CHECK(nk_copy(&bad, &s) == NK_INVALID);
    bad = d;
    bad.data = NULL;
    CHECK(nk_copy(&bad, &s) == NK_INVALID);
    CHECK(nk_copy(&d, &bad) == NK_INVALID);
    bad = d;
    bad.sizes[1] = 3;
    CHECK(nk_copy(&bad, &s) == NK_INVALID); /* shape mismatch */
    bad = d;
    bad.ndim = 1;
    CHECK(nk_copy(&bad, &s) == NK_INVALID);
    bad = d;
    bad.dtype = (nk_dtype)99;
    CHECK(nk_copy(&bad, &s) == NK_INVALID);
    CHECK(nk_copy(NULL, &s) == NK_INVALID);
    CHECK(nk_copy(&d, NULL) == NK_INVALID);
    CHECK(nk_copy(&d, &s) == NK_SUCCESS);
    CHECK(memcmp(a, b, sizeof a) == 0);

    /* in place: same memory, same layout (also with a same-size dtype change) */
    CHECK(nk_copy(&s, &s) == NK_SUCCESS);
    CHECK(a[5] == 6.0f);
    nk_tensor si = s;
    si.dtype = NK_I32;
    CHECK(nk_copy(&si, &s) == NK_SUCCESS);
    int32_t iv[8];
    memcpy(iv, a, sizeof iv);
    CHECK(iv[0] == 1 && iv[7] == 8);

    /* numel */
    int64_t big[2] = {INT64_MAX / 2, 3}, one[2] = {1, 1};
    nk_tensor ov = mk(a, NK_F32, 2, big, one);
    CHECK(nk_tensor_numel(&ov) == -1);
    CHECK(nk_copy(&ov, &ov) == NK_INVALID);
    nk_tensor sc = mk(a, NK_F32, 0, NULL, NULL);
    CHECK(nk_tensor_numel(&sc) == 1);
    CHECK(nk_tensor_numel(&d) == 8);
    CHECK(nk_tensor_numel(NULL) == -1);
}

static void test_dtype_props(void) {
    const size_t sizes[NK_DTYPE_COUNT] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 2, 4, 8};
    const char *names[NK_DTYPE_COUNT] = {"bool",    "uint8",   "int8",    "int16",  "int32",  "int64", "float16",
                                         "bfloat16", "float32", "float64", "uint16", "uint32", "uint64"};
    for (int k = 0; k < NK_DTYPE_COUNT; k++) {
        CHECK(nk_dtype_size((nk_dtype)k) == sizes[k]);
        CHECK(strcmp(nk_dtype_name((nk_dtype)k), names[k]) == 0);
    }
    CHECK(nk_dtype_size(NK_DTYPE_COUNT) == 0);
    CHECK(nk_dtype_size((nk_dtype)-1) == 0);
    CHECK(strcmp(nk_dtype_name(NK_DTYPE_COUNT), "unknown") == 0);
}

/* ------------------------------------------------------------------------------------------------ */
/* Fill tests                                                                                       */
/* ------------------------------------------------------------------------------------------------ */

static void test_fill(void) {
    const nk_scalar values[] = {
        {.is_float = true, .f = 2.5},      {.is_float = true, .f = -1.0},    {.is_float = true, .f = 0.0},
        {.is_float = true, .f = -0.0},     {.is_float = true, .f = NAN},     {.is_float = true, .f = INFINITY},
        {.is_float = true, .f = 1e10},     {.is_float = true, .f = 65520.0}, {.is_float = true, .f = 1.0 + 0x1p-11 + 0x1p-30},
        {.is_float = true, .f = 0.1},      {.is_float = false, .i = 0},      {.is_float = false, .i = -1},
        {.is_float = false, .i = 300},     {.is_float = false, .i = INT64_MAX}, {.is_float = false, .i = 1},
        {.is_float = false, .i = 16777217}, {.is_float = false, .i = INT64_MIN},
    };
    const int nv = (int)(sizeof values / sizeof values[0]);
    enum { N = 37 };
    uint8_t buf[N * 8 * 4];
    for (int a = 0; a < NK_DTYPE_COUNT; a++) {
        const nk_dtype dt = ALL_DTYPES[a];
        const int64_t sz = (int64_t)nk_dtype_size(dt);
        for (int v = 0; v < nv; v++) {
            uint8_t want[8];
            ref_val rv;
            memset(&rv, 0, sizeof rv);
            if (values[v].is_float) {
                rv.kind = RV_FLT;
                rv.d = values[v].f;
                rv.from_f64 = true;
            } else {
                rv.kind = RV_INT;
                rv.i = values[v].i;
            }
            if (!ref_store(dt, rv, want)) continue;
            /* contiguous */
            memset(buf, 0xEE, sizeof buf);
            nk_tensor d = make_1d(buf, dt, N, 1);
            CHECK(nk_fill(&d, values[v]) == NK_SUCCESS);
            int bad = 0;
            for (int64_t k = 0; k < N; k++) bad += !same_element(dt, buf + k * sz, want);
            bad += buf[N * sz] != 0xEE;
            /* 3x4 with a reversed outer dim and inner stride 2 in a 24-element region */
            memset(buf, 0xEE, sizeof buf);
            int64_t sizes[2] = {3, 4}, strides[2] = {-8, 2};
            d = mk(buf + 16 * sz, dt, 2, sizes, strides);
            CHECK(nk_fill(&d, values[v]) == NK_SUCCESS);
            for (int64_t k = 0; k < 24; k++) {
                const bool inside = k % 2 == 0;
                if (inside)
                    bad += !same_element(dt, buf + k * sz, want);
                else
                    for (int64_t b = 0; b < sz; b++) bad += buf[k * sz + b] != 0xEE;
            }
            /* 0-dim */
            memset(buf, 0xEE, sizeof buf);
            d = mk(buf, dt, 0, NULL, NULL);
            CHECK(nk_fill(&d, values[v]) == NK_SUCCESS);
            bad += !same_element(dt, buf, want);
            bad += buf[sz] != 0xEE;
            CHECK_MSG(bad == 0, "fill %s with value #%d: %d mismatches", nk_dtype_name(dt), v, bad);
        }
    }
    /* a few literal expectations */
    uint16_t h[2];
    nk_tensor hd = make_1d(h, NK_BF16, 2, 1);
    nk_fill(&hd, (nk_scalar){.is_float = true, .f = NAN});
    CHECK(h[0] == 0x7FC0 && h[1] == 0x7FC0);
    uint8_t u[2];
    nk_tensor ud = make_1d(u, NK_U8, 2, 1);
    nk_fill(&ud, (nk_scalar){.is_float = true, .f = -1.0});
    CHECK(u[0] == 255);
    nk_fill(&ud, (nk_scalar){.is_float = false, .i = 300});
    CHECK(u[1] == 44);
    float f[2];
    nk_tensor fd = make_1d(f, NK_F32, 2, 1);
    nk_fill(&fd, (nk_scalar){.is_float = true, .f = -0.0});
    CHECK(signbit(f[0]) && f[1] == 0.0f);
}

/* ------------------------------------------------------------------------------------------------ */
/* RNG tests                                                                                        */
/* ------------------------------------------------------------------------------------------------ */

static void test_philox_kat(void) {
    const uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
    const uint32_t c1[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, k1[2] = {0xffffffffu, 0xffffffffu};
    const uint32_t c2[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, k2[2] = {0xa4093822u, 0x299f31d0u};
    uint32_t out[4];
    /* Random123 kat_vectors (also TensorFlow's Philox test); word 2 is 0xbc57ac4c. */
    nk_philox4x32_10(c0, k0, out);
    CHECK(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu && out[3] == 0x9b00dbd8u);
    nk_philox4x32_10(c1, k1, out);
    CHECK(out[0] == 0x408f276du && out[1] == 0x41c83b0eu && out[2] == 0xa20bc7c6u && out[3] == 0x6d5451fdu);
    /* third Random123 known-answer vector (pi digits) */
    nk_philox4x32_10(c2, k2, out);
    CHECK(out[0] == 0xd16cfe09u && out[1] == 0x94fdccebu && out[2] == 0x5001e420u && out[3] == 0x24126ea1u);
    /* stream word mapping: word p = lane p%4 of block p/4 with counter (block lo, block hi, 0, 0) */
    const uint64_t seed = 0x123456789abcdefULL;
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint64_t block = 0x100000002ULL;
    const uint32_t ctr[4] = {2, 1, 0, 0};
    nk_philox4x32_10(ctr, key, out);
    for (int l = 0; l < 4; l++) CHECK(nk_philox_word(seed, block * 4 + (uint64_t)l) == out[l]);
}

typedef nk_status (*draw_fn)(const nk_tensor *dst, uint64_t seed, uint64_t *offset, const void *arg);

typedef struct draw_case {
    const char *name;
    nk_dtype dtype;
    int words;
    int kind; /* 0 uniform, 1 normal, 2 bernoulli, 3 random */
    double a, b;
    int64_t from;
    uint64_t range;
} draw_case;

static nk_status draw(const draw_case *c, const nk_tensor *dst, uint64_t seed, uint64_t *offset) {
    switch (c->kind) {
    case 0: return nk_rng_uniform(dst, seed, offset, c->a, c->b);
    case 1: return nk_rng_normal(dst, seed, offset, c->a, c->b);
    case 2: return nk_rng_bernoulli(dst, seed, offset, c->a);
    default: return nk_rng_random(dst, seed, offset, c->from, c->range);
    }
}

static void test_rng_structure(void) {
    const draw_case cases[] = {
        {"uniform f32", NK_F32, 1, 0, -2.0, 3.0, 0, 0},
        {"uniform f64", NK_F64, 2, 0, 0.0, 1.0, 0, 0},
        {"uniform f16", NK_F16, 1, 0, 0.0, 0.1, 0, 0},
        {"uniform bf16", NK_BF16, 1, 0, -1.0, 1.0, 0, 0},
        {"normal f32", NK_F32, 2, 1, 1.0, 2.0, 0, 0},
        {"normal f64", NK_F64, 2, 1, 0.0, 1.0, 0, 0},
        {"normal bf16", NK_BF16, 2, 1, 0.0, 1.0, 0, 0},
        {"bernoulli bool", NK_BOOL, 1, 2, 0.3, 0, 0, 0},
        {"bernoulli f32", NK_F32, 1, 2, 0.7, 0, 0, 0},
        {"random i32", NK_I32, 1, 3, 0, 0, -5, 10},
        {"random i64 big", NK_I64, 2, 3, 0, 0, -3, (UINT64_C(1) << 40) + 7},
        {"random u8", NK_U8, 1, 3, 0, 0, 0, 256},
        {"random f32", NK_F32, 1, 3, 0, 0, 0, (UINT64_C(1) << 24) + 1},
        {"random full", NK_I64, 2, 3, 0, 0, INT64_MIN, 0},
    };
    const int nc = (int)(sizeof cases / sizeof cases[0]);
    enum { R = 10, C = 7, N = R * C };
    for (int ci = 0; ci < nc; ci++) {
        const draw_case *c = &cases[ci];
        const int64_t sz = (int64_t)nk_dtype_size(c->dtype);
        uint8_t full[N * 8], again[N * 8], other[N * 8], one[8], part[N * 8], strided[4 * N * 8];
        const uint64_t seed = 42 + (uint64_t)ci, o = 13; /* o not a multiple of 4: unaligned start */
        int64_t sizes[2] = {R, C}, cstr[2] = {C, 1};
        nk_tensor t = mk(full, c->dtype, 2, sizes, cstr);
        uint64_t off = o;
        CHECK_MSG(draw(c, &t, seed, &off) == NK_SUCCESS, "%s", c->name);
        const uint64_t adv = ((uint64_t)N * (uint64_t)c->words + 3) / 4 * 4;
        CHECK_MSG(off == o + adv, "%s: offset %llu, want %llu", c->name, (unsigned long long)off,
                  (unsigned long long)(o + adv));

        /* determinism */
        t.data = again;
        off = o;
        draw(c, &t, seed, &off);
        CHECK_MSG(memcmp(full, again, (size_t)(N * sz)) == 0, "%s not deterministic", c->name);

        /* a different offset (and a different seed) gives a different stream */
        t.data = other;
        off = o + 4;
        draw(c, &t, seed, &off);
        CHECK_MSG(memcmp(full, other, (size_t)(N * sz)) != 0, "%s same for other offset", c->name);
        off = o;
        draw(c, &t, seed + 1, &off);
        CHECK_MSG(memcmp(full, other, (size_t)(N * sz)) != 0, "%s same for other seed", c->name);

        /* slice property: element k of the full draw = a 1-element draw at offset o + k*w */
        int bad = 0;
        for (int64_t k = 0; k < N; k++) {
            nk_tensor e = mk(one, c->dtype, 0, NULL, NULL);
            off = o + (uint64_t)k * (uint64_t)c->words;
            draw(c, &e, seed, &off);
            bad += memcmp(one, full + k * sz, (size_t)sz) != 0;
        }
        CHECK_MSG(bad == 0, "%s: %d elements differ from single draws", c->name, bad);
        /* rows 3..9 drawn at o + 3*C*w equal rows 3..9 of the full draw */
        int64_t psz[2] = {R - 3, C};
        nk_tensor pt = mk(part, c->dtype, 2, psz, cstr);
        off = o + 3 * C * (uint64_t)c->words;
        draw(c, &pt, seed, &off);
        CHECK_MSG(memcmp(part, full + 3 * C * sz, (size_t)((R - 3) * C * sz)) == 0, "%s row slice", c->name);

        /* strides do not matter: transposed, reversed and gapped destinations */
        const int64_t layouts[3][2] = {{1, R}, {-C, -1}, {3 * C, 3}};
        const int64_t bases[3] = {0, N - 1, 0};
        for (int l = 0; l < 3; l++) {
            memset(strided, 0, sizeof strided);
            int64_t lst[2] = {layouts[l][0], layouts[l][1]};
            nk_tensor st = mk(strided + bases[l] * sz, c->dtype, 2, sizes, lst);
            off = o;
            draw(c, &st, seed, &off);
            CHECK(off == o + adv);
            bad = 0;
            for (int64_t i = 0; i < R; i++)
                for (int64_t j = 0; j < C; j++)
                    bad += memcmp(strided + (bases[l] + i * lst[0] + j * lst[1]) * sz, full + (i * C + j) * sz,
                                  (size_t)sz) != 0;
            CHECK_MSG(bad == 0, "%s: strided layout %d differs in %d elements", c->name, l, bad);
        }

        /* empty draw: no words, offset unchanged */
        int64_t zsz[2] = {0, 5};
        nk_tensor zt = mk(NULL, c->dtype, 2, zsz, cstr);
        off = o;
        CHECK(draw(c, &zt, seed, &off) == NK_SUCCESS && off == o);
    }

    /* explicit word-to-value formulas for a few elements */
    const uint64_t seed = 7;
    float uf[5];
    double ud[3];
    nk_tensor tf = make_1d(uf, NK_F32, 5, 1), td = make_1d(ud, NK_F64, 3, 1);
    uint64_t off = 6;
    nk_rng_uniform(&tf, seed, &off, 1.0, 3.0);
    CHECK(off == 6 + 8);
    for (int k = 0; k < 5; k++) {
        const float u = (float)(nk_philox_word(seed, 6 + (uint64_t)k) >> 8) * 0x1p-24f;
        CHECK(uf[k] == u * 2.0f + 1.0f);
    }
    off = 1;
    nk_rng_uniform(&td, seed, &off, 0.0, 1.0);
    CHECK(off == 1 + 8);
    for (int k = 0; k < 3; k++) {
        const uint64_t x = (uint64_t)nk_philox_word(seed, 1 + 2 * (uint64_t)k) |
                           ((uint64_t)nk_philox_word(seed, 2 + 2 * (uint64_t)k) << 32);
        CHECK(ud[k] == (double)(x >> 11) * 0x1p-53);
    }
    int64_t ri[3];
    nk_tensor tr = make_1d(ri, NK_I64, 3, 1);
    off = 0;
    nk_rng_random(&tr, seed, &off, 100, 7);
    for (int k = 0; k < 3; k++) CHECK(ri[k] == 100 + (int64_t)(nk_philox_word(seed, (uint64_t)k) % 7));
    uint8_t bb[3];
    nk_tensor tb = make_1d(bb, NK_BOOL, 3, 1);
    off = 2;
    nk_rng_bernoulli(&tb, seed, &off, 0.5);
    for (int k = 0; k < 3; k++) CHECK(bb[k] == ((double)nk_philox_word(seed, 2 + (uint64_t)k) * 0x1p-32 < 0.5));
}

static void test_rng_statistics(void) {
    enum { N = 1000000 };
    float *f = malloc(N * sizeof *f);
    double *d = malloc(N * sizeof *d);
    uint16_t *h = malloc(N * sizeof *h);
    uint64_t off = 0;
    nk_tensor tf = make_1d(f, NK_F32, N, 1), td = make_1d(d, NK_F64, N, 1);

    CHECK(nk_rng_uniform(&tf, 1, &off, 0.0, 1.0) == NK_SUCCESS);
    double sum = 0, sq = 0, mn = 1e9, mx = -1e9;
    for (int k = 0; k < N; k++) {
        sum += f[k];
        mn = fmin(mn, f[k]);
        mx = fmax(mx, f[k]);
    }
    CHECK(mn >= 0.0 && mx < 1.0);
    CHECK_MSG(fabs(sum / N - 0.5) < 0.002, "uniform mean %g", sum / N);

    CHECK(nk_rng_uniform(&td, 1, &off, -3.0, 5.0) == NK_SUCCESS);
    sum = 0, mn = 1e9, mx = -1e9;
    for (int k = 0; k < N; k++) {
        sum += d[k];
        mn = fmin(mn, d[k]);
        mx = fmax(mx, d[k]);
    }
    CHECK(mn >= -3.0 && mx < 5.0);
    CHECK_MSG(fabs(sum / N - 1.0) < 0.02, "uniform f64 mean %g", sum / N);

    nk_tensor th = make_1d(h, NK_BF16, N, 1);
    CHECK(nk_rng_uniform(&th, 1, &off, 2.0, 4.0) == NK_SUCCESS);
    sum = 0, mn = 1e9, mx = -1e9;
    for (int k = 0; k < N; k++) {
        const double v = ref_decode_float(h[k], 8, 7);
        sum += v;
        mn = fmin(mn, v);
        mx = fmax(mx, v);
    }
    CHECK(mn >= 2.0 && mx <= 4.0);
    CHECK_MSG(fabs(sum / N - 3.0) < 0.01, "uniform bf16 mean %g", sum / N);

    CHECK(nk_rng_normal(&tf, 2, &off, 0.0, 1.0) == NK_SUCCESS);
    sum = 0, sq = 0;
    for (int k = 0; k < N; k++) {
        CHECK_MSG(isfinite(f[k]), "normal gave %g", f[k]);
        sum += f[k];
        sq += (double)f[k] * f[k];
    }
    double mean = sum / N, sd = sqrt(sq / N - mean * mean);
    CHECK_MSG(fabs(mean) < 0.005 && fabs(sd - 1.0) < 0.005, "normal f32 mean %g std %g", mean, sd);

    CHECK(nk_rng_normal(&td, 2, &off, 3.0, 2.0) == NK_SUCCESS);
    sum = 0, sq = 0;
    for (int k = 0; k < N; k++) {
        sum += d[k];
        sq += d[k] * d[k];
    }
    mean = sum / N, sd = sqrt(sq / N - mean * mean);
    CHECK_MSG(fabs(mean - 3.0) < 0.01 && fabs(sd - 2.0) < 0.01, "normal f64 mean %g std %g", mean, sd);

    nk_tensor hh = make_1d(h, NK_F16, N, 1);
    CHECK(nk_rng_normal(&hh, 3, &off, 0.0, 1.0) == NK_SUCCESS);
    sum = 0;
    for (int k = 0; k < N; k++) sum += ref_decode_float(h[k], 5, 10);
    CHECK_MSG(fabs(sum / N) < 0.01, "normal f16 mean %g", sum / N);

    /* bernoulli */
    uint8_t *b = (uint8_t *)h;
    nk_tensor tb = make_1d(b, NK_BOOL, N, 1);
    CHECK(nk_rng_bernoulli(&tb, 4, &off, 0.3) == NK_SUCCESS);
    int64_t ones = 0;
    for (int k = 0; k < N; k++) ones += b[k];
    CHECK_MSG(fabs((double)ones / N - 0.3) < 0.003, "bernoulli freq %g", (double)ones / N);
    CHECK(nk_rng_bernoulli(&tb, 4, &off, 0.0) == NK_SUCCESS);
    ones = 0;
    for (int k = 0; k < N; k++) ones += b[k];
    CHECK(ones == 0);
    CHECK(nk_rng_bernoulli(&tf, 4, &off, 1.0) == NK_SUCCESS);
    bool all_one = true;
    for (int k = 0; k < N; k++) all_one = all_one && f[k] == 1.0f;
    CHECK(all_one);

    /* bernoulli with a probability tensor: broadcast row of 4 probabilities over 250000 rows */
    double prow[4] = {0.0, 0.25, 0.5, 1.0};
    int64_t bs[2] = {N / 4, 4}, bst[2] = {4, 1}, pst[2] = {0, 1};
    nk_tensor bt = mk(b, NK_U8, 2, bs, bst), pt = mk(prow, NK_F64, 2, bs, pst);
    CHECK(nk_rng_bernoulli_tensor(&bt, &pt, 5, &off) == NK_SUCCESS);
    int64_t cnt[4] = {0};
    for (int k = 0; k < N; k++) cnt[k % 4] += b[k];
    CHECK(cnt[0] == 0 && cnt[3] == N / 4);
    CHECK_MSG(fabs((double)cnt[1] / (N / 4) - 0.25) < 0.005 && fabs((double)cnt[2] / (N / 4) - 0.5) < 0.005,
              "bernoulli_tensor freqs %lld %lld", (long long)cnt[1], (long long)cnt[2]);
    /* a constant probability tensor (half precision, broadcast everywhere) equals the scalar kernel */
    uint16_t phalf = 0x3800; /* 0.5 */
    int64_t zst[2] = {0, 0};
    nk_tensor pc = mk(&phalf, NK_F16, 2, bs, zst);
    uint8_t *b2 = malloc(N);
    nk_tensor bt2 = mk(b2, NK_U8, 2, bs, bst);
    uint64_t o1 = 77, o2 = 77;
    CHECK(nk_rng_bernoulli_tensor(&bt, &pc, 6, &o1) == NK_SUCCESS);
    CHECK(nk_rng_bernoulli(&bt2, 6, &o2, 0.5) == NK_SUCCESS);
    CHECK(o1 == o2 && memcmp(b, b2, N) == 0);
    free(b2);

    /* random: small range covers every value and stays in range */
    int32_t *ri = (int32_t *)f;
    nk_tensor tri = make_1d(ri, NK_I32, 10000, 1);
    CHECK(nk_rng_random(&tri, 8, &off, -5, 10) == NK_SUCCESS);
    int seen[10] = {0};
    bool in_range = true;
    for (int k = 0; k < 10000; k++) {
        in_range = in_range && ri[k] >= -5 && ri[k] < 5;
        if (ri[k] >= -5 && ri[k] < 5) seen[ri[k] + 5]++;
    }
    CHECK(in_range);
    for (int k = 0; k < 10; k++) CHECK_MSG(seen[k] > 800, "random value %d seen %d times", k - 5, seen[k]);
    uint8_t *ru = (uint8_t *)f;
    nk_tensor tru = make_1d(ru, NK_U8, 100000, 1);
    CHECK(nk_rng_random(&tru, 8, &off, 0, 256) == NK_SUCCESS);
    int useen[256] = {0};
    for (int k = 0; k < 100000; k++) useen[ru[k]] = 1;
    int covered = 0;
    for (int k = 0; k < 256; k++) covered += useen[k];
    CHECK(covered == 256);
    /* large range uses 64 bits: values beyond 2^32 appear */
    int64_t *rl = (int64_t *)d;
    nk_tensor trl = make_1d(rl, NK_I64, 1000, 1);
    CHECK(nk_rng_random(&trl, 9, &off, 10, UINT64_C(1) << 40) == NK_SUCCESS);
    int high = 0;
    in_range = true;
    for (int k = 0; k < 1000; k++) {
        in_range = in_range && rl[k] >= 10 && rl[k] < 10 + ((int64_t)1 << 40);
        high += rl[k] > ((int64_t)1 << 33);
    }
    CHECK(in_range && high > 900);
    /* bool destination of random(0, 2) has both values */
    uint8_t rb[64];
    nk_tensor trb = make_1d(rb, NK_BOOL, 64, 1);
    CHECK(nk_rng_random(&trb, 9, &off, 0, 2) == NK_SUCCESS);
    int t1 = 0;
    for (int k = 0; k < 64; k++) {
        CHECK(rb[k] <= 1);
        t1 += rb[k];
    }
    CHECK(t1 > 0 && t1 < 64);

    free(f);
    free(d);
    free(h);
}

static bool is_permutation_i64(const int64_t *v, int64_t n) {
    uint8_t *seen = calloc((size_t)n + 1, 1);
    bool ok = true;
    for (int64_t k = 0; k < n; k++) {
        if (v[k] < 0 || v[k] >= n || seen[v[k]]) ok = false;
        else seen[v[k]] = 1;
    }
    free(seen);
    return ok;
}

static void test_randperm(void) {
    enum { N = 1000 };
    int64_t p[N], q[N];
    nk_tensor t = make_1d(p, NK_I64, N, 1);
    uint64_t off = 5;
    CHECK(nk_rng_randperm(&t, N, 11, &off) == NK_SUCCESS);
    CHECK(off == 5 + N);
    CHECK(is_permutation_i64(p, N));
    int fixed = 0;
    for (int k = 0; k < N; k++) fixed += p[k] == k;
    CHECK_MSG(fixed < 10, "randperm has %d fixed points", fixed);
    /* deterministic; other dtypes and strides give the same permutation */
    nk_tensor tq = make_1d(q, NK_I64, N, 1);
    off = 5;
    nk_rng_randperm(&tq, N, 11, &off);
    CHECK(memcmp(p, q, sizeof p) == 0);
    off = 6;
    nk_rng_randperm(&tq, N, 11, &off);
    CHECK(memcmp(p, q, sizeof p) != 0);

    float pf[2 * N];
    nk_tensor tf = make_1d(pf + 2 * (N - 1), NK_F32, N, -2);
    off = 5;
    CHECK(nk_rng_randperm(&tf, N, 11, &off) == NK_SUCCESS);
    int bad = 0;
    for (int k = 0; k < N; k++) bad += pf[2 * (N - 1) - 2 * k] != (float)p[k];
    CHECK(bad == 0);
    int16_t ps[N];
    nk_tensor ts = make_1d(ps, NK_I16, N, 1);
    off = 5;
    CHECK(nk_rng_randperm(&ts, N, 11, &off) == NK_SUCCESS);
    bad = 0;
    for (int k = 0; k < N; k++) bad += ps[k] != p[k];
    CHECK(bad == 0);
    uint16_t ph[N];
    nk_tensor th = make_1d(ph, NK_BF16, 200, 1);
    off = 5;
    CHECK(nk_rng_randperm(&th, 200, 11, &off) == NK_SUCCESS);
    int64_t back[200];
    for (int k = 0; k < 200; k++) back[k] = (int64_t)ref_decode_float(ph[k], 8, 7);
    CHECK(is_permutation_i64(back, 200));

    /* the swap sequence: j = word % (i+1) for i = n-1 .. 1, words consumed in order */
    int64_t small[5] = {0, 1, 2, 3, 4};
    for (int64_t i = 4, w = 0; i >= 1; i--, w++) {
        const int64_t j = (int64_t)(nk_philox_word(3, 9 + (uint64_t)w) % (uint64_t)(i + 1));
        const int64_t tmp = small[i];
        small[i] = small[j];
        small[j] = tmp;
    }
    int64_t got[5];
    nk_tensor tg = make_1d(got, NK_I64, 5, 1);
    off = 9;
    CHECK(nk_rng_randperm(&tg, 5, 3, &off) == NK_SUCCESS && off == 9 + 8);
    CHECK(memcmp(got, small, sizeof got) == 0);

    /* n = 0 and n = 1 */
    nk_tensor t0 = make_1d(NULL, NK_I64, 0, 1);
    off = 3;
    CHECK(nk_rng_randperm(&t0, 0, 1, &off) == NK_SUCCESS && off == 3);
    int32_t single = -1;
    nk_tensor t1 = make_1d(&single, NK_I32, 1, 1);
    CHECK(nk_rng_randperm(&t1, 1, 1, &off) == NK_SUCCESS && off == 7 && single == 0);
    /* bad arguments */
    CHECK(nk_rng_randperm(&t1, 2, 1, &off) == NK_INVALID);
    CHECK(nk_rng_randperm(&t1, -1, 1, &off) == NK_INVALID);
    CHECK(nk_rng_randperm(&t1, 1, 1, NULL) == NK_INVALID);
    nk_tensor tb = make_1d(got, NK_BOOL, 1, 1);
    CHECK(nk_rng_randperm(&tb, 1, 1, &off) == NK_UNSUPPORTED);
}

static void test_rng_errors(void) {
    int32_t i[4];
    float f[4];
    uint64_t off = 0;
    nk_tensor ti = make_1d(i, NK_I32, 4, 1), tf = make_1d(f, NK_F32, 4, 1);
    CHECK(nk_rng_uniform(&ti, 1, &off, 0, 1) == NK_UNSUPPORTED);
    CHECK(nk_rng_normal(&ti, 1, &off, 0, 1) == NK_UNSUPPORTED);
    nk_tensor tb = make_1d(i, NK_BOOL, 4, 1);
    CHECK(nk_rng_normal(&tb, 1, &off, 0, 1) == NK_UNSUPPORTED);
    CHECK(nk_rng_bernoulli_tensor(&tf, &ti, 1, &off) == NK_UNSUPPORTED);
    CHECK(off == 0);
    CHECK(nk_rng_uniform(&tf, 1, NULL, 0, 1) == NK_INVALID);
    CHECK(nk_rng_uniform(&tf, 1, &off, 1, 0) == NK_INVALID);
    CHECK(nk_rng_normal(&tf, 1, &off, 0, -1) == NK_INVALID);
    CHECK(nk_rng_bernoulli(&tf, 1, &off, 1.5) == NK_INVALID);
    CHECK(nk_rng_bernoulli(&tf, 1, &off, NAN) == NK_INVALID);
    nk_tensor bad = tf;
    bad.ndim = 17;
    CHECK(nk_rng_uniform(&bad, 1, &off, 0, 1) == NK_INVALID);
    CHECK(nk_rng_random(&bad, 1, &off, 0, 1) == NK_INVALID);
    nk_tensor p3 = make_1d(f, NK_F32, 3, 1);
    CHECK(nk_rng_bernoulli_tensor(&tf, &p3, 1, &off) == NK_INVALID); /* shape mismatch */
    CHECK(off == 0);
    /* bernoulli into an int dst with a float p tensor is fine */
    f[0] = 0.0f, f[1] = 1.0f, f[2] = 0.0f, f[3] = 1.0f;
    CHECK(nk_rng_bernoulli_tensor(&ti, &tf, 1, &off) == NK_SUCCESS && off == 4);
    CHECK(i[0] == 0 && i[1] == 1 && i[2] == 0 && i[3] == 1);
}

/* ---- thread pool ---- */

typedef struct pool_ctx {
    int64_t *hits;     /* per index: how many times it was visited */
    int64_t grain;
    int nested;
} pool_ctx;

static void pool_visit(void *arg, int64_t b, int64_t e) {
    pool_ctx *c = arg;
    for (int64_t i = b; i < e; i++)
        __atomic_add_fetch(&c->hits[i], 1, __ATOMIC_RELAXED);
    if (c->nested) {
        pool_ctx inner = {.hits = NULL, .grain = 1, .nested = 0};
        int64_t count[4] = {0, 0, 0, 0};
        inner.hits = count;
        nk_parallel_for(4, 1, pool_visit, &inner); /* runs serially on this thread */
        for (int k = 0; k < 4; k++)
            if (count[k] != 1)
                __atomic_add_fetch(&c->hits[0], 1000000, __ATOMIC_RELAXED);
    }
}

static void test_threadpool(void) {
    enum { N = 10007 };
    static int64_t hits[N];
    for (int threads = 1; threads <= 4; threads++) {
        nk_threads_set(threads);
        CHECK(nk_threads_get() == threads);
        for (int rep = 0; rep < 200; rep++) {
            int64_t n = rep % 3 == 0 ? N : 1 + rep * 37 % N;
            memset(hits, 0, sizeof hits);
            pool_ctx c = {.hits = hits, .grain = 1 + rep % 50, .nested = rep % 7 == 0};
            nk_parallel_for(n, c.grain, pool_visit, &c);
            int ok = 1;
            for (int64_t i = 0; i < N; i++)
                ok &= hits[i] == (i < n ? 1 : 0);
            CHECK(ok);
        }
    }
    nk_parallel_for(0, 1, pool_visit, NULL); /* empty range: fn not called */
    nk_threads_set(1);
}

/* Another pool in charge (as the binding installs PyTorch's): every loop goes through it, nested calls
 * included, nk_threads_get reports its count, and NULL gives the library's pool back. This runner runs
 * the chunks itself in reverse order, each `grain` long, the nested ones serially. */
static int g_runner_calls, g_runner_depth;

static void reverse_runner(int64_t n, int64_t grain, nk_range_fn fn, void *ctx) {
    g_runner_calls++;
    if (g_runner_depth > 0) { /* nested: serially, as at::parallel_for does inside a parallel region */
        fn(ctx, 0, n);
        return;
    }
    g_runner_depth++;
    for (int64_t e = n; e > 0; e -= grain) fn(ctx, e - grain > 0 ? e - grain : 0, e);
    g_runner_depth--;
}

static int three_threads(void) { return 3; }

static void test_parallel_runner(void) {
    enum { N = 1001 };
    static int64_t hits[N];
    nk_threads_set(2);
    nk_parallel_set_runner(reverse_runner, three_threads);
    CHECK(nk_threads_get() == 3);
    memset(hits, 0, sizeof hits);
    pool_ctx c = {.hits = hits, .grain = 7, .nested = 1};
    nk_parallel_for(N, c.grain, pool_visit, &c);
    int ok = 1;
    for (int64_t i = 0; i < N; i++) ok &= hits[i] == 1;
    CHECK(ok);
    CHECK(g_runner_calls == 1 + (N + 6) / 7); /* the loop, and one nested loop per chunk */
    /* A kernel through the runner: a 96 x 80 x 64 product of ones (every entry 64) is split in tasks. */
    enum { M = 96, K = 64, NN = 80 };
    static float a[M * K], b[K * NN], out[M * NN];
    for (int i = 0; i < M * K; i++) a[i] = 1.0f;
    for (int i = 0; i < K * NN; i++) b[i] = 1.0f;
    nk_tensor ta = {.data = a, .dtype = NK_F32, .ndim = 2}, tb = ta, to = ta;
    ta.sizes[0] = M, ta.sizes[1] = K, ta.strides[0] = K, ta.strides[1] = 1;
    tb.data = b, tb.sizes[0] = K, tb.sizes[1] = NN, tb.strides[0] = NN, tb.strides[1] = 1;
    to.data = out, to.sizes[0] = M, to.sizes[1] = NN, to.strides[0] = NN, to.strides[1] = 1;
    const int before = g_runner_calls;
    CHECK(nk_gemm(&to, &ta, &tb, NULL, 1.0, 0.0) == NK_SUCCESS);
    CHECK(g_runner_calls > before);
    for (int i = 0; i < M * NN; i++) ok &= out[i] == (float)K;
    CHECK(ok);
    nk_parallel_set_runner(NULL, NULL);
    CHECK(nk_threads_get() == 2);
    const int calls = g_runner_calls;
    memset(hits, 0, sizeof hits);
    c.nested = 0;
    nk_parallel_for(N, c.grain, pool_visit, &c);
    CHECK(g_runner_calls == calls);
    nk_threads_set(1);
}

int main(void) {
    test_dtype_props();
    test_copy_edge_cases();
    test_copy_all_pairs();
    test_half_bf16_exhaustive();
    test_copy_layouts();
    test_fill();
    test_philox_kat();
    test_rng_structure();
    test_rng_statistics();
    test_randperm();
    test_rng_errors();
    test_threadpool();
    test_parallel_runner();
    printf("test_kernels: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
