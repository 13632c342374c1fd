/* test_core.c: unit tests of the shared primitives: half floats,
 * percentiles, the top-k reference against a sort, the parameter tables'
 * validation, synth determinism, the exact retriever against a brute
 * force written here, that the kernels make their streams in one way, and
 * that the tests' environment helper gives back what a run had set. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../datasets/kv_trace.h"
#include "../kernels/ops/score.h"
#include "../kernels/ops/topk.h"
#include "../retrievers/kv_retriever.h"
#include "kv_test.h"

/* kv_test_env_set / _restore (tests/util.c): a value set or unset for a stretch of a test gives way to the run's own
 * afterwards (device_check.sh runs the tests under its variants' variables), and an unset one stays unset. */
int test_env_set_restores(void) {
    static const char name[] = "KVBENCH_TEST_ENV_PROBE";
    CHECK(!getenv(name), "%s set before the test", name);
    kv_test_env run, e;
    kv_test_env_set(&run, name, "run"); /* as a run's variant would have it */
    kv_test_env_set(&e, name, "x");
    CHECK(getenv(name) && !strcmp(getenv(name), "x"), "set: %s", getenv(name) ? getenv(name) : "(unset)");
    kv_test_env_restore(&e);
    CHECK(getenv(name) && !strcmp(getenv(name), "run"), "restored: %s", getenv(name) ? getenv(name) : "(unset)");
    kv_test_env_set(&e, name, NULL);
    CHECK(!getenv(name), "unset: %s", getenv(name));
    kv_test_env_restore(&e);
    CHECK(getenv(name) && !strcmp(getenv(name), "run"), "restored after unset: %s", getenv(name) ? getenv(name) : "(unset)");
    kv_test_env_restore(&run);
    CHECK(!getenv(name), "unset again: %s", getenv(name));
    return KV_TEST_PASS;
}

int test_common_half_roundtrip(void) {
    /* every finite half converts to float and back to itself */
    for (uint32_t u = 0; u < 65536; u++) {
        if (((u >> 10) & 0x1f) == 0x1f) continue; /* inf / nan */
        float f = kv_half_to_float((uint16_t)u);
        CHECK(kv_float_to_half(f) == u, "half 0x%04x -> %g -> 0x%04x", u, f, kv_float_to_half(f));
    }
    CHECK(kv_half_to_float(0x3c00) == 1.0f, "0x3c00 is 1.0");
    CHECK(kv_half_to_float(0xc000) == -2.0f, "0xc000 is -2.0");
    CHECK(kv_half_to_float(0x0001) == 5.9604645e-08f, "smallest subnormal");
    CHECK(kv_float_to_half(1.0f + 1.0f / 4096) == 0x3c00, "round to nearest even (down)");
    CHECK(kv_float_to_half(65520.f) == 0x7c00, "overflow to inf");
    return KV_TEST_PASS;
}

