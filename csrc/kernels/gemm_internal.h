/*
 * gemm_internal.h - what the GEMM driver (gemm.c) needs from its per-ISA micro-kernel files
 * (gemm_avx512.c, gemm_avx512bf16.c, gemm_amx.c, gemm_avx2.c, gemm_generic.c). Not part of the public
 * contract.
 */
#ifndef NEURON_GEMM_INTERNAL_H
#define NEURON_GEMM_INTERNAL_H

#include "kernels_internal.h"

#define NK_GEMM_MR_MAX 16
#define NK_GEMM_NR_MAX 32
/*
 * The peak probes (gemm.c fp32, peak_bf16.c bf16) keep the best of several timed rounds, each long
 * enough (15-30 ms at full speed on 2 cores) that one late-waking pool thread or a moment of another
 * process on a core cannot halve it: with 3 rounds of 16 tasks per thread (~7 ms) a 2-core Zen 3 once
 * reported one core's peak, and GEMMs then read as over 100% of it.
 */
#define NK_PEAK_PROBE_REPS 7
#define NK_PEAK_PROBE_TASKS_PER_THREAD 32

/* Rows up to which a product takes the streaming (skinny) path instead of the packed one. */
#define NK_GEMM_SKINNY_M 16

/*
 * Cache lines of the next B micro-panel's source that a micro-kernel prefetches into L2 while it
 * computes, one every kc / n steps, walking the source run by run. A B larger than the L3 comes from DRAM, and packing it would
 * otherwise wait on memory with the arithmetic idle: on Zen 5 a panel's 32 interleaved row streams
 * defeat the hardware prefetcher. The same lines prefetched in one burst before each micro-kernel call
 * gained nothing; for a B that stays in the L3 the prefetches cost 3-9%, so they are listed only for a
 * B above half the L3 (gemm.c).
 */
typedef struct nk_gemm_prefetch {
    const char *run; /* the current run: a column of a k-contiguous B, a row of an n-contiguous one */
    int64_t stride;  /* bytes from one run to the next */
    int64_t per_run; /* 64-byte lines per run */
    int64_t line;    /* the next line of the current run */
    int64_t n;       /* lines the next micro-kernel call prefetches (nk_gemm_prefetch_share) */
    int64_t step;    /* ...one every step steps of its loop */
    int64_t due;     /* the step of the next one */
} nk_gemm_prefetch;

/* Starts the walk over cols columns x kcur rows of B at b (element (k, j) at b + (k*sk + j*sn) * es)
 * stored k- or n-contiguous; returns its number of lines (0 for other layouts). pf->n is left 0. */
int64_t nk_gemm_prefetch_init(nk_gemm_prefetch *pf, const char *b, int64_t es, int64_t sk, int64_t sn, int64_t kcur,
                              int64_t cols);

/* Gives the next micro-kernel call, of `steps` loop steps, part `part` of `parts` of the walk's `lines`. */
static inline void nk_gemm_prefetch_share(nk_gemm_prefetch *pf, int64_t lines, int64_t part, int64_t parts,
                                          int64_t steps) {
    pf->n = lines * (part + 1) / parts - lines * part / parts;
    pf->step = pf->n > 0 && steps / pf->n > 0 ? steps / pf->n : 1;
    pf->due = 0;
}

/* A micro-kernel's loop step k: the next line into L2 when one is due. */
static inline void nk_gemm_prefetch_tick(nk_gemm_prefetch *pf, int64_t k) {
    if (k != pf->due || pf->n <= 0) return;
    __builtin_prefetch(pf->run + pf->line * 64, 0, 2);
    if (++pf->line == pf->per_run) {
        pf->line = 0;
        pf->run += pf->stride;
    }
    pf->n--;
    pf->due += pf->step;
}

/*
 * Packed micro-kernel: the MR x NR tile c (fp32, row stride ldc, unit column stride) becomes
 * pa @ pb (accumulate false) or c + pa @ pb (accumulate true). pa is a packed A micro-panel, kc
 * groups of MR values (one column of A per k); pb a packed B micro-panel, kc groups of NR values
 * (one row of B per k). Both are 64-byte aligned. pf (never NULL): prefetches pf->n lines of its walk
 * meanwhile, spread over the kc steps.
 */
