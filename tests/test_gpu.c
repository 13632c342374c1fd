/* test_gpu.c: the CUDA kernels against the C reference (KV_NEEDS_GPU: they
 * skip without a GPU, and fail under KVBENCH_REQUIRE_GPU=1). Every test
 * draws fresh random inputs (the seed is in each failure message), never
 * zeros. The score kernel is checked for bitwise equality with
 * kv_scores_ref, the top-k for exactly kv_topk_ref's indices and order
 * (ties included) and the oracle and the exact retriever against their CPU
 * paths; a GPU out-of-memory must come back as KV_ERR_NOMEM. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cli/oracle.h"
#include "../kernels/ops/kv_gpu.h"
#include "../kernels/ops/score.h"
#include "../kernels/ops/topk.h"
#include "../retrievers/kv_retriever.h"
#include "kv_test.h"

static uint64_t fresh_seed(void) { return kv_test_seed(); } /* KVBENCH_TEST_SEED reproduces a run */

static float half_round(float x) { return kv_half_to_float(kv_float_to_half(x)); }

/* N(0, scale^2) values, rounded to float16 when half (a trace stored as float16). */
static void fill(kv_rng *r, float *x, size_t n, float scale, int half) {
    for (size_t i = 0; i < n; i++) {
        float v = scale * (float)kv_rng_normal(r);
        x[i] = half ? half_round(v) : v;
    }
}

int test_gpu_scores_match_ref(void) {
    static const struct { int Hq, Hkv, T, D, half, lo, hi; } cs[] = {
        {16, 8, 3001, 128, 1, 0, 3001}, {16, 8, 3001, 128, 1, 37, 2999}, {8, 2, 1000, 128, 0, 5, 1000},
        {12, 4, 777, 64, 1, 0, 777},    {6, 2, 513, 64, 0, 3, 500},      {4, 1, 300, 40, 1, 0, 300},
        {6, 3, 301, 20, 0, 2, 301},     {24, 2, 600, 128, 1, 0, 600},    {3, 1, 257, 128, 1, 1, 257},
    };
    uint64_t seed = fresh_seed();
    kv_rng r;
    kv_rng_seed(&r, seed);
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        int Hq = cs[c].Hq, Hkv = cs[c].Hkv, T = cs[c].T, D = cs[c].D, lo = cs[c].lo, n = cs[c].hi - lo, G = Hq / Hkv;
        float *K = malloc((size_t)Hkv * T * D * 4), *q = malloc((size_t)Hq * D * 4);
        float *got = malloc((size_t)Hq * n * 4), *want = malloc((size_t)n * 4);
        CHECK(K && q && got && want, "out of memory");
        fill(&r, K, (size_t)Hkv * T * D, 1.0f, cs[c].half);
        fill(&r, q, (size_t)Hq * D, 1.0f, 0);
        for (int h = 0; h < Hq * n; h++) got[h] = NAN; /* poison: every element must be written */
        float scale = 1.0f / sqrtf((float)D);
        CHECK_OK(kv_gpu_scores_host(q, K, Hq, Hkv, T, D, cs[c].half, scale, lo, lo + n, got));
        int bad = 0;
        double maxd = 0;
        for (int h = 0; h < Hq; h++) {
            kv_scores_ref(q + (size_t)h * D, K + ((size_t)(h / G) * T + lo) * D, n, D, scale, want);
            for (int i = 0; i < n; i++) {
                float g = got[(size_t)h * n + i];
                bad += g != want[i];
                double d = fabs((double)g - want[i]);
                maxd = d > maxd || isnan(g) ? (isnan(g) ? INFINITY : d) : maxd;
            }
        }
        CHECK(bad == 0, "case %zu (Hq %d Hkv %d T %d D %d %s [%d,%d)): %d of %d scores differ from kv_scores_ref "
              "(max |diff| %g), seed %llu", c, Hq, Hkv, T, D, cs[c].half ? "float16" : "float32", lo, lo + n, bad,
              Hq * n, maxd, (unsigned long long)seed);
        free(K); free(q); free(got); free(want);
    }
    return KV_TEST_PASS;
}

