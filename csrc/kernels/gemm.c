/*
 * gemm.c - matrix products: out = beta * self + alpha * (a @ b), batched, any strides, fp32/bf16/fp16
 * with fp32 accumulation (rounded once to the output dtype), fp64 on a plain loop.
 *
 * Two paths:
 *  - skinny (at most NK_GEMM_SKINNY_M rows, after transposing the problem if the short side is n):
 *    the large operand is read once straight from memory, columns split across threads. This is the
 *    decode path of a language model, bound by memory bandwidth.
 *  - packed, in the BLIS manner, for everything else (see the comment above gemm_packed_task);
 *    bf16 runs on AMX tiles where the CPU has them (gemm_amx.c), else on AVX512-BF16 dot instructions
 *    (gemm_avx512bf16.c, also on the skinny path), else through the fp32 micro-kernels.
 */
#include "gemm_internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* ---- ISA selection -------------------------------------------------------------------------------- */

static const nk_gemm_isa *g_isa;

/* How bf16 products run: converted to fp32 for the fp32 micro-kernels, on vdpbf16ps, or on AMX tiles.
 * BF16_DP_SKINNY: the packed path (and attention) through the fp32 micro-kernels, the skinny one on
 * vdpbf16ps, for CPUs whose dot instruction does not outrun their FMAs (nk_gemm_dp_fma_ratio). */
typedef enum bf16_kind { BF16_VIA_F32 = 1, BF16_DP, BF16_AMX, BF16_DP_SKINNY } bf16_kind;
static int g_bf16; /* 0: not chosen yet */

/*
 * vdpbf16ps does twice an FMA's multiply-adds, which pays when it issues as fast as an FMA (Zen 4: 2x the
 * fp32 peak). A 2-core Xeon (family 6, model 207) issues it at half that rate, as many flops as the FMAs:
 * its bf16 GEMMs ran at 84-156 GFLOP/s on it against 194-239 for fp32 ones of the same shapes. Measured
 * on the calling thread when the first product is chosen (under a millisecond);
 * TORCH_NEURONX_BF16_DOT=0/1 decides instead.
 */
static bf16_kind bf16_detect(const nk_gemm_isa *isa) {
    if (isa != &nk_gemm_isa_avx512) return BF16_VIA_F32;
    if (nk_gemm_amx_available()) return BF16_AMX;
    if (!nk_gemm_dpbf16_available()) return BF16_VIA_F32;
    const char *env = getenv("TORCH_NEURONX_BF16_DOT");
    const bool dot = env != NULL && env[0] != '\0' ? strcmp(env, "0") != 0 : nk_gemm_dp_fma_ratio() >= NK_GEMM_BF16_DP_MIN_RATIO;
    return dot ? BF16_DP : BF16_DP_SKINNY;
}

static const nk_gemm_isa *isa_detect(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return &nk_gemm_isa_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return &nk_gemm_isa_avx2;
#endif
    return &nk_gemm_isa_generic;
}

static const nk_gemm_isa *isa_get(void) {
    const nk_gemm_isa *isa = __atomic_load_n(&g_isa, __ATOMIC_ACQUIRE);
    if (isa == NULL) {
        isa = isa_detect();
        __atomic_store_n(&g_bf16, (int)bf16_detect(isa), __ATOMIC_RELAXED);
        __atomic_store_n(&g_isa, isa, __ATOMIC_RELEASE);
    }
    return isa;
}

static bf16_kind bf16_get(void) {
    (void)isa_get();
    return (bf16_kind)__atomic_load_n(&g_bf16, __ATOMIC_RELAXED);
}

bool nk_gemm_bf16_on_amx(void) {
    return bf16_get() == BF16_AMX;
}

bool nk_gemm_bf16_packed_on_dp(void) {
    return bf16_get() == BF16_DP;
}

const char *nk_gemm_isa_name(void) {
    return isa_get()->name;
}

/* Test hook: forces an ISA by name (see gemm_internal.h); false if this CPU lacks it. */
bool nk_gemm_isa_force(const char *name) {
    const nk_gemm_isa *best = isa_detect();
    const nk_gemm_isa *want = NULL;
    bf16_kind bf16 = BF16_VIA_F32;
    const bool avx512 = best == &nk_gemm_isa_avx512;
    if (strcmp(name, "generic") == 0) want = &nk_gemm_isa_generic;
    else if (strcmp(name, "avx2") == 0 && best != &nk_gemm_isa_generic) want = &nk_gemm_isa_avx2;
    else if (strcmp(name, "avx512") == 0 && avx512) want = &nk_gemm_isa_avx512;
    else if (strcmp(name, "avx512bf16") == 0 && avx512 && nk_gemm_dpbf16_available())
        want = &nk_gemm_isa_avx512, bf16 = BF16_DP;
    else if (strcmp(name, "amx") == 0 && avx512 && nk_gemm_amx_available())
        want = &nk_gemm_isa_avx512, bf16 = BF16_AMX;
    if (want == NULL) return false;
    __atomic_store_n(&g_bf16, (int)bf16, __ATOMIC_RELAXED);
    __atomic_store_n(&g_isa, want, __ATOMIC_RELEASE);
    return true;
}

/*
 * Cache blocking of the packed path, per micro-kernel. kc x NR floats of packed B (one micro-panel)
 * stay in L1 while the A micro-panels stream past it; the mc x kc block of packed A lives in L2 and
 * is reused by all nc columns; the kc x nc block of packed B is reused by every mc block. A large nc
 * packs A fewer times, but on AVX-512 a 512-column block (512 KiB) keeps packed B in L2 beside A: at
 * 4096 columns it went to L3 and back, and re-packing A costs less (M=128 x 768 x 32000: 30 -> 24 ms).
 */
typedef struct nk_gemm_blocking {
    const nk_gemm_isa *isa;
    int64_t kc, mc, nc;
} nk_gemm_blocking;

static const nk_gemm_blocking g_blocking[] = {
    {&nk_gemm_isa_avx512, 256, 144, 512},
    {&nk_gemm_isa_avx2, 256, 72, 2048},
    {&nk_gemm_isa_generic, 128, 64, 256},
};

static nk_gemm_blocking blocking_of(const nk_gemm_isa *isa) {
    for (size_t i = 0; i < sizeof g_blocking / sizeof g_blocking[0]; i++)
        if (g_blocking[i].isa == isa) return g_blocking[i];
    return g_blocking[2];
}

/* ---- the problem ------------------------------------------------------------------------------------ */

