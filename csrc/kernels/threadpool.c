/*
 * threadpool.c - the library's one thread pool (see nk_parallel_for in neuron_kernels.h).
 *
 * A job is published by bumping a generation counter. The range is cut into one part per thread, as
 * a static schedule would: thread t (the caller is 0) always starts on part t, so consecutive ops on
 * the same tensors find their part in that core's L2 (a dynamic schedule moved half of every operand
 * between the cores' caches each op, and cost a third of the speed of a 3 MiB element-wise op). Each
 * part is claimed in a few sub-chunks from its own cursor, and a thread that finishes its part takes
 * what is left of the others, so uneven chunks and late workers still balance. The caller works too,
 * closes the job when no chunk is left, and waits only for the workers that joined before that: a
 * worker that is not running yet (asleep, or without a core because other threads spin or the machine
 * is oversubscribed) never delays a job, the caller has done its share. Waiting for every worker to
 * arrive cost a scheduler time slice per op.
 */
#include "neuron_kernels.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NK_MAX_THREADS 256
/* Spin iterations before sleeping: long enough to catch the next op of a model (a few microseconds
 * apart), short enough not to steal a core from PyTorch's own threads for long. */
#define NK_SPIN_ITERS 20000

/* One thread's share of a job; padded so the cursors of different parts never share a cache line. */
typedef struct nk_part {
    _Alignas(64) atomic_int_fast64_t next; /* start of the next unclaimed sub-chunk */
    int64_t end;
} nk_part;

typedef struct nk_job {
    nk_range_fn fn;
    void *ctx;
    int64_t chunk;             /* sub-chunk length */
    unsigned generation;       /* the g_generation value that published this job */
    int nworkers;              /* workers 0 .. nworkers-1 take part */
    int nparts;                /* nworkers + 1 */
    nk_part *parts;
} nk_job;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* one job at a time; guards (re)sizing */
static int g_threads = 1;
static int g_started;                 /* workers running */
static atomic_uint g_generation;      /* futex word: bumped once per job */
static atomic_int g_inside;           /* workers that joined (or are trying to join) a job */
static atomic_uint g_open;            /* generation of the job open for joining; 0: none */
static atomic_int g_sleepers;         /* workers waiting on the futex */
static nk_job *_Atomic g_job;
static _Thread_local int t_in_parallel;
/* The generation current when each worker was created: it must not miss a job published before it
 * first runs. */
static unsigned g_start_generation[NK_MAX_THREADS];

static void futex_wait(atomic_uint *addr, unsigned expected) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(atomic_uint *addr) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Own part first (thread `self`, 0 = the caller), then whatever the other parts have left. */
static void run_chunks(nk_job *job, int self) {
    for (int i = 0; i < job->nparts; i++) {
        nk_part *p = &job->parts[(self + i) % job->nparts];
        for (;;) {
            int64_t b = atomic_fetch_add_explicit(&p->next, job->chunk, memory_order_relaxed);
            if (b >= p->end)
                break;
            int64_t e = b + job->chunk < p->end ? b + job->chunk : p->end;
            job->fn(job->ctx, b, e);
        }
    }
}

static void *worker_main(void *arg) {
    const int index = (int)(intptr_t)arg;
    t_in_parallel = 1;
    unsigned seen = g_start_generation[index];
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&g_generation, memory_order_acquire)) == seen) {
            if (++spins < NK_SPIN_ITERS) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
                continue;
            }
            atomic_fetch_add(&g_sleepers, 1);
            futex_wait(&g_generation, seen);
            atomic_fetch_sub(&g_sleepers, 1);
            spins = 0;
        }
        seen = gen;
        /* Join, then check the job is still open (both sequentially consistent, against the caller's
         * close-then-count): a worker that saw it open is counted before the caller stops waiting. */
        atomic_fetch_add(&g_inside, 1);
        if (atomic_load(&g_open) == gen) {
            nk_job *job = atomic_load_explicit(&g_job, memory_order_acquire);
            if (index < job->nworkers)
                run_chunks(job, index + 1);
        }
        atomic_fetch_sub_explicit(&g_inside, 1, memory_order_release);
    }
    return NULL;
}

