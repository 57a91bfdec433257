/* reduce.c - the element-wise reduction of N sources into one or more destinations, for every dtype. */
#include "collectives_internal.h"

#include <math.h>
#include <string.h>

/* Elements per chunk. A chunk is combined across all sources before the next one starts, so every
 * source is read as one continuous stream, interleaved with the others, while the results stream out.
 * Reducing a large block of one source, then of the next, then writing the block (phases of reads and
 * phases of writes) ran a 2-rank 64 MiB reduce-scatter at 0.55-0.7x this speed. */
#define NCL_CHUNK 64

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

/* Where a reduction's result goes: every one of dsts, with non-temporal stores when stream is set. */
typedef struct ncl_out {
    char *const *dsts;
    int ndst;
    bool stream;
} ncl_out;

/* Writes one finished chunk (src 64-byte aligned) at byte offset off of every destination. */
static inline __attribute__((always_inline)) void ncl_put(const ncl_out *o, size_t off, const void *src,
                                                          size_t bytes)
{
    for (int j = 0; j < o->ndst; j++) {
        char *d = o->dsts[j] + off;
#if defined(__x86_64__)
        if (o->stream && ((uintptr_t)d & 15) == 0 && bytes % 64 == 0) {
            const __m128i *s = src;
            for (size_t i = 0; i < bytes / 16; i += 4) {
                _mm_stream_si128((__m128i *)d + i, _mm_load_si128(s + i));
                _mm_stream_si128((__m128i *)d + i + 1, _mm_load_si128(s + i + 1));
                _mm_stream_si128((__m128i *)d + i + 2, _mm_load_si128(s + i + 2));
                _mm_stream_si128((__m128i *)d + i + 3, _mm_load_si128(s + i + 3));
            }
            continue;
        }
#endif
        memcpy(d, src, bytes);
    }
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bf16_to_f32(uint16_t b) { return f32_from_bits((uint32_t)b << 16); }

/* Round to nearest even; NaN becomes the quiet NaN 0x7FC0 as PyTorch's BFloat16 does. */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = 0u - (uint32_t)((u & 0x7FFFFFFFu) > 0x7F800000u);
    return (uint16_t)((0x7FC0u & nan) | (r & ~nan));
}

/* Branch-free IEEE half conversions (exponent rebias with float arithmetic doing the rounding), so the
 * block loops vectorise. */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    float normalized = f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    float denormalized = f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    uint32_t is_denormal = 0u - (uint32_t)(two_w < (1u << 27));
    return f32_from_bits(sign | (f32_bits(denormalized) & is_denormal) | (f32_bits(normalized) & ~is_denormal));
}

static inline uint16_t f32_to_f16(float f)
{
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t w = f32_bits(f), shl1_w = w + w, sign = w & 0x80000000u;
    uint32_t exp_bits_in = shl1_w & 0xFF000000u;
    uint32_t bias = exp_bits_in < 0x71000000u ? 0x71000000u : exp_bits_in;
    base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = f32_bits(base);
    uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
    uint32_t is_nan = 0u - (uint32_t)(shl1_w > 0xFF000000u);
    return (uint16_t)((sign >> 16) | (0x7E00u & is_nan) | (nonsign & ~is_nan));
}

/* NaN-propagating min/max, like torch.minimum/maximum. */
#define NCL_FMAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define NCL_FMIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))

/* ---- float16 / bfloat16 / float32: accumulate in float ---------------------------------------- */

/* t[0..n) = the half-precision src (bf16 or f16) widened to float. */
static inline __attribute__((always_inline)) void load_f(float *restrict t, const void *src, ncl_dtype dt,
                                                         int64_t n)
{
    const uint16_t *s = src;
    if (dt == NCL_BF16)
        for (int64_t i = 0; i < n; i++)
            t[i] = bf16_to_f32(s[i]);
    else
        for (int64_t i = 0; i < n; i++)
            t[i] = f16_to_f32(s[i]);
}

