/*
 * neuron_collectives.h - collectives between the ranks (processes) of one host, over shared memory.
 * The only public header of csrc/collectives (C11, no C++/Python header).
 *
 * Model
 *   - One communicator per process group and process. Each rank owns a small memfd workspace (control
 *     words, send/recv rings, two staging slots) that its peers map through /proc/<pid>/fd/<fd>; no name
 *     is ever created in /dev/shm, so nothing is left behind, even after a crash.
 *   - Buffers passed to the collectives are device memory from nrn_mem_alloc (memfd-backed segments,
 *     see nrn_mem_segment_of). Large contributions are read (and for all_reduce/reduce written) by the
 *     peers directly in the owner's device memory: no staging copy. Small ones (at most
 *     NCL_STAGE_BYTES per rank) are copied once into the owner's staging slot so the call needs one
 *     synchronisation instead of two.
 *   - all_reduce/reduce of large messages: each rank reduces its 1/N slice of every rank's input and
 *     writes it to every rank's output (reduce-scatter and all-gather fused). Small messages: every rank
 *     reads all staged inputs and reduces the whole message itself (one shot). Large all_gather: each
 *     rank writes its input into every rank's output. Every input byte is thus read from memory once.
 *   - Reductions combine all sources chunk by chunk (every source read as one stream) and write each
 *     chunk straight to its destinations; large results and copies are written with non-temporal stores
 *     (no read-for-ownership of the destination lines).
 *   - Every call exchanges a header (operation, dtype, count, root, reduce op, and the caller's shape
 *     for messages) and fails with NCL_MISMATCH on every rank if the ranks disagree.
 *   - Waits spin briefly (not at all when the ranks outnumber the usable CPUs), then yield, then sleep on
 *     a futex in the peer's workspace. A peer that exited (pidfd), a peer that aborted, or the
 *     communicator's timeout end the wait with an error; after a timeout or a dead peer the communicator
 *     is broken and every later call fails at once.
 *   - Floating-point reductions accumulate in float (double for float64) in rank order, and round once,
 *     so every rank gets bit-identical results. Integer sums and products wrap like PyTorch's.
 *   - A communicator is used by one thread at a time.
 */
#ifndef NEURON_COLLECTIVES_H
#define NEURON_COLLECTIVES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ncl_status {
    NCL_SUCCESS = 0,
    NCL_FAILURE = 1,     /* an OS call failed */
    NCL_INVALID = 2,     /* bad argument (rank, count, non-device buffer, ...) */
    NCL_TIMEOUT = 5,     /* a peer did not arrive within the communicator's timeout */
    NCL_PEER_DEAD = 6,   /* a peer process exited or aborted */
    NCL_MISMATCH = 7,    /* ranks called different collectives or with different sizes */
    NCL_BROKEN = 8,      /* an earlier timeout or dead peer broke the communicator */
    NCL_UNSUPPORTED = 15 /* e.g. a reduce op the dtype has no meaning for */
} ncl_status;

/* Same numbering as the kernel library's nk_dtype. */
typedef enum ncl_dtype {
    NCL_BOOL = 0,
    NCL_U8,
    NCL_I8,
    NCL_I16,
    NCL_I32,
    NCL_I64,
    NCL_F16,
    NCL_BF16,
    NCL_F32,
    NCL_F64,
    NCL_U16,
    NCL_U32,
    NCL_U64,
    NCL_DTYPE_COUNT
} ncl_dtype;

typedef enum ncl_redop {
    NCL_SUM = 0,
    NCL_AVG,        /* sum / world size (truncating for integers) */
    NCL_PRODUCT,
    NCL_MIN,
    NCL_MAX,
    NCL_PREMUL_SUM, /* sum of factor_r * x_r, each rank passing its own factor */
    NCL_REDOP_COUNT
} ncl_redop;

/* Contributions of at most this many bytes per rank are staged through the workspace. */
#define NCL_STAGE_BYTES ((size_t)64 * 1024)
#define NCL_MAX_RANKS 256
/* Dimensions of a shape carried in the call header (larger shapes are reported by their first ones). */
#define NCL_SHAPE_DIMS 6

const char *ncl_status_str(ncl_status s);
/* Message of the calling thread's last failing call ("" if none). */
const char *ncl_last_error(void);
size_t ncl_dtype_size(ncl_dtype t);
const char *ncl_dtype_name(ncl_dtype t);
const char *ncl_redop_name(ncl_redop op);

typedef struct ncl_comm ncl_comm;

/* What a rank publishes (through any out-of-band channel, e.g. a c10d store) so peers can connect. */
typedef struct ncl_rank_info {
    int32_t pid;
    int32_t fd;          /* memfd of the rank's workspace */
    int32_t rank;
    int32_t size;
    uint64_t ws_bytes;
    uint64_t ws_ino;     /* inode of the workspace, checked by peers after opening it */
} ncl_rank_info;

