/* test_cli.c: the kvbench binary as a user runs it: usage and input
 * errors (message on stderr, exit 2), slice, the end-to-end run on the
 * bundled demo trace checked against an independent computation here,
 * atomic results, and the Python dumper's own test. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../datasets/kv_trace.h"
#include "kv_test.h"

#define DEMO "datasets/demo.h5"
static char out[1 << 16], err[1 << 16];

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return kv_test_sh(cmd, out, sizeof out, err, sizeof err);
}

static int exists(const char *p) { struct stat sb; return stat(p, &sb) == 0; }

int test_cli_errors(void) {
    const char *B = kv_test_bin(), *tmp = kv_test_tmpdir();
    struct { const char *args; int rc; const char *needle; } cases[] = {
        {"run --trace /nonexistent.h5 --method exact", 2, "/nonexistent.h5: no such file"},
        {"run --trace " DEMO " --method nope", 2, "unknown method 'nope'"},
        {"run --trace " DEMO " --method exact --param beta=1", 2, "no such parameter"},
        {"run --trace " DEMO " --method random --param seed=-4", 2, "expected a value in [0, 2.14748e+09]"},
        {"run --trace " DEMO " --method exact --k 0", 2, "--k: expected an integer in [1, 1073741824], found '0'"},
        {"run --trace " DEMO " --method exact --layer L999", 2, "no such layer"},
        {"run --trace " DEMO " --method exact --device tpu", 2, "--device: expected auto, cpu or gpu, found 'tpu'"},
        {"run --method exact", 2, "--trace FILE is required"},
        {"frobnicate", 2, "unknown command 'frobnicate'"},
        {"info", 2, "expected exactly one trace file"},
        {"synth --out /nonexistent-dir/x.h5 --tokens 100", 2, "its directory '/nonexistent-dir' does not exist"},
        {"synth --out x.h5 --q-heads 3 --kv-heads 2", 2, "not a multiple"},
        {"slice --in " DEMO " --out x.h5 --tokens 99999999", 2, "exceeds"},
        {"bench --method nope", 2, "unknown method 'nope'"},
        {"bench --method pariskv --param pariskv.beta=7", 2, "expected a value in [0, 1], found 7"},
        {"bench --tokens 100", 2, "--method is required"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = sh("cd %s && %s%s %s", tmp, B[0] == '/' ? "" : "$OLDPWD/", B, cases[i].args);
        if (strstr(cases[i].args, DEMO)) rc = sh("%s %s", B, cases[i].args); /* DEMO is relative to the repo */
        CHECK(rc == cases[i].rc, "'kvbench %s': exit %d, want %d; stderr: %s", cases[i].args, rc, cases[i].rc, err);
        CHECK(strstr(err, cases[i].needle), "'kvbench %s': stderr lacks '%s': %s", cases[i].args, cases[i].needle, err);
    }
    CHECK(sh("%s run --help", B) == 0 && strstr(out, "usage: kvbench run"), "run --help");
    CHECK(sh("%s list", B) == 0 && strstr(out, "exact") && strstr(out, "streaming") && strstr(out, "random"), "list");
    return KV_TEST_PASS;
}

/* kvbench bench on the CPU for several methods: a build and a search row per
 * (method, length), positive times, exact's index bytes as counted here
 * (its float32 keys, Hkv * T * D * 4), parameters carried to the CSV. */