static int cmp_asc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int test_common_percentile(void) {
    /* random arrays with many ties against the definition on a sorted copy */
    kv_rng r;
    kv_rng_seed(&r, 7);
    static const double qs[] = {0, 0.1, 0.5, 0.9, 0.999, 1};
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + (int)(kv_rng_uniform(&r) * 400), ties = trial % 3;
        float *v = malloc(n * sizeof *v), *w = malloc(n * sizeof *w);
        for (int i = 0; i < n; i++) w[i] = ties ? (float)(int)(kv_rng_normal(&r) * 3) : (float)kv_rng_normal(&r);
        qsort(w, (size_t)n, sizeof *w, cmp_asc);
        for (int j = 0; j < 6; j++) {
            for (int i = 0; i < n; i++) v[i] = w[((long)i * 7919 + trial) % n]; /* a permutation (7919 is prime, > n) */
            double pos = qs[j] * (n - 1), want;
            size_t lo = (size_t)pos;
            want = lo + 1 >= (size_t)n ? w[n - 1] : w[lo] + (pos - (double)lo) * (w[lo + 1] - w[lo]);
            double got = kv_percentile_inplace(v, (size_t)n, qs[j]);
            if (got != want) { free(v); free(w); }
            CHECK(got == want, "trial %d n=%d q=%g: %.9g, want %.9g", trial, n, qs[j], got, want);
        }
        free(v); free(w);
    }
    float v[5] = {5, 1, 4, 2, 3};
    CHECK_CLOSE(kv_percentile_inplace(v, 5, 0.5), 3.0, 0, 0);
    CHECK_CLOSE(kv_percentile_inplace(v, 5, 0.1), 1.4, 1e-6, 0); /* 1 + 0.4*(2-1) */
    CHECK_CLOSE(kv_percentile_inplace(v, 5, 0.9), 4.6, 1e-6, 0);
    float one = 7;
    CHECK_CLOSE(kv_percentile_inplace(&one, 1, 0.1), 7.0, 0, 0);
    return KV_TEST_PASS;
}

typedef struct { float s; int i; } scored;
static int cmp_scored(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return x->i - y->i;
}

static int cmp_desc_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* kv_kth_largest_ref (radix select from 512 scores up, quickselect below):
 * its value is the k-th of a full descending sort and its scratch's first k
 * are the k largest and the whole scratch a permutation of the scores, on continuous scores, heavy ties, signed zeros and
 * negatives, at sizes around the switch and far above it. */
int test_kth_largest_matches_sort(void) {
    kv_rng r;
    kv_rng_seed(&r, 29);
    int sizes[] = {511, 512, 4099, 70000};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int dist = 0; dist < 3; dist++) {
            int n = sizes[si];
            float *s = malloc(n * sizeof *s), *srt = malloc(n * sizeof *srt), *a = malloc(n * sizeof *a);
            for (int i = 0; i < n; i++) {
                float u = kv_rng_uniform(&r);
                s[i] = dist == 0 ? (u - 0.5f) * 37.0f * kv_rng_uniform(&r)             /* continuous */
                     : dist == 1 ? (float)(int)(u * 9) - 4                              /* heavy ties */
                                 : (u < 0.3f ? -0.0f : u < 0.6f ? 0.0f : -u * 1e-30f); /* zeros, tiny negatives */
            }
            memcpy(srt, s, n * sizeof *s);
            qsort(srt, n, sizeof *srt, cmp_desc_f);
            int ks[] = {1, 2, 100, 512, n / 2, n};
            for (size_t ki = 0; ki < 6; ki++) {
                int k = ks[ki] < n ? ks[ki] : n;
                float got = kv_kth_largest_ref(s, n, k, a);
                CHECK(got == srt[k - 1], "n=%d dist=%d k=%d: %g, want %g", n, dist, k, got, srt[k - 1]);
                qsort(a, k, sizeof *a, cmp_desc_f); /* the k largest first, then the rest: a permutation */
                qsort(a + k, n - k, sizeof *a, cmp_desc_f);
                for (int j = 0; j < n; j++)
                    CHECK(a[j] == srt[j], "n=%d dist=%d k=%d: top[%d] %g, want %g", n, dist, k, j, a[j], srt[j]);
            }
            free(s); free(srt); free(a);
        }
    return KV_TEST_PASS;
}

