/* ops.c - the collectives and point-to-point messages, built on the call header + barrier protocol:
 *   1. each rank writes its header (what it calls, its pieces: staged or in device memory) and arrives;
 *   2. after everyone arrived, every rank checks all headers agree, then reads what it needs from the
 *      peers' slots or device memory (and, for all_reduce/reduce, writes its slice into theirs);
 *   3. if any piece lived in device memory, a second barrier keeps the owners from returning (and
 *      reusing their buffers) before the peers are done. */
#include "collectives_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define NCL_ALIGN(x) (((x) + 63) & ~(uint64_t)63)

static const char *ncl_op_name(int op)
{
    switch (op) {
    case NCL_OP_BARRIER: return "barrier";
    case NCL_OP_ALL_REDUCE: return "all_reduce";
    case NCL_OP_REDUCE: return "reduce";
    case NCL_OP_BROADCAST: return "broadcast";
    case NCL_OP_ALL_GATHER: return "all_gather";
    case NCL_OP_REDUCE_SCATTER: return "reduce_scatter";
    case NCL_OP_ALL_TO_ALL: return "all_to_all";
    case NCL_OP_GATHER: return "gather";
    case NCL_OP_SCATTER: return "scatter";
    }
    return "unknown";
}

/* Appends to buf (size n, holding *k characters) without running past its end. */
static void ncl_append(char *buf, size_t n, size_t *k, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void ncl_append(char *buf, size_t n, size_t *k, const char *fmt, ...)
{
    if (*k + 1 >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *k, n - *k, fmt, ap);
    va_end(ap);
    if (w > 0)
        *k = *k + (size_t)w < n ? *k + (size_t)w : n - 1;
}

static void ncl_header_str(const ncl_header *h, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = 0;
    ncl_append(buf, n, &k, "%s(dtype=%s", ncl_op_name(h->op), ncl_dtype_name((ncl_dtype)h->dtype));
    if (h->count >= 0)
        ncl_append(buf, n, &k, ", count=%lld", (long long)h->count);
    if (h->ndim >= 0) {
        ncl_append(buf, n, &k, ", shape=[");
        for (int i = 0; i < h->ndim; i++) {
            if (i == NCL_SHAPE_DIMS) {
                ncl_append(buf, n, &k, ", ...");
                break;
            }
            ncl_append(buf, n, &k, "%s%lld", i ? ", " : "", (long long)h->shape[i]);
        }
        ncl_append(buf, n, &k, "]");
    }
    if (h->op == NCL_OP_ALL_REDUCE || h->op == NCL_OP_REDUCE || h->op == NCL_OP_REDUCE_SCATTER)
        ncl_append(buf, n, &k, ", op=%s", ncl_redop_name((ncl_redop)h->redop));
    if (h->root >= 0)
        ncl_append(buf, n, &k, ", root=%d", h->root);
    ncl_append(buf, n, &k, ")");
}

typedef struct ncl_call {
    uint64_t id;
    const char *what;
    bool end_barrier;
} ncl_call;

/*
 * Publishes this rank's header and pieces, passes the start barrier and checks that every rank called
 * the same thing. Pieces are staged in the slot when stage is true and they fit. meta[0..nmeta) are
 * data-less pieces (sizes only) placed after the data pieces, for ops whose sizes differ per rank.
 * count < 0: not compared (per-rank sizes, checked by the op).
 */
static ncl_status ncl_begin_meta(ncl_comm *c, ncl_call *k, int op, ncl_dtype dt, ncl_redop redop, int root,
                                 int64_t count, double factor, const void *const *ptrs, const int64_t *bytes,
                                 int npieces, bool stage, const int64_t *meta, int nmeta, const char *what)
{
    k->what = what;
    k->end_barrier = false;
    k->id = 0;
    int ndim = c->next_ndim; /* the announced shape belongs to this call only, even if it fails early */
    c->next_ndim = -1;
    ncl_status st = ncl_check_usable(c, what);
    if (st != NCL_SUCCESS)
        return st;
    k->id = c->calls++;
    ncl_header *h = ncl_header_of(c, c->rank, k->id);
    uint64_t total = 0;
    for (int i = 0; i < npieces; i++)
        total += NCL_ALIGN((uint64_t)bytes[i]);
    stage = stage && total <= NCL_STAGE_BYTES;
    h->call = k->id;
    h->op = op;
    h->dtype = (int32_t)dt;
    h->redop = (int32_t)redop;
    h->root = root;
    h->count = count;
    h->factor = factor;
    h->npieces = npieces;
    h->zero_copy = 0;
    h->ndim = ndim;
    for (int i = 0; i < ndim && i < NCL_SHAPE_DIMS; i++)
        h->shape[i] = c->next_shape[i];
    char *slot = ncl_slot(c, c->rank, k->id);
    uint64_t off = 0;
    ncl_status local = NCL_SUCCESS;
    for (int i = 0; i < npieces && local == NCL_SUCCESS; i++) {
        ncl_piece *p = &h->pieces[i];
        c->own_ptr[i] = ptrs[i];
        if (bytes[i] > 0 && ptrs[i] == NULL) {
            local = ncl_error(NCL_INVALID, "%s: NULL buffer for %lld bytes", what, (long long)bytes[i]);
        } else if (stage) {
            memset(p, 0, sizeof *p);
            p->where = NCL_PIECE_SLOT;
            p->bytes = bytes[i];
            p->offset = off;
            if (bytes[i] > 0)
                memcpy(slot + off, ptrs[i], (size_t)bytes[i]);
            off += NCL_ALIGN((uint64_t)bytes[i]);
        } else {
            local = ncl_piece_describe(ptrs[i], bytes[i], p, what);
            if (bytes[i] > 0)
                h->zero_copy = 1;
        }
    }
    for (int i = 0; i < nmeta; i++) {
        ncl_piece *p = &h->pieces[npieces + i];
        memset(p, 0, sizeof *p);
        p->bytes = meta[i];
    }
    /* A rank with bad arguments still takes part in the barrier, flagged, so that every rank fails now
     * rather than its peers timing out. */
    char local_msg[768] = "";
    if (local != NCL_SUCCESS) {
        h->npieces = -1;
        snprintf(local_msg, sizeof local_msg, "%s", ncl_last_error());
        snprintf(h->reject_reason, sizeof h->reject_reason, "%s", local_msg);
    }
    st = ncl_phase_barrier(c, what);
    if (st != NCL_SUCCESS)
        return st;
    if (local != NCL_SUCCESS)
        return ncl_error(local, "%s", local_msg);
    bool zero_copy = false;
    for (int r = 0; r < c->size; r++) {
        const ncl_header *o = ncl_header_of(c, r, k->id);
        zero_copy |= o->zero_copy != 0;
        if (r == c->rank)
            continue;
        if (o->npieces < 0)
            return ncl_error(NCL_INVALID, "%s: rank %d could not take part in call #%llu: %s", what, r,
                             (unsigned long long)h->call, o->reject_reason);
        bool same = o->call == h->call && o->op == h->op && o->dtype == h->dtype && o->root == h->root &&
                    o->count == h->count;
        if (same && (op == NCL_OP_ALL_REDUCE || op == NCL_OP_REDUCE || op == NCL_OP_REDUCE_SCATTER))
            same = o->redop == h->redop;
        if (!same) {
            char mine[320], theirs[320];
            ncl_header_str(h, mine, sizeof mine);
            ncl_header_str(o, theirs, sizeof theirs);
            return ncl_error(NCL_MISMATCH,
                             "%s: ranks called mismatched collectives: rank %d called %s but rank %d called %s "
                             "(call #%llu)",
                             what, c->rank, mine, r, theirs, (unsigned long long)h->call);
        }
    }
    k->end_barrier = zero_copy;
    return NCL_SUCCESS;
}

ncl_status ncl_call_reject(ncl_comm *c, const char *what, const char *reason)
{
    ncl_status st = ncl_check_usable(c, what);
    if (st != NCL_SUCCESS)
        return st;
    c->next_ndim = -1;
    uint64_t id = c->calls++;
    ncl_header *h = ncl_header_of(c, c->rank, id);
    memset(h, 0, sizeof *h);
    h->call = id;
    h->npieces = -1;
    h->ndim = -1;
    snprintf(h->reject_reason, sizeof h->reject_reason, "%s", reason ? reason : "invalid arguments");
    st = ncl_phase_barrier(c, what);
    if (st != NCL_SUCCESS)
        return st;
    return ncl_error(NCL_INVALID, "%s: %s", what, h->reject_reason);
}

static ncl_status ncl_begin(ncl_comm *c, ncl_call *k, int op, ncl_dtype dt, ncl_redop redop, int root,
                            int64_t count, double factor, const void *const *ptrs, const int64_t *bytes,
                            int npieces, bool stage, const char *what)
{
    return ncl_begin_meta(c, k, op, dt, redop, root, count, factor, ptrs, bytes, npieces, stage, NULL, 0, what);
}

static ncl_status ncl_end(ncl_comm *c, ncl_call *k, ncl_status st)
{
    /* Even after a local failure the peers may be reading this rank's memory: wait for them. */
    if (k->end_barrier && st != NCL_PEER_DEAD && st != NCL_TIMEOUT && !c->broken) {
        ncl_status st2 = ncl_phase_barrier(c, k->what);
        if (st == NCL_SUCCESS)
            st = st2;
    }
    return st;
}

static ncl_status ncl_count_check(int64_t count, ncl_dtype dt, const char *what)
{
    if ((unsigned)dt >= NCL_DTYPE_COUNT)
        return ncl_error(NCL_INVALID, "%s: invalid dtype %d", what, (int)dt);
    if (count < 0)
        return ncl_error(NCL_INVALID, "%s: negative count %lld", what, (long long)count);
    return NCL_SUCCESS;
}

static ncl_status ncl_root_check(ncl_comm *c, int root, const char *what)
{
    if (c != NULL && (root < 0 || root >= c->size))
        return ncl_error(NCL_INVALID, "%s: root %d out of range for %d ranks", what, root, c->size);
    return NCL_SUCCESS;
}

/* Copies of at least this many bytes bypass the caches (non-temporal stores): the destination would not
 * stay in this core's cache anyway, and skipping the read-for-ownership of every destination line saves a
 * third of the memory traffic. */
#define NCL_STREAM_BYTES ((size_t)1 << 20)

#if defined(__x86_64__)
static void ncl_stream_copy(char *dst, const char *src, size_t n)
{
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > n)
        head = n;
    memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i)), b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32)), d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + i, src + i, n - i);
}
/* Non-temporal stores are weakly ordered: fence them before a peer may read the data. */
static void ncl_stream_fence(void) { _mm_sfence(); }
#else
static void ncl_stream_copy(char *dst, const char *src, size_t n) { memcpy(dst, src, n); }
static void ncl_stream_fence(void) {}
#endif

