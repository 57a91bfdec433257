/*
 * copy.c - nk_copy, nk_fill, the dtype-pair inner loops and the row iterator.
 *
 * Conversion rules (PyTorch CPU, c10/util/TypeCast.h):
 *   - bool destination: x != 0 (NaN is true); a bool source byte is true when nonzero.
 *   - half/bfloat16 sources are widened to float first; half/bfloat16 destinations are produced from a
 *     float, so double and 64-bit integers round twice (to float, then to half), exactly as c10 does.
 *   - floating -> integer truncates toward zero. uint8 goes through int64 (c10 special-cases it so
 *     negative values wrap); uint16/uint32/uint64 do the same, which is what the x86 build of PyTorch
 *     produces and keeps negative inputs defined. int8/int16 go through int32, the instruction x86 uses.
 *     Out-of-range and NaN inputs give the x86 result too (see nk_f32_to_i32).
 *   - integer -> integer wraps (two's complement).
 */
#include "elementwise_internal.h"

/* ---- per-element conversions ---- */

/*
 * Floating -> integer. C leaves out-of-range (and NaN) conversions undefined; PyTorch on x86 gets the
 * hardware's "integer indefinite" (INT_MIN of the conversion width). We pin that result down so the
 * kernels are deterministic everywhere (and clean under -fsanitize=float-cast-overflow), and write it
 * as a select so the loops still vectorise.
 */
static inline int32_t nk_f32_to_i32(float v) {
    return (v >= -2147483648.0f && v < 2147483648.0f) ? (int32_t)v : INT32_MIN;
}
static inline int32_t nk_f64_to_i32(double v) {
    return (v > -2147483649.0 && v < 2147483648.0) ? (int32_t)v : INT32_MIN;
}
static inline int64_t nk_f32_to_i64(float v) {
    return (v >= -9223372036854775808.0f && v < 9223372036854775808.0f) ? (int64_t)v : INT64_MIN;
}
static inline int64_t nk_f64_to_i64(double v) {
    return (v >= -9223372036854775808.0 && v < 9223372036854775808.0) ? (int64_t)v : INT64_MIN;
}
static inline uint64_t nk_f64_to_u64(double v) {
    /* Values in [2^63, 2^64) do not fit int64; everything else goes through int64 so negatives wrap. */
    if (v >= 9223372036854775808.0 && v < 18446744073709551616.0)
        return (uint64_t)(int64_t)(v - 9223372036854775808.0) + (UINT64_C(1) << 63);
    return (uint64_t)nk_f64_to_i64(v);
}
#define NK_TO_I32(v) _Generic((v), float: nk_f32_to_i32, default: nk_f64_to_i32)(v)
#define NK_TO_I64(v) _Generic((v), float: nk_f32_to_i64, default: nk_f64_to_i64)(v)
/* uint8 is defined through int64. For a float the int32 conversion has the same low byte: any float
 * outside int32 range is a multiple of 2^8, as are INT32_MIN and INT64_MIN. int32 vectorises on SSE2,
 * int64 does not, and float -> uint8 is the image-pipeline hot path. */
#define NK_TO_U8_BITS(v) _Generic((v), float: nk_f32_to_i32, default: nk_f64_to_i64)(v)

/* Loading a source element gives a value of "kind" INT (any C integer type) or FLT (float/double). */
/* "b8" rather than "bool": stdbool.h makes bool a macro, which would break token pasting. */
#define NK_LOAD_b8(x) ((x) != 0)
#define NK_LOAD_u8(x) (x)
#define NK_LOAD_i8(x) (x)
#define NK_LOAD_i16(x) (x)
#define NK_LOAD_i32(x) (x)
#define NK_LOAD_i64(x) (x)
#define NK_LOAD_u16(x) (x)
#define NK_LOAD_u32(x) (x)
#define NK_LOAD_u64(x) (x)
#define NK_LOAD_f16(x) nk_f16_to_f32(x)
#define NK_LOAD_bf16(x) nk_bf16_to_f32(x)
#define NK_LOAD_f32(x) (x)
#define NK_LOAD_f64(x) (x)

