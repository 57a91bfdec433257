/*
 * norm.c - layer norm, RMS norm and group norm, forward and backward, on contiguous rows.
 *
 * Rows are processed in float chunks (see reduce_simd.h); a row that fits one chunk is read once per
 * pass that needs it. Statistics follow PyTorch's CPU kernels: float mean and biased variance,
 * rstd = 1/sqrt(max(var, 0) + eps), y = (x * rstd - mean * rstd) * w + b. Weight gradients are column
 * sums over rows, done by column blocks so each thread owns its columns.
 */
#include "reduce_simd.h"

NK_SIMD_FN(int, nk_rgather, (float *dst, const char *src, int64_t n, int64_t s, nk_dtype t), (dst, src, n, s, t))
NK_SIMD_FN(int, nk_rscatter, (char *dst, int64_t s, nk_dtype t, const float *src, int64_t n), (dst, s, t, src, n))
NK_SIMD_FN(double, nk_sum, (const float *x, int64_t n), (x, n))
NK_SIMD_FN(double, nk_sumsqdev, (const float *x, int64_t n, float c), (x, n, c))
NK_SIMD_FN(double, nk_dot, (const float *a, const float *b, int64_t n), (a, b, n))
NK_SIMD_FN(int, nk_axpb, (float *dst, const float *x, int64_t n, float a, float b), (dst, x, n, a, b))

NK_SIMD_FN(int, nk_affine, (float *dst, const float *x, int64_t n, float a, float c, const float *w, const float *b),
           (dst, x, n, a, c, w, b))

NK_SIMD_FN(int, nk_scalew, (float *dst, const float *x, int64_t n, float a, const float *w), (dst, x, n, a, w))

NK_SIMD_FN(int, nk_gxh, (float *g, float *xh, const float *dy, const float *w, const float *x, int64_t n, float mu, float r),
           (g, xh, dy, w, x, n, mu, r))

NK_SIMD_FN(int, nk_dxrow, (float *dst, const float *g, const float *xh, int64_t n, float r, float a, float b),
           (dst, g, xh, n, r, a, b))

#define NK_NCH 1024 /* norm chunk: several buffers of it live on the stack */

static bool nk_contig(const nk_tensor *t) {
    int64_t expect = 1;
    for (int32_t d = t->ndim - 1; d >= 0; d--) {
        if (t->sizes[d] != 1 && t->strides[d] != expect) return false;
        expect *= t->sizes[d];
    }
    return true;
}

/* A float-dtype contiguous tensor of exactly n elements (NULL allowed when optional). */
static nk_status nk_norm_check(const nk_tensor *t, int64_t n, bool optional) {
    if (t == NULL) return optional ? NK_SUCCESS : NK_INVALID;
    int64_t numel;
    nk_status st = nk_tensor_check(t, &numel);
    if (st != NK_SUCCESS) return st;
    if (numel != n) return NK_INVALID;
    if (!nk_is_half_or_float(t->dtype) || !nk_contig(t)) return NK_UNSUPPORTED;
    return NK_SUCCESS;
}

static inline const char *nk_at(const nk_tensor *t, int64_t i) {
    return (const char *)t->data + i * (int64_t)nk_dtype_size(t->dtype);
}
static inline char *nk_atw(const nk_tensor *t, int64_t i) {
    return (char *)t->data + i * (int64_t)nk_dtype_size(t->dtype);
}

/* Float view of [off, off+n) of a contiguous tensor: in place for f32, else converted into buf. */
static const float *nk_fl(const nk_tensor *t, int64_t off, int64_t n, float *buf) {
    if (t == NULL) return NULL;
    if (t->dtype == NK_F32) return (const float *)t->data + off;
    nk_rgather(buf, nk_at(t, off), n, 1, t->dtype);
    return buf;
}

