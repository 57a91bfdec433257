/* test_collectives.c - unit tests of csrc/collectives: NRANKS forked processes run every collective
 * (staged and zero-copy sizes) and check the results against values each rank computes itself. */
#include "neuron_collectives.h"
#include "neuron_runtime.h"

#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NRANKS 3

static int g_checks, g_failures, g_rank = -1;

#define CHECK(cond)                                                                                     \
    do {                                                                                                \
        g_checks++;                                                                                     \
        if (!(cond)) {                                                                                  \
            g_failures++;                                                                               \
            fprintf(stderr, "[rank %d] %s:%d: CHECK(%s) failed\n", g_rank, __FILE__, __LINE__, #cond);  \
        }                                                                                               \
    } while (0)

#define CHECK_ST(expr, want)                                                                            \
    do {                                                                                                \
        ncl_status st_ = (expr);                                                                        \
        g_checks++;                                                                                     \
        if (st_ != (want)) {                                                                            \
            g_failures++;                                                                               \
            fprintf(stderr, "[rank %d] %s:%d: %s returned %s, expected %s (%s)\n", g_rank, __FILE__,    \
                    __LINE__, #expr, ncl_status_str(st_), ncl_status_str(want), ncl_last_error());      \
        }                                                                                               \
    } while (0)
#define CHECK_OK(expr) CHECK_ST(expr, NCL_SUCCESS)

typedef struct shared {
    _Atomic int published;
    ncl_rank_info infos[NRANKS];
} shared;

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    if (nrn_mem_alloc(0, bytes, &p) != NRN_SUCCESS) {
        fprintf(stderr, "nrn_mem_alloc failed: %s\n", nrn_last_error());
        exit(99);
    }
    return p;
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
/* Exact for the small integers the tests use. */
static uint16_t to_f16(float f)
{
    if (f == 0)
        return 0;
    int v = (int)fabsf(f), e = 0;
    while (v >> (e + 1))
        e++;
    return (uint16_t)((f < 0 ? 0x8000 : 0) | ((e + 15) << 10) | (((v << 10) >> e) & 0x3FF));
}
static float from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Value of element i on rank r: small integers, so float sums are exact. */
static float val(int r, int64_t i) { return (float)((r + 1) * (int)(i % 13) - 5); }

static void test_all_reduce(ncl_comm *c, int64_t n, bool in_place)
{
    int me = g_rank;
    float *a = dev_alloc((size_t)n * 4), *b = in_place ? a : dev_alloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++)
        a[i] = val(me, i);
    CHECK_OK(ncl_all_reduce(c, a, b, n, NCL_F32, NCL_SUM, 0));
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < NRANKS; r++)
            want += val(r, i);
        bad += b[i] != want;
    }
    CHECK(bad == 0);
    /* MAX, then AVG and PREMUL_SUM (each rank its own factor). */
    for (int64_t i = 0; i < n; i++)
        a[i] = val(me, i);
    CHECK_OK(ncl_all_reduce(c, a, b, n, NCL_F32, NCL_MAX, 0));
    bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float want = val(0, i);
        for (int r = 1; r < NRANKS; r++)
            want = fmaxf(want, val(r, i));
        bad += b[i] != want;
    }
    CHECK(bad == 0);
    for (int64_t i = 0; i < n; i++)
        a[i] = val(me, i);
    CHECK_OK(ncl_all_reduce(c, a, b, n, NCL_F32, NCL_PREMUL_SUM, 0.5 * (me + 1)));
    bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float want = 0.5f * val(0, i);
        for (int r = 1; r < NRANKS; r++)
            want += 0.5f * (float)(r + 1) * val(r, i);
        bad += fabsf(b[i] - want) > 1e-5f * (1 + fabsf(want));
    }
    CHECK(bad == 0);
    nrn_mem_free(a);
    if (!in_place)
        nrn_mem_free(b);

    /* bfloat16 AVG: reduced in float, rounded once. */
    uint16_t *h = dev_alloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        h[i] = to_bf16(val(me, i) * 0.37f);
    CHECK_OK(ncl_all_reduce(c, h, h, n, NCL_BF16, NCL_AVG, 0));
    bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float acc = 0;
        for (int r = 0; r < NRANKS; r++)
            acc += from_bf16(to_bf16(val(r, i) * 0.37f));
        bad += h[i] != to_bf16(acc / NRANKS);
    }
    CHECK(bad == 0);
    nrn_mem_free(h);

    /* int64 PRODUCT and int32 MIN. */
    int64_t *q = dev_alloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++)
        q[i] = (int64_t)(i % 5) - 2 + me;
    CHECK_OK(ncl_all_reduce(c, q, q, n, NCL_I64, NCL_PRODUCT, 0));
    bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t want = 1;
        for (int r = 0; r < NRANKS; r++)
            want *= (int64_t)(i % 5) - 2 + r;
        bad += q[i] != want;
    }
    CHECK(bad == 0);
    nrn_mem_free(q);
}