typedef struct gemm_problem {
    nk_dtype dt;
    int64_t es;  /* element size in bytes */
    int64_t batch, m, n, k;
    const char *a, *b, *s; /* s: self (NULL when beta == 0) */
    char *c;
    int64_t a_bs, a_sm, a_sk;
    int64_t b_bs, b_sk, b_sn;
    int64_t c_bs, c_sm, c_sn;
    int64_t s_bs, s_sm, s_sn;
    double alpha, beta;
    const nk_gemm_isa *isa;
    nk_gemm_blocking blk;
    bf16_kind bf16;         /* how bf16 runs (dt == NK_BF16 only) */
    bool stream_b;          /* B likely comes from DRAM: the micro-kernels prefetch it (nk_gemm_prefetch) */
    int64_t mparts, nparts; /* tasks per batch entry: an mparts x nparts grid */
    atomic_int failed;      /* a scratch allocation failed */
} gemm_problem;

/* Growable per-thread scratch (pool threads live as long as the process, so it is reused). */
typedef struct nk_scratch {
    float *p;
    size_t cap; /* floats */
} nk_scratch;

static _Thread_local nk_scratch t_pack_a, t_pack_b, t_acc;

static float *scratch_get(nk_scratch *s, size_t n) {
    if (n <= s->cap) return s->p;
    free(s->p);
    size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
    s->p = aligned_alloc(64, bytes);
    s->cap = s->p ? n : 0;
    return s->p;
}

/* ---- element access ----------------------------------------------------------------------------------- */

static inline float load_f32(const char *p, nk_dtype dt) {
    switch (dt) {
    case NK_BF16: return nk_bf16_to_f32(*(const uint16_t *)p);
    case NK_F16: return nk_f16_to_f32(*(const uint16_t *)p);
    default: return *(const float *)p;
    }
}

/*
 * out[i, j] = alpha * acc[i, j] + beta * self[i, j] for an mm x nn block at (i0, j0) of batch bi, in
 * the output dtype (the one rounding of the result). beta == 0 never reads self.
 */
#define STORE_LOOP(T, TO_T, FROM_T)                                                                       \
    for (int64_t i = 0; i < mm; i++) {                                                                   \
        T *o = (T *)(c + i * p->c_sm * es);                                                              \
        const float *ar = acc + i * ldacc;                                                               \
        if (has_self) {                                                                                  \
            const T *sr = (const T *)(s + i * p->s_sm * es);                                             \
            for (int64_t j = 0; j < nn; j++) o[j * csn] = TO_T(alpha * ar[j] + beta * FROM_T(sr[j * ssn])); \
        } else {                                                                                         \
            for (int64_t j = 0; j < nn; j++) o[j * csn] = TO_T(alpha * ar[j]);                           \
        }                                                                                                \
    }
#define ID(x) (x)

static void store_block(const gemm_problem *p, int64_t bi, int64_t i0, int64_t j0, int64_t mm, int64_t nn,
                        const float *acc, int64_t ldacc) {
    const int64_t es = p->es;
    char *c = p->c + (bi * p->c_bs + i0 * p->c_sm + j0 * p->c_sn) * es;
    const bool has_self = p->s != NULL;
    const char *s = has_self ? p->s + (bi * p->s_bs + i0 * p->s_sm + j0 * p->s_sn) * es : NULL;
    const int64_t csn = p->c_sn, ssn = p->s_sn;
    const float alpha = (float)p->alpha, beta = (float)p->beta;
    if (p->isa == &nk_gemm_isa_avx512 && csn == 1 && (!has_self || ssn == 0 || ssn == 1)) {
        for (int64_t i = 0; i < mm; i++)
            nk_gemm_store_row_avx512(c + i * p->c_sm * es, p->dt, acc + i * ldacc,
                                     has_self ? s + i * p->s_sm * es : NULL, ssn, nn, alpha, beta);
        return;
    }
    switch (p->dt) {
    case NK_BF16: STORE_LOOP(uint16_t, nk_f32_to_bf16, nk_bf16_to_f32) break;
    case NK_F16: STORE_LOOP(uint16_t, nk_f32_to_f16, nk_f16_to_f32) break;
    default: STORE_LOOP(float, ID, ID) break;
    }
}

/* ---- packing -------------------------------------------------------------------------------------------- */

/*
 * Packing copies a block of A or B into the order the micro-kernel reads it, converted to fp32:
 * A (mc x kc) becomes ceil(mc/MR) micro-panels, each kc columns of MR consecutive values; B (kc x nc)
 * becomes ceil(nc/NR) micro-panels, each kc rows of NR consecutive values. Missing rows/columns at the
 * edges are zero, so the micro-kernel always runs full tiles. Any source strides work (a transposed
 * view packs without a prior copy); the loop order follows the contiguous source direction.
 */
#define PACK_A_LOOP(T, LOAD)                                                                               \
    for (int64_t p0 = 0; p0 < mcur; p0 += mr) {                                                            \
        const int64_t rows = mcur - p0 < mr ? mcur - p0 : mr;                                              \
        float *d = dst + p0 * kcur;                                                                        \
        const T *ap = (const T *)a + p0 * sm;                                                              \
        if (rows == mr && sk == 1 && fast != NULL) {                                                       \
            fast(d, ap, dt, sm, kcur);                                                                     \
            continue;                                                                                      \
        }                                                                                                  \
        if (sk == 1) {                                                                                     \
            for (int64_t i = 0; i < rows; i++)                                                             \
                for (int64_t k = 0; k < kcur; k++) d[k * mr + i] = LOAD(ap[i * sm + k]);                   \
        } else {                                                                                           \
            for (int64_t k = 0; k < kcur; k++)                                                             \
                for (int64_t i = 0; i < rows; i++) d[k * mr + i] = LOAD(ap[i * sm + k * sk]);              \
        }                                                                                                  \
        for (int64_t i = rows; i < mr; i++)                                                                \
            for (int64_t k = 0; k < kcur; k++) d[k * mr + i] = 0.f;                                        \
    }

#define LD_F32(x) (x)
#define LD_BF16(x) nk_bf16_to_f32(x)
#define LD_F16(x) nk_f16_to_f32(x)

static void pack_a(float *dst, const char *a, nk_dtype dt, int64_t es, int64_t sm, int64_t sk, int64_t mcur,
                   int64_t kcur, int64_t mr, nk_gemm_pack_kcontig_fn fast) {
    (void)es;
    switch (dt) {
    case NK_BF16: PACK_A_LOOP(uint16_t, LD_BF16) break;
    case NK_F16: PACK_A_LOOP(uint16_t, LD_F16) break;
    default: PACK_A_LOOP(float, LD_F32) break;
    }
}

