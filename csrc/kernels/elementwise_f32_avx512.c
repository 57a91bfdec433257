/* elementwise_f32_avx512.c - the float32 element-wise loops compiled for AVX-512 (picked at run time). */
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")
#define NK_VM_FMA(a, b, c) __builtin_fmaf((a), (b), (c))
#define NK_EW_TABLE nk_ew_f32_avx512
#define NK_EW_ISA_NAME "avx512"
#include "elementwise_f32.h"
#pragma GCC pop_options
#endif