#define NK_STORE_b8_INT(v) ((uint8_t)((v) != 0))
#define NK_STORE_b8_FLT(v) ((uint8_t)((v) != 0))
#define NK_STORE_u8_INT(v) ((uint8_t)(v))
#define NK_STORE_u8_FLT(v) ((uint8_t)NK_TO_U8_BITS(v))
#define NK_STORE_i8_INT(v) ((int8_t)(v))
#define NK_STORE_i8_FLT(v) ((int8_t)NK_TO_I32(v))
#define NK_STORE_i16_INT(v) ((int16_t)(v))
#define NK_STORE_i16_FLT(v) ((int16_t)NK_TO_I32(v))
#define NK_STORE_i32_INT(v) ((int32_t)(v))
#define NK_STORE_i32_FLT(v) NK_TO_I32(v)
#define NK_STORE_i64_INT(v) ((int64_t)(v))
#define NK_STORE_i64_FLT(v) NK_TO_I64(v)
#define NK_STORE_u16_INT(v) ((uint16_t)(v))
#define NK_STORE_u16_FLT(v) ((uint16_t)NK_TO_I64(v))
#define NK_STORE_u32_INT(v) ((uint32_t)(v))
#define NK_STORE_u32_FLT(v) ((uint32_t)NK_TO_I64(v))
#define NK_STORE_u64_INT(v) ((uint64_t)(v))
#define NK_STORE_u64_FLT(v) nk_f64_to_u64((double)(v))
#define NK_STORE_f16_INT(v) nk_f32_to_f16((float)(v))
#define NK_STORE_f16_FLT(v) nk_f32_to_f16((float)(v))
#define NK_STORE_bf16_INT(v) nk_f32_to_bf16((float)(v))
#define NK_STORE_bf16_FLT(v) nk_f32_to_bf16((float)(v))
#define NK_STORE_f32_INT(v) ((float)(v))
#define NK_STORE_f32_FLT(v) ((float)(v))
#define NK_STORE_f64_INT(v) ((double)(v))
#define NK_STORE_f64_FLT(v) ((double)(v))

#define NK_STORE_(dn, kind, v) NK_STORE_##dn##_##kind(v)
#define NK_STORE(dn, kind, v) NK_STORE_(dn, kind, v)
#define NK_CONVERT(dn, sn, kind, x) NK_STORE(dn, kind, NK_LOAD_##sn(x))

/* X(name, enum, storage type, value kind after load) */
#define NK_DTYPES_A(X, ...)                        \
    X(b8, NK_BOOL, uint8_t, INT, __VA_ARGS__)    \
    X(u8, NK_U8, uint8_t, INT, __VA_ARGS__)        \
    X(i8, NK_I8, int8_t, INT, __VA_ARGS__)         \
    X(i16, NK_I16, int16_t, INT, __VA_ARGS__)      \
    X(i32, NK_I32, int32_t, INT, __VA_ARGS__)      \
    X(i64, NK_I64, int64_t, INT, __VA_ARGS__)      \
    X(f16, NK_F16, uint16_t, FLT, __VA_ARGS__)     \
    X(bf16, NK_BF16, uint16_t, FLT, __VA_ARGS__)   \
    X(f32, NK_F32, float, FLT, __VA_ARGS__)        \
    X(f64, NK_F64, double, FLT, __VA_ARGS__)       \
    X(u16, NK_U16, uint16_t, INT, __VA_ARGS__)     \
    X(u32, NK_U32, uint32_t, INT, __VA_ARGS__)     \
    X(u64, NK_U64, uint64_t, INT, __VA_ARGS__)
