/*
 * reduce_simd_body.h - the vector helpers and row kernels of reduce_simd.h, included once per ISA
 * with NK_ISA set (avx512, avx2, base) under the matching `#pragma GCC target`. Every name defined
 * here gets the _<isa> suffix. The whole body must be compiled for the target: GCC lowers vector
 * comparisons it cannot do natively before inlining, so a generic helper inlined into an AVX-512
 * function would still compare lane by lane.
 */
#define NK_SFX2(a, b) a##_##b
#define NK_SFX(a, b) NK_SFX2(a, b)
#define nk_vload NK_SFX(nk_vload, NK_ISA)
#define nk_vstore NK_SFX(nk_vstore, NK_ISA)
#define nk_vsplat NK_SFX(nk_vsplat, NK_ISA)
#define nk_vbits NK_SFX(nk_vbits, NK_ISA)
#define nk_vfloat NK_SFX(nk_vfloat, NK_ISA)
#define nk_vsel NK_SFX(nk_vsel, NK_ISA)
#define nk_vhsum NK_SFX(nk_vhsum, NK_ISA)
#define nk_vexp NK_SFX(nk_vexp, NK_ISA)
#define nk_vload_bf16 NK_SFX(nk_vload_bf16, NK_ISA)
#define nk_vload_f16 NK_SFX(nk_vload_f16, NK_ISA)
#define nk_vstore_bf16 NK_SFX(nk_vstore_bf16, NK_ISA)
#define nk_vstore_f16 NK_SFX(nk_vstore_f16, NK_ISA)
#define nk_vload8 NK_SFX(nk_vload8, NK_ISA)
#define nk_rgather_body NK_SFX(nk_rgather_body, NK_ISA)
#define nk_rscatter_body NK_SFX(nk_rscatter_body, NK_ISA)
#define nk_sum_body NK_SFX(nk_sum_body, NK_ISA)
#define nk_sum_cascade_body NK_SFX(nk_sum_cascade_body, NK_ISA)
#define nk_sum_sq_cascade_body NK_SFX(nk_sum_sq_cascade_body, NK_ISA)
#define nk_vsq8 NK_SFX(nk_vsq8, NK_ISA)
#define nk_sq1 NK_SFX(nk_sq1, NK_ISA)
#define nk_sum_cascade_core NK_SFX(nk_sum_cascade_core, NK_ISA)
#define nk_sum_cascade_bf16_body NK_SFX(nk_sum_cascade_bf16_body, NK_ISA)
#define nk_colsum_body NK_SFX(nk_colsum_body, NK_ISA)
#define nk_sum_cascade2_body NK_SFX(nk_sum_cascade2_body, NK_ISA)
#define nk_vload8_bf16 NK_SFX(nk_vload8_bf16, NK_ISA)
#define nk_sumsqdev_body NK_SFX(nk_sumsqdev_body, NK_ISA)
#define nk_dot_body NK_SFX(nk_dot_body, NK_ISA)
#define nk_maxidx_body NK_SFX(nk_maxidx_body, NK_ISA)
#define nk_max_body NK_SFX(nk_max_body, NK_ISA)
#define nk_max_core NK_SFX(nk_max_core, NK_ISA)
#define nk_max_bf16_body NK_SFX(nk_max_bf16_body, NK_ISA)
#define nk_expsub_body NK_SFX(nk_expsub_body, NK_ISA)
#define nk_axpb_body NK_SFX(nk_axpb_body, NK_ISA)
#define nk_smbwd_body NK_SFX(nk_smbwd_body, NK_ISA)
#define nk_lsmbwd_body NK_SFX(nk_lsmbwd_body, NK_ISA)
#define nk_affine_body NK_SFX(nk_affine_body, NK_ISA)
#define nk_scalew_body NK_SFX(nk_scalew_body, NK_ISA)
#define nk_gxh_body NK_SFX(nk_gxh_body, NK_ISA)
#define nk_dxrow_body NK_SFX(nk_dxrow_body, NK_ISA)

/* The vector of this ISA: 16 float lanes on AVX-512, 8 elsewhere. GCC 12 lowers comparisons of
 * 64-byte vectors lane by lane through the stack where the target has no 64-byte registers (AVX2 softmax
 * and amax ran 4-10x slower than PyTorch's CPU that way), while 32-byte ones become single instructions. */
#if defined(__AVX512F__)
#define NK_VL 16
#define NK_VF nk_v16f
#define NK_VI nk_v16i
#define NK_VU nk_v16u
#define NK_VH nk_v16h
#define NK_LANES {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
#else
#define NK_VL 8
#define NK_VF nk_v8f
#define NK_VI nk_v8i
#define NK_VU nk_v8u
#define NK_VH nk_v8h
#define NK_LANES {0, 1, 2, 3, 4, 5, 6, 7}
#endif

