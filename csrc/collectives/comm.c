/* comm.c - communicator life, workspace mapping, waiting (futex + liveness + timeout), errors. */
#include "collectives_internal.h"
#include "neuron_runtime.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char g_err[768];

ncl_status ncl_error(ncl_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return s;
}

const char *ncl_last_error(void) { return g_err; }

const char *ncl_status_str(ncl_status s)
{
    switch (s) {
    case NCL_SUCCESS: return "NCL_SUCCESS";
    case NCL_FAILURE: return "NCL_FAILURE";
    case NCL_INVALID: return "NCL_INVALID";
    case NCL_TIMEOUT: return "NCL_TIMEOUT";
    case NCL_PEER_DEAD: return "NCL_PEER_DEAD";
    case NCL_MISMATCH: return "NCL_MISMATCH";
    case NCL_BROKEN: return "NCL_BROKEN";
    case NCL_UNSUPPORTED: return "NCL_UNSUPPORTED";
    }
    return "NCL_UNKNOWN";
}

size_t ncl_dtype_size(ncl_dtype t)
{
    static const uint8_t sizes[NCL_DTYPE_COUNT] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 2, 4, 8};
    return (unsigned)t < NCL_DTYPE_COUNT ? sizes[t] : 0;
}

const char *ncl_dtype_name(ncl_dtype t)
{
    static const char *names[NCL_DTYPE_COUNT] = {"bool",    "uint8",    "int8",    "int16",  "int32",
                                                 "int64",   "float16",  "bfloat16", "float32", "float64",
                                                 "uint16",  "uint32",   "uint64"};
    return (unsigned)t < NCL_DTYPE_COUNT ? names[t] : "invalid";
}

const char *ncl_redop_name(ncl_redop op)
{
    static const char *names[NCL_REDOP_COUNT] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM"};
    return (unsigned)op < NCL_REDOP_COUNT ? names[op] : "invalid";
}

static double ncl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void ncl_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void ncl_layout_compute(ncl_layout *l, int size)
{
    size_t off = (sizeof(ncl_region) + 63) & ~(size_t)63;
    l->header_bytes = (sizeof(ncl_header) + (size_t)(2 * size + 1) * sizeof(ncl_piece) + 63) & ~(size_t)63;
    l->off_header[0] = off;
    l->off_header[1] = off + l->header_bytes;
    off += 2 * l->header_bytes;
    l->off_posted = off;
    off += (size_t)size * sizeof(ncl_flag);
    l->off_consumed = off;
    off += (size_t)size * sizeof(ncl_flag);
    l->off_ring = off;
    off += ((size_t)size * NCL_RING * sizeof(ncl_msg) + 4095) & ~(size_t)4095;
    off = (off + 4095) & ~(size_t)4095;
    l->off_slot[0] = off;
    l->off_slot[1] = off + NCL_STAGE_BYTES;
    l->total = off + 2 * NCL_STAGE_BYTES;
}

ncl_status ncl_comm_create(int rank, int size, double timeout_s, ncl_comm **out)
{
    ncl_comm *c;
    if (out == NULL)
        return ncl_error(NCL_INVALID, "ncl_comm_create: out is NULL");
    *out = NULL;
    if (size < 1 || size > NCL_MAX_RANKS || rank < 0 || rank >= size)
        return ncl_error(NCL_INVALID, "ncl_comm_create: rank %d / size %d out of range (size 1..%d)", rank, size,
                         NCL_MAX_RANKS);
    if (!(timeout_s > 0))
        return ncl_error(NCL_INVALID, "ncl_comm_create: timeout must be > 0 seconds, got %g", timeout_s);
    c = calloc(1, sizeof *c);
    if (c == NULL)
        return ncl_error(NCL_FAILURE, "ncl_comm_create: out of host memory");
    c->rank = rank;
    c->size = size;
    c->timeout_s = timeout_s;
    c->next_ndim = -1;
    /* Spinning pays only when every rank can have a core of its own: with more ranks than usable CPUs a
     * spinning rank would hold the core the rank it waits for needs. */
    cpu_set_t cpus;
    int ncpu = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    c->spin_s = size <= ncpu ? 50e-6 : 0.0;
    c->ws_fd = -1;
    ncl_layout_compute(&c->layout, size);
    c->peers = calloc((size_t)size, sizeof *c->peers);
    if (c->peers == NULL)
        goto fail_oom;
    for (int r = 0; r < size; r++)
        c->peers[r].pidfd = -1;
    c->ws_fd = memfd_create("neuron-collectives", MFD_CLOEXEC);
    if (c->ws_fd < 0 || ftruncate(c->ws_fd, (off_t)c->layout.total) != 0) {
        ncl_error(NCL_FAILURE, "ncl_comm_create: workspace of %zu bytes: %s", c->layout.total, strerror(errno));
        ncl_comm_destroy(c);
        return NCL_FAILURE;
    }
    void *base = mmap(NULL, c->layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, c->ws_fd, 0);
    if (base == MAP_FAILED) {
        ncl_error(NCL_FAILURE, "ncl_comm_create: mmap of the workspace: %s", strerror(errno));
        ncl_comm_destroy(c);
        return NCL_FAILURE;
    }
    c->self = base;
    c->self->magic = NCL_MAGIC;
    c->self->rank = rank;
    c->self->size = size;
    c->self->pid = (int32_t)getpid();
    c->peers[rank].region = c->self;
    c->peers[rank].pid = c->self->pid;
    *out = c;
    return NCL_SUCCESS;
fail_oom:
    ncl_comm_destroy(c);
    return ncl_error(NCL_FAILURE, "ncl_comm_create: out of host memory");
}

