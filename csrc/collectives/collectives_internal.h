/* collectives_internal.h - workspace layout and helpers shared by the files of csrc/collectives. */
#ifndef NEURON_COLLECTIVES_INTERNAL_H
#define NEURON_COLLECTIVES_INTERNAL_H

#include "neuron_collectives.h"

#include <stdatomic.h>

#define NCL_MAGIC UINT64_C(0x4e434c5753303031) /* "NCLWS001" */
#define NCL_RING 64                            /* messages in flight per (sender, receiver) pair */
#define NCL_MAP_CACHE 64                       /* mapped peer segments kept per peer */

/* A counter peers wait on. waiters lets the writer skip the futex wake when nobody sleeps. */
typedef struct ncl_flag {
    _Atomic uint32_t value;
    _Atomic uint32_t waiters;
    char pad[56];
} ncl_flag;

/* Where a contribution lives: staged in the owner's slot, or in a device memory segment. */
enum { NCL_PIECE_SLOT = 0, NCL_PIECE_SEGMENT = 1 };
typedef struct ncl_piece {
    int64_t bytes;
    uint64_t offset;   /* in the slot, or in the segment */
    uint64_t ino;      /* segment identity */
    uint64_t seg_size;
    int32_t fd;        /* the owner's fd of the segment */
    int32_t where;
} ncl_piece;

/* Per-call header, double-buffered by call parity: a peer may still read call k's header while this
 * rank writes call k+1's (call k+2 starts only after everyone finished call k). */
typedef struct ncl_header {
    uint64_t call;       /* call number, equal on every rank */
    int32_t op;          /* ncl_op */
    int32_t dtype;
    int32_t redop;
    int32_t root;
    int64_t count;
    double factor;
    int32_t npieces;
    int32_t zero_copy;   /* 1 if some piece is in device memory: an end barrier follows */
    int32_t ndim;        /* the caller's tensor shape, for error messages only (-1: not given) */
    int64_t shape[NCL_SHAPE_DIMS];
    char reject_reason[160]; /* npieces < 0: why this rank could not take part */
    ncl_piece pieces[];  /* 2 * size + 1 entries */
} ncl_header;

/* One point-to-point message descriptor. */
typedef struct ncl_msg {
    int64_t tag;
    ncl_piece piece;
} ncl_msg;

/* The start of every rank's workspace. The rest is laid out by ncl_layout. */
typedef struct ncl_region {
    uint64_t magic;
    int32_t rank, size, pid;
    _Atomic uint32_t aborted;
    char abort_reason[256];
    ncl_flag arrive; /* barrier phase reached by this rank */
} ncl_region;

typedef struct ncl_layout {
    size_t header_bytes;  /* one header with its pieces */
    size_t off_header[2];
    size_t off_posted;    /* ncl_flag[size]: messages this rank posted to each receiver */
    size_t off_consumed;  /* ncl_flag[size]: messages this rank consumed from each sender */
    size_t off_ring;      /* ncl_msg[size][NCL_RING]: outgoing messages per receiver */
    size_t off_slot[2];
    size_t total;
} ncl_layout;

typedef struct ncl_mapping {
    uint64_t ino, size, last_use;
    void *base;
} ncl_mapping;

typedef struct ncl_peer {
    ncl_region *region;   /* mapped workspace (this rank's own one for itself) */
    int pidfd;
    int32_t pid;
    ncl_mapping maps[NCL_MAP_CACHE];
} ncl_peer;

typedef enum ncl_op {
    NCL_OP_BARRIER = 1,
    NCL_OP_ALL_REDUCE,
    NCL_OP_REDUCE,
    NCL_OP_BROADCAST,
    NCL_OP_ALL_GATHER,
    NCL_OP_REDUCE_SCATTER,
    NCL_OP_ALL_TO_ALL,
    NCL_OP_GATHER,
    NCL_OP_SCATTER,
    NCL_OP_CONNECT,
} ncl_op;

struct ncl_comm {
    int rank, size;
    double timeout_s;
    double spin_s;        /* how long a wait spins before yielding the core */
    int ws_fd;
    ncl_layout layout;
    ncl_region *self;     /* this rank's workspace */
    ncl_peer *peers;      /* [size] */
    uint32_t phase;       /* barriers passed */
    uint64_t calls;       /* collectives started */
    uint64_t use_clock;   /* LRU clock of the mapping cache */
    uint64_t sent[NCL_MAX_RANKS], received[NCL_MAX_RANKS];
    ncl_status broken;    /* non-zero after a timeout or dead peer */
    char broken_msg[768];
    const void *own_ptr[2 * NCL_MAX_RANKS + 1]; /* this call's pieces, as local pointers */
    int32_t next_ndim;    /* shape announced by ncl_comm_set_shape for the next call (-1: none) */
    int64_t next_shape[NCL_SHAPE_DIMS];
};

ncl_status ncl_error(ncl_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncl_status ncl_reduce_check(ncl_dtype dt, ncl_redop op, const char *what);

static inline char *ncl_ws(const ncl_comm *c, int r) { return (char *)c->peers[r].region; }
static inline ncl_header *ncl_header_of(const ncl_comm *c, int r, uint64_t call)
{
    return (ncl_header *)(ncl_ws(c, r) + c->layout.off_header[call & 1]);
}
static inline ncl_flag *ncl_posted(const ncl_comm *c, int owner, int to)
{
    return (ncl_flag *)(ncl_ws(c, owner) + c->layout.off_posted) + to;
}
static inline ncl_flag *ncl_consumed(const ncl_comm *c, int owner, int from)
{
    return (ncl_flag *)(ncl_ws(c, owner) + c->layout.off_consumed) + from;
}
static inline ncl_msg *ncl_ring(const ncl_comm *c, int owner, int to)
{
    return (ncl_msg *)(ncl_ws(c, owner) + c->layout.off_ring) + (size_t)to * NCL_RING;
}
static inline char *ncl_slot(const ncl_comm *c, int r, uint64_t call)
{
    return ncl_ws(c, r) + c->layout.off_slot[call & 1];
}

/* Stores value and wakes sleepers. */
void ncl_flag_set(ncl_flag *f, uint32_t value);
/* Waits until f (in peer's workspace) reaches target (wrapping compare). */
ncl_status ncl_flag_wait(ncl_comm *c, ncl_flag *f, uint32_t target, int peer, const char *what);
/* All ranks reach the next phase. */
ncl_status ncl_phase_barrier(ncl_comm *c, const char *what);
/* Describes a device buffer (bytes may be 0 with a NULL ptr). */
ncl_status ncl_piece_describe(const void *ptr, int64_t bytes, ncl_piece *out, const char *what);
/* Local address of piece idx of rank r's header for call (maps the peer's segment if needed; this rank's
 * own pieces come from own_ptr). */
ncl_status ncl_piece_ptr(ncl_comm *c, int r, uint64_t call, int idx, void **out, const char *what);
/* Maps peer r's device segment described by p (cached); *base is the segment start. */
ncl_status ncl_map_segment(ncl_comm *c, int r, const ncl_piece *p, char **base, const char *what);
ncl_status ncl_check_usable(ncl_comm *c, const char *what);
/* ncl_reduce_local's result written to every one of dsts (none overlapping a source except exactly, in
 * place), with fenced non-temporal stores when stream is set. */
ncl_status ncl_reduce_to(char *const *dsts, int ndst, bool stream, const void *const *src, const double *factors,
                         int nsrc, int64_t n, ncl_dtype dt, ncl_redop op, int avg_div);

#endif