NK_AI NK_VF nk_vload(const float *p) {
    NK_VF v;
    memcpy(&v, p, sizeof v);
    return v;
}

NK_AI void nk_vstore(float *p, NK_VF v) { memcpy(p, &v, sizeof v); }

NK_AI NK_VF nk_vsplat(float f) {
    const NK_VF v = {f};
    return __builtin_shuffle(v, (NK_VI){0});
}

NK_AI NK_VI nk_vbits(NK_VF v) {
    NK_VI i;
    memcpy(&i, &v, sizeof i);
    return i;
}

NK_AI NK_VF nk_vfloat(NK_VI i) {
    NK_VF v;
    memcpy(&v, &i, sizeof v);
    return v;
}

NK_AI NK_VF nk_vsel(NK_VI m, NK_VF a, NK_VF b) { return nk_vfloat((m & nk_vbits(a)) | (~m & nk_vbits(b))); }

NK_AI float nk_vhsum(NK_VF v) {
    /* Pairwise, so the lane order does not bias the rounding. */
    float t[NK_VL];
    nk_vstore(t, v);
    for (int w = NK_VL / 2; w >= 1; w >>= 1)
        for (int l = 0; l < w; l++) t[l] += t[l + w];
    return t[0];
}

NK_AI NK_VF nk_vexp(NK_VF x) {
#if defined(__AVX512F__)
    /* The same reduction and polynomial, with 2^n applied by vscalefps: it overflows to inf, gives
     * PyTorch's subnormals below -87.3 and keeps NaN by itself, which saves the selects (a third of
     * softmax's exp). The clamp keeps the reduction sane for huge |x|, low enough
     * that e^-inf is exactly 0 (at -104, 2^-150 * p still rounds up to the least subnormal); _mm512_min/max return
     * their second operand for NaN, so a NaN passes. */
    const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-110.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), (__m512)x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    NK_VF r = (NK_VF)_mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = (NK_VF)_mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), (__m512)r);
    NK_VF p = nk_vsplat(1.0f / 5040.0f);
    p = p * r + nk_vsplat(1.0f / 720.0f);
    p = p * r + nk_vsplat(1.0f / 120.0f);
    p = p * r + nk_vsplat(1.0f / 24.0f);
    p = p * r + nk_vsplat(1.0f / 6.0f);
    p = p * r + nk_vsplat(0.5f);
    p = p * r + nk_vsplat(1.0f);
    p = p * r + nk_vsplat(1.0f);
    return (NK_VF)_mm512_scalef_ps((__m512)p, n);
#else
    NK_VF out;
    NK_EXP_BODY(NK_VF, nk_vsplat, nk_vbits, nk_vfloat, nk_vsel, NK_VLT, NK_VGT, NK_VNE, x, out);
    return out;
#endif
}

NK_AI NK_VF nk_vload_bf16(const uint16_t *p) {
#if defined(__AVX512F__)
    return (NK_VF)_mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
#elif defined(__AVX2__)
    return (NK_VF)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
#else
    NK_VH h;
    memcpy(&h, p, sizeof h);
    NK_VU w = __builtin_convertvector(h, NK_VU) << 16;
    return nk_vfloat((NK_VI)w);
#endif
}

/* nk_f16_to_f32, lane-wise. */
NK_AI NK_VF nk_vload_f16(const uint16_t *p) {
    NK_VH h;
    memcpy(&h, p, sizeof h);
    const NK_VU w = __builtin_convertvector(h, NK_VU) << 16;
    const NK_VU sign = w & 0x80000000u;
    const NK_VU two_w = w + w;
    const NK_VF normalized = nk_vfloat((NK_VI)((two_w >> 4) + (0xE0u << 23))) * nk_vsplat(0x1.0p-112f);
    const NK_VF denormalized = nk_vfloat((NK_VI)((two_w >> 17) | (126u << 23))) - nk_vsplat(0.5f);
    const NK_VI is_denormal = (NK_VI)(two_w < (1u << 27));
    const NK_VI r = (NK_VI)sign | (nk_vbits(denormalized) & is_denormal) | (nk_vbits(normalized) & ~is_denormal);
    return nk_vfloat(r);
}

/* nk_f32_to_bf16 (round to nearest even, NaN -> 0x7FC0), lane-wise. */
NK_AI void nk_vstore_bf16(uint16_t *p, NK_VF f) {
    const NK_VU u = (NK_VU)nk_vbits(f);
    const NK_VU rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const NK_VU is_nan = (NK_VU)((u & 0x7FFFFFFFu) > 0x7F800000u);
    const NK_VU r = (is_nan & 0x7FC0u) | (~is_nan & rounded);
    NK_VH h = __builtin_convertvector(r, NK_VH);
    memcpy(p, &h, sizeof h);
}

