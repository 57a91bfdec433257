/*
 * stream.c - streams, events and ordered copies.
 *
 * Work runs synchronously on the submitting thread, but completion is still tracked with per-stream
 * submitted/completed counters and events compare against them, so an asynchronous engine only has to
 * advance "completed" from its worker instead of inline.
 */
#include "runtime_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct nrn_event {
    pthread_mutex_t lock;
    unsigned flags;
    bool recorded;
    int dev;
    nrn_stream_id stream;
    uint64_t counter;   /* the stream's submitted counter at record time */
    uint64_t gen;       /* runtime generation at record time: a later nrn_close makes the event trivially done */
    int64_t time_ns;
};

/* Per thread and per device, as in CUDA; gen resets the choices made before an nrn_close. */
static _Thread_local nrn_stream_id tl_stream[NRN_MAX_DEVICES];
static _Thread_local uint64_t tl_stream_gen;

nrn_status nrn_streams_init(nrn_device *d)
{
    d->streams = calloc(8, sizeof *d->streams);
    if (d->streams == NULL)
        return nrn_error_set(NRN_RESOURCE, "nrn_init: out of host memory for streams");
    d->cap_streams = 8;
    d->n_streams = 1; /* the default stream, priority 0 */
    pthread_mutex_init(&d->stream_lock, NULL);
    return NRN_SUCCESS;
}

void nrn_streams_destroy(nrn_device *d)
{
    if (d->streams == NULL)
        return;
    pthread_mutex_destroy(&d->stream_lock);
    free(d->streams);
    d->streams = NULL;
    d->n_streams = d->cap_streams = 0;
}

