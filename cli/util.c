/* util.c: option parsing, error reporting and device resolution shared by
 * the subcommands (see cli.h). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
