/*
 * conv_winograd.c - 3x3 stride-1 convolution by Winograd's F(4x4, 3x3): each 6x6 input tile d gives a 4x4
 * output tile as A^T [(G g G^T) . (B^T d B)] A, so the 9 multiply-adds per output pixel and input channel
 * become 36 per 16 pixels (2.25 per pixel, 4x fewer), carried out as 36 independent GEMMs
 * M[xi] = U[xi] . V[xi] over (output channel x input channel) x (input channel x tile).
 *
 * Why this shape of loop: a VAE convolution's transformed image V and product M are each 2.25x the
 * image, so materialising them whole for 36 library GEMMs would stream them through memory twice. Instead
 * a task takes a block of tiles: it transforms them straight into the GEMM micro-kernel's packed B layout
 * (no packing pass), runs the 36 products with the micro-kernel of gemm.c on the packed transformed weight
 * U, and transforms its block of M back into the output while it is still in cache. The weight is
 * transformed once per call, already in the micro-kernel's packed A layout.
 *
 * F(4x4, 3x3) rather than F(6x6, 3x3), whose error grows past the fp32 tolerance; F(2x2, 3x3) (2.25x fewer
 * multiplies, more accurate) was not needed: F(4, 3)'s error (DEVELOPING.md) stays inside that tolerance.
 */
#include "gemm_internal.h"

#include <stdlib.h>

#define WT 6 /* input tile side */
#define WO 4 /* output tile side */
#define WX 36 /* transformed values per tile */
#define LN 8  /* tiles transformed together: one 8-lane vector */

typedef float v8 __attribute__((vector_size(32)));

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define WINO_HAVE_AVX2 1
#define WINO_AVX2 __attribute__((target("avx2,fma")))
#else
#define WINO_HAVE_AVX2 0
#endif
#define WINO_INLINE static inline __attribute__((always_inline))

WINO_INLINE v8 ld8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

WINO_INLINE void st8(float *p, v8 v) {
    memcpy(p, &v, sizeof v);
}

WINO_INLINE v8 splat(float f) {
    return (v8){f, f, f, f, f, f, f, f};
}

/* Element i of a F32/BF16/F16 array, widened to fp32 (exact). The transforms and products then run in fp32
 * and only the output is rounded back, once, as PyTorch's CPU convolution does for bf16/fp16 (fp32
 * accumulation, one rounding). dt is a constant wherever these are inlined (per-dtype instances below). */
WINO_INLINE float ld_el(const char *p, int64_t i, nk_dtype dt) {
    switch (dt) {
    case NK_BF16: return nk_bf16_to_f32(((const uint16_t *)(const void *)p)[i]);
    case NK_F16: return nk_f16_to_f32(((const uint16_t *)(const void *)p)[i]);
    default: return ((const float *)(const void *)p)[i];
    }
}

WINO_INLINE void st_el(char *p, int64_t i, float v, nk_dtype dt) {
    switch (dt) {
    case NK_BF16: ((uint16_t *)(void *)p)[i] = nk_f32_to_bf16(v); break;
    case NK_F16: ((uint16_t *)(void *)p)[i] = nk_f32_to_f16(v); break;
    default: ((float *)(void *)p)[i] = v; break;
    }
}

/*
 * The transforms interpolate at 0, 1, -1, 1/2, -2 and infinity rather than the usual 0, +-1, +-2: simulated
 * in fp32 over 256 channels of unit inputs (weights scaled by 1/sqrt(9C)), the largest error against float64
 * fell from 3.4e-5 to 1.1e-5 and the mean from 8.7e-6 to 4.4e-6 (+-1/2 alone: 2.8e-5; 1/2 and 2: 3.1e-5).
 * Matrices from the Lagrange basis of those points (B^T rows: the basis polynomials' coefficients).
 */