#if defined(__x86_64__)
/* src to every one of dsts (all with the same alignment mod 16) with non-temporal stores, one 64-byte
 * line to all destinations at a time: the source is read as one stream while every destination stream is
 * written. Copying 64 KiB blocks to one destination after another (reads, then writes from cache) was
 * 15% slower for a 2-rank 64 MiB all_gather. */
static void ncl_stream_copy_all(char *const *dsts, int ndst, const char *src, size_t n)
{
    size_t head = (16 - ((uintptr_t)dsts[0] & 15)) & 15;
    if (head > n)
        head = n;
    for (int j = 0; j < ndst; j++)
        memcpy(dsts[j], src, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i)), b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32)), d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        for (int j = 0; j < ndst; j++) {
            char *q = dsts[j] + i;
            _mm_stream_si128((__m128i *)q, a);
            _mm_stream_si128((__m128i *)(q + 16), b);
            _mm_stream_si128((__m128i *)(q + 32), c);
            _mm_stream_si128((__m128i *)(q + 48), d);
        }
    }
    for (int j = 0; j < ndst; j++)
        memcpy(dsts[j] + i, src + i, n - i);
}
#endif

/* Bytes of src copied to every destination before moving on: read from memory once, then from cache. */
#define NCL_COPY_BLOCK ((size_t)64 * 1024)

