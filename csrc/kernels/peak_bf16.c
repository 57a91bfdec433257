/*
 * peak_bf16.c - the machine's bf16 multiply-add peak, the bound the bf16 GEMMs are reported against.
 *
 * Measured on the instruction the bf16 GEMM runs on where the CPU has it: AMX tiles (tdpbf16ps) first,
 * else AVX512-BF16 (vdpbf16ps) where it outruns the FMAs, else the fp32 FMA peak (the products widen). Both loops only touch registers/tiles, so memory never bounds them; the
 * accumulators are independent chains, enough to cover each instruction's latency. Everything that uses
 * these instructions carries its own target attribute and runs only after the CPU (and, for AMX, the
 * kernel's permission for the tile state) was checked.
 */
#include "gemm_internal.h"
#include "neuron_kernels.h"

#include <stdatomic.h>
#include <time.h>

static double peak_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <string.h>

#define PK_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#define PK_DP_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

typedef struct pk_tilecfg {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} pk_tilecfg;

/* One tdpbf16ps of full 16 x 64-byte tiles: 16 x 16 fp32 outputs, each the sum of 32 bf16 products. */
#define PK_AMX_FLOPS_PER_INSN (16.0 * 16.0 * 32.0 * 2.0)
/* One 512-bit vdpbf16ps: 16 fp32 lanes, each adding 2 bf16 products. */
#define PK_DP_FLOPS_PER_INSN (16.0 * 2.0 * 2.0)
#define PK_DP_CHAINS 12 /* the accumulators c0..c11 of pk_dp_loop */

/* 2x2 accumulator tiles fed by two A and two B tiles, the GEMM kernel's own arrangement. Inputs hold small
 * finite values (not zeros) so no fast path for zero operands can flatter the figure. */
PK_AMX_TARGET static void pk_amx_loop(int64_t iters, float *sink) {
    pk_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    /* GCC does not see ldtilecfg read the whole struct and may drop the stores above. */
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
    _Alignas(64) uint16_t in[16 * 32];
    for (int i = 0; i < 16 * 32; i++) in[i] = 0x3c00; /* bf16 2^-7 */
    _Alignas(64) float out[16 * 16];
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, in, 64);
    _tile_loadd(5, in, 64);
    _tile_loadd(6, in, 64);
    _tile_loadd(7, in, 64);
    for (int64_t i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    *sink += out[0];
}

/* The 12 chains are named variables (c0..c11, spelled out by PK_DP_EACH), not an array: with an array GCC kept
 * the accumulators on the stack and reloaded and stored all 12 every iteration, so each chain waited on store
 * forwarding and a Zen 4 read 145 GFLOP/s against 404 reached by the bf16 GEMM. */
#define PK_DP_EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define PK_DP_DECL(i) __m512 c##i = _mm512_set1_ps((float)(i));
#define PK_DP_STEP(i) c##i = _mm512_dpbf16_ps(c##i, a, b);
#define PK_DP_SUM(i) s = _mm512_add_ps(s, c##i);
PK_DP_TARGET static void pk_dp_loop(int64_t iters, float *sink) {
    PK_DP_EACH(PK_DP_DECL)
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3c00), b = (__m512bh)_mm512_set1_epi16(0x3c00);
    for (int64_t i = 0; i < iters; i++) {
        PK_DP_EACH(PK_DP_STEP)
        /* Keeps GCC from folding the chains' constant operands into one multiply per chain. */
        __asm__ volatile("" : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6), "+v"(c7),
                         "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));
    }
    __m512 s = _mm512_setzero_ps();
    PK_DP_EACH(PK_DP_SUM)
    *sink += _mm512_reduce_add_ps(s);
}

static bool pk_dp_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512bf16");
}

typedef struct pk_ctx {
    int64_t iters;
    bool amx;
    atomic_int sink; /* keeps the loops' results alive */
} pk_ctx;

static void pk_range(void *vctx, int64_t begin, int64_t end) {
    pk_ctx *ctx = vctx;
    float sink = 0.f;
    for (int64_t t = begin; t < end; t++) {
        if (ctx->amx) pk_amx_loop(ctx->iters, &sink);
        else pk_dp_loop(ctx->iters, &sink);
    }
    atomic_store_explicit(&ctx->sink, sink != 0.f, memory_order_relaxed);
}

double nk_bf16_peak_gflops(const char **method) {
    pk_ctx ctx;
    double flops_per_iter;
    if (nk_gemm_amx_available()) {
        ctx.amx = true;
        ctx.iters = 20000;
        flops_per_iter = 4.0 * PK_AMX_FLOPS_PER_INSN;
        if (method) *method = "amx";
    } else if (pk_dp_available() && !nk_gemm_bf16_packed_on_dp()) {
        /* The packed bf16 products widen into the fp32 kernels here (the dot instruction issues slower than
         * the FMAs, nk_gemm_dp_fma_ratio), so their bound is the FMA peak. */
        if (method) *method = "fp32_fma";
        return nk_fma_peak_gflops();
    } else if (pk_dp_available()) {
        ctx.amx = false;
        ctx.iters = 100000;
        flops_per_iter = PK_DP_CHAINS * PK_DP_FLOPS_PER_INSN;
        if (method) *method = "avx512_bf16";
    } else {
        if (method) *method = "none";
        return 0.0;
    }
    atomic_init(&ctx.sink, 0);
    const int64_t tasks = (int64_t)nk_threads_get() * NK_PEAK_PROBE_TASKS_PER_THREAD;
    pk_range(&ctx, 0, 1); /* warm up: the unit's power-up and the core's license frequency */
    double best = 0.0;
    for (int rep = 0; rep < NK_PEAK_PROBE_REPS; rep++) {
        const double t0 = peak_now();
        nk_parallel_for(tasks, 1, pk_range, &ctx);
        const double dt = peak_now() - t0;
        const double gf = (double)tasks * (double)ctx.iters * flops_per_iter / dt * 1e-9;
        if (gf > best) best = gf;
    }
    return best;
}

/*
 * vdpbf16ps flops per second over fp32 FMA flops per second, on the calling thread: each loop the best of
 * 5 alternating rounds of ~0.1 ms (register-only chains, so the ratio is the issue rates').
 */
double nk_gemm_dp_fma_ratio(void) {
    if (!pk_dp_available()) return 0.0;
    const int64_t iters = 20000;
    float sink = 0.f;
    double best_dp = 1e30, best_fma = 1e30;
    pk_dp_loop(iters, &sink); /* warm up: the unit's power-up and the core's license frequency */
    nk_gemm_fma_loop_avx512(iters, &sink);
    for (int r = 0; r < 5; r++) {
        double t0 = peak_now();
        pk_dp_loop(iters, &sink);
        double t1 = peak_now();
        nk_gemm_fma_loop_avx512(iters, &sink);
        const double t2 = peak_now();
        if (t1 - t0 < best_dp) best_dp = t1 - t0;
        if (t2 - t1 < best_fma) best_fma = t2 - t1;
    }
    __asm__ volatile("" : : "m"(sink)); /* the loops' results stay live */
    /* nk_gemm_fma_loop_avx512: 16 chains of 16-lane FMAs per iteration */
    const double dp = (double)iters * PK_DP_CHAINS * PK_DP_FLOPS_PER_INSN / best_dp;
    const double fma = (double)iters * 16.0 * 16.0 * 2.0 / best_fma;
    return dp / fma;
}

#else

double nk_gemm_dp_fma_ratio(void) {
    return 0.0;
}

double nk_bf16_peak_gflops(const char **method) {
    (void)peak_now;
    if (method) *method = "none";
    return 0.0;
}

#endif