static const float WBT[WT][WT] = {
    {1.f, -1.5f, -2.f, 1.5f, 1.f, 0.f}, {0.f, -1.f, 0.5f, 2.5f, 1.f, 0.f}, {0.f, 1.f, -2.5f, 0.5f, 1.f, 0.f},
    {0.f, -2.f, -1.f, 2.f, 1.f, 0.f},   {0.f, 0.5f, -1.f, -0.5f, 1.f, 0.f}, {0.f, 1.f, -1.5f, -2.f, 1.5f, 1.f},
};
static const float WAT[WO][WT] = {
    {1.f, 1.f, 1.f, 1.f, 1.f, 0.f},
    {0.f, 1.f, -1.f, 0.5f, -2.f, 0.f},
    {0.f, 1.f, 1.f, 0.25f, 4.f, 0.f},
    {0.f, 1.f, -1.f, 0.125f, -8.f, 1.f},
};

/* out[i * os] = sum_k mat[i][k] in[k * is] for a constant rows x cols matrix: unrolled, the zero entries
 * drop out at compile time (the first nonzero term starts the sum, so no 0 + x is left) and the units fold. */
#define WINO_MATVEC(mat, rows, cols, in, is, out, os)                            \
    do {                                                                         \
        _Pragma("GCC unroll 6") for (int i_ = 0; i_ < (rows); i_++) {           \
            v8 acc_ = splat(0.f);                                                \
            bool first_ = true;                                                  \
            _Pragma("GCC unroll 6") for (int k_ = 0; k_ < (cols); k_++) {        \
                const float m_ = (mat)[i_][k_];                                  \
                if (m_ == 0.f) continue;                                         \
                const v8 t_ = m_ == 1.f ? (in)[k_ * (is)]                        \
                                        : (m_ == -1.f ? -(in)[k_ * (is)] : splat(m_) * (in)[k_ * (is)]); \
                acc_ = first_ ? t_ : acc_ + t_;                                  \
                first_ = false;                                                  \
            }                                                                    \
            (out)[i_ * (os)] = acc_;                                             \
        }                                                                        \
    } while (0)

typedef struct wino_ctx {
    int64_t N, C, H, W, OC, OH, OW, ph, pw;
    int64_t tiles_h, tiles_w, tiles; /* per image: tiles_h * tiles_w; all images: tiles */
    /* in/out/bias share dtype dt, the weight has wdt (F32, BF16, F16); element offsets, not bytes */
    const char *in;
    int64_t isn, isc, ish, isw;
    char *out;
    int64_t osn, osc, osh, osw;
    const char *wt;
    int64_t wso, wsc, wsh, wsw;
    const char *bias;
    int64_t bs;
    nk_dtype dt, wdt;
    float *U;           /* [36][ocp / mr] A panels of round16(C * mr) floats, U[xi] uxs floats apart */
    int64_t uxs, vxs, mxs; /* floats from one xi to the next in U, V and M */
    int64_t ocp, apan;  /* output channels rounded up to mr; floats per A panel */
    int64_t tb, np;     /* tiles per block (a multiple of nr), B panels per block */
    int64_t osplit;     /* tasks per block, each with a share of the output channels' A panels */
    int64_t mr, nr;
    nk_gemm_ukr_fn ukr;
    bool avx2;
    nk_status status;
} wino_ctx;

/* ---- weight: U = G g G^T, stored as the micro-kernel's packed A panels ---------------------------- */

/* G x for x = (a0, a1, a2), G's rows (1, 0, 0), (1, 1, 1)/3, (-1, 1, -1)/3, (-16, -8, -4)/15, (1, -2, 4)/15,
 * (0, 0, 1) with their common factors taken out (as a constant matrix-vector product the weight transform
 * cost a 512->512 convolution at 32x32 ~10% more). */
WINO_INLINE void g_times(v8 a0, v8 a1, v8 a2, v8 *o, int step) {
    const v8 s = a0 + a2, third = splat(1.f / 3), m4_15 = splat(-4.f / 15), p1_15 = splat(1.f / 15);
    o[0] = a0;
    o[step] = (s + a1) * third;
    o[2 * step] = (a1 - s) * third;
    o[3 * step] = (splat(4.f) * a0 + splat(2.f) * a1 + a2) * m4_15;
    o[4 * step] = (a0 - splat(2.f) * a1 + splat(4.f) * a2) * p1_15;
    o[5 * step] = a2;
}

