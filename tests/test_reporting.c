/* test_reporting.c: what kvbench reports about itself is true (issue 16):
 * the per_kv_head flag of every method against the selections it makes;
 * summary.json's host record (threads, wait policy, load); the binary
 * starting without any CUDA library; the batch script keyed by
 * configuration (tests/test_run_traces.sh); README numbers and names
 * against the program (tests/check_readme.sh); the plot scripts' style
 * and error handling (tests/test_plots.py). */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_test.h"

/* 1 when at every step the G query heads of each group got the same set. */
static int lists_group_equal(const kv_selection *s, int G) {
    if (s->n_lists == s->n_kv) return 1;
    for (int h = 0; h < s->n_lists; h++) {
        int h0 = h / G * G;
        if (s->count[h] != s->count[h0]) return 0;
        const int32_t *a = s->idx + (size_t)h * s->cap, *b = s->idx + (size_t)h0 * s->cap;
        for (int i = 0; i < s->count[h]; i++) { /* as sets: every a[i] is in b */
            int found = 0;
            for (int j = 0; j < s->count[h0] && !found; j++) found = a[i] == b[j];
            if (!found) return 0;
        }
    }
    return 1;
}

/* For every method, with its defaults and with each value of its pooling
 * parameter, the flag that `kvbench list` and summary.json print
 * (kv_method_group_consistent) equals what its selections show on random
 * data with groups of 2: identical sets within every group at every step. */
int test_method_group_flag_truthful(void) {
    int T = 600, P = 400, k = 16, G = 2;
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(T, P, 4, 2, 32, 5, &L));
    int n, checked = 0, pooled = 0;
    const kv_method *const *all = kv_methods(&n);
    int result = KV_TEST_PASS;
    for (int i = 0; i < n && result == KV_TEST_PASS; i++) {
        const kv_method *m = all[i];
        char vals[8][32];
        int nv = 0;
        strcpy(vals[nv++], ""); /* the defaults */
        for (const kv_param_spec *s = m->params; m->group_pool_param && s && s->name; s++)
            if (!strcmp(s->name, m->group_pool_param))
                for (const char *c = s->choices; c && *c && nv < 8;) {
                    const char *e = strchr(c, '|');
                    size_t len = e ? (size_t)(e - c) : strlen(c);
                    snprintf(vals[nv++], sizeof vals[0], "%s=%.*s", s->name, (int)len, c);
                    c = e ? e + 1 : NULL;
                }
        for (int v = 0; v < nv && result == KV_TEST_PASS; v++) {
            const char *params[1] = {vals[v]};
            int np = vals[v][0] ? 1 : 0;
            kv_param_set ps;
            kv_params_init(&ps, m->params);
            if (np && kv_params_set(&ps, m->name, vals[v]) != KV_OK) { result = KV_TEST_FAIL; break; }
            kv_test_driver d;
            kv_status st = kv_test_driver_open(&d, m->name, params, np, &L, P, 4, 16, k);
            int same = 1;
            for (int t = 430; t < T && st == KV_OK; t += 37) {
                st = kv_test_driver_step(&d, t, k);
                if (st == KV_OK) same &= lists_group_equal(&d.sel, G);
            }
            kv_test_driver_close(&d);
            if (st != KV_OK) {
                fprintf(stderr, "    %s %s: %s\n", m->name, vals[v], kv_last_error());
                result = KV_TEST_FAIL;
                break;
            }
            int flag = kv_method_group_consistent(m, &ps);
            if (flag != same) {
                fprintf(stderr, "    %s %s: reports per_kv_head=%s but its selections are %sgroup-consistent\n", m->name,
                        np ? vals[v] : "(defaults)", flag ? "true" : "false", same ? "" : "not ");
                result = KV_TEST_FAIL;
            }
            checked++;
            pooled += flag && !m->per_kv_head;
        }
    }
    kv_layer_free(&L);
    if (result == KV_TEST_PASS)
        CHECK(checked >= n + 5 && pooled >= 3, "checked %d configurations, %d pooled (want >= %d and >= 3)", checked,
              pooled, n + 5);
    return result;
}

