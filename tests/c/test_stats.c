/* test_stats.c - the per-process statistics segment (neuron_stats.h): contents, refresh, removal at
 * exit, the off switch and the removal of segments left by dead processes. */
#include "nk_test.h"
#include "neuron_runtime.h"
#include "neuron_stats.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_dir[] = "/tmp/neuron-stats-test-XXXXXX";

static uint64_t g_native;
static uint64_t native_source(void)
{
    return __atomic_load_n(&g_native, __ATOMIC_RELAXED);
}

static bool read_segment(const char *path, nrn_stats_segment *out)
{
    for (int tries = 0; tries < 100; tries++) {
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            return false;
        ssize_t n = read(fd, out, sizeof *out);
        close(fd);
        if (n == (ssize_t)sizeof *out && out->magic == NRN_STATS_MAGIC && out->seq % 2 == 0)
            return true;
    }
    return false;
}

static bool exists(const char *path)
{
    return access(path, F_OK) == 0;
}

static void seg_path(pid_t pid, char *buf, size_t n)
{
    snprintf(buf, n, "%s/neuron-stats-%d", g_dir, (int)pid);
}

static void test_contents(void)
{
    char path[512];
    nrn_stats_segment s;
    void *p = NULL;
    CHECK(nrn_init() == NRN_SUCCESS);
    seg_path(getpid(), path, sizeof path);
    CHECK(strcmp(nrn_stats_path(), path) == 0);
    CHECK(read_segment(path, &s));
    CHECK(s.version == NRN_STATS_VERSION && s.size == sizeof s && s.pid == getpid());
    CHECK(s.start_ticks != 0);
    CHECK(strstr(s.cmdline, "test_stats") != NULL);

    CHECK(nrn_mem_alloc(1, 3 << 20, &p) == NRN_SUCCESS);
    nrn_stats_publish_now();
    CHECK(read_segment(path, &s));
    CHECK(s.cores[1].allocated >= (3u << 20) && s.cores[0].allocated == 0);
    /* Native calls go where the memory is when no fallback ran in the interval... */
    __atomic_store_n(&g_native, 4, __ATOMIC_RELAXED);
    nrn_stats_publish_now();
    CHECK(read_segment(path, &s));
    CHECK(s.native_ops == 4 && s.cores[1].native_ops == 4 && s.cores[0].native_ops == 0);
    /* ...else where the fallback ops ran. */
    __atomic_store_n(&g_native, 10, __ATOMIC_RELAXED);
    for (int i = 0; i < 3; i++)
        CHECK(nrn_stream_submit(0, NRN_STREAM_DEFAULT) == NRN_SUCCESS);
    nrn_stats_publish_now();
    CHECK(read_segment(path, &s));
    int count = 0;
    nrn_device_count(&count);
    CHECK(s.core_count == count && count == 2);
    CHECK(s.nc_config == 2);
    CHECK(s.cores[1].physical_index == 2 && s.cores[0].physical_index == 1);
    CHECK(s.cores[1].reserved >= s.cores[1].allocated);
    CHECK(s.cores[1].capacity == (64u << 20));
    CHECK(s.cores[0].allocated == 0);
    CHECK(s.native_ops == 10 && s.fallback_ops == 3);
    CHECK(s.cores[0].native_ops == 6 && s.cores[0].fallback_ops == 3);
    CHECK(s.cores[1].native_ops == 4 && s.cores[1].fallback_ops == 0);

    CHECK(nrn_mem_free(p) == NRN_SUCCESS);
}

/* The refresher thread picks up changes by itself (in a child with a 20 ms interval; the parent's is long
 * so that the attribution checks above do not race with it). */