/* nk_f32_to_f16, lane-wise. */
NK_AI void nk_vstore_f16(uint16_t *p, NK_VF f) {
    const NK_VU w = (NK_VU)nk_vbits(f);
    NK_VF base = (nk_vfloat((NK_VI)(w & 0x7FFFFFFFu)) * nk_vsplat(0x1.0p+112f)) * nk_vsplat(0x1.0p-110f);
    const NK_VU shl1_w = w + w;
    const NK_VU sign = w & 0x80000000u;
    const NK_VU exp_bits_in = shl1_w & 0xFF000000u;
    const NK_VU small = (NK_VU)(exp_bits_in < 0x71000000u);
    const NK_VU bias = (small & 0x71000000u) | (~small & exp_bits_in);
    base = nk_vfloat((NK_VI)((bias >> 1) + 0x07800000u)) + base;
    const NK_VU bits = (NK_VU)nk_vbits(base);
    const NK_VU nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    const NK_VU is_nan = (NK_VU)(shl1_w > 0xFF000000u);
    const NK_VU r = (sign >> 16) | (0x7E00u & is_nan) | (nonsign & ~is_nan);
    NK_VH h = __builtin_convertvector(r, NK_VH);
    memcpy(p, &h, sizeof h);
}

/* dst[0..n) = (float) src[i*s] for a float dtype t (f32, bf16, f16). */
NK_BODY int nk_rgather_body(float *dst, const char *src, int64_t n, int64_t s, nk_dtype t) {
    int64_t i = 0;
    if (s == 1 && t == NK_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return 0;
    }
    if (s == 1 && t == NK_BF16) {
        for (; i + NK_VL <= n; i += NK_VL) nk_vstore(dst + i, nk_vload_bf16((const uint16_t *)src + i));
    } else if (s == 1 && t == NK_F16) {
        for (; i + NK_VL <= n; i += NK_VL) nk_vstore(dst + i, nk_vload_f16((const uint16_t *)src + i));
    }
    const size_t es = nk_dtype_size(t);
    for (; i < n; i++) dst[i] = nk_load_f32(src + i * s * (int64_t)es, t);
    return 0;
}

/* dst[i*s] = (t) src[i], rounding like PyTorch. */
NK_BODY int nk_rscatter_body(char *dst, int64_t s, nk_dtype t, const float *src, int64_t n) {
    int64_t i = 0;
    if (s == 1 && t == NK_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return 0;
    }
    if (s == 1 && t == NK_BF16) {
        for (; i + NK_VL <= n; i += NK_VL) nk_vstore_bf16((uint16_t *)dst + i, nk_vload(src + i));
    } else if (s == 1 && t == NK_F16) {
        for (; i + NK_VL <= n; i += NK_VL) nk_vstore_f16((uint16_t *)dst + i, nk_vload(src + i));
    }
    const size_t es = nk_dtype_size(t);
    for (; i < n; i++) nk_store_f32(dst + i * s * (int64_t)es, t, src[i]);
    return 0;
}

/* Sum in float lanes (4 accumulators), the result in double. */
NK_BODY double nk_sum_body(const float *x, int64_t n) {
    NK_VF a0 = nk_vsplat(0), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 4 * NK_VL <= n; i += 4 * NK_VL) {
        a0 += nk_vload(x + i);
        a1 += nk_vload(x + i + NK_VL);
        a2 += nk_vload(x + i + 2 * NK_VL);
        a3 += nk_vload(x + i + 3 * NK_VL);
    }
    for (; i + NK_VL <= n; i += NK_VL) a0 += nk_vload(x + i);
    double s = (double)nk_vhsum((a0 + a1) + (a2 + a3));
    for (; i < n; i++) s += x[i];
    return s;
}