static _Atomic(nk_parallel_run_fn) g_runner;
static int (*_Atomic g_runner_threads)(void);

void nk_parallel_set_runner(nk_parallel_run_fn run, int (*threads)(void)) {
    atomic_store(&g_runner_threads, run != NULL ? threads : NULL);
    atomic_store(&g_runner, run);
}

void nk_threads_set(int n) {
    if (n < 1)
        n = 1;
    if (n > NK_MAX_THREADS)
        n = NK_MAX_THREADS;
    pthread_mutex_lock(&g_lock);
    /* Workers are never stopped: with a smaller count the extra ones wake but take no part. */
    g_threads = n;
    pthread_mutex_unlock(&g_lock);
}

int nk_threads_get(void) {
    int (*threads)(void) = atomic_load_explicit(&g_runner_threads, memory_order_acquire);
    if (threads != NULL) {
        const int n = threads();
        return n < 1 ? 1 : n;
    }
    return g_threads;
}

void nk_parallel_for(int64_t n, int64_t grain, nk_range_fn fn, void *ctx) {
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    /* One chunk runs here whatever pool is attached: handing it to PyTorch's parallel_for first cost
     * ~550 instructions, a third of a 1-element op's kernel time. */
    if (n <= grain) {
        fn(ctx, 0, n);
        return;
    }
    const nk_parallel_run_fn run = atomic_load_explicit(&g_runner, memory_order_acquire);
    if (run != NULL) {
        run(n, grain, fn, ctx);
        return;
    }
    int threads = g_threads;
    if (t_in_parallel || threads == 1 || n <= grain) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&g_lock);
    threads = g_threads;
    while (g_started < threads - 1) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        g_start_generation[g_started] = atomic_load(&g_generation);
        int rc = pthread_create(&th, &attr, worker_main, (void *)(intptr_t)g_started);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break; /* run with the workers we have */
        g_started++;
    }
    int workers = g_started < threads - 1 ? g_started : threads - 1;
    if (workers == 0) {
        pthread_mutex_unlock(&g_lock);
        fn(ctx, 0, n);
        return;
    }
    /* One part per thread that the grain allows; sub-chunks of about a quarter part for balance,
     * never below the grain. Part boundaries depend only on n and the thread count, so the same
     * tensor splits the same way every op. */
    int nparts = workers + 1;
    if ((int64_t)nparts > n / grain)
        nparts = (int)(n / grain) > 1 ? (int)(n / grain) : 2;
    workers = nparts - 1;
    int64_t per = (n + nparts - 1) / nparts;
    int64_t chunk = (per + 3) / 4;
    if (chunk < grain)
        chunk = grain;
    nk_part parts[NK_MAX_THREADS];
    for (int i = 0; i < nparts; i++) {
        int64_t b = (int64_t)i * per < n ? (int64_t)i * per : n;
        atomic_init(&parts[i].next, b);
        parts[i].end = b + per < n ? b + per : n;
    }
    unsigned gen = atomic_load_explicit(&g_generation, memory_order_relaxed) + 1;
    if (gen == 0)
        gen = 1; /* 0 means "no open job" */
    nk_job job = {.fn = fn, .ctx = ctx, .chunk = chunk, .generation = gen, .nworkers = workers,
                  .nparts = nparts, .parts = parts};
    atomic_store_explicit(&g_job, &job, memory_order_release);
    atomic_store(&g_open, gen);
    atomic_store(&g_generation, gen);
    if (atomic_load(&g_sleepers) > 0)
        futex_wake_all(&g_generation);
    t_in_parallel = 1;
    run_chunks(&job, 0);
    t_in_parallel = 0;
    atomic_store(&g_open, 0);
    /* Only workers inside a chunk remain; one that lost its core mid-chunk gets it back sooner if we
     * step aside. */
    for (int spins = 0; atomic_load_explicit(&g_inside, memory_order_acquire) > 0; spins++) {
        if (spins < 4096) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield();
        }
    }
    atomic_store_explicit(&g_job, NULL, memory_order_relaxed);
    pthread_mutex_unlock(&g_lock);
}
