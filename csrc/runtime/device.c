/* device.c - runtime initialisation from the environment, device properties, the current device. */
#include "neuron_stats.h"
#include "runtime_internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NRN_RT_UNINIT = 0, NRN_RT_READY = 1, NRN_RT_FAILED = 2 };

static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
/* Read without the lock on the hot path; written under g_init_lock after the devices are set up. */
static _Atomic int g_state = NRN_RT_UNINIT;
static _Atomic uint64_t g_generation = 1;
static nrn_device *g_devices;
static int g_device_count;
/* A failed init is remembered so every later call reports the same problem. */
static nrn_status g_init_status;
static char g_init_msg[NRN_ERRMSG_MAX];

static _Thread_local int tl_current_device;
static _Thread_local uint64_t tl_current_device_gen;

typedef struct nrn_env_config {
    int config;
    int chips;
    int available;
    int count;
    int physical[NRN_MAX_DEVICES];
    bool have_memory;
    uint64_t memory_per_core;
} nrn_env_config;

/* ---- environment parsing ---- */

static const char *nrn_env_get(const char *name)
{
    const char *v = getenv(name);
    /* An empty variable means "unset": shells and launchers often export VAR= to clear a setting. */
    return (v != NULL && v[0] != '\0') ? v : NULL;
}

/* Parses a whole string as a decimal int in [lo, hi]; false on junk, sign tricks or overflow. */
static bool nrn_parse_int(const char *s, size_t len, long lo, long hi, long *out)
{
    long v = 0;
    if (len == 0)
        return false;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i]))
            return false;
        if (v > (hi + 9) / 10 + 1)
            return false; /* will exceed hi anyway; stop before overflowing */
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static nrn_status nrn_env_small_int(const char *name, long lo, long hi, long dflt, long *out)
{
    const char *v = nrn_env_get(name);
    if (v == NULL) {
        *out = dflt;
        return NRN_SUCCESS;
    }
    if (nrn_parse_int(v, strlen(v), lo, hi, out))
        return NRN_SUCCESS;
    if (hi == lo + 1)
        return nrn_error_set(NRN_INVALID, "%s='%s': expected %ld or %ld", name, v, lo, hi);
    return nrn_error_set(NRN_INVALID, "%s='%s': expected an integer from %ld to %ld", name, v, lo, hi);
}

static nrn_status nrn_env_visible_cores(const char *v, nrn_env_config *c)
{
    const char *name = "NEURON_RT_VISIBLE_CORES";
    const char *p = v;
    bool seen[NRN_MAX_DEVICES] = {false};
    c->count = 0;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *dash = memchr(p, '-', len);
        long lo, hi;
        /* Trim spaces around an item: "0, 3" is a natural thing to type. */
        while (len > 0 && isspace((unsigned char)*p)) {
            p++;
            len--;
        }
        while (len > 0 && isspace((unsigned char)p[len - 1]))
            len--;
        if (len == 0)
            return nrn_error_set(NRN_INVALID, "%s='%s': empty item; expected a comma-separated list of core "
                                 "indices and ranges such as '0-3,6'", name, v);
        if (dash != NULL) {
            const char *a = p, *b = dash + 1;
            size_t alen = (size_t)(dash - p), blen = len - alen - 1;
            while (alen > 0 && isspace((unsigned char)a[alen - 1]))
                alen--;
            while (blen > 0 && isspace((unsigned char)*b)) {
                b++;
                blen--;
            }
            if (!nrn_parse_int(a, alen, 0, 1000000, &lo) || !nrn_parse_int(b, blen, 0, 1000000, &hi))
                return nrn_error_set(NRN_INVALID, "%s='%s': '%.*s' is not a core index or a range 'a-b' of "
                                     "non-negative integers", name, v, (int)len, p);
            if (hi < lo)
                return nrn_error_set(NRN_INVALID, "%s='%s': range '%.*s' is reversed; write it as '%ld-%ld'",
                                     name, v, (int)len, p, hi, lo);
        } else {
            if (!nrn_parse_int(p, len, 0, 1000000, &lo))
                return nrn_error_set(NRN_INVALID, "%s='%s': '%.*s' is not a core index or a range 'a-b' of "
                                     "non-negative integers", name, v, (int)len, p);
            hi = lo;
        }
        if (hi >= c->available)
            return nrn_error_set(NRN_INVALID, "%s='%s': core %ld out of range; this instance has %d logical "
                                 "NeuronCores (0-%d) at NEURON_LOGICAL_NC_CONFIG=%d", name, v, hi,
                                 c->available, c->available - 1, c->config);
        for (long i = lo; i <= hi; i++) {
            if (seen[i])
                return nrn_error_set(NRN_INVALID, "%s='%s': core %ld is listed more than once", name, v, i);
            seen[i] = true;
            c->physical[c->count++] = (int)i;
        }
        if (end == NULL)
            break;
        p = end + 1;
    }
    return NRN_SUCCESS;
}

