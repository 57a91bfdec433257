/* test_peak.c - the bf16 peak probe: it names the instruction the CPU has and returns a finite, positive
 * figure for it (0 only where the CPU has neither AMX-BF16 nor AVX512-BF16). No timing bound: the host is
 * shared, so only the probe's contract is checked. */
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
        const char *want = amx ? "amx" : dp ? "avx512_bf16" : "none";
        CHECK_MSG(strcmp(method, want) == 0, "method %s, expected %s", method, want);
        if (strcmp(want, "none") == 0) CHECK_MSG(gf == 0.0, "%f without a bf16 instruction", gf);
        else CHECK_MSG(isfinite(gf) && gf > 0.0, "%f GFLOP/s", gf);
        printf("bf16 peak: %.1f GFLOP/s on %d threads (%s)\n", gf, threads, method);
    }
    CHECK(nk_bf16_peak_gflops(NULL) >= 0.0);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