/* Mean and m2 of a contiguous row of n elements at x[off]. */
static void nk_row_moments(const nk_tensor *x, int64_t off, int64_t n, float *buf, double *mean, double *m2) {
    double cnt = 0, mu = 0, acc = 0;
    for (int64_t i = 0; i < n; i += NK_NCH) {
        const int64_t c = n - i < NK_NCH ? n - i : NK_NCH;
        const float *xf = nk_fl(x, off + i, c, buf);
        const double md = nk_sum(xf, c) / (double)c;
        const float mf = (float)md;
        double q = nk_sumsqdev(xf, c, mf) - (double)c * (md - mf) * (md - mf);
        if (q < 0) q = 0;
        const double tot = cnt + (double)c, delta = md - mu;
        mu += delta * (double)c / tot;
        acc += q + delta * delta * cnt * (double)c / tot;
        cnt = tot;
    }
    *mean = mu;
    *m2 = acc;
}

/* ---- layer norm / RMS norm forward ---- */

typedef struct nk_ln_job {
    const nk_tensor *y, *mean, *rstd, *x, *w, *b;
    int64_t N;
    double eps;
    bool rms;
} nk_ln_job;

static void nk_ln_run(void *ctx, int64_t lo, int64_t hi) {
    const nk_ln_job *j = ctx;
    const int64_t N = j->N;
    float xb[NK_NCH], wb[NK_NCH], bb[NK_NCH], yb[NK_NCH];
    for (int64_t r = lo; r < hi; r++) {
        const int64_t off = r * N;
        float mu = 0, rs;
        if (j->rms) {
            double ss = 0;
            for (int64_t i = 0; i < N; i += NK_NCH) {
                const int64_t c = N - i < NK_NCH ? N - i : NK_NCH;
                const float *xf = nk_fl(j->x, off + i, c, xb);
                ss += nk_dot(xf, xf, c);
            }
            /* PyTorch: rsqrt(mean(x^2) + eps), all in float. */
            rs = 1.0f / sqrtf((float)(ss / (double)N) + (float)j->eps);
        } else {
            double md, m2;
            nk_row_moments(j->x, off, N, xb, &md, &m2);
            float var = (float)(m2 / (double)N);
            mu = (float)md;
            rs = 1.0f / sqrtf((var > 0 ? var : 0.0f) + (float)j->eps);
        }
        if (j->mean) nk_store_f32(nk_atw(j->mean, r), j->mean->dtype, mu);
        if (j->rstd) nk_store_f32(nk_atw(j->rstd, r), j->rstd->dtype, rs);
        for (int64_t i = 0; i < N; i += NK_NCH) {
            const int64_t c = N - i < NK_NCH ? N - i : NK_NCH;
            /* One-chunk rows still sit in xb from the statistics pass (unless read in place). */
            const float *xf = (N <= NK_NCH && j->x->dtype != NK_F32) ? xb : nk_fl(j->x, off + i, c, xb);
            const float *wf = nk_fl(j->w, i, c, wb), *bf = nk_fl(j->b, i, c, bb);
            float *yf = j->y->dtype == NK_F32 ? (float *)j->y->data + off + i : yb;
            if (j->rms) nk_scalew(yf, xf, c, rs, wf);
            else nk_affine(yf, xf, c, rs, -mu * rs, wf, bf);
            if (yf == yb) nk_rscatter(nk_atw(j->y, off + i), 1, j->y->dtype, yb, c);
        }
    }
}

static nk_status nk_ln_common(nk_ln_job *j, int64_t M) {
    const int64_t N = j->N;
    if (M < 0 || N < 0) return NK_INVALID;
    nk_status st;
    if ((st = nk_norm_check(j->x, M * N, false)) || (st = nk_norm_check(j->y, M * N, false)) ||
        (st = nk_norm_check(j->w, N, true)) || (st = nk_norm_check(j->b, N, true)) ||
        (st = nk_norm_check(j->mean, M, true)) || (st = nk_norm_check(j->rstd, M, true)))
        return st;
    if (M == 0 || N == 0) return NK_SUCCESS;
    int64_t grain = 16384 / N;
    nk_parallel_for(M, grain < 1 ? 1 : grain, nk_ln_run, j);
    return NK_SUCCESS;
}

nk_status nk_layer_norm(const nk_tensor *y, const nk_tensor *mean, const nk_tensor *rstd, const nk_tensor *x,
                        const nk_tensor *weight, const nk_tensor *bias, int64_t M, int64_t N, double eps) {
    nk_ln_job j = {.y = y, .mean = mean, .rstd = rstd, .x = x, .w = weight, .b = bias, .N = N, .eps = eps};
    return nk_ln_common(&j, M);
}