NK_AI nk_v8f nk_vload8(const float *p) {
    nk_v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* bfloat16 -> float widening loads. GCC lowers the vector-extension zero-extension to shuffles and
 * half-width vpmovzxwd (a third of a bfloat16 sum's time); one vpmovzxwd from memory where available. */
NK_AI nk_v8f nk_vload8_bf16(const uint16_t *p) {
#if defined(__AVX2__)
    return (nk_v8f)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
#else
    typedef uint16_t nk_v8h __attribute__((vector_size(16)));
    typedef uint32_t nk_v8u __attribute__((vector_size(32)));
    nk_v8h hv;
    memcpy(&hv, p, sizeof hv);
    const nk_v8u w = __builtin_convertvector(hv, nk_v8u) << 16;
    nk_v8f v;
    memcpy(&v, &w, sizeof v);
    return v;
#endif
}

/* x * x, each product rounded to float on its own: under fp-contract=fast the adds of the cascade would
 * otherwise absorb the multiply into an FMA (one rounding), and the sum of squares would differ from squaring
 * into a tile and summing it (nki_exec.c folds that pair into one pass and must give its bits). */
NK_AI nk_v8f nk_vsq8(nk_v8f v) {
    nk_v8f p = v * v;
#if defined(__AVX__)
    __asm__("" : "+x"(p));
#else
    __asm__("" : "+m"(p));  /* a 32-byte vector has no SSE register (and no FMA to contract into) */
#endif
    return p;
}

NK_AI float nk_sq1(float v) {
#if defined(__x86_64__) || defined(__i386__)
    float p = v * v;
    __asm__("" : "+x"(p));
    return p;
#else
    volatile float p = v * v;
    return p;
#endif
}

/* The cascade over float or (bf16 == 1) bfloat16 elements, widened as they are loaded (bf16 == 2: the squares
 * of float elements, as nk_vsq8 rounds them): the same sums
 * as gathering a bfloat16 chunk into floats first, without the store and reload of the chunk. R rows
 * (1 or 2, a constant after inlining) of the same length at once, out[r] the sum of xs[r]: one row's
 * adds are 4 chains of dependent vector adds, and a second row's chains fill the adder's latency (a
 * 768-float row is short enough for that latency, not memory, to bound it). Per row, the same adds in
 * the same order. */
NK_AI void nk_sum_cascade_core(const void *const *xs, const int R, int64_t n, const int bf16, float *out) {
#define NK_CASCADE_LOAD(r, v)                                                                              \
    (bf16 == 1 ? nk_vload8_bf16((const uint16_t *)xs[r] + (v) * 8)                                         \
     : bf16 == 2 ? nk_vsq8(nk_vload8((const float *)xs[r] + (v) * 8))                                      \
                 : nk_vload8((const float *)xs[r] + (v) * 8))
    const int64_t nvec = n / 8, groups = nvec / 4;
    int64_t lg = 0;
    while ((INT64_C(1) << lg) < groups) lg++;
    const int64_t power = lg / 4 > 4 ? lg / 4 : 4, step = INT64_C(1) << power, mask = step - 1;
    /* The cascade's levels (a: 0, b: 1, c: 2, d: 3) in variables indexed by constants only, so they live
     * in registers: level 0 indexed by a run-time level lived on the stack and every add waited on a
     * store-to-load forward, and an array of the upper levels was zeroed by `rep stos`. */
    const nk_v8f zero = {0};
    nk_v8f a[2][4], b[2][4], c[2][4], d[2][4];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) a[r][k] = b[r][k] = c[r][k] = d[r][k] = zero;
#define NK_CASCADE_EACH(stmt)                                                                              \
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) stmt
    int64_t i = 0;
    while (i + step <= groups) {
        for (int64_t j = 0; j < step; j++, i++) NK_CASCADE_EACH(a[r][k] += NK_CASCADE_LOAD(r, i * 4 + k));
        NK_CASCADE_EACH((b[r][k] += a[r][k], a[r][k] = zero));
        if ((i & (mask << power)) != 0) continue;
        NK_CASCADE_EACH((c[r][k] += b[r][k], b[r][k] = zero));
        if ((i & (mask << (2 * power))) != 0) continue;
        NK_CASCADE_EACH((d[r][k] += c[r][k], c[r][k] = zero));
    }
    for (; i < groups; i++) NK_CASCADE_EACH(a[r][k] += NK_CASCADE_LOAD(r, i * 4 + k));
    NK_CASCADE_EACH(a[r][k] += b[r][k]);
    NK_CASCADE_EACH(a[r][k] += c[r][k]);
    NK_CASCADE_EACH(a[r][k] += d[r][k]);
#undef NK_CASCADE_EACH
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        for (int64_t v = groups * 4; v < nvec; v++) a[r][0] += NK_CASCADE_LOAD(r, v);
        nk_v8f tot = a[r][0];
        tot += a[r][1];
        tot += a[r][2];
        tot += a[r][3];
#define NK_CASCADE_ELEM(e)                                                                                 \
    (bf16 == 1 ? nk_bf16_to_f32(((const uint16_t *)xs[r])[e])                                              \
     : bf16 == 2 ? nk_sq1(((const float *)xs[r])[e])                                                       \
                 : ((const float *)xs[r])[e])
        float sum = 0;
        if (nvec == 0 && n > 4) {
            /* A row shorter than a vector: PyTorch's row_sum, 4 interleaved partial sums with the elements
             * past the last group of 4 added to the first (sequential order differs for 5-7 elements). */
            sum = NK_CASCADE_ELEM(0);
            for (int64_t e = 4; e < n; e++) sum += NK_CASCADE_ELEM(e);
            for (int64_t e = 1; e < 4; e++) sum += NK_CASCADE_ELEM(e);
            out[r] = sum;
            continue;
        }
        for (int64_t e = nvec * 8; e < n; e++) sum += NK_CASCADE_ELEM(e);
#undef NK_CASCADE_ELEM
        float lanes[8];
        memcpy(lanes, &tot, sizeof lanes);
        for (int l = 0; l < 8; l++) sum += lanes[l];
        out[r] = sum;
    }
