/*
 * memory.c - the per-device caching allocator and the global segment registry.
 *
 * Each device has two pools (small, large) of free blocks carved out of memfd-backed segments. Free blocks
 * sit in size bins (exact bins for small sizes, 16 sub-bins per power of two above) kept sorted by size,
 * with a bitmap of non-empty bins, so best fit is a short walk plus a find-first-set. Allocated blocks are
 * found on free through a hash map keyed by address. Neighbouring free blocks of a segment coalesce.
 * The rules mirror PyTorch's CUDA caching allocator so its statistics mean the same thing here.
 */
#include "runtime_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NRN_MIN_BLOCK ((size_t)512)
#define NRN_SMALL_SIZE ((size_t)1 << 20)       /* largest request served by the small pool */
#define NRN_SMALL_BUFFER ((size_t)2 << 20)     /* small-pool segment size */
#define NRN_LARGE_BUFFER ((size_t)20 << 20)    /* large-pool segment size for requests below... */
#define NRN_MIN_LARGE_ALLOC ((size_t)10 << 20) /* ...this size */
#define NRN_ROUND_LARGE ((size_t)2 << 20)      /* bigger requests get their own segment in 2 MiB steps */

/* Bins: units of 512 bytes; 0..63 exact, then 16 sub-bins per power of two up to 2^55 units. */
#define NRN_EXACT_BINS 64
#define NRN_NBINS (NRN_EXACT_BINS + (55 - 6) * 16)
#define NRN_BITMAP_WORDS ((NRN_NBINS + 63) / 64)
#define NRN_HASH_INITIAL_BITS 10

typedef struct nrn_segment nrn_segment;

typedef struct nrn_block {
    uintptr_t ptr;
    size_t size;
    size_t requested;              /* bytes asked for, while allocated */
    nrn_segment *seg;
    struct nrn_block *prev, *next; /* address-ordered neighbours inside the segment */
    struct nrn_block *fprev, *fnext; /* bin list while free; fnext links the spare list when recycled */
    struct nrn_block *hnext;       /* hash chain while allocated */
    bool allocated;
} nrn_block;

struct nrn_segment {
    uintptr_t base;
    size_t size;
    int fd;
    int dev;
    int pool;                      /* NRN_POOL_SMALL or NRN_POOL_LARGE */
    nrn_block *head;               /* lowest-addressed block */
    nrn_segment *prev, *next;      /* the device's segment list */
};

typedef struct nrn_pool {
    nrn_block *bins[NRN_NBINS];
    uint64_t bitmap[NRN_BITMAP_WORDS];
} nrn_pool;

struct nrn_allocator {
    pthread_mutex_t lock;
    int dev;
    uint64_t capacity;
    nrn_pool pools[NRN_POOL_COUNT]; /* indexed by NRN_POOL_SMALL / NRN_POOL_LARGE; [0] unused */
    nrn_segment *segments;
    nrn_block **table;
    unsigned table_bits;
    size_t table_count;
    nrn_block *spare;               /* recycled block descriptors, so the hot path rarely mallocs */
    nrn_mem_stats stats;
};

/* ---- fault injection ---- */

static _Atomic int g_fail_after;

void nrn_debug_fail_os_alloc_after(int n)
{
    atomic_store(&g_fail_after, n < 0 ? 0 : n);
}

bool nrn_debug_os_alloc_should_fail(void)
{
    int cur = atomic_load_explicit(&g_fail_after, memory_order_relaxed);
    while (cur > 0) {
        if (atomic_compare_exchange_weak(&g_fail_after, &cur, cur - 1))
            return cur == 1;
    }
    return false;
}

/* ---- segment registry: sorted by base, for the pointer -> segment queries that are not hot ---- */

static pthread_rwlock_t g_reg_lock = PTHREAD_RWLOCK_INITIALIZER;
static nrn_segment **g_reg;
static size_t g_reg_n, g_reg_cap;