int test_cli_bench_cpu(void) {
    const char *B = kv_test_bin();
    char csv[600];
    snprintf(csv, sizeof csv, "%s/bench.csv", kv_test_tmpdir());
    CHECK(sh("%s bench --method exact,pariskv,quest --tokens 1024,2048 --device cpu --q-heads 4 --kv-heads 2 --dim 64 "
             "--reps 2 --warmup 0 --param pariskv.beta=0.3 --csv %s", B, csv) == 0, "bench failed: %s", err);
    FILE *f = fopen(csv, "r");
    CHECK(f, "no CSV at %s", csv);
    char line[2048];
    int rows = 0, exact = 0, bad = 0, beta = 0;
    CHECK(fgets(line, sizeof line, f) && !strncmp(line, "method,device,tokens,", 21), "CSV header: %s", line);
    while (fgets(line, sizeof line, f)) {
        char method[32], stage[32];
        int T;
        double med, bytes;
        if (sscanf(line, "%31[^,],cpu,%d,4,2,64,100,%31[^,],%lf,%*f,%lf", method, &T, stage, &med, &bytes) != 5) {
            bad++;
            continue;
        }
        rows++;
        bad += !(med > 0) || !(bytes > 0) || (strcmp(stage, "build") && strcmp(stage, "search"));
        if (!strcmp(method, "exact")) {
            exact++;
            bad += bytes != 2.0 * T * 64 * 4;
        }
        beta += !strcmp(method, "pariskv") && strstr(line, "beta=0.3") != NULL;
    }
    fclose(f);
    CHECK(rows == 12 && exact == 4 && !bad, "%d rows (%d exact), %d bad", rows, exact, bad);
    CHECK(beta == 4, "pariskv rows carry beta=0.3 in params: %d of 4", beta);
    return KV_TEST_PASS;
}

int test_cli_slice_roundtrip(void) {
    const char *B = kv_test_bin();
    char path[600];
    snprintf(path, sizeof path, "%s/slice.h5", kv_test_tmpdir());
    kv_trace_info src, dst;
    CHECK_OK(kv_trace_open(DEMO, &src));
    CHECK(sh("%s slice --in %s --out %s --tokens 300 --layers %s --prefill 200", B, DEMO, path, src.layer_names[0]) == 0,
          "slice failed: %s", err);
    CHECK_OK(kv_trace_open(path, &dst));
    CHECK(dst.num_tokens == 300 && dst.prefill_len == 200 && dst.num_layers == 1 &&
          dst.layer_index[0] == src.layer_index[0] && dst.num_q_heads == src.num_q_heads &&
          dst.head_dim == src.head_dim && dst.layer_half[0] == src.layer_half[0],
          "slice attributes");
    kv_layer a, b;
    CHECK_OK(kv_trace_load_layer(&src, 0, &a));
    CHECK_OK(kv_trace_load_layer(&dst, 0, &b));
    int D = a.D, same = 1;
    for (int g = 0; g < a.Hkv && same; g++)
        same = !memcmp(a.k + (size_t)g * a.T * D, b.k + (size_t)g * b.T * D, (size_t)300 * D * sizeof(float)) &&
               (!a.v || !memcmp(a.v + (size_t)g * a.T * D, b.v + (size_t)g * b.T * D, (size_t)300 * D * sizeof(float)));
    for (int h = 0; h < a.Hq && same; h++)
        same = !memcmp(a.q + (size_t)h * a.T * D, b.q + (size_t)h * b.T * D, (size_t)300 * D * sizeof(float));
    kv_layer_free(&a);
    kv_layer_free(&b);
    CHECK(same, "sliced values differ from the source's first 300 positions");
    CHECK(sh("%s info %s", B, path) == 0 && strstr(out, "tokens (T)    300"), "info on the slice: %s", out);
    return KV_TEST_PASS;
}

/* ---- end to end on the demo trace, against a computation written here ---- */
typedef struct { float s; int i; } sc;
static int cmp_sc(const void *a, const void *b) {
    const sc *x = a, *y = b;
    return x->s != y->s ? (x->s > y->s ? -1 : 1) : x->i - y->i;
}

/* Independent metrics of one step and head for the attended set sink U
 * local U sel (double throughout). */