#undef NK_CASCADE_LOAD
}

NK_BODY float nk_sum_cascade_body(const float *x, int64_t n) {
    const void *xs[1] = {x};
    float s;
    nk_sum_cascade_core(xs, 1, n, 0, &s);
    return s;
}

NK_BODY float nk_sum_sq_cascade_body(const float *x, int64_t n) {
    const void *xs[1] = {x};
    float s;
    nk_sum_cascade_core(xs, 1, n, 2, &s);
    return s;
}

NK_BODY float nk_sum_cascade_bf16_body(const uint16_t *x, int64_t n) {
    const void *xs[1] = {x};
    float s;
    nk_sum_cascade_core(xs, 1, n, 1, &s);
    return s;
}

/* Two rows of n float (bf16 = 0) or bfloat16 elements at once: out[0], out[1] as nk_sum_cascade*. */
NK_BODY void nk_sum_cascade2_body(const void *x, const void *y, int64_t n, int bf16, float *out) {
    const void *xs[2] = {x, y};
    if (bf16) nk_sum_cascade_core(xs, 2, n, 1, out);
    else nk_sum_cascade_core(xs, 2, n, 0, out);
}

/* Sums of ncols (<= NK_COLTILE) contiguous f32/bf16/f16 columns over `rows` rows rs bytes apart, each
 * column in nk_sum_cascade1's order, into out. Whole row segments are added at a time, so the input is
 * read row after row; the levels are arrays in L1, one add per element and level flush. */
NK_BODY void nk_colsum_body(const char *in, nk_dtype t, int64_t rows, int64_t rs, int64_t ncols, float *out) {
    float acc[4][NK_COLTILE] __attribute__((aligned(64)));
    for (int l = 0; l < 4; l++) memset(acc[l], 0, (size_t)ncols * sizeof(float));
    int64_t lg = 0;
    while ((INT64_C(1) << lg) < rows) lg++;
    const int64_t power = lg / 4 > 4 ? lg / 4 : 4, step = INT64_C(1) << power, mask = step - 1;
    float *restrict a0 = acc[0];
#define NK_COLSUM_ROW(i)                                                                                 \
    do {                                                                                                 \
        const char *r_ = in + (i) * rs;                                                                  \
        if (t == NK_F32) {                                                                               \
            const float *x_ = (const float *)r_;                                                         \
            for (int64_t c = 0; c < ncols; c++) a0[c] += x_[c];                                         \
        } else if (t == NK_BF16) {                                                                       \
            const uint16_t *h_ = (const uint16_t *)r_;                                                   \
            for (int64_t c = 0; c < ncols; c++) a0[c] += nk_bf16_to_f32(h_[c]);                         \
        } else {                                                                                         \
            const uint16_t *h_ = (const uint16_t *)r_;                                                   \
            for (int64_t c = 0; c < ncols; c++) a0[c] += nk_f16_to_f32(h_[c]);                          \
        }                                                                                                \
    } while (0)
    int64_t i = 0;
    while (i + step <= rows) {
        for (int64_t j = 0; j < step; j++, i++) NK_COLSUM_ROW(i);
        for (int l = 1; l < 4; l++) {
            for (int64_t c = 0; c < ncols; c++) {
                acc[l][c] += acc[l - 1][c];
                acc[l - 1][c] = 0;
            }
            if ((i & (mask << (l * power))) != 0) break;
        }
    }
    for (; i < rows; i++) NK_COLSUM_ROW(i);
#undef NK_COLSUM_ROW
    for (int64_t c = 0; c < ncols; c++) out[c] = ((acc[0][c] + acc[1][c]) + acc[2][c]) + acc[3][c];
}