/* A second copy: a macro cannot expand itself, and the pair table nests one list inside the other. */
#define NK_DTYPES_B(X, ...)                        \
    X(b8, NK_BOOL, uint8_t, INT, __VA_ARGS__)    \
    X(u8, NK_U8, uint8_t, INT, __VA_ARGS__)        \
    X(i8, NK_I8, int8_t, INT, __VA_ARGS__)         \
    X(i16, NK_I16, int16_t, INT, __VA_ARGS__)      \
    X(i32, NK_I32, int32_t, INT, __VA_ARGS__)      \
    X(i64, NK_I64, int64_t, INT, __VA_ARGS__)      \
    X(f16, NK_F16, uint16_t, FLT, __VA_ARGS__)     \
    X(bf16, NK_BF16, uint16_t, FLT, __VA_ARGS__)   \
    X(f32, NK_F32, float, FLT, __VA_ARGS__)        \
    X(f64, NK_F64, double, FLT, __VA_ARGS__)       \
    X(u16, NK_U16, uint16_t, INT, __VA_ARGS__)     \
    X(u32, NK_U32, uint32_t, INT, __VA_ARGS__)     \
    X(u64, NK_U64, uint64_t, INT, __VA_ARGS__)

/*
 * The unit-stride branch is a separate loop so the compiler vectorises it; the strided one handles
 * transposes and gathers. No restrict: dst and src may be the same memory with the same layout.
 */
#define NK_DEFINE_CAST(sn, se, st, sk, dn, de, dt, dk)                                          \
    static void nk_cast_##dn##_from_##sn(void *dst, int64_t ds, const void *src, int64_t ss,    \
                                         int64_t n) {                                           \
        dt *d = (dt *)dst;                                                                      \
        const st *s = (const st *)src;                                                          \
        if (ds == 1 && ss == 1) {                                                               \
            for (int64_t i = 0; i < n; i++) d[i] = NK_CONVERT(dn, sn, sk, s[i]);                \
        } else {                                                                                \
            for (int64_t i = 0; i < n; i++) d[i * ds] = NK_CONVERT(dn, sn, sk, s[i * ss]);      \
        }                                                                                       \
    }
#define NK_DEFINE_CASTS_TO(dn, de, dt, dk, unused) NK_DTYPES_B(NK_DEFINE_CAST, dn, de, dt, dk)
NK_DTYPES_A(NK_DEFINE_CASTS_TO, 0)

#define NK_CAST_ENTRY(sn, se, st, sk, dn) [se] = nk_cast_##dn##_from_##sn,
#define NK_CAST_ROW(dn, de, dt, dk, unused) [de] = {NK_DTYPES_B(NK_CAST_ENTRY, dn)},
static const nk_cast_fn nk_cast_table[NK_DTYPE_COUNT][NK_DTYPE_COUNT] = {NK_DTYPES_A(NK_CAST_ROW, 0)};

/* Same-dtype copies move bits (no NaN canonicalisation, bool bytes kept), like PyTorch's memcpy path. */
#define NK_DEFINE_RAW_COPY(bits)                                                                \
    static void nk_copy_raw##bits(void *dst, int64_t ds, const void *src, int64_t ss, int64_t n) { \
        uint##bits##_t *d = (uint##bits##_t *)dst;                                              \
        const uint##bits##_t *s = (const uint##bits##_t *)src;                                  \
        if (ds == 1 && ss == 1) {                                                               \
            memmove(d, s, (size_t)n * sizeof *d);                                               \
        } else {                                                                                \
            for (int64_t i = 0; i < n; i++) d[i * ds] = s[i * ss];                              \
        }                                                                                       \
    }
NK_DEFINE_RAW_COPY(8)
NK_DEFINE_RAW_COPY(16)
NK_DEFINE_RAW_COPY(32)
NK_DEFINE_RAW_COPY(64)

void *nk_elem_ptr(nk_elem *e, nk_dtype t) {
    switch (t) {
    case NK_BOOL: case NK_U8: return &e->u8;
    case NK_I8: return &e->i8;
    case NK_I16: return &e->i16;
    case NK_F16: case NK_BF16: case NK_U16: return &e->u16;
    case NK_I32: return &e->i32;
    case NK_U32: return &e->u32;
    case NK_I64: return &e->i64;
    case NK_F32: return &e->f32;
    case NK_F64: return &e->f64;
    default: return &e->u64;
    }
}

nk_cast_fn nk_cast_get(nk_dtype dst, nk_dtype src) {
    if (!nk_dtype_valid(dst) || !nk_dtype_valid(src)) return NULL;
    if (dst != src) return nk_cast_table[dst][src];
    switch (nk_dtype_size(dst)) {
    case 1: return nk_copy_raw8;
    case 2: return nk_copy_raw16;
    case 4: return nk_copy_raw32;
    default: return nk_copy_raw64;
    }
}