/* B stored n-contiguous (sn == 1, sk != 1) goes through pack_rows instead, a whole block at a time. */
#define PACK_B_LOOP(T, LOAD)                                                                               \
    for (int64_t p0 = 0; p0 < ncur; p0 += nr) {                                                            \
        const int64_t cols = ncur - p0 < nr ? ncur - p0 : nr;                                              \
        float *d = dst + p0 * kcur;                                                                        \
        const T *bp = (const T *)b + p0 * sn;                                                              \
        if (cols == nr && sk == 1 && fast != NULL) {                                                       \
            fast(d, bp, dt, sn, kcur);                                                                     \
            continue;                                                                                      \
        }                                                                                                  \
        if (sk == 1 && sn != 1) {                                                                          \
            for (int64_t j = 0; j < cols; j++)                                                             \
                for (int64_t k = 0; k < kcur; k++) d[k * nr + j] = LOAD(bp[j * sn + k]);                  \
        } else {                                                                                           \
            for (int64_t k = 0; k < kcur; k++)                                                             \
                for (int64_t j = 0; j < cols; j++) d[k * nr + j] = LOAD(bp[k * sk + j * sn]);              \
        }                                                                                                  \
        if (cols < nr)                                                                                     \
            for (int64_t k = 0; k < kcur; k++)                                                             \
                for (int64_t j = cols; j < nr; j++) d[k * nr + j] = 0.f;                                   \
    }

static void pack_b(float *dst, const char *b, nk_dtype dt, int64_t es, int64_t sk, int64_t sn, int64_t kcur,
                   int64_t ncur, int64_t nr, nk_gemm_pack_kcontig_fn fast) {
    (void)es;
    switch (dt) {
    case NK_BF16: PACK_B_LOOP(uint16_t, LD_BF16) break;
    case NK_F16: PACK_B_LOOP(uint16_t, LD_F16) break;
    default: PACK_B_LOOP(float, LD_F32) break;
    }
}

/* The portable nk_gemm_pack_rows_fn: rows PF_ROWS ahead are prefetched (rows ldk apart are further
 * apart than hardware prefetchers look). */
#define PF_ROWS 4
#define PACK_ROWS_LOOP(T, LOAD)                                                                            \
    for (int64_t k = 0; k < kc; k++) {                                                                     \
        const T *row = (const T *)src + k * ldk;                                                           \
        if (k + PF_ROWS < kc)                                                                              \
            for (int64_t l = 0; l < lines; l++) __builtin_prefetch((const char *)(row + PF_ROWS * ldk) + 64 * l); \
        for (int64_t p = 0; p < panels; p++) {                                                             \
            float *d = dst + (p * kc + k) * w;                                                             \
            const int64_t have = count - p * w < w ? count - p * w : w;                                    \
            for (int64_t j = 0; j < have; j++) d[j] = LOAD(row[p * w + j]);                                \
            for (int64_t j = have; j < w; j++) d[j] = 0.f;                                                 \
        }                                                                                                  \
    }

static void pack_rows_portable(float *dst, const void *src, nk_dtype dt, int64_t ldk, int64_t count, int64_t kc,
                               int64_t w) {
    const int64_t panels = (count + w - 1) / w;
    const int64_t lines = (count * (int64_t)nk_dtype_size(dt) + 63) / 64 + 1;
    switch (dt) {
    case NK_BF16: PACK_ROWS_LOOP(uint16_t, LD_BF16) break;
    case NK_F16: PACK_ROWS_LOOP(uint16_t, LD_F16) break;
    default: PACK_ROWS_LOOP(float, LD_F32) break;
    }
}

static void pack_rows(const nk_gemm_isa *isa, float *dst, const char *src, nk_dtype dt, int64_t ldk, int64_t count,
                      int64_t kc, int64_t w) {
    (isa->pack_rows != NULL ? isa->pack_rows : pack_rows_portable)(dst, src, dt, ldk, count, kc, w);
}

int64_t nk_gemm_prefetch_init(nk_gemm_prefetch *pf, const char *b, int64_t es, int64_t sk, int64_t sn, int64_t kcur,
                              int64_t cols) {
    pf->run = b, pf->line = 0, pf->n = 0;
    if (sk == 1) /* each column a run of kcur elements */
        pf->stride = sn * es, pf->per_run = (kcur * es + 63) / 64;
    else if (sn == 1) /* each row a run of cols elements */
        pf->stride = sk * es, pf->per_run = (cols * es + 63) / 64;
    else
        return pf->per_run = 0;
    return pf->per_run * (sk == 1 ? cols : kcur);
}

/* ---- packed path ------------------------------------------------------------------------------------------ */

static void split_range(int64_t total, int64_t parts, int64_t unit, int64_t part, int64_t *b, int64_t *e) {
    const int64_t units = (total + unit - 1) / unit;
    const int64_t per = units / parts, extra = units % parts;
    const int64_t ub = part * per + (part < extra ? part : extra);
    const int64_t ue = ub + per + (part < extra ? 1 : 0);
    *b = ub * unit < total ? ub * unit : total;
    *e = ue * unit < total ? ue * unit : total;
}

/*
 * One task: rows [m0, m1) x columns [n0, n1) of batch entry bi, on one thread. Loops, outermost
 * first: nc columns (jc), kc depth (pc), mc rows (ic: pack A), NR columns (jr: the first row block packs
 * the B micro-panel), MR rows (ir:
 * micro-kernel). The fp32 accumulator is the output itself when it is fp32 with unit column stride
 * and nothing is added to it (beta == 0); otherwise a per-thread buffer that store_block rounds into
 * the output once all of k is summed.
 */