/* Index of the first entry with base > p. Caller holds g_reg_lock. */
static size_t nrn_reg_upper(uintptr_t p)
{
    size_t lo = 0, hi = g_reg_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g_reg[mid]->base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static nrn_segment *nrn_reg_find_locked(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    size_t i = nrn_reg_upper(a);
    if (i == 0)
        return NULL;
    nrn_segment *s = g_reg[i - 1];
    return a < s->base + s->size ? s : NULL;
}

static bool nrn_reg_insert(nrn_segment *seg)
{
    bool ok = false;
    size_t i;
    pthread_rwlock_wrlock(&g_reg_lock);
    if (g_reg_n == g_reg_cap) {
        size_t cap = g_reg_cap ? g_reg_cap * 2 : 64;
        nrn_segment **n = realloc(g_reg, cap * sizeof *n);
        if (n == NULL)
            goto out;
        g_reg = n;
        g_reg_cap = cap;
    }
    i = nrn_reg_upper(seg->base);
    memmove(&g_reg[i + 1], &g_reg[i], (g_reg_n - i) * sizeof *g_reg);
    g_reg[i] = seg;
    g_reg_n++;
    ok = true;
out:
    pthread_rwlock_unlock(&g_reg_lock);
    return ok;
}

static void nrn_reg_remove(nrn_segment *seg)
{
    size_t i;
    pthread_rwlock_wrlock(&g_reg_lock);
    i = nrn_reg_upper(seg->base);
    if (i > 0 && g_reg[i - 1] == seg) {
        memmove(&g_reg[i - 1], &g_reg[i], (g_reg_n - i) * sizeof *g_reg);
        g_reg_n--;
    }
    pthread_rwlock_unlock(&g_reg_lock);
}

bool nrn_segment_lookup(const void *p, int *dev, uint64_t *bytes_after)
{
    nrn_segment *s;
    pthread_rwlock_rdlock(&g_reg_lock);
    s = nrn_reg_find_locked(p);
    if (s != NULL) {
        if (dev != NULL)
            *dev = s->dev;
        if (bytes_after != NULL)
            *bytes_after = s->base + s->size - (uintptr_t)p;
    }
    pthread_rwlock_unlock(&g_reg_lock);
    return s != NULL;
}

/* ---- statistics ---- */

static void nrn_stat_add(nrn_stat *st, int pool, int64_t n)
{
    nrn_stat *targets[2] = {&st[NRN_POOL_ALL], &st[pool]};
    for (int i = 0; i < 2; i++) {
        nrn_stat *s = targets[i];
        s->current += n;
        s->allocated += n;
        if (s->current > s->peak)
            s->peak = s->current;
    }
}

static void nrn_stat_sub(nrn_stat *st, int pool, int64_t n)
{
    st[NRN_POOL_ALL].current -= n;
    st[NRN_POOL_ALL].freed += n;
    st[pool].current -= n;
    st[pool].freed += n;
}

/* Applies fn to every nrn_stat of the struct; the list is the struct's, so keep the two in step. */
static void nrn_stats_each(nrn_mem_stats *s, void (*fn)(nrn_stat *))
{
    nrn_stat *arrays[] = {s->allocation, s->segment, s->active, s->inactive_split, s->allocated_bytes,
                          s->reserved_bytes, s->active_bytes, s->inactive_split_bytes, s->requested_bytes};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        for (int p = 0; p < NRN_POOL_COUNT; p++)
            fn(&arrays[i][p]);
    fn(&s->oversize_allocations);
    fn(&s->oversize_segments);
}

static void nrn_stat_reset_peak(nrn_stat *s)
{
    s->peak = s->current;
}

static void nrn_stat_reset_accumulated(nrn_stat *s)
{
    s->allocated = 0;
    s->freed = 0;
}

/* ---- block descriptors, bins, hash ---- */

static nrn_block *nrn_block_new(nrn_allocator *a)
{
    nrn_block *b = a->spare;
    if (b != NULL)
        a->spare = b->fnext;
    else
        b = malloc(sizeof *b);
    if (b != NULL)
        memset(b, 0, sizeof *b);
    return b;
}

static void nrn_block_recycle(nrn_allocator *a, nrn_block *b)
{
    b->fnext = a->spare;
    a->spare = b;
}

static unsigned nrn_bin_of(size_t size)
{
    uint64_t units = (uint64_t)size >> 9;
    unsigned fl;
    if (units < NRN_EXACT_BINS)
        return (unsigned)units;
    fl = 63u - (unsigned)__builtin_clzll(units);
    return NRN_EXACT_BINS + (fl - 6u) * 16u + (unsigned)((units >> (fl - 4u)) & 15u);
}

static bool nrn_block_is_split(const nrn_block *b)
{
    return b->prev != NULL || b->next != NULL;
}

static void nrn_free_insert(nrn_allocator *a, nrn_block *b)
{
    int pool = b->seg->pool;
    nrn_pool *p = &a->pools[pool];
    unsigned bin = nrn_bin_of(b->size);
    nrn_block *cur = p->bins[bin], *prev = NULL;
    /* Ascending by size, newest first among equals (recently freed memory is likely still cached). */
    while (cur != NULL && cur->size < b->size) {
        prev = cur;
        cur = cur->fnext;
    }
    b->fprev = prev;
    b->fnext = cur;
    if (cur != NULL)
        cur->fprev = b;
    if (prev != NULL)
        prev->fnext = b;
    else
        p->bins[bin] = b;
    p->bitmap[bin / 64] |= (uint64_t)1 << (bin % 64);
    if (nrn_block_is_split(b)) {
        nrn_stat_add(a->stats.inactive_split, pool, 1);
        nrn_stat_add(a->stats.inactive_split_bytes, pool, (int64_t)b->size);
    }
}

static void nrn_free_remove(nrn_allocator *a, nrn_block *b)
{
    int pool = b->seg->pool;
    nrn_pool *p = &a->pools[pool];
    unsigned bin = nrn_bin_of(b->size);
    if (b->fprev != NULL)
        b->fprev->fnext = b->fnext;
    else
        p->bins[bin] = b->fnext;
    if (b->fnext != NULL)
        b->fnext->fprev = b->fprev;
    if (p->bins[bin] == NULL)
        p->bitmap[bin / 64] &= ~((uint64_t)1 << (bin % 64));
    b->fprev = b->fnext = NULL;
    if (nrn_block_is_split(b)) {
        nrn_stat_sub(a->stats.inactive_split, pool, 1);
        nrn_stat_sub(a->stats.inactive_split_bytes, pool, (int64_t)b->size);
    }
}

/* Smallest free block of the pool holding size bytes, or NULL. */
static nrn_block *nrn_pool_best_fit(nrn_pool *p, size_t size)
{
    unsigned bin = nrn_bin_of(size);
    for (nrn_block *b = p->bins[bin]; b != NULL; b = b->fnext)
        if (b->size >= size)
            return b;
    /* Every block in a higher bin is at least as large as any request mapping to this bin. */
    bin++;
    for (unsigned w = bin / 64; w < NRN_BITMAP_WORDS; w++) {
        uint64_t bits = p->bitmap[w];
        if (w == bin / 64)
            bits &= bin % 64 ? ~(((uint64_t)1 << (bin % 64)) - 1) : ~(uint64_t)0;
        if (bits != 0)
            return p->bins[w * 64 + (unsigned)__builtin_ctzll(bits)];
    }
    return NULL;
}

static size_t nrn_hash(const nrn_allocator *a, uintptr_t p)
{
    return (size_t)(((uint64_t)(p >> 9) * 0x9E3779B97F4A7C15ull) >> (64u - a->table_bits));
}

static void nrn_hash_grow(nrn_allocator *a)
{
    unsigned bits = a->table_bits + 1;
    size_t n = (size_t)1 << bits, old_n = (size_t)1 << a->table_bits;
    nrn_block **t = calloc(n, sizeof *t), **old = a->table;
    if (t == NULL)
        return; /* longer chains are slower, not wrong */
    a->table = t;
    a->table_bits = bits;
    for (size_t i = 0; i < old_n; i++) {
        nrn_block *b = old[i];
        while (b != NULL) {
            nrn_block *next = b->hnext;
            size_t h = nrn_hash(a, b->ptr);
            b->hnext = t[h];
            t[h] = b;
            b = next;
        }
    }
    free(old);
}

static void nrn_hash_insert(nrn_allocator *a, nrn_block *b)
{
    size_t h;
    if (a->table_count >= ((size_t)1 << a->table_bits))
        nrn_hash_grow(a);
    h = nrn_hash(a, b->ptr);
    b->hnext = a->table[h];
    a->table[h] = b;
    a->table_count++;
}

static nrn_block *nrn_hash_remove(nrn_allocator *a, uintptr_t p)
{
    nrn_block **link = &a->table[nrn_hash(a, p)];
    for (nrn_block *b = *link; b != NULL; link = &b->hnext, b = b->hnext) {
        if (b->ptr == p) {
            *link = b->hnext;
            b->hnext = NULL;
            a->table_count--;
            return b;
        }
    }
    return NULL;
}

/* ---- segments ---- */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif
#define NRN_HUGE_PAGE ((size_t)2 << 20)
/* Larger segments keep lazily faulted small pages: populating one costs about what touching all of it
 * would, which a tensor allocated big and used sparsely should not pay up front. */
#define NRN_HUGE_SEGMENT_MAX ((size_t)256 << 20)

/*
 * Device memory lives in a memfd so that peer ranks can map it (collectives), and shared memory gets no
 * transparent huge pages from page faults on most systems (shmem_enabled is "never" by default), while
 * PyTorch's CPU tensors get them: a kernel streaming a 12 MB working set through 4 KiB pages ran 5-10%
 * slower than through 2 MiB ones (the TLB covers 12 MiB of small pages), 1.3-1.6x at 48 MB.
 * MADV_COLLAPSE builds huge pages regardless of that setting but needs the range present, so the segment
 * is populated first: 256 MiB took 230 ms this way against 205 ms for faulting it in by 4 KiB pages on
 * first write, which the caller does anyway. Populating also turns "the host has no memory for this"
 * into ENOMEM here (the allocator's out-of-memory error) instead of SIGBUS on a later store.
 * NEURON_RT_HUGE_PAGES=0 keeps segments on lazily faulted small pages.
 */
static bool nrn_huge_pages_enabled(void)
{
    const char *v = getenv("NEURON_RT_HUGE_PAGES");
    return v == NULL || strcmp(v, "0") != 0;
}

/* Maps size bytes of fd, at a 2 MiB boundary when size is a multiple of 2 MiB (so that whole huge
 * pages can back it). Returns MAP_FAILED with errno set on failure. */
static void *nrn_segment_mmap(int fd, size_t size)
{
    char *resv, *base;
    uintptr_t aligned;
    if (size % NRN_HUGE_PAGE != 0 || size > NRN_HUGE_SEGMENT_MAX || !nrn_huge_pages_enabled())
        return mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    resv = mmap(NULL, size + NRN_HUGE_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (resv == MAP_FAILED)
        return MAP_FAILED;
    aligned = ((uintptr_t)resv + NRN_HUGE_PAGE - 1) & ~(uintptr_t)(NRN_HUGE_PAGE - 1);
    base = mmap((void *)aligned, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (base == MAP_FAILED) {
        int err = errno;
        munmap(resv, size + NRN_HUGE_PAGE);
        errno = err;
        return MAP_FAILED;
    }
    if (base > resv)
        munmap(resv, (size_t)(base - resv));
    if (resv + size + NRN_HUGE_PAGE > base + size)
        munmap(base + size, (size_t)(resv + size + NRN_HUGE_PAGE - (base + size)));
    if (madvise(base, size, MADV_POPULATE_WRITE) != 0) {
        if (errno == ENOMEM || errno == EFAULT) { /* EFAULT: populating hit SIGBUS (no memory for shmem) */
            munmap(base, size);
            errno = ENOMEM;
            return MAP_FAILED;
        }
        return base; /* EINVAL: a kernel before 5.14, which has no MADV_COLLAPSE either */
    }
    (void)madvise(base, size, MADV_COLLAPSE); /* best effort: stays on small pages if refused */
    return base;
}

/* Maps a new segment holding one free block. Returns 0 or an errno value. Caller holds a->lock. */
static int nrn_segment_map(nrn_allocator *a, int pool, size_t size, nrn_segment **out)
{
    int err = 0;
    char name[32];
    void *base = MAP_FAILED;
    nrn_segment *seg = calloc(1, sizeof *seg);
    nrn_block *b = nrn_block_new(a);
    if (seg == NULL || b == NULL) {
        err = ENOMEM;
        goto out;
    }
    seg->fd = -1;
    if (nrn_debug_os_alloc_should_fail()) {
        err = ENOMEM;
        goto out;
    }
    snprintf(name, sizeof name, "neuron-dev%d", a->dev);
    seg->fd = memfd_create(name, MFD_CLOEXEC);
    if (seg->fd < 0 || ftruncate(seg->fd, (off_t)size) != 0) {
        err = errno;
        goto out;
    }
    base = nrn_segment_mmap(seg->fd, size);
    if (base == MAP_FAILED) {
        err = errno;
        goto out;
    }
    seg->base = (uintptr_t)base;
    seg->size = size;
    seg->dev = a->dev;
    seg->pool = pool;
    seg->head = b;
    b->ptr = seg->base;
    b->size = size;
    b->seg = seg;
    if (!nrn_reg_insert(seg)) {
        err = ENOMEM;
        goto out;
    }
    seg->next = a->segments;
    if (a->segments != NULL)
        a->segments->prev = seg;
    a->segments = seg;
    nrn_stat_add(a->stats.segment, pool, 1);
    nrn_stat_add(a->stats.reserved_bytes, pool, (int64_t)size);
    a->stats.num_device_alloc++;
    nrn_log(NRN_LOG_DEBUG, "neuron:%d: mapped %s segment of %zu bytes at %p (fd %d)", a->dev,
            pool == NRN_POOL_SMALL ? "small" : "large", size, base, seg->fd);
    *out = seg;
    seg = NULL;
    b = NULL;
out:
    if (seg != NULL) {
        if (base != MAP_FAILED)
            munmap(base, size);
        if (seg->fd >= 0)
            close(seg->fd);
        free(seg);
    }
    if (b != NULL)
        nrn_block_recycle(a, b);
    return err;
}

/* Unmaps a segment whose only block is free and not in a bin. Caller holds a->lock. */
static void nrn_segment_unmap(nrn_allocator *a, nrn_segment *seg, bool count)
{
    nrn_reg_remove(seg);
    munmap((void *)seg->base, seg->size);
    close(seg->fd);
    if (seg->prev != NULL)
        seg->prev->next = seg->next;
    else
        a->segments = seg->next;
    if (seg->next != NULL)
        seg->next->prev = seg->prev;
    if (count) {
        nrn_stat_sub(a->stats.segment, seg->pool, 1);
        nrn_stat_sub(a->stats.reserved_bytes, seg->pool, (int64_t)seg->size);
        a->stats.num_device_free++;
    }
    nrn_log(NRN_LOG_DEBUG, "neuron:%d: unmapped segment of %zu bytes at %p", a->dev, seg->size,
            (void *)seg->base);
    nrn_block_recycle(a, seg->head);
    free(seg);
}

/* Returns every fully free segment to the OS. Caller holds a->lock. */
static void nrn_release_cached(nrn_allocator *a)
{
    nrn_segment *seg = a->segments;
    /* With asynchronous streams this is where pending frees would be waited for, as CUDA does. */
    a->stats.num_sync_all_streams++;
    while (seg != NULL) {
        nrn_segment *next = seg->next;
        nrn_block *b = seg->head;
        if (!b->allocated && b->next == NULL) {
            nrn_free_remove(a, b);
            nrn_segment_unmap(a, seg, true);
        }
        seg = next;
    }
}

/* ---- allocator lifecycle ---- */

nrn_status nrn_allocator_create(int dev, uint64_t capacity, nrn_allocator **out)
{
    nrn_status st = NRN_SUCCESS;
    nrn_allocator *a = calloc(1, sizeof *a);
    if (a == NULL)
        goto oom;
    a->table_bits = NRN_HASH_INITIAL_BITS;
    a->table = calloc((size_t)1 << a->table_bits, sizeof *a->table);
    if (a->table == NULL)
        goto oom;
    pthread_mutex_init(&a->lock, NULL);
    a->dev = dev;
    a->capacity = capacity;
    a->stats.max_split_size = -1;
    *out = a;
    a = NULL;
    goto out;
oom:
    st = nrn_error_set(NRN_RESOURCE, "nrn_init: out of host memory creating the allocator of neuron:%d", dev);
out:
    if (a != NULL) {
        free(a->table);
        free(a);
    }
    return st;
}

void nrn_allocator_destroy(nrn_allocator *a)
{
    size_t live_bytes = 0, live_count = 0;
    pthread_mutex_lock(&a->lock);
    while (a->segments != NULL) {
        nrn_segment *seg = a->segments;
        nrn_block *b = seg->head;
        if (!b->allocated && b->next == NULL) {
            nrn_segment_unmap(a, seg, false);
            continue;
        }
        /* Callers still hold pointers into this segment: keep the mapping, forget the bookkeeping. */
        nrn_reg_remove(seg);
        close(seg->fd); /* the mapping stays valid without the fd */
        a->segments = seg->next;
        if (a->segments != NULL)
            a->segments->prev = NULL;
        while (b != NULL) {
            nrn_block *next = b->next;
            if (b->allocated) {
                live_bytes += b->size;
                live_count++;
            }
            free(b);
            b = next;
        }
        free(seg);
    }
    if (live_count > 0)
        nrn_log(NRN_LOG_INFO, "nrn_close: neuron:%d still has %zu live allocation(s) of %zu bytes; their "
                "segments stay mapped", a->dev, live_count, live_bytes);
    while (a->spare != NULL) {
        nrn_block *b = a->spare;
        a->spare = b->fnext;
        free(b);
    }
    pthread_mutex_unlock(&a->lock);
    pthread_mutex_destroy(&a->lock);
    free(a->table);
    free(a);
}

/* ---- public API ---- */

static nrn_status nrn_allocator_of(int dev, nrn_allocator **out, const char *fn)
{
    nrn_device *d = NULL;
    nrn_status st = nrn_device_lookup(dev, &d, fn);
    if (st == NRN_SUCCESS)
        *out = d->alloc;
    return st;
}

static size_t nrn_segment_size_for(size_t rounded)
{
    if (rounded <= NRN_SMALL_SIZE)
        return NRN_SMALL_BUFFER;
    if (rounded < NRN_MIN_LARGE_ALLOC)
        return NRN_LARGE_BUFFER;
    return (rounded + NRN_ROUND_LARGE - 1) & ~(NRN_ROUND_LARGE - 1);
}

static nrn_status nrn_oom(nrn_allocator *a, size_t size, size_t seg_size, int os_err)
{
    char req[32], fr[32], cap[32], res[32], al[32], seg[32];
    uint64_t reserved = (uint64_t)a->stats.reserved_bytes[NRN_POOL_ALL].current;
    uint64_t free_bytes = a->capacity > reserved ? a->capacity - reserved : 0;
    a->stats.num_ooms++;
    nrn_format_bytes(size, req, sizeof req);
    nrn_format_bytes(free_bytes, fr, sizeof fr);
    nrn_format_bytes(a->capacity, cap, sizeof cap);
    nrn_format_bytes(reserved, res, sizeof res);
    nrn_format_bytes((uint64_t)a->stats.allocated_bytes[NRN_POOL_ALL].current, al, sizeof al);
    nrn_format_bytes(seg_size, seg, sizeof seg);
    nrn_log(NRN_LOG_INFO, "neuron:%d: out of memory allocating %zu bytes", a->dev, size);
    if (os_err != 0)
        return nrn_error_set(NRN_RESOURCE, "out of device memory on neuron:%d: tried to allocate %s (%zu bytes); "
                             "the host refused a %s segment (%s); %s (%llu bytes) free of %s capacity; %s reserved "
                             "by the caching allocator, of which %s is allocated", a->dev, req, size, seg,
                             strerror(os_err), fr, (unsigned long long)free_bytes, cap, res, al);
    /* Say so when the segment is what does not fit, otherwise "1 MiB requested, 1.5 MiB free" is puzzling. */
    if (seg_size != size)
        return nrn_error_set(NRN_RESOURCE, "out of device memory on neuron:%d: tried to allocate %s (%zu bytes, "
                             "needing a new %s segment); %s (%llu bytes) free of %s capacity; %s reserved by the "
                             "caching allocator, of which %s is allocated", a->dev, req, size, seg, fr,
                             (unsigned long long)free_bytes, cap, res, al);
    return nrn_error_set(NRN_RESOURCE, "out of device memory on neuron:%d: tried to allocate %s (%zu bytes); %s "
                         "(%llu bytes) free of %s capacity; %s reserved by the caching allocator, of which %s is "
                         "allocated", a->dev, req, size, fr, (unsigned long long)free_bytes, cap, res, al);
}

/* Maps a segment for a request, flushing the cache once if capacity or the OS says no. Holds a->lock. */
static nrn_status nrn_grow(nrn_allocator *a, int pool, size_t size, size_t seg_size, nrn_block **out)
{
    nrn_segment *seg = NULL;
    int err = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        bool fits = seg_size <= a->capacity &&
                    (uint64_t)a->stats.reserved_bytes[NRN_POOL_ALL].current <= a->capacity - seg_size;
        int64_t unmapped = a->stats.num_device_free;
        err = 0;
        if (fits) {
            err = nrn_segment_map(a, pool, seg_size, &seg);
            if (err == 0) {
                nrn_free_insert(a, seg->head);
                *out = seg->head;
                return NRN_SUCCESS;
            }
        }
        if (attempt > 0)
            break;
        a->stats.num_alloc_retries++;
        nrn_release_cached(a);
        /* Nothing was returned to the host, so the retry would fail the same way (and would hide an
         * injected OS failure from the caller). */
        if (a->stats.num_device_free == unmapped)
            break;
    }
    return nrn_oom(a, size, seg_size, err);
}

/* Turns free block b into an allocation of rounded bytes, splitting off the tail when worth keeping. */
static void nrn_block_take(nrn_allocator *a, nrn_block *b, size_t rounded, size_t requested)
{
    int pool = b->seg->pool;
    size_t remaining = b->size - rounded;
    nrn_free_remove(a, b);
    /* A large-pool tail of at most 1 MiB could only serve small requests, which never use this pool. */
    if (pool == NRN_POOL_SMALL ? remaining >= NRN_MIN_BLOCK : remaining > NRN_SMALL_SIZE) {
        nrn_block *r = nrn_block_new(a);
        if (r != NULL) {
            r->ptr = b->ptr + rounded;
            r->size = remaining;
            r->seg = b->seg;
            r->prev = b;
            r->next = b->next;
            if (b->next != NULL)
                b->next->prev = r;
            b->next = r;
            b->size = rounded;
            nrn_free_insert(a, r);
        }
    }
    b->allocated = true;
    b->requested = requested;
    nrn_stat_add(a->stats.allocation, pool, 1);
    nrn_stat_add(a->stats.active, pool, 1);
    nrn_stat_add(a->stats.allocated_bytes, pool, (int64_t)b->size);
    nrn_stat_add(a->stats.active_bytes, pool, (int64_t)b->size);
    nrn_stat_add(a->stats.requested_bytes, pool, (int64_t)requested);
    nrn_hash_insert(a, b);
}

/*
 * NEURON_RT_FAULT_ALLOC_EVERY=N makes every N-th allocation of the process fail as out of memory, so tests
 * can drive every error path above the runtime (clean exceptions, statistics, the next step). Off unless
 * set; read on the first allocation.
 */
static long nrn_fault_alloc_every(void)
{
    static _Atomic long every = -1;
    long v = atomic_load_explicit(&every, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("NEURON_RT_FAULT_ALLOC_EVERY");
        v = e != NULL ? strtol(e, NULL, 10) : 0;
        if (v < 0)
            v = 0;
        atomic_store(&every, v);
    }
    return v;
}

static _Atomic unsigned long g_alloc_calls;

nrn_status nrn_mem_alloc(int dev, size_t size, void **ptr)
{
    nrn_allocator *a = NULL;
    nrn_block *b;
    nrn_status st;
    size_t rounded, seg_size;
    int pool;
    if (ptr == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_mem_alloc: ptr is NULL");
    if (nrn_runtime_forked_child())
        return nrn_error_set(NRN_FAILURE, "cannot allocate neuron device memory in a forked child process: its "
                             "device memory is shared with the parent. Use the 'spawn' start method for "
                             "processes that use the device");
    st = nrn_allocator_of(dev, &a, "nrn_mem_alloc");
    if (st != NRN_SUCCESS)
        return st;
    *ptr = NULL;
    if (size == 0)
        return NRN_SUCCESS;
    pthread_mutex_lock(&a->lock);
    long every = nrn_fault_alloc_every();
    if (every > 0) {
        unsigned long k = atomic_fetch_add(&g_alloc_calls, 1) + 1;
        if (k % (unsigned long)every == 0) {
            a->stats.num_ooms++;
            st = nrn_error_set(NRN_RESOURCE, "out of device memory on neuron:%d: allocation %lu (%zu bytes) failed "
                               "by fault injection (NEURON_RT_FAULT_ALLOC_EVERY=%ld)", dev, k, size, every);
            goto out;
        }
    }
    if (size > SIZE_MAX / 2) {
        /* No segment can be this big; report it like any OOM rather than overflow the rounding. */
        st = nrn_oom(a, size, size, 0);
        goto out;
    }
    rounded = (size + NRN_MIN_BLOCK - 1) & ~(NRN_MIN_BLOCK - 1);
    pool = rounded <= NRN_SMALL_SIZE ? NRN_POOL_SMALL : NRN_POOL_LARGE;
    b = nrn_pool_best_fit(&a->pools[pool], rounded);
    if (b == NULL) {
        seg_size = nrn_segment_size_for(rounded);
        st = nrn_grow(a, pool, size, seg_size, &b);
        if (st != NRN_SUCCESS)
            goto out;
    }
    nrn_block_take(a, b, rounded, size);
    *ptr = (void *)b->ptr;
    st = NRN_SUCCESS;
out:
    pthread_mutex_unlock(&a->lock);
    return st;
}

nrn_status nrn_mem_free(void *ptr)
{
    nrn_allocator *a = NULL;
    nrn_block *b, *n;
    int dev, pool;
    nrn_status st = NRN_SUCCESS;
    if (ptr == NULL || nrn_runtime_forked_child())
        return NRN_SUCCESS; /* in a forked child the block belongs to the parent's allocator */
    /* No implicit init: a pointer from a runtime that is not up cannot be a live allocation. */
    if (!nrn_is_initialized() || !nrn_segment_lookup(ptr, &dev, NULL))
        return nrn_error_set(NRN_INVALID_HANDLE, "nrn_mem_free: %p is not device memory of this runtime", ptr);
    a = nrn_runtime_device(dev)->alloc;
    pthread_mutex_lock(&a->lock);
    b = nrn_hash_remove(a, (uintptr_t)ptr);
    if (b == NULL) {
        st = nrn_error_set(NRN_INVALID_HANDLE, "nrn_mem_free: %p is not the start of a live allocation on "
                           "neuron:%d (freed twice, or a pointer into an allocation?)", ptr, dev);
        goto out;
    }
    pool = b->seg->pool;
    b->allocated = false;
    nrn_stat_sub(a->stats.allocation, pool, 1);
    nrn_stat_sub(a->stats.active, pool, 1);
    nrn_stat_sub(a->stats.allocated_bytes, pool, (int64_t)b->size);
    nrn_stat_sub(a->stats.active_bytes, pool, (int64_t)b->size);
    nrn_stat_sub(a->stats.requested_bytes, pool, (int64_t)b->requested);
    b->requested = 0;
    /* Coalesce with free neighbours; they leave their bins first so split accounting sees the old shape. */
    n = b->prev;
    if (n != NULL && !n->allocated) {
        nrn_free_remove(a, n);
        b->ptr = n->ptr;
        b->size += n->size;
        b->prev = n->prev;
        if (b->prev != NULL)
            b->prev->next = b;
        else
            b->seg->head = b;
        nrn_block_recycle(a, n);
    }
    n = b->next;
    if (n != NULL && !n->allocated) {
        nrn_free_remove(a, n);
        b->size += n->size;
        b->next = n->next;
        if (b->next != NULL)
            b->next->prev = b;
        nrn_block_recycle(a, n);
    }
    nrn_free_insert(a, b);
out:
    pthread_mutex_unlock(&a->lock);
    return st;
}

nrn_status nrn_mem_empty_cache(int dev)
{
    nrn_status st = nrn_runtime_ensure();
    int first = dev, last = dev;
    if (st != NRN_SUCCESS)
        return st;
    if (dev == -1) {
        first = 0;
        last = nrn_runtime_device_count() - 1;
    } else {
        nrn_device *d = NULL;
        st = nrn_device_lookup(dev, &d, "nrn_mem_empty_cache");
        if (st != NRN_SUCCESS)
            return st;
    }
    for (int i = first; i <= last; i++) {
        nrn_allocator *a = nrn_runtime_device(i)->alloc;
        pthread_mutex_lock(&a->lock);
        nrn_release_cached(a);
        pthread_mutex_unlock(&a->lock);
    }
    return NRN_SUCCESS;
}

nrn_status nrn_mem_get_info(int dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
    nrn_allocator *a = NULL;
    uint64_t reserved;
    nrn_status st = nrn_allocator_of(dev, &a, "nrn_mem_get_info");
    if (st != NRN_SUCCESS)
        return st;
    pthread_mutex_lock(&a->lock);
    reserved = (uint64_t)a->stats.reserved_bytes[NRN_POOL_ALL].current;
    if (free_bytes != NULL)
        *free_bytes = a->capacity > reserved ? a->capacity - reserved : 0;
    if (total_bytes != NULL)
        *total_bytes = a->capacity;
    pthread_mutex_unlock(&a->lock);
    return NRN_SUCCESS;
}

nrn_status nrn_mem_set_capacity(int dev, uint64_t bytes)
{
    nrn_allocator *a = NULL;
    uint64_t reserved;
    nrn_status st = nrn_allocator_of(dev, &a, "nrn_mem_set_capacity");
    if (st != NRN_SUCCESS)
        return st;
    pthread_mutex_lock(&a->lock);
    reserved = (uint64_t)a->stats.reserved_bytes[NRN_POOL_ALL].current;
    if (bytes < reserved) {
        st = nrn_error_set(NRN_INVALID, "nrn_mem_set_capacity: %llu bytes is below the %llu bytes already reserved "
                           "on neuron:%d (free memory or call nrn_mem_empty_cache first)",
                           (unsigned long long)bytes, (unsigned long long)reserved, dev);
        goto out;
    }
    a->capacity = bytes;
out:
    pthread_mutex_unlock(&a->lock);
    return st;
}

nrn_status nrn_mem_device_of(const void *ptr, int *dev)
{
    if (dev == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_mem_device_of: dev is NULL");
    if (!nrn_segment_lookup(ptr, dev, NULL))
        return nrn_error_set(NRN_INVALID_HANDLE, "nrn_mem_device_of: %p is not device memory", ptr);
    return NRN_SUCCESS;
}

nrn_status nrn_mem_segment_of(const void *ptr, nrn_segment_info *out)
{
    nrn_segment *s;
    nrn_status st = NRN_SUCCESS;
    if (out == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_mem_segment_of: out is NULL");
    pthread_rwlock_rdlock(&g_reg_lock);
    s = nrn_reg_find_locked(ptr);
    if (s == NULL) {
        st = nrn_error_set(NRN_INVALID_HANDLE, "nrn_mem_segment_of: %p is not device memory", ptr);
        goto out;
    }
    out->fd = s->fd;
    out->base = (void *)s->base;
    out->size = s->size;
    out->offset = (uintptr_t)ptr - s->base;
    out->device = s->dev;
out:
    pthread_rwlock_unlock(&g_reg_lock);
    return st;
}

nrn_status nrn_mem_get_stats(int dev, nrn_mem_stats *out)
{
    nrn_allocator *a = NULL;
    nrn_status st;
    if (out == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_mem_get_stats: out is NULL");
    st = nrn_allocator_of(dev, &a, "nrn_mem_get_stats");
    if (st != NRN_SUCCESS)
        return st;
    pthread_mutex_lock(&a->lock);
    *out = a->stats;
    pthread_mutex_unlock(&a->lock);
    return NRN_SUCCESS;
}

nrn_status nrn_mem_snapshot(int dev, nrn_mem_block_info *out, size_t cap, size_t *count)
{
    nrn_allocator *a = NULL;
    size_t n = 0;
    nrn_status st;
    if (count == NULL || (out == NULL && cap > 0))
        return nrn_error_set(NRN_INVALID, "nrn_mem_snapshot: count is NULL, or out is NULL with cap %zu", cap);
    st = nrn_allocator_of(dev, &a, "nrn_mem_snapshot");
    if (st != NRN_SUCCESS)
        return st;
    pthread_mutex_lock(&a->lock);
    for (nrn_segment *seg = a->segments; seg != NULL; seg = seg->next) {
        for (nrn_block *b = seg->head; b != NULL; b = b->next, n++) {
            if (n >= cap)
                continue;
            out[n].segment_base = (uint64_t)seg->base;
            out[n].segment_size = seg->size;
            out[n].pool = seg->pool;
            out[n].addr = (uint64_t)b->ptr;
            out[n].size = b->size;
            out[n].requested = b->allocated ? b->requested : 0;
            out[n].allocated = b->allocated;
        }
    }
    pthread_mutex_unlock(&a->lock);
    *count = n;
    return NRN_SUCCESS;
}

nrn_status nrn_mem_reset_peak_stats(int dev)
{
    nrn_allocator *a = NULL;
    nrn_status st = nrn_allocator_of(dev, &a, "nrn_mem_reset_peak_stats");
    if (st != NRN_SUCCESS)
        return st;
    pthread_mutex_lock(&a->lock);
    nrn_stats_each(&a->stats, nrn_stat_reset_peak);
    pthread_mutex_unlock(&a->lock);
    return NRN_SUCCESS;
}

nrn_status nrn_mem_reset_accumulated_stats(int dev)
{
    nrn_allocator *a = NULL;
    nrn_status st = nrn_allocator_of(dev, &a, "nrn_mem_reset_accumulated_stats");
    if (st != NRN_SUCCESS)
        return st;
    pthread_mutex_lock(&a->lock);
    nrn_stats_each(&a->stats, nrn_stat_reset_accumulated);
    a->stats.num_alloc_retries = 0;
    a->stats.num_ooms = 0;
    a->stats.num_sync_all_streams = 0;
    a->stats.num_device_alloc = 0;
    a->stats.num_device_free = 0;
    pthread_mutex_unlock(&a->lock);
    return NRN_SUCCESS;
}
