/*
 * sort.c - sort and topk along one dimension.
 *
 * Every element becomes a 64-bit unsigned key whose unsigned order is PyTorch's ascending order
 * (NaN above everything and all NaNs equal, -0.0 equal to 0.0); descending order sorts the complement,
 * which puts NaN first as the CPU's descending comparator does. A slice is sorted as (key, position)
 * pairs with a stable merge sort, so equal keys keep their input order: the result of the CPU's
 * stable sort. Values are then copied from the input by position, keeping their bit patterns (-0.0,
 * NaN payloads) as the CPU's sort moves them. Slices run in parallel, each with its own scratch.
 */
#include "kernels_internal.h"

#include <stdatomic.h>
#include <stdlib.h>

typedef struct nk_kv {
    uint64_t key;
    int64_t pos;
} nk_kv;

#define NK_SIGN64 (UINT64_C(1) << 63)

static inline uint64_t nk_key_f64(double v) {
    if (v != v) return UINT64_MAX;
    if (v == 0.0) v = 0.0; /* -0.0 ties with 0.0 */
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return (u & NK_SIGN64) ? ~u : (u | NK_SIGN64);
}

static bool nk_sort_dtype_ok(nk_dtype t) {
    return nk_dtype_valid(t);
}

/* keys[i].key = key of element i of a strided row (stride in elements), complemented when flip. */
static void nk_keys_load(nk_kv *kv, const char *base, int64_t stride, int64_t n, nk_dtype dt, bool flip) {
    const uint64_t x = flip ? UINT64_MAX : 0;
#define NK_KEYS(T, EXPR)                                   \
    for (int64_t i = 0; i < n; i++) {                      \
        const T v = ((const T *)base)[i * stride];         \
        kv[i].key = (EXPR) ^ x;                            \
        kv[i].pos = i;                                     \
    }                                                      \
    break;
    switch (dt) {
    case NK_BOOL: NK_KEYS(uint8_t, (uint64_t)(v != 0))
    case NK_U8: NK_KEYS(uint8_t, (uint64_t)v)
    case NK_U16: NK_KEYS(uint16_t, (uint64_t)v)
    case NK_U32: NK_KEYS(uint32_t, (uint64_t)v)
    case NK_U64: NK_KEYS(uint64_t, v)
    case NK_I8: NK_KEYS(int8_t, (uint64_t)(int64_t)v ^ NK_SIGN64)
    case NK_I16: NK_KEYS(int16_t, (uint64_t)(int64_t)v ^ NK_SIGN64)
    case NK_I32: NK_KEYS(int32_t, (uint64_t)(int64_t)v ^ NK_SIGN64)
    case NK_I64: NK_KEYS(int64_t, (uint64_t)v ^ NK_SIGN64)
    case NK_F16: NK_KEYS(uint16_t, nk_key_f64(nk_f16_to_f32(v)))
    case NK_BF16: NK_KEYS(uint16_t, nk_key_f64(nk_bf16_to_f32(v)))
    case NK_F32: NK_KEYS(float, nk_key_f64(v))
    case NK_F64: NK_KEYS(double, nk_key_f64(v))
    default: break;
    }
#undef NK_KEYS
}

/* (key, pos) strictly before: the order of a stable sort, as a total order. */
static inline bool nk_kv_less(nk_kv a, nk_kv b) {
    return a.key < b.key || (a.key == b.key && a.pos < b.pos);
}

/* Sorts by (key, pos): the stable order of the keys when pos is increasing, and also the right order
 * for the pairs a heap selection leaves scrambled. */
static void nk_insertion_sort(nk_kv *a, int64_t n) {
    for (int64_t i = 1; i < n; i++) {
        const nk_kv v = a[i];
        int64_t j = i;
        while (j > 0 && nk_kv_less(v, a[j - 1])) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = v;
    }
}