/* Sum of (x - c)^2. */
NK_BODY double nk_sumsqdev_body(const float *x, int64_t n, float c) {
    NK_VF a0 = nk_vsplat(0), a1 = a0;
    const NK_VF vc = nk_vsplat(c);
    int64_t i = 0;
    for (; i + 2 * NK_VL <= n; i += 2 * NK_VL) {
        NK_VF d0 = nk_vload(x + i) - vc, d1 = nk_vload(x + i + NK_VL) - vc;
        a0 += d0 * d0;
        a1 += d1 * d1;
    }
    for (; i + NK_VL <= n; i += NK_VL) {
        NK_VF d = nk_vload(x + i) - vc;
        a0 += d * d;
    }
    double s = (double)nk_vhsum(a0 + a1);
    for (; i < n; i++) s += (double)((x[i] - c) * (x[i] - c));
    return s;
}

/* Sum of a[i]*b[i]. */
NK_BODY double nk_dot_body(const float *a, const float *b, int64_t n) {
    NK_VF a0 = nk_vsplat(0), a1 = a0;
    int64_t i = 0;
    for (; i + 2 * NK_VL <= n; i += 2 * NK_VL) {
        a0 += nk_vload(a + i) * nk_vload(b + i);
        a1 += nk_vload(a + i + NK_VL) * nk_vload(b + i + NK_VL);
    }
    for (; i + NK_VL <= n; i += NK_VL) a0 += nk_vload(a + i) * nk_vload(b + i);
    double s = (double)nk_vhsum(a0 + a1);
    for (; i < n; i++) s += (double)(a[i] * b[i]);
    return s;
}

/*
 * Max (or min) with the index of its first occurrence; a NaN wins (the first NaN). Each lane keeps
 * its best value and the index where it saw it; a strictly better value or a first NaN replaces it.
 */
NK_BODY float nk_maxidx_body(const float *x, int64_t n, int is_max, int64_t *idx) {
    if (n < NK_VL) {
        float best = x[0];
        int64_t bi = 0;
        for (int64_t i = 1; i < n; i++) {
            const float v = x[i];
            if (best != best) break;
            if (v != v || (is_max ? v > best : v < best)) {
                best = v;
                bi = i;
            }
        }
        *idx = bi;
        return best;
    }
    NK_VF bv = nk_vload(x);
    const NK_VI lane = NK_LANES;
    NK_VI bi = lane;
    int64_t i = NK_VL;
    /* Lane indices are int32: the caller splits rows longer than 2^30. */
    for (; i + NK_VL <= n; i += NK_VL) {
        const NK_VF v = nk_vload(x + i);
        const NK_VI better = is_max ? (v > bv) : (v < bv);
        const NK_VI take = better | (NK_VISNAN(v) & ~NK_VISNAN(bv));
        bv = nk_vsel(take, v, bv);
        bi = (take & (lane + (int32_t)i)) | (~take & bi);
    }
    float tv[NK_VL];
    int32_t ti[NK_VL];
    nk_vstore(tv, bv);
    memcpy(ti, &bi, sizeof ti);
    float best = tv[0];
    int64_t besti = ti[0];
    for (int l = 1; l < NK_VL; l++) {
        const float v = tv[l];
        const bool bn = best != best, vn = v != v;
        bool take;
        if (bn || vn)
            take = vn && (!bn || ti[l] < besti);
        else
            take = (is_max ? v > best : v < best) || (v == best && ti[l] < besti);
        if (take) {
            best = v;
            besti = ti[l];
        }
    }
    for (; i < n && best == best; i++) {
        const float v = x[i];
        if (v != v || (is_max ? v > best : v < best)) {
            best = v;
            besti = i;
        }
    }
    *idx = besti;
    return best;
}

