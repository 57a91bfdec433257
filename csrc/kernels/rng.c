/*
 * rng.c - Philox4x32-10 and the random kernels.
 *
 * Every kernel walks dst in logical row-major order (the iterator is built without reordering) and
 * consumes the word stream sequentially from *offset, so values depend on (seed, offset, shape) only.
 * Values are produced a chunk at a time into a contiguous staging buffer and then stored with the
 * copy kernels' cast loops, which gives every destination dtype and stride for free.
 *
 * Choices the header leaves open (documented here, relied on by tests):
 *   - 64-bit draws combine two consecutive words little-endian: x = w[k] | (uint64)w[k+1] << 32.
 *   - uniform: float/half/bfloat16 use u = (w >> 8) * 2^-24 and compute u * (to - from) + from in float
 *     with from/to first rounded to dst's dtype (PyTorch's uniform_real in its accumulate type);
 *     float64 uses u = (x >> 11) * 2^-53 in double.
 *   - normal (2 words): float/half/bfloat16 use u1 = ((w0 >> 8) + 1) * 2^-24, u2 = (w1 >> 8) * 2^-24 in
 *     float; float64 uses u1 = (w0 + 1) * 2^-32, u2 = w1 * 2^-32 in double; z = sqrt(-2 ln u1) cos(2 pi u2).
 *   - bernoulli always uses one word per element, u = w * 2^-32 (a double), result (u < p).
 *   - random: range == 0 means 2^64 (the full 64-bit range, which uint64 cannot spell otherwise).
 *   - randperm: for i = n-1 down to 1, j = x % (i+1) with x the next 1 (2 if n > 2^32) words, swap.
 *     The offset advances by roundup(n*w, 4), like an n-element fill.
 */
#include "kernels_internal.h"

#include <math.h>

#define NK_RNG_CHUNK 256
#define NK_TWO_PI 6.283185307179586476925286766559

void nk_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += NK_PHILOX_W0;
            k1 += NK_PHILOX_W1;
        }
        const uint64_t p0 = (uint64_t)NK_PHILOX_M0 * c0;
        const uint64_t p1 = (uint64_t)NK_PHILOX_M1 * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

static void nk_philox_block(const uint32_t key[2], uint64_t block, uint32_t out[4]) {
    const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0, 0};
    nk_philox4x32_10(ctr, key, out);
}

uint32_t nk_philox_word(uint64_t seed, uint64_t p) {
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    nk_philox_block(key, p / 4, out);
    return out[p % 4];
}

/* Sequential reader over the word stream, caching the current block. */
typedef struct nk_philox_stream {
    uint32_t key[2];
    uint64_t block;
    uint32_t buf[4];
    uint32_t pos;
} nk_philox_stream;

static void nk_philox_stream_init(nk_philox_stream *s, uint64_t seed, uint64_t word) {
    s->key[0] = (uint32_t)seed;
    s->key[1] = (uint32_t)(seed >> 32);
    s->block = word / 4;
    s->pos = (uint32_t)(word % 4);
    nk_philox_block(s->key, s->block, s->buf);
}

static void nk_philox_stream_read(nk_philox_stream *s, uint32_t *out, int64_t count) {
    int64_t i = 0;
    while (i < count) {
        if (s->pos == 4) {
            s->block++;
            nk_philox_block(s->key, s->block, s->buf);
            s->pos = 0;
        }
        /* Whole blocks straight into the output when aligned. */
        if (s->pos == 0) {
            while (count - i >= 4) {
                memcpy(out + i, s->buf, sizeof s->buf);
                i += 4;
                s->block++;
                nk_philox_block(s->key, s->block, s->buf);
            }
        }
        while (i < count && s->pos < 4) out[i++] = s->buf[s->pos++];
    }
}

static uint64_t nk_philox_stream_next64(nk_philox_stream *s, int32_t words) {
    uint32_t w[2] = {0, 0};
    nk_philox_stream_read(s, w, words);
    return (uint64_t)w[0] | ((uint64_t)w[1] << 32);
}

static uint64_t nk_round_up4(uint64_t x) {
    return (x + 3) & ~(uint64_t)3;
}