typedef void (*nk_gemm_ukr_fn)(int64_t kc, const float *pa, const float *pb, float *c, int64_t ldc, bool accumulate,
                               nk_gemm_prefetch *pf);

/*
 * Transposing packers for operands stored k-contiguous, full panels only:
 *  - A: A[i, k] (i < MR) at src + (i*ld + k) elements into kc groups of MR floats;
 *  - B: B[k, j] (j < NR) at src + (k + j*ld) elements into kc rows of NR floats.
 */
typedef void (*nk_gemm_pack_kcontig_fn)(float *dst, const void *src, nk_dtype dt, int64_t ldj, int64_t kc);

/*
 * Row-block packer for operands whose k is the strided direction (the backward products of a linear
 * layer: A = dY^T stored i-contiguous, B = W or X stored n-contiguous): element (k, j) of the source at
 * src + (k*ldk + j) elements, j < count, k < kc, goes to dst[(j / w * kc + k) * w + j % w] in fp32, w
 * the panel width (MR for A, NR for B), lanes past count zero. One pass over k reads each row's segment
 * once, front to back, and scatters it into the panels: packing panel by panel re-read every row once
 * per panel, 48 or 128 bytes at a time (19% of dY^T @ X with M = 32000 x 512 x 768).
 */
typedef void (*nk_gemm_pack_rows_fn)(float *dst, const void *src, nk_dtype dt, int64_t ldk, int64_t count,
                                     int64_t kc, int64_t w);

/*
 * Skinny products for m <= NK_GEMM_SKINNY_M rows: c[i*ldc + j] = sum_k a[i*lda + k] * B[k, j] for
 * i < m, j < n, with a in fp32 (already packed) and B of dtype dt (F32, BF16, F16) read in place:
 *  - kcontig: B[k, j] at b + k + j*ldb (linear's weight [N, K]): dot products along k;
 *  - ncontig: B[k, j] at b + k*ldb + j (a row-major [K, N] matrix): axpy along n.
 */
typedef void (*nk_gemm_skinny_fn)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                                  nk_dtype dt, int64_t ldb, float *c, int64_t ldc);

typedef struct nk_gemm_isa {
    const char *name;
    int mr, nr;             /* register tile */
    nk_gemm_ukr_fn ukr;
    nk_gemm_pack_kcontig_fn pack_a_kcontig; /* NULL: the portable packer */
    nk_gemm_pack_kcontig_fn pack_b_kcontig;
    nk_gemm_pack_rows_fn pack_rows; /* NULL: the portable one */
    nk_gemm_skinny_fn skinny_kcontig;
    nk_gemm_skinny_fn skinny_ncontig;
    /* skinny_kcontig with bf16 B takes a in pair order: in every whole block of 16 k, the 8 even k first,
     * then the 8 odd ones (nk_gemm_pair_index); the k past the last whole block stay in order. A bf16 pair
     * read as one 32-bit lane then widens to two fp32 values with an AND and a shift, no unpacking. */
    bool skinny_bf16_pairs;
} nk_gemm_isa;

/* Where k lands in a row of k_total values in pair order. */
static inline int64_t nk_gemm_pair_index(int64_t k, int64_t k_total) {
    const int64_t blk = k & ~(int64_t)15;
    if (blk + 16 > k_total) return k;
    const int64_t r = k & 15;
    return blk + ((r & 1) ? 8 + (r >> 1) : (r >> 1));
}

extern const nk_gemm_isa nk_gemm_isa_avx512;
extern const nk_gemm_isa nk_gemm_isa_avx2;
extern const nk_gemm_isa nk_gemm_isa_generic;

/* Portable pieces the ISA files reuse for dtypes or layouts they do not specialise. */
void nk_gemm_skinny_kcontig_generic(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                                    nk_dtype dt, int64_t ldb, float *c, int64_t ldc);
void nk_gemm_skinny_ncontig_generic(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                                    nk_dtype dt, int64_t ldb, float *c, int64_t ldc);