/* "1073741824", "512M", "2G", "2GiB", "1.5G", "64KB": powers of 1024. */
static nrn_status nrn_env_memory(const char *v, uint64_t *out)
{
    const char *name = "NEURON_RT_MEMORY_PER_CORE";
    const char *p = v;
    double mult = 1.0, value;
    char *end = NULL;
    if (!isdigit((unsigned char)*p) && *p != '.')
        goto bad; /* strtod would also accept "-1", "inf", "0x10" */
    errno = 0;
    value = strtod(p, &end);
    if (errno != 0 || end == p)
        goto bad;
    p = end;
    while (isspace((unsigned char)*p))
        p++;
    switch (toupper((unsigned char)*p)) {
    case 'K': mult = 1024.0; p++; break;
    case 'M': mult = 1024.0 * 1024.0; p++; break;
    case 'G': mult = 1024.0 * 1024.0 * 1024.0; p++; break;
    case 'T': mult = 1024.0 * 1024.0 * 1024.0 * 1024.0; p++; break;
    default: break;
    }
    if (mult > 1.0 && (p[0] == 'i' || p[0] == 'I') && (p[1] == 'b' || p[1] == 'B'))
        p += 2;
    else if (p[0] == 'b' || p[0] == 'B')
        p++;
    if (*p != '\0')
        goto bad;
    value *= mult;
    if (!(value >= 1.0) || value >= 9.2e18)
        return nrn_error_set(NRN_INVALID, "%s='%s': the capacity must be at least 1 byte and below 8 EiB", name,
                             v);
    *out = (uint64_t)value;
    return NRN_SUCCESS;
bad:
    return nrn_error_set(NRN_INVALID, "%s='%s': expected a byte count, optionally with a K, M, G or T suffix "
                         "(powers of 1024, e.g. '1073741824', '512M', '2GiB', '1.5G')", name, v);
}

static nrn_status nrn_env_read(nrn_env_config *c)
{
    nrn_status st;
    long config, chips, num;
    const char *visible, *memory;

    memset(c, 0, sizeof *c);
    st = nrn_env_small_int("NEURON_LOGICAL_NC_CONFIG", 1, 2, 2, &config);
    if (st != NRN_SUCCESS)
        goto out;
    st = nrn_env_small_int("NEURON_RT_NUM_CHIPS", 1, NRN_MAX_CHIPS, 1, &chips);
    if (st != NRN_SUCCESS)
        goto out;
    c->config = (int)config;
    c->chips = (int)chips;
    c->available = c->chips * NRN_CORES_PER_CHIP / c->config;

    visible = nrn_env_get("NEURON_RT_VISIBLE_CORES");
    if (visible != NULL) {
        st = nrn_env_visible_cores(visible, c);
        if (st != NRN_SUCCESS)
            goto out;
    } else {
        const char *nv = nrn_env_get("NEURON_RT_NUM_CORES");
        if (nv != NULL && !nrn_parse_int(nv, strlen(nv), 1, c->available, &num)) {
            st = nrn_error_set(NRN_INVALID, "NEURON_RT_NUM_CORES='%s': expected an integer from 1 to %d (this "
                               "instance has %d logical NeuronCores at NEURON_LOGICAL_NC_CONFIG=%d)", nv,
                               c->available, c->available, c->config);
            goto out;
        }
        c->count = nv != NULL ? (int)num : c->available;
        for (int i = 0; i < c->count; i++)
            c->physical[i] = i;
    }

    memory = nrn_env_get("NEURON_RT_MEMORY_PER_CORE");
    if (memory != NULL) {
        st = nrn_env_memory(memory, &c->memory_per_core);
        if (st != NRN_SUCCESS)
            goto out;
        c->have_memory = true;
    }
    st = NRN_SUCCESS;
out:
    return st;
}