static int sh(char *out, size_t oc, char *err, size_t ec, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
static int sh(char *out, size_t oc, char *err, size_t ec, const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return kv_test_sh(cmd, out, oc, err, ec);
}

/* summary.json records the thread count (--threads), the wait policy
 * (passive unless the user set one, then theirs) and three load averages. */
int test_run_records_host(void) {
    static char out[8192], err[8192];
    const char *tmp = kv_test_tmpdir(), *bin = kv_test_bin();
    int rc = sh(out, sizeof out, err, sizeof err,
                "env -u OMP_WAIT_POLICY %s run --trace datasets/demo.h5 --method exact --max-steps 2 --device cpu "
                "--threads 1 --out %s/host1 --quiet && python3 -c \"import json; h = json.load(open('%s/host1/summary.json'))"
                "['host']; print(h['cpu_threads'], h['omp_wait_policy'], len(h['load_average_at_start']), "
                "all(x >= 0 for x in h['load_average_at_start']), h['cores'])\"",
                bin, tmp, tmp);
    CHECK(rc == 0, "run --threads 1: exit %d: %s", rc, err);
    char want[64];
    snprintf(want, sizeof want, "1 passive 3 True %ld\n", sysconf(_SC_NPROCESSORS_ONLN));
    CHECK(!strcmp(out, want), "host record '%s', want '%s'", out, want);
    rc = sh(out, sizeof out, err, sizeof err,
            "OMP_WAIT_POLICY=active %s run --trace datasets/demo.h5 --method exact --max-steps 2 --device cpu "
            "--threads 2 --out %s/host2 --quiet && python3 -c \"import json; h = json.load(open('%s/host2/summary.json'))"
            "['host']; print(h['cpu_threads'], h['omp_wait_policy'])\"",
            bin, tmp, tmp);
    CHECK(rc == 0, "run --threads 2: exit %d: %s", rc, err);
    CHECK(!strcmp(out, "2 active\n"), "host record '%s', want '2 active' (the user's policy is kept)", out);
    rc = sh(out, sizeof out, err, sizeof err, "%s run --trace datasets/demo.h5 --method exact --threads 0", bin);
    CHECK(rc == 2 && strstr(err, "--threads"), "--threads 0: exit %d, stderr %s", rc, err);
    return KV_TEST_PASS;
}

/* kvbench needs no CUDA library to start: cuBLAS is loaded by the PQCache
 * GPU path only, the CUDA runtime is static. Checked on the binary's
 * dynamic dependencies, and by running --help and a CPU run with the
 * loader's search path pointed away from every CUDA directory. */
int test_binary_needs_no_cuda_libraries(void) {
    static char out[16384], err[8192];
    const char *bin = kv_test_bin();
    int rc = sh(out, sizeof out, err, sizeof err, "ldd %s", bin);
    CHECK(rc == 0, "ldd %s: exit %d: %s", bin, rc, err);
    CHECK(!strstr(out, "libcublas") && !strstr(out, "libcudart") && !strstr(out, "libcuda.so"),
          "%s links a CUDA library:\n%s", bin, out);
    rc = sh(out, sizeof out, err, sizeof err, "env -u LD_LIBRARY_PATH LD_LIBRARY_PATH=/nonexistent %s --help", bin);
    CHECK(rc == 0 && strstr(out, "usage: kvbench"), "--help without CUDA libraries: exit %d: %s", rc, err);
    rc = sh(out, sizeof out, err, sizeof err,
            "env -u LD_LIBRARY_PATH LD_LIBRARY_PATH=/nonexistent %s run --trace datasets/demo.h5 --method exact,pqcache "
            "--max-steps 4 --device cpu --out %s/nocuda --quiet",
            bin, kv_test_tmpdir());
    CHECK(rc == 0, "CPU run without CUDA libraries: exit %d: %s", rc, err);
    return KV_TEST_PASS;
}

int test_run_traces_keyed_by_config(void) {
    static char out[8192], err[16384];
    int rc = sh(out, sizeof out, err, sizeof err, "KVBENCH_BIN=%s tests/test_run_traces.sh %s/run_traces", kv_test_bin(),
                kv_test_tmpdir());
    CHECK(rc == 0, "tests/test_run_traces.sh: exit %d:\n%s", rc, err);
    return KV_TEST_PASS;
}

int test_readme_agrees_with_program(void) {
    static char out[8192], err[16384];
    int rc = sh(out, sizeof out, err, sizeof err, "KVBENCH_BIN=%s tests/check_readme.sh %s/readme", kv_test_bin(),
                kv_test_tmpdir());
    CHECK(rc == 0, "tests/check_readme.sh: exit %d:\n%s", rc, err);
    return KV_TEST_PASS;
}

/* The plot scripts: one style per method, no traceback (tests/test_plots.py). */
int test_plots_style_and_errors(void) {
    static char out[8192], err[16384];
    int rc = sh(out, sizeof out, err, sizeof err, "KVBENCH_BIN=%s python3 tests/test_plots.py", kv_test_bin());
    if (rc == 77) {
        kv_test_skip_reason("matplotlib not installed (make pydeps)");
        return KV_TEST_SKIP;
    }
    CHECK(rc == 0, "tests/test_plots.py: exit %d:\n%s%s", rc, out, err);
    return KV_TEST_PASS;
}

/* `kvbench list` and summary.json say what the parameters make of the
 * granularity (pariskv: per kv head by default, per query head with
 * pool=none), and cite papers by title, never by a file of the repository. */
int test_list_and_summary_report_granularity(void) {
    static char out[65536], err[8192];
    const char *bin = kv_test_bin(), *tmp = kv_test_tmpdir();
    int rc = sh(out, sizeof out, err, sizeof err, "%s list", bin);
    CHECK(rc == 0, "list: exit %d: %s", rc, err);
    CHECK(!strstr(out, "papers/") && !strstr(out, ".txt"), "list cites a file:\n%s", out);
    char *p = strstr(out, "\npariskv "), *l2 = p ? strchr(p + 1, '\n') : NULL, *l3 = l2 ? strchr(l2 + 1, '\n') : NULL;
    CHECK(l3, "no pariskv entry in list:\n%s", out);
    *l3 = 0; /* l2: pariskv's granularity line */
    CHECK(strstr(l2, "selects per kv head (group-consistent)"), "pariskv's default granularity in list: %s", l2);
    *l3 = '\n';
    CHECK(strstr(out, "\"ParisKV: Fast and Drift-Robust KV-Cache Retrieval for Long-Context LLMs\""),
          "list does not cite ParisKV by title");
    rc = sh(out, sizeof out, err, sizeof err,
            "%s run --trace datasets/demo.h5 --method pariskv,exact,quest --param quest.pool=mean --max-steps 2 "
            "--device cpu --out %s/gran1 --quiet && %s run --trace datasets/demo.h5 --method pariskv --param pool=none "
            "--max-steps 2 --device cpu --out %s/gran2 --quiet && python3 -c \"import json; "
            "print([m['per_kv_head'] for d in ('gran1', 'gran2') for m in json.load(open('%s/' + d + '/summary.json'))"
            "['methods']])\"",
            bin, tmp, bin, tmp, tmp);
    CHECK(rc == 0, "runs: exit %d: %s", rc, err);
    CHECK(!strcmp(out, "[True, False, True, False]\n"),
          "per_kv_head of pariskv, exact, quest pool=mean, pariskv pool=none: %s (want True False True False)", out);
    return KV_TEST_PASS;
}

/* `bench --device cpu` without --tokens times 16384 and 65536 tokens (about
 * 1 GB of RAM at the default shape), not 1M (13 GB); --help says so. */
int test_bench_cpu_defaults_fit_a_laptop(void) {
    static char out[16384], err[8192];
    const char *bin = kv_test_bin();
    int rc = sh(out, sizeof out, err, sizeof err, "%s bench --help", bin);
    CHECK(rc == 0 && strstr(out, "on the CPU") && strstr(out, "16384,65536"), "bench --help: %s", out);
    rc = sh(out, sizeof out, err, sizeof err, "%s bench --method streaming --device cpu --reps 1 --threads 1", bin);
    CHECK(rc == 0, "bench: exit %d: %s", rc, err);
    int n16 = 0, n64 = 0, other = 0;
    for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n")) {
        char m[64], stage[64];
        int tok;
        if (sscanf(l, "%63s %d %63s", m, &tok, stage) != 3 || strcmp(m, "streaming")) continue;
        if (tok == 16384) n16++;
        else if (tok == 65536) n64++;
        else other++;
    }
    CHECK(n16 == 2 && n64 == 2 && other == 0, "rows at 16384/65536/other tokens: %d/%d/%d (want 2/2/0)", n16, n64, other);
    CHECK(strstr(err, "1 OpenMP threads"), "the banner does not report --threads 1: %s", err);
    return KV_TEST_PASS;
}