static void reference(const kv_layer *L, float scale, int t, int h, const int *sel, int nsel, int S, int W, int k,
                      double *recall, double *mass, double *outerr) {
    int D = L->D, T = L->T, g = h / (L->Hq / L->Hkv), n = t + 1;
    double *s = malloc(n * sizeof *s), m = -1e300, Z = 0;
    const float *q = L->q + ((size_t)h * T + t) * D;
    for (int i = 0; i < n; i++) {
        double acc = 0;
        for (int d = 0; d < D; d++) acc += (double)q[d] * L->k[((size_t)g * T + i) * D + d];
        s[i] = scale * acc;
        m = s[i] > m ? s[i] : m;
    }
    for (int i = 0; i < n; i++) Z += exp(s[i] - m);
    int lo = S, hi = t + 1 - W, nr = hi - lo, kk = k < nr ? k : nr;
    sc *r = malloc(nr * sizeof *r);
    for (int i = 0; i < nr; i++) r[i] = (sc){(float)s[lo + i], lo + i};
    qsort(r, nr, sizeof *r, cmp_sc);
    double thr = r[kk - 1].s;
    char *att = calloc(n, 1);
    for (int i = 0; i < S && i < n; i++) att[i] = 1;
    for (int i = hi; i <= t; i++) att[i] = 1;
    int hits = 0;
    for (int j = 0; j < nsel; j++) { att[sel[j]] = 1; hits += (float)s[sel[j]] >= (float)thr - 1e-6 * (1 + fabs(thr)); }
    *recall = (double)(hits < kk ? hits : kk) / kk;
    double ms = 0, wsum = 0, num = 0, den = 0, *oa = calloc(D, sizeof *oa), *of = calloc(D, sizeof *of);
    for (int i = 0; i < n; i++) {
        double p = exp(s[i] - m);
        for (int d = 0; d < D; d++) of[d] += p / Z * L->v[((size_t)g * T + i) * D + d];
        if (!att[i]) continue;
        ms += p; wsum += p;
        for (int d = 0; d < D; d++) oa[d] += p * L->v[((size_t)g * T + i) * D + d];
    }
    for (int d = 0; d < D; d++) { num += (oa[d] / wsum - of[d]) * (oa[d] / wsum - of[d]); den += of[d] * of[d]; }
    *mass = ms / Z;
    *outerr = sqrt(num / den);
    free(s); free(r); free(att); free(oa); free(of);
}

/* One end-to-end run of exact and streaming on a bundled trace, every row
 * of steps.csv checked against selections and metrics computed here. */
