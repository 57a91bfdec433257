/* status.c - status strings, the per-thread last error, and logging. */
#include "runtime_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Per thread, so a failing call on one thread never clobbers the message another thread is reading. */
static _Thread_local char tl_last_error[NRN_ERRMSG_MAX];

const char *nrn_status_str(nrn_status s)
{
    switch (s) {
    case NRN_SUCCESS: return "NRN_SUCCESS";
    case NRN_FAILURE: return "NRN_FAILURE";
    case NRN_INVALID: return "NRN_INVALID";
    case NRN_INVALID_HANDLE: return "NRN_INVALID_HANDLE";
    case NRN_RESOURCE: return "NRN_RESOURCE";
    case NRN_TIMEOUT: return "NRN_TIMEOUT";
    case NRN_HW_ERROR: return "NRN_HW_ERROR";
    case NRN_QUEUE_FULL: return "NRN_QUEUE_FULL";
    case NRN_UNINITIALIZED: return "NRN_UNINITIALIZED";
    case NRN_CLOSED: return "NRN_CLOSED";
    case NRN_UNSUPPORTED: return "NRN_UNSUPPORTED";
    }
    return "NRN_UNKNOWN_STATUS";
}

const char *nrn_last_error(void)
{
    return tl_last_error;
}

nrn_status nrn_error_set(nrn_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_last_error, sizeof tl_last_error, fmt, ap);
    va_end(ap);
    nrn_log(NRN_LOG_TRACE, "%s: %s", nrn_status_str(st), tl_last_error);
    return st;
}

void nrn_format_bytes(uint64_t bytes, char *buf, size_t n)
{
    if (bytes < 1024)
        snprintf(buf, n, "%llu bytes", (unsigned long long)bytes);
    else if (bytes < (1ull << 20))
        snprintf(buf, n, "%.2f KiB", (double)bytes / 1024.0);
    else if (bytes < (1ull << 30))
        snprintf(buf, n, "%.2f MiB", (double)bytes / (1024.0 * 1024.0));
    else
        snprintf(buf, n, "%.2f GiB", (double)bytes / (1024.0 * 1024.0 * 1024.0));
}

/* ---- logging ---- */

static pthread_once_t g_log_once = PTHREAD_ONCE_INIT;
static _Atomic int g_log_level = NRN_LOG_WARN;
/* Set when nrn_log_level_set ran before the environment was read, so the explicit choice wins. */
static _Atomic bool g_log_level_explicit = false;

static const char *const g_level_names[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

static void nrn_log_env_read(void)
{
    const char *v = getenv("NEURON_RT_LOG_LEVEL");
    int level = -1;
    if (v == NULL || v[0] == '\0' || atomic_load(&g_log_level_explicit))
        return;
    if (strcasecmp(v, "WARNING") == 0)
        level = NRN_LOG_WARN;
    for (int i = 0; i <= NRN_LOG_TRACE && level < 0; i++)
        if (strcasecmp(v, g_level_names[i]) == 0)
            level = i;
    if (level < 0) {
        /* Logging must not make the runtime unusable, so a bad level only warns. */
        fprintf(stderr, "neuron-rt WARN: NEURON_RT_LOG_LEVEL='%s' is not one of ERROR, WARN, WARNING, INFO, "
                        "DEBUG, TRACE; using WARN\n", v);
        return;
    }
    atomic_store(&g_log_level, level);
}

nrn_log_level nrn_log_level_get(void)
{
    pthread_once(&g_log_once, nrn_log_env_read);
    return (nrn_log_level)atomic_load_explicit(&g_log_level, memory_order_relaxed);
}

void nrn_log_level_set(nrn_log_level level)
{
    if ((int)level < NRN_LOG_ERROR)
        level = NRN_LOG_ERROR;
    if (level > NRN_LOG_TRACE)
        level = NRN_LOG_TRACE;
    atomic_store(&g_log_level_explicit, true);
    pthread_once(&g_log_once, nrn_log_env_read);
    atomic_store(&g_log_level, (int)level);
}

void nrn_log(nrn_log_level level, const char *fmt, ...)
{
    char msg[NRN_ERRMSG_MAX + 64];
    va_list ap;
    if ((int)level < NRN_LOG_ERROR || level > nrn_log_level_get())
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* One fprintf call per line so lines from concurrent threads do not interleave. */
    fprintf(stderr, "neuron-rt %s: %s\n", g_level_names[level], msg);
}
