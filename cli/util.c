/* util.c: option parsing, error reporting, device resolution and the host
 * probe (threads, load average) shared by the subcommands (see cli.h). */
#define _DEFAULT_SOURCE /* getloadavg, setenv */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cli.h"

#ifndef KV_GIT_SHA
#define KV_GIT_SHA "unknown"
#endif

int kv_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "kvbench %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'kvbench %s --help'.\n", cmd);
    return 2;
}

int kv_report(kv_status st) {
    fprintf(stderr, "kvbench: %s\n", kv_last_error());
    return kv_exit_code(st);
}

int kv_parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int kv_parse_float(const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int kv_parse_int_list(const char *s, int *out, int cap) {
    int n = 0;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (n >= cap || kv_parse_int(tok, 1, 2147483647L, &out[n]) != 0) return -1;
        n++;
    }
    return n ? n : -1;
}

int kv_parse_device(const char *s, kv_device_choice *out) {
    if (!strcmp(s, "auto")) *out = KV_DEVICE_AUTO;
    else if (!strcmp(s, "cpu")) *out = KV_DEVICE_CPU;
    else if (!strcmp(s, "gpu")) *out = KV_DEVICE_GPU;
    else return -1;
    return 0;
}

kv_status kv_resolve_device(kv_device_choice c, kv_gpu_info *gi, int *use_gpu) {
    kv_gpu_probe(gi);
    *use_gpu = 0;
    if (c == KV_DEVICE_CPU) return KV_OK;
    if (gi->available) { *use_gpu = 1; return KV_OK; }
    if (c == KV_DEVICE_GPU)
        return kv_fail(KV_ERR_INPUT, "--device gpu: no usable GPU (%s); use --device cpu or auto", gi->reason);
    return KV_OK;
}

void kv_command_line(int argc, char **argv, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < argc && used < cap; i++) {
        int w = snprintf(buf + used, cap - used, "%s%s", i ? " " : "", argv[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
}

const char *kv_git_sha(void) { return KV_GIT_SHA; }

/* libgomp reads OMP_WAIT_POLICY once, when it is loaded (before main), and
 * by default an idle worker spins for about 300000 iterations before it
 * sleeps. On a machine busy with other work the spinning workers and the
 * working one fight for the cores: the demo took 25 s instead of 7 s, and
 * CPU bench medians were 40x too high (issue 16). Measured on this 2-core
 * machine with a busy loop on one core: the demo's wall time 7-23 s with
 * the default, 12-16 s with a shorter spin (GOMP_SPINCOUNT=30000, search
 * medians ~2 ms: worse), 3.9 s passive. A passive policy makes idle
 * workers sleep at once; on an idle machine that costs a wake-up of tens
 * of microseconds per parallel region (quest's search median 20-27 us ->
 * 50-86 us, the demo 2.0-2.7 s -> 2.7-3.0 s). Robust numbers on a shared
 * machine are worth that, so kvbench sets it and re-executes itself once
 * so that libgomp sees it; an explicit OMP_WAIT_POLICY (e.g. active, for
 * the lowest latency on a dedicated machine) is kept. */
void kv_passive_wait_policy(char **argv) {
    if (getenv("OMP_WAIT_POLICY")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    execv("/proc/self/exe", argv);
    /* no /proc (or exec refused): go on with the runtime's default */
    unsetenv("OMP_WAIT_POLICY");
}

void kv_host_setup(const char *cmd, int threads, kv_host_info *h) {
    memset(h, 0, sizeof *h);
    h->threads = 1;
    h->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
#ifdef _OPENMP
    if (threads > 0) omp_set_num_threads(threads);
    h->threads = omp_get_max_threads();
#endif
    const char *wp = getenv("OMP_WAIT_POLICY");
    snprintf(h->wait_policy, sizeof h->wait_policy, "%s", wp && *wp ? wp : "default");
    if (getloadavg(h->load, 3) != 3) h->load[0] = h->load[1] = h->load[2] = -1;
    if (h->load[0] > h->cores)
        fprintf(stderr, "kvbench %s: warning: the 1-minute load average (%.2f) is above the %d available cores: "
                        "other work competes for the CPU, so CPU timings (build_seconds, search_us) will be "
                        "inflated (fewer --threads, or a quieter machine, steadies them); the accuracy results are "
                        "not affected\n", cmd, h->load[0], h->cores);
}