/* src to every one of dsts (none overlapping src). */
static void ncl_copy_to_all(char *const *dsts, int ndst, const void *src, size_t bytes)
{
    bool stream = bytes >= NCL_STREAM_BYTES;
#if defined(__x86_64__)
    bool same_align = true;
    for (int j = 1; j < ndst; j++)
        same_align &= (((uintptr_t)dsts[j] ^ (uintptr_t)dsts[0]) & 15) == 0;
    if (stream && ndst > 0 && same_align) {
        ncl_stream_copy_all(dsts, ndst, src, bytes);
        ncl_stream_fence();
        return;
    }
#endif
    for (size_t b0 = 0; b0 < bytes; b0 += NCL_COPY_BLOCK) {
        size_t m = bytes - b0 < NCL_COPY_BLOCK ? bytes - b0 : NCL_COPY_BLOCK;
        for (int j = 0; j < ndst; j++) {
            if (stream)
                ncl_stream_copy(dsts[j] + b0, (const char *)src + b0, m);
            else
                memcpy(dsts[j] + b0, (const char *)src + b0, m);
        }
    }
    if (stream)
        ncl_stream_fence();
}

/* memmove, streaming when large and the ranges do not overlap. */
static void ncl_copy(void *dst, const void *src, size_t n)
{
    if (dst == src || n == 0)
        return;
    const char *d = dst, *s = src;
    if (n >= NCL_STREAM_BYTES && (d + n <= s || s + n <= d)) {
        ncl_stream_copy(dst, src, n);
        ncl_stream_fence();
    } else {
        memmove(dst, src, n);
    }
}

