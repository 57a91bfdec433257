/*
 * conv_direct.c - a direct 2-D convolution for few output channels (a VAE decoder's conv_out, 128 -> 3 at
 * 256x256): stride 1, any kernel size, padding and dilation. im2col + GEMM would copy kh*kw times the image to
 * feed a product only OC rows tall, and Winograd's products are as short; PyTorch's CPU kernel (oneDNN) ran
 * 128 -> 3 3x3 at 256x256 at 15 GFLOP/s on a 2-core Xeon. Here each task takes output rows: per input channel
 * the kh input rows it needs are widened to fp32 once (zero padding included), and a block of output columns
 * of every output channel sums its kh*kw shifted rows by FMAs on vectors of fp32 (weights broadcast), the
 * partial sums of one output row staying in L1 across the channels. fp32 accumulation, one rounding to
 * the output dtype (as CPU's oneDNN kernel does for bf16/fp16).
 */
#include "kernels_internal.h"

#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#define FEW_OC 4   /* output channels summed together (accumulators: FEW_OC x FEW_CV vectors) */
#define FEW_CV 2   /* vectors of output columns per block */

typedef struct few_ctx {
    const nk_tensor *out, *in, *bias;
    const float *wp; /* weights as [C][kh][kw][OCp] fp32, OCp = OC rounded up to FEW_OC (zeros beyond) */
    int64_t N, C, H, W, OC, OCp, OH, OW, kh, kw, ph, pw, dh, dw;
    int64_t owp; /* OW rounded up to a block of columns of the widest vector (16 lanes x FEW_CV) */
    int64_t rw;  /* width of a staged input row: owp + (kw - 1) * dw */
    int64_t rb;  /* output rows computed together: their input rows are staged once per channel */
    bool f16c;   /* the CPU converts fp16 by instruction */
} few_ctx;

static inline float few_ld(const char *p, nk_dtype dt) {
    switch (dt) {
    case NK_BF16: return nk_bf16_to_f32(*(const uint16_t *)(const void *)p);
    case NK_F16: return nk_f16_to_f32(*(const uint16_t *)(const void *)p);
    default: return *(const float *)(const void *)p;
    }
}

static inline void few_st(char *p, nk_dtype dt, float v) {
    switch (dt) {
    case NK_BF16: *(uint16_t *)(void *)p = nk_f32_to_bf16(v); break;
    case NK_F16: *(uint16_t *)(void *)p = nk_f32_to_f16(v); break;
    default: *(float *)(void *)p = v; break;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx,f16c"))) static void few_f16_row(float *r, const uint16_t *s, int64_t n) {
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) _mm256_storeu_ps(r + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(s + k))));
    for (; k < n; ++k) r[k] = nk_f16_to_f32(s[k]);
}
#define FEW_HAVE_F16C 1
#else
#define FEW_HAVE_F16C 0
#endif

/* rows[i][x] = in[n][c][h0 + i][x - pw] (zero outside the image), i < nrows, x < rw. */
static void few_stage(const few_ctx *x, float *rows, int64_t n, int64_t c, int64_t h0, int64_t nrows) {
    const nk_tensor *in = x->in;
    const size_t es = nk_dtype_size(in->dtype);
    const nk_dtype dt = in->dtype;
    for (int64_t i = 0; i < nrows; ++i) {
        float *r = rows + i * x->rw;
        const int64_t h = h0 + i;
        if (h < 0 || h >= x->H) {
            memset(r, 0, (size_t)x->rw * sizeof(float));
            continue;
        }
        const char *src = (const char *)in->data + (size_t)(n * in->strides[0] + c * in->strides[1] + h * in->strides[2]) * es;
        const int64_t lo = x->pw < x->rw ? x->pw : x->rw, hi = x->pw + x->W < x->rw ? x->pw + x->W : x->rw;
        for (int64_t k = 0; k < lo; ++k) r[k] = 0.0f;
        const int64_t sw = in->strides[3];
        if (sw == 1 && dt == NK_F32) {
            memcpy(r + lo, src, (size_t)(hi - lo) * sizeof(float));
        } else if (sw == 1 && dt == NK_BF16) {
            const uint16_t *s = (const uint16_t *)(const void *)src;
            for (int64_t k = lo; k < hi; ++k) {
                const uint32_t u = (uint32_t)s[k - lo] << 16;
                memcpy(&r[k], &u, sizeof u);
            }
#if FEW_HAVE_F16C
        } else if (sw == 1 && dt == NK_F16 && x->f16c) {
            few_f16_row(r + lo, (const uint16_t *)(const void *)src, hi - lo);
#endif
        } else {
            for (int64_t k = lo; k < hi; ++k) r[k] = few_ld(src + (size_t)((k - lo) * sw) * es, dt);
        }
        for (int64_t k = hi; k < x->rw; ++k) r[k] = 0.0f;
    }
}