static uint64_t nrn_host_physical_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return UINT64_MAX;
    return (uint64_t)pages * (uint64_t)page;
}

/* ---- init / close ---- */

static void nrn_devices_free(nrn_device *devs, int count)
{
    for (int i = 0; i < count; i++) {
        if (devs[i].alloc != NULL)
            nrn_allocator_destroy(devs[i].alloc);
        nrn_streams_destroy(&devs[i]);
    }
    free(devs);
}

static nrn_status nrn_init_locked(void)
{
    nrn_env_config c;
    nrn_device *devs = NULL;
    int created = 0;
    uint64_t capacity;
    nrn_status st = nrn_env_read(&c);
    if (st != NRN_SUCCESS)
        goto out;

    capacity = (uint64_t)12 << 30;
    capacity *= (uint64_t)c.config;
    if (c.have_memory) {
        capacity = c.memory_per_core;
    } else {
        uint64_t phys = nrn_host_physical_memory();
        if (phys < capacity)
            capacity = phys;
    }

    devs = calloc((size_t)c.count, sizeof *devs);
    if (devs == NULL) {
        st = nrn_error_set(NRN_RESOURCE, "nrn_init: out of host memory for %d device descriptors", c.count);
        goto out;
    }
    for (created = 0; created < c.count; created++) {
        nrn_device *d = &devs[created];
        nrn_device_props *p = &d->props;
        snprintf(p->name, sizeof p->name, "NeuronCore-v3 (Trainium2, logical x%d)", c.config);
        p->logical_index = created;
        p->physical_index = c.physical[created];
        p->chip = c.physical[created] / (NRN_CORES_PER_CHIP / c.config);
        p->physical_cores = c.config;
        p->major = 3;
        p->minor = 0;
        p->memory_capacity = capacity;
        p->sbuf_bytes = (uint64_t)24 * 1024 * 1024 * (uint64_t)c.config;
        p->psum_bytes = (uint64_t)2 * 1024 * 1024 * (uint64_t)c.config;
        st = nrn_streams_init(d);
        if (st != NRN_SUCCESS)
            goto out;
        st = nrn_allocator_create(created, capacity, &d->alloc);
        if (st != NRN_SUCCESS) {
            created++; /* its streams exist and must be torn down */
            goto out;
        }
    }
    g_devices = devs;
    g_device_count = c.count;
    devs = NULL;
    nrn_log(NRN_LOG_INFO, "initialised %d logical NeuronCore(s) at NEURON_LOGICAL_NC_CONFIG=%d, %d chip(s), "
            "%llu bytes of device memory per core", c.count, c.config, c.chips, (unsigned long long)capacity);
    st = NRN_SUCCESS;
out:
    if (devs != NULL)
        nrn_devices_free(devs, created);
    return st;
}

/* Device memory is a MAP_SHARED mapping, so a forked child sees its parent's memory: allocating there
 * would hand out blocks the parent may also hand out. The child may keep reading inherited buffers but
 * cannot allocate (as with CUDA, use the 'spawn' start method for workers that use the device). */
static atomic_bool g_forked_child;

static void nrn_after_fork_in_child(void)
{
    if (atomic_load(&g_state) == NRN_RT_READY)
        atomic_store(&g_forked_child, true);
}

bool nrn_runtime_forked_child(void)
{
    return atomic_load_explicit(&g_forked_child, memory_order_relaxed);
}

nrn_status nrn_init(void)
{
    nrn_status st;
    if (atomic_load_explicit(&g_state, memory_order_acquire) == NRN_RT_READY)
        return NRN_SUCCESS;
    pthread_mutex_lock(&g_init_lock);
    switch (atomic_load_explicit(&g_state, memory_order_relaxed)) {
    case NRN_RT_READY:
        st = NRN_SUCCESS;
        break;
    case NRN_RT_FAILED:
        st = nrn_error_set(g_init_status, "%s", g_init_msg);
        break;
    default:
        st = nrn_init_locked();
        if (st == NRN_SUCCESS) {
            static bool atfork_registered;
            if (!atfork_registered && pthread_atfork(NULL, NULL, nrn_after_fork_in_child) == 0)
                atfork_registered = true;
            atomic_store_explicit(&g_state, NRN_RT_READY, memory_order_release);
            (void)nrn_stats_start(); /* neuron-ls / neuron-top; NEURON_RT_STATS=0 turns it off */
        } else {
            g_init_status = st;
            snprintf(g_init_msg, sizeof g_init_msg, "%s", nrn_last_error());
            atomic_store_explicit(&g_state, NRN_RT_FAILED, memory_order_release);
        }
        break;
    }
    pthread_mutex_unlock(&g_init_lock);
    return st;
}

