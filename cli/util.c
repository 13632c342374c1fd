/* util.c: option parsing, error reporting, output-path checks, device
 * resolution and the host probe (threads, load average) shared by the
 * subcommands (see cli.h). Numbers are parsed into long with errno and end
 * checks, then range-checked before they are narrowed, so no option value
 * can wrap; the ranges callers pass keep the products they form within int
 * or size_t (see each command). */
#define _DEFAULT_SOURCE /* getloadavg, setenv */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    if (!*s || *end || errno || v < lo || v > hi || v < INT_MIN || v > INT_MAX) return -1;
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

static void describe_range(long lo, long hi, char *buf, size_t cap) {
    snprintf(buf, cap, "an integer in [%ld, %ld]", lo, hi);
}

int kv_opt_int(const char *cmd, const char *name, const char *s, long lo, long hi, int *out) {
    if (kv_parse_int(s, lo, hi, out) == 0) return 0;
    char want[96];
    describe_range(lo, hi, want, sizeof want);
    return kv_usage_error(cmd, "--%s: expected %s, found '%s'", name, want, s);
}

int kv_opt_int_list(const char *cmd, const char *name, const char *s, long lo, long hi, int *out, int cap) {
    char want[96];
    describe_range(lo, hi, want, sizeof want);
    int n = 0;
    const char *p = s;
    for (;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == 0) {
            kv_usage_error(cmd, "--%s: expected comma-separated values, each %s; found an empty item in '%s'", name,
                           want, s);
            return -2;
        }
        if (n >= cap) {
            kv_usage_error(cmd, "--%s: at most %d values, found more in '%s'", name, cap, s);
            return -2;
        }
        char *item = kv_malloc(len + 1, "option item");
        if (!item) { kv_report(KV_ERR_NOMEM); return -2; }
        memcpy(item, p, len);
        item[len] = 0;
        int bad = kv_parse_int(item, lo, hi, &out[n]);
        if (bad) kv_usage_error(cmd, "--%s: expected comma-separated values, each %s; found '%s'", name, want, item);
        free(item);
        if (bad) return -2;
        n++;
        if (!c) break;
        p = c + 1;
    }
    return n;
}

int kv_opt_error(const char *cmd, int c, char **argv, const struct option *opts) {
    const struct option *o = NULL;
    for (const struct option *x = opts; x->name; x++)
        if (optopt && x->val == optopt && !x->flag) { o = x; break; }
    if (c == ':' && o) return kv_usage_error(cmd, "option --%s needs a value", o->name);
    if (c == ':') return kv_usage_error(cmd, "option '%s' needs a value", argv[optind - 1]);
    const char *arg = argv[optind - 1];
    if (o && !o->has_arg && !strncmp(arg, "--", 2) && strchr(arg, '='))
        return kv_usage_error(cmd, "option --%s takes no value, found '%s'", o->name, arg);
    if (optopt && !o && optopt > ' ' && optopt < 127 && arg[0] == '-' && arg[1] != '-')
        return kv_usage_error(cmd, "unknown option '-%c'", optopt);
    return kv_usage_error(cmd, "unknown or ambiguous option '%s'", arg);
}

char *kv_strfmt(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) { kv_fail(KV_ERR_INTERNAL, "cannot format a message"); return NULL; }
    char *s = kv_malloc((size_t)n + 1, "string");
    if (!s) return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

kv_status kv_check_parent(const char *opt, const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? kv_strfmt("%.*s", slash == path ? 1 : (int)(slash - path), path) : kv_strfmt(".");
    if (!dir) return KV_ERR_NOMEM;
    struct stat sb;
    kv_status st = KV_OK;
    if (stat(dir, &sb) != 0)
        st = kv_fail(KV_ERR_INPUT, "%s %s: its directory '%s' %s (create it first, or choose another %s)", opt, path,
                     dir, errno == ENOENT ? "does not exist" : strerror(errno), opt);
    else if (!S_ISDIR(sb.st_mode))
        st = kv_fail(KV_ERR_INPUT, "%s %s: '%s' is not a directory", opt, path, dir);
    else if (access(dir, W_OK | X_OK) != 0)
        st = kv_fail(KV_ERR_INPUT, "%s %s: its directory '%s' is not writable (%s)", opt, path, dir, strerror(errno));
    free(dir);
    return st;
}

kv_status kv_check_out_file(const char *opt, const char *path, int force, const char *input) {
    if (!*path) return kv_fail(KV_ERR_INPUT, "%s: expected a file name, found ''", opt);
    if (path[strlen(path) - 1] == '/')
        return kv_fail(KV_ERR_INPUT, "%s %s: expected a file name, found a directory name", opt, path);
    KV_TRY(kv_check_parent(opt, path));
    struct stat sb, si;
    if (stat(path, &sb) != 0) return KV_OK;
    if (input && stat(input, &si) == 0 && si.st_dev == sb.st_dev && si.st_ino == sb.st_ino)
        return kv_fail(KV_ERR_INPUT, "%s %s: is the input file; write to another file", opt, path);
    if (!force) return kv_fail(KV_ERR_INPUT, "%s %s: already exists (use --force to replace it)", opt, path);
    if (!S_ISREG(sb.st_mode))
        return kv_fail(KV_ERR_INPUT, "%s %s: exists and is not a regular file; --force replaces only files", opt, path);
    return KV_OK;
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

char *kv_command_line(int argc, char **argv) {
    size_t n = 1;
    for (int i = 0; i < argc; i++) n += strlen(argv[i]) + 1;
    char *buf = kv_malloc(n, "command line");
    if (!buf) return NULL;
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < argc; i++) {
        if (i) buf[used++] = ' ';
        size_t l = strlen(argv[i]);
        memcpy(buf + used, argv[i], l);
        used += l;
    }
    buf[used] = 0;
    return buf;
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
