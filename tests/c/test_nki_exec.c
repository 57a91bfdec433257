/*
 * test_nki_exec.c - the NKI plan executor (nkx_run): hand-built plans of the shapes nki/_compile.py records,
 * replayed step by step and as fused groups (NKX_FUSE_NEXT). Fused must equal unfused bitwise (same vector
 * loops, conversions and row reductions), both must match plain double loops, and a malformed plan must
 * come back as NK_INVALID naming the step, never as a crash.
 */
#include "nk_test.h"

#include <math.h>
#include <stdlib.h>

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float rnd(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 4.0 - 2.0);
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Regions of the plans below, as the Python side numbers them: 0 arena, 1 constants, then arguments. */
enum { R_ARENA = 0, R_CONST, R_X, R_W, R_OUT, R_COUNT };

static nkx_operand opd(int32_t region, nk_dtype dt, int64_t off_bytes, int32_t nd, const int64_t *sizes,
                       const int64_t *strides) {
    nkx_operand o;
    memset(&o, 0, sizeof o);
    o.region = region;
    o.dtype = dt;
    o.ndim = nd;
    o.offset = off_bytes;
    for (int32_t d = 0; d < nd; d++) {
        o.sizes[d] = sizes[d];
        o.strides[d] = strides[d];
    }
    return o;
}

static nkx_instr ins(int32_t kind, int32_t op, double value, int32_t flags, int nops, nkx_operand a, nkx_operand b,
                     nkx_operand c) {
    nkx_instr in;
    memset(&in, 0, sizeof in);
    in.kind = kind;
    in.op = op;
    in.value = value;
    in.flags = flags;
    in.nops = nops;
    in.o[0] = a;
    in.o[1] = b;
    in.o[2] = c;
    return in;
}

static void fuse(nkx_instr *p, int n, bool on) {
    for (int i = 0; i < n; i++) {
        p[i].flags &= ~NKX_FUSE_NEXT;
        if (on && i + 1 < n) p[i].flags |= NKX_FUSE_NEXT;
    }
}

static float g_consts[4];

/* Tags the arena tiles of a one-group plan as scratch (nkx_slots: one slot per tile, by its arena offset), as the
 * tracer does for tiles no step outside the group touches; off: every operand back on the arena. */
static void scratch(nkx_instr *p, int n, bool on) {
    int64_t offs[8];
    int nt = 0;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < p[i].nops; k++) {
            nkx_operand *o = &p[i].o[k];
            o->pad = 0;
            if (!on || o->region != R_ARENA) continue;
            int t = 0;
            while (t < nt && offs[t] != o->offset) t++;
            if (t == nt) offs[nt++] = o->offset;
            o->pad = t + 1;
        }
    }
}

/*
 * rmsnorm of x [rows, f] (dt) with weight w [f] (f32, broadcast over rows by a stride-0 dim), as the tile API
 * records it after load forwarding: sq = x * x; ss = sum(sq); m = ss * (1/f); m = m + eps; r = rsqrt(m);
 * y = x * r (r broadcast along the row); out = y * w. Then a softmax of out's rows: d = out (widened to f32, as
 * the tracer stages reduce inputs); mx = max(d); d = d - mx; e = exp(d); s = sum(e); rs = 1/s; e = e * rs, and
 * d = e > 1/f (a predicate into a float tile), stored into the second half of the output as dt.
 */
static int build(nkx_instr *p, int64_t rows, int64_t f, nk_dtype dt, int64_t x_row_stride) {
    const int64_t es = (int64_t)nk_dtype_size(dt);
    const int64_t tile = rows * f * 4, col = rows * 4;
    int64_t full[2] = {rows, f}, one[2] = {rows, 1};
    int64_t st_x[2] = {x_row_stride, 1}, st_t[2] = {f, 1}, st_c[2] = {1, 1}, st_b[2] = {1, 0}, st_w[2] = {0, 1},
            st_k[2] = {0, 0};
    /* arena: sq @0, y @tile, e @2*tile, d @3*tile, five [rows, 1] columns after */
    const int64_t cols = 4 * tile;
    nkx_operand x = opd(R_X, dt, 0, 2, full, st_x);
    nkx_operand sq = opd(R_ARENA, NK_F32, 0, 2, full, st_t);
    nkx_operand y = opd(R_ARENA, NK_F32, tile, 2, full, st_t);
    nkx_operand e = opd(R_ARENA, NK_F32, 2 * tile, 2, full, st_t);
    nkx_operand d = opd(R_ARENA, NK_F32, 3 * tile, 2, full, st_t);
    nkx_operand c0 = opd(R_ARENA, NK_F32, cols, 2, one, st_c), c1 = opd(R_ARENA, NK_F32, cols + col, 2, one, st_c);
    nkx_operand c0b = opd(R_ARENA, NK_F32, cols, 2, full, st_b);
    nkx_operand c1b = opd(R_ARENA, NK_F32, cols + col, 2, full, st_b);
    nkx_operand kinv = opd(R_CONST, NK_F32, 0, 2, one, st_k), keps = opd(R_CONST, NK_F32, 4, 2, one, st_k);
    nkx_operand kinvf = opd(R_CONST, NK_F32, 0, 2, full, st_k);
    nkx_operand w = opd(R_W, NK_F32, 0, 2, full, st_w);
    nkx_operand out = opd(R_OUT, dt, 0, 2, full, st_t);
    nkx_operand out2 = opd(R_OUT, dt, rows * f * es, 2, full, st_t);
    nkx_operand none;
    memset(&none, 0, sizeof none);
    g_consts[0] = 1.0f / (float)f;
    g_consts[1] = 1e-6f;
    int n = 0;
    p[n++] = ins(NKX_BINARY, NK_MUL, 1.0, 0, 3, sq, x, x);
    p[n++] = ins(NKX_REDUCE, NK_REDUCE_SUM, 0.0, 2, 2, c0, sq, none);
    p[n++] = ins(NKX_BINARY, NK_MUL, 1.0, 0, 3, c0, c0, kinv);
    p[n++] = ins(NKX_BINARY, NK_ADD, 1.0, 0, 3, c0, c0, keps);
    p[n++] = ins(NKX_UNARY, NK_RSQRT, 0.0, 0, 2, c1, c0, none);
    p[n++] = ins(NKX_BINARY, NK_MUL, 1.0, 0, 3, y, x, c1b);
    p[n++] = ins(NKX_BINARY, NK_MUL, 1.0, 0, 3, out, y, w);
    p[n++] = ins(NKX_COPY, 0, 0.0, 0, 2, d, out, none);
    p[n++] = ins(NKX_REDUCE, NK_REDUCE_AMAX, 0.0, 2, 2, c0, d, none);
    p[n++] = ins(NKX_BINARY, NK_ADD, -1.0, 0, 3, d, d, c0b);
    p[n++] = ins(NKX_UNARY, NK_EXP, 0.0, 0, 2, e, d, none);
    p[n++] = ins(NKX_REDUCE, NK_REDUCE_SUM, 0.0, 2, 2, c1, e, none);
    p[n++] = ins(NKX_UNARY, NK_RECIPROCAL, 0.0, 0, 2, c1, c1, none);
    p[n++] = ins(NKX_BINARY, NK_MUL, 1.0, 0, 3, e, e, c1b);
    p[n++] = ins(NKX_BINARY, NK_GT, 1.0, 0, 3, d, e, kinvf);
    p[n++] = ins(NKX_COPY, 0, 0.0, 0, 2, out2, d, none);
    return n;
}