int test_topk_ref_matches_sort(void) {
    kv_rng r;
    kv_rng_seed(&r, 11);
    int sizes[] = {1, 7, 100, 101, 1000, 4099};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int n = sizes[si];
        float *s = malloc(n * sizeof *s);
        scored *ref = malloc(n * sizeof *ref);
        int32_t *idx = malloc((n + 5) * sizeof *idx);
        float *val = malloc((n + 5) * sizeof *val);
        for (int i = 0; i < n; i++) { s[i] = (float)(int)(kv_rng_uniform(&r) * 20) - 5; ref[i] = (scored){s[i], i}; }
        qsort(ref, n, sizeof *ref, cmp_scored);
        int ks[] = {1, 3, 100, n, n + 5};
        for (size_t ki = 0; ki < 5; ki++) {
            int k = ks[ki], c = kv_topk_ref(s, n, k, 10, idx, val), want = k < n ? k : n;
            CHECK(c == want, "n=%d k=%d: count %d, want %d", n, k, c, want);
            for (int j = 0; j < c; j++) {
                CHECK(idx[j] == ref[j].i + 10, "n=%d k=%d rank %d: index %d, want %d", n, k, j, idx[j], ref[j].i + 10);
                CHECK(val[j] == ref[j].s, "n=%d k=%d rank %d: value", n, k, j);
            }
        }
        free(s); free(ref); free(idx); free(val);
    }
    return KV_TEST_PASS;
}

/* issue 12: kv_topk_ref's quickselect route and its heap route give the
 * same indices and values (continuous scores, heavy ties, signed zeros). */
int test_topk_routes_agree(void) {
    kv_rng r;
    kv_rng_seed(&r, 13);
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + (int)(kv_rng_uniform(&r) * 5000), k = 1 + (int)(kv_rng_uniform(&r) * (trial % 3 ? n / 4 + 1 : n));
        int kind = trial % 3;
        float *s = malloc(n * sizeof *s), *v1 = malloc(n * sizeof *s), *v2 = malloc(n * sizeof *s);
        int32_t *i1 = malloc(n * sizeof *i1), *i2 = malloc(n * sizeof *i2);
        for (int i = 0; i < n; i++) {
            float x = (float)kv_rng_normal(&r);
            s[i] = kind == 0 ? x : kind == 1 ? (float)(int)(x * 3) : (x > 0.5f ? 0.0f : x > -0.5f ? -0.0f : x);
        }
        int c1 = kv_topk_ref(s, n, k, 3, i1, v1), c2 = kv_topk_heap_ref(s, n, k, 3, i2, v2);
        CHECK(c1 == c2, "n=%d k=%d: counts %d vs %d", n, k, c1, c2);
        for (int j = 0; j < c1; j++) {
            CHECK(i1[j] == i2[j], "n=%d k=%d kind %d rank %d: index %d vs heap %d", n, k, kind, j, i1[j], i2[j]);
            CHECK(memcmp(&v1[j], &v2[j], sizeof(float)) == 0, "n=%d k=%d rank %d: value bits differ", n, k, j);
        }
        free(s); free(v1); free(v2); free(i1); free(i2);
    }
    return KV_TEST_PASS;
}

int test_topk_kth_largest(void) {
    kv_rng r;
    kv_rng_seed(&r, 12);
    for (int trial = 0; trial < 50; trial++) {
        int n = 1 + (int)(kv_rng_uniform(&r) * 300), k = 1 + (int)(kv_rng_uniform(&r) * n);
        float *s = malloc(n * sizeof *s), *scratch = malloc(n * sizeof *s), *sorted = malloc(n * sizeof *s);
        for (int i = 0; i < n; i++) sorted[i] = s[i] = (float)(int)(kv_rng_normal(&r) * 4);
        qsort(sorted, (size_t)n, sizeof *sorted, cmp_asc);
        float got = kv_kth_largest_ref(s, n, k, scratch), want = sorted[n - k];
        free(s); free(scratch); free(sorted);
        CHECK(got == want, "trial %d n=%d k=%d: %g, want %g", trial, n, k, got, want);
    }
    return KV_TEST_PASS;
}

static const kv_param_spec test_spec[] = {
    {"beta", KV_PARAM_FLOAT, KV_PARAM_SEARCH, 0.1, 0, 1, NULL, "fraction"},
    {"update", KV_PARAM_INT, KV_PARAM_BUILD, 256, 1, 4096, NULL, "interval"},
    {"centroids", KV_PARAM_ENUM, KV_PARAM_BUILD, 0, 0, 0, "analytic|kmeans", "kind"},
    {NULL},
};

