/*
 * runtime_internal.h - state shared between the runtime's translation units. Not installed, not public.
 *
 * Lock order (outer to inner): init lock -> device allocator lock -> segment registry lock.
 * The stream lock of a device and the lock of an event are leaves: nothing else is taken under them.
 */
#ifndef NEURON_RUNTIME_INTERNAL_H
#define NEURON_RUNTIME_INTERNAL_H

#include "neuron_runtime.h"

#include <pthread.h>
#include <stdatomic.h>

#define NRN_CORES_PER_CHIP 8
#define NRN_MAX_CHIPS 16
#define NRN_MAX_DEVICES (NRN_CORES_PER_CHIP * NRN_MAX_CHIPS)
#define NRN_ERRMSG_MAX 1024

#if defined(__GNUC__)
#define NRN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define NRN_PRINTF(a, b)
#endif

/* ---- status.c ---- */
/* Stores a message for nrn_last_error() and returns st, so callers can write `return nrn_error_set(...)`. */
nrn_status nrn_error_set(nrn_status st, const char *fmt, ...) NRN_PRINTF(2, 3);
/* "2.00 GiB" style, like PyTorch's format_size. */
void nrn_format_bytes(uint64_t bytes, char *buf, size_t n);

/* ---- device.c ---- */
typedef struct nrn_allocator nrn_allocator;

typedef struct nrn_stream_state {
    int32_t priority;
    uint64_t submitted;
    uint64_t completed;
} nrn_stream_state;

typedef struct nrn_device {
    nrn_device_props props;
    /* Guards the stream array and every stream's counters. */
    pthread_mutex_t stream_lock;
    nrn_stream_state *streams;
    size_t n_streams;
    size_t cap_streams;
    nrn_allocator *alloc;
} nrn_device;

/* Implicitly initialises the runtime; cheap once initialised (one acquire load). */
nrn_status nrn_runtime_ensure(void);
/* Validates dev (after implicit init) and returns its state. fn names the API entry for the message. */
nrn_status nrn_device_lookup(int dev, nrn_device **out, const char *fn);
/* Bumped by every nrn_close, so thread-locals and events can tell that their device state is stale. */
uint64_t nrn_runtime_generation(void);
/* True in a child forked after the runtime was initialised: allocation is refused there. */
bool nrn_runtime_forked_child(void);
int nrn_runtime_device_count(void);
nrn_device *nrn_runtime_device(int dev); /* dev must be valid */
/* Holds the init lock: the device array stays as it is (stats_shm.c samples it from its thread). */
void nrn_runtime_lock_devices(void);
void nrn_runtime_unlock_devices(void);

/* ---- memory.c ---- */
nrn_status nrn_allocator_create(int dev, uint64_t capacity, nrn_allocator **out);
/* Unmaps every segment with no live allocation; segments still in use are leaked (left mapped). */
void nrn_allocator_destroy(nrn_allocator *a);
/* Consumes one tick of the fault-injection countdown; true if this OS allocation must fail. */
bool nrn_debug_os_alloc_should_fail(void);
/* If p lies inside a device segment: its device, and the bytes from p to the segment end. */
bool nrn_segment_lookup(const void *p, int *dev, uint64_t *bytes_after);

/* ---- stream.c ---- */
nrn_status nrn_streams_init(nrn_device *d);
void nrn_streams_destroy(nrn_device *d);

#endif /* NEURON_RUNTIME_INTERNAL_H */
