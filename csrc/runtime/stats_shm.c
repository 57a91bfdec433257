/* stats_shm.c - the per-process statistics segment (neuron_stats.h) and its refresher thread. */
#include "neuron_stats.h"
#include "runtime_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t (*_Atomic g_native_source)(void);

void nrn_stats_set_native_source(uint64_t (*fn)(void))
{
    atomic_store(&g_native_source, fn);
}

static pthread_mutex_t g_stats_lock = PTHREAD_MUTEX_INITIALIZER; /* start/stop/publish; after the init lock */
static nrn_stats_segment *g_seg;
static pid_t g_owner;
static char g_path[PATH_MAX];
static bool g_started, g_atexit_registered;
static uint64_t g_interval_ms = 200;
/* Previous sample, to share the CPU time of an interval among the cores that ran ops in it. */
static uint64_t g_prev_ops[NRN_STATS_MAX_CORES], g_prev_fallback[NRN_STATS_MAX_CORES];
static double g_native_attr[NRN_STATS_MAX_CORES];
static uint64_t g_prev_cpu_ns, g_prev_native;

/* A directory of its own in /dev/shm by default (memory-backed, shared by every user: mode 1777), so that
 * the file a killed process leaves behind (until a reader or the next process removes it) is not one more
 * entry of /dev/shm itself, whose leftovers tests and users check. */
#define NRN_STATS_DEFAULT_DIR "/dev/shm/neuron-stats"

static const char *nrn_stats_dir(void)
{
    const char *d = getenv("NEURON_RT_STATS_DIR");
    if (d != NULL && d[0] != '\0')
        return d;
    if (mkdir(NRN_STATS_DEFAULT_DIR, 01777) == 0)
        (void)chmod(NRN_STATS_DEFAULT_DIR, 01777); /* mkdir's mode is cut by the umask */
    return NRN_STATS_DEFAULT_DIR;
}

static uint64_t nrn_clock_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); 0 if unreadable. */
static uint64_t nrn_proc_start_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (p == NULL)
        return 0;
    p++;
    /* After ')' come fields 3, 4, ...: skip 19 of them to reach field 22. */
    for (int field = 3; field < 22 && p != NULL; field++) {
        p = strchr(p + 1, ' ');
    }
    return p != NULL ? strtoull(p + 1, NULL, 10) : 0;
}

static void nrn_read_cmdline(char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/self/cmdline", "r");
    if (f == NULL)
        return;
    size_t n = fread(out, 1, cap - 1, f);
    fclose(f);
    while (n > 0 && out[n - 1] == '\0')
        n--;
    for (size_t i = 0; i < n; i++)
        if (out[i] == '\0')
            out[i] = ' ';
    out[n] = '\0';
}

/* Copies the runtime's counters into the segment. Holds the init lock (devices stay alive) and then
 * g_stats_lock; the allocator lock is taken inside nrn_mem_get_stats, as the lock order wants. */