/* Elements [lo, hi) of the reduction over srcs, written to every one of dsts, streamed out when the
 * slice is large. Each chunk of every source is read before that chunk of any destination is written,
 * so a destination may be one of the sources (in place). */
static ncl_status ncl_reduce_slice(char *const *dsts, int ndst, const void *const *srcs, const double *factors,
                                   int nsrc, int64_t lo, int64_t hi, ncl_dtype dt, ncl_redop redop)
{
    size_t es = ncl_dtype_size(dt);
    const void *s[NCL_MAX_RANKS];
    char *d[NCL_MAX_RANKS];
    for (int r = 0; r < nsrc; r++)
        s[r] = (const char *)srcs[r] + (size_t)lo * es;
    for (int j = 0; j < ndst; j++)
        d[j] = dsts[j] + (size_t)lo * es;
    bool stream = (size_t)(hi - lo) * es >= NCL_STREAM_BYTES;
    return ncl_reduce_to(d, ndst, stream, s, factors, nsrc, hi - lo, dt, redop, nsrc);
}

static ncl_status ncl_reduce_common(ncl_comm *c, const void *send, void *recv, int64_t count, ncl_dtype dt,
                                    ncl_redop redop, double factor, int root, const char *what)
{
    int n = c->size, op = root < 0 ? NCL_OP_ALL_REDUCE : NCL_OP_REDUCE;
    size_t es = ncl_dtype_size(dt), bytes = (size_t)count * es;
    bool has_out = root < 0 || root == c->rank;
    const void *srcs[NCL_MAX_RANKS];
    double factors[NCL_MAX_RANKS];
    ncl_call k;
    ncl_status st;
    if (bytes <= NCL_STAGE_BYTES) {
        /* One shot: every rank (the root for reduce) reduces all staged inputs itself. */
        int64_t b = (int64_t)bytes;
        st = ncl_begin(c, &k, op, dt, redop, root, count, factor, &send, &b, 1, true, what);
        if (st != NCL_SUCCESS)
            return ncl_end(c, &k, st);
        if (has_out) {
            for (int r = 0; r < n && st == NCL_SUCCESS; r++) {
                st = ncl_piece_ptr(c, r, k.id, 0, (void **)&srcs[r], what);
                factors[r] = ncl_header_of(c, r, k.id)->factor;
            }
            if (st == NCL_SUCCESS)
                st = ncl_reduce_local(recv, srcs, factors, n, count, dt, redop, n);
        }
        return ncl_end(c, &k, st);
    }
    /* Large: rank i reduces slice i of every input and writes it to every output (or the root's). */
    const void *ptrs[2] = {send, has_out ? recv : NULL};
    int64_t b[2] = {(int64_t)bytes, has_out ? (int64_t)bytes : 0};
    st = ncl_begin(c, &k, op, dt, redop, root, count, factor, ptrs, b, 2, false, what);
    if (st != NCL_SUCCESS)
        return ncl_end(c, &k, st);
    int64_t chunk = ((count + n - 1) / n + 63) & ~(int64_t)63;
    int64_t lo = chunk * c->rank, hi = lo + chunk < count ? lo + chunk : count;
    char *dsts[NCL_MAX_RANKS];
    int ndst = 0;
    for (int r = 0; r < n && st == NCL_SUCCESS; r++) {
        st = ncl_piece_ptr(c, r, k.id, 0, (void **)&srcs[r], what);
        factors[r] = ncl_header_of(c, r, k.id)->factor;
        if (st == NCL_SUCCESS && (root < 0 || r == root))
            st = ncl_piece_ptr(c, r, k.id, 1, (void **)&dsts[ndst++], what);
    }
    if (st == NCL_SUCCESS)
        st = ncl_reduce_slice(dsts, ndst, srcs, factors, n, lo, hi, dt, redop);
    return ncl_end(c, &k, st);
}

