/* test_runtime.c - unit tests of csrc/runtime. Exit status is non-zero if any check fails. */
#include "neuron_runtime.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static int g_checks, g_failures;

#define CHECK(cond)                                                                                     \
    do {                                                                                                \
        g_checks++;                                                                                     \
        if (!(cond)) {                                                                                  \
            g_failures++;                                                                               \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);                    \
        }                                                                                               \
    } while (0)

#define CHECK_ST(expr, want)                                                                            \
    do {                                                                                                \
        nrn_status st_ = (expr);                                                                        \
        g_checks++;                                                                                     \
        if (st_ != (want)) {                                                                            \
            g_failures++;                                                                               \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: %s)\n", __FILE__, __LINE__, \
                    #expr, nrn_status_str(st_), nrn_status_str(want), nrn_last_error());                \
        }                                                                                               \
    } while (0)

#define CHECK_OK(expr) CHECK_ST(expr, NRN_SUCCESS)

#define CHECK_MSG(needle)                                                                               \
    do {                                                                                                \
        g_checks++;                                                                                     \
        if (strstr(nrn_last_error(), (needle)) == NULL) {                                               \
            g_failures++;                                                                               \
            fprintf(stderr, "%s:%d: last error '%s' does not contain '%s'\n", __FILE__, __LINE__,       \
                    nrn_last_error(), (needle));                                                        \
        }                                                                                               \
    } while (0)

#define MiB ((size_t)1 << 20)

static const char *const g_env_vars[] = {"NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_NUM_CHIPS",
                                         "NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES",
                                         "NEURON_RT_MEMORY_PER_CORE"};

static void env_reset(void)
{
    nrn_close();
    for (size_t i = 0; i < sizeof g_env_vars / sizeof g_env_vars[0]; i++)
        unsetenv(g_env_vars[i]);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- status / logging ---- */

static void test_status(void)
{
    CHECK(strcmp(nrn_status_str(NRN_SUCCESS), "NRN_SUCCESS") == 0);
    CHECK(strcmp(nrn_status_str(NRN_RESOURCE), "NRN_RESOURCE") == 0);
    CHECK(strcmp(nrn_status_str((nrn_status)99), "NRN_UNKNOWN_STATUS") == 0);
    CHECK(strcmp(nrn_last_error(), "") == 0);
    nrn_log_level old = nrn_log_level_get();
    nrn_log_level_set(NRN_LOG_DEBUG);
    CHECK(nrn_log_level_get() == NRN_LOG_DEBUG);
    nrn_log_level_set(old);
    CHECK(nrn_log_level_get() == old);
    nrn_log(NRN_LOG_TRACE, "not shown at the default level");
}

/* ---- environment ---- */

static void expect_env_error(const char *var, const char *value, const char *needle)
{
    env_reset();
    setenv(var, value, 1);
    CHECK_ST(nrn_init(), NRN_INVALID);
    CHECK_MSG(var);
    CHECK_MSG(needle);
    CHECK(!nrn_is_initialized());
    unsetenv(var);
}

static void test_env(void)
{
    nrn_device_props p;
    int n = -1;
    uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t dflt = (uint64_t)24 << 30;

    env_reset();
    CHECK_OK(nrn_init());
    CHECK_OK(nrn_init()); /* idempotent */
    CHECK(nrn_is_initialized());
    CHECK_OK(nrn_device_count(&n));
    CHECK(n == 4);
    CHECK_OK(nrn_device_get_props(3, &p));
    CHECK(strcmp(p.name, "NeuronCore-v3 (Trainium2, logical x2)") == 0);
    CHECK(p.logical_index == 3 && p.physical_index == 3 && p.chip == 0 && p.physical_cores == 2);
    CHECK(p.major == 3 && p.minor == 0);
    CHECK(p.sbuf_bytes == 48 * MiB && p.psum_bytes == 4 * MiB);
    CHECK(p.memory_capacity == (phys < dflt ? phys : dflt));
    CHECK_ST(nrn_device_get_props(4, &p), NRN_INVALID_HANDLE);
    CHECK_MSG("invalid device index 4");

    /* Implicit init after close. */
    nrn_close();
    CHECK(!nrn_is_initialized());
    CHECK_OK(nrn_device_count(&n));
    CHECK(nrn_is_initialized() && n == 4);

    env_reset();
    setenv("NEURON_RT_VISIBLE_CORES", "1-2", 1);
    CHECK_OK(nrn_device_count(&n));
    CHECK(n == 2);
    CHECK_OK(nrn_device_get_props(0, &p));
    CHECK(p.logical_index == 0 && p.physical_index == 1);
    CHECK_OK(nrn_device_get_props(1, &p));
    CHECK(p.logical_index == 1 && p.physical_index == 2);

    env_reset();
    setenv("NEURON_RT_VISIBLE_CORES", "0,3", 1);
    setenv("NEURON_RT_NUM_CORES", "1", 1); /* VISIBLE_CORES wins */
    CHECK_OK(nrn_device_count(&n));
    CHECK(n == 2);
    CHECK_OK(nrn_device_get_props(1, &p));
    CHECK(p.physical_index == 3);

    env_reset();
    setenv("NEURON_RT_NUM_CORES", "3", 1);
    CHECK_OK(nrn_device_count(&n));
    CHECK(n == 3);

    env_reset();
    setenv("NEURON_LOGICAL_NC_CONFIG", "1", 1);
    CHECK_OK(nrn_device_count(&n));
    CHECK(n == 8);
    CHECK_OK(nrn_device_get_props(7, &p));
    CHECK(strcmp(p.name, "NeuronCore-v3 (Trainium2, logical x1)") == 0);
    CHECK(p.physical_cores == 1 && p.sbuf_bytes == 24 * MiB && p.psum_bytes == 2 * MiB);

    env_reset();
    setenv("NEURON_RT_NUM_CHIPS", "2", 1);
    setenv("NEURON_RT_VISIBLE_CORES", "0-3,6", 1);
    CHECK_OK(nrn_device_count(&n));
    CHECK(n == 5);
    CHECK_OK(nrn_device_get_props(4, &p));
    CHECK(p.physical_index == 6 && p.chip == 1);

    static const struct { const char *v; uint64_t bytes; } mem[] = {
        {"1073741824", 1ull << 30}, {"512M", 512ull << 20}, {"2G", 2ull << 30}, {"2GiB", 2ull << 30},
        {"1.5G", 3ull << 29}, {"64KB", 64ull << 10}, {"3t", 3ull << 40}, {"4096B", 4096}};
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++) {
        uint64_t total = 0;
        env_reset();
        setenv("NEURON_RT_MEMORY_PER_CORE", mem[i].v, 1);
        CHECK_OK(nrn_mem_get_info(0, NULL, &total));
        CHECK(total == mem[i].bytes);
        CHECK_OK(nrn_device_get_props(0, &p));
        CHECK(p.memory_capacity == mem[i].bytes);
    }

    expect_env_error("NEURON_RT_VISIBLE_CORES", "0-9", "'0-9': core 9 out of range; this instance has 4 logical "
                     "NeuronCores (0-3) at NEURON_LOGICAL_NC_CONFIG=2");
    expect_env_error("NEURON_RT_VISIBLE_CORES", "4", "out of range");
    expect_env_error("NEURON_RT_VISIBLE_CORES", "0,,1", "empty item");
    expect_env_error("NEURON_RT_VISIBLE_CORES", "0,", "empty item");
    expect_env_error("NEURON_RT_VISIBLE_CORES", "a", "not a core index");
    expect_env_error("NEURON_RT_VISIBLE_CORES", "-1", "not a core index");
    expect_env_error("NEURON_RT_VISIBLE_CORES", "1-", "not a core index");
    expect_env_error("NEURON_RT_VISIBLE_CORES", "3-1", "reversed");
    expect_env_error("NEURON_RT_VISIBLE_CORES", "1,1", "more than once");
    expect_env_error("NEURON_RT_VISIBLE_CORES", "0-2,1", "more than once");
    expect_env_error("NEURON_RT_NUM_CORES", "0", "from 1 to 4");
    expect_env_error("NEURON_RT_NUM_CORES", "5", "from 1 to 4");
    expect_env_error("NEURON_RT_NUM_CORES", "two", "'two'");
    expect_env_error("NEURON_LOGICAL_NC_CONFIG", "3", "expected 1 or 2");
    expect_env_error("NEURON_LOGICAL_NC_CONFIG", "x", "expected 1 or 2");
    expect_env_error("NEURON_RT_NUM_CHIPS", "17", "from 1 to 16");
    expect_env_error("NEURON_RT_MEMORY_PER_CORE", "abc", "'abc'");
    expect_env_error("NEURON_RT_MEMORY_PER_CORE", "12X", "suffix");
    expect_env_error("NEURON_RT_MEMORY_PER_CORE", "-1", "'-1'");
    expect_env_error("NEURON_RT_MEMORY_PER_CORE", "0", "at least 1 byte");

    /* A failed init keeps failing with the same message until nrn_close, even if the env is fixed. */
    env_reset();
    setenv("NEURON_RT_NUM_CORES", "9", 1);
    CHECK_ST(nrn_init(), NRN_INVALID);
    char first[1024];
    snprintf(first, sizeof first, "%s", nrn_last_error());
    unsetenv("NEURON_RT_NUM_CORES");
    CHECK_ST(nrn_device_count(&n), NRN_INVALID);
    CHECK(strcmp(first, nrn_last_error()) == 0);
    void *ptr;
    CHECK_ST(nrn_mem_alloc(0, 16, &ptr), NRN_INVALID);
    CHECK(strcmp(first, nrn_last_error()) == 0);
    env_reset();
    CHECK_OK(nrn_init());
    env_reset();
}

/* ---- devices ---- */

static void *current_device_thread(void *arg)
{
    int *out = arg;
    nrn_stream_id s = -1;
    nrn_device_get_current(&out[0]);
    nrn_stream_get_current(0, &s);
    out[1] = (int)s;
    return NULL;
}

static void test_current_device(void)
{
    int dev = -1, seen[2] = {-1, -1};
    pthread_t t;
    CHECK_OK(nrn_device_get_current(&dev));
    CHECK(dev == 0);
    CHECK_OK(nrn_device_set_current(2));
    CHECK_OK(nrn_device_get_current(&dev));
    CHECK(dev == 2);
    CHECK_ST(nrn_device_set_current(4), NRN_INVALID_HANDLE);
    CHECK_ST(nrn_device_set_current(-1), NRN_INVALID_HANDLE);
    pthread_create(&t, NULL, current_device_thread, seen);
    pthread_join(t, NULL);
    CHECK(seen[0] == 0); /* per thread */
    CHECK_OK(nrn_device_synchronize(2));
    /* After a close the choice is forgotten (devices may be renumbered). */
    nrn_close();
    CHECK_OK(nrn_device_get_current(&dev));
    CHECK(dev == 0);
}

/* ---- allocator ---- */

static void get_stats(int dev, nrn_mem_stats *s)
{
    CHECK_OK(nrn_mem_get_stats(dev, s));
}

/* Invariants that hold at every quiescent point; returns false (after reporting) on the first violation. */
static void check_invariants(int dev)
{
    nrn_mem_stats s;
    get_stats(dev, &s);
    nrn_stat *arrays[] = {s.allocation, s.segment, s.active, s.inactive_split, s.allocated_bytes,
                          s.reserved_bytes, s.active_bytes, s.inactive_split_bytes, s.requested_bytes};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) {
        nrn_stat *a = arrays[i];
        CHECK(a[0].current == a[1].current + a[2].current);
        for (int p = 0; p < NRN_POOL_COUNT; p++) {
            CHECK(a[p].current >= 0);
            CHECK(a[p].peak >= a[p].current);
        }
    }
    for (int p = 0; p < NRN_POOL_COUNT; p++) {
        CHECK(s.reserved_bytes[p].current >= s.allocated_bytes[p].current + s.inactive_split_bytes[p].current);
        CHECK(s.allocated_bytes[p].current >= s.requested_bytes[p].current);
        CHECK(s.active[p].current == s.allocation[p].current);
        CHECK(s.active_bytes[p].current == s.allocated_bytes[p].current);
        CHECK(s.allocation[p].allocated - s.allocation[p].freed == s.allocation[p].current);
        CHECK(s.allocated_bytes[p].allocated - s.allocated_bytes[p].freed == s.allocated_bytes[p].current);
        CHECK(s.reserved_bytes[p].allocated - s.reserved_bytes[p].freed == s.reserved_bytes[p].current);
    }
    CHECK(s.reserved_bytes[NRN_POOL_SMALL].current == s.segment[NRN_POOL_SMALL].current * (int64_t)(2 * MiB));
    CHECK(s.num_device_alloc - s.num_device_free == s.segment[0].current);
    CHECK(s.max_split_size == -1);
    uint64_t free_b, total;
    CHECK_OK(nrn_mem_get_info(dev, &free_b, &total));
    CHECK(free_b == total - (uint64_t)s.reserved_bytes[0].current);
}