/* A panels [begin, end) of every U[xi], WC input channels at a time through a local buffer, so each of the
 * 36 destinations gets whole cache lines in order (stores spread over 36 streams one float at a time
 * missed on every line: 3/4 of the weight transform's time). The lanes are 8 output channels of a panel,
 * whose values lie side by side in the packed layout: lanes past the panel's mr rows spill into the next
 * channel's slots (or the buffer's slack), which later stores overwrite. Vector lanes and products for
 * G's divisions: the scalar loop with divides had been half of a 512-channel 16x16 convolution's time. */
#define WC 8
WINO_INLINE void weight_panels(const wino_ctx *x, int64_t begin, int64_t end, nk_dtype wdt) {
    const int64_t mr = x->mr;
    float buf[WX][WC * NK_GEMM_MR_MAX + LN];
    for (int64_t ob = begin; ob < end; ob++)
        for (int64_t c0 = 0; c0 < x->C; c0 += WC) {
            const int64_t cn = x->C - c0 < WC ? x->C - c0 : WC;
            for (int64_t c = 0; c < cn; c++)
                for (int64_t r0 = 0; r0 < mr; r0 += LN) {
                    float g[9][LN];
                    for (int l = 0; l < LN; l++) {
                        const int64_t oc = ob * mr + r0 + l;
                        /* rows past OC (the last panel's padding) are zeros: their products are never read */
                        const bool live = r0 + l < mr && oc < x->OC;
                        const int64_t p = live ? oc * x->wso + (c0 + c) * x->wsc : 0;
                        for (int i = 0; i < 3; i++)
                            for (int j = 0; j < 3; j++)
                                g[i * 3 + j][l] = live ? ld_el(x->wt, p + i * x->wsh + j * x->wsw, wdt) : 0.f;
                    }
                    v8 gv[9], t[WT * 3], u[WX]; /* g[i*3 + j]; G g: t[i*3 + j]; G g G^T: u[i*6 + k] */
                    for (int k = 0; k < 9; k++) gv[k] = ld8(g[k]);
                    for (int j = 0; j < 3; j++) g_times(gv[j], gv[3 + j], gv[6 + j], t + j, 3);
                    for (int i = 0; i < WT; i++) g_times(t[i * 3], t[i * 3 + 1], t[i * 3 + 2], u + i * WT, 1);
                    for (int xi = 0; xi < WX; xi++) st8(buf[xi] + c * mr + r0, u[xi]);
                }
            for (int xi = 0; xi < WX; xi++)
                memcpy(x->U + xi * x->uxs + ob * x->apan + c0 * mr, buf[xi], (size_t)(cn * mr) * sizeof(float));
        }
}

/* One instance per weight dtype, so the element loads compile to plain loads / shifts. */
#define WINO_BY_DTYPE(dt, call)                    \
    do {                                           \
        switch (dt) {                              \
        case NK_BF16: call(NK_BF16); break;        \
        case NK_F16: call(NK_F16); break;          \
        default: call(NK_F32); break;              \
        }                                          \
    } while (0)

static void weight_range(void *vctx, int64_t begin, int64_t end) {
    const wino_ctx *x = vctx;
#define WINO_W(d) weight_panels(x, begin, end, d)
    WINO_BY_DTYPE(x->wdt, WINO_W);
}

/* ---- input: V = B^T d B for a block of tiles, as packed B panels [36][np][C][nr] ------------------ */

/* Where tile t of the whole batch starts in the input (may lie in the padding). */
typedef struct tile_pos {
    int64_t n, y0, x0;
} tile_pos;