static void nrn_stats_sample(void)
{
    uint64_t (*source)(void) = atomic_load(&g_native_source);
    uint64_t native_total = source != NULL ? source() : 0; /* outside our locks: it takes the binding's */
    nrn_runtime_lock_devices();
    pthread_mutex_lock(&g_stats_lock);
    nrn_stats_segment *s = g_seg;
    if (s == NULL || getpid() != g_owner)
        goto out;
    int count = nrn_is_initialized() ? nrn_runtime_device_count() : 0;
    if (count > NRN_STATS_MAX_CORES)
        count = NRN_STATS_MAX_CORES;
    uint64_t cpu = nrn_clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    uint64_t ops[NRN_STATS_MAX_CORES], delta_total = 0;
    nrn_stats_core cores[NRN_STATS_MAX_CORES];
    memset(cores, 0, sizeof(nrn_stats_core) * (size_t)count);
    for (int i = 0; i < count; i++) {
        nrn_device *d = nrn_runtime_device(i);
        nrn_stats_core *c = &cores[i];
        nrn_mem_stats ms;
        c->logical_index = i;
        c->physical_index = d->props.physical_index;
        c->chip = d->props.chip;
        c->physical_cores = d->props.physical_cores;
        if (nrn_mem_get_info(i, NULL, &c->capacity) != NRN_SUCCESS)
            c->capacity = d->props.memory_capacity;
        if (nrn_mem_get_stats(i, &ms) == NRN_SUCCESS) {
            c->reserved = (uint64_t)ms.reserved_bytes[NRN_POOL_ALL].current;
            c->allocated = (uint64_t)ms.allocated_bytes[NRN_POOL_ALL].current;
            c->peak_allocated = (uint64_t)ms.allocated_bytes[NRN_POOL_ALL].peak;
        }
        pthread_mutex_lock(&d->stream_lock);
        for (size_t k = 0; k < d->n_streams; k++)
            c->fallback_ops += d->streams[k].submitted;
        pthread_mutex_unlock(&d->stream_lock);
    }
    /* Native calls of the interval, shared as neuron_stats.h says. */
    uint64_t native_delta = 0;
    if (native_total > g_prev_native) { /* a concurrent sample may have read a later total first */
        native_delta = native_total - g_prev_native;
        g_prev_native = native_total;
    }
    double weight[NRN_STATS_MAX_CORES], weight_sum = 0;
    for (int pass = 0; pass < 2 && weight_sum == 0; pass++) {
        for (int i = 0; i < count; i++) {
            if (pass == 0)
                weight[i] = cores[i].fallback_ops > g_prev_fallback[i]
                                ? (double)(cores[i].fallback_ops - g_prev_fallback[i]) : 0;
            else
                weight[i] = (double)cores[i].allocated;
            weight_sum += weight[i];
        }
    }
    if (weight_sum == 0 && count > 0) {
        weight[0] = 1;
        weight_sum = 1;
    }
    uint64_t fallback_total = 0;
    for (int i = 0; i < count; i++) {
        g_native_attr[i] += (double)native_delta * weight[i] / weight_sum;
        cores[i].native_ops = (uint64_t)(g_native_attr[i] + 0.5);
        g_prev_fallback[i] = cores[i].fallback_ops;
        fallback_total += cores[i].fallback_ops;
        ops[i] = cores[i].native_ops + cores[i].fallback_ops;
        if (ops[i] > g_prev_ops[i])
            delta_total += ops[i] - g_prev_ops[i];
    }
    /* Busy time: the interval's CPU time, shared among the cores by the ops each ran in it. */
    uint64_t cpu_delta = cpu > g_prev_cpu_ns ? cpu - g_prev_cpu_ns : 0;
    for (int i = 0; i < count; i++) {
        uint64_t busy = s->cores[i].busy_ns;
        if (delta_total > 0 && ops[i] > g_prev_ops[i])
            busy += (uint64_t)((double)cpu_delta * (double)(ops[i] - g_prev_ops[i]) / (double)delta_total);
        cores[i].busy_ns = busy;
        g_prev_ops[i] = ops[i];
    }
    g_prev_cpu_ns = cpu;

    __atomic_fetch_add(&s->seq, 1, __ATOMIC_ACQ_REL); /* odd: readers retry */
    s->core_count = count;
    if (count > 0)
        s->nc_config = cores[0].physical_cores;
    memcpy(s->cores, cores, sizeof(nrn_stats_core) * (size_t)count);
    s->cpu_ns = cpu;
    s->native_ops = native_total;
    s->fallback_ops = fallback_total;
    s->update_unix_ns = nrn_clock_ns(CLOCK_REALTIME);
    __atomic_fetch_add(&s->seq, 1, __ATOMIC_ACQ_REL);
out:
    pthread_mutex_unlock(&g_stats_lock);
    nrn_runtime_unlock_devices();
}

void nrn_stats_publish_now(void)
{
    nrn_stats_sample();
}