static void test_alloc_basic(void)
{
    void *p = (void *)1, *q;
    nrn_mem_stats s;
    int local;
    CHECK_OK(nrn_mem_alloc(0, 0, &p));
    CHECK(p == NULL);
    CHECK_OK(nrn_mem_free(NULL));
    CHECK_ST(nrn_mem_alloc(0, 16, NULL), NRN_INVALID);
    CHECK_ST(nrn_mem_alloc(9, 16, &p), NRN_INVALID_HANDLE);
    CHECK_ST(nrn_mem_free(&local), NRN_INVALID_HANDLE);
    CHECK_OK(nrn_mem_alloc(0, 1000, &p));
    CHECK(p != NULL && ((uintptr_t)p % 512) == 0);
    CHECK_ST(nrn_mem_free((char *)p + 512), NRN_INVALID_HANDLE);
    CHECK_MSG("not the start of a live allocation");
    get_stats(0, &s);
    CHECK(s.allocation[0].current == 1 && s.allocated_bytes[0].current == 1024);
    CHECK(s.requested_bytes[0].current == 1000 && s.requested_bytes[NRN_POOL_SMALL].current == 1000);
    CHECK(s.segment[NRN_POOL_SMALL].current == 1 && s.reserved_bytes[0].current == (int64_t)(2 * MiB));
    CHECK(s.inactive_split[0].current == 1 && s.inactive_split_bytes[0].current == (int64_t)(2 * MiB - 1024));
    CHECK_OK(nrn_mem_free(p));
    CHECK_ST(nrn_mem_free(p), NRN_INVALID_HANDLE); /* double free */
    /* Reuse from the cache: the same block comes back, no new segment. */
    CHECK_OK(nrn_mem_alloc(0, 1024, &q));
    CHECK(q == p);
    get_stats(0, &s);
    CHECK(s.num_device_alloc == 1);
    CHECK_OK(nrn_mem_free(q));
    get_stats(0, &s);
    CHECK(s.allocation[0].current == 0 && s.allocated_bytes[0].current == 0 && s.inactive_split[0].current == 0);
    CHECK(s.reserved_bytes[0].current == (int64_t)(2 * MiB));
    CHECK_OK(nrn_mem_empty_cache(0));
    get_stats(0, &s);
    CHECK(s.reserved_bytes[0].current == 0 && s.segment[0].current == 0 && s.num_device_free == 1);
    check_invariants(0);
}