/* The row-block loop for one vector width: acc (OCp rows of owp floats) += the taps of channel c. */
#define FEW_BODY(NAME, ATTR, LANES)                                                                            \
    typedef float NAME##_v __attribute__((vector_size(LANES * 4)));                                            \
    ATTR static void NAME(const few_ctx *x, const float *rows, const float *wc, float *acc) {                  \
        const int64_t kh = x->kh, kw = x->kw, dw = x->dw, rw = x->rw, owp = x->owp;                            \
        for (int64_t o0 = 0; o0 < x->OCp; o0 += FEW_OC) {                                                      \
            float *a0 = acc + o0 * owp;                                                                        \
            for (int64_t col = 0; col < owp; col += LANES * FEW_CV) {                                          \
                NAME##_v s[FEW_OC][FEW_CV];                                                                    \
                for (int o = 0; o < FEW_OC; ++o)                                                               \
                    for (int v = 0; v < FEW_CV; ++v) memcpy(&s[o][v], a0 + o * owp + col + v * LANES, LANES * 4); \
                for (int64_t i = 0; i < kh; ++i)                                                               \
                    for (int64_t j = 0; j < kw; ++j) {                                                         \
                        const float *r = rows + i * x->dh * rw + col + j * dw;                                 \
                        const float *w = wc + (i * kw + j) * x->OCp + o0;                                      \
                        NAME##_v in[FEW_CV];                                                                   \
                        for (int v = 0; v < FEW_CV; ++v) memcpy(&in[v], r + v * LANES, LANES * 4);            \
                        for (int o = 0; o < FEW_OC; ++o)                                                       \
                            for (int v = 0; v < FEW_CV; ++v) s[o][v] += in[v] * w[o];                          \
                    }                                                                                          \
                for (int o = 0; o < FEW_OC; ++o)                                                               \
                    for (int v = 0; v < FEW_CV; ++v) memcpy(a0 + o * owp + col + v * LANES, &s[o][v], LANES * 4); \
            }                                                                                                  \
        }                                                                                                      \
    }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FEW_X86 1
/* fp-contract=fast: ISO C mode does not contract a*b+c into an FMA. */
FEW_BODY(few_block_avx512, __attribute__((target("avx512f,fma"), optimize("fp-contract=fast"))), 16)
FEW_BODY(few_block_avx2, __attribute__((target("avx2,fma"), optimize("fp-contract=fast"))), 8)
#else
#define FEW_X86 0
#endif
FEW_BODY(few_block_generic, , 4)

typedef void (*few_block_fn)(const few_ctx *, const float *, const float *, float *);

/* 0: the best the CPU has; else the family nk_conv_few_isa_force named (tests run every one the CPU has). */
static int g_few_force;

static few_block_fn few_pick(void) {
    const int f = __atomic_load_n(&g_few_force, __ATOMIC_RELAXED);
    if (f == 3) return few_block_generic;
#if FEW_X86
    if (f != 2 && __builtin_cpu_supports("avx512f")) return few_block_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return few_block_avx2;
#endif
    return few_block_generic;
}

bool nk_conv_few_isa_force(const char *name) {
    int f = -1;
    if (name == NULL || strcmp(name, "best") == 0) f = 0;
    else if (strcmp(name, "generic") == 0) f = 3;
#if FEW_X86
    else if (strcmp(name, "avx512") == 0 && __builtin_cpu_supports("avx512f")) f = 1;
    else if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) f = 2;
#endif
    if (f < 0) return false;
    __atomic_store_n(&g_few_force, f, __ATOMIC_RELAXED);
    return true;
}

typedef struct few_task {
    const few_ctx *x;
    few_block_fn block;
    bool failed;
} few_task;

/* Output rows [begin, end) of all images (row r: image r / OH, row r % OH), rb at a time. */
static void few_range(void *vctx, int64_t begin, int64_t end) {
    few_task *t = vctx;
    const few_ctx *x = t->x;
    const int64_t span = (x->kh - 1) * x->dh; /* input rows a block needs beyond its own count */
    float *rows = malloc((size_t)((x->rb + span) * x->rw + x->rb * x->OCp * x->owp) * sizeof(float));
    if (rows == NULL) {
        t->failed = true;
        return;
    }
    float *accs = rows + (x->rb + span) * x->rw;
    const nk_tensor *out = x->out;
    const size_t oes = nk_dtype_size(out->dtype);
    for (int64_t r0 = begin; r0 < end;) {
        const int64_t n = r0 / x->OH, oh0 = r0 % x->OH;
        int64_t rb = x->rb < end - r0 ? x->rb : end - r0;
        if (rb > x->OH - oh0) rb = x->OH - oh0;
        memset(accs, 0, (size_t)(rb * x->OCp * x->owp) * sizeof(float));
        for (int64_t c = 0; c < x->C; ++c) {
            few_stage(x, rows, n, c, oh0 - x->ph, rb + span);
            for (int64_t k = 0; k < rb; ++k)
                t->block(x, rows + k * x->rw, x->wp + c * x->kh * x->kw * x->OCp, accs + k * x->OCp * x->owp);
        }
        for (int64_t k = 0; k < rb; ++k)
        for (int64_t o = 0; o < x->OC; ++o) {
            const int64_t oh = oh0 + k;
            const float *a = accs + (k * x->OCp + o) * x->owp;
            const float b = x->bias != NULL ? few_ld((const char *)x->bias->data +
                                                         (size_t)(o * x->bias->strides[0]) * nk_dtype_size(x->bias->dtype),
                                                     x->bias->dtype)
                                            : 0.0f;
            char *dst = (char *)out->data + (size_t)(n * out->strides[0] + o * out->strides[1] + oh * out->strides[2]) * oes;
            if (out->dtype == NK_F32 && out->strides[3] == 1) {
                float *d = (float *)(void *)dst;
                for (int64_t q = 0; q < x->OW; ++q) d[q] = a[q] + b;
            } else {
                for (int64_t q = 0; q < x->OW; ++q) few_st(dst + (size_t)(q * out->strides[3]) * oes, out->dtype, a[q] + b);
            }
        }
        r0 += rb;
    }
    free(rows);
}

