/* util.c: test helpers (see kv_test.h). */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../kernels/ops/kv_gpu.h"
#include "kv_test.h"

static char tmpdir[512];
char kv_test_reason[512];

void kv_test_skip_reason(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kv_test_reason, sizeof kv_test_reason, fmt, ap);
    va_end(ap);
}

const char *kv_test_tmpdir(void) {
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/kvbench-test-XXXXXX");
        if (!mkdtemp(tmpdir)) { perror("mkdtemp"); exit(1); }
    }
    return tmpdir;
}

const char *kv_test_bin(void) {
    const char *b = getenv("KVBENCH_BIN");
    return b && *b ? b : "./kvbench";
}

char *kv_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)n + 1)) && fread(b, 1, (size_t)n, f) == (size_t)n)
        b[n] = 0;
    else {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b && len) *len = (size_t)n;
    return b;
}

/* The start of a file into buf (at most cap - 1 bytes, NUL-terminated; empty when unreadable). */
static void slurp(const char *path, char *buf, size_t cap) {
    if (!buf || !cap) return;
    size_t n = 0;
    char *s = kv_test_read_file(path, &n);
    if (!s) n = 0;
    if (n > cap - 1) n = cap - 1;
    if (n) memcpy(buf, s, n);
    buf[n] = 0;
    free(s);
}

int kv_test_sh(const char *cmd, char *out, size_t out_cap, char *err, size_t err_cap) {
    char full[8192], po[600], pe[600];
    snprintf(po, sizeof po, "%s/cmd.out", kv_test_tmpdir());
    snprintf(pe, sizeof pe, "%s/cmd.err", kv_test_tmpdir());
    snprintf(full, sizeof full, "( %s ) >%s 2>%s", cmd, po, pe);
    int rc = system(full);
    slurp(po, out, out_cap);
    slurp(pe, err, err_cap);
    if (rc == -1) return -1;
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

uint64_t kv_test_seed(void) {
    const char *e = getenv("KVBENCH_TEST_SEED");
    if (e && *e) {
        char *end;
        unsigned long long v = strtoull(e, &end, 0);
        if (*end) {
            fprintf(stderr, "KVBENCH_TEST_SEED: expected an unsigned integer, found '%s'\n", e);
            exit(2);
        }
        return (uint64_t)v;
    }
    return (uint64_t)(kv_now() * 1e9) ^ ((uint64_t)getpid() << 40);
}

int kv_test_have_gpu(void) {
    kv_gpu_info gi;
    kv_gpu_probe(&gi);
    if (!gi.available) kv_test_skip_reason("no GPU: %s", gi.reason);
    return gi.available;
}

void kv_test_env_set(kv_test_env *e, const char *name, const char *value) {
    const char *o = getenv(name);
    e->name = name;
    e->old = o ? strdup(o) : NULL;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

void kv_test_env_restore(kv_test_env *e) {
    if (e->old) setenv(e->name, e->old, 1);
    else unsetenv(e->name);
    free(e->old);
    e->old = NULL;
}