/* float16 SUM into an output 2 bytes off its 16-byte alignment (no non-temporal stores there) and from
 * an input at an odd element offset: every chunk, the tail included, lands where it belongs. */
static void test_all_reduce_offset(ncl_comm *c, int64_t n)
{
    int me = g_rank;
    uint16_t *a = dev_alloc((size_t)(n + 3) * 2), *b = dev_alloc((size_t)(n + 2) * 2);
    for (int64_t i = 0; i < n + 2; i++)
        b[i] = 0x7777;
    for (int64_t i = 0; i < n; i++)
        a[3 + i] = to_f16(val(me, i));
    CHECK_OK(ncl_all_reduce(c, a + 3, b + 1, n, NCL_F16, NCL_SUM, 0));
    int bad = b[0] != 0x7777 || b[n + 1] != 0x7777;
    for (int64_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < NRANKS; r++)
            want += val(r, i);
        bad += b[1 + i] != to_f16(want);
    }
    CHECK(bad == 0);
    nrn_mem_free(a);
    nrn_mem_free(b);
}

static void test_rooted(ncl_comm *c, int64_t n)
{
    int me = g_rank, root = 1 % NRANKS;
    float *a = dev_alloc((size_t)n * 4), *b = dev_alloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        a[i] = val(me, i);
        b[i] = -1;
    }
    CHECK_OK(ncl_reduce(c, a, me == root ? b : NULL, n, NCL_F32, NCL_SUM, 0, root));
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < NRANKS; r++)
            want += val(r, i);
        bad += me == root ? b[i] != want : b[i] != -1;
    }
    CHECK(bad == 0);
    for (int64_t i = 0; i < n; i++)
        a[i] = val(me, i);
    CHECK_OK(ncl_broadcast(c, a, n, NCL_F32, NRANKS - 1));
    bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += a[i] != val(NRANKS - 1, i);
    CHECK(bad == 0);
    nrn_mem_free(a);
    nrn_mem_free(b);
}