static int e2e_trace(const char *trace, const char *tag) {
    const char *B = kv_test_bin();
    char dir[600];
    snprintf(dir, sizeof dir, "%s/e2e-%s", kv_test_tmpdir(), tag);
    int k = 50, S = 4, W = 32;
    CHECK(sh("%s run --trace %s --method exact,streaming --k %d --sink %d --local %d --stride 23 --max-steps 12 "
             "--device cpu --out %s --force", B, trace, k, S, W, dir) == 0, "run failed: %s", err);
    CHECK(strstr(out, "exact") && strstr(out, "results: "), "summary table on stdout: %s", out);
    char p[700];
    snprintf(p, sizeof p, "%s/summary.json", dir);
    CHECK(exists(p), "summary.json written");
    snprintf(p, sizeof p, "%s/drift.csv", dir);
    FILE *f = fopen(p, "r");
    CHECK(f, "drift.csv written");
    char line[4096];
    CHECK(fgets(line, sizeof line, f) && !strncmp(line, "method,params,layer,k,seed,window,step_start,step_end,recall_mean,", 65),
          "drift header: %s", line);
    fclose(f);
    kv_trace_info in;
    CHECK_OK(kv_trace_open(trace, &in));
    kv_layer L;
    CHECK_OK(kv_trace_load_layer(&in, 0, &L));
    CHECK(L.v, "the demo trace has values");
    snprintf(p, sizeof p, "%s/steps.csv", dir);
    f = fopen(p, "r");
    CHECK(f, "steps.csv written");
    CHECK(fgets(line, sizeof line, f), "steps header");
    int rows = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        char method[64];
        int step, head;
        double recall, recall_sel, mass, outerr;
        char *c = strchr(line, ',');
        if (!c) break;
        snprintf(method, sizeof method, "%.*s", (int)(c - line), line);
        for (int i = 0; i < 3 && c; i++) c = strchr(c + 1, ','); /* layer, k, seed (issue 11) */
        if (!c) { bad++; continue; }
        if (sscanf(c + 1, "%d,%d,%lf,%lf,", &step, &head, &recall, &recall_sel) != 4) { bad++; continue; }
        char *fld = c + 1; /* fields: step head recall recall_sel cand mass outerr ... */
        for (int i = 0; i < 5; i++) fld = strchr(fld, ',') + 1;
        sscanf(fld, "%lf,%lf", &mass, &outerr);
        int sel[256], nsel = 0, G = L.Hq / L.Hkv;
        if (!strcmp(method, "streaming")) {
            for (int i = step + 1 - W - 1; i >= S && i >= step + 1 - W - k; i--) sel[nsel++] = i;
        } else { /* exact: the top-k by independent double scores */
            int lo = S, hi = step + 1 - W, nr = hi - lo;
            sc *r = malloc(nr * sizeof *r);
            for (int i = 0; i < nr; i++) {
                double acc = 0;
                for (int d = 0; d < L.D; d++)
                    acc += (double)L.q[((size_t)head * L.T + step) * L.D + d] * L.k[((size_t)(head / G) * L.T + lo + i) * L.D + d];
                r[i] = (sc){(float)(in.softmax_scale * acc), lo + i};
            }
            qsort(r, nr, sizeof *r, cmp_sc);
            for (int j = 0; j < k && j < nr; j++) sel[nsel++] = r[j].i;
            free(r);
        }
        double rr, rm, ro;
        reference(&L, in.softmax_scale, step, head, sel, nsel, S, W, k, &rr, &rm, &ro);
        if (!strcmp(method, "exact") && recall != 1.0) { fprintf(stderr, "    exact recall %g at step %d head %d\n", recall, step, head); bad++; }
        if (fabs(rr - recall) > 1e-6 || fabs(rm - mass) > 1e-4 + 1e-4 * rm || fabs(ro - outerr) > 1e-4 + 1e-3 * ro) {
            if (bad < 5) fprintf(stderr, "    %s step %d head %d: recall %g/%g mass %g/%g outerr %g/%g (kvbench/ref)\n",
                                 method, step, head, recall, rr, mass, rm, outerr, ro);
            bad++;
        }
        rows++;
    }
    fclose(f);
    kv_layer_free(&L);
    CHECK(rows == 2 * 12 * in.num_q_heads, "steps.csv has %d rows, want %d", rows, 2 * 12 * in.num_q_heads);
    CHECK(bad == 0, "%s: %d rows disagree with the independent computation", trace, bad);
    return KV_TEST_PASS;
}

/* Both bundled traces: the 0.5B model's (64-dim heads, GQA 7) and the 1.5B's (128-dim heads, GQA 6). */
int test_e2e_demo_trace(void) {
    if (e2e_trace(DEMO, "0.5b") != KV_TEST_PASS) return KV_TEST_FAIL;
    return e2e_trace("datasets/demo-1.5b.h5", "1.5b");
}

int test_results_atomic_on_failure(void) {
    const char *B = kv_test_bin(), *tmp = kv_test_tmpdir();
    char nan[600], dir[600];
    snprintf(nan, sizeof nan, "%s/nan_run.h5", tmp);
    snprintf(dir, sizeof dir, "%s/atomic_out", tmp);
    kv_test_write_nan_trace(nan);
    int rc = sh("%s run --trace %s --method exact --out %s", B, nan, dir);
    CHECK(rc == 2 && strstr(err, "non-finite value"), "NaN trace: exit %d, %s", rc, err);
    CHECK(!exists(dir), "a failed run left %s", dir);
    DIR *d = opendir(tmp);
    struct dirent *e;
    int leftovers = 0;
    while ((e = readdir(d))) leftovers += strstr(e->d_name, "atomic_out.tmp") != NULL;
    closedir(d);
    CHECK(leftovers == 0, "temporary result directories left behind");
    /* an existing result is not overwritten without --force */
    CHECK(sh("%s run --trace %s --method streaming --max-steps 3 --out %s", B, DEMO, dir) == 0, "first run: %s", err);
    rc = sh("%s run --trace %s --method exact --max-steps 3 --out %s", B, DEMO, dir);
    CHECK(rc == 2 && strstr(err, "already exists"), "second run without --force: exit %d: %s", rc, err);
    char p[700];
    snprintf(p, sizeof p, "%s/summary.json", dir);
    FILE *f = fopen(p, "r");
    CHECK(f, "summary kept");
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    CHECK(strstr(buf, "\"streaming\"") && !strstr(buf, "\"exact\""), "the earlier result was modified");
    return KV_TEST_PASS;
}