ncl_status ncl_all_reduce(ncl_comm *c, const void *send, void *recv, int64_t count, ncl_dtype dt,
                          ncl_redop op, double factor)
{
    const char *what = "ncl_all_reduce";
    ncl_status st = ncl_count_check(count, dt, what);
    if (st == NCL_SUCCESS)
        st = ncl_reduce_check(dt, op, what);
    if (st == NCL_SUCCESS)
        st = ncl_check_usable(c, what);
    if (st != NCL_SUCCESS)
        return st;
    return ncl_reduce_common(c, send, recv, count, dt, op, factor, -1, what);
}

ncl_status ncl_reduce(ncl_comm *c, const void *send, void *recv, int64_t count, ncl_dtype dt, ncl_redop op,
                      double factor, int root)
{
    const char *what = "ncl_reduce";
    ncl_status st = ncl_count_check(count, dt, what);
    if (st == NCL_SUCCESS)
        st = ncl_reduce_check(dt, op, what);
    if (st == NCL_SUCCESS)
        st = ncl_check_usable(c, what);
    if (st == NCL_SUCCESS)
        st = ncl_root_check(c, root, what);
    if (st != NCL_SUCCESS)
        return st;
    return ncl_reduce_common(c, send, recv, count, dt, op, factor, root, what);
}

ncl_status ncl_broadcast(ncl_comm *c, void *buf, int64_t count, ncl_dtype dt, int root)
{
    const char *what = "ncl_broadcast";
    ncl_call k;
    ncl_status st = ncl_count_check(count, dt, what);
    if (st == NCL_SUCCESS)
        st = ncl_check_usable(c, what);
    if (st == NCL_SUCCESS)
        st = ncl_root_check(c, root, what);
    if (st != NCL_SUCCESS)
        return st;
    int64_t bytes = count * (int64_t)ncl_dtype_size(dt);
    const void *p = buf;
    int64_t b = c->rank == root ? bytes : 0;
    st = ncl_begin(c, &k, NCL_OP_BROADCAST, dt, NCL_SUM, root, count, 0, &p, &b, 1, true, what);
    if (st == NCL_SUCCESS && c->rank != root) {
        void *src;
        st = ncl_piece_ptr(c, root, k.id, 0, &src, what);
        if (st == NCL_SUCCESS)
            ncl_copy(buf, src, (size_t)bytes);
    }
    return ncl_end(c, &k, st);
}