WINO_INLINE tile_pos tile_at(const wino_ctx *x, int64_t t) {
    const int64_t per = x->tiles_h * x->tiles_w, n = t / per, r = t % per;
    return (tile_pos){n, r / x->tiles_w * WO - x->ph, r % x->tiles_w * WO - x->pw};
}

/* The 8 tiles [t0, t0 + 8) of the block (those past the batch's last tile: zeros), all channels, into
 * lanes [l0, l0 + 8) of B panel `p`. */
WINO_INLINE void input_lanes(const wino_ctx *x, float *V, int64_t p, int64_t l0, int64_t t0, nk_dtype dt) {
    const int64_t C = x->C, nr = x->nr;
    tile_pos pos[LN];
    bool inside[LN], live[LN];
    for (int l = 0; l < LN; l++) {
        live[l] = t0 + l < x->tiles;
        pos[l] = live[l] ? tile_at(x, t0 + l) : (tile_pos){0, 0, 0};
        inside[l] = live[l] && pos[l].y0 >= 0 && pos[l].x0 >= 0 && pos[l].y0 + WT <= x->H && pos[l].x0 + WT <= x->W;
    }
    const int64_t ish = x->ish, isw = x->isw;
    for (int64_t c = 0; c < C; c++) {
        float d[WT][WT][LN];
        for (int l = 0; l < LN; l++) {
            if (!live[l]) {
                for (int i = 0; i < WT; i++)
                    for (int j = 0; j < WT; j++) d[i][j][l] = 0.f;
                continue;
            }
            const int64_t src = pos[l].n * x->isn + c * x->isc;
            if (inside[l]) {
                const int64_t s = src + pos[l].y0 * ish + pos[l].x0 * isw;
                for (int i = 0; i < WT; i++)
                    for (int j = 0; j < WT; j++) d[i][j][l] = ld_el(x->in, s + i * ish + j * isw, dt);
            } else {
                for (int i = 0; i < WT; i++) {
                    const int64_t y = pos[l].y0 + i;
                    for (int j = 0; j < WT; j++) {
                        const int64_t xx = pos[l].x0 + j;
                        d[i][j][l] =
                            y >= 0 && y < x->H && xx >= 0 && xx < x->W ? ld_el(x->in, src + y * ish + xx * isw, dt) : 0.f;
                    }
                }
            }
        }
        v8 q[WT][WT], t[WT][WT], r[WT][WT];
        for (int i = 0; i < WT; i++)
            for (int j = 0; j < WT; j++) q[i][j] = ld8(d[i][j]);
        for (int j = 0; j < WT; j++) WINO_MATVEC(WBT, WT, WT, &q[0][j], WT, &t[0][j], WT); /* B^T d */
        for (int i = 0; i < WT; i++) WINO_MATVEC(WBT, WT, WT, t[i], 1, r[i], 1);          /* (B^T d) B */
        for (int i = 0; i < WT; i++)
            for (int j = 0; j < WT; j++) st8(V + (i * WT + j) * x->vxs + (p * C + c) * nr + l0, r[i][j]);
    }
}

/* ---- output: y = A^T m A (+ bias) for a block of tiles ------------------------------------------- */

WINO_INLINE void output_lanes(const wino_ctx *x, const float *M, int64_t col, int64_t t0, int64_t oc0, int64_t oc1,
                              nk_dtype dt) {
    const int64_t tb = x->tb;
    tile_pos pos[LN];
    int nl = 0;
    for (int l = 0; l < LN && t0 + l < x->tiles; l++, nl++) pos[l] = tile_at(x, t0 + l);
    for (int64_t oc = oc0; oc < oc1; oc++) {
        v8 m[WX], t[WO][WT];
        for (int xi = 0; xi < WX; xi++) m[xi] = ld8(M + xi * x->mxs + oc * tb + col);
        for (int j = 0; j < WT; j++) WINO_MATVEC(WAT, WO, WT, &m[j], WT, &t[0][j], WT); /* A^T m */
        float y[WO][WO][LN];
        const v8 b = splat(x->bias != NULL ? ld_el(x->bias, oc * x->bs, dt) : 0.f);
        for (int i = 0; i < WO; i++) {
            v8 o[WO];
            WINO_MATVEC(WAT, WO, WT, t[i], 1, o, 1); /* (A^T m) A */
            for (int j = 0; j < WO; j++) st8(y[i][j], o[j] + b);
        }
        for (int l = 0; l < nl; l++) {
            const int64_t oy = pos[l].y0 + x->ph, ox = pos[l].x0 + x->pw; /* the tile's first output pixel */
            const int64_t dst = pos[l].n * x->osn + oc * x->osc;
            const int hi = x->OH - oy < WO ? (int)(x->OH - oy) : WO, wi = x->OW - ox < WO ? (int)(x->OW - ox) : WO;
            for (int i = 0; i < hi; i++)
                for (int j = 0; j < wi; j++) st_el(x->out, dst + (oy + i) * x->osh + (ox + j) * x->osw, y[i][j][l], dt);
        }
    }
}

