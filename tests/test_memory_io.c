/* test_memory_io.c: issue 12's run-level checks. (1) A run whose memory
 * needs exceed the limit fails before loading anything, exit 2, with a
 * message naming the bytes needed (computed here from the formula in
 * cli/run.c's check_memory, independently) and available; at exactly the
 * needed bytes it runs. (2) The results on both bundled demo traces are
 * bit for bit the same whether the layer came through the parallel loader
 * or the HDF5 library's path (the code every earlier result was loaded
 * with): steps.csv, drift.csv, and summary.json without its timings. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "../datasets/kv_trace.h"
#include "kv_test.h"

static char out[1 << 16], err[1 << 16];

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return kv_test_sh(cmd, out, sizeof out, err, sizeof err);
}

int test_run_memory_preflight(void) {
    const char *B = kv_test_bin(), *tmp = kv_test_tmpdir();
    char tr[600];
    snprintf(tr, sizeof tr, "%s/mem.h5", tmp);
    CHECK(sh("'%s' synth --out '%s' --tokens 3000 --prefill 2000 --q-heads 4 --kv-heads 2 --dim 32 --force", B, tr) == 0,
          "synth: %s", err);
    /* host: layer 4*(4+2*2)*3000*32 + decode rows set aside 4*8*(3000-2000)*32 + 2 CPU instances x
     * (4*2*3000*32 + 4*4*3000) + oracle 4*4*3000 */
    long long layer = 4LL * 8 * 3000 * 32, prefix = 4LL * 8 * 1000 * 32, per = 4LL * 2 * 3000 * 32 + 4LL * 4 * 3000;
    long long need = layer + prefix + 2 * per + 4LL * 4 * 3000;
    int rc = sh("KVBENCH_MEM_LIMIT=%lld '%s' run --trace '%s' --method exact,quest --out '%s/mem-out' --force --quiet",
                need - 1, B, tr, tmp);
    CHECK(rc == 2, "exit %d (want 2); stderr: %s", rc, err);
    char want[128];
    snprintf(want, sizeof want, "needs %lld bytes", need);
    CHECK(strstr(err, want), "message lacks '%s': %s", want, err);
    snprintf(want, sizeof want, "%lld bytes", need - 1);
    CHECK(strstr(err, want) && strstr(err, "available") && strstr(err, tr), "message lacks the available bytes: %s", err);
    CHECK(!strstr(out, "results:"), "ran anyway");
    rc = sh("KVBENCH_MEM_LIMIT=%lld '%s' run --trace '%s' --method exact,quest --max-steps 2 --out '%s/mem-out' --force "
            "--quiet", need, B, tr, tmp);
    CHECK(rc == 0, "at exactly the needed bytes: exit %d: %s", rc, err);
    /* --lag 3: q's prefix is copied (4*4*2000*32) instead of its decode rows set aside (4*4*1000*32) */
    long long need_lag = need + 4LL * 4 * 2000 * 32 - 4LL * 4 * 1000 * 32;
    rc = sh("KVBENCH_MEM_LIMIT=%lld '%s' run --trace '%s' --method exact,quest --lag 3 --out '%s/mem-out' --force --quiet",
            need_lag - 1, B, tr, tmp);
    snprintf(want, sizeof want, "needs %lld bytes", need_lag);
    CHECK(rc == 2 && strstr(err, want), "--lag 3: exit %d, want 2 and '%s': %s", rc, want, err);
    return KV_TEST_PASS;
}

/* summary.json without the lines and fields that hold times, dates, the command or the load (phase_seconds
 * spans lines: its members are dropped by name). */
static const char *strip =
    "grep -v -E '\"(started|command|git_sha|wall_seconds|host)\"' | "
    "sed -E 's/\"(build_seconds|append_seconds_total|search_us_[a-z0-9]+|[a-z_]*seconds[a-z_]*)\": [^,}]*//g' | "
    "sed -E 's/\"(load|build|append|oracle|search|diagnostics|methods_wall|bookkeeping|output)\": [0-9.eE+-]+//g'";

int test_run_results_loader_invariant(void) {
    const char *B = kv_test_bin(), *tmp = kv_test_tmpdir();
    static const char *traces[2] = {"datasets/demo.h5", "datasets/demo-1.5b.h5"};
    for (int i = 0; i < 2; i++) {
        for (int m = 0; m < 2; m++) {
            int rc = sh("%s '%s' run --trace %s --method exact,quest,pariskv,magicpig,streaming,csattention --stride 3 "
                        "--out '%s/inv-%d-%d' --force --quiet", m ? "KVBENCH_LOADER=library" : "", B, traces[i], tmp,
                        i, m);
            CHECK(rc == 0, "%s (loader %s): exit %d: %s", traces[i], m ? "library" : "parallel", rc, err);
        }
        CHECK(sh("cmp '%s/inv-%d-0/steps.csv' '%s/inv-%d-1/steps.csv'", tmp, i, tmp, i) == 0, "%s: steps.csv differ: %s",
              traces[i], out);
        CHECK(sh("cmp '%s/inv-%d-0/drift.csv' '%s/inv-%d-1/drift.csv'", tmp, i, tmp, i) == 0, "%s: drift.csv differ: %s",
              traces[i], out);
        for (int m = 0; m < 2; m++)
            CHECK(sh("cat '%s/inv-%d-%d/summary.json' | %s > '%s/inv-%d-%d.json'", tmp, i, m, strip, tmp, i, m) == 0, "strip");
        CHECK(sh("diff '%s/inv-%d-0.json' '%s/inv-%d-1.json'", tmp, i, tmp, i) == 0 && strlen(out) == 0,
              "%s: summary.json metrics differ: %s", traces[i], out);
    }
    return KV_TEST_PASS;
}

/* The device side of the preflight (--device gpu): KVBENCH_GPU_MEM_LIMIT one byte short of
 * the oracle's K and V as float16 + its scores + exact's keys and scores: exit 2 naming the bytes. */
int test_run_memory_preflight_gpu(void) {
    const char *B = kv_test_bin(), *tmp = kv_test_tmpdir();
    char tr[600];
    snprintf(tr, sizeof tr, "%s/memg.h5", tmp);
    CHECK(sh("'%s' synth --out '%s' --tokens 3000 --prefill 2000 --q-heads 4 --kv-heads 2 --dim 32 --force", B, tr) == 0,
          "synth: %s", err);
    long long T = 3000, D = 32, Hq = 4, Hkv = 2;
    long long need = 2 * 2 * Hkv * T * D + 4 * Hq * T + (2 * Hkv * T * D + 4 * Hq * T);
    int rc = sh("KVBENCH_GPU_MEM_LIMIT=%lld '%s' run --trace '%s' --method exact --device gpu --out '%s/memg-out' "
                "--force --quiet", need - 1, B, tr, tmp);
    CHECK(rc == 2, "exit %d (want 2); stderr: %s", rc, err);
    char want[128];
    snprintf(want, sizeof want, "needs %lld bytes", need);
    CHECK(strstr(err, want) && strstr(err, "GPU memory"), "message lacks '%s' of GPU memory: %s", want, err);
    rc = sh("KVBENCH_GPU_MEM_LIMIT=%lld '%s' run --trace '%s' --method exact --device gpu --max-steps 2 --out "
            "'%s/memg-out' --force --quiet", need, B, tr, tmp);
    CHECK(rc == 0, "at exactly the needed bytes: exit %d: %s", rc, err);
    return KV_TEST_PASS;
}