nk_status nk_rms_norm(const nk_tensor *y, const nk_tensor *rstd, const nk_tensor *x, const nk_tensor *weight,
                      int64_t M, int64_t N, double eps) {
    nk_ln_job j = {.y = y, .rstd = rstd, .x = x, .w = weight, .N = N, .eps = eps, .rms = true};
    return nk_ln_common(&j, M);
}

/* ---- layer norm / RMS norm backward ---- */

typedef struct nk_lnb_job {
    const nk_tensor *dx, *dw, *db, *dy, *x, *mean, *rstd, *w;
    int64_t M, N;
    bool rms;
} nk_lnb_job;

/* dx, one row per iteration. */
static void nk_lnb_dx_run(void *ctx, int64_t lo, int64_t hi) {
    const nk_lnb_job *j = ctx;
    const int64_t N = j->N;
    float xb[NK_NCH], dyb[NK_NCH], wb[NK_NCH], g[NK_NCH], xh[NK_NCH], out[NK_NCH];
    for (int64_t r = lo; r < hi; r++) {
        const int64_t off = r * N;
        const float mu = j->rms ? 0.0f : nk_load_f32(nk_at(j->mean, r), j->mean->dtype);
        const float rs = nk_load_f32(nk_at(j->rstd, r), j->rstd->dtype);
        double sg = 0, sgx = 0;
        for (int64_t i = 0; i < N; i += NK_NCH) {
            const int64_t c = N - i < NK_NCH ? N - i : NK_NCH;
            nk_gxh(g, xh, nk_fl(j->dy, off + i, c, dyb), nk_fl(j->w, i, c, wb), nk_fl(j->x, off + i, c, xb), c, mu, rs);
            if (!j->rms) sg += nk_sum(g, c);
            sgx += nk_dot(g, xh, c);
        }
        const float a = (float)(sg / (double)N), b = (float)(sgx / (double)N);
        for (int64_t i = 0; i < N; i += NK_NCH) {
            const int64_t c = N - i < NK_NCH ? N - i : NK_NCH;
            if (N > NK_NCH)
                nk_gxh(g, xh, nk_fl(j->dy, off + i, c, dyb), nk_fl(j->w, i, c, wb), nk_fl(j->x, off + i, c, xb), c,
                       mu, rs);
            float *dst = j->dx->dtype == NK_F32 ? (float *)j->dx->data + off + i : out;
            nk_dxrow(dst, g, xh, c, rs, a, b);
            if (dst == out) nk_rscatter(nk_atw(j->dx, off + i), 1, j->dx->dtype, out, c);
        }
    }
}

#define NK_COLS 256

/* dweight/dbias: one block of NK_COLS columns per iteration, summed over all rows. */
static void nk_lnb_dw_run(void *ctx, int64_t lo, int64_t hi) {
    const nk_lnb_job *j = ctx;
    const int64_t N = j->N;
    float xb[NK_COLS], dyb[NK_COLS], g[NK_COLS], xh[NK_COLS];
    double aw[NK_COLS], ab[NK_COLS];
    for (int64_t blk = lo; blk < hi; blk++) {
        const int64_t c0 = blk * NK_COLS, c = N - c0 < NK_COLS ? N - c0 : NK_COLS;
        for (int64_t k = 0; k < c; k++) aw[k] = ab[k] = 0;
        for (int64_t r = 0; r < j->M; r++) {
            const float mu = j->rms ? 0.0f : nk_load_f32(nk_at(j->mean, r), j->mean->dtype);
            const float rs = nk_load_f32(nk_at(j->rstd, r), j->rstd->dtype);
            const float *dy = nk_fl(j->dy, r * N + c0, c, dyb);
            nk_gxh(g, xh, dy, NULL, nk_fl(j->x, r * N + c0, c, xb), c, mu, rs);
            for (int64_t k = 0; k < c; k++) {
                aw[k] += (double)(dy[k] * xh[k]);
                ab[k] += dy[k];
            }
        }
        for (int64_t k = 0; k < c; k++) {
            if (j->dw) nk_store_f32(nk_atw(j->dw, c0 + k), j->dw->dtype, (float)aw[k]);
            if (j->db) nk_store_f32(nk_atw(j->db, c0 + k), j->db->dtype, (float)ab[k]);
        }
    }
}