/* acc[i] = a[i] op t[i] (a may be acc); f scales t for PREMUL_SUM. */
static inline __attribute__((always_inline)) void combine_f(float *acc, const float *a, const float *restrict t,
                                                            int64_t m, ncl_redop op, float f)
{
    switch (op) {
    case NCL_PREMUL_SUM:
        for (int64_t i = 0; i < m; i++)
            acc[i] = a[i] + f * t[i];
        break;
    case NCL_SUM:
    case NCL_AVG:
        for (int64_t i = 0; i < m; i++)
            acc[i] = a[i] + t[i];
        break;
    case NCL_PRODUCT:
        for (int64_t i = 0; i < m; i++)
            acc[i] = a[i] * t[i];
        break;
    case NCL_MIN:
        for (int64_t i = 0; i < m; i++)
            acc[i] = NCL_FMIN(a[i], t[i]);
        break;
    default:
        for (int64_t i = 0; i < m; i++)
            acc[i] = NCL_FMAX(a[i], t[i]);
        break;
    }
}

static inline __attribute__((always_inline)) void reduce_float_impl(const ncl_out *out, const void *const *src,
                                                                    const double *factors, int nsrc, int64_t n,
                                                                    ncl_dtype dt, ncl_redop op, int avg_div)
{
    float acc[NCL_CHUNK] __attribute__((aligned(64))), tmp[NCL_CHUNK];
    uint16_t half[NCL_CHUNK] __attribute__((aligned(64)));
    size_t es = ncl_dtype_size(dt);
    for (int64_t b0 = 0; b0 < n; b0 += NCL_CHUNK) {
        int64_t m = n - b0 < NCL_CHUNK ? n - b0 : NCL_CHUNK;
        /* Source s of this chunk as floats: float32 is read where it lies, not copied first (an inlined
         * copy of source 0 into acc became rep movs, 40% of a reduce-scatter's time). */
#define NCL_SRC_F(s, buf)                                                                                     \
    (dt == NCL_F32 ? (const float *)src[s] + b0                                                               \
                   : (load_f(buf, (const char *)src[s] + (size_t)b0 * es, dt, m), (const float *)(buf)))
        const float *t0 = NCL_SRC_F(0, acc);
        int s = 1;
        if (op == NCL_PREMUL_SUM) {
            float f = factors ? (float)factors[0] : 1.0f;
            for (int64_t i = 0; i < m; i++)
                acc[i] = f * t0[i];
        } else if (nsrc == 1) {
            if (t0 != acc)
                memcpy(acc, t0, (size_t)m * sizeof(float));
        } else {
            combine_f(acc, t0, NCL_SRC_F(1, tmp), m, op, 1.0f);
            s = 2;
        }
        for (; s < nsrc; s++)
            combine_f(acc, acc, NCL_SRC_F(s, tmp), m, op, factors ? (float)factors[s] : 1.0f);
#undef NCL_SRC_F
        if (op == NCL_AVG) {
            float d = (float)avg_div;
            for (int64_t i = 0; i < m; i++)
                acc[i] /= d;
        }
        if (dt == NCL_F32) {
            ncl_put(out, (size_t)b0 * es, acc, (size_t)m * es);
            continue;
        }
        if (dt == NCL_BF16)
            for (int64_t i = 0; i < m; i++)
                half[i] = f32_to_bf16(acc[i]);
        else
            for (int64_t i = 0; i < m; i++)
                half[i] = f32_to_f16(acc[i]);
        ncl_put(out, (size_t)b0 * es, half, (size_t)m * es);
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) static void
reduce_float_avx512(const ncl_out *out, const void *const *src, const double *factors, int nsrc, int64_t n, ncl_dtype dt,
                    ncl_redop op, int avg_div)
{
    reduce_float_impl(out, src, factors, nsrc, n, dt, op, avg_div);
}

__attribute__((target("avx2,fma"))) static void reduce_float_avx2(const ncl_out *out, const void *const *src,
                                                                  const double *factors, int nsrc, int64_t n,
                                                                  ncl_dtype dt, ncl_redop op, int avg_div)
{
    reduce_float_impl(out, src, factors, nsrc, n, dt, op, avg_div);
}

static void reduce_float_portable(const ncl_out *out, const void *const *src, const double *factors, int nsrc, int64_t n,
                                  ncl_dtype dt, ncl_redop op, int avg_div)
{
    reduce_float_impl(out, src, factors, nsrc, n, dt, op, avg_div);
}

typedef void (*reduce_float_fn)(const ncl_out *, const void *const *, const double *, int, int64_t, ncl_dtype, ncl_redop,
                                int);

static reduce_float_fn reduce_float_pick(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return reduce_float_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return reduce_float_avx2;
    return reduce_float_portable;
}

/* ---- float64 ----------------------------------------------------------------------------------- */

static void reduce_f64(const ncl_out *out, const void *const *src, const double *factors, int nsrc, int64_t n,
                       ncl_redop op, int avg_div)
{
    double acc[NCL_CHUNK] __attribute__((aligned(64)));
    for (int64_t b0 = 0; b0 < n; b0 += NCL_CHUNK) {
        int64_t m = n - b0 < NCL_CHUNK ? n - b0 : NCL_CHUNK;
        for (int s = 0; s < nsrc; s++) {
            const double *t = (const double *)src[s] + b0;
            double f = (op == NCL_PREMUL_SUM && factors) ? factors[s] : 1.0;
            if (s == 0) {
                for (int64_t i = 0; i < m; i++)
                    acc[i] = op == NCL_PREMUL_SUM ? f * t[i] : t[i];
                continue;
            }
            for (int64_t i = 0; i < m; i++) {
                switch (op) {
                case NCL_PRODUCT: acc[i] *= t[i]; break;
                case NCL_MIN: acc[i] = NCL_FMIN(acc[i], t[i]); break;
                case NCL_MAX: acc[i] = NCL_FMAX(acc[i], t[i]); break;
                case NCL_PREMUL_SUM: acc[i] += f * t[i]; break;
                default: acc[i] += t[i]; break;
                }
            }
        }
        if (op == NCL_AVG)
            for (int64_t i = 0; i < m; i++)
                acc[i] /= (double)avg_div;
        ncl_put(out, (size_t)b0 * sizeof(double), acc, (size_t)m * sizeof(double));
    }
}

/* ---- integers and bool: 64-bit accumulator, wrapping sums and products ---------------------------- */

static inline int64_t load_int(const void *p, int64_t i, ncl_dtype dt)
{
    switch (dt) {
    case NCL_BOOL: return ((const uint8_t *)p)[i] != 0;
    case NCL_U8: return ((const uint8_t *)p)[i];
    case NCL_I8: return ((const int8_t *)p)[i];
    case NCL_I16: return ((const int16_t *)p)[i];
    case NCL_I32: return ((const int32_t *)p)[i];
    case NCL_U16: return ((const uint16_t *)p)[i];
    case NCL_U32: return ((const uint32_t *)p)[i];
    default: return ((const int64_t *)p)[i]; /* I64, U64: bit pattern */
    }
}

static inline void store_int(void *p, int64_t i, ncl_dtype dt, uint64_t v)
{
    switch (dt) {
    case NCL_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case NCL_U8: case NCL_I8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case NCL_I16: case NCL_U16: ((uint16_t *)p)[i] = (uint16_t)v; break;
    case NCL_I32: case NCL_U32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    default: ((uint64_t *)p)[i] = v; break;
    }
}

static void reduce_int(const ncl_out *out, const void *const *src, int nsrc, int64_t n, ncl_dtype dt,
                       ncl_redop op, int avg_div)
{
    bool is_unsigned = dt == NCL_U64; /* the only type whose order differs from its int64 bit pattern */
    size_t es = ncl_dtype_size(dt);
    uint64_t chunk[NCL_CHUNK] __attribute__((aligned(64))); /* the results, stored as dt */
    for (int64_t b0 = 0; b0 < n; b0 += NCL_CHUNK) {
        int64_t m = n - b0 < NCL_CHUNK ? n - b0 : NCL_CHUNK;
        for (int64_t i = 0; i < m; i++) {
            uint64_t acc = (uint64_t)load_int(src[0], b0 + i, dt);
            for (int s = 1; s < nsrc; s++) {
                uint64_t v = (uint64_t)load_int(src[s], b0 + i, dt);
                switch (op) {
                case NCL_PRODUCT: acc *= v; break;
                case NCL_MIN:
                    if (is_unsigned ? v < acc : (int64_t)v < (int64_t)acc)
                        acc = v;
                    break;
                case NCL_MAX:
                    if (is_unsigned ? v > acc : (int64_t)v > (int64_t)acc)
                        acc = v;
                    break;
                default: acc += v; break;
                }
            }
            if (op == NCL_AVG)
                acc = is_unsigned ? acc / (uint64_t)avg_div : (uint64_t)((int64_t)acc / avg_div);
            store_int(chunk, i, dt, acc);
        }
        ncl_put(out, (size_t)b0 * es, chunk, (size_t)m * es);
    }
}

ncl_status ncl_reduce_to(char *const *dsts, int ndst, bool stream, const void *const *src, const double *factors,
                         int nsrc, int64_t n, ncl_dtype dt, ncl_redop op, int avg_div)
{
    static reduce_float_fn float_fn;
    ncl_status st = ncl_reduce_check(dt, op, "ncl_reduce_local");
    if (st != NCL_SUCCESS)
        return st;
    if (n <= 0 || nsrc <= 0)
        return NCL_SUCCESS;
    if (avg_div <= 0)
        avg_div = 1;
    ncl_out out = {dsts, ndst, stream};
    switch (dt) {
    case NCL_F32:
    case NCL_BF16:
    case NCL_F16:
        if (float_fn == NULL)
            float_fn = reduce_float_pick(); /* benign race: every thread stores the same value */
        float_fn(&out, src, factors, nsrc, n, dt, op, avg_div);
        break;
    case NCL_F64: reduce_f64(&out, src, factors, nsrc, n, op, avg_div); break;
    default: reduce_int(&out, src, nsrc, n, dt, op, avg_div); break;
    }
#if defined(__x86_64__)
    if (stream)
        _mm_sfence(); /* non-temporal stores are weakly ordered: fence them before a peer may read */
#endif
    return NCL_SUCCESS;
}

ncl_status ncl_reduce_local(void *dst, const void *const *src, const double *factors, int nsrc, int64_t n,
                            ncl_dtype dt, ncl_redop op, int avg_div)
{
    char *d = dst;
    return ncl_reduce_to(&d, 1, false, src, factors, nsrc, n, dt, op, avg_div);
}

ncl_status ncl_reduce_check(ncl_dtype dt, ncl_redop op, const char *what)
{
    if ((unsigned)dt >= NCL_DTYPE_COUNT)
        return ncl_error(NCL_INVALID, "%s: invalid dtype %d", what, (int)dt);
    if ((unsigned)op >= NCL_REDOP_COUNT)
        return ncl_error(NCL_INVALID, "%s: invalid reduce op %d", what, (int)op);
    if (dt == NCL_BOOL && (op == NCL_AVG || op == NCL_PREMUL_SUM))
        return ncl_error(NCL_UNSUPPORTED, "%s: reduce op %s is not supported for bool", what, ncl_redop_name(op));
    if (op == NCL_PREMUL_SUM && !(dt == NCL_F16 || dt == NCL_BF16 || dt == NCL_F32 || dt == NCL_F64))
        return ncl_error(NCL_UNSUPPORTED, "%s: PREMUL_SUM needs a floating-point dtype, got %s", what,
                         ncl_dtype_name(dt));
    return NCL_SUCCESS;
}