int test_params_validation(void) {
    kv_param_set ps;
    kv_params_init(&ps, test_spec);
    CHECK(ps.n == 3 && kv_param(&ps, "beta") == 0.1 && kv_param_int(&ps, "update") == 256, "defaults");
    CHECK(!kv_param_is_set(&ps, "beta"), "not set yet");
    CHECK_OK(kv_params_set(&ps, "m", "beta=0.25"));
    CHECK(kv_param(&ps, "beta") == 0.25 && kv_param_is_set(&ps, "beta"), "beta set");
    CHECK_OK(kv_params_set(&ps, "m", "centroids=kmeans"));
    CHECK(kv_param_int(&ps, "centroids") == 1, "enum index");
    struct { const char *a, *needle; } bad[] = {
        {"beta=2", "[0, 1]"},          {"beta=x", "expected a number"}, {"update=1.5", "integer"},
        {"update=0", "[1, 4096]"},     {"gamma=1", "no such parameter"}, {"centroids=lsh", "analytic|kmeans"},
        {"beta", "name=value"},        {"beta=nan", "expected a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kv_status st = kv_params_set(&ps, "m", bad[i].a);
        CHECK(st == KV_ERR_INPUT, "'%s' accepted", bad[i].a);
        CHECK(strstr(kv_last_error(), bad[i].needle), "'%s': message '%s' lacks '%s'", bad[i].a, kv_last_error(), bad[i].needle);
    }
    kv_params_set(&ps, "m", "gamma=1");
    CHECK(strstr(kv_last_error(), "beta=float in [0, 1], update=int in [1, 4096], centroids=analytic|kmeans"),
          "unknown name lists the accepted parameters: %s", kv_last_error());
    char buf[256];
    kv_params_format(&ps, buf, sizeof buf);
    CHECK(!strcmp(buf, "beta=0.25,update=256,centroids=kmeans"), "format: %s", buf);
    /* every registered method's table is well formed */
    int n;
    const kv_method *const *all = kv_methods(&n);
    for (int i = 0; i < n; i++) {
        CHECK(all[i]->abi == KV_RETRIEVER_ABI, "%s: abi", all[i]->name);
        for (const kv_param_spec *s = all[i]->params; s && s->name; s++)
            CHECK((s->def >= s->min && s->def <= s->max) || s->type == KV_PARAM_ENUM, "%s.%s: default out of range",
                  all[i]->name, s->name);
    }
    return KV_TEST_PASS;
}

int test_synth_deterministic(void) {
    kv_synth_spec sp = {.tokens = 600, .prefill = 400, .q_heads = 4, .kv_heads = 2, .dim = 16, .layers = 1, .seed = 5,
                        .half = 0, .with_v = 1};
    size_t nq = 4 * 600 * 16, nk = 2 * 600 * 16;
    float *a = malloc((nq + 2 * nk) * sizeof(float)), *b = malloc((nq + 2 * nk) * sizeof(float));
    kv_synth *s1, *s2;
    CHECK_OK(kv_synth_create(&sp, 0, &s1));
    CHECK_OK(kv_synth_create(&sp, 0, &s2));
    kv_synth_rows(s1, 0, 600, a, a + nq, a + nq + nk);
    /* the same rows in two blocks: block [H][n][D] layouts differ, compare per position */
    float *q1 = malloc(4 * 250 * 16 * sizeof(float)), *k1 = malloc(2 * 250 * 16 * sizeof(float)),
          *v1 = malloc(2 * 250 * 16 * sizeof(float)), *q2 = malloc(4 * 350 * 16 * sizeof(float)),
          *k2 = malloc(2 * 350 * 16 * sizeof(float)), *v2 = malloc(2 * 350 * 16 * sizeof(float));
    kv_synth_rows(s2, 0, 250, q1, k1, v1);
    kv_synth_rows(s2, 250, 350, q2, k2, v2);
    int same = 1;
    for (int g = 0; g < 2 && same; g++)
        for (int t = 0; t < 600 && same; t++) {
            const float *x = a + nq + ((size_t)g * 600 + t) * 16;
            const float *y = t < 250 ? k1 + ((size_t)g * 250 + t) * 16 : k2 + ((size_t)g * 350 + t - 250) * 16;
            same = !memcmp(x, y, 16 * sizeof(float));
        }
    kv_synth_destroy(s1); kv_synth_destroy(s2);
    sp.seed = 6;
    CHECK_OK(kv_synth_create(&sp, 0, &s1));
    kv_synth_rows(s1, 0, 600, b, b + nq, b + nq + nk);
    kv_synth_destroy(s1);
    int differs = memcmp(a, b, (nq + 2 * nk) * sizeof(float)) != 0;
    int finite = 1;
    for (size_t i = 0; i < nq + 2 * nk; i++) finite &= isfinite(a[i]);
    free(a); free(b); free(q1); free(k1); free(v1); free(q2); free(k2); free(v2);
    CHECK(same, "rows generated in one block and in two blocks differ");
    CHECK(differs, "seeds 5 and 6 gave identical traces");
    CHECK(finite, "non-finite synthetic value");
    return KV_TEST_PASS;
}

int test_exact_matches_brute_force(void) {
    int Hq = 4, Hkv = 2, D = 24, T = 500, P = 300, k = 17, S = 3, W = 10;
    kv_rng r;
    kv_rng_seed(&r, 77);
    float *K = malloc((size_t)Hkv * T * D * sizeof(float)), *Q = malloc((size_t)Hq * D * sizeof(float));
    for (int i = 0; i < Hkv * T * D; i++) K[i] = (float)kv_rng_normal(&r);
    for (int g = 0; g < Hkv; g++) /* plant exact ties */
        memcpy(K + ((size_t)g * T + 200) * D, K + ((size_t)g * T + 100) * D, D * sizeof(float));
    kv_shape sh = {.num_q_heads = Hq, .num_kv_heads = Hkv, .head_dim = D, .group = 2, .max_tokens = T,
                   .prefill_len = P, .softmax_scale = 0.2f, .sink = S, .local = W};
    const kv_method *m = kv_method_find("exact");
    kv_param_set ps;
    kv_params_init(&ps, m->params);
    void *st;
    CHECK_OK(m->create(&sh, &ps, &st));
    kv_prefill pre = {.n = P, .k = NULL, .q = NULL};
    float *pk = malloc((size_t)Hkv * P * D * sizeof(float)), *row = malloc((size_t)Hkv * D * sizeof(float));
    for (int g = 0; g < Hkv; g++) memcpy(pk + (size_t)g * P * D, K + (size_t)g * T * D, (size_t)P * D * sizeof(float));
    pre.k = pk;
    CHECK_OK(m->build(st, &pre));
    kv_selection sel;
    CHECK_OK(kv_selection_alloc(&sel, Hq, Hkv, k, T, T));
    int failures = 0;
    for (int t = P; t < T && !failures; t++) {
        for (int g = 0; g < Hkv; g++) memcpy(row + g * D, K + ((size_t)g * T + t) * D, D * sizeof(float));
        CHECK_OK(m->append(st, t, row, NULL, NULL));
        if (t % 37) continue;
        for (int i = 0; i < Hq * D; i++) Q[i] = (float)kv_rng_normal(&r);
        kv_selection_reset(&sel);
        CHECK_OK(m->search(st, t, Q, k, &sel));
        int lo = S, hi = t + 1 - W, n = hi - lo;
        for (int h = 0; h < Hq; h++) { /* brute force: double scores, full sort */
            scored *all = malloc(n * sizeof *all);
            for (int i = 0; i < n; i++) {
                double acc = 0;
                for (int d = 0; d < D; d++) acc += (double)Q[h * D + d] * K[((size_t)(h / 2) * T + lo + i) * D + d];
                all[i] = (scored){(float)(0.2 * acc), lo + i};
            }
            qsort(all, n, sizeof *all, cmp_scored);
            float kth = all[k - 1].s;
            CHECK(sel.count[h] == k, "t=%d h=%d: %d selected", t, h, sel.count[h]);
            for (int j = 0; j < k; j++) { /* same set up to ties: every pick scores >= the k-th best */
                int i = sel.idx[h * sel.cap + j];
                double acc = 0;
                for (int d = 0; d < D; d++) acc += (double)Q[h * D + d] * K[((size_t)(h / 2) * T + i) * D + d];
                if (!(0.2 * acc >= kth - 1e-5 * (1 + fabs(kth)))) failures++;
            }
            free(all);
        }
    }
    CHECK(failures == 0, "%d selected indices below the brute-force k-th score", failures);
    kv_selection_free(&sel);
    m->destroy(st);
    free(K); free(Q); free(pk); free(row);
    return KV_TEST_PASS;
}

/* How many times `what` occurs in text. */
static int count_in(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

/* Streams made in one source text, other than through kv_stream_create. */
static int stray_streams(const char *text, int is_kv_cuda_h) {
    int made = count_in(text, "cudaStreamCreate") - (is_kv_cuda_h ? 1 : 0);
    return made + count_in(text, "cudaStreamNonBlocking");
}

/* Every stream of the kernels is made by kv_stream_create (kernels/ops/kv_cuda.h), a blocking stream, so that
 * the synchronous cudaMemcpy/cudaMemset calls on the legacy default stream order with the kernels (session 18:
 * a pageable upload still in flight under PQCache's first search). Scans every kernels/ source. */
int test_gpu_streams_blocking(void) {
    CHECK(stray_streams("x; KV_CUDA_TRY(cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking));", 0) == 2,
          "the scan misses a non-blocking stream");
    CHECK(stray_streams("cudaStream_t s; cudaStreamCreate(&s);", 0) == 1, "the scan misses a direct stream");
    static const char *dirs[] = {"kernels", "kernels/ops"};
    int files = 0, in_helper = 0;
    for (int d = 0; d < 2; d++) {
        DIR *dir = opendir(dirs[d]);
        CHECK(dir, "cannot open %s (the tests run from the repository root)", dirs[d]);
        struct dirent *e;
        while ((e = readdir(dir))) {
            size_t n = strlen(e->d_name);
            int src = (n > 3 && !strcmp(e->d_name + n - 3, ".cu")) || (n > 4 && !strcmp(e->d_name + n - 4, ".cuh")) ||
                      (n > 2 && !strcmp(e->d_name + n - 2, ".h"));
            if (!src) continue;
            char path[512];
            snprintf(path, sizeof path, "%s/%s", dirs[d], e->d_name);
            char *text = kv_test_read_file(path, NULL);
            if (!text) { closedir(dir); CHECK(0, "cannot read %s", path); }
            int helper = !strcmp(path, "kernels/ops/kv_cuda.h");
            in_helper += helper && strstr(text, "kv_stream_create(cudaStream_t *st) { return cudaStreamCreate(st); }");
            int bad = stray_streams(text, helper);
            free(text);
            files++;
            if (bad) { closedir(dir); CHECK(0, "%s makes %d stream(s) other than through kv_stream_create", path, bad); }
        }
        closedir(dir);
    }
    CHECK(files >= 30, "only %d kernel sources found", files);
    CHECK(in_helper == 1, "kernels/ops/kv_cuda.h: kv_stream_create is not cudaStreamCreate");
    return KV_TEST_PASS;
}