typedef struct bufs {
    void *arena, *x, *out;
    float *w;
    size_t arena_bytes, out_bytes;
} bufs;

static void run_plan(const nkx_instr *p, int n, bufs *b, const void *x0, size_t xbytes) {
    memset(b->arena, 0xFF, b->arena_bytes); /* NaN: stale arena bytes must not leak into results */
    memset(b->out, 0, b->out_bytes);
    memcpy(b->x, x0, xbytes);
    void *bases[R_COUNT] = {b->arena, g_consts, b->x, b->w, b->out};
    int64_t failed = 123;
    const nk_status s = nkx_run(p, n, bases, R_COUNT, &failed);
    CHECK_MSG(s == NK_SUCCESS && failed == -1, "status %d at %lld", (int)s, (long long)failed);
}

static float outv(const void *out, nk_dtype dt, int64_t i) {
    return dt == NK_F32 ? ((const float *)out)[i] : from_bf16(((const uint16_t *)out)[i]);
}

static void test_chain(int64_t rows, int64_t f, nk_dtype dt, int64_t pad) {
    const int64_t es = (int64_t)nk_dtype_size(dt), xs = f + pad;
    bufs b;
    b.arena_bytes = (size_t)(4 * rows * f * 4 + 2 * rows * 4 + 64);
    b.out_bytes = (size_t)(2 * rows * f * es);
    b.arena = malloc(b.arena_bytes);
    b.out = malloc(b.out_bytes);
    b.x = malloc((size_t)(rows * xs * es));
    void *x0 = malloc((size_t)(rows * xs * es));
    b.w = malloc((size_t)f * 4);
    float *xf = malloc((size_t)(rows * xs) * 4);
    for (int64_t i = 0; i < rows * xs; i++) {
        xf[i] = rnd();
        if (dt == NK_BF16) {
            ((uint16_t *)x0)[i] = to_bf16(xf[i]);
            xf[i] = from_bf16(((uint16_t *)x0)[i]);
        } else {
            ((float *)x0)[i] = xf[i];
        }
    }
    for (int64_t j = 0; j < f; j++) b.w[j] = rnd();
    nkx_instr p[32];
    const int n = build(p, rows, f, dt, xs);
    void *plain = malloc(b.out_bytes);
    fuse(p, n, false);
    run_plan(p, n, &b, x0, (size_t)(rows * xs * es));
    memcpy(plain, b.out, b.out_bytes);
    fuse(p, n, true);
    run_plan(p, n, &b, x0, (size_t)(rows * xs * es));
    CHECK_MSG(memcmp(plain, b.out, b.out_bytes) == 0, "rows %lld f %lld dt %d: fused != unfused", (long long)rows,
              (long long)f, (int)dt);
    /* the intermediates in the workers' scratch blocks instead of the arena */
    scratch(p, n, true);
    run_plan(p, n, &b, x0, (size_t)(rows * xs * es));
    CHECK_MSG(memcmp(plain, b.out, b.out_bytes) == 0, "rows %lld f %lld dt %d: scratch != unfused", (long long)rows,
              (long long)f, (int)dt);
    scratch(p, n, false);
    /* and two fused groups split where the rmsnorm half ends (a different block plan per group) */
    fuse(p, 7, true);
    fuse(p + 7, n - 7, true);
    run_plan(p, n, &b, x0, (size_t)(rows * xs * es));
    CHECK_MSG(memcmp(plain, b.out, b.out_bytes) == 0, "rows %lld f %lld: two groups != unfused", (long long)rows,
              (long long)f);
    /* against double loops, rounding where the plan rounds (the output dtype) */
    const double tol = dt == NK_F32 ? 2e-5 : 1e-2;
    int bad = 0;
    for (int64_t r = 0; r < rows && bad < 5; r++) {
        const float *xr = xf + r * xs;
        double ss = 0;
        for (int64_t j = 0; j < f; j++) ss += (double)xr[j] * xr[j];
        const double rs = 1.0 / sqrt(ss / (double)f + 1e-6);
        double mx = -INFINITY;
        double *o = malloc((size_t)f * sizeof(double));
        for (int64_t j = 0; j < f; j++) {
            o[j] = dt == NK_F32 ? (double)xr[j] * rs * b.w[j] : from_bf16(to_bf16((float)((double)xr[j] * rs * b.w[j])));
            const double got = outv(b.out, dt, r * f + j);
            if (!(fabs(got - o[j]) <= tol * (1 + fabs(o[j])))) {
                bad++;
                CHECK_MSG(0, "rmsnorm row %lld col %lld: %g vs %g", (long long)r, (long long)j, got, o[j]);
            }
            o[j] = got; /* the softmax half reads the rounded output */
            if (o[j] > mx) mx = o[j];
        }
        double s = 0;
        for (int64_t j = 0; j < f; j++) s += exp(o[j] - mx);
        for (int64_t j = 0; j < f; j++) {
            const double sm = exp(o[j] - mx) / s;
            const double thr = 1.0 / (double)f;
            const double got = outv(b.out, dt, rows * f + r * f + j);
            /* a predicate: only where sm is not within rounding of the threshold */
            if (fabs(sm - thr) > 1e-5 * thr && got != (sm > thr ? 1.0 : 0.0)) {
                bad++;
                CHECK_MSG(0, "softmax > 1/f row %lld col %lld: %g (softmax %g)", (long long)r, (long long)j, got, sm);
            }
        }
        free(o);
    }
    free(plain);
    free(xf);
    free(b.w);
    free(x0);
    free(b.x);
    free(b.out);
    free(b.arena);
}

