/*
 * nk_test_values.h - helpers shared by the C tests of the convolution kernels (their descriptors come
 * from nk_test.h's mk): values that are exact in fp32, bf16 and fp16 (small integers / 4), written and
 * read in each dtype, so the dtypes compare exactly.
 */
#ifndef NK_TEST_VALUES_H
#define NK_TEST_VALUES_H

#include "neuron_kernels.h"

#include <stdint.h>
#include <string.h>

static float val(int64_t i) {
    return (float)((i * 37) % 11 - 5) * 0.25f;
}

static void put(void *p, nk_dtype dt, int64_t i, float v) {
    if (dt == NK_F32) ((float *)p)[i] = v;
    else {
        /* exact for these values: build the bits from a float with few mantissa bits */
        uint32_t u;
        memcpy(&u, &v, 4);
        if (dt == NK_BF16) ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        else {
            /* fp16: sign, exponent rebias, 10-bit mantissa (v is 0 or a normal number here) */
            uint16_t h = 0;
            if (v != 0.f) h = (uint16_t)(((u >> 16) & 0x8000) | ((((u >> 23) & 0xFF) - 112) << 10) | ((u >> 13) & 0x3FF));
            ((uint16_t *)p)[i] = h;
        }
    }
}

static float get(const void *p, nk_dtype dt, int64_t i) {
    if (dt == NK_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (dt == NK_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    if ((h & 0x7FFF) == 0) return (h & 0x8000) ? -0.f : 0.f;
    uint32_t u = ((uint32_t)(h & 0x8000) << 16) | ((((h >> 10) & 0x1F) + 112u) << 23) | ((uint32_t)(h & 0x3FF) << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
