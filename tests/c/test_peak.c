/* test_peak.c - the bf16 peak probe: it names the instruction the CPU has and returns a finite, positive
 * figure for it (0 only where the CPU has neither AMX-BF16 nor AVX512-BF16); the same for the dot/FMA rate
 * ratio. No timing bound: the host is shared, so only the probes' contracts are checked. */
#include "nk_test.h"
#include "gemm_internal.h"

#include <math.h>

int main(void) {
    for (int threads = 1; threads <= 2; threads++) {
        nk_threads_set(threads);
        const char *method = NULL;
        const double gf = nk_bf16_peak_gflops(&method);
        CHECK_MSG(method != NULL, "method not set");
        if (method == NULL) continue;
        const bool amx = nk_gemm_amx_available(), dp = nk_gemm_dpbf16_available();
        const char *want = amx ? "amx" : dp ? (nk_gemm_bf16_packed_on_dp() ? "avx512_bf16" : "fp32_fma") : "none";
        CHECK_MSG(strcmp(method, want) == 0, "method %s, expected %s", method, want);
        if (strcmp(want, "none") == 0) CHECK_MSG(gf == 0.0, "%f without a bf16 instruction", gf);
        else CHECK_MSG(isfinite(gf) && gf > 0.0, "%f GFLOP/s", gf);
        printf("bf16 peak: %.1f GFLOP/s on %d threads (%s)\n", gf, threads, method);
    }
    CHECK(nk_bf16_peak_gflops(NULL) >= 0.0);
    /* The dot/FMA rate ratio that picks the packed bf16 path: positive exactly where AVX512-BF16 is. */
    const double ratio = nk_gemm_dp_fma_ratio();
    if (nk_gemm_dpbf16_available()) CHECK_MSG(isfinite(ratio) && ratio > 0.0, "dot/fma ratio %f", ratio);
    else CHECK_MSG(ratio == 0.0, "dot/fma ratio %f without AVX512-BF16", ratio);
    printf("vdpbf16ps / fp32 FMA flops per second: %.2f (packed bf16 on the dot instruction from %.2f)\n", ratio, NK_GEMM_BF16_DP_MIN_RATIO);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