static void test_refresh(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        /* A forked child may not allocate device memory: the native-call source shows the refresh. */
        char mine[512];
        nrn_stats_segment s;
        int rc = 0;
        setenv("NEURON_RT_STATS_INTERVAL_MS", "20", 1);
        nrn_close();
        if (nrn_init() != NRN_SUCCESS)
            _exit(2);
        seg_path(getpid(), mine, sizeof mine);
        __atomic_store_n(&g_native, 7, __ATOMIC_RELAXED);
        struct timespec ts = {0, 150 * 1000000L};
        nanosleep(&ts, NULL);
        if (!read_segment(mine, &s) || s.update_unix_ns == 0 || s.native_ops != 7 || s.core_count != 2)
            rc = 3;
        uint64_t before = s.update_unix_ns;
        __atomic_store_n(&g_native, 9, __ATOMIC_RELAXED);
        nanosleep(&ts, NULL);
        if (rc == 0 && !(read_segment(mine, &s) && s.update_unix_ns > before && s.native_ops == 9))
            rc = 4;
        nrn_stats_stop(); /* _exit skips atexit */
        _exit(rc);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (WEXITSTATUS(status) != 0)
        fprintf(stderr, "test_refresh: child status %d\n", WEXITSTATUS(status));
}

/* A process that exits normally removes its segment; a fork does not remove its parent's. */
static void test_exit_removes(void)
{
    char parent_path[512], child_path[512];
    seg_path(getpid(), parent_path, sizeof parent_path);
    pid_t pid = fork();
    if (pid == 0) {
        /* A fresh runtime in the child publishes its own segment; exit() runs the atexit removal. */
        nrn_close();
        if (nrn_init() != NRN_SUCCESS)
            _exit(2);
        char mine[512];
        seg_path(getpid(), mine, sizeof mine);
        exit(exists(mine) && strcmp(nrn_stats_path(), mine) == 0 ? 0 : 3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    seg_path(pid, child_path, sizeof child_path);
    CHECK(!exists(child_path));
    CHECK(exists(parent_path));
}

static void test_off_switch(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        setenv("NEURON_RT_STATS", "0", 1);
        nrn_close();
        if (nrn_init() != NRN_SUCCESS)
            _exit(2);
        char mine[512];
        seg_path(getpid(), mine, sizeof mine);
        _exit(!exists(mine) && nrn_stats_path()[0] == '\0' ? 0 : 3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void write_fake(pid_t pid, uint64_t start_ticks)
{
    char path[512];
    nrn_stats_segment s;
    memset(&s, 0, sizeof s);
    s.magic = NRN_STATS_MAGIC;
    s.version = NRN_STATS_VERSION;
    s.size = sizeof s;
    s.pid = pid;
    s.start_ticks = start_ticks;
    seg_path(pid, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0 && write(fd, &s, sizeof s) == (ssize_t)sizeof s);
    close(fd);
}

/* Segments of killed processes (SIGKILL: no atexit) and of reused pids are removed; live ones stay. */
static void test_stale_cleanup(void)
{
    char path[512];
    pid_t pid = fork();
    if (pid == 0) {
        nrn_close();
        if (nrn_init() != NRN_SUCCESS)
            _exit(2);
        pause();
        _exit(0);
    }
    seg_path(pid, path, sizeof path);
    for (int i = 0; i < 200 && !exists(path); i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    CHECK(exists(path));
    CHECK(nrn_stats_cleanup_stale(g_dir) == 0); /* alive */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    CHECK(exists(path));                        /* killed: nothing ran */
    write_fake(getppid(), 1);                   /* a live pid that started at another time */
    CHECK(nrn_stats_cleanup_stale(g_dir) == 2);
    CHECK(!exists(path));
    seg_path(getppid(), path, sizeof path);
    CHECK(!exists(path));
    seg_path(getpid(), path, sizeof path);
    CHECK(exists(path));                        /* ours stays */
}

int main(void)
{
    if (mkdtemp(g_dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    setenv("NEURON_RT_STATS_DIR", g_dir, 1);
    setenv("NEURON_RT_STATS_INTERVAL_MS", "100000", 1);
    setenv("NEURON_RT_VISIBLE_CORES", "1-2", 1);
    setenv("NEURON_RT_MEMORY_PER_CORE", "64M", 1);
    unsetenv("NEURON_RT_STATS");
    nrn_stats_set_native_source(native_source);
    test_contents();
    test_refresh();
    test_exit_removes();
    test_off_switch();
    test_stale_cleanup();
    nrn_close();
    nrn_stats_stop();
    char path[512];
    seg_path(getpid(), path, sizeof path);
    CHECK(!exists(path));
    rmdir(g_dir);
    printf("test_stats: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