/* Malformed plans: NK_INVALID and the failing step's index, for single steps and inside fused groups. */
static void test_bad_plans(void) {
    float arena[64], x[64], out[64];
    memset(arena, 0, sizeof arena);
    for (int i = 0; i < 64; i++) x[i] = (float)i;
    void *bases[R_COUNT] = {arena, g_consts, x, x, out};
    int64_t s44[2] = {4, 4}, st[2] = {4, 1}, s41[2] = {4, 1}, st1[2] = {1, 1}, s34[2] = {3, 4};
    nkx_operand none;
    memset(&none, 0, sizeof none);
    nkx_operand a = opd(R_ARENA, NK_F32, 0, 2, s44, st), xo = opd(R_X, NK_F32, 0, 2, s44, st);
    nkx_operand o = opd(R_OUT, NK_F32, 0, 2, s44, st);
    nkx_instr good = ins(NKX_BINARY, NK_ADD, 1.0, 0, 3, a, xo, xo);
    nkx_instr p[4];
    int64_t failed;
    nk_status s;

    /* a good two-step plan first: the harness itself works */
    p[0] = good;
    p[1] = ins(NKX_COPY, 0, 0.0, 0, 2, o, a, none);
    failed = 7;
    s = nkx_run(p, 2, bases, R_COUNT, &failed);
    CHECK(s == NK_SUCCESS && failed == -1);
    CHECK(out[5] == 10.0f && out[15] == 30.0f);

    struct {
        const char *what;
        nkx_instr bad;
    } cases[8];
    int nc = 0;
    nkx_instr t = good;
    t.o[1].region = R_COUNT; /* past the base table */
    cases[nc].what = "region past the bases", cases[nc++].bad = t;
    t = good;
    t.o[0].region = -1;
    cases[nc].what = "negative region", cases[nc++].bad = t;
    t = good;
    t.o[2].ndim = NKX_MAX_DIMS + 1;
    cases[nc].what = "too many dims", cases[nc++].bad = t;
    t = good;
    t.kind = NKX_KIND_COUNT + 3;
    cases[nc].what = "unknown kind", cases[nc++].bad = t;
    t = good;
    t.nops = 0;
    cases[nc].what = "no operands", cases[nc++].bad = t;
    t = good;
    t.o[1].dtype = -2;
    cases[nc].what = "unknown dtype", cases[nc++].bad = t;
    t = good;
    t.o[2] = opd(R_X, NK_F32, 0, 2, s34, st); /* 3 x 4 beside 4 x 4 */
    cases[nc].what = "operands of different shapes", cases[nc++].bad = t;
    t = ins(NKX_GEMM, 0, 0.0, 0, 2, a, xo, none);
    cases[nc].what = "a GEMM with two operands", cases[nc++].bad = t;
    for (int c = 0; c < nc; c++) {
        p[0] = good;
        p[1] = cases[c].bad;
        failed = 7;
        s = nkx_run(p, 2, bases, R_COUNT, &failed);
        CHECK_MSG(s == NK_INVALID && failed == 1, "%s: status %d at %lld", cases[c].what, (int)s, (long long)failed);
        /* the same step inside a fused group */
        fuse(p, 2, true);
        failed = 7;
        s = nkx_run(p, 2, bases, R_COUNT, &failed);
        CHECK_MSG(s == NK_INVALID && failed == 1, "%s (fused): status %d at %lld", cases[c].what, (int)s,
                  (long long)failed);
    }

    /* what only a fused group refuses: steps over different row counts, a reduce over the rows, a GEMM */
    int64_t s24[2] = {2, 4}, s14[2] = {1, 4};
    nkx_instr rows2 = ins(NKX_UNARY, NK_EXP, 0.0, 0, 2, opd(R_ARENA, NK_F32, 0, 2, s24, st),
                          opd(R_X, NK_F32, 0, 2, s24, st), none);
    nkx_instr red0 = ins(NKX_REDUCE, NK_REDUCE_SUM, 0.0, 1, 2, opd(R_ARENA, NK_F32, 0, 2, s14, st),
                         opd(R_X, NK_F32, 0, 2, s44, st), none);
    nkx_instr red_keep = ins(NKX_REDUCE, NK_REDUCE_SUM, 0.0, 0, 2, opd(R_ARENA, NK_F32, 0, 2, s41, st1),
                             opd(R_X, NK_F32, 0, 2, s44, st), none);
    nkx_instr gemm = ins(NKX_GEMM, 0, 0.0, 0, 3, a, xo, xo);
    nkx_instr ints = good;
    ints.o[0].dtype = NK_I32;
    nkx_instr slot_big = good, slot_arg = good, slot_wide = good;
    slot_big.o[0].pad = 1000;  /* no such scratch slot */
    slot_arg.o[1].pad = 1;     /* scratch for an argument's memory */
    slot_wide.o[0].pad = 1;    /* a row of 4 floats in a 2-float row stride */
    slot_wide.o[0].strides[0] = 2;
    const nkx_instr fused_bad[] = {rows2, red0, red_keep, gemm, ints, slot_big, slot_arg, slot_wide};
    for (size_t c = 0; c < sizeof fused_bad / sizeof fused_bad[0]; c++) {
        p[0] = good;
        p[1] = fused_bad[c];
        fuse(p, 2, true);
        failed = 7;
        s = nkx_run(p, 2, bases, R_COUNT, &failed);
        CHECK_MSG(s == NK_INVALID && failed == 1, "fused case %zu: status %d at %lld", c, (int)s, (long long)failed);
    }
    /* NKX_COPY_IF: out keeps its value where the condition is 0 (x[0]), takes on_true elsewhere; NaN counts as
     * true; an integer destination from a float source is refused */
    for (int i = 0; i < 16; i++) out[i] = -1.0f;
    float cond[16];
    for (int i = 0; i < 16; i++) cond[i] = (float)(i % 3);
    cond[4] = NAN;
    void *cbases[R_COUNT] = {arena, g_consts, x, cond, out};
    p[0] = ins(NKX_COPY_IF, 0, 0.0, 0, 3, o, opd(R_W, NK_F32, 0, 2, s44, st), xo);
    CHECK(nkx_run(p, 1, cbases, R_COUNT, NULL) == NK_SUCCESS);
    int wrong = 0;
    for (int i = 0; i < 16; i++) wrong += out[i] != ((i % 3 || i == 4) ? (float)i : -1.0f);
    CHECK_MSG(wrong == 0, "copy_if: %d elements wrong", wrong);
    p[0].o[0].dtype = NK_I32;
    failed = 7;
    CHECK(nkx_run(p, 1, cbases, R_COUNT, &failed) == NK_INVALID && failed == 0);
    /* an empty plan and a NULL failed_at are fine */
    CHECK(nkx_run(p, 0, bases, R_COUNT, NULL) == NK_SUCCESS);
    p[0] = good;
    p[0].o[1].region = 99;
    CHECK(nkx_run(p, 1, bases, R_COUNT, NULL) == NK_INVALID);
}