static void test_gather_scatter(ncl_comm *c, int64_t n)
{
    int me = g_rank, root = 0;
    int32_t *big = dev_alloc((size_t)n * NRANKS * 4), *mine = big + (size_t)me * n;
    void *parts[NRANKS];
    for (int r = 0; r < NRANKS; r++)
        parts[r] = big + (size_t)r * n;
    for (int64_t i = 0; i < n * NRANKS; i++)
        big[i] = -7;
    for (int64_t i = 0; i < n; i++)
        mine[i] = me * 1000 + (int32_t)i;
    /* In place: this rank's piece of the output is its input. */
    CHECK_OK(ncl_all_gather(c, mine, parts, n, NCL_I32));
    int bad = 0;
    for (int r = 0; r < NRANKS; r++)
        for (int64_t i = 0; i < n; i++)
            bad += big[(size_t)r * n + i] != r * 1000 + (int32_t)i;
    CHECK(bad == 0);

    /* reduce_scatter: piece r of rank q holds q + r + i; rank me gets the sum over q of q + me + i. */
    int32_t *out = dev_alloc((size_t)n * 4);
    for (int r = 0; r < NRANKS; r++)
        for (int64_t i = 0; i < n; i++)
            big[(size_t)r * n + i] = me + r + (int32_t)(i % 100);
    CHECK_OK(ncl_reduce_scatter(c, (const void *const *)parts, out, n, NCL_I32, NCL_SUM, 0));
    bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t want = 0;
        for (int q = 0; q < NRANKS; q++)
            want += q + me + (int32_t)(i % 100);
        bad += out[i] != want;
    }
    CHECK(bad == 0);

    /* gather to root, scatter from root. */
    for (int64_t i = 0; i < n; i++)
        out[i] = me * 7 + (int32_t)i;
    CHECK_OK(ncl_gather(c, out, me == root ? parts : NULL, n, NCL_I32, root));
    if (me == root) {
        bad = 0;
        for (int r = 0; r < NRANKS; r++)
            for (int64_t i = 0; i < n; i++)
                bad += big[(size_t)r * n + i] != r * 7 + (int32_t)i;
        CHECK(bad == 0);
        for (int r = 0; r < NRANKS; r++)
            for (int64_t i = 0; i < n; i++)
                big[(size_t)r * n + i] = r * 3 - (int32_t)i;
    }
    CHECK_OK(ncl_scatter(c, me == root ? (const void *const *)parts : NULL, out, n, NCL_I32, root));
    bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += out[i] != me * 3 - (int32_t)i;
    CHECK(bad == 0);
    nrn_mem_free(big);
    nrn_mem_free(out);
}

static void test_all_to_all(ncl_comm *c, int64_t unit)
{
    /* Rank q sends (q + r + 1) * unit elements to rank r, valued q * 100000 + r * 1000 + i. */
    int me = g_rank;
    int64_t sc[NRANKS], rc[NRANKS];
    void *sp[NRANKS], *rp[NRANKS];
    for (int r = 0; r < NRANKS; r++) {
        sc[r] = (me + r + 1) * unit;
        rc[r] = (r + me + 1) * unit;
        int32_t *s = dev_alloc((size_t)sc[r] * 4);
        for (int64_t i = 0; i < sc[r]; i++)
            s[i] = me * 100000 + r * 1000 + (int32_t)(i % 1000);
        sp[r] = s;
        rp[r] = dev_alloc((size_t)rc[r] * 4);
    }
    CHECK_OK(ncl_all_to_all(c, (const void *const *)sp, sc, rp, rc, NCL_I32));
    int bad = 0;
    for (int r = 0; r < NRANKS; r++)
        for (int64_t i = 0; i < rc[r]; i++)
            bad += ((int32_t *)rp[r])[i] != r * 100000 + me * 1000 + (int32_t)(i % 1000);
    CHECK(bad == 0);
    /* Rank 0 expects one element less from rank 1: every rank fails with a mismatch. */
    if (me == 0)
        rc[1] -= 1;
    CHECK_ST(ncl_all_to_all(c, (const void *const *)sp, sc, rp, rc, NCL_I32), NCL_MISMATCH);
    CHECK(strstr(ncl_last_error(), "expects") != NULL);
    for (int r = 0; r < NRANKS; r++) {
        nrn_mem_free(sp[r]);
        nrn_mem_free(rp[r]);
    }
}