/* ---- fill ---- */

#define NK_FILL_LOOP(type)                                                                      \
    do {                                                                                        \
        type v_;                                                                                \
        memcpy(&v_, value, sizeof v_);                                                          \
        type *d_ = (type *)dst;                                                                 \
        if (ds == 1) {                                                                          \
            for (int64_t i = 0; i < n; i++) d_[i] = v_;                                         \
        } else {                                                                                \
            for (int64_t i = 0; i < n; i++) d_[i * ds] = v_;                                    \
        }                                                                                       \
    } while (0)

void nk_fill_row(void *dst, int64_t ds, const void *value, size_t elsize, int64_t n) {
    const unsigned char *b = (const unsigned char *)value;
    bool uniform_bytes = true;
    for (size_t k = 1; k < elsize; k++) uniform_bytes = uniform_bytes && b[k] == b[0];
    /* memset covers zero (but not -0.0) and every 1-byte dtype. */
    if (ds == 1 && uniform_bytes) {
        memset(dst, b[0], (size_t)n * elsize);
        return;
    }
    switch (elsize) {
    case 1: NK_FILL_LOOP(uint8_t); break;
    case 2: NK_FILL_LOOP(uint16_t); break;
    case 4: NK_FILL_LOOP(uint32_t); break;
    default: NK_FILL_LOOP(uint64_t); break;
    }
}

/* ---- iteration ---- */

void nk_iter_init(nk_iter *it, int32_t nops, const nk_tensor *const ops[], bool reorder) {
    const nk_tensor *t0 = ops[0];
    it->nops = nops;
    for (int32_t op = 0; op < nops; op++) {
        it->base[op] = (char *)ops[op]->data;
        it->elsize[op] = (int64_t)nk_dtype_size(ops[op]->dtype);
        it->off[op] = 0;
    }

    /* Size-1 dims never move a pointer: drop them. */
    int32_t nd = 0;
    for (int32_t d = 0; d < t0->ndim; d++) {
        if (t0->sizes[d] == 1) continue;
        it->sizes[nd] = t0->sizes[d];
        for (int32_t op = 0; op < nops; op++) it->strides[op][nd] = ops[op]->strides[d];
        nd++;
    }

    if (reorder) {
        /* Walking a reversed destination backwards is the same element-wise work done forwards. */
        for (int32_t d = 0; d < nd; d++) {
            if (it->strides[0][d] >= 0) continue;
            for (int32_t op = 0; op < nops; op++) {
                it->base[op] += (it->sizes[d] - 1) * it->strides[op][d] * it->elsize[op];
                it->strides[op][d] = -it->strides[op][d];
            }
        }
        /* Stable insertion sort, largest destination stride outermost, so writes go sequentially
         * (e.g. copying into a transposed view). Already-ordered layouts are left untouched. */
        for (int32_t d = 1; d < nd; d++) {
            for (int32_t e = d; e > 0 && it->strides[0][e - 1] < it->strides[0][e]; e--) {
                int64_t tmp = it->sizes[e];
                it->sizes[e] = it->sizes[e - 1];
                it->sizes[e - 1] = tmp;
                for (int32_t op = 0; op < nops; op++) {
                    tmp = it->strides[op][e];
                    it->strides[op][e] = it->strides[op][e - 1];
                    it->strides[op][e - 1] = tmp;
                }
            }
        }
    }

    /* Merge dim d into the kept outer dim when, for every operand, stepping the outer dim once equals
     * stepping d across its whole extent. Row-major order is preserved. */
    int32_t kept = 0;
    for (int32_t d = 0; d < nd; d++) {
        bool merge = kept > 0;
        for (int32_t op = 0; op < nops && merge; op++)
            merge = it->strides[op][kept - 1] == it->strides[op][d] * it->sizes[d];
        if (merge) {
            it->sizes[kept - 1] *= it->sizes[d];
            for (int32_t op = 0; op < nops; op++) it->strides[op][kept - 1] = it->strides[op][d];
        } else {
            it->sizes[kept] = it->sizes[d];
            for (int32_t op = 0; op < nops; op++) it->strides[op][kept] = it->strides[op][d];
            kept++;
        }
    }
    if (kept == 0) {
        it->sizes[0] = 1;
        for (int32_t op = 0; op < nops; op++) it->strides[op][0] = 1;
        kept = 1;
    }
    it->ndim = kept;
    it->rows = 1;
    for (int32_t d = 0; d < kept; d++) {
        it->idx[d] = 0;
        if (d < kept - 1) it->rows *= it->sizes[d];
    }
}