/* NKX_INT: one step over n elements of 1-D operands (region R_X: a, R_W: b, R_OUT: out). */
static nk_status int_step(int32_t op, int32_t flags, double value, nk_dtype tout, void *out, nk_dtype ta, void *a,
                          nk_dtype tb, void *b, int64_t n) {
    int64_t sz[1] = {n}, st[1] = {1};
    float arena[4];
    void *bases[R_COUNT] = {arena, g_consts, a, b ? b : a, out};
    nkx_operand none;
    memset(&none, 0, sizeof none);
    nkx_instr p = ins(NKX_INT, op, value, flags, b ? 3 : 2, opd(R_OUT, tout, 0, 1, sz, st), opd(R_X, ta, 0, 1, sz, st),
                      b ? opd(R_W, tb, 0, 1, sz, st) : none);
    return nkx_run(&p, 1, bases, R_COUNT, NULL);
}

static void test_int_ops(void) {
    /* int8 arithmetic wraps; max/min exact */
    int8_t a8[6] = {100, -100, 127, -128, 5, -3}, b8[6] = {100, -100, 1, -1, 7, 2}, o8[6];
    CHECK(int_step(NKX_I_ADD, NK_I8, 0, NK_I8, o8, NK_I8, a8, NK_I8, b8, 6) == NK_SUCCESS);
    CHECK(o8[0] == -56 && o8[1] == 56 && o8[2] == -128 && o8[3] == 127 && o8[4] == 12 && o8[5] == -1);
    CHECK(int_step(NKX_I_MUL, NK_I8, 0, NK_I8, o8, NK_I8, a8, NK_I8, b8, 6) == NK_SUCCESS);
    CHECK(o8[0] == 16 && o8[2] == 127 && o8[3] == -128 && o8[4] == 35 && o8[5] == -6);
    CHECK(int_step(NKX_I_MIN, NK_I8, 0, NK_I8, o8, NK_I8, a8, NK_I8, b8, 6) == NK_SUCCESS);
    CHECK(o8[0] == 100 && o8[1] == -100 && o8[2] == 1 && o8[3] == -128 && o8[4] == 5 && o8[5] == -3);
    /* shifts as numpy: counts outside [0, 8) give 0 (<<) or the sign (>>) */
    int8_t c8[6] = {1, 8, -1, 1, 9, 9}, s8[6] = {-128, 5, -3, -128, -7, 7};
    CHECK(int_step(NKX_I_SHL, NK_I8, 0, NK_I8, o8, NK_I8, s8, NK_I8, c8, 6) == NK_SUCCESS);
    CHECK(o8[0] == 0 && o8[1] == 0 && o8[2] == 0 && o8[3] == 0 && o8[4] == 0 && o8[5] == 0);
    CHECK(int_step(NKX_I_SHR, NK_I8, 0, NK_I8, o8, NK_I8, s8, NK_I8, c8, 6) == NK_SUCCESS);
    CHECK(o8[0] == -64 && o8[1] == 0 && o8[2] == -1 && o8[3] == -64 && o8[4] == -1 && o8[5] == 0);
    /* int32 products wrap in int32; computed in int64 and stored to int8 they wrap at the store */
    int32_t a32[3] = {65536, -2147483647 - 1, 46341}, b32[3] = {65536, -1, 46341}, o32[3];
    CHECK(int_step(NKX_I_MUL, NK_I32, 0, NK_I32, o32, NK_I32, a32, NK_I32, b32, 3) == NK_SUCCESS);
    CHECK(o32[0] == 0 && o32[1] == -2147483647 - 1 && o32[2] == -2147479015);
    CHECK(int_step(NKX_I_ADD, NK_I64, 0, NK_I8, o8, NK_I32, a32, NK_I32, b32, 3) == NK_SUCCESS);
    CHECK(o8[0] == 0 && o8[1] == -1 && o8[2] == 10);
    /* a reversed scalar in uint8: 3 - x wraps */
    uint8_t u8[3] = {5, 3, 0}, ou8[3];
    CHECK(int_step(NKX_I_SUB, NK_U8 | NKX_I_SCALAR | NKX_I_REVERSE, 3.0, NK_U8, ou8, NK_U8, u8, NK_U8, NULL, 3) ==
          NK_SUCCESS);
    CHECK(ou8[0] == 254 && ou8[1] == 0 && ou8[2] == 3);
    /* float -> int: nearest even, saturated, NaN as 0; -> bool: != 0 (NaN true) */
    float f[8] = {127.5f, -128.5f, 2.5f, 3.5f, NAN, INFINITY, -INFINITY, -0.0f};
    CHECK(int_step(NKX_I_CAST, NK_F32, 0, NK_I8, o8, NK_F32, f, 0, NULL, 6) == NK_SUCCESS);
    CHECK(o8[0] == 127 && o8[1] == -128 && o8[2] == 2 && o8[3] == 4 && o8[4] == 0 && o8[5] == 127);
    float big[4] = {3e9f, -3e9f, 2147483520.0f, INFINITY};
    CHECK(int_step(NKX_I_CAST, NK_F32, 0, NK_I32, o32, NK_F32, big, 0, NULL, 3) == NK_SUCCESS);
    CHECK(o32[0] == 2147483647 && o32[1] == -2147483647 - 1 && o32[2] == 2147483520);
    uint32_t ou32[4];
    float ub[4] = {-1.0f, 5e9f, 4294967040.0f, 0.5f};
    CHECK(int_step(NKX_I_CAST, NK_F32, 0, NK_U32, ou32, NK_F32, ub, 0, NULL, 4) == NK_SUCCESS);
    CHECK(ou32[0] == 0 && ou32[1] == 4294967295u && ou32[2] == 4294967040u && ou32[3] == 0);
    uint8_t bo[8];
    CHECK(int_step(NKX_I_CAST, NK_F32, 0, NK_BOOL, bo, NK_F32, f, 0, NULL, 8) == NK_SUCCESS);
    CHECK(bo[0] == 1 && bo[4] == 1 && bo[7] == 0);
    /* int -> float rounds to nearest: 16777217 -> 16777216; the fp32 domain rounds operands first */
    int32_t i24[2] = {16777217, -16777219};
    float of[2], zero[2] = {0.0f, 0.5f};
    CHECK(int_step(NKX_I_CAST, NK_I32, 0, NK_F32, of, NK_I32, i24, 0, NULL, 2) == NK_SUCCESS);
    CHECK(of[0] == 16777216.0f && of[1] == -16777220.0f);
    CHECK(int_step(NKX_I_ADD, NK_F32, 0, NK_F32, of, NK_I32, i24, NK_F32, zero, 2) == NK_SUCCESS);
    CHECK(of[0] == 16777216.0f && of[1] == -16777220.0f);
    uint16_t obf[2];
    CHECK(int_step(NKX_I_CAST, NK_I32, 0, NK_BF16, obf, NK_I32, i24, 0, NULL, 2) == NK_SUCCESS);
    CHECK(obf[0] == 0x4B80 && obf[1] == 0xCB80);
    /* compares in double are exact: 16777217 != 16777216.0f; results 0/1 */
    float ff[2] = {16777216.0f, -16777220.0f};
    CHECK(int_step(NKX_I_EQ, NK_F64, 0, NK_I32, o32, NK_I32, i24, NK_F32, ff, 2) == NK_SUCCESS);
    CHECK(o32[0] == 0 && o32[1] == 0);
    CHECK(int_step(NKX_I_GT, NK_F64, 0, NK_F32, of, NK_I32, i24, NK_F32, ff, 2) == NK_SUCCESS);
    CHECK(of[0] == 1.0f && of[1] == 1.0f);
    /* in place: the run is read before it is written */
    int16_t x16[300];
    for (int i = 0; i < 300; i++) x16[i] = (int16_t)(i * 300 - 30000);
    CHECK(int_step(NKX_I_MUL, NK_I16 | NKX_I_SCALAR, 3.0, NK_I16, x16, NK_I16, x16, 0, NULL, 300) == NK_SUCCESS);
    int wrong = 0;
    for (int i = 0; i < 300; i++) wrong += x16[i] != (int16_t)(uint16_t)((i * 300 - 30000) * 3);
    CHECK_MSG(wrong == 0, "in-place int16 multiply: %d wrong", wrong);
    /* refused: a unary op with two sources, a float operand in an integer domain, a compare in the fp32 domain,
     * an unknown op, an integer scalar beyond 2^53 */
    CHECK(int_step(NKX_I_NEG, NK_I8, 0, NK_I8, o8, NK_I8, a8, NK_I8, b8, 2) == NK_INVALID);
    CHECK(int_step(NKX_I_ADD, NK_I32, 0, NK_I32, o32, NK_I32, a32, NK_F32, ff, 2) == NK_INVALID);
    CHECK(int_step(NKX_I_LT, NK_F32, 0, NK_I32, o32, NK_I32, a32, NK_F32, ff, 2) == NK_INVALID);
    CHECK(int_step(NKX_I_COUNT, NK_I8, 0, NK_I8, o8, NK_I8, a8, NK_I8, b8, 2) == NK_INVALID);
    CHECK(int_step(NKX_I_ADD, NK_I32 | NKX_I_SCALAR, 1e300, NK_I32, o32, NK_I32, a32, 0, NULL, 2) == NK_INVALID);
}