static void test_p2p(ncl_comm *c, int64_t n)
{
    /* A ring: everyone posts to the next rank first, then receives from the previous one. */
    int me = g_rank, next = (me + 1) % NRANKS, prev = (me + NRANKS - 1) % NRANKS;
    int64_t *s = dev_alloc((size_t)n * 8), *r = dev_alloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++)
        s[i] = me * 1000000 + i;
    uint64_t t;
    CHECK_OK(ncl_send(c, s, n * 8, next, 5, &t));
    CHECK_OK(ncl_recv(c, r, n * 8, prev, 5));
    CHECK_OK(ncl_send_wait(c, next, t));
    bool done = false;
    CHECK_OK(ncl_send_test(c, next, t, &done));
    CHECK(done);
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += r[i] != prev * 1000000 + i;
    CHECK(bad == 0);
    /* Size mismatch: the receiver reports it, the sender is released. */
    CHECK_OK(ncl_send(c, s, 16, next, 9, &t));
    CHECK_ST(ncl_recv(c, r, 8, prev, 9), NCL_MISMATCH);
    CHECK_OK(ncl_send_wait(c, next, t));
    nrn_mem_free(s);
    nrn_mem_free(r);
}

static int run_rank(int rank, shared *sh)
{
    g_rank = rank;
    ncl_comm *c = NULL;
    CHECK_OK(ncl_comm_create(rank, NRANKS, 20.0, &c));
    if (c == NULL)
        return 1;
    ncl_comm_info(c, &sh->infos[rank]);
    atomic_fetch_add(&sh->published, 1);
    while (atomic_load(&sh->published) < NRANKS)
        usleep(100);
    CHECK_OK(ncl_comm_connect(c, sh->infos));

    /* Staged, zero-copy, and zero-copy with slices of at least 1 MiB (streamed out). */
    int64_t sizes[] = {1, 37, 5000, 300001, 1000003};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        test_all_reduce(c, sizes[s], true);
        test_all_reduce(c, sizes[s], false);
        test_rooted(c, sizes[s]);
        test_gather_scatter(c, sizes[s]);
        test_p2p(c, sizes[s]);
        test_all_reduce_offset(c, sizes[s]);
    }
    test_all_to_all(c, 3);
    test_all_to_all(c, 20000);
    test_all_reduce(c, 0, false);
    CHECK_OK(ncl_barrier(c));

    /* Mismatched counts: every rank gets NCL_MISMATCH naming both calls; the communicator stays usable. */
    float *a = dev_alloc(400000 * 4);
    int64_t shape[8] = {rank == 1 ? 10 : 1000, 100, 1, 1, 1, 1, 1, 10};
    ncl_comm_set_shape(c, 2, shape);
    CHECK_ST(ncl_all_reduce(c, a, a, rank == 1 ? 1000 : 100000, NCL_F32, NCL_SUM, 0), NCL_MISMATCH);
    CHECK(strstr(ncl_last_error(), "count=1000, shape=[10, 100]") != NULL);
    /* Shapes longer than the header holds are named by their first dimensions. */
    ncl_comm_set_shape(c, 8, shape + 2);
    CHECK_ST(ncl_broadcast(c, a, 10, rank == 0 ? NCL_F32 : NCL_I32, 0), NCL_MISMATCH);
    CHECK(strstr(ncl_last_error(), "shape=[1, 1, 1, 1, 1, 10, ...]") != NULL);
    /* A shape is announced for one call only. */
    CHECK_OK(ncl_barrier(c));
    CHECK_ST(ncl_broadcast(c, a, 10, rank == 0 ? NCL_F32 : NCL_I32, 0), NCL_MISMATCH);
    CHECK(strstr(ncl_last_error(), "shape=") == NULL);
    /* A host buffer is rejected on that rank; the others learn it at once. */
    float host[4];
    CHECK_ST(ncl_all_reduce(c, rank == 2 ? host : a, a, 100000, NCL_F32, NCL_SUM, 0),
             rank == 2 ? NCL_INVALID : NCL_INVALID);
    CHECK(strstr(ncl_last_error(), "not neuron device memory") != NULL);
    CHECK_OK(ncl_barrier(c));
    /* A rank whose caller rejected its arguments before the collective: the others fail that call at once. */
    if (rank == 1)
        CHECK_ST(ncl_call_reject(c, "all_gather", "output too small"), NCL_INVALID);
    else
        CHECK_ST(ncl_all_reduce(c, a, a, 100000, NCL_F32, NCL_SUM, 0), NCL_INVALID);
    CHECK(strstr(ncl_last_error(), "output too small") != NULL);
    CHECK_OK(ncl_barrier(c));

    /* The last rank exits in the middle: the others fail quickly, without waiting for the timeout. */
    if (rank == NRANKS - 1) {
        nrn_mem_free(a);
        _exit(g_failures ? 1 : 0);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_ST(ncl_all_reduce(c, a, a, 100000, NCL_F32, NCL_SUM, 0), NCL_PEER_DEAD);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK((t1.tv_sec - t0.tv_sec) < 5);
    CHECK(strstr(ncl_last_error(), "rank") != NULL);
    CHECK_ST(ncl_barrier(c), NCL_BROKEN);
    ncl_comm_destroy(c);
    nrn_mem_free(a);
    printf("[rank %d] %d checks, %d failed\n", rank, g_checks, g_failures);
    fflush(stdout);
    return g_failures ? 1 : 0;
}