typedef struct live_block {
    unsigned char *p;
    size_t n;
    unsigned char tag;
} live_block;

static int cmp_live(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const live_block *)a)->p, y = (uintptr_t)((const live_block *)b)->p;
    return x < y ? -1 : x > y;
}

static bool block_intact(const live_block *b)
{
    for (size_t i = 0; i < b->n; i += 1 + b->n / 64)
        if (b->p[i] != b->tag)
            return false;
    return b->p[b->n - 1] == b->tag;
}

static void test_alloc_sizes(void)
{
    static const size_t sizes[] = {1, 7, 511, 512, 513, 1000, 4096, 65537, MiB - 1, MiB, MiB + 1, 3 * MiB,
                                   10 * MiB - 1, 10 * MiB, 10 * MiB + 7, 25 * MiB, 2, 3, 100000};
    enum { N = sizeof sizes / sizeof sizes[0] };
    live_block b[N];
    nrn_mem_stats s;
    int64_t requested = 0;
    for (size_t i = 0; i < N; i++) {
        void *p;
        CHECK_OK(nrn_mem_alloc(0, sizes[i], &p));
        b[i].p = p;
        b[i].n = sizes[i];
        b[i].tag = (unsigned char)(i * 37 + 1);
        CHECK(((uintptr_t)p % 512) == 0);
        memset(p, b[i].tag, sizes[i]);
        requested += (int64_t)sizes[i];
    }
    for (size_t i = 0; i < N; i++)
        CHECK(block_intact(&b[i]));
    qsort(b, N, sizeof b[0], cmp_live);
    for (size_t i = 0; i + 1 < N; i++)
        CHECK(b[i].p + b[i].n <= b[i + 1].p);
    get_stats(0, &s);
    CHECK(s.allocation[0].current == N);
    CHECK(s.requested_bytes[0].current == requested);
    CHECK(s.allocation[NRN_POOL_SMALL].current == 13 && s.allocation[NRN_POOL_LARGE].current == 6);
    check_invariants(0);
    for (size_t i = 0; i < N; i++)
        CHECK_OK(nrn_mem_free(b[i].p));
    get_stats(0, &s);
    CHECK(s.allocation[0].current == 0 && s.allocated_bytes[0].current == 0 && s.requested_bytes[0].current == 0);
    CHECK(s.active_bytes[0].current == 0 && s.inactive_split[0].current == 0);
    CHECK(s.inactive_split_bytes[0].current == 0);
    CHECK(s.reserved_bytes[0].current > 0);
    CHECK(s.allocated_bytes[0].peak >= requested);
    check_invariants(0);
    CHECK_OK(nrn_mem_empty_cache(-1));
    get_stats(0, &s);
    CHECK(s.reserved_bytes[0].current == 0);
}