/* ---- generator driver ---- */

typedef enum nk_gen_kind {
    NK_GEN_UNIFORM_F32,
    NK_GEN_UNIFORM_F64,
    NK_GEN_NORMAL_F32,
    NK_GEN_NORMAL_F64,
    NK_GEN_BERNOULLI,
    NK_GEN_BERNOULLI_TENSOR,
    NK_GEN_RANDOM,
} nk_gen_kind;

typedef struct nk_gen {
    nk_gen_kind kind;
    int32_t words;  /* words per element */
    nk_dtype stage; /* dtype of the staged values, cast into dst afterwards */
    float af, bf;   /* (from, to) or (mean, std) for float computation */
    double a, b;    /* the same in double; a is p for bernoulli */
    int64_t from;
    uint64_t range; /* 0 = 2^64 */
} nk_gen;

typedef union nk_stage {
    float f[NK_RNG_CHUNK];
    double d[NK_RNG_CHUNK];
    int64_t i[NK_RNG_CHUNK];
    uint8_t b[NK_RNG_CHUNK];
} nk_stage;

static void nk_gen_values(const nk_gen *g, const uint32_t *w, const double *p, nk_stage *out, int64_t n) {
    switch (g->kind) {
    case NK_GEN_UNIFORM_F32: {
        const float span = g->bf - g->af;
        for (int64_t i = 0; i < n; i++) out->f[i] = (float)(w[i] >> 8) * 0x1.0p-24f * span + g->af;
        break;
    }
    case NK_GEN_UNIFORM_F64: {
        const double span = g->b - g->a;
        for (int64_t i = 0; i < n; i++) {
            const uint64_t x = (uint64_t)w[2 * i] | ((uint64_t)w[2 * i + 1] << 32);
            out->d[i] = (double)(x >> 11) * 0x1.0p-53 * span + g->a;
        }
        break;
    }
    case NK_GEN_NORMAL_F32:
        for (int64_t i = 0; i < n; i++) {
            const float u1 = (float)((w[2 * i] >> 8) + 1) * 0x1.0p-24f;
            const float u2 = (float)(w[2 * i + 1] >> 8) * 0x1.0p-24f;
            const float z = sqrtf(-2.0f * logf(u1)) * cosf((float)NK_TWO_PI * u2);
            out->f[i] = g->af + g->bf * z;
        }
        break;
    case NK_GEN_NORMAL_F64:
        for (int64_t i = 0; i < n; i++) {
            const double u1 = ((double)w[2 * i] + 1.0) * 0x1.0p-32;
            const double u2 = (double)w[2 * i + 1] * 0x1.0p-32;
            const double z = sqrt(-2.0 * log(u1)) * cos(NK_TWO_PI * u2);
            out->d[i] = g->a + g->b * z;
        }
        break;
    case NK_GEN_BERNOULLI:
        for (int64_t i = 0; i < n; i++) out->b[i] = (uint8_t)((double)w[i] * 0x1.0p-32 < g->a);
        break;
    case NK_GEN_BERNOULLI_TENSOR:
        for (int64_t i = 0; i < n; i++) out->b[i] = (uint8_t)((double)w[i] * 0x1.0p-32 < p[i]);
        break;
    case NK_GEN_RANDOM:
        for (int64_t i = 0; i < n; i++) {
            const uint64_t x = g->words == 1 ? (uint64_t)w[i]
                                             : ((uint64_t)w[2 * i] | ((uint64_t)w[2 * i + 1] << 32));
            const uint64_t r = g->range == 0 ? x : x % g->range;
            /* Unsigned add then reinterpret: wraps instead of overflowing. */
            out->i[i] = (int64_t)((uint64_t)g->from + r);
        }
        break;
    }
}