/* ---- a block: transform in, 36 products, transform out ------------------------------------------ */

/* Task `task`: block task / osplit, its share task % osplit of the A panels. Few blocks (a small image)
 * would leave threads idle, so the output channels are split too, each share transforming the block's
 * input again (a small cost beside its GEMMs). */
WINO_INLINE void run_block(const wino_ctx *x, int64_t task, float *V, float *M, nk_dtype dt) {
    const int64_t blk = task / x->osplit, part = task % x->osplit;
    const int64_t t_base = blk * x->tb, nr = x->nr, mr = x->mr, np = x->np, nob = x->ocp / mr;
    const int64_t ob0 = nob * part / x->osplit, ob1 = nob * (part + 1) / x->osplit;
    const int64_t oc0 = ob0 * mr, oc1 = ob1 * mr < x->OC ? ob1 * mr : x->OC;
    for (int64_t p = 0; p < np; p++)
        for (int64_t l0 = 0; l0 < nr; l0 += LN) input_lanes(x, V, p, l0, t_base + p * nr + l0, dt);
    nk_gemm_prefetch none;
    memset(&none, 0, sizeof none);
    /* One A panel (an mr-row slice of U[xi]) meets every B panel of the block while it is in L1/L2; the
     * block's V[xi] (C x tb) stays in L2 across the A panels. */
    for (int64_t xi = 0; xi < WX; xi++)
        for (int64_t ob = ob0; ob < ob1; ob++) {
            const float *pa = x->U + xi * x->uxs + ob * x->apan;
            for (int64_t p = 0; p < np; p++)
                x->ukr(x->C, pa, V + xi * x->vxs + p * x->C * nr, M + xi * x->mxs + ob * mr * x->tb + p * nr, x->tb,
                       false, &none);
        }
    for (int64_t col = 0; col < x->tb && t_base + col < x->tiles; col += LN) output_lanes(x, M, col, t_base + col, oc0, oc1, dt);
}

#define WINO_RUN(d)                                    \
    for (; b < e; b++) run_block(x, b, V, M, d)
static void run_blocks_plain(const wino_ctx *x, int64_t b, int64_t e, float *V, float *M) {
    WINO_BY_DTYPE(x->dt, WINO_RUN);
}

#if WINO_HAVE_AVX2
WINO_AVX2 static void run_blocks_avx2(const wino_ctx *x, int64_t b, int64_t e, float *V, float *M) {
    WINO_BY_DTYPE(x->dt, WINO_RUN);
}
WINO_AVX2 static void weight_range_avx2(void *vctx, int64_t begin, int64_t end) {
    const wino_ctx *x = vctx;
    WINO_BY_DTYPE(x->wdt, WINO_W);
}
#endif

/* Scratch kept per thread between calls: fresh pages for the transformed weight and tiles (tens of MB)
 * cost every call their page faults and zeroing (~10% of a 512-channel 64x64 convolution). Blocks above
 * SCRATCH_KEEP floats are freed after the call rather than held. */