/* Max (or min) value only, NaN propagating. */
/* max (is_max) or min of float (bf16 = 0) or bfloat16 elements, widened as loaded; NaN if any is. */
NK_AI float nk_max_core(const void *xv, int64_t n, int is_max, const int bf16) {
    const float *x = (const float *)xv;
    const uint16_t *h = (const uint16_t *)xv;
#define NK_MAX_LOAD(i) (bf16 ? nk_vload_bf16(h + (i)) : nk_vload(x + (i)))
#define NK_MAX_ELEM(i) (bf16 ? nk_bf16_to_f32(h[i]) : x[i])
/* v > b ? v : b (v < b ? v : b for min) is exactly vmaxps (vminps) v, b; NaNs are tracked apart. */
#if defined(__AVX2__) && !defined(__AVX512F__)
#define NK_MAX_SEL(v, b) ((NK_VF)(is_max ? _mm256_max_ps((__m256)(v), (__m256)(b)) : _mm256_min_ps((__m256)(v), (__m256)(b))))
#define NK_MAX_NAN(v) ((NK_VI)_mm256_castps_si256(_mm256_cmp_ps((__m256)(v), (__m256)(v), _CMP_UNORD_Q)))
#else
#define NK_MAX_SEL(v, b) nk_vsel(is_max ? ((v) > (b)) : ((v) < (b)), (v), (b))
#define NK_MAX_NAN(v) NK_VISNAN(v)
#endif
    NK_VF b0 = nk_vsplat(is_max ? -INFINITY : INFINITY), b1 = b0;
    NK_VI nan = {0};
    int64_t i = 0;
    for (; i + 2 * NK_VL <= n; i += 2 * NK_VL) {
        const NK_VF v0 = NK_MAX_LOAD(i), v1 = NK_MAX_LOAD(i + NK_VL);
        nan |= NK_MAX_NAN(v0) | NK_MAX_NAN(v1);
        b0 = NK_MAX_SEL(v0, b0);
        b1 = NK_MAX_SEL(v1, b1);
    }
    b0 = NK_MAX_SEL(b1, b0);
    for (; i + NK_VL <= n; i += NK_VL) {
        const NK_VF v = NK_MAX_LOAD(i);
        nan |= NK_MAX_NAN(v);
        b0 = NK_MAX_SEL(v, b0);
    }
    float t[NK_VL];
    int32_t tn[NK_VL];
    nk_vstore(t, b0);
    memcpy(tn, &nan, sizeof tn);
    float best = is_max ? -INFINITY : INFINITY;
    bool any_nan = false;
    for (int l = 0; l < NK_VL; l++) {
        any_nan |= tn[l] != 0;
        if (is_max ? t[l] > best : t[l] < best) best = t[l];
    }
    for (; i < n; i++) {
        const float v = NK_MAX_ELEM(i);
        any_nan |= v != v;
        if (is_max ? v > best : v < best) best = v;
    }
#undef NK_MAX_LOAD
#undef NK_MAX_ELEM
#undef NK_MAX_SEL
#undef NK_MAX_NAN
    return any_nan ? NAN : best;
}

NK_BODY float nk_max_body(const float *x, int64_t n, int is_max) { return nk_max_core(x, n, is_max, 0); }

NK_BODY float nk_max_bf16_body(const uint16_t *x, int64_t n, int is_max) { return nk_max_core(x, n, is_max, 1); }

/* dst[i] = exp(x[i] - c) (dst may be x); returns the sum in double. */
NK_BODY double nk_expsub_body(float *dst, const float *x, int64_t n, float c) {
    NK_VF a0 = nk_vsplat(0);
    const NK_VF vc = nk_vsplat(c);
    int64_t i = 0;
    for (; i + NK_VL <= n; i += NK_VL) {
        const NK_VF e = nk_vexp(nk_vload(x + i) - vc);
        if (dst) nk_vstore(dst + i, e);
        a0 += e;
    }
    double s = (double)nk_vhsum(a0);
    for (; i < n; i++) {
        const float e = nk_exp_f32(x[i] - c);
        if (dst) dst[i] = e;
        s += e;
    }
    return s;
}

/* dst[i] = x[i] * a + b */
NK_BODY int nk_axpb_body(float *dst, const float *x, int64_t n, float a, float b) {
    const NK_VF va = nk_vsplat(a), vb = nk_vsplat(b);
    int64_t i = 0;
    for (; i + NK_VL <= n; i += NK_VL) nk_vstore(dst + i, nk_vload(x + i) * va + vb);
    for (; i < n; i++) dst[i] = x[i] * a + b;
    return 0;
}

/* dst = y * (g - d) */
NK_BODY int nk_smbwd_body(float *dst, const float *y, const float *g, int64_t n, float d) {
    const NK_VF vd = nk_vsplat(d);
    int64_t i = 0;
    for (; i + NK_VL <= n; i += NK_VL) nk_vstore(dst + i, nk_vload(y + i) * (nk_vload(g + i) - vd));
    for (; i < n; i++) dst[i] = y[i] * (g[i] - d);
    return 0;
}

/* dst = g - exp(y) * s */
NK_BODY int nk_lsmbwd_body(float *dst, const float *y, const float *g, int64_t n, float s) {
    const NK_VF vs = nk_vsplat(s);
    int64_t i = 0;
    for (; i + NK_VL <= n; i += NK_VL) nk_vstore(dst + i, nk_vload(g + i) - nk_vexp(nk_vload(y + i)) * vs);
    for (; i < n; i++) dst[i] = g[i] - nk_exp_f32(y[i]) * s;
    return 0;
}