/* Sorts a[0..n) by (key, pos) with tmp[0..n) as scratch; the result ends in a. */
static void nk_merge_sort(nk_kv *a, nk_kv *tmp, int64_t n) {
    const int64_t run = 24;
    for (int64_t b = 0; b < n; b += run) nk_insertion_sort(a + b, n - b < run ? n - b : run);
    nk_kv *src = a, *dst = tmp;
    for (int64_t w = run; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            const int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, o = lo;
            if (mid == hi || nk_kv_less(src[mid - 1], src[mid])) {
                /* Already in order: one copy. */
                memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof *src);
                continue;
            }
            while (i < mid && j < hi) dst[o++] = nk_kv_less(src[j], src[i]) ? src[j++] : src[i++];
            while (i < mid) dst[o++] = src[i++];
            while (j < hi) dst[o++] = src[j++];
        }
        nk_kv *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, (size_t)n * sizeof *a);
}

/* The k first pairs of a stable sort of a[0..n), in order, into a[0..k): a max-heap of the k best
 * pairs seen, then a sort of the heap. For k much smaller than n. */
static void nk_select_k(nk_kv *a, int64_t n, int64_t k, nk_kv *tmp) {
    nk_kv *h = tmp; /* h[0] is the worst of the k kept */
    for (int64_t i = 0; i < n; i++) {
        const nk_kv v = a[i];
        int64_t c;
        if (i < k) {
            c = i;
            while (c > 0 && nk_kv_less(h[(c - 1) / 2], v)) {
                h[c] = h[(c - 1) / 2];
                c = (c - 1) / 2;
            }
            h[c] = v;
            continue;
        }
        if (!nk_kv_less(v, h[0])) continue;
        c = 0;
        for (;;) {
            int64_t l = 2 * c + 1;
            if (l >= k) break;
            if (l + 1 < k && nk_kv_less(h[l], h[l + 1])) l++;
            if (!nk_kv_less(v, h[l])) break;
            h[c] = h[l];
            c = l;
        }
        h[c] = v;
    }
    memcpy(a, h, (size_t)k * sizeof *a);
    nk_merge_sort(a, tmp, k);
}

/* ---- introsort: the tie order of the CPU's non-stable sort ----
 *
 * For most dtypes PyTorch's CPU sort with stable=False is the C++ library's introsort over (value,
 * index) pairs compared by value only, so equal values come out in an order that depends on the exact
 * steps of that algorithm. Reproducing those steps (median-of-three pivot moved to the front, an
 * unguarded partition, heap sort once the depth budget of 2 floor(log2 n) is spent, then one insertion
 * pass with runs of 16) gives the same indices the CPU returns, tie for tie. Only keys are compared. */
#define NK_INTRO_RUN 16

static inline bool nk_key_lt(const nk_kv *a, const nk_kv *b) {
    return a->key < b->key;
}

static inline void nk_kv_swap(nk_kv *a, nk_kv *b) {
    const nk_kv t = *a;
    *a = *b;
    *b = t;
}