static void gemm_packed_rows(gemm_problem *p, int64_t bi, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const nk_gemm_isa *isa = p->isa;
    const int64_t mr = isa->mr, nr = isa->nr, es = p->es;
    const int64_t kc = p->blk.kc, mc = p->blk.mc;
    const int64_t mt = m1 - m0;
    const bool direct = p->dt == NK_F32 && p->c_sn == 1 && p->s == NULL;
    /* Operands whose k is the strided direction are packed a block at a time (pack_rows). */
    const bool a_rows = p->a_sm == 1 && p->a_sk != 1, b_rows = p->b_sn == 1 && p->b_sk != 1;
    /* Bound the accumulator buffer (mt x nc floats) to 1M floats by narrowing nc. */
    int64_t nc = p->blk.nc;
    if (!direct && mt * nc > (1 << 20)) {
        nc = ((1 << 20) / mt) / nr * nr;
        if (nc < nr) nc = nr;
    }
    const int64_t kc_eff = p->k < kc ? p->k : kc;
    const int64_t nc_eff = (n1 - n0) < nc ? (n1 - n0) : nc;
    const int64_t mc_eff = mt < mc ? mt : mc;
    float *ap = scratch_get(&t_pack_a, (size_t)((mc_eff + mr) * kc_eff));
    float *bp = scratch_get(&t_pack_b, (size_t)((nc_eff + nr) * kc_eff));
    const int64_t ldacc_buf = (nc_eff + 15) / 16 * 16;
    float *accbuf = direct ? NULL : scratch_get(&t_acc, (size_t)(mt * ldacc_buf));
    if (ap == NULL || bp == NULL || (!direct && accbuf == NULL)) {
        atomic_store(&p->failed, 1);
        return;
    }
    const char *abase = p->a + bi * p->a_bs * es;
    const char *bbase = p->b + bi * p->b_bs * es;
    float tile[NK_GEMM_MR_MAX * NK_GEMM_NR_MAX] __attribute__((aligned(64)));

    for (int64_t jc = n0; jc < n1; jc += nc) {
        const int64_t ncur = n1 - jc < nc ? n1 - jc : nc;
        float *acc;
        int64_t ldacc;
        if (direct) {
            acc = (float *)(p->c + (bi * p->c_bs + m0 * p->c_sm + jc) * es);
            ldacc = p->c_sm;
        } else {
            acc = accbuf;
            ldacc = ldacc_buf;
        }
        for (int64_t pc = 0; pc < p->k; pc += kc) {
            const int64_t kcur = p->k - pc < kc ? p->k - pc : kc;
            const bool accumulate = pc > 0;
            const char *bk = bbase + (pc * p->b_sk + jc * p->b_sn) * es;
            if (b_rows) pack_rows(isa, bp, bk, p->dt, p->b_sk, ncur, kcur, nr);
            for (int64_t ic = m0; ic < m1; ic += mc) {
                const int64_t mcur = m1 - ic < mc ? m1 - ic : mc;
                const int64_t parts = (mcur + mr - 1) / mr;
                const char *asrc = abase + (ic * p->a_sm + pc * p->a_sk) * es;
                if (a_rows) pack_rows(isa, ap, asrc, p->dt, p->a_sk, mcur, kcur, mr);
                else pack_a(ap, asrc, p->dt, es, p->a_sm, p->a_sk, mcur, kcur, mr, isa->pack_a_kcontig);
                for (int64_t jr = 0; jr < ncur; jr += nr) {
                    const int64_t cols = ncur - jr < nr ? ncur - jr : nr;
                    float *pb = bp + jr * kcur;
                    /* The first row block packs each B micro-panel right before it uses it (it is still
                     * in L1 then), the micro-kernels prefetching the next one's source meanwhile when B
                     * comes from DRAM; the other row blocks find the panels packed. An n-contiguous B
                     * was packed whole above. */
                    const bool first = ic == m0 && !b_rows, next = p->stream_b && first && jr + nr < ncur;
                    if (first)
                        pack_b(pb, bk + jr * p->b_sn * es, p->dt, es, p->b_sk, p->b_sn, kcur, cols, nr,
                               isa->pack_b_kcontig);
                    nk_gemm_prefetch pf = {0};
                    const int64_t lines = next ? nk_gemm_prefetch_init(&pf, bk + (jr + nr) * p->b_sn * es, es, p->b_sk,
                                                                       p->b_sn, kcur, ncur - jr - nr < nr ? ncur - jr - nr : nr)
                                               : 0;
                    for (int64_t ir = 0; ir < mcur; ir += mr) {
                        const int64_t rows = mcur - ir < mr ? mcur - ir : mr;
                        const float *pa = ap + ir * kcur;
                        float *ct = acc + (ic - m0 + ir) * ldacc + jr;
                        nk_gemm_prefetch_share(&pf, lines, ir / mr, parts, kcur);
                        if (rows == mr && cols == nr) {
                            isa->ukr(kcur, pa, pb, ct, ldacc, accumulate, &pf);
                            continue;
                        }
                        isa->ukr(kcur, pa, pb, tile, nr, false, &pf);
                        for (int64_t i = 0; i < rows; i++)
                            for (int64_t j = 0; j < cols; j++)
                                ct[i * ldacc + j] = accumulate ? ct[i * ldacc + j] + tile[i * nr + j] : tile[i * nr + j];
                    }
                }
            }
        }
        if (!direct) {
            store_block(p, bi, m0, jc, mt, ncur, acc, ldacc);
        } else if (p->alpha != 1.0) {
            const float alpha = (float)p->alpha;
            for (int64_t i = 0; i < mt; i++)
                for (int64_t j = 0; j < ncur; j++) acc[i * ldacc + j] *= alpha;
        }
    }
}

/* A task whose accumulator is a buffer (beta != 0, or an output that is not fp32 with unit column stride)
 * runs in chunks of rows, so the buffer (rows x nc floats) stays within 1M floats with nc whole. Narrowing nc
 * instead re-packed all of A for every few columns: the weight gradient of a tied 32000 x 768 embedding,
 * addmm(grad, A^T, B) with M = 32000, took 192 ms against mm's 91. */
static void gemm_packed_task(gemm_problem *p, int64_t bi, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const bool direct = p->dt == NK_F32 && p->c_sn == 1 && p->s == NULL;
    const int64_t mc = p->blk.mc, nc = p->blk.nc;
    int64_t rows = m1 - m0;
    if (!direct && rows * nc > (1 << 20)) {
        rows = ((1 << 20) / nc) / mc * mc;
        if (rows < mc) rows = mc;
    }
    for (int64_t r0 = m0; r0 < m1; r0 += rows) gemm_packed_rows(p, bi, r0, m1 - r0 < rows ? m1 : r0 + rows, n0, n1);
}

/* Where a dot-kernel block sends its final rows: straight into the output. */
typedef struct bf16_flush {
    const gemm_problem *p;
    int64_t bi, m0, j0, nn;
} bf16_flush;

static void bf16_flush_rows(void *ctx, int64_t i0, int64_t mm, const float *acc, int64_t ldacc) {
    const bf16_flush *f = ctx;
    store_block(f->p, f->bi, f->m0 + i0, f->j0, mm, f->nn, acc, ldacc);
}

/* The same task on bf16 instructions (AMX tiles or vdpbf16ps): packing and kernels in their files, the
 * fp32 accumulator here, rows padded to the kernel's tile (row_pad) and columns to 32. */