/* kind 0: continuous; 1: few distinct values (many ties); 2: crowded into
 * one top-digit bin (forces the deeper radix passes); 3: all equal (ties
 * beyond the candidate capacity); 4: signed zeros and small integers. */
static void fill_scores(kv_rng *r, float *x, size_t n, int kind) {
    for (size_t i = 0; i < n; i++) {
        double u = kv_rng_uniform(r), g = kv_rng_normal(r);
        switch (kind) {
        case 0: x[i] = (float)(3 * g); break;
        case 1: x[i] = 0.5f * (float)(kv_rng_u64(r) % 20) - 3.0f; break;
        case 2: x[i] = 1000.0f + 1e-3f * (float)g + (u < 0.001 ? 0.25f : 0.f); break;
        case 3: x[i] = 1.25f; break;
        default: x[i] = u < 0.3 ? -0.0f : u < 0.6 ? 0.0f : (float)((int)(4 * g)); break;
        }
    }
}

static int check_topk(kv_rng *r, uint64_t seed, int R, int n, int k, int kind, int base, int want_idx) {
    int kk = k < n ? k : n;
    float *S = malloc((size_t)R * n * 4), *val = malloc((size_t)R * kk * 4), *kth = malloc((size_t)R * 4);
    float *rv = malloc((size_t)kk * 4), *scratch = malloc((size_t)n * 4);
    int32_t *idx = malloc((size_t)R * kk * 4), *ri = malloc((size_t)kk * 4);
    CHECK(S && val && kth && rv && scratch && idx && ri, "out of memory");
    fill_scores(r, S, (size_t)R * n, kind);
    for (int i = 0; i < R * kk; i++) idx[i] = -7;
    CHECK_OK(kv_gpu_topk_host(S, R, n, k, base, want_idx ? idx : NULL, val, kth));
    for (int row = 0; row < R; row++) {
        const float *s = S + (size_t)row * n;
        float want_kth = kv_kth_largest_ref(s, n, kk, scratch);
        CHECK(kth[row] == want_kth, "R %d n %d k %d kind %d row %d: k-th largest %.9g, want %.9g, seed %llu", R, n,
              k, kind, row, kth[row], want_kth, (unsigned long long)seed);
        if (!want_idx) continue;
        CHECK(kv_topk_ref(s, n, k, base, ri, rv) == kk, "reference top-k failed");
        for (int j = 0; j < kk; j++)
            CHECK(idx[(size_t)row * kk + j] == ri[j] && val[(size_t)row * kk + j] == rv[j],
                  "R %d n %d k %d kind %d row %d rank %d: got (%d, %.9g), want (%d, %.9g), seed %llu", R, n, k, kind,
                  row, j, idx[(size_t)row * kk + j], val[(size_t)row * kk + j], ri[j], rv[j],
                  (unsigned long long)seed);
    }
    free(S); free(val); free(kth); free(rv); free(scratch); free(idx); free(ri);
    return KV_TEST_PASS;
}