static nk_status nk_lnb_common(nk_lnb_job *j) {
    const int64_t M = j->M, N = j->N;
    if (M < 0 || N < 0) return NK_INVALID;
    nk_status st;
    if ((st = nk_norm_check(j->x, M * N, false)) || (st = nk_norm_check(j->dy, M * N, false)) ||
        (st = nk_norm_check(j->dx, M * N, true)) || (st = nk_norm_check(j->w, N, true)) ||
        (st = nk_norm_check(j->dw, N, true)) || (st = nk_norm_check(j->db, N, true)) ||
        (st = nk_norm_check(j->mean, M, j->rms)) || (st = nk_norm_check(j->rstd, M, false)))
        return st;
    if (N == 0) return NK_SUCCESS;
    if (M == 0) {
        /* No rows: the weight gradients are sums of nothing. */
        for (int64_t k = 0; k < N; k++) {
            if (j->dw) nk_store_f32(nk_atw(j->dw, k), j->dw->dtype, 0.0f);
            if (j->db) nk_store_f32(nk_atw(j->db, k), j->db->dtype, 0.0f);
        }
        return NK_SUCCESS;
    }
    if (j->dx) {
        int64_t grain = 16384 / N;
        nk_parallel_for(M, grain < 1 ? 1 : grain, nk_lnb_dx_run, j);
    }
    if (j->dw || j->db) nk_parallel_for((N + NK_COLS - 1) / NK_COLS, 1, nk_lnb_dw_run, j);
    return NK_SUCCESS;
}

nk_status nk_layer_norm_backward(const nk_tensor *dx, const nk_tensor *dweight, const nk_tensor *dbias,
                                 const nk_tensor *dy, const nk_tensor *x, const nk_tensor *mean,
                                 const nk_tensor *rstd, const nk_tensor *weight, int64_t M, int64_t N) {
    nk_lnb_job j = {.dx = dx, .dw = dweight, .db = dbias, .dy = dy, .x = x, .mean = mean, .rstd = rstd,
                    .w = weight, .M = M, .N = N};
    return nk_lnb_common(&j);
}

nk_status nk_rms_norm_backward(const nk_tensor *dx, const nk_tensor *dweight, const nk_tensor *dy,
                               const nk_tensor *x, const nk_tensor *rstd, const nk_tensor *weight, int64_t M,
                               int64_t N) {
    nk_lnb_job j = {.dx = dx, .dw = dweight, .dy = dy, .x = x, .rstd = rstd, .w = weight, .M = M, .N = N,
                    .rms = true};
    return nk_lnb_common(&j);
}

/* ---- group norm ---- */

typedef struct nk_gn_job {
    const nk_tensor *y, *mean, *rstd, *x, *w, *b, *dx, *dw, *db, *dy;
    int64_t N, C, HxW, G, D;
    double eps;
} nk_gn_job;

static inline float nk_param(const nk_tensor *t, int64_t i, float dflt) {
    return t ? nk_load_f32(nk_at(t, i), t->dtype) : dflt;
}

