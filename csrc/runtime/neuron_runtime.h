/*
 * neuron_runtime.h - the TorchNeuron runtime: logical NeuronCores, device memory, streams, events.
 *
 * This is the only public header of csrc/runtime. It is plain C11 and includes no C++ or Python header.
 * The device driver here executes NeuronCore work on the host CPU; device memory is host-addressable.
 * A hardware driver can later implement the same API.
 *
 * Conventions
 *   - Every function that can fail returns an nrn_status. On failure it also stores a human-readable
 *     message for the calling thread, readable with nrn_last_error() until the next failing call.
 *   - Device indices are logical and renumbered from 0 after NEURON_RT_VISIBLE_CORES/NEURON_RT_NUM_CORES.
 *   - All functions are thread-safe. nrn_init() is idempotent and is called implicitly by every
 *     function that needs an initialised runtime.
 *
 * Execution model (documented so an asynchronous engine can slot in later)
 *   - Work is submitted to a stream of a device. In this driver every submitted piece of work runs to
 *     completion on the calling thread before the submitting call returns, so each stream's "completed"
 *     counter always equals its "submitted" counter.
 *   - An event records the stream's submitted counter (and, with NRN_EVENT_TIMING, a monotonic timestamp)
 *     at record time; it is complete once the stream's completed counter reaches that value. Query,
 *     synchronize and stream-wait-event honour this, so they stay correct if execution becomes async.
 *   - Memory freed while work may still use it is reusable once the owning stream (and any stream the
 *     block was recorded on) has passed the free point; with synchronous execution that is immediately.
 */
#ifndef NEURON_RUNTIME_H
#define NEURON_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. Values mirror the Neuron runtime's NRT_STATUS numbering where one fits. */
typedef enum nrn_status {
    NRN_SUCCESS = 0,
    NRN_FAILURE = 1,        /* generic failure (e.g. an OS call failed) */
    NRN_INVALID = 2,        /* invalid argument */
    NRN_INVALID_HANDLE = 3, /* unknown device, stream, event or pointer */
    NRN_RESOURCE = 4,       /* out of device memory (or another bounded resource) */
    NRN_TIMEOUT = 5,
    NRN_HW_ERROR = 6,
    NRN_QUEUE_FULL = 7,
    NRN_UNINITIALIZED = 13,
    NRN_CLOSED = 14,
    NRN_UNSUPPORTED = 15,   /* not in NRT: the operation is not supported by this driver */
} nrn_status;

const char *nrn_status_str(nrn_status s);
/* Message of the last failing call on this thread ("" if none). Valid until the next failing call. */
const char *nrn_last_error(void);

/* ---- logging ------------------------------------------------------------------------------------ */
/* NEURON_RT_LOG_LEVEL = ERROR | WARN | WARNING | INFO | DEBUG | TRACE (case-insensitive); default WARN. */
typedef enum nrn_log_level {
    NRN_LOG_ERROR = 0,
    NRN_LOG_WARN = 1,
    NRN_LOG_INFO = 2,
    NRN_LOG_DEBUG = 3,
    NRN_LOG_TRACE = 4,
} nrn_log_level;