ncl_status ncl_all_gather(ncl_comm *c, const void *send, void *const *recv, int64_t count, ncl_dtype dt)
{
    const char *what = "ncl_all_gather";
    ncl_call k;
    ncl_status st = ncl_count_check(count, dt, what);
    if (st == NCL_SUCCESS)
        st = ncl_check_usable(c, what);
    if (st != NCL_SUCCESS)
        return st;
    int n = c->size;
    int64_t bytes = count * (int64_t)ncl_dtype_size(dt);
    if ((uint64_t)bytes <= NCL_STAGE_BYTES) {
        /* Small: staged once; every rank copies all contributions out of the slots. */
        st = ncl_begin(c, &k, NCL_OP_ALL_GATHER, dt, NCL_SUM, -1, count, 0, &send, &bytes, 1, true, what);
        for (int r = 0; r < n && st == NCL_SUCCESS; r++) {
            void *src;
            st = ncl_piece_ptr(c, r, k.id, 0, &src, what);
            if (st == NCL_SUCCESS)
                ncl_copy(recv[r], src, (size_t)bytes);
        }
        return ncl_end(c, &k, st);
    }
    /* Large: every rank writes its contribution into every rank's output, block by block, so each input
     * is read from memory once instead of once per rank. Pieces: the input, then the outputs. */
    const void *ptrs[NCL_MAX_RANKS + 1];
    int64_t b[NCL_MAX_RANKS + 1];
    ptrs[0] = send;
    b[0] = bytes;
    for (int r = 0; r < n; r++) {
        ptrs[1 + r] = recv[r];
        b[1 + r] = bytes;
    }
    st = ncl_begin(c, &k, NCL_OP_ALL_GATHER, dt, NCL_SUM, -1, count, 0, ptrs, b, n + 1, false, what);
    char *dsts[NCL_MAX_RANKS];
    int ndst = 0;
    for (int j = 0; j < n && st == NCL_SUCCESS; j++) {
        int q = (c->rank + j) % n; /* ranks start on different targets */
        st = ncl_piece_ptr(c, q, k.id, 1 + c->rank, (void **)&dsts[ndst], what);
        if (st == NCL_SUCCESS && dsts[ndst] != send) /* in place on this rank: nothing to copy */
            ndst++;
    }
    if (st == NCL_SUCCESS)
        ncl_copy_to_all(dsts, ndst, send, (size_t)bytes);
    return ncl_end(c, &k, st);
}

ncl_status ncl_reduce_scatter(ncl_comm *c, const void *const *send, void *recv, int64_t count, ncl_dtype dt,
                              ncl_redop op, double factor)
{
    const char *what = "ncl_reduce_scatter";
    const void *srcs[NCL_MAX_RANKS];
    double factors[NCL_MAX_RANKS];
    int64_t bytes[NCL_MAX_RANKS];
    ncl_call k;
    ncl_status st = ncl_count_check(count, dt, what);
    if (st == NCL_SUCCESS)
        st = ncl_reduce_check(dt, op, what);
    if (st == NCL_SUCCESS)
        st = ncl_check_usable(c, what);
    if (st != NCL_SUCCESS)
        return st;
    for (int r = 0; r < c->size; r++)
        bytes[r] = count * (int64_t)ncl_dtype_size(dt);
    st = ncl_begin(c, &k, NCL_OP_REDUCE_SCATTER, dt, op, -1, count, factor, (const void *const *)send, bytes,
                   c->size, true, what);
    for (int r = 0; r < c->size && st == NCL_SUCCESS; r++) {
        st = ncl_piece_ptr(c, r, k.id, c->rank, (void **)&srcs[r], what);
        factors[r] = ncl_header_of(c, r, k.id)->factor;
    }
    if (st == NCL_SUCCESS) {
        char *dst = recv;
        st = ncl_reduce_slice(&dst, 1, srcs, factors, c->size, 0, count, dt, op);
    }
    return ncl_end(c, &k, st);
}