static uint16_t h_bits(double v) {  /* the expected fp16 of v by exhaustive search: nearest, ties to even */
    uint16_t best = 0;
    double bd = INFINITY;
    for (uint32_t h = 0; h < 0x7C00u; h++) {
        const uint32_t e = h >> 10, m = h & 0x3FFu;
        const double x = e ? ldexp(1024.0 + m, (int)e - 25) : ldexp((double)m, -24);
        const double d = fabs(x - fabs(v));
        if (d < bd || (d == bd && !(h & 1u))) bd = d, best = (uint16_t)h;
    }
    if (fabs(v) >= 65520.0) best = 0x7C00u;
    return (uint16_t)(best | (v < 0 ? 0x8000u : 0u));
}

/* The float ops on integer tiles (NKX_I_DIV/SQRT/RSQRT/RECIP) and the integer reductions. */
static void test_int_float_ops(void) {
    /* float64 division: x / 0 is +-inf or NaN; stored to int32 NaN is 0 and inf saturates */
    int32_t a[5] = {7, -7, 0, 2147483647, 1}, b[5] = {2, 0, 0, -1, 3};
    float qf[5];
    int32_t qi[5];
    CHECK(int_step(NKX_I_DIV, NK_F64, 0, NK_F32, qf, NK_I32, a, NK_I32, b, 5) == NK_SUCCESS);
    CHECK(qf[0] == 3.5f && isinf(qf[1]) && qf[1] < 0 && isnan(qf[2]) && qf[3] == -2147483648.0f &&
          qf[4] == (float)(1.0 / 3.0));
    CHECK(int_step(NKX_I_DIV, NK_F64, 0, NK_I32, qi, NK_I32, a, NK_I32, b, 5) == NK_SUCCESS);
    CHECK(qi[0] == 4 && qi[1] == -2147483647 - 1 && qi[2] == 0 && qi[3] == -2147483647 && qi[4] == 0);
    /* fp16 stores of double quotients round once (no double rounding through fp32) */
    int32_t n[6] = {2049, 1, 4097, -1, 65519, 65520}, d[6] = {1, 3, 1, 7, 1, 1};
    uint16_t h[6];
    CHECK(int_step(NKX_I_DIV, NK_F64, 0, NK_F16, h, NK_I32, n, NK_I32, d, 6) == NK_SUCCESS);
    int bad = 0;
    for (int i = 0; i < 6; i++) bad += h[i] != h_bits((double)n[i] / (double)d[i]);
    CHECK_MSG(bad == 0, "fp16 of float64 quotients: %d wrong", bad);
    /* a value just above a half-way point of fp16 whose fp32 rounding lands on the tie: 1 + 2^-11 + 2^-30 */
    int64_t big[1] = {(int64_t)1 << 30 | (int64_t)1 << 19 | 1}, one[1] = {(int64_t)1 << 30};
    CHECK(int_step(NKX_I_DIV, NK_F64, 0, NK_F16, h, NK_I64, big, NK_I64, one, 1) == NK_SUCCESS);
    CHECK(h[0] == 0x3C01);
    /* fp16 domain: sqrt of int8 rounded to fp16, rsqrt rounds twice there; a reversed scalar divide */
    int8_t s8[4] = {2, 3, -1, 0};
    float sf[4];
    CHECK(int_step(NKX_I_SQRT, NK_F16, 0, NK_F32, sf, NK_I8, s8, 0, NULL, 4) == NK_SUCCESS);
    CHECK(sf[0] == 1.4140625f && sf[1] == 1.732421875f && isnan(sf[2]) && sf[3] == 0.0f);
    CHECK(int_step(NKX_I_RSQRT, NK_F16, 0, NK_F32, sf, NK_I8, s8, 0, NULL, 4) == NK_SUCCESS);
    CHECK(sf[0] == 0.70703125f && isnan(sf[2]) && isinf(sf[3]));
    CHECK(int_step(NKX_I_DIV, NK_F32 | NKX_I_SCALAR | NKX_I_REVERSE, 1.0, NK_F32, sf, NK_I8, s8, 0, NULL, 4) ==
          NK_SUCCESS);
    CHECK(sf[0] == 0.5f && sf[1] == 1.0f / 3.0f && sf[2] == -1.0f && isinf(sf[3]));
    /* casts through float64 saturate into integers */
    int64_t wide[2] = {(int64_t)1 << 40, -3};
    int16_t o16[2];
    CHECK(int_step(NKX_I_CAST, NK_F64, 0, NK_I16, o16, NK_I64, wide, 0, NULL, 2) == NK_SUCCESS);
    CHECK(o16[0] == 32767 && o16[1] == -3);
    /* refused: a float op in an integer domain */
    CHECK(int_step(NKX_I_DIV, NK_I32, 0, NK_I32, qi, NK_I32, a, NK_I32, b, 5) == NK_INVALID);

    /* reductions of a [3, 4] int8 tile over dim 1 (and both dims): sum in int64 / wrapped in int8, max, min,
     * mean, negate */
    int8_t x[12] = {100, 100, 100, -1, -128, -128, 5, 6, 0, 0, 0, 0};
    int64_t sz[2] = {3, 4}, st[2] = {4, 1}, osz[2] = {3, 1}, ost[2] = {1, 1};
    void *bases[R_COUNT] = {NULL, g_consts, x, x, NULL};
    int64_t out64[3];
    int8_t out8[3];
    float outf[3];
    struct { int32_t op, dom, neg; nk_dtype dt; void *out; } cases[] = {
        {NKX_I_RSUM, NK_I64, 0, NK_I64, out64}, {NKX_I_RSUM, NK_I8, 0, NK_I8, out8},
        {NKX_I_RMAX, NK_I8, 1, NK_I8, out8}, {NKX_I_RMEAN, NK_F64, 0, NK_F32, outf},
        {NKX_I_RMIN, NK_I8, 0, NK_I64, out64},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        bases[R_OUT] = cases[c].out;
        nkx_operand none;
        memset(&none, 0, sizeof none);
        nkx_instr p = ins(NKX_INT, cases[c].op, 0, cases[c].dom | (cases[c].neg ? NKX_I_NEGATE : 0) |
                          (2 << NKX_I_AXES_SHIFT), 2, opd(R_OUT, cases[c].dt, 0, 2, osz, ost),
                          opd(R_X, NK_I8, 0, 2, sz, st), none);
        CHECK(nkx_run(&p, 1, bases, R_COUNT, NULL) == NK_SUCCESS);
        switch (c) {
        case 0: CHECK(out64[0] == 299 && out64[1] == -245 && out64[2] == 0); break;
        case 1: CHECK(out8[0] == 43 && out8[1] == 11 && out8[2] == 0); break;
        case 2: CHECK(out8[0] == -100 && out8[1] == -6 && out8[2] == 0); break;
        case 3: CHECK(outf[0] == 74.75f && outf[1] == -61.25f && outf[2] == 0.0f); break;
        default: CHECK(out64[0] == -1 && out64[1] == -128 && out64[2] == 0); break;
        }
    }
    int64_t all1[2] = {1, 1}, total[1] = {0};
    bases[R_OUT] = total;
    nkx_operand none;
    memset(&none, 0, sizeof none);
    nkx_instr p = ins(NKX_INT, NKX_I_RSUM, 0, NK_I64 | (3 << NKX_I_AXES_SHIFT), 2, opd(R_OUT, NK_I64, 0, 2, all1, st),
                      opd(R_X, NK_I8, 0, 2, sz, st), none);
    CHECK(nkx_run(&p, 1, bases, R_COUNT, NULL) == NK_SUCCESS);
    CHECK(total[0] == 54);
    /* refused: a reduced dim of the output that is not 1, a mean outside float64 */
    p.o[0].sizes[1] = 2;
    CHECK(nkx_run(&p, 1, bases, R_COUNT, NULL) == NK_INVALID);
    p.o[0].sizes[1] = 1;
    p.op = NKX_I_RMEAN;
    CHECK(nkx_run(&p, 1, bases, R_COUNT, NULL) == NK_INVALID);
}

