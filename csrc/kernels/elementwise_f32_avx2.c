/* elementwise_f32_avx2.c - the float32 element-wise loops compiled for AVX2 + FMA (picked at run time). */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define NK_VM_FMA(a, b, c) __builtin_fmaf((a), (b), (c))
#define NK_EW_TABLE nk_ew_f32_avx2
#define NK_EW_ISA_NAME "avx2"
#include "elementwise_f32.h"
#pragma GCC pop_options
#endif