/* Forward: one (n, group) block per iteration. */
static void nk_gn_run(void *ctx, int64_t lo, int64_t hi) {
    const nk_gn_job *j = ctx;
    float xb[NK_NCH], yb[NK_NCH];
    for (int64_t ng = lo; ng < hi; ng++) {
        const int64_t g = ng % j->G, off = ng * j->D * j->HxW;
        double md, m2;
        nk_row_moments(j->x, off, j->D * j->HxW, xb, &md, &m2);
        const float mu = (float)md;
        float var = (float)(m2 / (double)(j->D * j->HxW));
        const float rs = 1.0f / sqrtf((var > 0 ? var : 0.0f) + (float)j->eps);
        nk_store_f32(nk_atw(j->mean, ng), j->mean->dtype, mu);
        nk_store_f32(nk_atw(j->rstd, ng), j->rstd->dtype, rs);
        for (int64_t d = 0; d < j->D; d++) {
            const int64_t ch = g * j->D + d;
            const float scale = rs * nk_param(j->w, ch, 1.0f);
            const float shift = -scale * mu + nk_param(j->b, ch, 0.0f);
            for (int64_t i = 0; i < j->HxW; i += NK_NCH) {
                const int64_t c = j->HxW - i < NK_NCH ? j->HxW - i : NK_NCH;
                const int64_t o = off + d * j->HxW + i;
                const float *xf = nk_fl(j->x, o, c, xb);
                float *yf = j->y->dtype == NK_F32 ? (float *)j->y->data + o : yb;
                nk_axpb(yf, xf, c, scale, shift);
                if (yf == yb) nk_rscatter(nk_atw(j->y, o), 1, j->y->dtype, yb, c);
            }
        }
    }
}

/* Sums over one channel plane: sum(dy * x) and sum(dy). */
static void nk_gn_plane(const nk_gn_job *j, int64_t o, double *ds, double *dsum, float *xb, float *dyb) {
    double a = 0, b = 0;
    for (int64_t i = 0; i < j->HxW; i += NK_NCH) {
        const int64_t c = j->HxW - i < NK_NCH ? j->HxW - i : NK_NCH;
        const float *dy = nk_fl(j->dy, o + i, c, dyb);
        a += nk_dot(dy, nk_fl(j->x, o + i, c, xb), c);
        b += nk_sum(dy, c);
    }
    *ds = a;
    *dsum = b;
}

/* dx: one (n, group) block per iteration. */
static void nk_gnb_dx_run(void *ctx, int64_t lo, int64_t hi) {
    const nk_gn_job *j = ctx;
    float xb[NK_NCH], dyb[NK_NCH], ob[NK_NCH];
    for (int64_t ng = lo; ng < hi; ng++) {
        const int64_t g = ng % j->G, off = ng * j->D * j->HxW;
        const float mu = nk_load_f32(nk_at(j->mean, ng), j->mean->dtype);
        const float rs = nk_load_f32(nk_at(j->rstd, ng), j->rstd->dtype);
        double dsg = 0, dbg = 0;
        for (int64_t d = 0; d < j->D; d++) {
            double ds, db;
            nk_gn_plane(j, off + d * j->HxW, &ds, &db, xb, dyb);
            const double gm = nk_param(j->w, g * j->D + d, 1.0f);
            dsg += ds * gm;
            dbg += db * gm;
        }
        const double s = 1.0 / (double)(j->D * j->HxW);
        const double c2 = (dbg * mu - dsg) * rs * rs * rs * s;
        const double c3 = -c2 * mu - dbg * rs * s;
        for (int64_t d = 0; d < j->D; d++) {
            const float c1 = rs * nk_param(j->w, g * j->D + d, 1.0f);
            for (int64_t i = 0; i < j->HxW; i += NK_NCH) {
                const int64_t c = j->HxW - i < NK_NCH ? j->HxW - i : NK_NCH;
                const int64_t o = off + d * j->HxW + i;
                const float *dy = nk_fl(j->dy, o, c, dyb), *x = nk_fl(j->x, o, c, xb);
                float *dst = j->dx->dtype == NK_F32 ? (float *)j->dx->data + o : ob;
                for (int64_t k = 0; k < c; k++) dst[k] = c1 * dy[k] + (float)c2 * x[k] + (float)c3;
                if (dst == ob) nk_rscatter(nk_atw(j->dx, o), 1, j->dx->dtype, ob, c);
            }
        }
    }
}

/* dweight/dbias: one channel per iteration, summed over the batch. */
static void nk_gnb_dw_run(void *ctx, int64_t lo, int64_t hi) {
    const nk_gn_job *j = ctx;
    float xb[NK_NCH], dyb[NK_NCH];
    for (int64_t ch = lo; ch < hi; ch++) {
        const int64_t g = ch / j->D;
        double aw = 0, ab = 0;
        for (int64_t n = 0; n < j->N; n++) {
            double ds, db;
            nk_gn_plane(j, (n * j->C + ch) * j->HxW, &ds, &db, xb, dyb);
            const double mu = nk_load_f32(nk_at(j->mean, n * j->G + g), j->mean->dtype);
            const double rs = nk_load_f32(nk_at(j->rstd, n * j->G + g), j->rstd->dtype);
            aw += (ds - db * mu) * rs;
            ab += db;
        }
        if (j->dw) nk_store_f32(nk_atw(j->dw, ch), j->dw->dtype, (float)aw);
        if (j->db) nk_store_f32(nk_atw(j->db, ch), j->db->dtype, (float)ab);
    }
}