static void gemm_bf16_task(gemm_problem *p, int64_t bi, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const bool amx = p->bf16 == BF16_AMX;
    const int64_t row_pad = amx ? 32 : NK_GEMM_DPBF16_MR;
    const int64_t mt = m1 - m0;
    int64_t mp = (mt + row_pad - 1) / row_pad * row_pad;
    int64_t nc = p->blk.nc;
    /* The dot kernels in one pass over k hand each 144-row block to the output as soon as it is final,
     * while it is in L2, so the accumulator is one row block and the columns per block are set by the
     * packed B block (nc x k bf16) alone, 768 KiB: 512 columns at k = 768 (M=512 x 768 x 768: 676 -> 654
     * us, x 3072: 2670 -> 2611 us; a 384 KiB block measured between the two). */
    const bool rolling = !amx && p->k <= NK_GEMM_DPBF16_KC_MAX;
    if (rolling) {
        if (mp > NK_GEMM_DPBF16_MC) mp = NK_GEMM_DPBF16_MC;
        const int64_t nc_b = ((int64_t)(768 << 10) / 2 / p->k) / 32 * 32; /* 768 KiB of bf16 */
        nc = nc_b < 32 ? 32 : nc_b;
    } else if (amx) {
        /* The accumulator in L2 (512 KiB) across the depth blocks and the epilogue; A is packed once
         * per task, so narrow column blocks cost nothing extra (M=512 x 768 x 2048: 1030 -> 814 us). */
        if (mp * nc > (1 << 17)) nc = ((1 << 17) / mp) / 32 * 32;
        /* and the packed B block (nc x 512 deep) to 256 KiB, also in L2: a wide block spilled to memory
         * and was read back from there (M=8 x 768 x 32000: 3.3 -> 1.7 ms). */
        const int64_t kc = p->k < 512 ? p->k : 512, nc_b = ((1 << 17) / kc) / 32 * 32;
        if (nc > nc_b) nc = nc_b;
    } else if (mp * nc > (1 << 17)) {
        /* The dot-instruction kernels read and write the accumulator once per 512-deep block and the
         * epilogue reads it again: keep it in L2 (512 KiB) unless that re-packs A too often (nc < 256). */
        nc = ((1 << 17) / mp) / 32 * 32;
        if (nc < 256) nc = 256;
    }
    if (nc < 32) nc = 32;
    const int64_t nc_eff = (n1 - n0) < nc ? (n1 - n0) : nc;
    const int64_t ldacc = (nc_eff + 31) / 32 * 32;
    float *acc = scratch_get(&t_acc, (size_t)(mp * ldacc));
    if (acc == NULL) {
        atomic_store(&p->failed, 1);
        return;
    }
    const uint16_t *a = (const uint16_t *)p->a + bi * p->a_bs + m0 * p->a_sm;
    uint16_t *apack = NULL;
    if (amx) { /* A packed once per task: the accumulator stays in L2 without re-packing A per block */
        apack = (uint16_t *)scratch_get(&t_pack_a, (size_t)(nk_gemm_amx_packed_a_size(mt, p->k) + 1) / 2);
        if (apack == NULL) {
            atomic_store(&p->failed, 1);
            return;
        }
        nk_gemm_amx_pack_a(apack, mt, p->k, a, p->a_sm, p->a_sk);
    }
    for (int64_t jc = n0; jc < n1; jc += nc) {
        const int64_t ncur = n1 - jc < nc ? n1 - jc : nc;
        const uint16_t *b = (const uint16_t *)p->b + bi * p->b_bs + jc * p->b_sn;
        bf16_flush flush = {.p = p, .bi = bi, .m0 = m0, .j0 = jc, .nn = ncur};
        const bool ok = amx ? nk_gemm_amx_block_packed_a(mt, ncur, p->k, apack, b, p->b_sk, p->b_sn, acc, ldacc)
                            : nk_gemm_dpbf16_block(mt, ncur, p->k, a, p->a_sm, p->a_sk, b, p->b_sk, p->b_sn, acc, ldacc,
                                                   p->stream_b, rolling ? bf16_flush_rows : NULL, &flush);
        if (!ok) {
            atomic_store(&p->failed, 1);
            return;
        }
        if (!rolling) store_block(p, bi, m0, jc, mt, ncur, acc, ldacc);
    }
}

static void gemm_packed_range(void *ctx, int64_t begin, int64_t end) {
    gemm_problem *p = ctx;
    const int64_t per_batch = p->mparts * p->nparts;
    for (int64_t t = begin; t < end; t++) {
        const int64_t bi = t / per_batch, r = t % per_batch;
        int64_t m0, m1, n0, n1;
        split_range(p->m, p->mparts, p->isa->mr, r / p->nparts, &m0, &m1);
        split_range(p->n, p->nparts, p->isa->nr, r % p->nparts, &n0, &n1);
        if (m0 >= m1 || n0 >= n1) continue;
        if (p->dt == NK_BF16 && (p->bf16 == BF16_DP || p->bf16 == BF16_AMX)) gemm_bf16_task(p, bi, m0, m1, n0, n1);
        else gemm_packed_task(p, bi, m0, m1, n0, n1);
    }
}

/* ---- skinny path ------------------------------------------------------------------------------------------- */

#define SKINNY_COLS 256 /* columns per task chunk: the fp32 result tile is m x SKINNY_COLS */

/* Columns per task of the streaming paths: about 4 chunks per thread over all batch entries, multiples of
 * align columns, at least 64. */
static int64_t skinny_chunk(const gemm_problem *p, int64_t align) {
    const int64_t want = (int64_t)nk_threads_get() * 4;
    const int64_t per_batch = (want + p->batch - 1) / p->batch;
    int64_t chunk = (p->n + per_batch - 1) / per_batch;
    chunk = (chunk + align - 1) / align * align;
    return chunk < 64 ? 64 : chunk;
}

typedef struct skinny_ctx {
    gemm_problem *p;
    const float *apacked; /* batch x m x k, fp32 */
    const uint16_t *abf16; /* instead, batch x m rows of lda bf16 for the vdpbf16ps dot products */
    int64_t lda;
    int64_t chunks;       /* column chunks per batch entry */
    int64_t chunk;        /* columns per chunk */
} skinny_ctx;