int test_dump_trace_tiny_models(void) {
    const char *py = exists(".venv/bin/python") ? ".venv/bin/python" : "python3";
    int rc = sh("KVBENCH_BIN=%s %s tests/test_dump_trace.py", kv_test_bin(), py);
    if (rc == 77) {
        char *last = strrchr(out, '\n');
        while (last && last > out && last[1] == 0) { *last = 0; last = strrchr(out, '\n'); }
        kv_test_skip_reason("%s", last ? last + 1 : out);
        return KV_TEST_SKIP;
    }
    fputs(out, stdout);
    CHECK(rc == 0, "tests/test_dump_trace.py exit %d:\n%s\n%s", rc, out, err);
    return KV_TEST_PASS;
}

/* scripts/ablate.py (standard library only) against direct kvbench runs: tests/test_ablate.py. */
int test_ablate_script(void) {
    int rc = sh("KVBENCH_BIN=%s python3 tests/test_ablate.py", kv_test_bin());
    fputs(out, stdout);
    CHECK(rc == 0, "tests/test_ablate.py exit %d:\n%s\n%s", rc, out, err);
    return KV_TEST_PASS;
}

/* issue 11: several budgets/layers/seeds in one run vs the single runs, and scripts/sweep.py (tests/test_sweep.py) */
int test_run_multi_k_layer_seed_equals_single(void) {
    int rc = sh("KVBENCH_BIN=%s python3 tests/test_sweep.py multi", kv_test_bin());
    fputs(out, stdout);
    CHECK(rc == 0, "tests/test_sweep.py multi exit %d:\n%s\n%s", rc, out, err);
    return KV_TEST_PASS;
}

/* issue 12, goal 6: the run loop's speed work changes no number: steps.csv,
 * drift.csv and summary.json's metrics on a slice of the demo trace (all
 * twelve demo methods, two budgets) equal, byte for byte, the reference the
 * binary of main at 21e04c7 plus the method-side changes wrote before the
 * run-loop work (9d51ffe, aadf90a, 61341f7 merged; tests/golden/run-cpu;
 * scripts/golden_run.py). Run with one and with two threads: the parallel
 * loop must give the serial loop's numbers. */
int test_run_golden_cpu(void) {
    for (int th = 1; th <= 2; th++) {
        int rc = sh("python3 scripts/golden_run.py check %s tests/golden/run-cpu --device cpu --threads %d",
                    kv_test_bin(), th);
        fputs(out, stdout);
        CHECK(rc == 0, "scripts/golden_run.py check (--threads %d) exit %d:\n%s\n%s", th, rc, out, err);
    }
    return KV_TEST_PASS;
}

/* The same on the GPU against tests/golden/run-gpu, which only a GPU
 * machine can write (scripts/golden_run.py make BASE_BIN DIR --device gpu;
 * the committed one: scripts/golden_run.py's docstring says from what). */
int test_run_golden_gpu(void) {
    const char *dir = getenv("KVBENCH_GOLDEN_GPU") ? getenv("KVBENCH_GOLDEN_GPU") : "tests/golden/run-gpu";
    char path[1024];
    snprintf(path, sizeof path, "%s/steps.csv.gz", dir);
    if (!exists(path)) {
        kv_test_skip_reason("no GPU reference %s (scripts/golden_run.py make OLD_BIN %s --device gpu)", path, dir);
        return KV_TEST_SKIP;
    }
    /* the queued searches (the default, kv_method.search_launch) and the synchronous ones (KVBENCH_RUN_QUEUE=0) */
    for (int q = 1; q >= 0; q--) {
        int rc = sh("%spython3 scripts/golden_run.py check %s %s --device gpu", q ? "" : "KVBENCH_RUN_QUEUE=0 ",
                    kv_test_bin(), dir);
        fputs(out, stdout);
        CHECK(rc == 0, "scripts/golden_run.py check --device gpu%s exit %d:\n%s\n%s", q ? "" : " (KVBENCH_RUN_QUEUE=0)",
              rc, out, err);
    }
    return KV_TEST_PASS;
}