/* ---- transposes ---- */

#define NK_TILE 32

/*
 * dst's innermost dim is contiguous but src's is the one with unit stride (e.g. .contiguous() of a .t(), or
 * channels-last <-> contiguous). Row-by-row, every src read would touch a new cache line; copying the last two
 * dims in square tiles keeps a tile's worth of src lines in cache until all their elements have been used.
 * Same-dtype tiles move elements as plain integers of their size (a bf16 [1,128,256,256] channels-last to
 * contiguous went from 5.3 ms through the per-row cast functions to well under that); the tasks, one strip of
 * NK_TILE rows of one plane each, go to all threads.
 */
typedef struct nk_transpose_ctx {
    const nk_iter *it;
    nk_cast_fn cast;
    int64_t rows, cols, rtiles;
    int64_t drs, dcs, srs, scs;
    int64_t es; /* element size when both dtypes are the same, else 0 */
} nk_transpose_ctx;

#define NK_TILE_COPY(T)                                                                                       \
    static void nk_tile_copy_##T(char *d, int64_t drs, int64_t dcs, const char *s, int64_t srs, int64_t scs, \
                                 int64_t rn, int64_t cn) {                                                   \
        T *dd = (T *)d;                                                                                      \
        const T *ss = (const T *)s;                                                                          \
        for (int64_t r = 0; r < rn; r++)                                                                     \
            for (int64_t c = 0; c < cn; c++) dd[r * drs + c * dcs] = ss[r * srs + c * scs];                  \
    }
NK_TILE_COPY(uint8_t)
NK_TILE_COPY(uint16_t)
NK_TILE_COPY(uint32_t)
NK_TILE_COPY(uint64_t)

static void nk_transpose_range(void *ctx, int64_t begin, int64_t end) {
    const nk_transpose_ctx *c = (const nk_transpose_ctx *)ctx;
    const nk_iter *it = c->it;
    const int32_t nd = it->ndim;
    for (int64_t t = begin; t < end; t++) {
        int64_t plane = t / c->rtiles, off0 = 0, off1 = 0;
        const int64_t r0 = (t % c->rtiles) * NK_TILE;
        for (int32_t d = nd - 3; d >= 0; d--) {
            const int64_t i = plane % it->sizes[d];
            plane /= it->sizes[d];
            off0 += i * it->strides[0][d];
            off1 += i * it->strides[1][d];
        }
        char *dplane = it->base[0] + off0 * it->elsize[0];
        const char *splane = it->base[1] + off1 * it->elsize[1];
        const int64_t rn = c->rows - r0 < NK_TILE ? c->rows - r0 : NK_TILE;
        for (int64_t c0 = 0; c0 < c->cols; c0 += NK_TILE) {
            const int64_t cn = c->cols - c0 < NK_TILE ? c->cols - c0 : NK_TILE;
            char *d = dplane + (r0 * c->drs + c0 * c->dcs) * it->elsize[0];
            const char *s = splane + (r0 * c->srs + c0 * c->scs) * it->elsize[1];
            switch (c->es) {
            case 1: nk_tile_copy_uint8_t(d, c->drs, c->dcs, s, c->srs, c->scs, rn, cn); break;
            case 2: nk_tile_copy_uint16_t(d, c->drs, c->dcs, s, c->srs, c->scs, rn, cn); break;
            case 4: nk_tile_copy_uint32_t(d, c->drs, c->dcs, s, c->srs, c->scs, rn, cn); break;
            case 8: nk_tile_copy_uint64_t(d, c->drs, c->dcs, s, c->srs, c->scs, rn, cn); break;
            default:
                for (int64_t r = 0; r < rn; r++)
                    c->cast(d + r * c->drs * it->elsize[0], c->dcs, s + r * c->srs * it->elsize[1], c->scs, cn);
            }
        }
    }
}