nk_status nk_conv2d_few_out(const nk_tensor *out, const nk_tensor *in, const nk_tensor *weight,
                            const nk_tensor *bias, const int64_t padding[2], const int64_t dilation[2]) {
    if (out == NULL || in == NULL || weight == NULL || padding == NULL || dilation == NULL) return NK_INVALID;
    if (out->ndim != 4 || in->ndim != 4 || weight->ndim != 4) return NK_INVALID;
    const nk_dtype dt = in->dtype;
    if ((dt != NK_F32 && dt != NK_BF16 && dt != NK_F16) || out->dtype != dt || weight->dtype != dt ||
        (bias != NULL && (bias->dtype != dt || bias->ndim != 1)))
        return NK_UNSUPPORTED;
    few_ctx x = {.out = out, .in = in, .bias = bias, .N = in->sizes[0], .C = in->sizes[1], .H = in->sizes[2],
                 .W = in->sizes[3], .OC = weight->sizes[0], .kh = weight->sizes[2], .kw = weight->sizes[3],
                 .ph = padding[0], .pw = padding[1], .dh = dilation[0], .dw = dilation[1]};
    if (weight->sizes[1] != x.C || x.ph < 0 || x.pw < 0 || x.dh <= 0 || x.dw <= 0 || x.kh <= 0 || x.kw <= 0)
        return NK_INVALID;
    x.OH = x.H + 2 * x.ph - x.dh * (x.kh - 1);
    x.OW = x.W + 2 * x.pw - x.dw * (x.kw - 1);
    if (out->sizes[0] != x.N || out->sizes[1] != x.OC || out->sizes[2] != x.OH || out->sizes[3] != x.OW ||
        (bias != NULL && bias->sizes[0] != x.OC))
        return NK_INVALID;
    if (x.N == 0 || x.OC == 0 || x.OH <= 0 || x.OW <= 0) return NK_SUCCESS;
    x.OCp = (x.OC + FEW_OC - 1) / FEW_OC * FEW_OC;
    x.owp = (x.OW + 16 * FEW_CV - 1) / (16 * FEW_CV) * (16 * FEW_CV);
    x.rw = x.owp + (x.kw - 1) * x.dw;
    /* Partial sums of rb rows within ~24 KB (L1 beside the staged rows): 6 rows of 3 channels at 256 wide. */
    x.rb = 6144 / (x.OCp * x.owp);
    x.rb = x.rb < 1 ? 1 : (x.rb > 16 ? 16 : x.rb);
#if FEW_HAVE_F16C
    x.f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
#endif
    const size_t wn = (size_t)(x.C * x.kh * x.kw * x.OCp);
    float *wp = calloc(wn > 0 ? wn : 1, sizeof(float));
    if (wp == NULL) return NK_NO_MEMORY;
    const size_t wes = nk_dtype_size(dt);
    for (int64_t o = 0; o < x.OC; ++o)
        for (int64_t c = 0; c < x.C; ++c)
            for (int64_t i = 0; i < x.kh; ++i)
                for (int64_t j = 0; j < x.kw; ++j)
                    wp[((c * x.kh + i) * x.kw + j) * x.OCp + o] =
                        few_ld((const char *)weight->data + (size_t)(o * weight->strides[0] + c * weight->strides[1] +
                                                                    i * weight->strides[2] + j * weight->strides[3]) * wes,
                               dt);
    x.wp = wp;
    few_task t = {.x = &x, .block = few_pick(), .failed = false};
    const int64_t per_row = x.C * x.kh * x.OW * x.OCp;  /* FMAs of a row, roughly */
    int64_t grain = per_row >= 65536 ? 1 : 65536 / per_row + 1;
    grain = grain > x.rb ? grain : x.rb;
    nk_parallel_for(x.N * x.OH, grain, few_range, &t);
    free(wp);
    return t.failed ? NK_NO_MEMORY : NK_SUCCESS;
}