ncl_status ncl_all_to_all(ncl_comm *c, const void *const *send, const int64_t *send_counts, void *const *recv,
                          const int64_t *recv_counts, ncl_dtype dt)
{
    const char *what = "ncl_all_to_all";
    int64_t bytes[NCL_MAX_RANKS], rbytes[NCL_MAX_RANKS];
    ncl_call k;
    ncl_status st = ncl_count_check(0, dt, what);
    if (st == NCL_SUCCESS)
        st = ncl_check_usable(c, what);
    if (st != NCL_SUCCESS)
        return st;
    int n = c->size;
    int64_t es = (int64_t)ncl_dtype_size(dt);
    for (int r = 0; r < n; r++) {
        if (send_counts[r] < 0 || recv_counts[r] < 0)
            return ncl_error(NCL_INVALID, "%s: negative count for rank %d", what, r);
        bytes[r] = send_counts[r] * es;
        rbytes[r] = recv_counts[r] * es;
    }
    /* The receive sizes ride along as data-less pieces so every rank checks the whole size matrix and
     * all ranks fail together on a mismatch. */
    st = ncl_begin_meta(c, &k, NCL_OP_ALL_TO_ALL, dt, NCL_SUM, -1, -1, 0, (const void *const *)send, bytes, n,
                        true, rbytes, n, what);
    for (int r = 0; r < n && st == NCL_SUCCESS; r++) {
        for (int q = 0; q < n; q++) {
            int64_t sent = ncl_header_of(c, r, k.id)->pieces[q].bytes;
            int64_t expected = ncl_header_of(c, q, k.id)->pieces[n + r].bytes;
            if (sent != expected) {
                st = ncl_error(NCL_MISMATCH,
                               "%s: rank %d sends %lld elements to rank %d, but rank %d expects %lld from rank %d",
                               what, r, (long long)(sent / es), q, q, (long long)(expected / es), r);
                break;
            }
        }
    }
    for (int r = 0; r < n && st == NCL_SUCCESS; r++) {
        void *src;
        st = ncl_piece_ptr(c, r, k.id, c->rank, &src, what);
        if (st == NCL_SUCCESS)
            ncl_copy(recv[r], src, (size_t)rbytes[r]);
    }
    return ncl_end(c, &k, st);
}

ncl_status ncl_gather(ncl_comm *c, const void *send, void *const *recv, int64_t count, ncl_dtype dt, int root)
{
    const char *what = "ncl_gather";
    ncl_call k;
    ncl_status st = ncl_count_check(count, dt, what);
    if (st == NCL_SUCCESS)
        st = ncl_check_usable(c, what);
    if (st == NCL_SUCCESS)
        st = ncl_root_check(c, root, what);
    if (st != NCL_SUCCESS)
        return st;
    int64_t bytes = count * (int64_t)ncl_dtype_size(dt);
    st = ncl_begin(c, &k, NCL_OP_GATHER, dt, NCL_SUM, root, count, 0, &send, &bytes, 1, true, what);
    for (int r = 0; r < c->size && st == NCL_SUCCESS && c->rank == root; r++) {
        void *src;
        st = ncl_piece_ptr(c, r, k.id, 0, &src, what);
        if (st == NCL_SUCCESS)
            ncl_copy(recv[r], src, (size_t)bytes);
    }
    return ncl_end(c, &k, st);
}

ncl_status ncl_scatter(ncl_comm *c, const void *const *send, void *recv, int64_t count, ncl_dtype dt, int root)
{
    const char *what = "ncl_scatter";
    int64_t bytes[NCL_MAX_RANKS];
    ncl_call k;
    ncl_status st = ncl_count_check(count, dt, what);
    if (st == NCL_SUCCESS)
        st = ncl_check_usable(c, what);
    if (st == NCL_SUCCESS)
        st = ncl_root_check(c, root, what);
    if (st != NCL_SUCCESS)
        return st;
    bool is_root = c->rank == root;
    for (int r = 0; r < c->size; r++)
        bytes[r] = is_root ? count * (int64_t)ncl_dtype_size(dt) : 0;
    static const void *const none[NCL_MAX_RANKS];
    st = ncl_begin(c, &k, NCL_OP_SCATTER, dt, NCL_SUM, root, count, 0, is_root ? send : none, bytes, c->size,
                   true, what);
    if (st == NCL_SUCCESS) {
        void *src;
        st = ncl_piece_ptr(c, root, k.id, c->rank, &src, what);
        if (st == NCL_SUCCESS)
            ncl_copy(recv, src, (size_t)count * ncl_dtype_size(dt));
    }
    return ncl_end(c, &k, st);
}

ncl_status ncl_barrier(ncl_comm *c)
{
    ncl_call k;
    ncl_status st = ncl_begin(c, &k, NCL_OP_BARRIER, NCL_U8, NCL_SUM, -1, 0, 0, NULL, NULL, 0, true, "ncl_barrier");
    return ncl_end(c, &k, st);
}