#define SCRATCH_KEEP ((size_t)16 << 20)
typedef struct scratch {
    float *p;
    size_t cap;
} scratch;
static _Thread_local scratch t_tiles, t_weight;

static float *scratch_get(scratch *s, size_t floats) {
    if (floats > s->cap) {
        free(s->p);
        s->p = aligned_alloc(64, ((floats * sizeof(float)) + 63) & ~(size_t)63);
        s->cap = s->p != NULL ? floats : 0;
    }
    return s->p;
}

static void scratch_trim(scratch *s) {
    if (s->cap > SCRATCH_KEEP) {
        free(s->p);
        s->p = NULL, s->cap = 0;
    }
}

static void block_range(void *vctx, int64_t begin, int64_t end) {
    wino_ctx *x = vctx;
    const size_t vn = (size_t)(WX * x->vxs), mn = (size_t)(WX * x->mxs);
    float *V = scratch_get(&t_tiles, vn + mn);
    if (V == NULL) {
        __atomic_store_n(&x->status, NK_NO_MEMORY, __ATOMIC_RELAXED);
        return;
    }
    float *M = V + vn; /* vn is a multiple of 16 floats (nr is) */
#if WINO_HAVE_AVX2
    if (x->avx2) run_blocks_avx2(x, begin, end, V, M);
    else
#endif
        run_blocks_plain(x, begin, end, V, M);
    scratch_trim(&t_tiles);
}

/* Tiles per task's block: at most 64. Larger blocks reuse each A panel (streamed from U, 38 MB at 512
 * channels) over more B panels, smaller ones keep the block's V and M (36 x (C + OC) x tb floats) nearer the
 * core; one thread on a Zen 4, 512->512 at 64x64 and 128->128 at 256x256 ran fastest at 64 (32: 0.8-1.0x,
 * 96-192: 0.6-1.0x of that, on a noisy host). Fewer tiles than that per thread: one block per thread. */
static int64_t block_tiles(int64_t tiles, int64_t nr, int threads) {
    const int64_t cap = 64 > nr ? 64 : nr;
    const int64_t per = (tiles + threads - 1) / threads;
    const int64_t tb = (per + nr - 1) / nr * nr;
    return tb > cap ? cap / nr * nr : tb;
}

/* The micro-kernel family gemm.c runs (nk_gemm_isa_force included), by its public name. */
static const nk_gemm_isa *current_isa(void) {
    const char *name = nk_gemm_isa_name();
    if (strcmp(name, "avx512") == 0) return &nk_gemm_isa_avx512;
    if (strcmp(name, "avx2") == 0) return &nk_gemm_isa_avx2;
    return &nk_gemm_isa_generic;
}

static bool float_dtype(nk_dtype t) {
    return t == NK_F32 || t == NK_BF16 || t == NK_F16;
}

/* The transformed weight's layout for OC x C channels under the micro-kernel family isa. */
static void u_layout(wino_ctx *x, int64_t OC, int64_t C, const nk_gemm_isa *isa) {
    x->OC = OC, x->C = C;
    x->mr = isa->mr, x->nr = isa->nr, x->ukr = isa->ukr;
    x->avx2 = strcmp(isa->name, "generic") != 0;
    x->ocp = (OC + x->mr - 1) / x->mr * x->mr;
    x->apan = (C * x->mr + 15) / 16 * 16;
    /* The 36 slices of U, V and M are one cache line further apart than they need to be: slices a power
     * of two apart (128 KB for V at 512 channels) put all 36 streams of a transform in one cache set. */
    x->uxs = x->ocp / x->mr * x->apan + 16;
}

/* A weight [OC, C, 3, 3] of a float dtype: its strides into x. */
static nk_status weight_args(wino_ctx *x, const nk_tensor *weight) {
    int64_t n;
    nk_status st = nk_tensor_check(weight, &n);
    if (st != NK_SUCCESS) return st;
    if (weight->ndim != 4) return NK_INVALID;
    if (!float_dtype(weight->dtype)) return NK_UNSUPPORTED;
    if (weight->sizes[2] != 3 || weight->sizes[3] != 3) return NK_INVALID;
    x->wt = weight->data, x->wdt = weight->dtype;
    x->wso = weight->strides[0], x->wsc = weight->strides[1], x->wsh = weight->strides[2], x->wsw = weight->strides[3];
    return NK_SUCCESS;
}