static nk_status nk_rng_run(const nk_tensor *dst, const nk_tensor *p, const nk_gen *g, uint64_t seed,
                            uint64_t *offset) {
    int64_t n = 0, pn = 0;
    if (offset == NULL || nk_tensor_check(dst, &n) != NK_SUCCESS) return NK_INVALID;
    if (p != NULL && (nk_tensor_check(p, &pn) != NK_SUCCESS || !nk_same_shape(dst, p))) return NK_INVALID;
    if (n == 0) return NK_SUCCESS;

    const nk_tensor *const ops[2] = {dst, p};
    nk_iter it;
    nk_iter_init(&it, p != NULL ? 2 : 1, ops, false);
    const nk_cast_fn store = nk_cast_get(dst->dtype, g->stage);
    const nk_cast_fn load_p = p != NULL ? nk_cast_get(NK_F64, p->dtype) : NULL;
    const int64_t inner = nk_iter_inner_size(&it);
    const int64_t ds = nk_iter_inner_stride(&it, 0);
    const int64_t ps = p != NULL ? nk_iter_inner_stride(&it, 1) : 0;

    nk_philox_stream stream;
    nk_philox_stream_init(&stream, seed, *offset);
    uint32_t words[2 * NK_RNG_CHUNK];
    double pvals[NK_RNG_CHUNK];
    nk_stage stage;
    for (int64_t r = 0; r < it.rows; r++) {
        char *d = nk_iter_ptr(&it, 0);
        const char *pp = p != NULL ? nk_iter_ptr(&it, 1) : NULL;
        for (int64_t c = 0; c < inner; c += NK_RNG_CHUNK) {
            const int64_t m = inner - c < NK_RNG_CHUNK ? inner - c : NK_RNG_CHUNK;
            nk_philox_stream_read(&stream, words, m * g->words);
            if (pp != NULL) load_p(pvals, 1, pp + c * ps * it.elsize[1], ps, m);
            nk_gen_values(g, words, pvals, &stage, m);
            store(d + c * ds * it.elsize[0], ds, &stage, 1, m);
        }
        nk_iter_next_row(&it);
    }
    *offset += nk_round_up4((uint64_t)n * (uint64_t)g->words);
    return NK_SUCCESS;
}

static bool nk_dtype_is_float(nk_dtype t) {
    return t == NK_F16 || t == NK_BF16 || t == NK_F32 || t == NK_F64;
}

/* The value a bound takes once stored in dst's dtype, as PyTorch casts from/to to scalar_t first. */
static float nk_round_to_dtype(double v, nk_dtype t) {
    const float f = (float)v;
    if (t == NK_F16) return nk_f16_to_f32(nk_f32_to_f16(f));
    if (t == NK_BF16) return nk_bf16_to_f32(nk_f32_to_bf16(f));
    return f;
}

nk_status nk_rng_uniform(const nk_tensor *dst, uint64_t seed, uint64_t *offset, double from, double to) {
    if (dst == NULL || !nk_dtype_valid(dst->dtype)) return NK_INVALID;
    if (!nk_dtype_is_float(dst->dtype)) return NK_UNSUPPORTED;
    if (!(from <= to)) return NK_INVALID;
    nk_gen g = {.a = from, .b = to};
    if (dst->dtype == NK_F64) {
        g.kind = NK_GEN_UNIFORM_F64;
        g.words = 2;
        g.stage = NK_F64;
    } else {
        g.kind = NK_GEN_UNIFORM_F32;
        g.words = 1;
        g.stage = NK_F32;
        g.af = nk_round_to_dtype(from, dst->dtype);
        g.bf = nk_round_to_dtype(to, dst->dtype);
    }
    return nk_rng_run(dst, NULL, &g, seed, offset);
}

nk_status nk_rng_normal(const nk_tensor *dst, uint64_t seed, uint64_t *offset, double mean, double std) {
    if (dst == NULL || !nk_dtype_valid(dst->dtype)) return NK_INVALID;
    if (!nk_dtype_is_float(dst->dtype)) return NK_UNSUPPORTED;
    if (!(std >= 0.0)) return NK_INVALID;
    nk_gen g = {.words = 2, .a = mean, .b = std, .af = (float)mean, .bf = (float)std};
    g.kind = dst->dtype == NK_F64 ? NK_GEN_NORMAL_F64 : NK_GEN_NORMAL_F32;
    g.stage = dst->dtype == NK_F64 ? NK_F64 : NK_F32;
    return nk_rng_run(dst, NULL, &g, seed, offset);
}