nrn_log_level nrn_log_level_get(void);
void nrn_log_level_set(nrn_log_level level);
/* Writes "neuron-rt <LEVEL>: <message>\n" to stderr when level <= the current level. */
void nrn_log(nrn_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- runtime and devices ------------------------------------------------------------------------ */
/*
 * nrn_init reads the environment once:
 *   NEURON_LOGICAL_NC_CONFIG   1 or 2 (default 2): physical cores per logical core. One simulated
 *                              Trainium2 chip has 8 physical cores, so 4 logical cores at 2, 8 at 1.
 *   NEURON_RT_NUM_CHIPS        chips in the simulated instance (default 1, 1..16).
 *   NEURON_RT_VISIBLE_CORES    e.g. "1-2", "0,3", "0-3,6": logical cores made visible, renumbered from 0.
 *                              Wins over NEURON_RT_NUM_CORES.
 *   NEURON_RT_NUM_CORES        the first N logical cores are visible.
 *   NEURON_RT_MEMORY_PER_CORE  device memory capacity per logical core: bytes, or with a K/M/G/T suffix
 *                              (powers of 1024, optional "iB"/"B"). Default: the HBM share of a logical
 *                              core (12 GiB x config) bounded by the host's physical memory.
 * A malformed or out-of-range value makes nrn_init fail with NRN_INVALID and a message naming the
 * variable, its value and what is accepted; later calls fail the same way.
 */
nrn_status nrn_init(void);
/* Frees all device memory and streams. Device memory still in use by callers is leaked, not unmapped. */
nrn_status nrn_close(void);
bool nrn_is_initialized(void);

nrn_status nrn_device_count(int *count);

typedef struct nrn_device_props {
    char name[64];                 /* e.g. "NeuronCore-v3 (Trainium2, logical x2)" */
    int32_t logical_index;         /* index seen by the user (after renumbering) */
    int32_t physical_index;        /* logical core index on the instance before renumbering */
    int32_t chip;                  /* chip number */
    int32_t physical_cores;        /* physical NeuronCores in this logical core (the NC config) */
    int32_t major, minor;          /* NeuronCore version: 3.0 */
    uint64_t memory_capacity;      /* bytes of device memory this core may reserve */
    uint64_t sbuf_bytes;           /* on-chip state buffer per logical core */
    uint64_t psum_bytes;           /* partial-sum buffer per logical core */
} nrn_device_props;

nrn_status nrn_device_get_props(int dev, nrn_device_props *out);

/* Current device of the calling thread (default 0). */
nrn_status nrn_device_get_current(int *dev);
nrn_status nrn_device_set_current(int dev);
/* Waits for all work submitted to every stream of dev. */
nrn_status nrn_device_synchronize(int dev);

/* ---- device memory ------------------------------------------------------------------------------ */
/*
 * A caching allocator per device. Requests are rounded to 512 bytes. Requests of at most 1 MiB come
 * from the small pool (2 MiB segments); larger ones from the large pool (20 MiB segments for requests
 * below 10 MiB, else one segment rounded up to 2 MiB). Blocks are split and coalesced within a segment.
 * Segments are memfd-backed shared mappings, so another local process can map the same pages through
 * the segment's fd (see nrn_mem_segment_of).
 * When a request does not fit the capacity, cached free segments are released and the request retried;
 * if it still does not fit, NRN_RESOURCE is returned with a message naming the requested bytes, the
 * free bytes, and the capacity.
 */
nrn_status nrn_mem_alloc(int dev, size_t size, void **ptr); /* size 0 gives *ptr = NULL, success */
nrn_status nrn_mem_free(void *ptr);                         /* NULL is a no-op; unknown ptr: INVALID_HANDLE */
/* Returns cached, unused segments to the host; dev = -1 for all devices. */
nrn_status nrn_mem_empty_cache(int dev);
/* free = capacity - reserved bytes of this device; total = capacity. */
nrn_status nrn_mem_get_info(int dev, uint64_t *free_bytes, uint64_t *total_bytes);
/* Lowers or raises the capacity of a device (bytes); fails with INVALID below what is reserved. */
nrn_status nrn_mem_set_capacity(int dev, uint64_t bytes);
/* The device owning ptr (ptr may point anywhere inside an allocation); INVALID_HANDLE if none. */
nrn_status nrn_mem_device_of(const void *ptr, int *dev);

typedef struct nrn_segment_info {
    int fd;             /* memfd of the segment (owned by the runtime; do not close) */
    void *base;         /* start of the segment's mapping in this process */
    uint64_t size;      /* bytes of the segment */
    uint64_t offset;    /* offset of ptr inside the segment */
    int32_t device;
} nrn_segment_info;
/* Describes the segment holding ptr (which may point inside an allocation). */
nrn_status nrn_mem_segment_of(const void *ptr, nrn_segment_info *out);

/* Statistics, laid out like PyTorch's DeviceStats: index 0 = all pools, 1 = small pool, 2 = large pool. */
enum { NRN_POOL_ALL = 0, NRN_POOL_SMALL = 1, NRN_POOL_LARGE = 2, NRN_POOL_COUNT = 3 };
typedef struct nrn_stat {
    int64_t current, peak, allocated, freed;
} nrn_stat;
typedef struct nrn_mem_stats {
    nrn_stat allocation[NRN_POOL_COUNT];          /* number of live allocations */
    nrn_stat segment[NRN_POOL_COUNT];             /* number of reserved segments */
    nrn_stat active[NRN_POOL_COUNT];              /* live + waiting-on-stream blocks */
    nrn_stat inactive_split[NRN_POOL_COUNT];      /* free blocks inside partly used segments */
    nrn_stat allocated_bytes[NRN_POOL_COUNT];     /* rounded bytes of live allocations */
    nrn_stat reserved_bytes[NRN_POOL_COUNT];      /* bytes of segments */
    nrn_stat active_bytes[NRN_POOL_COUNT];
    nrn_stat inactive_split_bytes[NRN_POOL_COUNT];
    nrn_stat requested_bytes[NRN_POOL_COUNT];     /* bytes as requested, before rounding */
    int64_t num_alloc_retries;                    /* times the cache was flushed to satisfy a request */
    int64_t num_ooms;
    int64_t num_sync_all_streams;
    int64_t num_device_alloc;                     /* segments mapped */
    int64_t num_device_free;                      /* segments unmapped */
    nrn_stat oversize_allocations;
    nrn_stat oversize_segments;
    int64_t max_split_size;                       /* -1: unlimited */
} nrn_mem_stats;

nrn_status nrn_mem_get_stats(int dev, nrn_mem_stats *out);

/* One block of a device's segments, for memory snapshots. */
typedef struct nrn_mem_block_info {
    uint64_t segment_base, segment_size;
    int32_t pool;       /* NRN_POOL_SMALL or NRN_POOL_LARGE */
    bool allocated;
    uint64_t addr, size;
    uint64_t requested; /* bytes asked for (allocated blocks), 0 for free ones */
} nrn_mem_block_info;
/* Every block of dev's segments, segment by segment in address order: the first cap go to out, *count
 * is the total (call with cap 0 to size the array; the count can change between calls). */
nrn_status nrn_mem_snapshot(int dev, nrn_mem_block_info *out, size_t cap, size_t *count);
nrn_status nrn_mem_reset_peak_stats(int dev);         /* peak := current */
nrn_status nrn_mem_reset_accumulated_stats(int dev);  /* allocated/freed counters and counts := 0 */

/* Pinned host memory: page-aligned host buffers the runtime knows about (fast staging). */
nrn_status nrn_host_alloc(size_t size, void **ptr);
nrn_status nrn_host_free(void *ptr);
bool nrn_host_is_pinned(const void *ptr); /* true for any address inside a live pinned buffer */

/* ---- streams ------------------------------------------------------------------------------------ */
/*
 * Stream ids are per device; 0 is the default stream. Created streams live until nrn_close.
 * Priorities: 0 is the default (lowest); -1 is high, like CUDA (lower number = higher priority).
 */
typedef int64_t nrn_stream_id;
#define NRN_STREAM_DEFAULT ((nrn_stream_id)0)
#define NRN_STREAM_PRIORITY_LOW 0
#define NRN_STREAM_PRIORITY_HIGH (-1)

nrn_status nrn_stream_create(int dev, int priority, nrn_stream_id *out); /* priority clamped to range */
nrn_status nrn_stream_get_priority(int dev, nrn_stream_id s, int *priority);
/* The calling thread's current stream of dev (default: NRN_STREAM_DEFAULT). */
nrn_status nrn_stream_get_current(int dev, nrn_stream_id *s);
nrn_status nrn_stream_set_current(int dev, nrn_stream_id s);
nrn_status nrn_stream_query(int dev, nrn_stream_id s, bool *done);
nrn_status nrn_stream_synchronize(int dev, nrn_stream_id s);
/* Marks the submission of one unit of work on a stream (the binding calls this around each op). With
 * synchronous execution the work has completed when nrn_stream_submit returns. */
nrn_status nrn_stream_submit(int dev, nrn_stream_id s);

/* ---- events ------------------------------------------------------------------------------------- */
enum { NRN_EVENT_DEFAULT = 0, NRN_EVENT_TIMING = 1 };
typedef struct nrn_event nrn_event;

nrn_status nrn_event_create(unsigned flags, nrn_event **out);
nrn_status nrn_event_destroy(nrn_event *ev); /* NULL is a no-op */
nrn_status nrn_event_record(nrn_event *ev, int dev, nrn_stream_id s);
/* done = true if never recorded (as in CUDA) or once the recorded work completed. */
nrn_status nrn_event_query(const nrn_event *ev, bool *done);
nrn_status nrn_event_synchronize(const nrn_event *ev);
/* The stream s waits for ev before running work submitted after this call. */
nrn_status nrn_stream_wait_event(int dev, nrn_stream_id s, const nrn_event *ev);
/* Milliseconds between two recorded events; both need NRN_EVENT_TIMING and must be complete. */
nrn_status nrn_event_elapsed_ms(const nrn_event *start, const nrn_event *end, double *ms);
/* Device and stream of the last record; INVALID if never recorded. */
nrn_status nrn_event_get_stream(const nrn_event *ev, int *dev, nrn_stream_id *s);

/* ---- copies ------------------------------------------------------------------------------------- */
/* Copies n bytes between any mix of host and device memory, ordered on stream s of dev. */
nrn_status nrn_memcpy(void *dst, const void *src, size_t n, int dev, nrn_stream_id s);
nrn_status nrn_memset(void *dst, int value, size_t n, int dev, nrn_stream_id s);

/* ---- fault injection (tests) -------------------------------------------------------------------- */
/* The n-th next OS-level allocation (memfd/mmap, 1 = the next one) fails; 0 disables. */
void nrn_debug_fail_os_alloc_after(int n);

#ifdef __cplusplus
}
#endif
#endif /* NEURON_RUNTIME_H */
