/* elementwise_f32_generic.c - the float32 element-wise loops for any CPU (baseline instruction set). */
#define NK_EW_TABLE nk_ew_f32_generic
#define NK_EW_ISA_NAME "generic"
#include "elementwise_f32.h"