/* The math ops on integer tiles: integer power / mod / fmod with numpy's rules, <math.h> functions in the
 * float domains, and the pairwise float64 mean of int64 values. */
static void test_int_math_ops(void) {
    /* int8 power wraps; 0^0 = 1; a negative exponent fails the step before anything is written */
    int8_t a8[5] = {3, -2, 0, 2, -1}, e8[5] = {5, 7, 0, 8, 3}, o8[5];
    CHECK(int_step(NKX_I_POW, NK_I8, 0, NK_I8, o8, NK_I8, a8, NK_I8, e8, 5) == NK_SUCCESS);
    CHECK(o8[0] == -13 && o8[1] == -128 && o8[2] == 1 && o8[3] == 0 && o8[4] == -1);
    int8_t neg[5] = {1, 1, 1, 1, -1}, keep[5] = {9, 9, 9, 9, 9};
    memcpy(o8, keep, 5);
    CHECK(int_step(NKX_I_POW, NK_I8, 0, NK_I8, o8, NK_I8, a8, NK_I8, neg, 5) == NK_NEG_INT_POWER);
    CHECK(memcmp(o8, keep, 5) == 0);
    /* mod follows the divisor's sign, fmod the dividend's; 0 for a zero divisor and for INT64_MIN % -1 */
    int64_t x[6] = {7, -7, 7, -7, 5, INT64_MIN}, y[6] = {3, 3, -3, -3, 0, -1}, o[6];
    CHECK(int_step(NKX_I_MOD, NK_I64, 0, NK_I64, o, NK_I64, x, NK_I64, y, 6) == NK_SUCCESS);
    CHECK(o[0] == 1 && o[1] == 2 && o[2] == -2 && o[3] == -1 && o[4] == 0 && o[5] == 0);
    CHECK(int_step(NKX_I_FMOD, NK_I64, 0, NK_I64, o, NK_I64, x, NK_I64, y, 6) == NK_SUCCESS);
    CHECK(o[0] == 1 && o[1] == -1 && o[2] == 1 && o[3] == -1 && o[4] == 0 && o[5] == 0);
    /* float64 remainder of int32 by a scalar: the divisor's sign, NaN for 0 (stored to int32 as 0) */
    int32_t a32[4] = {7, -7, 0, 5};
    float of[4];
    CHECK(int_step(NKX_I_MOD, NK_F64 | NKX_I_SCALAR, -2.5, NK_F32, of, NK_I32, a32, 0, NULL, 4) == NK_SUCCESS);
    CHECK(of[0] == -0.5f && of[1] == -2.0f && of[2] == 0.0f && signbit(of[2]) && of[3] == 0.0f);
    CHECK(int_step(NKX_I_FMOD, NK_F64 | NKX_I_SCALAR, 0.0, NK_F32, of, NK_I32, a32, 0, NULL, 4) == NK_SUCCESS);
    CHECK(isnan(of[0]) && isnan(of[3]));
    /* exp in float64 rounded once to fp32; in fp16 (int8) through float; log of 0 is -inf, of -7 NaN */
    CHECK(int_step(NKX_I_EXP, NK_F64, 0, NK_F32, of, NK_I32, a32, 0, NULL, 4) == NK_SUCCESS);
    CHECK(of[0] == (float)exp(7.0) && of[1] == (float)exp(-7.0) && of[2] == 1.0f);
    CHECK(int_step(NKX_I_LOG, NK_F64, 0, NK_F32, of, NK_I32, a32, 0, NULL, 4) == NK_SUCCESS);
    CHECK(of[0] == (float)log(7.0) && isnan(of[1]) && isinf(of[2]) && of[2] < 0);
    int8_t b8[2] = {10, -3};
    CHECK(int_step(NKX_I_EXP, NK_F16, 0, NK_F32, of, NK_I8, b8, 0, NULL, 2) == NK_SUCCESS);
    CHECK(of[0] == 22032.0f && of[1] == 0.04977417f);
    CHECK(int_step(NKX_I_EXP, NK_I32, 0, NK_I32, a32, NK_I32, a32, 0, NULL, 4) == NK_INVALID);
    /* int64 mean of {2^54, 1 x 8}: numpy's pairwise float64 sum is 2^54 + 4 (a sequential one 2^54), so the
     * mean is 2001599834386887.5, 2001599834386888 in an int64 tile (2001599834386887 from the sequential sum) */
    int64_t v[9] = {(int64_t)1 << 54, 1, 1, 1, 1, 1, 1, 1, 1}, mean[1];
    int64_t sz[2] = {1, 9}, st[2] = {9, 1}, osz[2] = {1, 1}, ost[2] = {1, 1};
    void *bases[R_COUNT] = {NULL, g_consts, v, v, mean};
    nkx_operand none;
    memset(&none, 0, sizeof none);
    nkx_instr p = ins(NKX_INT, NKX_I_RMEAN, 0, NK_F64 | NKX_I_PAIRWISE | (2 << NKX_I_AXES_SHIFT), 2,
                      opd(R_OUT, NK_I64, 0, 2, osz, ost), opd(R_X, NK_I64, 0, 2, sz, st), none);
    CHECK(nkx_run(&p, 1, bases, R_COUNT, NULL) == NK_SUCCESS);
    CHECK(mean[0] == 2001599834386888);
}