static void transform_weight(wino_ctx *x) {
#if WINO_HAVE_AVX2
    nk_parallel_for(x->ocp / x->mr, 1, x->avx2 ? weight_range_avx2 : weight_range, x);
#else
    nk_parallel_for(x->ocp / x->mr, 1, weight_range, x);
#endif
}

/* Checks out/in/bias against OC x C channels (whose U layout u_layout set) and fills the rest of x. */
static nk_status image_args(wino_ctx *x, const nk_tensor *out, const nk_tensor *in, const nk_tensor *bias,
                            const int64_t padding[2]) {
    int64_t n;
    nk_status st;
    if ((st = nk_tensor_check(out, &n)) || (st = nk_tensor_check(in, &n))) return st;
    if (bias != NULL && (st = nk_tensor_check(bias, &n))) return st;
    if (in->ndim != 4 || out->ndim != 4 || (bias != NULL && bias->ndim != 1)) return NK_INVALID;
    if (!float_dtype(in->dtype) || out->dtype != in->dtype || (bias != NULL && bias->dtype != in->dtype))
        return NK_UNSUPPORTED;
    if (padding[0] < 0 || padding[1] < 0) return NK_INVALID;
    x->N = in->sizes[0], x->H = in->sizes[2], x->W = in->sizes[3], x->ph = padding[0], x->pw = padding[1];
    x->OH = x->H + 2 * x->ph - 2, x->OW = x->W + 2 * x->pw - 2;
    if (in->sizes[1] != x->C || x->OH < 0 || x->OW < 0 || out->sizes[0] != x->N || out->sizes[1] != x->OC ||
        out->sizes[2] != x->OH || out->sizes[3] != x->OW || (bias != NULL && bias->sizes[0] != x->OC))
        return NK_INVALID;
    x->dt = in->dtype;
    x->in = in->data, x->isn = in->strides[0], x->isc = in->strides[1], x->ish = in->strides[2], x->isw = in->strides[3];
    x->out = out->data, x->osn = out->strides[0], x->osc = out->strides[1], x->osh = out->strides[2],
    x->osw = out->strides[3];
    x->bias = bias != NULL ? bias->data : NULL, x->bs = bias != NULL ? bias->strides[0] : 0;
    x->tiles_h = (x->OH + WO - 1) / WO, x->tiles_w = (x->OW + WO - 1) / WO;
    x->tiles = x->N * x->tiles_h * x->tiles_w;
    x->tb = block_tiles(x->tiles, x->nr, nk_threads_get());
    x->np = x->tb / x->nr;
    x->vxs = x->np * x->C * x->nr + 16, x->mxs = x->ocp * x->tb + 16;
    x->status = NK_SUCCESS;
    return NK_SUCCESS;
}

/* The blocks of tiles, on x->U. */
static nk_status run_image(wino_ctx *x) {
    if (x->N == 0 || x->OC == 0 || x->OH == 0 || x->OW == 0) return NK_SUCCESS;
    const int64_t blocks = (x->tiles + x->tb - 1) / x->tb, threads = nk_threads_get();
    x->osplit = blocks % threads != 0 && blocks < 4 * threads ? threads : 1;
    if (x->osplit > x->ocp / x->mr) x->osplit = x->ocp / x->mr;
    nk_parallel_for(blocks * x->osplit, 1, block_range, x);
    return x->status;
}