static void gemm_skinny_range(void *vctx, int64_t begin, int64_t end) {
    skinny_ctx *ctx = vctx;
    gemm_problem *p = ctx->p;
    float tile[NK_GEMM_SKINNY_M * SKINNY_COLS];
    for (int64_t t = begin; t < end; t++) {
        const int64_t bi = t / ctx->chunks;
        const int64_t j0 = (t % ctx->chunks) * ctx->chunk;
        const int64_t j1 = j0 + ctx->chunk < p->n ? j0 + ctx->chunk : p->n;
        const float *a = ctx->apacked ? ctx->apacked + bi * p->m * p->k : NULL;
        for (int64_t j = j0; j < j1; j += SKINNY_COLS) {
            const int64_t nn = j1 - j < SKINNY_COLS ? j1 - j : SKINNY_COLS;
            const char *b = p->b + (bi * p->b_bs + j * p->b_sn) * p->es;
            if (ctx->abf16 != NULL && p->b_sk == 1)
                nk_gemm_dpbf16_skinny_kcontig(p->m, nn, p->k, ctx->abf16 + bi * p->m * ctx->lda, ctx->lda,
                                              (const uint16_t *)b, p->b_sn, tile, SKINNY_COLS);
            else if (ctx->abf16 != NULL)
                nk_gemm_dpbf16_skinny_ncontig(p->m, nn, p->k, ctx->abf16 + bi * p->m * ctx->lda, ctx->lda,
                                              (const uint16_t *)b, p->b_sk, tile, SKINNY_COLS);
            else if (p->b_sk == 1)
                p->isa->skinny_kcontig(p->m, nn, p->k, a, p->k, b, p->dt, p->b_sn, tile, SKINNY_COLS);
            else
                p->isa->skinny_ncontig(p->m, nn, p->k, a, p->k, b, p->dt, p->b_sk, tile, SKINNY_COLS);
            store_block(p, bi, 0, j, p->m, nn, tile, SKINNY_COLS);
        }
    }
}

static nk_status gemm_skinny(gemm_problem *p) {
    /* bf16: A stays bf16 for the dot instructions (AMX CPUs have them too). */
    const bool dp = p->dt == NK_BF16 &&
                    (p->bf16 == BF16_DP || p->bf16 == BF16_DP_SKINNY ||
                     (p->bf16 == BF16_AMX && nk_gemm_dpbf16_available()));
    /* Rows of the bf16 A one cache line longer than a multiple of 32: the 8 rows a tile reads at the same
     * k would otherwise share one L1 set whenever k is a multiple of 2048. */
    const int64_t lda = dp ? (p->k + 31) / 32 * 32 + 32 : p->k;
    const int64_t need = dp ? (p->batch * p->m * lda + 1) / 2 : p->batch * p->m * p->k;
    float *ap = scratch_get(&t_pack_a, (size_t)need + 16);
    if (ap == NULL) return NK_UNSUPPORTED;
    skinny_ctx ctx = {.p = p, .lda = lda};
    if (dp) {
        uint16_t *d = (uint16_t *)ap;
        for (int64_t bi = 0; bi < p->batch; bi++) {
            const uint16_t *a = (const uint16_t *)p->a + bi * p->a_bs;
            for (int64_t i = 0; i < p->m; i++, d += lda) {
                if (p->a_sk == 1) memcpy(d, a + i * p->a_sm, (size_t)p->k * 2);
                else
                    for (int64_t k = 0; k < p->k; k++) d[k] = a[i * p->a_sm + k * p->a_sk];
                /* The pair kernels read whole words: the odd k's partner must be a zero, not garbage. */
                memset(d + p->k, 0, (size_t)(lda - p->k) * 2);
            }
        }
        ctx.abf16 = (const uint16_t *)ap;
    } else {
        const bool pairs = p->dt == NK_BF16 && p->b_sk == 1 && p->isa->skinny_bf16_pairs;
        for (int64_t bi = 0; bi < p->batch; bi++) {
            const char *a = p->a + bi * p->a_bs * p->es;
            float *d = ap + bi * p->m * p->k;
            for (int64_t i = 0; i < p->m; i++)
                for (int64_t k = 0; k < p->k; k++)
                    d[i * p->k + (pairs ? nk_gemm_pair_index(k, p->k) : k)] =
                        load_f32(a + (i * p->a_sm + k * p->a_sk) * p->es, p->dt);
        }
        ctx.apacked = ap;
    }
    ctx.chunk = skinny_chunk(p, 16);
    ctx.chunks = (p->n + ctx.chunk - 1) / ctx.chunk;
    const int64_t tasks = p->batch * ctx.chunks;
    /* Small products are not worth waking the pool. */
    const double work = (double)p->batch * p->m * p->n * p->k;
    nk_parallel_for(tasks, work < 32768.0 ? tasks : 1, gemm_skinny_range, &ctx);
    return NK_SUCCESS;
}

/* ---- few rows on AMX tiles, weights read in place ------------------------------------------------------------ */

#define AMX_SKINNY_M 32 /* rows of a the two a-tiles of nk_gemm_amx_skinny hold */

typedef struct amx_skinny_ctx {
    gemm_problem *p;
    const uint16_t *apack; /* per batch entry, 32 x kp packed rows */
    int64_t kp, chunk, chunks;
} amx_skinny_ctx;

static void gemm_amx_skinny_range(void *vctx, int64_t begin, int64_t end) {
    amx_skinny_ctx *ctx = vctx;
    gemm_problem *p = ctx->p;
    float *acc = scratch_get(&t_acc, (size_t)AMX_SKINNY_M * SKINNY_COLS);
    if (acc == NULL) {
        atomic_store(&p->failed, 1);
        return;
    }
    for (int64_t t = begin; t < end; t++) {
        const int64_t bi = t / ctx->chunks;
        const int64_t j0 = (t % ctx->chunks) * ctx->chunk;
        const int64_t j1 = j0 + ctx->chunk < p->n ? j0 + ctx->chunk : p->n;
        for (int64_t j = j0; j < j1; j += SKINNY_COLS) {
            const int64_t nn = j1 - j < SKINNY_COLS ? j1 - j : SKINNY_COLS;
            const uint16_t *w = (const uint16_t *)p->b + bi * p->b_bs + j * p->b_sn;
            if (!nk_gemm_amx_skinny(p->m, nn, p->k, ctx->apack + bi * AMX_SKINNY_M * ctx->kp, w, p->b_sn, acc,
                                    SKINNY_COLS)) {
                atomic_store(&p->failed, 1);
                return;
            }
            store_block(p, bi, 0, j, p->m, nn, acc, SKINNY_COLS);
        }
    }
}

/* bf16, 8..32 rows, B k-contiguous (a linear layer's weight): decode batches. The packed path would
 * transpose every weight into tile order on each call, a pass as long as the product itself once the
 * weights come from memory (1B-parameter decode at batch 16: 48% of the read bound). */