/* AVX-512 FMA throughput loop: runs `iters` iterations of 16 independent 16-lane FMAs (512 flops). */
void nk_gemm_fma_loop_avx512(int64_t iters, float *sink);
void nk_gemm_fma_loop_avx2(int64_t iters, float *sink);

/*
 * bf16 on AMX tiles (gemm_amx.c). available: the CPU has AMX-BF16 and the OS granted the tile state.
 * pack_a: a task's rows of A (m x k bf16, element strides a_sm, a_sk) into packed_a_size(m, k) elements,
 * once, for all its column blocks. block_packed_a: acc[i*ldacc + j] = sum_k a[i, k] b[k, j] in fp32 for
 * i < m, j < n (b bf16 with element strides); acc must hold m and n rounded up to 32 (ldacc >= that, a
 * multiple of 16): the padding is written too. Returns false if scratch memory is unavailable.
 */
bool nk_gemm_amx_available(void);
int64_t nk_gemm_amx_packed_a_size(int64_t m, int64_t k);
void nk_gemm_amx_pack_a(uint16_t *dst, int64_t m, int64_t k, const uint16_t *a, int64_t a_sm, int64_t a_sk);
bool nk_gemm_amx_block_packed_a(int64_t m, int64_t n, int64_t k, const uint16_t *ap, const uint16_t *b,
                                int64_t b_sk, int64_t b_sn, float *acc, int64_t ldacc);

/*
 * The same tiles for callers issuing many small products between one begin and end on a thread
 * (attention), so the tile configuration is loaded once. session_begin: false (nothing to end) when
 * AMX is unusable or not the chosen bf16 path (nk_gemm_isa_force). pack_b: b (kcur x ncur bf16, element
 * strides sk, sn) into dst, 16-column panels of kp/2 pair rows, kp a multiple of 32, columns zero-padded
 * to a multiple of 32 (dst 64-byte aligned, round32(ncur) * kp elements). matmul: c[mp x np] (fp32, row
 * stride ldc) = (accumulate ? c : 0) + a[mp x kp] (bf16 rows lda apart) . packed b; mp, np, kp multiples of 32.
 */
bool nk_gemm_bf16_on_amx(void); /* gemm.c: AMX is the chosen bf16 path */
bool nk_amx_session_begin(void);
void nk_amx_session_end(void);
void nk_amx_pack_b(uint16_t *dst, const uint16_t *b, int64_t sk, int64_t sn, int64_t kcur, int64_t ncur,
                   int64_t kp);
void nk_amx_matmul(int64_t mp, int64_t np, int64_t kp, const uint16_t *a, int64_t lda, const uint16_t *bp,
                   float *c, int64_t ldc, bool accumulate);
/*
 * Few rows (m <= 32) times weights stored k-contiguous (w: n rows ldw elements apart): out^T = w . a^T on
 * tiles, w read in place as the tiles' A operand so it streams from memory once with no packing pass. ap:
 * the m rows of a packed by nk_amx_pack_b (ncur = m, kp = k rounded up to 32). acc[i*ldacc + j] for i < m,
 * j < n, n rounded up to 32 written. false: no scratch memory for an edge block.
 */
bool nk_gemm_amx_skinny(int64_t m, int64_t n, int64_t k, const uint16_t *ap, const uint16_t *w, int64_t ldw,
                        float *acc, int64_t ldacc);
/* p[j] = bf16(s[j]) for j < n (a multiple of 32), rounded to nearest even (a NaN stays a NaN). */
void nk_amx_row_to_bf16(const float *s, int64_t n, uint16_t *p);

/*
 * bf16 on AVX512-BF16 dot instructions (gemm_avx512bf16.c), for CPUs without AMX. available: the CPU has
 * AVX-512 F/BW/VL/DQ and BF16.
 * block: as nk_gemm_amx_block_packed_a (A unpacked, with strides), but acc must hold m rounded up to 12 rows (the register tile) and n rounded
 * up to 32 (ldacc >= that); the padding may be written too. With flush and k <= NK_GEMM_DPBF16_KC_MAX, acc holds
 * only NK_GEMM_DPBF16_MC rows: each block of that many rows is handed to flush as soon as it is final.
 * skinny_kcontig: c[i*ldc + j] = sum_k a[i*lda + k] * b[k + j*ldb] for i < m <= NK_GEMM_SKINNY_M, j < n,
 * a and b bf16, c fp32; skinny_ncontig: the same with b[k*ldb + j]. Rows of a must be zero from k up to
 * an even length (lda even).
 */