int test_gpu_topk_matches_ref(void) {
    uint64_t seed = fresh_seed();
    kv_rng r;
    kv_rng_seed(&r, seed);
    static const int ns[] = {1, 7, 100, 1000, 4099, 65537};
    static const int ks[] = {1, 10, 100, 1000000};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (int kind = 0; kind < 5; kind++)
            for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++) {
                int k = ks[b] == 1000000 ? ns[a] + 5 : ks[b]; /* k > n: everything, in order */
                if (k > KV_GPU_TOPK_MAX) continue;
                if (check_topk(&r, seed, 3, ns[a], k, kind, 17, 1) != KV_TEST_PASS) return KV_TEST_FAIL;
            }
    /* full size: 16 rows of 300001, a large k, the overflow of ties, thresholds beyond the index limit */
    if (check_topk(&r, seed, 16, 300001, 100, 0, 0, 1) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (check_topk(&r, seed, 16, 300001, 100, 2, 4, 1) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (check_topk(&r, seed, 2, 300001, KV_GPU_TOPK_MAX, 0, 0, 1) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (check_topk(&r, seed, 4, 70001, 1000, 3, 0, 1) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (check_topk(&r, seed, 4, 70001, 999, 1, 0, 1) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (check_topk(&r, seed, 3, 300001, 20000, 0, 0, 0) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (check_topk(&r, seed, 3, 300001, 50000, 3, 0, 0) != KV_TEST_PASS) return KV_TEST_FAIL;
    return KV_TEST_PASS;
}

static int oracle_case(kv_rng *r, uint64_t seed, int Hq, int Hkv, int T, int D, int half, int with_v, int k) {
    kv_layer L = {.Hq = Hq, .Hkv = Hkv, .T = T, .D = D, .half = half};
    L.k = malloc((size_t)Hkv * T * D * 4);
    L.q = malloc((size_t)Hq * T * D * 4);
    L.v = with_v ? malloc((size_t)Hkv * T * D * 4) : NULL;
    float *q = malloc((size_t)Hq * D * 4);
    int cap = 300;
    int32_t *gi = malloc((size_t)Hq * cap * 4);
    int *cnt = malloc((size_t)Hq * sizeof(int));
    float *g_cpu = malloc((size_t)Hq * cap * 4), *g_gpu = malloc((size_t)Hq * cap * 4);
    CHECK(L.k && L.q && (!with_v || L.v) && q && gi && cnt && g_cpu && g_gpu, "out of memory");
    fill(r, L.k, (size_t)Hkv * T * D, 1.0f, half);
    fill(r, L.q, (size_t)Hq * T * D, 1.0f, half);
    if (with_v) fill(r, L.v, (size_t)Hkv * T * D, 1.0f, half); /* float32 values widen the GPU store */
    for (int g = 0; g < Hkv; g++) /* some keys repeated: exact score ties */
        for (int t = 100; t < T; t += 37)
            memcpy(L.k + ((size_t)g * T + t) * D, L.k + ((size_t)g * T + t / 3) * D, (size_t)D * 4);
    float scale = 1.0f / sqrtf((float)D);
    int sink = 4, local = 64;
    kv_oracle *oc = NULL, *og = NULL;
    CHECK_OK(kv_oracle_create(&L, scale, sink, local, k, T / 3, 0, &oc));
    CHECK_OK(kv_oracle_create(&L, scale, sink, local, k, T / 3, 1, &og));
    CHECK(!strcmp(kv_oracle_device(og), "gpu"), "the GPU oracle runs on %s", kv_oracle_device(og));
    int steps[] = {10, 70, 300, T / 2, T - 2, T - 1};
    for (size_t si = 0; si < sizeof steps / sizeof steps[0]; si++) {
        int t = steps[si];
        fill(r, q, (size_t)Hq * D, 1.5f, 0);
        kv_oracle_out a, b;
        CHECK_OK(kv_oracle_step(oc, t, q, &a));
        CHECK_OK(kv_oracle_step(og, t, q, &b));
        for (int h = 0; h < Hq; h++) {
            CHECK(a.m[h] == b.m[h], "t %d head %d: m %.9g, CPU %.9g, seed %llu", t, h, b.m[h], a.m[h],
                  (unsigned long long)seed);
            CHECK_CLOSE(b.Z[h], a.Z[h], 0, 1e-5);
            CHECK(a.thr[h] == b.thr[h], "t %d head %d: thr %.9g, CPU %.9g, seed %llu", t, h, b.thr[h], a.thr[h],
                  (unsigned long long)seed);
            CHECK(a.ntop_pre[h] == b.ntop_pre[h] && a.ntop_gen[h] == b.ntop_gen[h],
                  "t %d head %d: top-k by origin %d + %d, CPU %d + %d", t, h, b.ntop_pre[h], b.ntop_gen[h],
                  a.ntop_pre[h], a.ntop_gen[h]);
            if (with_v)
                for (int d = 0; d < D; d++) CHECK_CLOSE(b.o_full[(size_t)h * D + d], a.o_full[(size_t)h * D + d], 1e-5, 1e-5);
        }
        for (int h = 0; h < Hq; h++) {
            cnt[h] = (int)(kv_rng_u64(r) % (uint64_t)(cap + 1));
            for (int j = 0; j < cnt[h]; j++) gi[(size_t)h * cap + j] = (int32_t)(kv_rng_u64(r) % (uint64_t)(t + 1));
        }
        for (int i = 0; i < Hq * cap; i++) g_gpu[i] = g_cpu[i] = NAN;
        CHECK_OK(kv_oracle_gather(oc, gi, cnt, cap, g_cpu));
        CHECK_OK(kv_oracle_gather(og, gi, cnt, cap, g_gpu));
        for (int h = 0; h < Hq; h++)
            for (int j = 0; j < cnt[h]; j++)
                CHECK(g_cpu[(size_t)h * cap + j] == g_gpu[(size_t)h * cap + j],
                      "t %d head %d: gathered score %d is %.9g, CPU %.9g, seed %llu", t, h, j,
                      g_gpu[(size_t)h * cap + j], g_cpu[(size_t)h * cap + j], (unsigned long long)seed);
    }
    kv_oracle_destroy(oc);
    kv_oracle_destroy(og);
    free(L.k); free(L.q); free(L.v); free(q); free(gi); free(cnt); free(g_cpu); free(g_gpu);
    return KV_TEST_PASS;
}

int test_gpu_oracle_matches_cpu(void) {
    uint64_t seed = fresh_seed();
    kv_rng r;
    kv_rng_seed(&r, seed);
    if (oracle_case(&r, seed, 8, 2, 5000, 128, 1, 1, 100) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (oracle_case(&r, seed, 8, 2, 3000, 128, 1, 1, 20000) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (oracle_case(&r, seed, 6, 3, 2100, 64, 0, 1, 100) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (oracle_case(&r, seed, 4, 2, 1500, 48, 0, 1, 50) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (oracle_case(&r, seed, 4, 4, 1000, 128, 1, 0, 100) != KV_TEST_PASS) return KV_TEST_FAIL;
    if (oracle_case(&r, seed, 12, 1, 700, 64, 1, 1, 30) != KV_TEST_PASS) return KV_TEST_FAIL;
    /* the score kernel with and without the top-k's first histogram (KVBENCH_SCORE_HIST, read at create),
     * whichever the default: both paths must give the CPU's selections */
    for (int h = 0; h < 2; h++) {
        kv_test_env ev;
        kv_test_env_set(&ev, "KVBENCH_SCORE_HIST", h ? "1" : "0");
        const int st = oracle_case(&r, seed, 8, 2, 5000, 128, 1, 1, 100);
        kv_test_env_restore(&ev);
        if (st != KV_TEST_PASS) return KV_TEST_FAIL;
    }
    return KV_TEST_PASS;
}

int test_gpu_exact_matches_cpu(void) {
    uint64_t seed = fresh_seed();
    kv_rng r;
    kv_rng_seed(&r, seed);
    const kv_method *m = kv_method_find("exact");
    CHECK(m && m->has_gpu, "exact has no GPU path");
    int Hq = 8, Hkv = 4, D = 128, T = 3000, P = 1000;
    kv_shape sh = {.num_q_heads = Hq, .num_kv_heads = Hkv, .head_dim = D, .group = Hq / Hkv, .max_tokens = T,
                   .prefill_len = P, .softmax_scale = 1.0f / sqrtf((float)D), .sink = 4, .local = 64, .seed = 1};
    kv_param_set ps;
    kv_params_init(&ps, m->params);
    void *cpu = NULL, *gpu = NULL;
    CHECK_OK(m->create(&sh, &ps, &cpu));
    sh.use_gpu = 1;
    CHECK_OK(m->create(&sh, &ps, &gpu));
    float *pk = malloc((size_t)Hkv * P * D * 4), *pq = malloc((size_t)Hq * P * D * 4);
    float *k = malloc((size_t)Hkv * D * 4), *q = malloc((size_t)Hq * D * 4);
    CHECK(pk && pq && k && q, "out of memory");
    fill(&r, pk, (size_t)Hkv * P * D, 1.0f, 1);
    fill(&r, pq, (size_t)Hq * P * D, 1.0f, 1);
    for (int i = 0; i < 50; i++) /* duplicated keys: exact score ties */
        memcpy(pk + (size_t)(P - 1 - i) * D, pk + (size_t)(10 + i) * D, (size_t)D * 4);
    kv_prefill pre = {.n = P, .k = pk, .q = pq};
    CHECK_OK(m->build(cpu, &pre));
    CHECK_OK(m->build(gpu, &pre));
    kv_selection sa, sb;
    CHECK_OK(kv_selection_alloc(&sa, Hq, Hkv, 1000, T, T));
    CHECK_OK(kv_selection_alloc(&sb, Hq, Hkv, 1000, T, T));
    for (int t = P; t < T; t++) {
        fill(&r, k, (size_t)Hkv * D, 1.0f, t < 2000); /* from 2000 on not float16: the store widens */
        if (t % 5 == 0) memcpy(k, pk + (size_t)(t % P) * D, (size_t)D * 4);
        fill(&r, q, (size_t)Hq * D, 1.0f, 0);
        CHECK_OK(m->append(cpu, t, k, NULL, q));
        CHECK_OK(m->append(gpu, t, k, NULL, q));
        if (t % 97 && t != T - 1) continue;
        int kk = t % 2 ? 100 : 1000;
        kv_selection_reset(&sa);
        kv_selection_reset(&sb);
        CHECK_OK(m->search(cpu, t, q, kk, &sa));
        CHECK_OK(m->search(gpu, t, q, kk, &sb));
        for (int h = 0; h < Hq; h++) {
            CHECK(sa.count[h] == sb.count[h], "t %d head %d: %d selected, CPU %d", t, h, sb.count[h], sa.count[h]);
            for (int j = 0; j < sa.count[h]; j++)
                CHECK(sa.idx[(size_t)h * sa.cap + j] == sb.idx[(size_t)h * sb.cap + j],
                      "t %d head %d rank %d: index %d, CPU %d, seed %llu", t, h, j, sb.idx[(size_t)h * sb.cap + j],
                      sa.idx[(size_t)h * sa.cap + j], (unsigned long long)seed);
        }
    }
    CHECK(m->memory_bytes(gpu) == (size_t)Hkv * T * D * 4, "GPU key store not widened to float32: %zu bytes",
          m->memory_bytes(gpu));
    kv_selection_free(&sa);
    kv_selection_free(&sb);
    m->destroy(cpu);
    m->destroy(gpu);
    free(pk); free(pq); free(k); free(q);
    return KV_TEST_PASS;
}

int test_gpu_oom_is_an_error(void) {
    float dummy[128] = {1.0f};
    kv_gpu_attn *a = NULL;
    kv_status st = kv_gpu_attn_create(2, 2, (1 << 30) - 1, 128, 1, dummy, NULL, &a);
    CHECK(st == KV_ERR_NOMEM && !a, "status %d (%s), want KV_ERR_NOMEM", (int)st, kv_last_error());
    CHECK(strstr(kv_last_error(), "GPU out of memory allocating"), "message: %s", kv_last_error());
    kv_gpu_keys *k = NULL;
    st = kv_gpu_keys_create(64, 1 << 30, 256, 0, &k);
    CHECK(st == KV_ERR_NOMEM && !k, "key store: status %d (%s)", (int)st, kv_last_error());
    /* the device is still usable afterwards */
    float s[64], kth;
    kv_rng r;
    kv_rng_seed(&r, fresh_seed());
    fill_scores(&r, s, 64, 0);
    CHECK_OK(kv_gpu_topk_host(s, 1, 64, 5, 0, NULL, NULL, &kth));
    return KV_TEST_PASS;
}