static void nk_copy_transposed(const nk_iter *it, nk_cast_fn cast, bool same) {
    const int32_t nd = it->ndim;
    nk_transpose_ctx c = {.it = it, .cast = cast, .rows = it->sizes[nd - 2], .cols = it->sizes[nd - 1],
                          .drs = it->strides[0][nd - 2], .dcs = it->strides[0][nd - 1],
                          .srs = it->strides[1][nd - 2], .scs = it->strides[1][nd - 1],
                          .es = same ? it->elsize[0] : 0};
    c.rtiles = (c.rows + NK_TILE - 1) / NK_TILE;
    int64_t planes = 1;
    for (int32_t d = 0; d < nd - 2; d++) planes *= it->sizes[d];
    /* A task is NK_TILE rows of one plane: at least NK_TILE * NK_TILE elements unless the plane is smaller. */
    const int64_t per_task = (c.rows < NK_TILE ? c.rows : NK_TILE) * c.cols;
    const int64_t grain = per_task >= 32768 ? 1 : 32768 / (per_task > 0 ? per_task : 1);
    nk_parallel_for(planes * c.rtiles, grain, nk_transpose_range, &c);
}

/* ---- public kernels ---- */

/* The contiguous float <-> bfloat16/half conversions of the element-wise table (SIMD, per ISA, same
 * rounding as the generic loops), or NULL for another pair. */
typedef void (*nk_cvt_fn)(void *dst, const void *src, int64_t n);
static nk_cvt_fn nk_copy_simd_cvt(nk_dtype dst, nk_dtype src) {
    const nk_ew_f32_table *t = nk_ew_f32_select();
    if (dst == NK_BF16 && src == NK_F32) return (nk_cvt_fn)(void (*)(void))t->to_bf16;
    if (dst == NK_F32 && src == NK_BF16) return (nk_cvt_fn)(void (*)(void))t->from_bf16;
    if (dst == NK_F16 && src == NK_F32) return (nk_cvt_fn)(void (*)(void))t->to_f16;
    if (dst == NK_F32 && src == NK_F16) return (nk_cvt_fn)(void (*)(void))t->from_f16;
    return NULL;
}

typedef struct nk_copy_ctx {
    const nk_iter *it;
    nk_cast_fn cast;
    nk_cvt_fn cvt; /* for unit-stride rows, when the pair has one */
    nk_dtype dtype;
    bool same;     /* same dtype: memcpy for unit-stride rows */
} nk_copy_ctx;

static void nk_copy_row(const nk_copy_ctx *c, char *d, int64_t ds, const char *s, int64_t ss, int64_t n) {
    if (ss == 0 && n > 1) {
        /* Broadcast row: convert once, then replicate. */
        nk_elem value;
        void *vp = nk_elem_ptr(&value, c->dtype);
        c->cast(vp, 1, s, 1, 1);
        nk_fill_row(d, ds, vp, nk_dtype_size(c->dtype), n);
    } else if (ds == 1 && ss == 1 && c->same) {
        memmove(d, s, (size_t)n * nk_dtype_size(c->dtype));
    } else if (ds == 1 && ss == 1 && c->cvt) {
        c->cvt(d, s, n);
    } else {
        c->cast(d, ds, s, ss, n);
    }
}

/* Elements [begin, end) of the flattened iteration space (rows of the innermost dim, row-major over
 * the outer dims): each thread walks its own range. */