static void test_coalescing(void)
{
    void *a, *b, *c, *d, *e;
    nrn_mem_stats s;
    const size_t q = 512 * 1024;
    CHECK_OK(nrn_mem_empty_cache(0));
    CHECK_OK(nrn_mem_alloc(0, q, &a));
    CHECK_OK(nrn_mem_alloc(0, q, &b));
    CHECK_OK(nrn_mem_alloc(0, q, &c));
    CHECK((char *)b == (char *)a + q && (char *)c == (char *)b + q);
    get_stats(0, &s);
    CHECK(s.inactive_split[0].current == 1 && s.inactive_split_bytes[0].current == (int64_t)q);
    CHECK_OK(nrn_mem_free(b));
    get_stats(0, &s);
    CHECK(s.inactive_split[0].current == 2 && s.inactive_split_bytes[0].current == (int64_t)(2 * q));
    CHECK_OK(nrn_mem_free(a));
    get_stats(0, &s);
    CHECK(s.inactive_split[0].current == 2 && s.inactive_split_bytes[0].current == (int64_t)(3 * q));
    /* a and b coalesced into one 1 MiB block, the best fit for 1 MiB. */
    CHECK_OK(nrn_mem_alloc(0, 2 * q, &d));
    CHECK(d == a);
    get_stats(0, &s);
    CHECK(s.segment[0].current == 1 && s.inactive_split[0].current == 1);
    /* Best fit: a 512 KiB request takes the 512 KiB tail, not a new segment. */
    CHECK_OK(nrn_mem_alloc(0, q, &e));
    CHECK((char *)e == (char *)c + q);
    get_stats(0, &s);
    CHECK(s.segment[0].current == 1 && s.inactive_split[0].current == 0);
    CHECK_OK(nrn_mem_free(c));
    CHECK_OK(nrn_mem_free(d));
    CHECK_OK(nrn_mem_free(e));
    get_stats(0, &s);
    CHECK(s.inactive_split[0].current == 0 && s.segment[0].current == 1);
    /* The whole segment is one block again. */
    CHECK_OK(nrn_mem_alloc(0, 4 * q - 512 * 3, &a)); /* > 1 MiB: large pool, so a new large segment */
    get_stats(0, &s);
    CHECK(s.segment[NRN_POOL_LARGE].current == 1);
    CHECK_OK(nrn_mem_free(a));
    CHECK_OK(nrn_mem_alloc(0, 2 * q, &a));
    CHECK_OK(nrn_mem_alloc(0, 2 * q, &b)); /* two 1 MiB from the one small segment */
    get_stats(0, &s);
    CHECK(s.segment[NRN_POOL_SMALL].current == 1 && s.inactive_split[NRN_POOL_SMALL].current == 0);
    CHECK_OK(nrn_mem_free(a));
    CHECK_OK(nrn_mem_free(b));
    /* Large pool: a 1 MiB tail is not split off, the allocation keeps it. */
    CHECK_OK(nrn_mem_empty_cache(0));
    CHECK_OK(nrn_mem_alloc(0, 11 * MiB, &a)); /* 12 MiB segment, 1 MiB remainder stays attached */
    get_stats(0, &s);
    CHECK(s.allocated_bytes[NRN_POOL_LARGE].current == (int64_t)(12 * MiB));
    CHECK(s.requested_bytes[NRN_POOL_LARGE].current == (int64_t)(11 * MiB));
    CHECK_OK(nrn_mem_free(a));
    check_invariants(0);
    CHECK_OK(nrn_mem_empty_cache(0));
}

static void test_random_ops(void)
{
    enum { SLOTS = 200, OPS = 4000 };
    live_block live[SLOTS];
    memset(live, 0, sizeof live);
    for (int op = 0; op < OPS; op++) {
        int i = (int)(rng() % SLOTS);
        if (live[i].p != NULL) {
            CHECK(block_intact(&live[i]));
            CHECK_OK(nrn_mem_free(live[i].p));
            live[i].p = NULL;
        } else {
            uint64_t r = rng();
            size_t n = (r % 10 == 0) ? 1 + (size_t)(r >> 8) % (24 * MiB) : 1 + (size_t)(r >> 8) % 200000;
            void *p;
            CHECK_OK(nrn_mem_alloc(1, n, &p));
            live[i].p = p;
            live[i].n = n;
            live[i].tag = (unsigned char)(op | 1);
            memset(p, live[i].tag, n);
        }
        if (op % 97 == 0)
            check_invariants(1);
        if (op % 1000 == 999) {
            CHECK_OK(nrn_mem_empty_cache(1));
            check_invariants(1);
        }
    }
    live_block sorted[SLOTS];
    int n = 0;
    for (int i = 0; i < SLOTS; i++)
        if (live[i].p != NULL)
            sorted[n++] = live[i];
    qsort(sorted, (size_t)n, sizeof sorted[0], cmp_live);
    for (int i = 0; i + 1 < n; i++)
        CHECK(sorted[i].p + sorted[i].n <= sorted[i + 1].p);
    for (int i = 0; i < SLOTS; i++)
        if (live[i].p != NULL) {
            CHECK(block_intact(&live[i]));
            CHECK_OK(nrn_mem_free(live[i].p));
        }
    nrn_mem_stats s;
    get_stats(1, &s);
    CHECK(s.allocation[0].current == 0 && s.allocated_bytes[0].current == 0 && s.inactive_split[0].current == 0);
    check_invariants(1);
    CHECK_OK(nrn_mem_empty_cache(1));
    get_stats(1, &s);
    CHECK(s.reserved_bytes[0].current == 0 && s.segment[0].current == 0);

    /* Peak and accumulated resets. */
    CHECK(s.allocated_bytes[0].peak > 0 && s.num_device_alloc > 0);
    CHECK_OK(nrn_mem_reset_peak_stats(1));
    CHECK_OK(nrn_mem_reset_accumulated_stats(1));
    get_stats(1, &s);
    CHECK(s.allocated_bytes[0].peak == 0 && s.reserved_bytes[0].peak == 0);
    CHECK(s.allocated_bytes[0].allocated == 0 && s.allocated_bytes[0].freed == 0);
    CHECK(s.num_device_alloc == 0 && s.num_device_free == 0 && s.num_alloc_retries == 0 && s.num_ooms == 0);
    void *p;
    CHECK_OK(nrn_mem_alloc(1, 3000, &p));
    get_stats(1, &s);
    CHECK(s.allocated_bytes[0].peak == 3072 && s.allocated_bytes[0].allocated == 3072);
    CHECK_OK(nrn_mem_free(p));
    CHECK_OK(nrn_mem_empty_cache(1));
}