nk_status nk_conv3x3_winograd(const nk_tensor *out, const nk_tensor *in, const nk_tensor *weight,
                              const nk_tensor *bias, const int64_t padding[2]) {
    if (out == NULL || in == NULL || weight == NULL || padding == NULL) return NK_INVALID;
    wino_ctx x;
    memset(&x, 0, sizeof x);
    nk_status st = weight_args(&x, weight);
    if (st != NK_SUCCESS) return st;
    u_layout(&x, weight->sizes[0], weight->sizes[1], current_isa());
    if ((st = image_args(&x, out, in, bias, padding)) != NK_SUCCESS) return st;
    if (weight->dtype != in->dtype) return NK_UNSUPPORTED;
    if (x.N == 0 || x.OC == 0 || x.OH == 0 || x.OW == 0) return NK_SUCCESS;
    x.U = scratch_get(&t_weight, (size_t)(WX * x.uxs));
    if (x.U == NULL) return NK_NO_MEMORY;
    transform_weight(&x);
    st = run_image(&x);
    scratch_trim(&t_weight);
    return st;
}

/* ---- a weight transformed once, for many calls ------------------------------------------------------- */

/* What a transformed weight was made for, ahead of U in the caller's buffer: a buffer from another shape or
 * micro-kernel family (nk_gemm_isa_force in tests; its mr decides U's layout) is refused, never misread. */
#define WU_MAGIC UINT64_C(0x57696e6f55463434) /* "WinoUF44" */
#define WU_HEAD 64                            /* bytes: keeps U 64-byte aligned for the micro-kernel */
typedef struct wino_uhead {
    uint64_t magic;
    int64_t oc, c, mr, uxs;
    const nk_gemm_ukr_fn *isa; /* identity of the micro-kernel family (its ukr slot's address) */
} wino_uhead;

size_t nk_conv3x3_winograd_weight_bytes(int64_t oc, int64_t c) {
    if (oc < 0 || c < 0) return 0;
    wino_ctx x;
    memset(&x, 0, sizeof x);
    u_layout(&x, oc, c, current_isa());
    return WU_HEAD + (size_t)(WX * x.uxs) * sizeof(float);
}

nk_status nk_conv3x3_winograd_weight(void *u, size_t bytes, const nk_tensor *weight) {
    if (u == NULL || weight == NULL || ((uintptr_t)u & 63) != 0) return NK_INVALID;
    wino_ctx x;
    memset(&x, 0, sizeof x);
    nk_status st = weight_args(&x, weight);
    if (st != NK_SUCCESS) return st;
    const nk_gemm_isa *isa = current_isa();
    u_layout(&x, weight->sizes[0], weight->sizes[1], isa);
    if (bytes < WU_HEAD + (size_t)(WX * x.uxs) * sizeof(float)) return NK_INVALID;
    x.U = (float *)(void *)((char *)u + WU_HEAD);
    if (x.OC > 0) transform_weight(&x);
    wino_uhead h = {WU_MAGIC, x.OC, x.C, x.mr, x.uxs, &isa->ukr};
    memcpy(u, &h, sizeof h);
    return NK_SUCCESS;
}

nk_status nk_conv3x3_winograd_pretransformed(const nk_tensor *out, const nk_tensor *in, const void *u, size_t bytes,
                                             const nk_tensor *bias, const int64_t padding[2]) {
    if (out == NULL || in == NULL || u == NULL || padding == NULL || bytes < WU_HEAD || ((uintptr_t)u & 63) != 0)
        return NK_INVALID;
    wino_uhead h;
    memcpy(&h, u, sizeof h);
    const nk_gemm_isa *isa = current_isa();
    if (h.magic != WU_MAGIC || h.isa != &isa->ukr) return NK_INVALID;
    wino_ctx x;
    memset(&x, 0, sizeof x);
    u_layout(&x, h.oc, h.c, isa);
    if (x.mr != h.mr || x.uxs != h.uxs || bytes < WU_HEAD + (size_t)(WX * x.uxs) * sizeof(float)) return NK_INVALID;
    nk_status st = image_args(&x, out, in, bias, padding);
    if (st != NK_SUCCESS) return st;
    x.U = (float *)(void *)((char *)u + WU_HEAD);
    return run_image(&x);
}
