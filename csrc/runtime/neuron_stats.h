/*
 * neuron_stats.h - the per-process statistics segment read by neuron-ls / neuron-top.
 *
 * Every process with an initialised runtime publishes a small file, <dir>/neuron-stats-<pid>
 * (dir: $NEURON_RT_STATS_DIR, default /dev/shm/neuron-stats), laid out as nrn_stats_segment below. A background thread
 * refreshes it every $NEURON_RT_STATS_INTERVAL_MS (default 200) from counters the runtime already keeps
 * (allocator statistics, stream submissions, the binding's op counters): an eager op pays nothing more. The file is removed at exit (atexit); a reader that finds the file
 * of a dead process (or of a reused pid: the start time differs) removes it (nrn_stats_cleanup_stale).
 * NEURON_RT_STATS=0 turns the whole thing off.
 *
 * Readers: check magic and version, then read until `seq` is even and equal before and after the read
 * (the writer makes it odd while it updates).
 */
#ifndef NEURON_STATS_H
#define NEURON_STATS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NRN_STATS_MAGIC 0x5354415453524e4eULL /* "NNRSTATS" little-endian */
#define NRN_STATS_VERSION 1
#define NRN_STATS_MAX_CORES 128
#define NRN_STATS_CMDLINE 512

typedef struct nrn_stats_core {
    int32_t logical_index;    /* index inside the process (after NEURON_RT_VISIBLE_CORES renumbering) */
    int32_t physical_index;   /* logical core index on the instance */
    int32_t chip;
    int32_t physical_cores;   /* physical NeuronCores in this logical core */
    uint64_t capacity;        /* bytes */
    uint64_t reserved;        /* bytes of segments held by the caching allocator */
    uint64_t allocated;       /* bytes of live allocations */
    uint64_t peak_allocated;
    uint64_t native_ops;      /* native kernel calls attributed to this core (see nrn_stats_set_native_source) */
    uint64_t fallback_ops;    /* CPU-fallback calls submitted to this core's streams */
    uint64_t busy_ns;         /* CPU time of the process in intervals where this core ran ops (shared by
                                 op count when several did); the emulated core executes on the host CPU */
    uint64_t reserved_pad;
} nrn_stats_core; /* 80 bytes */

typedef struct nrn_stats_segment {
    uint64_t magic;
    uint32_t version;
    uint32_t size;            /* sizeof(nrn_stats_segment) */
    uint64_t seq;             /* odd while the writer updates */
    int32_t pid;
    int32_t core_count;       /* visible logical cores (0 until the runtime is initialised) */
    uint64_t start_ticks;     /* /proc/<pid>/stat field 22: tells a reused pid apart */
    uint64_t update_unix_ns;  /* CLOCK_REALTIME of the last update */
    uint64_t cpu_ns;          /* CLOCK_PROCESS_CPUTIME_ID at the last update */
    uint64_t interval_ms;
    uint64_t native_ops;      /* native kernel calls of the process (all cores) */
    uint64_t fallback_ops;    /* CPU-fallback calls of the process (all cores) */
    int32_t nc_config;        /* NEURON_LOGICAL_NC_CONFIG in effect */
    int32_t pad;
    char cmdline[NRN_STATS_CMDLINE]; /* arguments joined by spaces, truncated */
    nrn_stats_core cores[NRN_STATS_MAX_CORES];
} nrn_stats_segment;

/* The binding's count of native kernel calls so far (all cores), summed by the refresher thread each
 * interval, so the eager hot path gains nothing. The calls of an interval are attributed to the cores
 * that ran CPU-fallback ops in it (by their counts), else to the cores holding memory (by bytes), else to
 * core 0: exact for the usual one core per process, an estimate when one process drives several. */
void nrn_stats_set_native_source(uint64_t (*fn)(void));

/* Starts publishing (idempotent; nrn_init calls it). Returns 0, or -1 if disabled or it failed. */
int nrn_stats_start(void);
/* Refreshes the segment now (tests, and the binding before a reader is expected). */
void nrn_stats_publish_now(void);
/* Removes this process's segment and stops refreshing it (also run at exit). */
void nrn_stats_stop(void);
/* The segment path of this process ("" when not publishing). */
const char *nrn_stats_path(void);
/* Removes segments of processes that are gone from dir (NULL: the default dir); returns how many. */
int nrn_stats_cleanup_stale(const char *dir);

#ifdef __cplusplus
}
#endif
#endif /* NEURON_STATS_H */