/* Issue 12 goal 1: with one budget every GPU method with search_launch is queued (summary.json "search_timer":
 * "device"), and the run's files equal, byte for byte, those of the synchronous searches (KVBENCH_RUN_QUEUE=0,
 * "host"); the methods off the GPU or without search_launch keep the host timer either way. */
int test_run_queued_equals_sync_gpu(void) {
    const char *B = kv_test_bin(), *tmp = kv_test_tmpdir();
    const char *ms = "exact,pariskv,pqcache,quest,magicpig,csattention,ctkvr,freekv,streaming";
    for (int q = 0; q < 2; q++) {
        int rc = sh("%s%s run --trace " DEMO " --method %s --k 64 --stride 30 --max-steps 40 --device gpu --out %s/q%d "
                    "--quiet", q ? "" : "KVBENCH_RUN_QUEUE=0 ", B, ms, tmp, q);
        CHECK(rc == 0, "run (queue %d): exit %d: %s", q, rc, err);
    }
    CHECK(sh("cmp %s/q0/steps.csv %s/q1/steps.csv && cmp %s/q0/drift.csv %s/q1/drift.csv", tmp, tmp, tmp, tmp) == 0,
          "queued and synchronous runs differ: %s%s", out, err);
    const char *dev[] = {"exact", "pariskv", "pqcache", "quest", "magicpig", "csattention", "ctkvr"},
               *host[] = {"freekv", "streaming"};
    for (int q = 0; q < 2; q++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/q%d/summary.json", tmp, q);
        FILE *f = fopen(path, "r");
        CHECK(f, "%s missing", path);
        static char buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
        const int nd = (int)(sizeof dev / sizeof *dev), nh = (int)(sizeof host / sizeof *host);
        for (int i = 0; i < nd + nh; i++) {
            const char *m = i < nd ? dev[i] : host[i - nd], *want = q && i < nd ? "device" : "host";
            char key[64];
            snprintf(key, sizeof key, "\"method\": \"%s\"", m);
            const char *at = strstr(buf, key), *tm = at ? strstr(at, "\"search_timer\": \"") : NULL;
            CHECK(tm, "%s: no record of %s with a search_timer", path, m);
            CHECK(!strncmp(tm + 17, want, strlen(want)), "%s: %s's search_timer is %.8s, want %s", path, m, tm + 17, want);
        }
    }
    return KV_TEST_PASS;
}

int test_sweep_script(void) {
    int rc = sh("KVBENCH_BIN=%s python3 tests/test_sweep.py sweep", kv_test_bin());
    fputs(out, stdout);
    CHECK(rc == 0, "tests/test_sweep.py sweep exit %d:\n%s\n%s", rc, out, err);
    return KV_TEST_PASS;
}

/* the Slurm backend on a single-node cluster the test starts itself (tests/test_slurm.py; exit 77 = skip) */
int test_sweep_slurm_array(void) {
    int rc = sh("KVBENCH_BIN=%s timeout 900 python3 tests/test_slurm.py", kv_test_bin());
    if (rc == 77) {
        char *why = strstr(out, "skipped: ");
        kv_test_skip_reason("%s", why ? why + 9 : "tests/test_slurm.py skipped");
        return KV_TEST_SKIP;
    }
    fputs(out, stdout);
    CHECK(rc == 0, "tests/test_slurm.py exit %d:\n%s\n%s", rc, out, err);
    return KV_TEST_PASS;
}

/* the Pareto front of a hand-made point set, log interpolation, AUC (scripts/pareto.py) */
int test_pareto_front_hand_case(void) {
    int rc = sh("python3 tests/test_sweep.py pareto");
    fputs(out, stdout);
    CHECK(rc == 0, "tests/test_sweep.py pareto exit %d:\n%s\n%s", rc, out, err);
    return KV_TEST_PASS;
}