static void test_capacity_oom(void)
{
    void *a, *b, *c, *tiny;
    nrn_mem_stats s0, s;
    uint64_t cap0, free_b, total;
    char want[64];
    CHECK_OK(nrn_mem_empty_cache(0));
    CHECK_OK(nrn_mem_get_info(0, NULL, &cap0));
    CHECK_OK(nrn_mem_set_capacity(0, 64 * MiB));
    get_stats(0, &s0);
    CHECK_OK(nrn_mem_alloc(0, 30 * MiB, &a));
    CHECK_ST(nrn_mem_alloc(0, 40 * MiB, &b), NRN_RESOURCE);
    CHECK(b == NULL);
    CHECK_MSG("out of device memory on neuron:0");
    CHECK_MSG("41943040 bytes");
    snprintf(want, sizeof want, "(%llu bytes) free", (unsigned long long)(34 * MiB));
    CHECK_MSG(want);
    CHECK_MSG("64.00 MiB capacity");
    get_stats(0, &s);
    CHECK(s.num_ooms == s0.num_ooms + 1 && s.num_alloc_retries == s0.num_alloc_retries + 1);
    CHECK(s.allocation[0].current == 1 && s.reserved_bytes[0].current == (int64_t)(30 * MiB));
    check_invariants(0);
    /* Allocation keeps working after an OOM. */
    CHECK_OK(nrn_mem_alloc(0, 20 * MiB, &b));
    CHECK_OK(nrn_mem_alloc(0, 1000, &tiny));
    CHECK_ST(nrn_mem_set_capacity(0, 10 * MiB), NRN_INVALID);
    CHECK_MSG("reserved");
    CHECK_OK(nrn_mem_free(a));
    CHECK_OK(nrn_mem_free(b));
    /* 60 MiB fits only after the cached 30 + 20 MiB segments go back to the host. */
    get_stats(0, &s0);
    CHECK_OK(nrn_mem_alloc(0, 60 * MiB, &c));
    get_stats(0, &s);
    CHECK(s.num_alloc_retries == s0.num_alloc_retries + 1 && s.num_ooms == s0.num_ooms);
    CHECK(s.num_device_free == s0.num_device_free + 2);
    CHECK(s.reserved_bytes[0].current == (int64_t)(62 * MiB));
    CHECK_OK(nrn_mem_get_info(0, &free_b, &total));
    CHECK(total == 64 * MiB && free_b == 2 * MiB);
    check_invariants(0);
    memset(c, 0x5a, 60 * MiB);
    CHECK_OK(nrn_mem_free(c));
    CHECK_OK(nrn_mem_free(tiny));
    /* A request larger than anything possible. */
    CHECK_ST(nrn_mem_alloc(0, SIZE_MAX - 5, &a), NRN_RESOURCE);
    CHECK_OK(nrn_mem_empty_cache(0));
    get_stats(0, &s);
    CHECK(s.reserved_bytes[0].current == 0);
    CHECK_OK(nrn_mem_set_capacity(0, cap0));
    check_invariants(0);
}

static void test_fault_injection(void)
{
    void *a, *b;
    nrn_mem_stats s0, s;
    CHECK_OK(nrn_mem_empty_cache(0));
    get_stats(0, &s0);
    /* Nothing cached to release: the injected mmap failure surfaces as NRN_RESOURCE. */
    nrn_debug_fail_os_alloc_after(1);
    CHECK_ST(nrn_mem_alloc(0, 4096, &a), NRN_RESOURCE);
    CHECK_MSG("4096 bytes");
    get_stats(0, &s);
    CHECK(s.num_ooms == s0.num_ooms + 1 && s.num_alloc_retries == s0.num_alloc_retries + 1);
    CHECK(s.reserved_bytes[0].current == 0 && s.allocation[0].current == 0 && s.num_device_alloc == s0.num_device_alloc);
    check_invariants(0);
    CHECK_OK(nrn_mem_alloc(0, 4096, &a)); /* the failure was one-shot */
    CHECK_OK(nrn_mem_free(a));
    /* A cached segment is released and the retry succeeds. */
    CHECK_OK(nrn_mem_alloc(0, 30 * MiB, &a));
    CHECK_OK(nrn_mem_free(a));
    get_stats(0, &s0);
    nrn_debug_fail_os_alloc_after(1);
    CHECK_OK(nrn_mem_alloc(0, 40 * MiB, &a));
    get_stats(0, &s);
    CHECK(s.num_alloc_retries == s0.num_alloc_retries + 1 && s.num_ooms == s0.num_ooms);
    CHECK(s.num_device_free == s0.num_device_free + 2); /* the small one and the 30 MiB one */
    CHECK(s.reserved_bytes[0].current == (int64_t)(40 * MiB));
    check_invariants(0);
    /* Countdown: the second OS allocation fails. */
    nrn_debug_fail_os_alloc_after(2);
    CHECK_OK(nrn_mem_alloc(0, 100, &b));        /* first: new small segment */
    void *c = (void *)1;
    CHECK_ST(nrn_mem_alloc(0, 50 * MiB, &c), NRN_RESOURCE); /* second: fails, nothing cached to release */
    CHECK(c == NULL);
    CHECK_MSG("52428800 bytes");
    CHECK_OK(nrn_mem_free(b));
    CHECK_OK(nrn_mem_free(a));
    nrn_debug_fail_os_alloc_after(0);
    /* Pinned host allocations count as OS allocations too. */
    nrn_debug_fail_os_alloc_after(1);
    CHECK_ST(nrn_host_alloc(100, &a), NRN_RESOURCE);
    CHECK_OK(nrn_host_alloc(100, &a));
    CHECK_OK(nrn_host_free(a));
    CHECK_OK(nrn_mem_empty_cache(0));
    check_invariants(0);
}

/* kB of the mapping containing p that are mapped by 2 MiB pages (ShmemPmdMapped in smaps), -1 if unknown. */
static long pmd_mapped_kb(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[256];
    long kb = -1;
    int in = 0;
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) { /* a mapping's header line */
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            continue;
        }
        if (in && sscanf(line, "ShmemPmdMapped: %ld kB", &kb) == 1)
            break;
    }
    fclose(f);
    return kb;
}

