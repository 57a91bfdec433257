/*
 * host.c - pinned host memory: page-aligned anonymous mappings tracked in a sorted array so any interior
 * address can be recognised. Independent of nrn_init/nrn_close: host buffers outlive a device reset.
 */
#include "runtime_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct nrn_host_buf {
    uintptr_t base;
    size_t size;
} nrn_host_buf;

static pthread_mutex_t g_host_lock = PTHREAD_MUTEX_INITIALIZER;
static nrn_host_buf *g_host;
static size_t g_host_n, g_host_cap;

/* Index of the first buffer with base > p. Caller holds g_host_lock. */
static size_t nrn_host_upper(uintptr_t p)
{
    size_t lo = 0, hi = g_host_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g_host[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

nrn_status nrn_host_alloc(size_t size, void **ptr)
{
    nrn_status st = NRN_SUCCESS;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes, i;
    void *p = MAP_FAILED;
    if (ptr == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_host_alloc: ptr is NULL");
    *ptr = NULL;
    if (size == 0)
        return NRN_SUCCESS;
    if (size > SIZE_MAX - page)
        return nrn_error_set(NRN_RESOURCE, "nrn_host_alloc: %zu bytes is too large", size);
    bytes = (size + page - 1) & ~(page - 1);
    pthread_mutex_lock(&g_host_lock);
    if (g_host_n == g_host_cap) {
        size_t cap = g_host_cap ? g_host_cap * 2 : 64;
        nrn_host_buf *n = realloc(g_host, cap * sizeof *n);
        if (n == NULL) {
            st = nrn_error_set(NRN_RESOURCE, "nrn_host_alloc: out of host memory for bookkeeping");
            goto out;
        }
        g_host = n;
        g_host_cap = cap;
    }
    if (nrn_debug_os_alloc_should_fail()) {
        st = nrn_error_set(NRN_RESOURCE, "nrn_host_alloc: cannot map %zu bytes of pinned host memory (injected "
                           "failure)", size);
        goto out;
    }
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        st = nrn_error_set(NRN_RESOURCE, "nrn_host_alloc: cannot map %zu bytes of pinned host memory: %s", size,
                           strerror(errno));
        goto out;
    }
    i = nrn_host_upper((uintptr_t)p);
    memmove(&g_host[i + 1], &g_host[i], (g_host_n - i) * sizeof *g_host);
    g_host[i].base = (uintptr_t)p;
    g_host[i].size = bytes;
    g_host_n++;
    *ptr = p;
out:
    pthread_mutex_unlock(&g_host_lock);
    return st;
}

nrn_status nrn_host_free(void *ptr)
{
    nrn_status st = NRN_SUCCESS;
    size_t i;
    if (ptr == NULL)
        return NRN_SUCCESS;
    pthread_mutex_lock(&g_host_lock);
    i = nrn_host_upper((uintptr_t)ptr);
    if (i == 0 || g_host[i - 1].base != (uintptr_t)ptr) {
        st = nrn_error_set(NRN_INVALID_HANDLE, "nrn_host_free: %p is not the start of a pinned host buffer", ptr);
        goto out;
    }
    munmap(ptr, g_host[i - 1].size);
    memmove(&g_host[i - 1], &g_host[i], (g_host_n - i) * sizeof *g_host);
    g_host_n--;
out:
    pthread_mutex_unlock(&g_host_lock);
    return st;
}

bool nrn_host_is_pinned(const void *ptr)
{
    bool pinned = false;
    uintptr_t p = (uintptr_t)ptr;
    size_t i;
    if (ptr == NULL)
        return false;
    pthread_mutex_lock(&g_host_lock);
    i = nrn_host_upper(p);
    pinned = i > 0 && p < g_host[i - 1].base + g_host[i - 1].size;
    pthread_mutex_unlock(&g_host_lock);
    return pinned;
}