/* Creates this rank's workspace. timeout_s bounds every wait (> 0). */
ncl_status ncl_comm_create(int rank, int size, double timeout_s, ncl_comm **out);
void ncl_comm_info(const ncl_comm *c, ncl_rank_info *out);
/* Maps every peer's workspace (infos[r] for r in [0, size)), then waits until all ranks connected. */
ncl_status ncl_comm_connect(ncl_comm *c, const ncl_rank_info *infos);
/* Unmaps everything and closes the workspace. Safe on a partly created or broken communicator. */
void ncl_comm_destroy(ncl_comm *c);
ncl_status ncl_comm_set_timeout(ncl_comm *c, double timeout_s);
int ncl_comm_rank(const ncl_comm *c);
int ncl_comm_size(const ncl_comm *c);
/* The tensor shape of the next collective on this communicator: it is exchanged with the call header
 * and named in mismatch errors (ranks may legitimately pass different shapes of the same count). */
void ncl_comm_set_shape(ncl_comm *c, int ndim, const int64_t *sizes);
/* This rank cannot take part in the next collective (its caller rejected the arguments): it passes the
 * call's start barrier, flagged, so the peers fail that call at once with NCL_INVALID naming the rank and
 * reason, instead of waiting for the timeout. Returns NCL_INVALID (or the error of the barrier). */
ncl_status ncl_call_reject(ncl_comm *c, const char *what, const char *reason);
/* Marks this rank as aborted so peers waiting for it fail at once with the given reason. */
void ncl_comm_abort(ncl_comm *c, const char *reason);

/* Counts are elements of dtype; per-rank arrays have size entries. A NULL buffer is allowed when its
 * count is 0. In-place use (send == recv, or all_gather/reduce_scatter where this rank's piece of the
 * big buffer is the small one) is allowed. factor is used by NCL_PREMUL_SUM only. */
ncl_status ncl_all_reduce(ncl_comm *c, const void *send, void *recv, int64_t count, ncl_dtype dt,
                          ncl_redop op, double factor);
/* recv is used on root only (NULL elsewhere). */
ncl_status ncl_reduce(ncl_comm *c, const void *send, void *recv, int64_t count, ncl_dtype dt, ncl_redop op,
                      double factor, int root);
ncl_status ncl_broadcast(ncl_comm *c, void *buf, int64_t count, ncl_dtype dt, int root);
/* recv[r] receives rank r's send (count elements each). */
ncl_status ncl_all_gather(ncl_comm *c, const void *send, void *const *recv, int64_t count, ncl_dtype dt);
/* recv = reduction over ranks of their send[this rank] (count elements each). */
ncl_status ncl_reduce_scatter(ncl_comm *c, const void *const *send, void *recv, int64_t count, ncl_dtype dt,
                              ncl_redop op, double factor);
/* send[r] (send_counts[r] elements) goes to rank r's recv[this rank]; the sizes must agree pairwise. */
ncl_status ncl_all_to_all(ncl_comm *c, const void *const *send, const int64_t *send_counts, void *const *recv,
                          const int64_t *recv_counts, ncl_dtype dt);
/* recv (array of size pointers) is used on root only. */
ncl_status ncl_gather(ncl_comm *c, const void *send, void *const *recv, int64_t count, ncl_dtype dt, int root);
/* send (array of size pointers) is used on root only. */
ncl_status ncl_scatter(ncl_comm *c, const void *const *send, void *recv, int64_t count, ncl_dtype dt, int root);
ncl_status ncl_barrier(ncl_comm *c);

/*
 * Point to point, FIFO per (sender, receiver) pair. ncl_send posts the buffer and returns at once with
 * a ticket; the receiver copies straight out of the sender's device memory, so the buffer must stay
 * unchanged until ncl_send_test reports it consumed (or ncl_send_wait returns). ncl_recv blocks until
 * the next message from peer arrives; its tag and byte count must equal the receive's.
 */
ncl_status ncl_send(ncl_comm *c, const void *buf, int64_t bytes, int peer, int64_t tag, uint64_t *ticket);
ncl_status ncl_send_test(ncl_comm *c, int peer, uint64_t ticket, bool *done);
ncl_status ncl_send_wait(ncl_comm *c, int peer, uint64_t ticket);
ncl_status ncl_recv(ncl_comm *c, void *buf, int64_t bytes, int peer, int64_t tag);

/* Reduction kernel used by the collectives (exposed for tests): dst = op over src[0..nsrc) with
 * per-source factors (PREMUL_SUM only; may be NULL = 1) and avg_div as the AVG divisor. */
ncl_status ncl_reduce_local(void *dst, const void *const *src, const double *factors, int nsrc, int64_t n,
                            ncl_dtype dt, ncl_redop op, int avg_div);

#ifdef __cplusplus
}
#endif
#endif /* NEURON_COLLECTIVES_H */