/* dst = (x * a + c) * w + b; w and/or b may be NULL. */
NK_BODY int nk_affine_body(float *dst, const float *x, int64_t n, float a, float c, const float *w, const float *b) {
    const NK_VF va = nk_vsplat(a), vc = nk_vsplat(c);
    int64_t i = 0;
    if (w && b) {
        for (; i + NK_VL <= n; i += NK_VL) nk_vstore(dst + i, (nk_vload(x + i) * va + vc) * nk_vload(w + i) + nk_vload(b + i));
        for (; i < n; i++) dst[i] = (x[i] * a + c) * w[i] + b[i];
    } else if (w) {
        for (; i + NK_VL <= n; i += NK_VL) nk_vstore(dst + i, (nk_vload(x + i) * va + vc) * nk_vload(w + i));
        for (; i < n; i++) dst[i] = (x[i] * a + c) * w[i];
    } else if (b) {
        for (; i + NK_VL <= n; i += NK_VL) nk_vstore(dst + i, (nk_vload(x + i) * va + vc) + nk_vload(b + i));
        for (; i < n; i++) dst[i] = (x[i] * a + c) + b[i];
    } else {
        for (; i + NK_VL <= n; i += NK_VL) nk_vstore(dst + i, nk_vload(x + i) * va + vc);
        for (; i < n; i++) dst[i] = x[i] * a + c;
    }
    return 0;
}

/* dst = x * a * w (RMS norm: the input times rstd, then the weight, as PyTorch rounds it). */
NK_BODY int nk_scalew_body(float *dst, const float *x, int64_t n, float a, const float *w) {
    const NK_VF va = nk_vsplat(a);
    int64_t i = 0;
    if (w) {
        for (; i + NK_VL <= n; i += NK_VL) nk_vstore(dst + i, (nk_vload(x + i) * va) * nk_vload(w + i));
        for (; i < n; i++) dst[i] = (x[i] * a) * w[i];
    } else {
        for (; i + NK_VL <= n; i += NK_VL) nk_vstore(dst + i, nk_vload(x + i) * va);
        for (; i < n; i++) dst[i] = x[i] * a;
    }
    return 0;
}

/* g = dy * w (w may be NULL); xh = (x - mu) * r. */
NK_BODY int nk_gxh_body(float *g, float *xh, const float *dy, const float *w, const float *x, int64_t n, float mu, float r) {
    const NK_VF vm = nk_vsplat(mu), vr = nk_vsplat(r);
    int64_t i = 0;
    for (; i + NK_VL <= n; i += NK_VL) {
        NK_VF d = nk_vload(dy + i);
        if (w) d *= nk_vload(w + i);
        nk_vstore(g + i, d);
        nk_vstore(xh + i, (nk_vload(x + i) - vm) * vr);
    }
    for (; i < n; i++) {
        g[i] = w ? dy[i] * w[i] : dy[i];
        xh[i] = (x[i] - mu) * r;
    }
    return 0;
}

/* dst = r * (g - a - xh * b) */
NK_BODY int nk_dxrow_body(float *dst, const float *g, const float *xh, int64_t n, float r, float a, float b) {
    const NK_VF vr = nk_vsplat(r), va = nk_vsplat(a), vb = nk_vsplat(b);
    int64_t i = 0;
    for (; i + NK_VL <= n; i += NK_VL) nk_vstore(dst + i, vr * (nk_vload(g + i) - va - nk_vload(xh + i) * vb));
    for (; i < n; i++) dst[i] = r * (g[i] - a - xh[i] * b);
    return 0;
}

#undef nk_vload
#undef nk_vstore
#undef nk_vsplat
#undef nk_vbits
#undef nk_vfloat
#undef nk_vsel
#undef nk_vhsum
#undef nk_vexp
#undef nk_vload_bf16
#undef nk_vload_f16
#undef nk_vstore_bf16
#undef nk_vstore_f16
#undef nk_vload8
#undef nk_rgather_body
#undef nk_rscatter_body
#undef nk_sum_body
#undef nk_sum_cascade_body
#undef nk_sum_sq_cascade_body
#undef nk_vsq8
#undef nk_sq1
#undef nk_sum_cascade_core
#undef nk_sum_cascade_bf16_body
#undef nk_colsum_body
#undef nk_sum_cascade2_body
#undef nk_vload8_bf16
#undef nk_sumsqdev_body
#undef nk_dot_body
#undef nk_maxidx_body
#undef nk_max_body
#undef nk_max_core
#undef nk_max_bf16_body
#undef nk_expsub_body
#undef nk_axpb_body
#undef nk_smbwd_body
#undef nk_lsmbwd_body
#undef nk_affine_body
#undef nk_scalew_body
#undef nk_gxh_body
#undef nk_dxrow_body
#undef NK_SFX
#undef NK_SFX2
#undef NK_VL
#undef NK_VF
#undef NK_VI
#undef NK_VU
#undef NK_VH
#undef NK_LANES