/* Whether this kernel turns a populated memfd range into huge pages (MADV_COLLAPSE, Linux 6.1). */
static int kernel_collapses_shmem(void)
{
    int ok = 0, fd = memfd_create("probe", MFD_CLOEXEC);
    size_t n = 4 * MiB;
    if (fd < 0 || ftruncate(fd, (off_t)n) != 0)
        goto out;
    char *r = mmap(NULL, 2 * n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED)
        goto out;
    char *b = (char *)(((uintptr_t)r + 2 * MiB - 1) & ~(uintptr_t)(2 * MiB - 1));
    if (mmap(b, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED) {
        memset(b, 0, n);
        ok = madvise(b, n, 25 /* MADV_COLLAPSE */) == 0;
    }
    munmap(r, 2 * n);
out:
    if (fd >= 0)
        close(fd);
    return ok;
}

/* A large segment of at most 256 MiB sits at a 2 MiB boundary, populated with zeros, on huge pages where
 * the kernel makes them; NEURON_RT_HUGE_PAGES=0 and bigger segments keep small pages. */
static void test_huge_pages(void)
{
    unsigned char *a;
    nrn_segment_info info;
    const int collapses = kernel_collapses_shmem();
    for (int pass = 0; pass < 3; pass++) {
        const size_t n = pass == 2 ? 300 * MiB : 6 * MiB;
        env_reset();
        if (pass == 1)
            setenv("NEURON_RT_HUGE_PAGES", "0", 1);
        CHECK_OK(nrn_mem_alloc(0, n, (void **)&a));
        CHECK_OK(nrn_mem_segment_of(a, &info));
        CHECK(info.offset == 0 && info.size >= n);
        if (pass == 0)
            CHECK(((uintptr_t)a & (2 * MiB - 1)) == 0);
        long kb = pmd_mapped_kb(a);
        if (pass == 0 && collapses)
            CHECK(kb >= (long)(n >> 10));
        if (pass > 0)
            CHECK(kb <= 0);
        size_t nonzero = 0;
        for (size_t i = 0; i < n; i += 4093)
            nonzero += a[i] != 0;
        CHECK(nonzero == 0);
        memset(a, 0x5A, n);
        CHECK(a[0] == 0x5A && a[n - 1] == 0x5A);
        CHECK_OK(nrn_mem_free(a));
        unsetenv("NEURON_RT_HUGE_PAGES");
    }
    env_reset();
}

/* The snapshot lists every block of the device's segments: allocated ones with their requested bytes
 * summing to the statistics, and together covering every segment exactly. */
static void test_snapshot(void)
{
    void *a, *b, *c;
    nrn_mem_stats st;
    size_t n = 0, cap;
    CHECK_OK(nrn_mem_alloc(0, 1000, &a));
    CHECK_OK(nrn_mem_alloc(0, 3 * MiB, &b));
    CHECK_OK(nrn_mem_alloc(0, 5000, &c));
    CHECK_OK(nrn_mem_free(c));
    CHECK_OK(nrn_mem_snapshot(0, NULL, 0, &n));
    CHECK(n >= 3);
    CHECK_ST(nrn_mem_snapshot(0, NULL, 4, &n), NRN_INVALID);
    cap = n;
    nrn_mem_block_info *blk = calloc(cap, sizeof *blk);
    CHECK_OK(nrn_mem_snapshot(0, blk, cap, &n));
    CHECK_OK(nrn_mem_get_stats(0, &st));
    uint64_t alloc_bytes = 0, requested = 0, covered = 0, reserved = 0;
    int found_a = 0, found_b = 0;
    for (size_t i = 0; i < n && i < cap; i++) {
        if (blk[i].allocated) {
            alloc_bytes += blk[i].size;
            requested += blk[i].requested;
        }
        found_a += blk[i].allocated && blk[i].addr == (uint64_t)(uintptr_t)a && blk[i].requested == 1000;
        found_b += blk[i].allocated && blk[i].addr == (uint64_t)(uintptr_t)b && blk[i].pool == NRN_POOL_LARGE;
        covered += blk[i].size;
        if (blk[i].addr == blk[i].segment_base)
            reserved += blk[i].segment_size;
    }
    CHECK(found_a == 1 && found_b == 1);
    CHECK((int64_t)alloc_bytes == st.allocated_bytes[NRN_POOL_ALL].current);
    CHECK((int64_t)requested == st.requested_bytes[NRN_POOL_ALL].current);
    CHECK(covered == reserved && (int64_t)reserved == st.reserved_bytes[NRN_POOL_ALL].current);
    free(blk);
    CHECK_OK(nrn_mem_free(a));
    CHECK_OK(nrn_mem_free(b));
    CHECK_ST(nrn_mem_snapshot(99, NULL, 0, &n), NRN_INVALID_HANDLE);
}

static void test_segments(void)
{
    void *a, *b;
    nrn_segment_info info;
    int dev = -1, local = 0;
    CHECK_OK(nrn_mem_alloc(0, 3 * MiB, &a));
    unsigned char *p = (unsigned char *)a + 100;
    memset(a, 0x11, 3 * MiB);
    p[0] = 0xAB;
    CHECK_OK(nrn_mem_segment_of(p, &info));
    CHECK(info.fd >= 0 && info.device == 0 && info.size == 20 * MiB);
    CHECK((unsigned char *)info.base + info.offset == p);
    void *m = mmap(NULL, info.size, PROT_READ | PROT_WRITE, MAP_SHARED, info.fd, 0);
    CHECK(m != MAP_FAILED);
    if (m != MAP_FAILED) {
        unsigned char *mp = (unsigned char *)m + info.offset;
        CHECK(mp[0] == 0xAB && mp[1] == 0x11);
        mp[1] = 0xCD; /* writes through the second mapping are visible in the first */
        CHECK(p[1] == 0xCD);
        munmap(m, info.size);
    }
    CHECK_OK(nrn_mem_device_of(p, &dev));
    CHECK(dev == 0);
    CHECK_OK(nrn_mem_device_of((char *)a + 3 * MiB - 1, &dev));
    CHECK_ST(nrn_mem_device_of(&local, &dev), NRN_INVALID_HANDLE);
    CHECK_ST(nrn_mem_segment_of(&local, &info), NRN_INVALID_HANDLE);
    CHECK_OK(nrn_mem_alloc(2, 5000, &b));
    CHECK_OK(nrn_mem_device_of((char *)b + 4999, &dev));
    CHECK(dev == 2);
    CHECK_OK(nrn_mem_segment_of((char *)b + 1, &info));
    CHECK(info.device == 2 && info.size == 2 * MiB && info.offset == (uint64_t)((char *)b + 1 - (char *)info.base));
    CHECK_OK(nrn_mem_free(a));
    CHECK_OK(nrn_mem_free(b));
    CHECK_OK(nrn_mem_empty_cache(-1));
    CHECK_ST(nrn_mem_device_of(p, &dev), NRN_INVALID_HANDLE); /* unmapped with the cache */
}

static void test_pinned_host(void)
{
    void *p, *z = (void *)1;
    int local;
    CHECK_OK(nrn_host_alloc(0, &z));
    CHECK(z == NULL);
    CHECK_OK(nrn_host_alloc(10000, &p));
    CHECK(p != NULL && ((uintptr_t)p % (uintptr_t)sysconf(_SC_PAGESIZE)) == 0);
    memset(p, 1, 10000);
    CHECK(nrn_host_is_pinned(p));
    CHECK(nrn_host_is_pinned((char *)p + 9999));
    CHECK(!nrn_host_is_pinned(&local));
    CHECK(!nrn_host_is_pinned(NULL));
    CHECK_ST(nrn_host_free((char *)p + 8), NRN_INVALID_HANDLE);
    CHECK_OK(nrn_host_free(p));
    CHECK(!nrn_host_is_pinned(p));
    CHECK_ST(nrn_host_free(p), NRN_INVALID_HANDLE);
    CHECK_OK(nrn_host_free(NULL));
}

/* ---- streams, events, copies ---- */

static void test_streams(void)
{
    nrn_stream_id s1, s2, cur;
    int prio, seen[2] = {-1, -1};
    bool done = false;
    pthread_t t;
    CHECK_OK(nrn_stream_create(0, -5, &s1));
    CHECK_OK(nrn_stream_create(0, 7, &s2));
    CHECK(s1 == 1 && s2 == 2);
    CHECK_OK(nrn_stream_get_priority(0, s1, &prio));
    CHECK(prio == NRN_STREAM_PRIORITY_HIGH);
    CHECK_OK(nrn_stream_get_priority(0, s2, &prio));
    CHECK(prio == NRN_STREAM_PRIORITY_LOW);
    CHECK_OK(nrn_stream_get_priority(0, NRN_STREAM_DEFAULT, &prio));
    CHECK(prio == 0);
    for (int i = 0; i < 20; i++) { /* the array grows */
        nrn_stream_id s;
        CHECK_OK(nrn_stream_create(1, 0, &s));
        CHECK(s == i + 1);
    }
    CHECK_ST(nrn_stream_get_priority(0, 3, &prio), NRN_INVALID_HANDLE);
    CHECK_MSG("unknown stream 3");
    CHECK_ST(nrn_stream_get_priority(0, -1, &prio), NRN_INVALID_HANDLE);
    CHECK_OK(nrn_stream_get_current(0, &cur));
    CHECK(cur == NRN_STREAM_DEFAULT);
    CHECK_OK(nrn_stream_set_current(0, s2));
    CHECK_OK(nrn_stream_get_current(0, &cur));
    CHECK(cur == s2);
    CHECK_OK(nrn_stream_get_current(1, &cur));
    CHECK(cur == NRN_STREAM_DEFAULT);
    CHECK_ST(nrn_stream_set_current(0, 99), NRN_INVALID_HANDLE);
    pthread_create(&t, NULL, current_device_thread, seen);
    pthread_join(t, NULL);
    CHECK(seen[1] == 0);
    CHECK_OK(nrn_stream_submit(0, s1));
    CHECK_OK(nrn_stream_query(0, s1, &done));
    CHECK(done);
    CHECK_OK(nrn_stream_synchronize(0, s1));
    CHECK_OK(nrn_device_synchronize(0));
    CHECK_ST(nrn_stream_submit(0, 42), NRN_INVALID_HANDLE);
    CHECK_ST(nrn_stream_query(7, 0, &done), NRN_INVALID_HANDLE);
    CHECK_OK(nrn_stream_set_current(0, NRN_STREAM_DEFAULT));
}

static void test_events(void)
{
    nrn_event *start, *end, *plain;
    bool done = false;
    double ms = -1;
    int dev = -1;
    nrn_stream_id s = -1, s1;
    CHECK_ST(nrn_event_create(4, &start), NRN_INVALID);
    CHECK_OK(nrn_event_create(NRN_EVENT_TIMING, &start));
    CHECK_OK(nrn_event_create(NRN_EVENT_TIMING, &end));
    CHECK_OK(nrn_event_create(NRN_EVENT_DEFAULT, &plain));
    CHECK_OK(nrn_stream_create(1, 0, &s1));
    CHECK_OK(nrn_event_query(start, &done));
    CHECK(done); /* never recorded */
    CHECK_OK(nrn_event_synchronize(start));
    CHECK_ST(nrn_event_get_stream(start, &dev, &s), NRN_INVALID);
    CHECK_ST(nrn_event_elapsed_ms(start, end, &ms), NRN_INVALID);
    CHECK_MSG("Both events must be recorded before calculating elapsed time");
    CHECK_OK(nrn_event_record(start, 1, s1));
    CHECK_OK(nrn_event_record(plain, 1, s1));
    CHECK_ST(nrn_event_elapsed_ms(start, plain, &ms), NRN_INVALID);
    CHECK_MSG("Both events must be created with argument 'enable_timing=True'");
    char *buf = malloc(MiB);
    double t0 = now_ms();
    while (now_ms() - t0 < 2.0) {
        CHECK_OK(nrn_memset(buf, 3, MiB, 1, s1));
    }
    free(buf);
    CHECK_OK(nrn_event_record(end, 1, s1));
    CHECK_OK(nrn_event_query(end, &done));
    CHECK(done);
    CHECK_OK(nrn_event_synchronize(end));
    CHECK_OK(nrn_stream_wait_event(0, NRN_STREAM_DEFAULT, end));
    CHECK_OK(nrn_event_elapsed_ms(start, end, &ms));
    CHECK(ms >= 1.5 && ms < 10000);
    CHECK_OK(nrn_event_get_stream(end, &dev, &s));
    CHECK(dev == 1 && s == s1);
    CHECK_ST(nrn_event_record(end, 1, 999), NRN_INVALID_HANDLE);
    CHECK_ST(nrn_event_record(NULL, 1, 0), NRN_INVALID);
    /* Re-recording moves the event. */
    CHECK_OK(nrn_event_record(end, 0, NRN_STREAM_DEFAULT));
    CHECK_OK(nrn_event_get_stream(end, &dev, &s));
    CHECK(dev == 0 && s == 0);
    CHECK_OK(nrn_event_destroy(start));
    CHECK_OK(nrn_event_destroy(end));
    CHECK_OK(nrn_event_destroy(plain));
    CHECK_OK(nrn_event_destroy(NULL));
}

static void test_copies(void)
{
    enum { N = 100000 };
    unsigned char *host = malloc(N), *back = malloc(N);
    void *d0, *d1;
    for (int i = 0; i < N; i++)
        host[i] = (unsigned char)(i * 7);
    CHECK_OK(nrn_mem_alloc(0, N, &d0));
    CHECK_OK(nrn_mem_alloc(1, N, &d1));
    CHECK_OK(nrn_memcpy(d0, host, N, 0, NRN_STREAM_DEFAULT));
    CHECK_OK(nrn_memcpy(d1, d0, N, 1, NRN_STREAM_DEFAULT));
    memset(back, 0, N);
    CHECK_OK(nrn_memcpy(back, d1, N, 0, NRN_STREAM_DEFAULT));
    CHECK(memcmp(host, back, N) == 0);
    CHECK_OK(nrn_memset(d0, 0x7f, 10, 0, NRN_STREAM_DEFAULT));
    CHECK(((unsigned char *)d0)[9] == 0x7f && ((unsigned char *)d0)[10] == host[10]);
    CHECK_OK(nrn_memcpy((char *)d0 + 1, d0, 1000, 0, NRN_STREAM_DEFAULT)); /* overlapping */
    CHECK(((unsigned char *)d0)[10] == 0x7f && ((unsigned char *)d0)[11] == host[10]);
    CHECK_OK(nrn_memcpy(NULL, NULL, 0, 0, NRN_STREAM_DEFAULT));
    CHECK_ST(nrn_memcpy(NULL, host, 10, 0, NRN_STREAM_DEFAULT), NRN_INVALID);
    CHECK_ST(nrn_memcpy(back, host, 10, 0, 77), NRN_INVALID_HANDLE);
    CHECK_ST(nrn_memcpy(back, host, 10, 5, 0), NRN_INVALID_HANDLE);
    CHECK_ST(nrn_memset((char *)d0 + 100, 0, 3 * MiB, 0, 0), NRN_INVALID); /* past the segment end */
    CHECK_MSG("bytes of device memory after it");
    bool done = false;
    CHECK_OK(nrn_stream_query(0, NRN_STREAM_DEFAULT, &done));
    CHECK(done);
    CHECK_OK(nrn_mem_free(d0));
    CHECK_OK(nrn_mem_free(d1));
    free(host);
    free(back);
}

/* ---- threads ---- */

typedef struct stress_arg {
    int dev;
    int ops;
    uint64_t seed;
    int errors;
} stress_arg;

static void *stress_thread(void *argp)
{
    stress_arg *arg = argp;
    enum { SLOTS = 64 };
    live_block live[SLOTS];
    uint64_t x = arg->seed;
    memset(live, 0, sizeof live);
    for (int op = 0; op < arg->ops; op++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        live_block *b = &live[x % SLOTS];
        if (b->p != NULL) {
            if (b->p[0] != b->tag || b->p[b->n - 1] != b->tag)
                arg->errors++;
            if (nrn_mem_free(b->p) != NRN_SUCCESS)
                arg->errors++;
            b->p = NULL;
        } else {
            size_t n = (x >> 20) % 64 == 0 ? 1 + (size_t)(x >> 8) % (12 * MiB) : 1 + (size_t)(x >> 8) % 65536;
            void *p;
            if (nrn_mem_alloc(arg->dev, n, &p) != NRN_SUCCESS) {
                arg->errors++;
                continue;
            }
            b->p = p;
            b->n = n;
            b->tag = (unsigned char)(x >> 32);
            b->p[0] = b->tag;
            b->p[n - 1] = b->tag;
        }
    }
    for (int i = 0; i < SLOTS; i++)
        if (live[i].p != NULL && nrn_mem_free(live[i].p) != NRN_SUCCESS)
            arg->errors++;
    return NULL;
}

static void test_threads(void)
{
    enum { T = 4 };
    pthread_t t[T];
    stress_arg args[T];
    nrn_mem_stats s;
    for (int i = 0; i < T; i++) {
        args[i].dev = i == 3 ? 1 : 0; /* three threads contend on device 0 */
        args[i].ops = 10000;
        args[i].seed = 0x1234567ull * (uint64_t)(i + 1);
        args[i].errors = 0;
        pthread_create(&t[i], NULL, stress_thread, &args[i]);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(t[i], NULL);
        CHECK(args[i].errors == 0);
    }
    for (int dev = 0; dev < 2; dev++) {
        get_stats(dev, &s);
        CHECK(s.allocation[0].current == 0 && s.allocated_bytes[0].current == 0);
        CHECK(s.inactive_split[0].current == 0);
        check_invariants(dev);
    }
    CHECK_OK(nrn_mem_empty_cache(-1));
    get_stats(0, &s);
    CHECK(s.reserved_bytes[0].current == 0);
}

static void test_close_with_live_memory(void)
{
    void *p;
    int dev;
    CHECK_OK(nrn_mem_alloc(0, 4096, &p));
    memset(p, 1, 4096);
    nrn_log_level old = nrn_log_level_get();
    nrn_log_level_set(NRN_LOG_WARN);
    CHECK_OK(nrn_close());
    nrn_log_level_set(old);
    ((unsigned char *)p)[4095] = 2; /* still mapped: leaked, not unmapped */
    CHECK_ST(nrn_mem_free(p), NRN_INVALID_HANDLE);
    CHECK_OK(nrn_init());
    CHECK_ST(nrn_mem_device_of(p, &dev), NRN_INVALID_HANDLE);
    nrn_mem_stats s;
    get_stats(0, &s);
    CHECK(s.reserved_bytes[0].current == 0 && s.num_device_alloc == 0);
}

static void bench(void)
{
    enum { N = 200000 };
    void *ptrs[16];
    double t0 = now_ms();
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < 16; j++)
            nrn_mem_alloc(0, (size_t)(j + 1) * 1000, &ptrs[j]);
        for (int j = 0; j < 16; j++)
            nrn_mem_free(ptrs[j]);
    }
    double t = now_ms() - t0;
    printf("bench: %.1f ns per alloc+free pair\n", t * 1e6 / (N * 16.0));
    nrn_mem_empty_cache(0);
}