nk_status nk_rng_bernoulli(const nk_tensor *dst, uint64_t seed, uint64_t *offset, double p) {
    if (!(p >= 0.0 && p <= 1.0)) return NK_INVALID;
    const nk_gen g = {.kind = NK_GEN_BERNOULLI, .words = 1, .stage = NK_U8, .a = p};
    return nk_rng_run(dst, NULL, &g, seed, offset);
}

nk_status nk_rng_bernoulli_tensor(const nk_tensor *dst, const nk_tensor *p, uint64_t seed, uint64_t *offset) {
    if (p == NULL || !nk_dtype_valid(p->dtype)) return NK_INVALID;
    if (!nk_dtype_is_float(p->dtype)) return NK_UNSUPPORTED;
    const nk_gen g = {.kind = NK_GEN_BERNOULLI_TENSOR, .words = 1, .stage = NK_U8};
    return nk_rng_run(dst, p, &g, seed, offset);
}

nk_status nk_rng_random(const nk_tensor *dst, uint64_t seed, uint64_t *offset, int64_t from, uint64_t range) {
    const nk_gen g = {
        .kind = NK_GEN_RANDOM,
        .words = (range != 0 && range <= (UINT64_C(1) << 32)) ? 1 : 2,
        .stage = NK_I64,
        .from = from,
        .range = range,
    };
    return nk_rng_run(dst, NULL, &g, seed, offset);
}

/* memcpy swaps: the elements may be floats, moved as raw bits of the same size. */
#define NK_SWAP_LOOP(type)                                                                      \
    do {                                                                                        \
        for (int64_t i = n - 1; i >= 1; i--) {                                                  \
            const int64_t j = (int64_t)(nk_philox_stream_next64(&stream, w) % (uint64_t)(i + 1)); \
            char *pi_ = base + i * st * es, *pj_ = base + j * st * es;                          \
            type ti_, tj_;                                                                      \
            memcpy(&ti_, pi_, sizeof ti_);                                                      \
            memcpy(&tj_, pj_, sizeof tj_);                                                      \
            memcpy(pi_, &tj_, sizeof tj_);                                                      \
            memcpy(pj_, &ti_, sizeof ti_);                                                      \
        }                                                                                       \
    } while (0)

nk_status nk_rng_randperm(const nk_tensor *dst, int64_t n, uint64_t seed, uint64_t *offset) {
    int64_t numel = 0;
    if (offset == NULL || n < 0 || nk_tensor_check(dst, &numel) != NK_SUCCESS) return NK_INVALID;
    if (dst->ndim != 1 || dst->sizes[0] != n) return NK_INVALID;
    if (dst->dtype == NK_BOOL) return NK_UNSUPPORTED;
    if (n == 0) return NK_SUCCESS;

    char *base = (char *)dst->data;
    const int64_t st = dst->strides[0];
    const int64_t es = (int64_t)nk_dtype_size(dst->dtype);
    const nk_cast_fn store = nk_cast_get(dst->dtype, NK_I64);
    int64_t ramp[NK_RNG_CHUNK];
    for (int64_t c = 0; c < n; c += NK_RNG_CHUNK) {
        const int64_t m = n - c < NK_RNG_CHUNK ? n - c : NK_RNG_CHUNK;
        for (int64_t k = 0; k < m; k++) ramp[k] = c + k;
        store(base + c * st * es, st, ramp, 1, m);
    }

    /* Swapping raw elements works for every dtype since the values were already converted. */
    const int32_t w = (uint64_t)n > (UINT64_C(1) << 32) ? 2 : 1;
    nk_philox_stream stream;
    nk_philox_stream_init(&stream, seed, *offset);
    switch (es) {
    case 1: NK_SWAP_LOOP(uint8_t); break;
    case 2: NK_SWAP_LOOP(uint16_t); break;
    case 4: NK_SWAP_LOOP(uint32_t); break;
    default: NK_SWAP_LOOP(uint64_t); break;
    }
    *offset += nk_round_up4((uint64_t)n * (uint64_t)w);
    return NK_SUCCESS;
}