nrn_status nrn_close(void)
{
    pthread_mutex_lock(&g_init_lock);
    if (atomic_load_explicit(&g_state, memory_order_relaxed) == NRN_RT_READY) {
        nrn_devices_free(g_devices, g_device_count);
        g_devices = NULL;
        g_device_count = 0;
    }
    /* Closing also forgets a failed init, so the environment is read afresh by the next nrn_init. */
    atomic_fetch_add(&g_generation, 1);
    atomic_store_explicit(&g_state, NRN_RT_UNINIT, memory_order_release);
    pthread_mutex_unlock(&g_init_lock);
    return NRN_SUCCESS;
}

void nrn_runtime_lock_devices(void)
{
    pthread_mutex_lock(&g_init_lock);
}

void nrn_runtime_unlock_devices(void)
{
    pthread_mutex_unlock(&g_init_lock);
}

bool nrn_is_initialized(void)
{
    return atomic_load_explicit(&g_state, memory_order_acquire) == NRN_RT_READY;
}

nrn_status nrn_runtime_ensure(void)
{
    if (atomic_load_explicit(&g_state, memory_order_acquire) == NRN_RT_READY)
        return NRN_SUCCESS;
    return nrn_init();
}

uint64_t nrn_runtime_generation(void)
{
    return atomic_load_explicit(&g_generation, memory_order_acquire);
}

int nrn_runtime_device_count(void)
{
    return g_device_count;
}

nrn_device *nrn_runtime_device(int dev)
{
    return &g_devices[dev];
}

nrn_status nrn_device_lookup(int dev, nrn_device **out, const char *fn)
{
    nrn_status st = nrn_runtime_ensure();
    if (st != NRN_SUCCESS)
        return st;
    if (dev < 0 || dev >= g_device_count)
        return nrn_error_set(NRN_INVALID_HANDLE, "%s: invalid device index %d; %d NeuronCore(s) are visible "
                             "(0-%d)", fn, dev, g_device_count, g_device_count - 1);
    *out = &g_devices[dev];
    return NRN_SUCCESS;
}

/* ---- devices ---- */

nrn_status nrn_device_count(int *count)
{
    nrn_status st;
    if (count == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_device_count: count is NULL");
    st = nrn_runtime_ensure();
    if (st != NRN_SUCCESS)
        return st;
    *count = g_device_count;
    return NRN_SUCCESS;
}

nrn_status nrn_device_get_props(int dev, nrn_device_props *out)
{
    nrn_device *d = NULL;
    nrn_status st;
    if (out == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_device_get_props: out is NULL");
    st = nrn_device_lookup(dev, &d, "nrn_device_get_props");
    if (st != NRN_SUCCESS)
        return st;
    *out = d->props;
    /* The capacity can change at run time (nrn_mem_set_capacity); report the live value. */
    return nrn_mem_get_info(dev, NULL, &out->memory_capacity);
}

nrn_status nrn_device_get_current(int *dev)
{
    nrn_status st;
    if (dev == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_device_get_current: dev is NULL");
    st = nrn_runtime_ensure();
    if (st != NRN_SUCCESS)
        return st;
    /* A choice made before an nrn_close may name a device that no longer exists. */
    if (tl_current_device_gen != nrn_runtime_generation()) {
        tl_current_device = 0;
        tl_current_device_gen = nrn_runtime_generation();
    }
    *dev = tl_current_device;
    return NRN_SUCCESS;
}

nrn_status nrn_device_set_current(int dev)
{
    nrn_device *d = NULL;
    nrn_status st = nrn_device_lookup(dev, &d, "nrn_device_set_current");
    if (st != NRN_SUCCESS)
        return st;
    tl_current_device = dev;
    tl_current_device_gen = nrn_runtime_generation();
    return NRN_SUCCESS;
}