static void *nrn_stats_thread(void *arg)
{
    (void)arg;
    for (;;) {
        struct timespec ts = {(time_t)(g_interval_ms / 1000), (long)(g_interval_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        pthread_mutex_lock(&g_stats_lock);
        bool live = g_seg != NULL;
        pthread_mutex_unlock(&g_stats_lock);
        if (!live)
            return NULL;
        nrn_stats_sample();
    }
}

/* Fork with the refresher inside nrn_stats_sample would leave the child with held locks: take both
 * across fork. The child forgets the parent's segment (its own starts with its own runtime, if ever). */
static void nrn_stats_fork_prepare(void)
{
    nrn_runtime_lock_devices();
    pthread_mutex_lock(&g_stats_lock);
}

static void nrn_stats_fork_parent(void)
{
    pthread_mutex_unlock(&g_stats_lock);
    nrn_runtime_unlock_devices();
}

static void nrn_stats_fork_child(void)
{
    g_seg = NULL;
    g_path[0] = '\0';
    pthread_mutex_unlock(&g_stats_lock);
    nrn_runtime_unlock_devices();
}

static void nrn_stats_atexit(void)
{
    nrn_stats_stop();
    /* A peer killed with SIGKILL (a rank of the same job, say) left its file behind; whoever outlives it
     * removes it, so no file stays after the last process of a job exits. */
    nrn_stats_cleanup_stale(NULL);
}

int nrn_stats_start(void)
{
    const char *off = getenv("NEURON_RT_STATS");
    if (off != NULL && strcmp(off, "0") == 0)
        return -1;
    pthread_mutex_lock(&g_stats_lock);
    if (g_started && g_owner == getpid()) {
        pthread_mutex_unlock(&g_stats_lock);
        return g_seg != NULL ? 0 : -1;
    }
    /* First start, or the first in a forked child: the parent's mapping and thread are not ours. */
    g_started = true;
    g_seg = NULL;
    g_owner = getpid();
    const char *ms = getenv("NEURON_RT_STATS_INTERVAL_MS");
    if (ms != NULL && atoi(ms) > 0)
        g_interval_ms = (uint64_t)atoi(ms);
    snprintf(g_path, sizeof g_path, "%s/neuron-stats-%d", nrn_stats_dir(), (int)g_owner);
    nrn_stats_cleanup_stale(NULL);
    /* A file left by an earlier process with the same pid is stale: replace it. */
    int fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    nrn_stats_segment *s = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)sizeof(nrn_stats_segment)) == 0)
        s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0)
        close(fd);
    if (s == MAP_FAILED) {
        nrn_log(NRN_LOG_WARN, "statistics segment %s not published: %s (NEURON_RT_STATS=0 turns it off)", g_path,
                strerror(errno));
        if (fd >= 0)
            unlink(g_path);
        g_path[0] = '\0';
        pthread_mutex_unlock(&g_stats_lock);
        return -1;
    }
    s->version = NRN_STATS_VERSION;
    s->size = (uint32_t)sizeof *s;
    s->pid = (int32_t)g_owner;
    s->start_ticks = nrn_proc_start_ticks(g_owner);
    s->interval_ms = g_interval_ms;
    nrn_read_cmdline(s->cmdline, sizeof s->cmdline);
    __atomic_store_n(&s->magic, NRN_STATS_MAGIC, __ATOMIC_RELEASE); /* last: readers skip half-made files */
    g_seg = s;
    memset(g_prev_ops, 0, sizeof g_prev_ops);
    memset(g_prev_fallback, 0, sizeof g_prev_fallback);
    memset(g_native_attr, 0, sizeof g_native_attr);
    g_prev_native = 0;
    g_prev_cpu_ns = nrn_clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    if (!g_atexit_registered && atexit(nrn_stats_atexit) == 0 &&
        pthread_atfork(nrn_stats_fork_prepare, nrn_stats_fork_parent, nrn_stats_fork_child) == 0)
        g_atexit_registered = true;
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    if (pthread_create(&th, &attr, nrn_stats_thread, NULL) != 0)
        nrn_log(NRN_LOG_WARN, "statistics segment %s: no refresher thread; it shows the state at start", g_path);
    pthread_attr_destroy(&attr);
    pthread_mutex_unlock(&g_stats_lock);
    return 0;
}

void nrn_stats_stop(void)
{
    pthread_mutex_lock(&g_stats_lock);
    /* A forked child inherits the parent's atexit handler and mapping: never remove the parent's file. */
    if (g_seg != NULL && g_owner == getpid()) {
        unlink(g_path);
        munmap(g_seg, sizeof *g_seg);
        g_path[0] = '\0';
    }
    g_seg = NULL;
    pthread_mutex_unlock(&g_stats_lock);
}

const char *nrn_stats_path(void)
{
    return (g_seg != NULL && g_owner == getpid()) ? g_path : "";
}

int nrn_stats_cleanup_stale(const char *dir)
{
    if (dir == NULL)
        dir = nrn_stats_dir();
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "neuron-stats-", 13) != 0)
            continue;
        char *end = NULL;
        long pid = strtol(e->d_name + 13, &end, 10);
        if (end == NULL || *end != '\0' || pid <= 0)
            continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        bool dead = kill((pid_t)pid, 0) != 0 && errno == ESRCH;
        if (!dead) {
            /* Alive: the pid may have been reused by another program since the file was written. */
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            nrn_stats_segment hdr;
            if (fd >= 0 && read(fd, &hdr, offsetof(nrn_stats_segment, cmdline)) ==
                               (ssize_t)offsetof(nrn_stats_segment, cmdline) &&
                hdr.magic == NRN_STATS_MAGIC && hdr.start_ticks != 0) {
                uint64_t now = nrn_proc_start_ticks((pid_t)pid);
                dead = now != 0 && now != hdr.start_ticks;
            }
            if (fd >= 0)
                close(fd);
        }
        if (dead && unlink(path) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}