/* ---- point to point ------------------------------------------------------------------------------ */

static ncl_status ncl_peer_check(ncl_comm *c, int peer, const char *what)
{
    ncl_status st = ncl_check_usable(c, what);
    if (st != NCL_SUCCESS)
        return st;
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return ncl_error(NCL_INVALID, "%s: peer %d is invalid for rank %d of %d", what, peer, c->rank, c->size);
    return NCL_SUCCESS;
}

ncl_status ncl_send(ncl_comm *c, const void *buf, int64_t bytes, int peer, int64_t tag, uint64_t *ticket)
{
    const char *what = "ncl_send";
    ncl_status st = ncl_peer_check(c, peer, what);
    if (st != NCL_SUCCESS)
        return st;
    if (bytes < 0)
        return ncl_error(NCL_INVALID, "%s: negative size %lld", what, (long long)bytes);
    uint64_t n = c->sent[peer];
    ncl_piece piece;
    st = ncl_piece_describe(buf, bytes, &piece, what);
    if (st != NCL_SUCCESS)
        return st;
    /* A free ring entry: the receiver consumed message n - NCL_RING. */
    if (n >= NCL_RING) {
        st = ncl_flag_wait(c, ncl_consumed(c, peer, c->rank), (uint32_t)(n - NCL_RING + 1), peer, what);
        if (st != NCL_SUCCESS)
            return st;
    }
    ncl_msg *m = &ncl_ring(c, c->rank, peer)[n % NCL_RING];
    m->tag = tag;
    m->piece = piece;
    c->sent[peer] = n + 1;
    ncl_flag_set(ncl_posted(c, c->rank, peer), (uint32_t)(n + 1));
    *ticket = n + 1;
    return NCL_SUCCESS;
}

ncl_status ncl_send_test(ncl_comm *c, int peer, uint64_t ticket, bool *done)
{
    ncl_status st = ncl_peer_check(c, peer, "ncl_send_test");
    if (st != NCL_SUCCESS)
        return st;
    uint32_t v = atomic_load(&ncl_consumed(c, peer, c->rank)->value);
    *done = (int32_t)(v - (uint32_t)ticket) >= 0;
    return NCL_SUCCESS;
}

ncl_status ncl_send_wait(ncl_comm *c, int peer, uint64_t ticket)
{
    ncl_status st = ncl_peer_check(c, peer, "ncl_send_wait");
    if (st != NCL_SUCCESS)
        return st;
    return ncl_flag_wait(c, ncl_consumed(c, peer, c->rank), (uint32_t)ticket, peer, "ncl_send");
}

ncl_status ncl_recv(ncl_comm *c, void *buf, int64_t bytes, int peer, int64_t tag)
{
    const char *what = "ncl_recv";
    ncl_status st = ncl_peer_check(c, peer, what);
    if (st != NCL_SUCCESS)
        return st;
    uint64_t n = c->received[peer];
    st = ncl_flag_wait(c, ncl_posted(c, peer, c->rank), (uint32_t)(n + 1), peer, what);
    if (st != NCL_SUCCESS)
        return st;
    const ncl_msg *m = &ncl_ring(c, peer, c->rank)[n % NCL_RING];
    if (m->tag != tag || m->piece.bytes != bytes) {
        st = ncl_error(NCL_MISMATCH,
                       "%s: rank %d expected %lld bytes with tag %lld from rank %d, but the next message has %lld "
                       "bytes with tag %lld",
                       what, c->rank, (long long)bytes, (long long)tag, peer, (long long)m->piece.bytes,
                       (long long)m->tag);
    } else if (bytes > 0) {
        char *base;
        st = ncl_map_segment(c, peer, &m->piece, &base, what);
        if (st == NCL_SUCCESS)
            ncl_copy(buf, base + m->piece.offset, (size_t)bytes);
    }
    /* Consumed even on a mismatch, so the sender is not left waiting. */
    c->received[peer] = n + 1;
    ncl_flag_set(ncl_consumed(c, c->rank, peer), (uint32_t)(n + 1));
    return st;
}