static nk_status gemm_amx_skinny(gemm_problem *p) {
    const int64_t kp = (p->k + 31) / 32 * 32;
    uint16_t *ap = (uint16_t *)scratch_get(&t_pack_a, (size_t)(p->batch * AMX_SKINNY_M * kp + 1) / 2);
    if (ap == NULL) return NK_UNSUPPORTED;
    for (int64_t bi = 0; bi < p->batch; bi++)
        nk_amx_pack_b(ap + bi * AMX_SKINNY_M * kp, (const uint16_t *)p->a + bi * p->a_bs, p->a_sk, p->a_sm, p->k,
                      p->m, kp);
    amx_skinny_ctx ctx = {.p = p, .apack = ap, .kp = kp};
    ctx.chunk = skinny_chunk(p, 32);
    ctx.chunks = (p->n + ctx.chunk - 1) / ctx.chunk;
    atomic_init(&p->failed, 0);
    const int64_t tasks = p->batch * ctx.chunks;
    nk_parallel_for(tasks, (double)p->batch * p->m * p->n * p->k < 65536.0 ? tasks : 1, gemm_amx_skinny_range, &ctx);
    return atomic_load(&p->failed) ? NK_UNSUPPORTED : NK_SUCCESS;
}

/* ---- fp64: a plain, correct loop ------------------------------------------------------------------------------ */

static void gemm_f64_range(void *ctx, int64_t begin, int64_t end) {
    gemm_problem *p = ctx;
    for (int64_t t = begin; t < end; t++) {
        const int64_t bi = t / p->m, i = t % p->m;
        const double *a = (const double *)p->a + bi * p->a_bs + i * p->a_sm;
        const double *b = (const double *)p->b + bi * p->b_bs;
        double *c = (double *)p->c + bi * p->c_bs + i * p->c_sm;
        const double *s = p->s ? (const double *)p->s + bi * p->s_bs + i * p->s_sm : NULL;
        for (int64_t j = 0; j < p->n; j++) {
            double sum = 0.0;
            for (int64_t k = 0; k < p->k; k++) sum += a[k * p->a_sk] * b[k * p->b_sk + j * p->b_sn];
            double v = p->alpha * sum;
            if (s) v += p->beta * s[j * p->s_sn];
            c[j * p->c_sn] = v;
        }
    }
}

/* ---- entry ------------------------------------------------------------------------------------------------------ */

/* out = beta * self (0 when beta == 0), for k == 0. */
static void gemm_k0(const gemm_problem *p) {
    float zeros[64] = {0};
    for (int64_t bi = 0; bi < p->batch; bi++)
        for (int64_t i = 0; i < p->m; i++)
            for (int64_t j = 0; j < p->n; j += 64) {
                const int64_t nn = p->n - j < 64 ? p->n - j : 64;
                if (p->dt == NK_F64) {
                    double *c = (double *)p->c + bi * p->c_bs + i * p->c_sm + j * p->c_sn;
                    const double *s = p->s ? (const double *)p->s + bi * p->s_bs + i * p->s_sm + j * p->s_sn : NULL;
                    for (int64_t q = 0; q < nn; q++) c[q * p->c_sn] = s ? p->beta * s[q * p->s_sn] : 0.0;
                } else {
                    gemm_problem q = *p;
                    q.alpha = 0.0; /* acc is zero: alpha * 0 must not turn into NaN for alpha = inf */
                    store_block(&q, bi, i, j, 1, nn, zeros, 64);
                }
            }
}

/* The L3 cache of cpu0, from sysfs (glibc's sysconf reports a whole EPYC socket's L3, 384 MiB, on a
 * VM that has one 32 MiB slice); 32 MiB where it is not there. */