/* A child forked after init must not allocate (its mapping is shared with the parent). */
static void test_fork_child(void)
{
    env_reset();
    CHECK_OK(nrn_init());
    void *p = NULL;
    CHECK_OK(nrn_mem_alloc(0, 4096, &p));
    memset(p, 7, 4096);
    pid_t pid = fork();
    if (pid == 0) {
        void *q = NULL;
        int ok = nrn_mem_alloc(0, 4096, &q) == NRN_FAILURE && q == NULL &&
                 strstr(nrn_last_error(), "forked child") != NULL &&
                 nrn_mem_free(p) == NRN_SUCCESS && ((unsigned char *)p)[100] == 7;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The parent is unaffected. */
    void *q = NULL;
    CHECK_OK(nrn_mem_alloc(0, 4096, &q));
    CHECK_OK(nrn_mem_free(q));
    CHECK_OK(nrn_mem_free(p));
    CHECK_OK(nrn_close());
}

int main(void)
{
    test_status();
    test_env();
    test_current_device();
    test_alloc_basic();
    test_alloc_sizes();
    test_coalescing();
    test_random_ops();
    test_capacity_oom();
    test_fault_injection();
    test_huge_pages();
    test_segments();
    test_snapshot();
    test_pinned_host();
    test_streams();
    test_events();
    test_copies();
    test_threads();
    test_close_with_live_memory();
    test_fork_child();
    bench();
    env_reset();
    printf("test_runtime: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