void ncl_comm_info(const ncl_comm *c, ncl_rank_info *out)
{
    struct stat sb;
    memset(out, 0, sizeof *out);
    out->pid = c->self->pid;
    out->fd = c->ws_fd;
    out->rank = c->rank;
    out->size = c->size;
    out->ws_bytes = c->layout.total;
    if (fstat(c->ws_fd, &sb) == 0)
        out->ws_ino = (uint64_t)sb.st_ino;
}

/* Opens another process's fd through procfs (same user; no ptrace attach needed). */
static int ncl_open_peer_fd(int32_t pid, int32_t fd, uint64_t want_ino, uint64_t want_size)
{
    char path[64];
    struct stat sb;
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, (int)fd);
    int f = open(path, O_RDWR | O_CLOEXEC);
    if (f < 0)
        return -errno;
    if (fstat(f, &sb) != 0 || (uint64_t)sb.st_ino != want_ino || (uint64_t)sb.st_size < want_size) {
        close(f);
        return -ESTALE;
    }
    return f;
}

ncl_status ncl_comm_connect(ncl_comm *c, const ncl_rank_info *infos)
{
    if (c == NULL || infos == NULL)
        return ncl_error(NCL_INVALID, "ncl_comm_connect: NULL argument");
    for (int r = 0; r < c->size; r++) {
        const ncl_rank_info *in = &infos[r];
        ncl_peer *p = &c->peers[r];
        if (in->rank != r || in->size != c->size)
            return ncl_error(NCL_INVALID, "ncl_comm_connect: info %d describes rank %d of %d (expected %d of %d)",
                             r, in->rank, in->size, r, c->size);
        if (r == c->rank)
            continue;
        int f = ncl_open_peer_fd(in->pid, in->fd, in->ws_ino, in->ws_bytes);
        if (f < 0)
            return ncl_error(NCL_FAILURE, "ncl_comm_connect: cannot open the workspace of rank %d (pid %d, fd %d): %s",
                             r, in->pid, in->fd, strerror(-f));
        void *base = mmap(NULL, c->layout.total, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
        close(f);
        if (base == MAP_FAILED)
            return ncl_error(NCL_FAILURE, "ncl_comm_connect: mmap of rank %d's workspace: %s", r, strerror(errno));
        p->region = base;
        p->pid = in->pid;
        if (p->region->magic != NCL_MAGIC || p->region->rank != r || p->region->size != c->size)
            return ncl_error(NCL_INVALID, "ncl_comm_connect: rank %d's workspace is not a communicator of size %d",
                             r, c->size);
        p->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)in->pid, 0);
        if (p->pidfd < 0)
            return ncl_error(NCL_PEER_DEAD, "ncl_comm_connect: rank %d (pid %d) is not running: %s", r, in->pid,
                             strerror(errno));
    }
    return ncl_phase_barrier(c, "ncl_comm_connect");
}

void ncl_comm_destroy(ncl_comm *c)
{
    if (c == NULL)
        return;
    if (c->peers != NULL) {
        for (int r = 0; r < c->size; r++) {
            ncl_peer *p = &c->peers[r];
            for (int i = 0; i < NCL_MAP_CACHE; i++)
                if (p->maps[i].base != NULL)
                    munmap(p->maps[i].base, p->maps[i].size);
            if (r != c->rank && p->region != NULL)
                munmap(p->region, c->layout.total);
            if (p->pidfd >= 0)
                close(p->pidfd);
        }
        free(c->peers);
    }
    if (c->self != NULL)
        munmap(c->self, c->layout.total);
    if (c->ws_fd >= 0)
        close(c->ws_fd);
    free(c);
}