bool nk_gemm_dpbf16_available(void);
/* Called with rows [i0, i0 + mm) of a block's result, final, in acc (row stride ldacc). */
typedef void (*nk_gemm_rows_fn)(void *ctx, int64_t i0, int64_t mm, const float *acc, int64_t ldacc);
bool nk_gemm_dpbf16_block(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t a_sm, int64_t a_sk,
                          const uint16_t *b, int64_t b_sk, int64_t b_sn, float *acc, int64_t ldacc, bool stream_b,
                          nk_gemm_rows_fn flush, void *flush_ctx);
/* Depth up to which nk_gemm_dpbf16_block runs one pass, and rows per flush then (acc holds that many). */
#define NK_GEMM_DPBF16_KC_MAX 1024
#define NK_GEMM_DPBF16_MC 144
void nk_gemm_dpbf16_skinny_kcontig(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                                   const uint16_t *b, int64_t ldb, float *c, int64_t ldc);
void nk_gemm_dpbf16_skinny_ncontig(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                                   const uint16_t *b, int64_t ldb, float *c, int64_t ldc);
#define NK_GEMM_DPBF16_MR 12
/*
 * The same products for callers issuing many small ones (attention), as nk_amx_pack_b / nk_amx_matmul:
 * pack_b: b (kcur x ncur bf16, element strides sk, sn) into panels of 32 columns, each kp / 2 pair rows
 * deep (zero past kcur; kp even), dst 64-byte aligned and holding ncur rounded up to 32 times kp elements.
 * matmul: c (fp32, row stride ldc) = (accumulate ? c : 0) + a[m x kp] (bf16 rows lda apart, lda even) .
 * packed b, for np (a multiple of 32) columns; rows up to m rounded up to 4 are computed and written,
 * so a and c must hold them.
 */
void nk_dp_pack_b(uint32_t *dst, const uint16_t *b, int64_t sk, int64_t sn, int64_t kcur, int64_t ncur,
                  int64_t kp);
void nk_dp_matmul(int64_t m, int64_t np, int64_t kp, const uint16_t *a, int64_t lda, const uint32_t *bp,
                  float *c, int64_t ldc, bool accumulate);
/* gemm.c: packed bf16 products (and attention) run on the dot instruction, which outruns the FMAs here. */
bool nk_gemm_bf16_packed_on_dp(void);
/* peak_bf16.c: vdpbf16ps flops per second over fp32 FMA flops per second on the calling thread (0 without
 * AVX512-BF16); decides whether packed bf16 products run on the dot instruction. */
double nk_gemm_dp_fma_ratio(void);
#define NK_GEMM_BF16_DP_MIN_RATIO 1.25

/* Epilogue of one unit-stride output row on AVX-512: out[j] = alpha * acc[j] (+ beta * self[j * ss] when
 * self is not NULL; ss is 0 or 1), rounded once to dt (F32, BF16, F16). */
void nk_gemm_store_row_avx512(void *out, nk_dtype dt, const float *acc, const void *self, int64_t ss, int64_t n,
                              float alpha, float beta);

/* dst[i * ldd + j] = src[j * lds + i] for j < 16, i < n <= 16, on AVX-512 (16 floats of each of the 16 source
 * rows are read): the attention's key strips use it too. */
void nk_transpose16_f32_avx512(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t n);

/* Test hook: use the named micro-kernel family; false if the CPU lacks it. "avx512" runs bf16 through its
 * fp32 kernels, "avx512bf16" on the dot instructions, "amx" on AMX tiles; "avx2", "generic". */
bool nk_gemm_isa_force(const char *name);

#endif /* NEURON_GEMM_INTERNAL_H */
