/*
 * nk_test.h - what the C unit tests share: check counters, CHECK / CHECK_MSG (the first 30 failures
 * are printed; every one is counted), and a tensor descriptor builder. Each test is one translation
 * unit, so the counters are per test program.
 */
#ifndef NK_TEST_H
#define NK_TEST_H

#include "neuron_kernels.h"

#include <stdio.h>
#include <string.h>

static int g_checks, g_failures;

#define CHECK_MSG(cond, ...)                                                             \
    do {                                                                                 \
        g_checks++;                                                                      \
        if (!(cond)) {                                                                   \
            g_failures++;                                                                \
            if (g_failures <= 30) {                                                      \
                fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
                fprintf(stderr, __VA_ARGS__);                                            \
                fprintf(stderr, "\n");                                                   \
            }                                                                            \
        }                                                                                \
    } while (0)
#define CHECK(cond) CHECK_MSG(cond, "%s", "")

/* A descriptor of nd dims; strides NULL means row-major contiguous. */
static inline nk_tensor mk(void *data, nk_dtype dt, int32_t nd, const int64_t *sizes, const int64_t *strides) {
    nk_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.ndim = nd;
    int64_t st = 1;
    for (int32_t d = nd - 1; d >= 0; d--) {
        t.sizes[d] = sizes[d];
        t.strides[d] = strides ? strides[d] : st;
        if (!strides) st *= sizes[d]; /* given strides may describe sizes whose product overflows */
    }
    return t;
}

#endif
