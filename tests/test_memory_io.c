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

#include "../cli/protocol.h"
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
    /* host (cli/memory.c), T 3000, P 2000, Hq 4, Hkv 2, D 32, with v, float32 layer (the CPU path), 1 budget,
     * the profile on, 1000 steps, exact and quest on the CPU (one list per q head each):
     *   layer 4*(4+2*2)*3000*32 + decode rows set aside 4*8*(3000-2000)*32
     *   + 2 instances x (4*2*3000*32 + 4*4*3000)
     *   + selections 2 x 4*3000*(3*4 + 2)
     *   + the oracle's scores, scratch and softmax terms 16*4*3000, sorted regions 4*4*3000, radix buffer 4*4*3000
     *   + rows 2 records x 1000 steps x 4 heads x 52 bytes (kv_step_metric: 13 words) */
    long long layer = 4LL * 8 * 3000 * 32, prefix = 4LL * 8 * 1000 * 32, per = 4LL * 2 * 3000 * 32 + 4LL * 4 * 3000;
    long long sel = 2 * 4LL * 3000 * (3 * 4 + 2), orc = 16LL * 4 * 3000 + 4LL * 4 * 3000 + 4LL * 4 * 3000;
    long long rows = 2LL * 1000 * 4 * 52;
    CHECK(sizeof(kv_step_metric) == 52, "kv_step_metric is %zu bytes; the formula here assumes 52", sizeof(kv_step_metric));
    long long need = layer + prefix + 2 * per + sel + orc + rows;
    int rc = sh("KVBENCH_MEM_LIMIT=%lld '%s' run --trace '%s' --method exact,quest --out '%s/mem-out' --force --quiet",
                need - 1, B, tr, tmp);
    CHECK(rc == 2, "exit %d (want 2); stderr: %s", rc, err);
    char want[128];
    snprintf(want, sizeof want, "needs %lld bytes", need);
    CHECK(strstr(err, want), "message lacks '%s': %s", want, err);
    snprintf(want, sizeof want, "%lld bytes", need - 1);
    CHECK(strstr(err, want) && strstr(err, "available") && strstr(err, tr), "message lacks the available bytes: %s", err);
    CHECK(!strstr(out, "results:"), "ran anyway");
    rc = sh("KVBENCH_MEM_LIMIT=%lld '%s' run --trace '%s' --method exact,quest --out '%s/mem-out' --force "
            "--quiet", need, B, tr, tmp);
    CHECK(rc == 0, "at exactly the needed bytes: exit %d: %s", rc, err);
    /* --no-profile: the sorted regions and the radix buffer are not needed */
    long long need_np = need - 2 * 4LL * 4 * 3000;
    rc = sh("KVBENCH_MEM_LIMIT=%lld '%s' run --trace '%s' --method exact,quest --no-profile --out '%s/mem-out' --force "
            "--quiet", need_np - 1, B, tr, tmp);
    snprintf(want, sizeof want, "needs %lld bytes", need_np);
    CHECK(rc == 2 && strstr(err, want), "--no-profile: exit %d, want 2 and '%s': %s", rc, want, err);
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
 * the oracle's K and V as float16 + its scores + the profile's device sort keys (16 Hq T) + exact's
 * score rows (exact reads the oracle's K: no keys of its own): exit 2 naming the bytes. */
int test_run_memory_preflight_gpu(void) {
    const char *B = kv_test_bin(), *tmp = kv_test_tmpdir();
    char tr[600];
    snprintf(tr, sizeof tr, "%s/memg.h5", tmp);
    CHECK(sh("'%s' synth --out '%s' --tokens 3000 --prefill 2000 --q-heads 4 --kv-heads 2 --dim 32 --force", B, tr) == 0,
          "synth: %s", err);
    long long T = 3000, D = 32, Hq = 4, Hkv = 2;
    long long need = 2 * 2 * Hkv * T * D + 4 * Hq * T + 16 * Hq * T + 4 * Hq * T;
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

/* Issue 12 goal 3: the layer's float16 form changes no result. The same run with the layer held as float16
 * (KVBENCH_LAYER=f16: on the CPU path the indexes are built from it, every method without prefill_half
 * from float32 copies of only the arrays its prefill_reads names, then it is widened for the oracle; on the
 * GPU path, the default, it stays float16 throughout: the oracle, exact and quest upload it as it is, rows
 * and the protocol's value rows are converted per use) and as float32 (KVBENCH_LAYER=f32): steps.csv,
 * drift.csv and summary.json without timings bit for bit the same. */
static int layer_form_case(const char *device, const char *methods, const char *tag) {
    const char *B = kv_test_bin(), *tmp = kv_test_tmpdir();
    static const char *traces[2] = {"datasets/demo.h5", "datasets/demo-1.5b.h5"};
    for (int i = 0; i < 2; i++) {
        for (int m = 0; m < 2; m++) {
            int rc = sh("KVBENCH_LAYER=%s '%s' run --trace %s --method %s --device %s --stride 3 --max-steps 40 --k 50,100 "
                        "--out '%s/lf-%s-%d-%d' --force --quiet", m ? "f32" : "f16", B, traces[i], methods, device, tmp,
                        tag, i, m);
            CHECK(rc == 0, "%s (layer %s): exit %d: %s", traces[i], m ? "f32" : "f16", rc, err);
        }
        CHECK(sh("cmp '%s/lf-%s-%d-0/steps.csv' '%s/lf-%s-%d-1/steps.csv'", tmp, tag, i, tmp, tag, i) == 0,
              "%s: steps.csv differ between the float16 and float32 forms: %s", traces[i], out);
        CHECK(sh("cmp '%s/lf-%s-%d-0/drift.csv' '%s/lf-%s-%d-1/drift.csv'", tmp, tag, i, tmp, tag, i) == 0,
              "%s: drift.csv differ: %s", traces[i], out);
        for (int m = 0; m < 2; m++)
            CHECK(sh("cat '%s/lf-%s-%d-%d/summary.json' | %s > '%s/lf-%s-%d-%d.json'", tmp, tag, i, m, strip, tmp, tag, i,
                     m) == 0, "strip");
        CHECK(sh("diff '%s/lf-%s-%d-0.json' '%s/lf-%s-%d-1.json'", tmp, tag, i, tmp, tag, i) == 0 && strlen(out) == 0,
              "%s: summary.json metrics differ: %s", traces[i], out);
    }
    return KV_TEST_PASS;
}

int test_run_layer_form_invariant(void) {
    return layer_form_case("cpu", "exact,quest,streaming,random,pariskv,pqcache,magicpig,csattention,ctkvr,freekv,racc,"
                           "sampled", "cpu");
}

int test_run_layer_form_invariant_gpu(void) {
    return layer_form_case("gpu", "exact,quest,streaming,random,pariskv,pqcache,magicpig,csattention,ctkvr,freekv,racc",
                           "gpu");
}

/* Issue 12 goal 3: every method with prefill_half builds the same index from the layer's float16 form (in place,
 * row stride T > P) as from float32 copies of the same float16-exact values. P = 20000 spans three of the
 * GPU builds' widening chunks (KV_HOST_ROWS_CHUNK = 8192 positions, kv_rows_walk: ParisKV, PQCache, MagicPIG);
 * the selections (indices, counts, log-weights) of four steps must be equal. On the CPU the float16 form is
 * widened once; on the GPU a chunk at a time. */
static int prefill_half_case(int use_gpu) {
    enum { T = 20064, P = 20000, Hq = 4, Hkv = 2, D = 64, K = 40 };
    CHECK(P > 2 * KV_HOST_ROWS_CHUNK, "P = %d no longer spans three widening chunks of %d", P, KV_HOST_ROWS_CHUNK);
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(T, P, Hq, Hkv, D, kv_test_seed(), &L));
    float *arr[3] = {L.q, L.k, L.v};
    size_t len[3] = {(size_t)Hq * T * D, (size_t)Hkv * T * D, (size_t)Hkv * T * D};
    for (int a = 0; a < 3; a++)
        for (size_t i = 0; i < len[a]; i++) arr[a][i] = kv_half_to_float(kv_float_to_half(arr[a][i]));
    int n_ms, tested = 0;
    const kv_method *const *ms = kv_methods(&n_ms);
    for (int i = 0; i < n_ms; i++) {
        const kv_method *m = ms[i];
        if (!m->prefill_half || (use_gpu && !m->has_gpu)) continue;
        kv_test_driver a, b;
        kv_status sa = use_gpu ? kv_test_driver_open_gpu(&a, m->name, NULL, 0, &L, P, 4, 16, K)
                               : kv_test_driver_open(&a, m->name, NULL, 0, &L, P, 4, 16, K);
        CHECK(sa == KV_OK, "%s: build from float32: %s", m->name, kv_last_error());
        CHECK(kv_test_driver_open_half(&b, m->name, NULL, 0, &L, P, 4, 16, K, use_gpu) == KV_OK,
              "%s: build from float16: %s", m->name, kv_last_error());
        for (int t = P; t < P + 4; t++) {
            CHECK_OK(kv_test_driver_step(&a, t, K));
            CHECK_OK(kv_test_driver_step(&b, t, K));
            for (int l = 0; l < a.sel.n_lists; l++) {
                int n = a.sel.count[l];
                CHECK(n == b.sel.count[l], "%s step %d list %d: %d selected from float32, %d from float16", m->name, t,
                      l, n, b.sel.count[l]);
                CHECK(!memcmp(a.sel.idx + (size_t)l * a.sel.cap, b.sel.idx + (size_t)l * b.sel.cap, (size_t)n * 4),
                      "%s step %d list %d: the selections differ between the two forms", m->name, t, l);
                const float *wa = a.sel.logw + (size_t)l * a.sel.cap, *wb = b.sel.logw + (size_t)l * b.sel.cap;
                CHECK(!m->uses_logw || !memcmp(wa, wb, (size_t)n * 4),
                      "%s step %d list %d: the log-weights differ between the two forms", m->name, t, l);
            }
        }
        kv_test_driver_close(&a);
        kv_test_driver_close(&b);
        tested++;
    }
    kv_layer_free(&L);
    CHECK(tested >= (use_gpu ? 5 : 7), "only %d methods tested: exact, quest, pariskv, pqcache, magicpig (and random, "
          "streaming on the CPU) declare prefill_half", tested);
    return KV_TEST_PASS;
}

int test_prefill_half_equals_float32(void) { return prefill_half_case(0); }
int test_prefill_half_equals_float32_gpu(void) { return prefill_half_case(1); }

/* The largest context that fits (the README's statement, issue 12 goal 3), from the preflight's own formula
 * (cli/memory.c) for the default shape: 16 q and 8 kv heads, D 128, q/k/v float16 with values, 8192 decode
 * steps (P = T - 8192), every step evaluated, one budget, the profile on, on the GPU (the layer held as
 * float16). Machines: the lent H100 (80e9 bytes of GPU memory, 128e9 of host) and any other given by
 * KVBENCH_FIT_GPU_BYTES / KVBENCH_FIT_HOST_BYTES. The formula's monotonicity and one value computed here by
 * hand are checked; the numbers are printed for the README. */
#include <math.h>

#include "../cli/memory.h"

static void fit_print(const char *set, const char *methods, double host, double gpu) {
    const kv_method *ms[32];
    int n = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", methods);
    for (char *t = strtok(buf, ","); t && n < 32; t = strtok(NULL, ","))
        if ((ms[n] = kv_method_find(t))) n++;
    kv_mem_shape s = {.Hq = 16, .Hkv = 8, .D = 128, .has_v = 1, .f16_trace = 1, .k_half = 1, .layer_f16 = 1,
                      .use_gpu = 1, .nk = 1, .profile = 1};
    kv_mem_need at;
    double T = kv_mem_largest_context(s, ms, n, 8192, host, gpu, &at);
    printf("    fit %s (%s) on %.0f GB GPU / %.0f GB host: T = %.0f tokens (%.2fM); host %.2f GB (layer %.2f, prefill "
           "%.2f, CPU methods %.2f, selections %.2f, oracle %.2f, rows %.2f), GPU %.2f GB (oracle %.2f, methods %.2f)\n",
           set, methods, gpu / 1e9, host / 1e9, T, T / 1048576.0, at.host / 1e9, at.layer / 1e9, at.prefill / 1e9,
           at.methods / 1e9, at.selections / 1e9, at.oracle / 1e9, at.rows / 1e9, at.dev / 1e9, at.dev_oracle / 1e9,
           at.dev_methods / 1e9);
}

int test_run_memory_largest_context(void) {
    /* by hand: exact alone on the GPU at T = 1048576, P = T - 8192, 8192 steps:
     * host: layer 2*(16+16)*T*128, no prefill copy (exact takes the float16 form), no CPU method,
     * selections 4*T*(3*16 + 8), oracle 4*16*T (pinned scores) + 4*16*T (sorted) + 4*16*T (radix),
     * rows 1 x 8192 x 16 x 52; device: oracle 2*2*8*T*128 + 4*16*T + 16*16*T (the profile's device sort keys),
     * exact 4*16*T (it reads the oracle's K) */
    const kv_method *ex = kv_method_find("exact");
    CHECK(ex, "no exact");
    double T = 1048576, P = T - 8192;
    kv_mem_shape s = {.Hq = 16, .Hkv = 8, .T = T, .P = P, .D = 128, .has_v = 1, .f16_trace = 1, .k_half = 1,
                      .layer_f16 = 1, .use_gpu = 1, .nk = 1, .profile = 1, .steps = 8192};
    kv_mem_add_method(&s, ex, 1, 1, 1);
    kv_mem_need n;
    kv_mem_estimate(&s, &n);
    double host = 2 * 32 * T * 128 + 4 * T * (3 * 16 + 8) + 3 * 4 * 16 * T + 8192.0 * 16 * 52;
    double dev = 2 * 2 * 8 * T * 128 + 4 * 16 * T + 16 * 16 * T + 4 * 16 * T;
    CHECK(n.host == host && n.dev == dev, "exact at 1M: host %.0f (want %.0f), device %.0f (want %.0f)", n.host, host,
          n.dev, dev);
    CHECK(n.layer == 2 * 32 * T * 128 && n.prefill == 0, "layer %.0f, prefill %.0f", n.layer, n.prefill);
    /* pariskv takes the float16 form (no host prefill) but holds K on the device: 2*8*T*128 + 4*16*T more there;
     * csattention needs K and Q widened for its build: 4 P D (Hkv + Hq) more on the host */
    kv_mem_add_method(&s, kv_method_find("pariskv"), 1, 1, 1);
    kv_mem_estimate(&s, &n);
    CHECK(n.prefill == 0 && n.dev == dev + 2 * 8 * T * 128 + 4 * 16 * T, "pariskv: prefill %.0f (want 0), device %.0f",
          n.prefill, n.dev);
    kv_mem_add_method(&s, kv_method_find("csattention"), 1, 1, 1);
    kv_mem_estimate(&s, &n);
    CHECK(n.prefill == 4 * P * 128 * (8 + 16), "csattention: prefill %.0f, want K and Q widened %.0f", n.prefill,
          4 * P * 128 * (8 + 16));
    double gpu = kv_env_bytes("KVBENCH_FIT_GPU_BYTES"), hostb = kv_env_bytes("KVBENCH_FIT_HOST_BYTES");
    static const char *sets[2][2] = {{"issue 12's 7 methods", "exact,pariskv,pqcache,quest,magicpig,streaming,random"},
                                     {"make demo's 12", "exact,pariskv,csattention,ctkvr,freekv,racc,pqcache,quest,"
                                                        "magicpig,streaming,random,sampled"}};
    for (int i = 0; i < 2; i++) {
        fit_print(sets[i][0], sets[i][1], 128e9, 80e9);
        if (gpu > 0 && hostb > 0) fit_print(sets[i][0], sets[i][1], hostb, gpu);
    }
    return KV_TEST_PASS;
}