ncl_status ncl_comm_set_timeout(ncl_comm *c, double timeout_s)
{
    if (!(timeout_s > 0))
        return ncl_error(NCL_INVALID, "ncl_comm_set_timeout: timeout must be > 0 seconds, got %g", timeout_s);
    c->timeout_s = timeout_s;
    return NCL_SUCCESS;
}

void ncl_comm_set_shape(ncl_comm *c, int ndim, const int64_t *sizes)
{
    c->next_ndim = ndim < 0 ? -1 : ndim;
    for (int i = 0; i < ndim && i < NCL_SHAPE_DIMS; i++)
        c->next_shape[i] = sizes[i];
}

int ncl_comm_rank(const ncl_comm *c) { return c->rank; }
int ncl_comm_size(const ncl_comm *c) { return c->size; }

void ncl_comm_abort(ncl_comm *c, const char *reason)
{
    snprintf(c->self->abort_reason, sizeof c->self->abort_reason, "%s", reason ? reason : "aborted");
    atomic_store(&c->self->aborted, 1);
    /* Wake whoever sleeps on any of this rank's flags. */
    syscall(SYS_futex, &c->self->arrive.value, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
    for (int r = 0; r < c->size; r++) {
        syscall(SYS_futex, &ncl_posted(c, c->rank, r)->value, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
        syscall(SYS_futex, &ncl_consumed(c, c->rank, r)->value, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
    }
}

ncl_status ncl_check_usable(ncl_comm *c, const char *what)
{
    if (c == NULL)
        return ncl_error(NCL_INVALID, "%s: communicator is NULL", what);
    if (c->broken)
        return ncl_error(NCL_BROKEN, "%s: the communicator is unusable after an earlier error: %s", what,
                         c->broken_msg);
    return NCL_SUCCESS;
}

void ncl_flag_set(ncl_flag *f, uint32_t value)
{
    atomic_store(&f->value, value);
    if (atomic_load(&f->waiters) != 0)
        syscall(SYS_futex, &f->value, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

static bool ncl_reached(uint32_t v, uint32_t target) { return (int32_t)(v - target) >= 0; }

static ncl_status ncl_break(ncl_comm *c, ncl_status s)
{
    snprintf(c->broken_msg, sizeof c->broken_msg, "%s", g_err);
    c->broken = s;
    /* Peers waiting for this rank learn at once instead of waiting for their own timeout. */
    ncl_comm_abort(c, g_err);
    return s;
}

/* Is peer gone (exited or aborted)? Fills the error message if so. */
static bool ncl_peer_gone(ncl_comm *c, int peer, const char *what)
{
    ncl_peer *p = &c->peers[peer];
    if (atomic_load(&p->region->aborted)) {
        ncl_error(NCL_PEER_DEAD, "%s: rank %d aborted: %s", what, peer, p->region->abort_reason);
        return true;
    }
    if (p->pidfd >= 0) {
        struct pollfd pfd = {.fd = p->pidfd, .events = POLLIN};
        if (poll(&pfd, 1, 0) > 0) {
            ncl_error(NCL_PEER_DEAD, "%s: rank %d (pid %d) exited while this rank (%d) was waiting for it", what,
                      peer, p->pid, c->rank);
            return true;
        }
    }
    return false;
}

ncl_status ncl_flag_wait(ncl_comm *c, ncl_flag *f, uint32_t target, int peer, const char *what)
{
    if (ncl_reached(atomic_load(&f->value), target))
        return NCL_SUCCESS;
    /* Spin a little: the peer usually arrives within microseconds, far below a futex round trip. */
    double start = ncl_now();
    for (int i = 1; c->spin_s > 0; i++) {
        ncl_cpu_relax();
        if (ncl_reached(atomic_load(&f->value), target))
            return NCL_SUCCESS;
        if ((i & 255) == 0 && ncl_now() - start > c->spin_s)
            break;
    }
    double deadline = start + c->timeout_s;
    for (int round = 0;; round++) {
        if (ncl_reached(atomic_load(&f->value), target))
            return NCL_SUCCESS;
        if (ncl_peer_gone(c, peer, what))
            return ncl_break(c, NCL_PEER_DEAD);
        double now = ncl_now();
        if (now > deadline) {
            ncl_error(NCL_TIMEOUT, "%s: timed out after %.3f s waiting for rank %d (this rank is %d of %d)", what,
                      c->timeout_s, peer, c->rank, c->size);
            return ncl_break(c, NCL_TIMEOUT);
        }
        if (round < 20) { /* let a peer that is about to arrive run on this core */
            sched_yield();
            continue;
        }
        double slice = deadline - now < 0.005 ? deadline - now : 0.005;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(slice * 1e9)};
        atomic_fetch_add(&f->waiters, 1);
        uint32_t v = atomic_load(&f->value);
        if (!ncl_reached(v, target))
            syscall(SYS_futex, &f->value, FUTEX_WAIT, v, &ts, NULL, 0);
        atomic_fetch_sub(&f->waiters, 1);
    }
}

ncl_status ncl_phase_barrier(ncl_comm *c, const char *what)
{
    uint32_t phase = ++c->phase;
    ncl_flag_set(&c->self->arrive, phase);
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank)
            continue;
        ncl_status st = ncl_flag_wait(c, &c->peers[r].region->arrive, phase, r, what);
        if (st != NCL_SUCCESS)
            return st;
    }
    return NCL_SUCCESS;
}

ncl_status ncl_piece_describe(const void *ptr, int64_t bytes, ncl_piece *out, const char *what)
{
    nrn_segment_info si;
    struct stat sb;
    memset(out, 0, sizeof *out);
    out->where = NCL_PIECE_SEGMENT;
    out->fd = -1;
    out->bytes = bytes;
    if (bytes == 0)
        return NCL_SUCCESS;
    if (ptr == NULL)
        return ncl_error(NCL_INVALID, "%s: NULL buffer for %lld bytes", what, (long long)bytes);
    if (nrn_mem_segment_of(ptr, &si) != NRN_SUCCESS)
        return ncl_error(NCL_INVALID, "%s: buffer %p is not neuron device memory", what, ptr);
    if (si.offset + (uint64_t)bytes > si.size)
        return ncl_error(NCL_INVALID, "%s: buffer %p + %lld bytes runs past its device segment", what, ptr,
                         (long long)bytes);
    if (fstat(si.fd, &sb) != 0)
        return ncl_error(NCL_FAILURE, "%s: fstat of a device segment: %s", what, strerror(errno));
    out->fd = si.fd;
    out->offset = si.offset;
    out->seg_size = si.size;
    out->ino = (uint64_t)sb.st_ino;
    return NCL_SUCCESS;
}

/* Maps peer r's segment (cached by inode; the least recently used mapping is dropped when full). */
ncl_status ncl_map_segment(ncl_comm *c, int r, const ncl_piece *p, char **base, const char *what)
{
    ncl_peer *peer = &c->peers[r];
    ncl_mapping *victim = &peer->maps[0];
    c->use_clock++;
    for (int i = 0; i < NCL_MAP_CACHE; i++) {
        ncl_mapping *m = &peer->maps[i];
        if (m->base != NULL && m->ino == p->ino && m->size == p->seg_size) {
            m->last_use = c->use_clock;
            *base = m->base;
            return NCL_SUCCESS;
        }
        if (m->base == NULL || (victim->base != NULL && m->last_use < victim->last_use))
            victim = m;
    }
    int f = ncl_open_peer_fd(peer->pid, p->fd, p->ino, p->seg_size);
    if (f < 0)
        return ncl_error(NCL_FAILURE, "%s: cannot open rank %d's device segment (pid %d, fd %d): %s", what, r,
                         peer->pid, p->fd, strerror(-f));
    void *m = mmap(NULL, p->seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    close(f);
    if (m == MAP_FAILED)
        return ncl_error(NCL_FAILURE, "%s: mmap of rank %d's device segment (%llu bytes): %s", what, r,
                         (unsigned long long)p->seg_size, strerror(errno));
    if (victim->base != NULL)
        munmap(victim->base, victim->size);
    victim->base = m;
    victim->ino = p->ino;
    victim->size = p->seg_size;
    victim->last_use = c->use_clock;
    *base = m;
    return NCL_SUCCESS;
}

ncl_status ncl_piece_ptr(ncl_comm *c, int r, uint64_t call, int idx, void **out, const char *what)
{
    if (r == c->rank) {
        *out = (void *)c->own_ptr[idx];
        return NCL_SUCCESS;
    }
    const ncl_piece *p = &ncl_header_of(c, r, call)->pieces[idx];
    if (p->bytes == 0) {
        *out = NULL;
        return NCL_SUCCESS;
    }
    if (p->where == NCL_PIECE_SLOT) {
        *out = ncl_slot(c, r, call) + p->offset;
        return NCL_SUCCESS;
    }
    char *base;
    ncl_status st = ncl_map_segment(c, r, p, &base, what);
    if (st != NCL_SUCCESS)
        return st;
    *out = base + p->offset;
    return NCL_SUCCESS;
}