static void nk_heap_adjust(nk_kv *a, int64_t hole, int64_t len, nk_kv v) {
    const int64_t top = hole;
    int64_t child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (nk_key_lt(&a[child], &a[child - 1])) child--;
        a[hole] = a[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        a[hole] = a[child - 1];
        hole = child - 1;
    }
    int64_t parent = (hole - 1) / 2;
    while (hole > top && nk_key_lt(&a[parent], &v)) {
        a[hole] = a[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    a[hole] = v;
}

static void nk_heap_sort(nk_kv *a, int64_t len) {
    if (len >= 2) {
        for (int64_t parent = (len - 2) / 2;; parent--) {
            nk_heap_adjust(a, parent, len, a[parent]);
            if (parent == 0) break;
        }
    }
    for (int64_t last = len - 1; last > 0; last--) {
        const nk_kv v = a[last];
        a[last] = a[0];
        nk_heap_adjust(a, 0, last, v);
    }
}

static void nk_median_to_first(nk_kv *r, nk_kv *a, nk_kv *b, nk_kv *c) {
    if (nk_key_lt(a, b)) {
        if (nk_key_lt(b, c)) nk_kv_swap(r, b);
        else if (nk_key_lt(a, c)) nk_kv_swap(r, c);
        else nk_kv_swap(r, a);
    } else if (nk_key_lt(a, c)) {
        nk_kv_swap(r, a);
    } else if (nk_key_lt(b, c)) {
        nk_kv_swap(r, c);
    } else {
        nk_kv_swap(r, b);
    }
}

static void nk_intro_loop(nk_kv *first, nk_kv *last, int depth) {
    while (last - first > NK_INTRO_RUN) {
        if (depth == 0) {
            nk_heap_sort(first, last - first);
            return;
        }
        depth--;
        nk_median_to_first(first, first + 1, first + (last - first) / 2, last - 1);
        /* Partition [first + 1, last) around the pivot at first; both scans stop at it or a key equal. */
        nk_kv *lo = first + 1, *hi = last;
        for (;;) {
            while (nk_key_lt(lo, first)) lo++;
            hi--;
            while (nk_key_lt(first, hi)) hi--;
            if (!(lo < hi)) break;
            nk_kv_swap(lo, hi);
            lo++;
        }
        nk_intro_loop(lo, last, depth);
        last = lo;
    }
}

static void nk_linear_insert(nk_kv *p) {
    const nk_kv v = *p;
    while (nk_key_lt(&v, p - 1)) {
        *p = *(p - 1);
        p--;
    }
    *p = v;
}

static void nk_intro_insertion(nk_kv *first, nk_kv *last) {
    if (first == last) return;
    for (nk_kv *i = first + 1; i < last; i++) {
        if (nk_key_lt(i, first)) {
            const nk_kv v = *i;
            memmove(first + 1, first, (size_t)(i - first) * sizeof *first);
            *first = v;
        } else {
            nk_linear_insert(i);
        }
    }
}

static void nk_introsort(nk_kv *a, int64_t n) {
    if (n < 2) return;
    int lg = 63 - __builtin_clzll((unsigned long long)n);
    nk_intro_loop(a, a + n, 2 * lg);
    if (n > NK_INTRO_RUN) {
        nk_intro_insertion(a, a + NK_INTRO_RUN);
        /* Past the first run an element smaller than all before it cannot exist: the first run holds
         * the minimum after partitioning, so the insertion needs no bound check. */
        for (nk_kv *i = a + NK_INTRO_RUN; i < a + n; i++) nk_linear_insert(i);
    } else {
        nk_intro_insertion(a, a + n);
    }
}

typedef struct nk_sort_job {
    const nk_tensor *values, *indices, *in;
    int32_t dim;
    int64_t n, k;          /* slice length, results per slice */
    bool flip, topk, intro;
    int64_t outer_sizes[NK_MAX_DIMS];
    int32_t outer_ndim;
    int32_t outer_dims[NK_MAX_DIMS]; /* the dims other than dim, in order */
    atomic_int failed;
} nk_sort_job;

/* Element offset (in elements) of slice s of t: s unravelled over the dims other than dim. */
static int64_t nk_slice_offset(const nk_sort_job *j, const nk_tensor *t, int64_t s) {
    int64_t off = 0;
    for (int32_t q = j->outer_ndim - 1; q >= 0; q--) {
        const int64_t sz = j->outer_sizes[q];
        off += (s % sz) * t->strides[j->outer_dims[q]];
        s /= sz;
    }
    return off;
}

static void nk_sort_run(void *ctx, int64_t b, int64_t e) {
    nk_sort_job *j = (nk_sort_job *)ctx;
    const int64_t n = j->n;
    nk_kv *kv = (nk_kv *)malloc((size_t)(2 * n) * sizeof *kv);
    if (kv == NULL) {
        atomic_store(&j->failed, 1);
        return;
    }
    const nk_tensor *in = j->in;
    const size_t es = nk_dtype_size(in->dtype);
    const int64_t is = in->ndim ? in->strides[j->dim] : 1;
    for (int64_t s = b; s < e; s++) {
        const char *src = (const char *)in->data + nk_slice_offset(j, in, s) * (int64_t)es;
        nk_keys_load(kv, src, is, n, in->dtype, j->flip);
        if (j->topk && j->k * 8 < n) {
            nk_select_k(kv, n, j->k, kv + n);
        } else if (j->intro) {
            nk_introsort(kv, n);
        } else {
            nk_merge_sort(kv, kv + n, n);
        }
        if (j->values) {
            const nk_tensor *v = j->values;
            char *dst = (char *)v->data + nk_slice_offset(j, v, s) * (int64_t)es;
            const int64_t vs = (v->ndim ? v->strides[j->dim] : 1) * (int64_t)es;
            for (int64_t i = 0; i < j->k; i++) memcpy(dst + i * vs, src + kv[i].pos * is * (int64_t)es, es);
        }
        if (j->indices) {
            const nk_tensor *x = j->indices;
            int64_t *dst = (int64_t *)x->data + nk_slice_offset(j, x, s);
            const int64_t xs = x->ndim ? x->strides[j->dim] : 1;
            for (int64_t i = 0; i < j->k; i++) dst[i * xs] = kv[i].pos;
        }
    }
    free(kv);
}

/* Shared by sort and topk: outputs have in's shape with k along dim. */
static nk_status nk_sort_common(const nk_tensor *values, const nk_tensor *indices, const nk_tensor *in, int32_t dim,
                                int64_t k, bool flip, bool topk, bool intro) {
    int64_t ni, nv;
    if (nk_tensor_check(in, &ni) != NK_SUCCESS) return NK_INVALID;
    if (values && (nk_tensor_check(values, &nv) != NK_SUCCESS || values->dtype != in->dtype)) return NK_INVALID;
    if (indices && (nk_tensor_check(indices, &nv) != NK_SUCCESS || indices->dtype != NK_I64)) return NK_INVALID;
    if (!nk_sort_dtype_ok(in->dtype)) return NK_UNSUPPORTED;
    if (in->ndim == 0 ? dim != 0 : (dim < 0 || dim >= in->ndim)) return NK_INVALID;
    const int64_t n = in->ndim ? in->sizes[dim] : 1;
    if (k < 0 || k > n) return NK_INVALID;
    nk_sort_job *j = (nk_sort_job *)calloc(1, sizeof *j);
    if (j == NULL) return NK_NO_MEMORY;
    j->values = values;
    j->indices = indices;
    j->in = in;
    j->dim = dim;
    j->n = n;
    j->k = k;
    j->flip = flip;
    j->topk = topk;
    j->intro = intro;
    int64_t slices = 1;
    for (int32_t d = 0; d < in->ndim; d++) {
        const nk_tensor *outs[2] = {values, indices};
        for (int o = 0; o < 2; o++) {
            const nk_tensor *t = outs[o];
            if (t && (t->ndim != in->ndim || t->sizes[d] != (d == dim ? k : in->sizes[d]))) {
                free(j);
                return NK_INVALID;
            }
        }
        if (d == dim) continue;
        j->outer_dims[j->outer_ndim] = d;
        j->outer_sizes[j->outer_ndim++] = in->sizes[d];
        slices *= in->sizes[d];
    }
    atomic_init(&j->failed, 0);
    nk_status st = NK_SUCCESS;
    if (slices > 0 && k > 0) {
        const int64_t work = n > 1 ? n * 8 : 1;
        nk_parallel_for(slices, work >= 32768 ? 1 : 32768 / work, nk_sort_run, j);
        if (atomic_load(&j->failed)) st = NK_NO_MEMORY;
    }
    free(j);
    return st;
}

nk_status nk_sort(const nk_tensor *values, const nk_tensor *indices, const nk_tensor *in, int32_t dim,
                  bool descending) {
    const int64_t n = in && in->ndim > 0 && dim >= 0 && dim < in->ndim ? in->sizes[dim] : 1;
    return nk_sort_common(values, indices, in, dim, n, descending, false, false);
}

nk_status nk_sort_unstable(const nk_tensor *values, const nk_tensor *indices, const nk_tensor *in, int32_t dim,
                           bool descending) {
    const int64_t n = in && in->ndim > 0 && dim >= 0 && dim < in->ndim ? in->sizes[dim] : 1;
    return nk_sort_common(values, indices, in, dim, n, descending, false, true);
}

nk_status nk_topk(const nk_tensor *values, const nk_tensor *indices, const nk_tensor *in, int32_t dim, int64_t k,
                  bool largest) {
    return nk_sort_common(values, indices, in, dim, k, largest, true, false);
}

/* ---- isin --------------------------------------------------------------------------------------- */

static bool nk_is_float(nk_dtype t) {
    return t == NK_F16 || t == NK_BF16 || t == NK_F32 || t == NK_F64;
}

static int nk_u64_cmp(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : (x > y);
}

typedef struct nk_isin_job {
    const nk_tensor *out, *elements;
    const uint64_t *keys;
    int64_t nkeys;
    bool invert;
} nk_isin_job;

static bool nk_isin_find(const uint64_t *keys, int64_t n, uint64_t k) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (keys[mid] < k) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && keys[lo] == k;
}

static void nk_isin_run(void *ctx, int64_t b, int64_t e) {
    const nk_isin_job *j = (const nk_isin_job *)ctx;
    const nk_tensor *el = j->elements, *out = j->out;
    const bool fl = nk_is_float(el->dtype);
    const int64_t es = (int64_t)nk_dtype_size(el->dtype);
    nk_kv kv[256];
    /* Rows of the last dim, unravelled from the flat row index. */
    const int32_t nd = el->ndim;
    const int64_t len = nd ? el->sizes[nd - 1] : 1;
    const int64_t est = nd ? el->strides[nd - 1] : 0, ost = nd ? out->strides[nd - 1] : 0;
    for (int64_t r = b; r < e; r++) {
        int64_t q = r, eo = 0, oo = 0;
        for (int32_t d = nd - 2; d >= 0; d--) {
            const int64_t c = q % el->sizes[d];
            q /= el->sizes[d];
            eo += c * el->strides[d];
            oo += c * out->strides[d];
        }
        for (int64_t i = 0; i < len; i += 256) {
            const int64_t n = len - i < 256 ? len - i : 256;
            nk_keys_load(kv, (const char *)el->data + (eo + i * est) * es, est, n, el->dtype, false);
            for (int64_t t = 0; t < n; t++) {
                const bool nan = fl && kv[t].key == UINT64_MAX;
                const bool hit = !nan && nk_isin_find(j->keys, j->nkeys, kv[t].key);
                ((uint8_t *)out->data)[oo + (i + t) * ost] = (uint8_t)(hit != j->invert);
            }
        }
    }
}

nk_status nk_isin(const nk_tensor *out, const nk_tensor *elements, const nk_tensor *test, bool invert) {
    int64_t no, ne, nt;
    if (nk_tensor_check(out, &no) || nk_tensor_check(elements, &ne) || nk_tensor_check(test, &nt)) return NK_INVALID;
    if (out->dtype != NK_BOOL || !nk_same_shape(out, elements) || elements->dtype != test->dtype) return NK_INVALID;
    if (!nk_dtype_valid(elements->dtype)) return NK_UNSUPPORTED;
    if (ne == 0) return NK_SUCCESS;
    uint64_t *keys = (uint64_t *)malloc((size_t)(nt > 0 ? nt : 1) * sizeof(uint64_t));
    nk_kv *kv = (nk_kv *)malloc(256 * sizeof(nk_kv));
    if (keys == NULL || kv == NULL) {
        free(keys);
        free(kv);
        return NK_NO_MEMORY;
    }
    /* The test keys in row-major order of test, NaN dropped (it matches nothing), sorted. */
    int64_t m = 0;
    if (nt > 0) {
        const int32_t nd = test->ndim;
        const int64_t len = nd ? test->sizes[nd - 1] : 1, st = nd ? test->strides[nd - 1] : 0;
        const int64_t es = (int64_t)nk_dtype_size(test->dtype);
        const bool fl = nk_is_float(test->dtype);
        for (int64_t r = 0; r < nt / len; r++) {
            int64_t q = r, off = 0;
            for (int32_t d = nd - 2; d >= 0; d--) {
                off += (q % test->sizes[d]) * test->strides[d];
                q /= test->sizes[d];
            }
            for (int64_t i = 0; i < len; i += 256) {
                const int64_t n = len - i < 256 ? len - i : 256;
                nk_keys_load(kv, (const char *)test->data + (off + i * st) * es, st, n, test->dtype, false);
                for (int64_t t = 0; t < n; t++)
                    if (!(fl && kv[t].key == UINT64_MAX)) keys[m++] = kv[t].key;
            }
        }
        qsort(keys, (size_t)m, sizeof *keys, nk_u64_cmp);
    }
    free(kv);
    nk_isin_job j = {.out = out, .elements = elements, .keys = keys, .nkeys = m, .invert = invert};
    const int32_t nd = elements->ndim;
    const int64_t len = nd ? elements->sizes[nd - 1] : 1;
    nk_parallel_for(ne / len, len >= 4096 ? 1 : 4096 / len, nk_isin_run, &j);
    free(keys);
    return NK_SUCCESS;
}