static int64_t l3_bytes(void) {
    static _Atomic int64_t cached;
    int64_t v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v == 0) {
        long long kib = 0;
        FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
        if (f != NULL) {
            if (fscanf(f, "%lldK", &kib) != 1) kib = 0;
            fclose(f);
        }
        v = kib > 0 ? (int64_t)kib << 10 : (int64_t)32 << 20;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

static void swap64(int64_t *x, int64_t *y) {
    int64_t t = *x;
    *x = *y;
    *y = t;
}

nk_status nk_gemm(const nk_tensor *out, const nk_tensor *a, const nk_tensor *b, const nk_tensor *self, double alpha,
                  double beta) {
    int64_t n_out, n_a, n_b, n_s;
    if (nk_tensor_check(out, &n_out) || nk_tensor_check(a, &n_a) || nk_tensor_check(b, &n_b)) return NK_INVALID;
    if (self != NULL && nk_tensor_check(self, &n_s)) return NK_INVALID;
    const int32_t nd = out->ndim;
    if ((nd != 2 && nd != 3) || a->ndim != nd || b->ndim != nd) return NK_INVALID;
    const int32_t o = nd - 2; /* first matrix dim */
    const int64_t batch = nd == 3 ? out->sizes[0] : 1;
    const int64_t m = out->sizes[o], n = out->sizes[o + 1], k = a->sizes[o + 1];
    if (a->sizes[o] != m || b->sizes[o] != k || b->sizes[o + 1] != n) return NK_INVALID;
    if (nd == 3 && (a->sizes[0] != batch || b->sizes[0] != batch)) return NK_INVALID;
    if (self != NULL && !nk_same_shape(self, out)) return NK_INVALID;
    const nk_dtype dt = out->dtype;
    if (dt != NK_F32 && dt != NK_BF16 && dt != NK_F16 && dt != NK_F64) return NK_UNSUPPORTED;
    if (a->dtype != dt || b->dtype != dt || (self != NULL && self->dtype != dt)) return NK_UNSUPPORTED;
    if (n_out == 0) return NK_SUCCESS;

    gemm_problem p = {0};
    p.dt = dt;
    p.es = (int64_t)nk_dtype_size(dt);
    p.batch = batch, p.m = m, p.n = n, p.k = k;
    p.a = a->data, p.b = b->data, p.c = out->data;
    p.a_bs = nd == 3 ? a->strides[0] : 0, p.a_sm = a->strides[o], p.a_sk = a->strides[o + 1];
    p.b_bs = nd == 3 ? b->strides[0] : 0, p.b_sk = b->strides[o], p.b_sn = b->strides[o + 1];
    p.c_bs = nd == 3 ? out->strides[0] : 0, p.c_sm = out->strides[o], p.c_sn = out->strides[o + 1];
    const nk_tensor *s = self != NULL ? self : out;
    if (beta != 0.0) {
        p.s = s->data;
        p.s_bs = nd == 3 ? s->strides[0] : 0, p.s_sm = s->strides[o], p.s_sn = s->strides[o + 1];
    }
    p.alpha = alpha, p.beta = beta;
    /* Size-1 dims may carry any stride; give them a harmless one so the layout tests below see the
     * real layout (a [1, K] row of a transposed view is still contiguous along k). */
    if (m == 1) p.a_sm = k, p.c_sm = n, p.s_sm = p.s ? n * p.s_sn : 0;
    if (k == 1) p.a_sk = 1, p.b_sk = 1;
    if (n == 1) p.b_sn = 1, p.c_sn = 1, p.s_sn = 0;

    if (k == 0) {
        gemm_k0(&p);
        return NK_SUCCESS;
    }
    if (dt == NK_F64) {
        nk_parallel_for(batch * m, m * n * k < 32768 ? batch * m : 1, gemm_f64_range, &p);
        return NK_SUCCESS;
    }
    p.isa = isa_get();
    p.bf16 = bf16_get();
    /* PyTorch's CPU sends bf16 products of at most 16^3 multiply-adds (batch included) to its plain
     * fp32-accumulating loops, not to the bf16 dot instructions; on those small products the fp32 path
     * gives its bits (the dot instructions pair terms and flush subnormals), and speed does not matter. */
    if (dt == NK_BF16 && p.bf16 != BF16_VIA_F32 && (double)batch * (double)m * (double)n * (double)k <= 4096.0) p.bf16 = BF16_VIA_F32;
    p.blk = blocking_of(p.isa);

    /* On AMX tiles bf16 products from 8 rows beat the skinny dot products, B's packing included
     * (M=8 x 768 x 2048: 130 -> 83 us; M=16: 272 -> 88 us); fewer rows stream B once. */
    const int64_t skinny_m = dt == NK_BF16 && p.bf16 == BF16_AMX ? 7 : NK_GEMM_SKINNY_M;
    /* out^T = b^T a^T: a short n becomes a short m, so matrix-vector products stream too. */
    if (m > skinny_m && n <= skinny_m) {
        swap64(&p.m, &p.n);
        const char *t = p.a;
        p.a = p.b, p.b = t;
        swap64(&p.a_bs, &p.b_bs);
        const int64_t a_sm = p.a_sm, a_sk = p.a_sk;
        p.a_sm = p.b_sn, p.a_sk = p.b_sk;
        p.b_sk = a_sk, p.b_sn = a_sm;
        swap64(&p.c_sm, &p.c_sn);
        swap64(&p.s_sm, &p.s_sn);
    }
    if (p.m <= skinny_m && (p.b_sk == 1 || p.b_sn == 1)) return gemm_skinny(&p);
    if (dt == NK_BF16 && p.bf16 == BF16_AMX && p.m <= AMX_SKINNY_M && p.b_sk == 1) return gemm_amx_skinny(&p);
    p.stream_b = (double)p.k * (double)p.n * (double)p.es > 0.5 * (double)l3_bytes();

    const int threads = nk_threads_get();
    int64_t per_batch = batch >= threads ? 1 : (threads + batch - 1) / batch;
    /* A few whole entries that do not divide among the threads (3 images on 2) leave one thread a whole
     * entry behind the others; splitting each into threads / gcd parts makes the tasks divide evenly. */
    if (batch >= threads && batch < 8 * threads && batch % threads != 0) {
        int64_t x = batch, y = threads;
        while (y != 0) {
            const int64_t t = x % y;
            x = y, y = t;
        }
        per_batch = threads / x;
    }
    /* On the bf16 dot kernels up to 4 tasks per thread while each keeps >= 512 columns or >= 144 rows
     * (re-packing the short operand per task then costs ~1%): a thread that loses its core to another
     * process leaves tasks for the other to steal. */
    if (dt == NK_BF16 && p.bf16 == BF16_DP && batch < threads) {
        const int64_t side = p.n >= p.m ? p.n / 512 : p.m / 144;
        const int64_t more = side < per_batch * 4 ? side : per_batch * 4;
        if (more > per_batch) per_batch = more;
    }
    /* Split the longer side so every task keeps a wide panel. */
    if (p.n >= p.m) {
        p.mparts = 1;
        p.nparts = per_batch;
    } else {
        p.mparts = per_batch;
        p.nparts = 1;
    }
    const int64_t tasks = batch * p.mparts * p.nparts;
    const double work = (double)batch * p.m * p.n * p.k;
    atomic_init(&p.failed, 0);
    nk_parallel_for(tasks, work < 65536.0 ? tasks : 1, gemm_packed_range, &p);
    return atomic_load(&p.failed) ? NK_UNSUPPORTED : NK_SUCCESS;
}

/* ---- machine peak probe -------------------------------------------------------------------------------------- */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct probe_ctx {
    int64_t iters;
    bool avx512;
    atomic_int sink; /* keeps the loops' results alive */
} probe_ctx;

static void probe_range(void *vctx, int64_t begin, int64_t end) {
    probe_ctx *ctx = vctx;
    float sink = 0.f;
    for (int64_t t = begin; t < end; t++) {
        if (ctx->avx512) nk_gemm_fma_loop_avx512(ctx->iters, &sink);
        else nk_gemm_fma_loop_avx2(ctx->iters, &sink);
    }
    atomic_store_explicit(&ctx->sink, sink != 0.f, memory_order_relaxed);
}

double nk_fma_peak_gflops(void) {
    const nk_gemm_isa *isa = isa_detect();
    if (isa == &nk_gemm_isa_generic) return 0.0;
    probe_ctx ctx = {.iters = 200000, .avx512 = isa == &nk_gemm_isa_avx512};
    const double flops_per_iter = ctx.avx512 ? 16.0 * 16 * 2 : 12.0 * 8 * 2;
    const int64_t tasks = (int64_t)nk_threads_get() * NK_PEAK_PROBE_TASKS_PER_THREAD;
    probe_range(&ctx, 0, 1); /* warm up: bring the core to its AVX license frequency */
    double best = 0.0;
    for (int rep = 0; rep < NK_PEAK_PROBE_REPS; rep++) {
        const double t0 = now_seconds();
        nk_parallel_for(tasks, 1, probe_range, &ctx);
        const double dt = now_seconds() - t0;
        const double gf = (double)tasks * (double)ctx.iters * flops_per_iter / dt * 1e-9;
        if (gf > best) best = gf;
    }
    return best;
}