static int64_t nrn_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void nrn_pause(void)
{
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

static nrn_status nrn_stream_lookup(int dev, nrn_stream_id s, nrn_device **out, const char *fn)
{
    nrn_device *d = NULL;
    bool ok;
    nrn_status st = nrn_device_lookup(dev, &d, fn);
    if (st != NRN_SUCCESS)
        return st;
    pthread_mutex_lock(&d->stream_lock);
    ok = s >= 0 && (uint64_t)s < d->n_streams;
    pthread_mutex_unlock(&d->stream_lock);
    if (!ok)
        return nrn_error_set(NRN_INVALID_HANDLE, "%s: unknown stream %lld on neuron:%d", fn, (long long)s, dev);
    *out = d;
    return NRN_SUCCESS;
}

nrn_status nrn_stream_create(int dev, int priority, nrn_stream_id *out)
{
    nrn_device *d = NULL;
    nrn_status st;
    if (out == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_stream_create: out is NULL");
    st = nrn_device_lookup(dev, &d, "nrn_stream_create");
    if (st != NRN_SUCCESS)
        return st;
    if (priority < NRN_STREAM_PRIORITY_HIGH)
        priority = NRN_STREAM_PRIORITY_HIGH;
    if (priority > NRN_STREAM_PRIORITY_LOW)
        priority = NRN_STREAM_PRIORITY_LOW;
    pthread_mutex_lock(&d->stream_lock);
    if (d->n_streams == d->cap_streams) {
        size_t cap = d->cap_streams * 2;
        nrn_stream_state *n = realloc(d->streams, cap * sizeof *n);
        if (n == NULL) {
            st = nrn_error_set(NRN_RESOURCE, "nrn_stream_create: out of host memory for stream %zu on neuron:%d",
                               d->n_streams, dev);
            goto out;
        }
        d->streams = n;
        d->cap_streams = cap;
    }
    memset(&d->streams[d->n_streams], 0, sizeof d->streams[0]);
    d->streams[d->n_streams].priority = priority;
    *out = (nrn_stream_id)d->n_streams++;
out:
    pthread_mutex_unlock(&d->stream_lock);
    return st;
}

nrn_status nrn_stream_get_priority(int dev, nrn_stream_id s, int *priority)
{
    nrn_device *d = NULL;
    nrn_status st;
    if (priority == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_stream_get_priority: priority is NULL");
    st = nrn_stream_lookup(dev, s, &d, "nrn_stream_get_priority");
    if (st != NRN_SUCCESS)
        return st;
    pthread_mutex_lock(&d->stream_lock);
    *priority = d->streams[s].priority;
    pthread_mutex_unlock(&d->stream_lock);
    return NRN_SUCCESS;
}

static void nrn_tl_stream_refresh(void)
{
    uint64_t gen = nrn_runtime_generation();
    if (tl_stream_gen != gen) {
        memset(tl_stream, 0, sizeof tl_stream);
        tl_stream_gen = gen;
    }
}

nrn_status nrn_stream_get_current(int dev, nrn_stream_id *s)
{
    nrn_device *d = NULL;
    nrn_status st;
    if (s == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_stream_get_current: s is NULL");
    st = nrn_device_lookup(dev, &d, "nrn_stream_get_current");
    if (st != NRN_SUCCESS)
        return st;
    nrn_tl_stream_refresh();
    *s = tl_stream[dev];
    return NRN_SUCCESS;
}

nrn_status nrn_stream_set_current(int dev, nrn_stream_id s)
{
    nrn_device *d = NULL;
    nrn_status st = nrn_stream_lookup(dev, s, &d, "nrn_stream_set_current");
    if (st != NRN_SUCCESS)
        return st;
    nrn_tl_stream_refresh();
    tl_stream[dev] = s;
    return NRN_SUCCESS;
}

nrn_status nrn_stream_query(int dev, nrn_stream_id s, bool *done)
{
    nrn_device *d = NULL;
    nrn_status st;
    if (done == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_stream_query: done is NULL");
    st = nrn_stream_lookup(dev, s, &d, "nrn_stream_query");
    if (st != NRN_SUCCESS)
        return st;
    pthread_mutex_lock(&d->stream_lock);
    *done = d->streams[s].completed >= d->streams[s].submitted;
    pthread_mutex_unlock(&d->stream_lock);
    return NRN_SUCCESS;
}

/* Waits until stream index s of d has completed everything submitted before the call. */
static void nrn_stream_wait_idle(nrn_device *d, size_t s)
{
    uint64_t target;
    bool done;
    pthread_mutex_lock(&d->stream_lock);
    target = d->streams[s].submitted;
    done = d->streams[s].completed >= target;
    pthread_mutex_unlock(&d->stream_lock);
    while (!done) {
        nrn_pause();
        pthread_mutex_lock(&d->stream_lock);
        done = d->streams[s].completed >= target;
        pthread_mutex_unlock(&d->stream_lock);
    }
}

nrn_status nrn_stream_synchronize(int dev, nrn_stream_id s)
{
    nrn_device *d = NULL;
    nrn_status st = nrn_stream_lookup(dev, s, &d, "nrn_stream_synchronize");
    if (st != NRN_SUCCESS)
        return st;
    nrn_stream_wait_idle(d, (size_t)s);
    return NRN_SUCCESS;
}

nrn_status nrn_device_synchronize(int dev)
{
    nrn_device *d = NULL;
    size_t n;
    nrn_status st = nrn_device_lookup(dev, &d, "nrn_device_synchronize");
    if (st != NRN_SUCCESS)
        return st;
    pthread_mutex_lock(&d->stream_lock);
    n = d->n_streams;
    pthread_mutex_unlock(&d->stream_lock);
    for (size_t s = 0; s < n; s++)
        nrn_stream_wait_idle(d, s);
    return NRN_SUCCESS;
}

nrn_status nrn_stream_submit(int dev, nrn_stream_id s)
{
    nrn_device *d = NULL;
    nrn_status st = nrn_stream_lookup(dev, s, &d, "nrn_stream_submit");
    if (st != NRN_SUCCESS)
        return st;
    pthread_mutex_lock(&d->stream_lock);
    d->streams[s].submitted++;
    /* The caller runs the work inline, so it is complete by the time anyone can observe the stream. */
    d->streams[s].completed++;
    pthread_mutex_unlock(&d->stream_lock);
    return NRN_SUCCESS;
}

/* ---- events ---- */

nrn_status nrn_event_create(unsigned flags, nrn_event **out)
{
    nrn_event *ev;
    if (out == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_event_create: out is NULL");
    if ((flags & ~(unsigned)NRN_EVENT_TIMING) != 0)
        return nrn_error_set(NRN_INVALID, "nrn_event_create: unknown flags 0x%x (only NRN_EVENT_TIMING is "
                             "defined)", flags);
    ev = calloc(1, sizeof *ev);
    if (ev == NULL)
        return nrn_error_set(NRN_RESOURCE, "nrn_event_create: out of host memory");
    pthread_mutex_init(&ev->lock, NULL);
    ev->flags = flags;
    *out = ev;
    return NRN_SUCCESS;
}

nrn_status nrn_event_destroy(nrn_event *ev)
{
    if (ev == NULL)
        return NRN_SUCCESS;
    pthread_mutex_destroy(&ev->lock);
    free(ev);
    return NRN_SUCCESS;
}

nrn_status nrn_event_record(nrn_event *ev, int dev, nrn_stream_id s)
{
    nrn_device *d = NULL;
    uint64_t counter;
    nrn_status st;
    if (ev == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_event_record: event is NULL");
    st = nrn_stream_lookup(dev, s, &d, "nrn_event_record");
    if (st != NRN_SUCCESS)
        return st;
    pthread_mutex_lock(&d->stream_lock);
    counter = d->streams[s].submitted;
    pthread_mutex_unlock(&d->stream_lock);
    pthread_mutex_lock(&ev->lock);
    ev->recorded = true;
    ev->dev = dev;
    ev->stream = s;
    ev->counter = counter;
    ev->gen = nrn_runtime_generation();
    /* Work before the record already ran inline, so "now" is when the stream reached this point. */
    ev->time_ns = (ev->flags & NRN_EVENT_TIMING) ? nrn_now_ns() : 0;
    pthread_mutex_unlock(&ev->lock);
    return NRN_SUCCESS;
}

typedef struct nrn_event_snapshot {
    bool recorded;
    int dev;
    nrn_stream_id stream;
    uint64_t counter, gen;
    int64_t time_ns;
} nrn_event_snapshot;

static nrn_event_snapshot nrn_event_snap(const nrn_event *ev)
{
    nrn_event_snapshot sn;
    nrn_event *e = (nrn_event *)ev; /* the lock is the only thing mutated through a const event */
    pthread_mutex_lock(&e->lock);
    sn.recorded = e->recorded;
    sn.dev = e->dev;
    sn.stream = e->stream;
    sn.counter = e->counter;
    sn.gen = e->gen;
    sn.time_ns = e->time_ns;
    pthread_mutex_unlock(&e->lock);
    return sn;
}

static bool nrn_snapshot_done(const nrn_event_snapshot *sn)
{
    nrn_device *d = NULL;
    bool done;
    /* Never recorded, or recorded on streams that an nrn_close has since torn down: nothing to wait for. */
    if (!sn->recorded || sn->gen != nrn_runtime_generation() || !nrn_is_initialized())
        return true;
    d = nrn_runtime_device(sn->dev);
    pthread_mutex_lock(&d->stream_lock);
    done = d->streams[sn->stream].completed >= sn->counter;
    pthread_mutex_unlock(&d->stream_lock);
    return done;
}

nrn_status nrn_event_query(const nrn_event *ev, bool *done)
{
    nrn_event_snapshot sn;
    if (ev == NULL || done == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_event_query: %s is NULL", ev == NULL ? "event" : "done");
    sn = nrn_event_snap(ev);
    *done = nrn_snapshot_done(&sn);
    return NRN_SUCCESS;
}

nrn_status nrn_event_synchronize(const nrn_event *ev)
{
    nrn_event_snapshot sn;
    if (ev == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_event_synchronize: event is NULL");
    sn = nrn_event_snap(ev);
    while (!nrn_snapshot_done(&sn))
        nrn_pause();
    return NRN_SUCCESS;
}

nrn_status nrn_stream_wait_event(int dev, nrn_stream_id s, const nrn_event *ev)
{
    nrn_device *d = NULL;
    nrn_status st;
    if (ev == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_stream_wait_event: event is NULL");
    st = nrn_stream_lookup(dev, s, &d, "nrn_stream_wait_event");
    if (st != NRN_SUCCESS)
        return st;
    /* Work on s runs inline on the host, so waiting on the host orders it after the event. */
    return nrn_event_synchronize(ev);
}

nrn_status nrn_event_elapsed_ms(const nrn_event *start, const nrn_event *end, double *ms)
{
    nrn_event_snapshot a, b;
    if (start == NULL || end == NULL || ms == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_event_elapsed_ms: %s is NULL",
                             start == NULL ? "start" : end == NULL ? "end" : "ms");
    if (!(start->flags & NRN_EVENT_TIMING) || !(end->flags & NRN_EVENT_TIMING))
        return nrn_error_set(NRN_INVALID, "Both events must be created with argument 'enable_timing=True'");
    a = nrn_event_snap(start);
    b = nrn_event_snap(end);
    if (!a.recorded || !b.recorded)
        return nrn_error_set(NRN_INVALID, "Both events must be recorded before calculating elapsed time");
    if (!nrn_snapshot_done(&a) || !nrn_snapshot_done(&b))
        return nrn_error_set(NRN_FAILURE, "Both events must be completed before calculating elapsed time "
                             "(synchronize the events first)");
    *ms = (double)(b.time_ns - a.time_ns) / 1e6;
    return NRN_SUCCESS;
}

nrn_status nrn_event_get_stream(const nrn_event *ev, int *dev, nrn_stream_id *s)
{
    nrn_event_snapshot sn;
    if (ev == NULL)
        return nrn_error_set(NRN_INVALID, "nrn_event_get_stream: event is NULL");
    sn = nrn_event_snap(ev);
    if (!sn.recorded)
        return nrn_error_set(NRN_INVALID, "nrn_event_get_stream: the event was never recorded");
    if (dev != NULL)
        *dev = sn.dev;
    if (s != NULL)
        *s = sn.stream;
    return NRN_SUCCESS;
}

/* ---- copies ---- */

/* A device pointer must have n bytes left in its segment; host pointers cannot be checked. */
static nrn_status nrn_check_range(const void *p, size_t n, const char *what, const char *fn)
{
    uint64_t after;
    if (p == NULL)
        return nrn_error_set(NRN_INVALID, "%s: %s is NULL", fn, what);
    if (nrn_segment_lookup(p, NULL, &after) && after < n)
        return nrn_error_set(NRN_INVALID, "%s: %s %p has only %llu bytes of device memory after it, %zu requested",
                             fn, what, p, (unsigned long long)after, n);
    return NRN_SUCCESS;
}

static void nrn_stream_begin(nrn_device *d, nrn_stream_id s)
{
    pthread_mutex_lock(&d->stream_lock);
    d->streams[s].submitted++;
    pthread_mutex_unlock(&d->stream_lock);
}

static void nrn_stream_end(nrn_device *d, nrn_stream_id s)
{
    pthread_mutex_lock(&d->stream_lock);
    d->streams[s].completed++;
    pthread_mutex_unlock(&d->stream_lock);
}

nrn_status nrn_memcpy(void *dst, const void *src, size_t n, int dev, nrn_stream_id s)
{
    nrn_device *d = NULL;
    nrn_status st = nrn_stream_lookup(dev, s, &d, "nrn_memcpy");
    if (st != NRN_SUCCESS || n == 0)
        return st;
    st = nrn_check_range(dst, n, "dst", "nrn_memcpy");
    if (st != NRN_SUCCESS)
        return st;
    st = nrn_check_range(src, n, "src", "nrn_memcpy");
    if (st != NRN_SUCCESS)
        return st;
    nrn_stream_begin(d, s);
    memmove(dst, src, n); /* callers may copy within one buffer */
    nrn_stream_end(d, s);
    return NRN_SUCCESS;
}

nrn_status nrn_memset(void *dst, int value, size_t n, int dev, nrn_stream_id s)
{
    nrn_device *d = NULL;
    nrn_status st = nrn_stream_lookup(dev, s, &d, "nrn_memset");
    if (st != NRN_SUCCESS || n == 0)
        return st;
    st = nrn_check_range(dst, n, "dst", "nrn_memset");
    if (st != NRN_SUCCESS)
        return st;
    nrn_stream_begin(d, s);
    memset(dst, value, n);
    nrn_stream_end(d, s);
    return NRN_SUCCESS;
}