static void test_reduce_local(void)
{
    /* Integer wrap, NaN propagation, bool as logical or/and. */
    int8_t a[3] = {100, -128, 5}, b[3] = {100, -1, -7}, d[3];
    const void *s[2] = {a, b};
    CHECK_OK(ncl_reduce_local(d, s, NULL, 2, 3, NCL_I8, NCL_SUM, 2));
    CHECK(d[0] == (int8_t)200 && d[1] == 127 && d[2] == -2);
    CHECK_OK(ncl_reduce_local(d, s, NULL, 2, 3, NCL_I8, NCL_AVG, 2));
    CHECK(d[0] == 100 && d[1] == -64 && d[2] == -1);
    float f1[2] = {NAN, 1}, f2[2] = {2, NAN}, fd[2];
    const void *fs[2] = {f1, f2};
    CHECK_OK(ncl_reduce_local(fd, fs, NULL, 2, 2, NCL_F32, NCL_MAX, 2));
    CHECK(isnan(fd[0]) && isnan(fd[1]));
    uint8_t b1[2] = {1, 0}, b2[2] = {1, 0}, bd[2];
    const void *bs[2] = {b1, b2};
    CHECK_OK(ncl_reduce_local(bd, bs, NULL, 2, 2, NCL_BOOL, NCL_SUM, 2));
    CHECK(bd[0] == 1 && bd[1] == 0);
    CHECK_ST(ncl_reduce_local(bd, bs, NULL, 2, 2, NCL_BOOL, NCL_AVG, 2), NCL_UNSUPPORTED);
    CHECK_ST(ncl_reduce_local(d, s, NULL, 2, 3, NCL_I8, NCL_PREMUL_SUM, 2), NCL_UNSUPPORTED);
    uint64_t u1 = UINT64_MAX, u2 = 1, ud;
    const void *us[2] = {&u1, &u2};
    CHECK_OK(ncl_reduce_local(&ud, us, NULL, 2, 1, NCL_U64, NCL_MAX, 2));
    CHECK(ud == UINT64_MAX);
    ncl_comm *c = NULL;
    CHECK_ST(ncl_comm_create(3, 2, 1.0, &c), NCL_INVALID);
    CHECK_ST(ncl_comm_create(0, 2, 0.0, &c), NCL_INVALID);
}

int main(void)
{
    test_reduce_local();
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return 2;
    memset(sh, 0, sizeof *sh);
    pid_t pids[NRANKS];
    for (int r = 0; r < NRANKS; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm(120); /* a hang fails the test instead of blocking ctest */
            _exit(run_rank(r, sh));
        }
    }
    int failed = 0;
    for (int r = 0; r < NRANKS; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "rank %d failed (status 0x%x)\n", r, status);
            failed++;
        }
    }
    printf("test_collectives: %d local checks, %d failed; %d of %d ranks failed\n", g_checks, g_failures, failed,
           NRANKS);
    return (g_failures || failed) ? 1 : 0;
}