/* NKX_JOIN_NEXT (nki_exec.c): back-to-back independent groups run in one parallel region; same bytes as apart. */
#define NKX_JOIN_NEXT_TEST ((int32_t)1 << 29)
static void test_joined_groups(int64_t rows, int64_t f, int ngroups) {
    const int64_t n = rows * f * ngroups;
    float *x = malloc(sizeof(float) * (size_t)n), *o1 = malloc(sizeof(float) * (size_t)n);
    float *o2 = malloc(sizeof(float) * (size_t)n), *arena = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = rnd();
    int64_t sz[2] = {rows, f}, st[2] = {f, 1};
    nkx_operand none;
    memset(&none, 0, sizeof none);
    nkx_instr p[16];
    for (int g = 0; g < ngroups; g++) {
        const int64_t off = (int64_t)g * rows * f * 4;
        nkx_operand t = opd(R_ARENA, NK_F32, off, 2, sz, st), xo = opd(R_X, NK_F32, off, 2, sz, st);
        nkx_operand oo = opd(R_OUT, NK_F32, off, 2, sz, st);
        p[2 * g] = ins(NKX_BINARY, NK_MUL, 1.0, NKX_FUSE_NEXT, 3, t, xo, xo);
        p[2 * g + 1] = ins(NKX_BINARY, NK_ADD, 1.0, 0, 3, oo, t, xo);
    }
    void *b1[R_COUNT] = {arena, g_consts, x, x, o1}, *b2[R_COUNT] = {arena, g_consts, x, x, o2};
    CHECK(nkx_run(p, 2 * ngroups, b1, R_COUNT, NULL) == NK_SUCCESS);
    for (int g = 0; g + 1 < ngroups; g++) p[2 * g + 1].flags |= NKX_JOIN_NEXT_TEST;
    memset(arena, 0, sizeof(float) * (size_t)n);
    CHECK(nkx_run(p, 2 * ngroups, b2, R_COUNT, NULL) == NK_SUCCESS);
    int wrong = 0;
    for (int64_t i = 0; i < n; i++) wrong += memcmp(&o1[i], &o2[i], 4) != 0 || o2[i] != x[i] * x[i] + x[i];
    CHECK_MSG(wrong == 0, "joined %lld x %lld x %d: %d wrong", (long long)rows, (long long)f, ngroups, wrong);
    free(x), free(o1), free(o2), free(arena);
}

int main(void) {
    nk_threads_set(2); /* large groups split their row blocks over the pool */
    const int64_t shapes[][3] = {
        /* rows, free, row padding of x */
        {128, 1024, 0}, {7, 1000, 3}, {96, 33, 0}, {3, 1, 0}, {1, 17, 2}, {130, 257, 0}, {256, 1024, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        test_chain(shapes[i][0], shapes[i][1], NK_F32, shapes[i][2]);
        test_chain(shapes[i][0], shapes[i][1], NK_BF16, shapes[i][2]);
    }
    test_bad_plans();
    test_int_ops();
    test_int_float_ops();
    test_int_math_ops();
    test_joined_groups(128, 1024, 4);
    test_joined_groups(77, 1000, 3);
    test_joined_groups(3, 5, 2);
    printf("test_nki_exec: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
