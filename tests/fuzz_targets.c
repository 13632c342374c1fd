/* fuzz_targets.c: the two fuzz targets of `make fuzz`, also linked into the
 * test runner so `make test` replays the regression corpora through exactly
 * the code the fuzzer ran.
 *
 * kv_fuzz_loader: the input is an HDF5 file; it is written to a scratch
 * file and opened, validated and loaded (every layer, the token ids) with
 * the in-process entry points (kv_trace_open_direct: no child process, so
 * a crash anywhere, libhdf5 included, is seen by the fuzzer). Returns the
 * loader's status.
 * kv_fuzz_cli: the input is NUL-separated strings: the first is a --method
 * list, the rest --param assignments; each string is also fed to the
 * option parsers (integer, float, integer list, device). Returns
 * kv_pick_methods's result (-1 parsed, 2 usage error). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cli/cli.h"
#include "../cli/results.h"
#include "../datasets/kv_trace.h"
#include "kv_test.h"

int kv_fuzz_loader(const uint8_t *data, size_t size) {
    static char path[256];
    if (!path[0]) {
        const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(path, sizeof path, "%s/kvbench-fuzz-%d.h5", dir, (int)getpid());
    }
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fwrite(data, 1, size, f);
    fclose(f);
    static kv_trace_info in;
    kv_status st = kv_trace_open_direct(path, &in);
    for (int i = 0; st == KV_OK && i < in.num_layers; i++) {
        kv_layer L;
        st = kv_trace_load_layer_direct(&in, i, &L);
        if (st == KV_OK) kv_layer_free(&L);
    }
    int *tok = NULL;
    if (st == KV_OK) st = kv_trace_load_tokens_direct(&in, &tok);
    free(tok);
    unlink(path);
    return (int)st;
}

#define FUZZ_MAX_STRINGS 16
int kv_fuzz_cli(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    const char *s[FUZZ_MAX_STRINGS];
    int n = 0;
    for (size_t i = 0; i <= size && n < FUZZ_MAX_STRINGS;) {
        s[n++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    for (int i = 0; i < n; i++) {
        int iv, list[8];
        double fv;
        kv_device_choice dc;
        kv_parse_int(s[i], -5, 1 << 30, &iv);
        kv_parse_float(s[i], -1e9, 1e9, &fv);
        kv_opt_int("fuzz", "list", s[i], 0, 1L << 30, &iv);
        kv_opt_int_list("fuzz", "list", s[i], 1, 1L << 30, list, 8);
        kv_parse_device(s[i], &dc);
    }
    static kv_method_run runs[16];
    memset(runs, 0, sizeof runs); /* as the commands' own arrays start (a stale entry would hide a bug) */
    int nr = 0;
    int rc = kv_pick_methods("run", s[0], s + 1, n - 1, runs, 16, &nr);
    free(buf);
    return rc;
}