static void nk_copy_range(void *ctx, int64_t begin, int64_t end) {
    const nk_copy_ctx *c = (const nk_copy_ctx *)ctx;
    const nk_iter *it = c->it;
    const int32_t nd = it->ndim;
    const int64_t inner = it->sizes[nd - 1];
    int64_t row = begin / inner, col = begin % inner;
    int64_t idx[NK_MAX_DIMS];
    int64_t off0 = 0, off1 = 0;
    for (int32_t d = nd - 2; d >= 0; d--) {
        idx[d] = row % it->sizes[d];
        row /= it->sizes[d];
        off0 += idx[d] * it->strides[0][d];
        off1 += idx[d] * it->strides[1][d];
    }
    const int64_t ds = it->strides[0][nd - 1], ss = it->strides[1][nd - 1];
    for (int64_t pos = begin; pos < end;) {
        const int64_t n = inner - col < end - pos ? inner - col : end - pos;
        nk_copy_row(c, it->base[0] + (off0 + col * ds) * it->elsize[0], ds,
                    it->base[1] + (off1 + col * ss) * it->elsize[1], ss, n);
        pos += n;
        col = 0;
        for (int32_t d = nd - 2; d >= 0; d--) {
            off0 += it->strides[0][d];
            off1 += it->strides[1][d];
            if (++idx[d] < it->sizes[d]) break;
            off0 -= it->strides[0][d] * it->sizes[d];
            off1 -= it->strides[1][d] * it->sizes[d];
            idx[d] = 0;
        }
    }
}

nk_status nk_copy(const nk_tensor *dst, const nk_tensor *src) {
    int64_t n = 0, src_n = 0;
    if (nk_tensor_check(dst, &n) != NK_SUCCESS || nk_tensor_check(src, &src_n) != NK_SUCCESS)
        return NK_INVALID;
    if (!nk_same_shape(dst, src)) return NK_INVALID;
    if (n == 0) return NK_SUCCESS;

    if (dst->dtype == src->dtype && dst->data == src->data &&
        memcmp(dst->strides, src->strides, (size_t)dst->ndim * sizeof dst->strides[0]) == 0)
        return NK_SUCCESS; /* copy onto itself */

    const nk_tensor *const ops[2] = {dst, src};
    nk_iter it;
    nk_iter_init(&it, 2, ops, true);
    const int64_t ds = nk_iter_inner_stride(&it, 0);
    const int64_t ss = nk_iter_inner_stride(&it, 1);

    const nk_cast_fn cast = nk_cast_get(dst->dtype, src->dtype);
    if (it.ndim >= 2 && ds == 1 && ss != 0 && ss != 1 && it.strides[1][it.ndim - 2] == 1) {
        nk_copy_transposed(&it, cast, dst->dtype == src->dtype);
        return NK_SUCCESS;
    }
    nk_copy_ctx c = {.it = &it, .cast = cast, .cvt = nk_copy_simd_cvt(dst->dtype, src->dtype),
                     .dtype = dst->dtype, .same = dst->dtype == src->dtype};
    /* Split like PyTorch's copy (32K-element grain): a large copy is bandwidth that one core alone
     * does not reach. Ranges are disjoint parts of dst, so threads never write the same element. */
    nk_parallel_for(n, 32768, nk_copy_range, &c);
    return NK_SUCCESS;
}

nk_status nk_fill(const nk_tensor *dst, nk_scalar value) {
    int64_t n = 0;
    if (nk_tensor_check(dst, &n) != NK_SUCCESS) return NK_INVALID;
    if (n == 0) return NK_SUCCESS;

    /* Convert once with the copy rules: a Python float is a double, a Python int an int64. */
    nk_elem converted;
    void *cp = nk_elem_ptr(&converted, dst->dtype);
    if (value.is_float)
        nk_cast_get(dst->dtype, NK_F64)(cp, 1, &value.f, 1, 1);
    else
        nk_cast_get(dst->dtype, NK_I64)(cp, 1, &value.i, 1, 1);

    const nk_tensor *const ops[1] = {dst};
    nk_iter it;
    nk_iter_init(&it, 1, ops, true);
    const int64_t inner = nk_iter_inner_size(&it);
    const int64_t ds = nk_iter_inner_stride(&it, 0);
    const size_t dsize = nk_dtype_size(dst->dtype);
    for (int64_t r = 0; r < it.rows; r++) {
        nk_fill_row(nk_iter_ptr(&it, 0), ds, cp, dsize, inner);
        nk_iter_next_row(&it);
    }
    return NK_SUCCESS;
}