static nk_status nk_gn_check(const nk_gn_job *j) {
    if (j->N < 0 || j->C < 0 || j->HxW < 0 || j->G <= 0 || j->C % j->G != 0) return NK_INVALID;
    const int64_t T = j->N * j->C * j->HxW;
    nk_status st;
    if ((st = nk_norm_check(j->x, T, false)) || (st = nk_norm_check(j->w, j->C, true)) ||
        (st = nk_norm_check(j->b, j->C, true)) || (st = nk_norm_check(j->mean, j->N * j->G, false)) ||
        (st = nk_norm_check(j->rstd, j->N * j->G, false)))
        return st;
    return NK_SUCCESS;
}

nk_status nk_group_norm(const nk_tensor *y, const nk_tensor *mean, const nk_tensor *rstd, const nk_tensor *x,
                        const nk_tensor *weight, const nk_tensor *bias, int64_t N, int64_t C, int64_t HxW,
                        int64_t group, double eps) {
    nk_gn_job j = {.y = y, .mean = mean, .rstd = rstd, .x = x, .w = weight, .b = bias, .N = N, .C = C,
                   .HxW = HxW, .G = group, .eps = eps};
    nk_status st = nk_gn_check(&j);
    if (st != NK_SUCCESS) return st;
    if ((st = nk_norm_check(y, N * C * HxW, false)) != NK_SUCCESS) return st;
    j.D = C / group;
    if (N * group == 0) return NK_SUCCESS;
    if (j.D * HxW == 0) {
        /* Empty groups: mean 0 and rstd of a zero variance, as PyTorch computes them. */
        for (int64_t k = 0; k < N * group; k++) {
            nk_store_f32(nk_atw(mean, k), mean->dtype, 0.0f);
            nk_store_f32(nk_atw(rstd, k), rstd->dtype, 1.0f / sqrtf((float)eps));
        }
        return NK_SUCCESS;
    }
    int64_t grain = 16384 / (j.D * HxW);
    nk_parallel_for(N * group, grain < 1 ? 1 : grain, nk_gn_run, &j);
    return NK_SUCCESS;
}

nk_status nk_group_norm_backward(const nk_tensor *dx, const nk_tensor *dweight, const nk_tensor *dbias,
                                 const nk_tensor *dy, const nk_tensor *x, const nk_tensor *mean,
                                 const nk_tensor *rstd, const nk_tensor *weight, int64_t N, int64_t C,
                                 int64_t HxW, int64_t group) {
    nk_gn_job j = {.dx = dx, .dw = dweight, .db = dbias, .dy = dy, .x = x, .mean = mean, .rstd = rstd,
                   .w = weight, .N = N, .C = C, .HxW = HxW, .G = group};
    nk_status st = nk_gn_check(&j);
    if (st != NK_SUCCESS) return st;
    const int64_t T = N * C * HxW;
    if ((st = nk_norm_check(dy, T, false)) || (st = nk_norm_check(dx, T, true)) ||
        (st = nk_norm_check(dweight, C, true)) || (st = nk_norm_check(dbias, C, true)))
        return st;
    j.D = C / group;
    if (dx && N * group > 0 && j.D * HxW > 0) {
        int64_t grain = 16384 / (j.D * HxW);
        nk_parallel_for(N * group, grain < 1 ? 1 : grain, nk_gnb_dx_run, &j);
    }
    if ((dweight || dbias) && C > 0) {
        int64_t grain = 16384 / (N * HxW + 1);
        nk_parallel_for(C, grain < 1 ? 1 : grain, nk_gnb_dw_run, &j);
    }
    return NK_SUCCESS;
}
