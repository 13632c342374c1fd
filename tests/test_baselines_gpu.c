/* test_baselines_gpu.c: the CUDA paths of PQCache and Quest against their
 * C references (KV_NEEDS_GPU: skipped without a GPU, failures under
 * KVBENCH_REQUIRE_GPU=1). PQCache: on clustered keys arranged so that the
 * seeded k-means start takes one key per cluster, the GPU k-means gives the
 * CPU's codes exactly and its centroids within 1e-5; on unclustered keys
 * every GPU code is the nearest GPU centroid (up to a rounding gap);
 * appended keys are encoded bitwise as kv_pq_assign; the ADC scores equal
 * the CPU's (scale * sum of the lookups, same rounding) and the group
 * softmax sums within 1e-4 relative. Quest: page min/max equal the CPU's
 * exactly, bounds within 1e-5 relative (they are computed in the CPU's
 * order, so in practice bitwise). End to end, each retriever with use_gpu
 * selects what its CPU path selects over a layer with decode appends;
 * PQCache ranks may differ only between keys whose CPU scores tie within
 * 1e-5 relative (the documented float tie). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../datasets/kv_trace.h"
#include "../kernels/pqcache.h"
#include "../kernels/quest.h"
#include "../kernels/ops/topk.h"
#include "../retrievers/baselines.h"
#include "kv_test.h"

static uint64_t fresh_seed(void) { return kv_test_seed(); } /* KVBENCH_TEST_SEED reproduces a run */

static int need_gpu(void) {
    if (kv_test_have_gpu()) return 1;
    kv_test_skip_reason("no GPU");
    return 0;
}

/* The retriever's per-job k-means seed (retrievers/pqcache.c, pq_job_seed). */
static uint64_t pq_seed(uint64_t base, int g, int m) {
    return base * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)g << 32) ^ (uint64_t)(m + 1) * 0xbf58476d1ce4e5b9ULL;
}

/* Keys [Hkv][T][D] whose sub-vectors lie in C tight clusters (centres
 * 3*N(0,1), spread 0.02) and whose positions lo + pick[c] (c < C) of the
 * prefill [lo, P) belong to cluster c, so the seeded start holds one key per
 * cluster and Lloyd stays on the true clusters: no near-equal distances. */
static void clustered_keys(kv_rng *r, float *k, int Hkv, int T, int D, int M, int C, int lo, int P, uint64_t base) {
    int ds = D / M, cnt = P - lo;
    float *ctr = malloc((size_t)C * ds * sizeof(float));
    int32_t pick[256];
    int *label = malloc((size_t)T * sizeof(int));
    for (int g = 0; g < Hkv; g++)
        for (int m = 0; m < M; m++) {
            for (int e = 0; e < C * ds; e++) ctr[e] = 3.0f * (float)kv_rng_normal(r);
            for (int t = 0; t < T; t++) label[t] = (int)(kv_rng_u64(r) % (uint64_t)C);
            if (cnt >= C) {
                kv_pq_init_picks(cnt, C, pq_seed(base, g, m), pick);
                for (int c = 0; c < C; c++) label[lo + pick[c]] = c;
            }
            for (int t = 0; t < T; t++)
                for (int j = 0; j < ds; j++)
                    k[((size_t)g * T + t) * D + m * ds + j] = ctr[label[t] * ds + j] + 0.02f * (float)kv_rng_normal(r);
        }
    free(ctr);
    free(label);
}

/* CPU group softmax sums of pqcache's search over [lo, hi) for kv head g,
 * from centroids [Hkv][M][dsub][C] and codes [Hkv][T][M] (pq_search's order). */
static void cpu_agg(const float *cent, const uint8_t *codes, const float *q, int g, int G, int T, int D, int M, int C,
                    float scale, int lo, int hi, float *raw, float *agg) {
    int n = hi - lo, ds = D / M;
    float lut[8192];
    for (int i = 0; i < n; i++) agg[i] = 0.f;
    for (int h = g * G; h < (g + 1) * G; h++) {
        float *sc = raw + (size_t)(h - g * G) * n;
        kv_pq_lut(q + (size_t)h * D, cent + (size_t)g * M * ds * C, M, C, ds, lut);
        kv_pq_adc(lut, codes + ((size_t)g * T + lo) * M, M, n, M, C, sc);
        float mx = -INFINITY;
        for (int i = 0; i < n; i++) {
            sc[i] *= scale;
            if (sc[i] > mx) mx = sc[i];
        }
        double z = 0;
        for (int i = 0; i < n; i++) z += expf(sc[i] - mx);
        float inv = (float)(1.0 / z);
        for (int i = 0; i < n; i++) agg[i] += expf(sc[i] - mx) * inv;
    }
}

int test_pqcache_gpu_kmeans_matches_cpu(void) {
    if (!need_gpu()) return KV_TEST_SKIP;
    uint64_t seed = fresh_seed();
    kv_rng r;
    kv_rng_seed(&r, seed);
    const int Hq = 4, Hkv = 2, D = 64, M = 2, C = 16, ds = D / M, T = 3000, n = 2500, lo = 3, iters = 8;
    float *k = malloc((size_t)Hkv * T * D * 4), *kp = malloc((size_t)Hkv * n * D * 4);
    float *cc = malloc((size_t)Hkv * D * C * 4), *cg = malloc((size_t)Hkv * D * C * 4);
    uint8_t *codc = calloc((size_t)Hkv * T * M, 1), *codg = calloc((size_t)Hkv * T * M, 1), c1[64];
    int32_t *picks = malloc((size_t)Hkv * M * C * 4);
    CHECK(k && kp && cc && cg && codc && codg && picks, "out of memory");
    kv_pq_gpu *p = NULL;
    CHECK_OK(kv_pqcache_cuda.create(Hq, Hkv, T, D, M, C, &p));
    for (int pass = 0; pass < 2; pass++) { /* 0: clustered (codes must be equal); 1: unclustered */
        uint64_t base = seed + (uint64_t)pass;
        if (pass == 0)
            clustered_keys(&r, k, Hkv, T, D, M, C, lo, n, base);
        else
            for (size_t e = 0; e < (size_t)Hkv * T * D; e++) k[e] = (float)kv_rng_normal(&r);
        for (int g = 0; g < Hkv; g++) memcpy(kp + (size_t)g * n * D, k + (size_t)g * T * D, (size_t)n * D * 4);
        for (int g = 0; g < Hkv; g++)
            for (int m = 0; m < M; m++) {
                kv_pq_init_picks(n - lo, C, pq_seed(base, g, m), picks + ((size_t)g * M + m) * C);
                CHECK_OK(kv_pq_kmeans(kp + (size_t)g * n * D + (size_t)lo * D + m * ds, n - lo, D, ds, C, iters,
                                      pq_seed(base, g, m), 0, cc + ((size_t)g * M + m) * ds * C,
                                      codc + ((size_t)g * T + lo) * M + m, M));
            }
        CHECK_OK(kv_pqcache_cuda.build(p, &(kv_host_rows){kp, NULL, n}, n, lo, iters, picks, cg, codg));
        int diff = 0;
        for (int g = 0; g < Hkv; g++)
            for (int i = lo; i < n; i++)
                for (int m = 0; m < M; m++) diff += codc[((size_t)g * T + i) * M + m] != codg[((size_t)g * T + i) * M + m];
        if (pass == 0) {
            CHECK(diff == 0, "clustered keys: %d of %d GPU codes differ from the CPU's, seed %llu", diff,
                  Hkv * (n - lo) * M, (unsigned long long)seed);
            for (int e = 0; e < Hkv * D * C; e++) CHECK_CLOSE(cg[e], cc[e], 1e-6, 1e-5);
        } else {
            fprintf(stderr, "    unclustered keys: %d of %d GPU codes differ from the CPU's (rounding of near ties)\n",
                    diff, Hkv * (n - lo) * M);
            /* every GPU code is the nearest GPU centroid, up to a rounding gap */
            for (int g = 0; g < Hkv; g++)
                for (int m = 0; m < M; m++) {
                    const float *cm = cg + ((size_t)g * M + m) * ds * C;
                    for (int i = lo; i < n; i++) {
                        const float *x = kp + ((size_t)g * n + i) * D + m * ds;
                        double best = INFINITY, mine = 0, xx = 0;
                        for (int c = 0; c < C; c++) {
                            double s = 0;
                            for (int j = 0; j < ds; j++) {
                                double e = (double)x[j] - cm[(size_t)j * C + c];
                                s += e * e;
                            }
                            best = s < best ? s : best;
                            if (c == codg[((size_t)g * T + i) * M + m]) mine = s;
                        }
                        for (int j = 0; j < ds; j++) xx += (double)x[j] * x[j];
                        CHECK(mine - best <= 1e-5 * (xx + 1), "key %d (g %d m %d): code at distance %.9g, nearest "
                              "%.9g, seed %llu", i, g, m, mine, best, (unsigned long long)seed);
                    }
                }
        }
        /* appended keys: bitwise kv_pq_assign with the GPU's centroids */
        for (int t = n; t < n + 40; t++) {
            float key[2 * 64];
            for (int g = 0; g < Hkv; g++) memcpy(key + g * D, k + ((size_t)g * T + t) * D, (size_t)D * 4);
            CHECK_OK(kv_pqcache_cuda.encode(p, t, key, c1));
            for (int g = 0; g < Hkv; g++)
                for (int m = 0; m < M; m++) {
                    uint8_t want;
                    kv_pq_assign(key + g * D + m * ds, 1, ds, ds, cg + ((size_t)g * M + m) * ds * C, C, &want, 1);
                    CHECK(c1[g * M + m] == want, "appended key %d (g %d m %d): GPU code %d, kv_pq_assign %d, seed %llu",
                          t, g, m, c1[g * M + m], want, (unsigned long long)seed);
                }
        }
    }
    kv_pqcache_cuda.destroy(p);
    free(k); free(kp); free(cc); free(cg); free(codc); free(codg); free(picks);
    return KV_TEST_PASS;
}

int test_pqcache_gpu_adc_matches_cpu(void) {
    if (!need_gpu()) return KV_TEST_SKIP;
    uint64_t seed = fresh_seed();
    kv_rng r;
    kv_rng_seed(&r, seed);
    static const struct { int Hq, Hkv, D, M, C, n, lo, hi, k; } cs[] = {
        {16, 8, 128, 2, 64, 20000, 4, 19937, 100}, {8, 2, 64, 4, 16, 5000, 0, 5000, 50},
        {6, 3, 32, 1, 256, 3001, 7, 2990, 300},    {12, 1, 64, 8, 32, 777, 1, 700, 10},
    };
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        int Hq = cs[ci].Hq, Hkv = cs[ci].Hkv, D = cs[ci].D, M = cs[ci].M, C = cs[ci].C, n = cs[ci].n, G = Hq / Hkv;
        int lo = cs[ci].lo, hi = cs[ci].hi, nn = hi - lo, k = cs[ci].k, kk = k < nn ? k : nn;
        float *x = malloc((size_t)Hkv * n * D * 4), *cent = malloc((size_t)Hkv * D * C * 4), *q = malloc((size_t)Hq * D * 4);
        float *raw = malloc((size_t)Hq * nn * 4), *agg = malloc((size_t)Hkv * nn * 4);
        float *craw = malloc((size_t)G * nn * 4), *cagg = malloc((size_t)nn * 4);
        uint8_t *codes = calloc((size_t)Hkv * n * M, 1);
        int32_t *picks = malloc((size_t)Hkv * M * C * 4), *idx = malloc((size_t)Hkv * kk * 4), *ri = malloc((size_t)kk * 4);
        int cnt[64];
        CHECK(x && cent && q && raw && agg && craw && cagg && codes && picks && idx && ri, "out of memory");
        for (size_t e = 0; e < (size_t)Hkv * n * D; e++) x[e] = (float)kv_rng_normal(&r);
        for (size_t e = 0; e < (size_t)Hq * D; e++) q[e] = 2.0f * (float)kv_rng_normal(&r);
        for (int gm = 0; gm < Hkv * M; gm++) kv_pq_init_picks(n - lo, C, seed + (uint64_t)gm, picks + (size_t)gm * C);
        kv_pq_gpu *p = NULL;
        CHECK_OK(kv_pqcache_cuda.create(Hq, Hkv, n, D, M, C, &p));
        CHECK_OK(kv_pqcache_cuda.build(p, &(kv_host_rows){x, NULL, n}, n, lo, 3, picks, cent, codes));
        float scale = 1.0f / sqrtf((float)D);
        CHECK_OK(kv_pqcache_cuda.search(p, q, scale, lo, hi, k, idx, kk, cnt, agg, raw));
        for (int g = 0; g < Hkv; g++) {
            cpu_agg(cent, codes, q, g, G, n, D, M, C, scale, lo, hi, craw, cagg);
            int bad = 0;
            for (int hh = 0; hh < G; hh++)
                for (int i = 0; i < nn; i++) bad += raw[(size_t)(g * G + hh) * nn + i] != craw[(size_t)hh * nn + i];
            CHECK(bad == 0, "case %zu g %d: %d ADC scores differ from the CPU's, seed %llu", ci, g, bad,
                  (unsigned long long)seed);
            double maxrel = 0;
            for (int i = 0; i < nn; i++) {
                double d = fabs((double)agg[(size_t)g * nn + i] - cagg[i]) / fabs((double)cagg[i]);
                maxrel = d > maxrel ? d : maxrel;
            }
            CHECK(maxrel <= 1e-4, "case %zu g %d: group softmax sums differ by %.3g relative, seed %llu", ci, g,
                  maxrel, (unsigned long long)seed);
            CHECK(cnt[g] == kk, "case %zu g %d: %d selected, want %d", ci, g, cnt[g], kk);
            CHECK(kv_topk_ref(cagg, nn, k, lo, ri, NULL) == kk, "reference top-k failed");
            for (int j = 0; j < kk; j++) {
                int a = idx[(size_t)g * kk + j], b = ri[j];
                CHECK(a >= lo && a < hi, "case %zu g %d rank %d: index %d outside [%d, %d)", ci, g, j, a, lo, hi);
                CHECK(a == b || fabs((double)cagg[a - lo] - cagg[b - lo]) <= 1e-5 * fabs((double)cagg[b - lo]),
                      "case %zu g %d rank %d: index %d (score %.9g), CPU %d (%.9g), seed %llu", ci, g, j, a,
                      cagg[a - lo], b, cagg[b - lo], (unsigned long long)seed);
            }
        }
        kv_pqcache_cuda.destroy(p);
        free(x); free(cent); free(q); free(raw); free(agg); free(craw); free(cagg); free(codes); free(picks);
        free(idx); free(ri);
    }
    return KV_TEST_PASS;
}

/* The tuple path's top-k (threshold on the tuples, ordered compaction, no
 * per-key scores) equals kv_topk_ref over the per-key group scores the GPU
 * materialises on request, ties included. Codes from a small alphabet (few
 * tuples, each shared by many keys), codes 0 and 1 with one centroid (other
 * tuples with bitwise equal scores), a rare code (~1 key in 2000 per
 * sub-vector, so the top keys and their ties lie in every compaction block),
 * n ~ 1M (many blocks), a zero query (every key ties), k > n; at n ~ 1M the
 * threshold comes from the top values one at a time (k = 100, 1000, 8192 on
 * few tuples, where the first holds k; k = 300 on 4096 tuples, where a later
 * one does) or, when 4 values hold fewer than k keys (k = 2000 on 4096
 * tuples), from the radix select. Each search runs twice: without the
 * per-key scores, then with them. */
int test_pqcache_gpu_tuple_topk_matches_ref(void) {
    if (!need_gpu()) return KV_TEST_SKIP;
    uint64_t seed = fresh_seed();
    kv_rng r;
    kv_rng_seed(&r, seed);
    static const struct { int Hq, Hkv, D, M, C, n, lo, hi, k, alpha, zero_q; } cs[] = {
        {4, 2, 32, 2, 64, 1 << 20, 3, (1 << 20) - 5, 100, 4, 0}, {4, 2, 32, 2, 64, 1 << 20, 0, 1 << 20, 8192, 3, 0},
        {4, 2, 32, 2, 64, 1 << 20, 0, 1 << 20, 1000, 8, 1},      {2, 1, 16, 1, 16, 300000, 11, 299990, 777, 5, 0},
        {6, 3, 48, 3, 16, 200000, 0, 200000, 500, 16, 0},        {4, 2, 32, 2, 64, 50, 0, 50, 100, 2, 0},
        {4, 2, 32, 2, 64, 1 << 20, 0, 1 << 20, 300, 64, 0},  /* ~256 keys a tuple: the second or third top value */
        {4, 2, 32, 2, 64, 1 << 20, 0, 1 << 20, 2000, 64, 0}, /* ~256 keys a tuple: the 4 top values hold < k, radix */
        /* 8 kv heads: selection blocks of 32768 / 65536 keys on a GPU of ~100-144 SMs (pq_tuple_kpb), so a thread's
         * run of keys takes 2 / 4 batches of pq_run (the cases above: one), an unaligned region in the first */
        {16, 8, 32, 2, 64, 1 << 20, 5, (1 << 20) - 3, 100, 64, 0},
        {16, 8, 32, 2, 64, 1 << 21, 0, 1 << 21, 300, 16, 0},
    };
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        int Hq = cs[ci].Hq, Hkv = cs[ci].Hkv, D = cs[ci].D, M = cs[ci].M, C = cs[ci].C, n = cs[ci].n, ds = D / M;
        int lo = cs[ci].lo, hi = cs[ci].hi, nn = hi - lo, k = cs[ci].k, kk = k < nn ? k : nn, alpha = cs[ci].alpha;
        float *cent = malloc((size_t)Hkv * D * C * 4), *q = malloc((size_t)Hq * D * 4), *agg = malloc((size_t)Hkv * nn * 4);
        uint8_t *codes = malloc((size_t)Hkv * n * M);
        int32_t *idx = malloc((size_t)Hkv * kk * 4), *idx0 = malloc((size_t)Hkv * kk * 4), *ri = malloc((size_t)kk * 4);
        int cnt[64];
        CHECK(cent && q && agg && codes && idx && idx0 && ri, "out of memory");
        for (size_t e = 0; e < (size_t)Hkv * D * C; e++) cent[e] = (float)kv_rng_normal(&r);
        for (int gm = 0; gm < Hkv * M; gm++)
            for (int j = 0; j < ds; j++) cent[((size_t)gm * ds + j) * C + 1] = cent[((size_t)gm * ds + j) * C];
        for (size_t e = 0; e < (size_t)Hq * D; e++) q[e] = cs[ci].zero_q ? 0.f : 2.0f * (float)kv_rng_normal(&r);
        for (size_t e = 0; e < (size_t)Hkv * n * M; e++)
            codes[e] = (uint8_t)(alpha < C && kv_rng_u64(&r) % 2000 == 0 ? (uint64_t)alpha
                                                                         : kv_rng_u64(&r) % (uint64_t)alpha);
        kv_pq_gpu *p = NULL;
        CHECK_OK(kv_pqcache_cuda.create(Hq, Hkv, n, D, M, C, &p));
        CHECK_OK(kv_pqcache_cuda.upload(p, cent, codes, 0, n));
        float scale = 1.0f / sqrtf((float)D);
        CHECK_OK(kv_pqcache_cuda.search(p, q, scale, lo, hi, k, idx0, kk, cnt, NULL, NULL));
        CHECK_OK(kv_pqcache_cuda.search(p, q, scale, lo, hi, k, idx, kk, cnt, agg, NULL));
        /* the search runs as a CUDA graph per (lo, hi, k, scale, agg wanted) (kv_graph_run), captured when a
         * shape comes twice in a row: back to the first shape (direct), the same again (captured), again
         * (replayed), and direct launches (KVBENCH_CUDA_GRAPHS=0) must all select what the first search did */
        static const char *how[4] = {"direct, after another shape", "captured", "graph replayed", "direct launches"};
        for (int pass = 0; pass < 4; pass++) {
            int32_t *idx2 = malloc((size_t)Hkv * kk * 4);
            CHECK(idx2, "out of memory");
            kv_test_env ev;
            if (pass == 3) kv_test_env_set(&ev, "KVBENCH_CUDA_GRAPHS", "0");
            kv_status gs = kv_pqcache_cuda.search(p, q, scale, lo, hi, k, idx2, kk, cnt, NULL, NULL);
            if (pass == 3) kv_test_env_restore(&ev);
            CHECK_OK(gs);
            int same = !memcmp(idx2, idx0, (size_t)Hkv * kk * 4);
            free(idx2);
            CHECK(same, "case %zu: search %d (%s) selected otherwise than the first, seed %llu", ci, pass + 3,
                  how[pass], (unsigned long long)seed);
        }
        for (int g = 0; g < Hkv; g++) {
            CHECK(cnt[g] == kk, "case %zu g %d: %d selected, want %d", ci, g, cnt[g], kk);
            CHECK(kv_topk_ref(agg + (size_t)g * nn, nn, k, lo, ri, NULL) == kk, "reference top-k failed");
            int ties = 0; /* keys scoring the k-th score: how much of the tie rule this case exercises */
            for (int i = 0; i < nn; i++) ties += agg[(size_t)g * nn + i] == agg[(size_t)g * nn + ri[kk - 1] - lo];
            for (int j = 0; j < kk; j++) {
                int a = idx[(size_t)g * kk + j], a0 = idx0[(size_t)g * kk + j], b = ri[j];
                CHECK(a == b && a0 == b,
                      "case %zu g %d rank %d: GPU %d / %d (score %.9g), kv_topk_ref %d (%.9g), %d keys at the "
                      "k-th score, seed %llu", ci, g, j, a0, a, a >= lo && a < hi ? agg[(size_t)g * nn + a - lo] : 0.f,
                      b, agg[(size_t)g * nn + b - lo], ties, (unsigned long long)seed);
            }
        }
        kv_pqcache_cuda.destroy(p);
        free(cent); free(q); free(agg); free(codes); free(idx); free(idx0); free(ri);
    }
    return KV_TEST_PASS;
}

/* ---- Quest ---- */

static kv_status make_layer(int T, int Hq, int Hkv, int D, uint64_t seed, kv_layer *L) {
    kv_synth_spec sp = {.tokens = T, .prefill = T / 2, .q_heads = Hq, .kv_heads = Hkv, .dim = D, .layers = 1,
                        .seed = seed, .half = 0, .with_v = 0};
    kv_synth *s;
    KV_TRY(kv_synth_create(&sp, 0, &s));
    *L = (kv_layer){.Hq = Hq, .Hkv = Hkv, .T = T, .D = D};
    L->q = malloc((size_t)Hq * T * D * sizeof(float));
    L->k = malloc((size_t)Hkv * T * D * sizeof(float));
    if (!L->q || !L->k) { kv_synth_destroy(s); kv_layer_free(L); return KV_ERR_NOMEM; }
    kv_synth_rows(s, 0, T, L->q, L->k, NULL);
    kv_synth_destroy(s);
    return KV_OK;
}

int test_quest_gpu_summaries_match_cpu(void) {
    if (!need_gpu()) return KV_TEST_SKIP;
    uint64_t seed = fresh_seed();
    kv_rng r;
    kv_rng_seed(&r, seed);
    static const struct { int Hq, Hkv, D, page, sink, T, P; } cs[] = {
        {8, 2, 64, 16, 3, 1500, 701}, {6, 2, 128, 5, 0, 900, 400}, {12, 4, 32, 32, 4, 2100, 1000},
        {6, 1, 40, 1, 2, 300, 100}, /* D = 40: the scalar summary kernel */
        {8, 8, 32, 1, 0, 36000, 34000}, /* 36000 pages x 8 kv heads: the 4-pages-per-thread bound scan */
    };
    const kv_method *m = kv_method_find("quest");
    CHECK(m && m->has_gpu, "quest has no GPU path");
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        int Hq = cs[ci].Hq, Hkv = cs[ci].Hkv, D = cs[ci].D, page = cs[ci].page, T = cs[ci].T, P = cs[ci].P;
        int G = Hq / Hkv, sink = cs[ci].sink;
        float *k = malloc((size_t)Hkv * T * D * 4), *kp = malloc((size_t)Hkv * P * D * 4), *k1 = malloc((size_t)Hkv * D * 4);
        int maxp = (T - sink) / page + 1;
        float *gmin = malloc((size_t)Hkv * maxp * D * 4), *gmax = malloc((size_t)Hkv * maxp * D * 4);
        float *q = malloc((size_t)Hq * D * 4), *gb = malloc((size_t)Hq * maxp * 4);
        int32_t *pages = malloc((size_t)Hq * maxp * 4), *ri = malloc((size_t)maxp * 4);
        CHECK(k && kp && k1 && gmin && gmax && q && gb && pages && ri, "out of memory");
        for (size_t e = 0; e < (size_t)Hkv * T * D; e++) /* signed zeros: min/max must keep the CPU's choice; */
            k[e] = e % 13 == 0 ? -0.0f : e % 11 == 0 ? 0.0f /* float16 values: the float16 store is exact too */
                   : kv_half_to_float(kv_float_to_half((float)kv_rng_normal(&r)));
        for (int g = 0; g < Hkv; g++) memcpy(kp + (size_t)g * P * D, k + (size_t)g * T * D, (size_t)P * D * 4);
        kv_shape sh = {.num_q_heads = Hq, .num_kv_heads = Hkv, .head_dim = D, .group = G, .max_tokens = T,
                       .prefill_len = P, .softmax_scale = 1.0f / sqrtf((float)D), .sink = sink, .local = 0, .seed = 1};
        kv_param_set ps;
        kv_params_init(&ps, m->params);
        char pa[32];
        snprintf(pa, sizeof pa, "page=%d", page);
        CHECK_OK(kv_params_set(&ps, "quest", pa));
        void *cpu = NULL;
        CHECK_OK(m->create(&sh, &ps, &cpu));
        CHECK_OK(m->build(cpu, &(kv_prefill){.n = P, .k = kp}));
        kv_quest_gpu *gq = NULL, *gh = NULL; /* float32 and float16 summaries */
        CHECK_OK(kv_quest_cuda.create(Hq, Hkv, T, D, page, sink, maxp, 0, &gq));
        CHECK_OK(kv_quest_cuda.create(Hq, Hkv, T, D, page, sink, maxp, 1, &gh));
        CHECK_OK(kv_quest_cuda.build(gq, kp, P));
        CHECK_OK(kv_quest_cuda.build(gh, kp, P));
        for (int t = P; t < T; t++) {
            for (int g = 0; g < Hkv; g++) memcpy(k1 + (size_t)g * D, k + ((size_t)g * T + t) * D, (size_t)D * 4);
            CHECK_OK(m->append(cpu, t, k1, NULL, NULL));
            CHECK_OK(kv_quest_cuda.append(gq, t, k1));
            CHECK_OK(kv_quest_cuda.append(gh, t, k1));
            if (t % (T > 10000 ? 997 : 211) && t != T - 1) continue;
          for (int store = 0; store < 2; store++) {
            kv_quest_gpu *gx = store ? gh : gq;
            kv_quest_view v;
            kv_quest_view_of(cpu, &v);
            CHECK(v.npages == (t + 1 - sink) / page, "npages %d", v.npages);
            CHECK_OK(kv_quest_cuda.summaries(gx, v.npages, gmin, gmax));
            for (int g = 0; g < Hkv; g++)
                for (int j = 0; j < v.npages; j++)
                    for (int i = 0; i < D; i++) {
                        size_t cpu_o = ((size_t)g * v.max_pages + j) * D + i, gpu_o = ((size_t)g * v.npages + j) * D + i;
                        CHECK(memcmp(&v.kmin[cpu_o], &gmin[gpu_o], 4) == 0 && memcmp(&v.kmax[cpu_o], &gmax[gpu_o], 4) == 0,
                              "case %zu store %d t %d g %d page %d ch %d: GPU min/max %.9g/%.9g, CPU %.9g/%.9g, "
                              "seed %llu", ci, store, t, g, j, i, gmin[gpu_o], gmax[gpu_o], v.kmin[cpu_o],
                              v.kmax[cpu_o], (unsigned long long)seed);
                    }
            if (v.npages < 1) continue;
            for (size_t e = 0; e < (size_t)Hq * D; e++) q[e] = (float)kv_rng_normal(&r);
            int kp_ = v.npages < 7 ? v.npages : 7;
            for (int pool = 0; pool < 3; pool += 2) {
                CHECK_OK(kv_quest_cuda.search(gx, q, sh.softmax_scale, pool, v.npages, kp_, pages, gb));
                for (int h = 0; h < Hq; h++) {
                    int g = h / G;
                    float *cb = malloc((size_t)v.npages * 4);
                    for (int j = 0; j < v.npages; j++) {
                        cb[j] = kv_quest_page_bound(q + (size_t)h * D, v.kmin + ((size_t)g * v.max_pages + j) * D,
                                                    v.kmax + ((size_t)g * v.max_pages + j) * D, D);
                        CHECK_CLOSE(gb[(size_t)h * v.npages + j], cb[j], 1e-6, 1e-5);
                    }
                    if (pool == 0) {
                        kv_topk_ref(cb, v.npages, kp_, 0, ri, NULL);
                        for (int j = 0; j < kp_; j++)
                            CHECK(pages[(size_t)h * kp_ + j] == ri[j], "case %zu t %d head %d rank %d: page %d, CPU %d",
                                  ci, t, h, j, pages[(size_t)h * kp_ + j], ri[j]);
                    }
                    free(cb);
                }
            }
          }
        }
        m->destroy(cpu);
        kv_quest_cuda.destroy(gq);
        kv_quest_cuda.destroy(gh);
        free(k); free(kp); free(k1); free(gmin); free(gmax); free(q); free(gb); free(pages); free(ri);
    }
    return KV_TEST_PASS;
}

/* ---- end to end: the retriever with use_gpu against its CPU path ---- */

typedef struct {
    const char *method;
    const char *params[3];
    int np, Hq, Hkv, D, T, P, sink, local, k;
} e2e_case;

/* Both paths over one layer; steps every `every` positions. tol: PQCache's
 * float tie tolerance (rank j may differ when the CPU scores agree within it). */
static int e2e_run(const e2e_case *c, const kv_layer *L, uint64_t seed) {
    const kv_method *m = kv_method_find(c->method);
    CHECK(m && m->has_gpu, "%s has no GPU path", c->method);
    int Hq = L->Hq, Hkv = L->Hkv, D = L->D, T = L->T, P = c->P, G = Hq / Hkv;
    kv_shape sh = {.num_q_heads = Hq, .num_kv_heads = Hkv, .head_dim = D, .group = G, .max_tokens = T,
                   .prefill_len = P, .softmax_scale = 1.0f / sqrtf((float)D), .sink = c->sink, .local = c->local,
                   .seed = 5};
    kv_param_set ps;
    kv_params_init(&ps, m->params);
    for (int i = 0; i < c->np; i++) CHECK_OK(kv_params_set(&ps, c->method, c->params[i]));
    void *cpu = NULL, *gpu = NULL;
    CHECK_OK(m->create(&sh, &ps, &cpu));
    sh.use_gpu = 1;
    CHECK_OK(m->create(&sh, &ps, &gpu));
    float *pk = malloc((size_t)Hkv * P * D * 4), *k1 = malloc((size_t)Hkv * D * 4), *q1 = malloc((size_t)Hq * D * 4);
    float *craw = malloc((size_t)G * T * 4), *cagg = malloc((size_t)T * 4);
    CHECK(pk && k1 && q1 && craw && cagg, "out of memory");
    for (int g = 0; g < Hkv; g++) memcpy(pk + (size_t)g * P * D, L->k + (size_t)g * T * D, (size_t)P * D * 4);
    CHECK_OK(m->build(cpu, &(kv_prefill){.n = P, .k = pk}));
    CHECK_OK(m->build(gpu, &(kv_prefill){.n = P, .k = pk}));
    int lists = m->per_kv_head ? Hkv : Hq;
    kv_selection sa, sb;
    CHECK_OK(kv_selection_alloc(&sa, lists, Hkv, c->k, T, T));
    CHECK_OK(kv_selection_alloc(&sb, lists, Hkv, c->k, T, T));
    int is_pq = !strcmp(c->method, "pqcache"), steps = 0, tied = 0;
    for (int t = P; t < T; t++) {
        for (int g = 0; g < Hkv; g++) memcpy(k1 + (size_t)g * D, L->k + ((size_t)g * T + t) * D, (size_t)D * 4);
        for (int h = 0; h < Hq; h++) memcpy(q1 + (size_t)h * D, L->q + ((size_t)h * T + t) * D, (size_t)D * 4);
        CHECK_OK(m->append(cpu, t, k1, NULL, q1));
        CHECK_OK(m->append(gpu, t, k1, NULL, q1));
        if (t % 53 && t != T - 1) continue;
        steps++;
        kv_selection_reset(&sa);
        kv_selection_reset(&sb);
        CHECK_OK(m->search(cpu, t, q1, c->k, &sa));
        CHECK_OK(m->search(gpu, t, q1, c->k, &sb));
        int lo = c->sink, hi = t + 1 - c->local;
        kv_pq_view va, vb;
        if (is_pq) {
            kv_pqcache_view(cpu, &va);
            kv_pqcache_view(gpu, &vb);
            for (size_t e = 0; e < (size_t)Hkv * T * va.M; e++)
                CHECK(va.codes[e] == vb.codes[e], "%s t %d: code %zu is %d on the GPU, %d on the CPU, seed %llu",
                      c->method, t, e, vb.codes[e], va.codes[e], (unsigned long long)seed);
        }
        for (int l = 0; l < lists; l++) {
            CHECK(sa.count[l] == sb.count[l], "%s t %d list %d: %d selected, CPU %d", c->method, t, l, sb.count[l],
                  sa.count[l]);
            if (is_pq && hi > lo)
                cpu_agg(va.cent, va.codes, q1, l, G, T, D, va.M, va.C, sh.softmax_scale, lo, hi, craw, cagg);
            for (int j = 0; j < sa.count[l]; j++) {
                int a = sb.idx[(size_t)l * sb.cap + j], b = sa.idx[(size_t)l * sa.cap + j];
                if (a == b) continue;
                CHECK(is_pq && a >= lo && a < hi &&
                          fabs((double)cagg[a - lo] - cagg[b - lo]) <= 1e-5 * fabs((double)cagg[b - lo]),
                      "%s t %d list %d rank %d: index %d, CPU %d, seed %llu", c->method, t, l, j, a, b,
                      (unsigned long long)seed);
                tied++;
            }
        }
        for (int g = 0; g < Hkv; g++) {
            CHECK(sa.n_extra[g] == sb.n_extra[g], "%s t %d: %d extra, CPU %d", c->method, t, sb.n_extra[g], sa.n_extra[g]);
            for (int j = 0; j < sa.n_extra[g]; j++)
                CHECK(sa.extra[(size_t)g * sa.extra_cap + j] == sb.extra[(size_t)g * sb.extra_cap + j], "extra differs");
        }
    }
    if (tied) fprintf(stderr, "    %s: %d ranks differ between float-tied keys over %d steps\n", c->method, tied, steps);
    kv_selection_free(&sa);
    kv_selection_free(&sb);
    m->destroy(cpu);
    m->destroy(gpu);
    free(pk); free(k1); free(q1); free(craw); free(cagg);
    return KV_TEST_PASS;
}

int test_pqcache_gpu_retriever_matches_cpu(void) {
    if (!need_gpu()) return KV_TEST_SKIP;
    uint64_t seed = fresh_seed();
    kv_rng r;
    kv_rng_seed(&r, seed);
    static const e2e_case cs[] = {
        {"pqcache", {"b=4"}, 1, 8, 2, 64, 2400, 1500, 4, 64, 100},
        {"pqcache", {"M=4", "b=5", "iters=3"}, 3, 6, 3, 32, 1500, 900, 0, 16, 40},
        {"pqcache", {"b=4", "recluster=200"}, 2, 4, 2, 64, 1400, 1000, 2, 32, 50},
    };
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const e2e_case *c = &cs[ci];
        kv_layer L = {.Hq = c->Hq, .Hkv = c->Hkv, .T = c->T, .D = c->D};
        L.k = malloc((size_t)c->Hkv * c->T * c->D * 4);
        L.q = malloc((size_t)c->Hq * c->T * c->D * 4);
        CHECK(L.k && L.q, "out of memory");
        int M = 2, b = 4;
        for (int i = 0; i < c->np; i++) {
            sscanf(c->params[i], "M=%d", &M);
            sscanf(c->params[i], "b=%d", &b);
        }
        clustered_keys(&r, L.k, c->Hkv, c->T, c->D, M, 1 << b, c->sink, c->P, 5); /* the retriever's seed: 5 + 0 */
        for (size_t e = 0; e < (size_t)c->Hq * c->T * c->D; e++) L.q[e] = (float)kv_rng_normal(&r);
        int rc = e2e_run(c, &L, seed);
        free(L.k);
        free(L.q);
        if (rc != KV_TEST_PASS) return rc;
    }
    return KV_TEST_PASS;
}

int test_quest_gpu_retriever_matches_cpu(void) {
    if (!need_gpu()) return KV_TEST_SKIP;
    uint64_t seed = fresh_seed();
    static const e2e_case cs[] = {
        {"quest", {"pool=none"}, 1, 8, 2, 64, 1600, 700, 4, 64, 100},
        {"quest", {"pool=mean"}, 1, 8, 2, 64, 1600, 700, 4, 64, 100},
        {"quest", {"pool=max", "page=8"}, 2, 12, 4, 32, 1300, 501, 3, 5, 64},
        {"quest", {"pool=none", "page=32"}, 2, 6, 3, 128, 1200, 600, 0, 0, 200},
        {"quest", {"pool=mean", "page=4"}, 2, 24, 2, 64, 900, 300, 1, 2, 30},
    };
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const e2e_case *c = &cs[ci];
        kv_layer L;
        CHECK_OK(make_layer(c->T, c->Hq, c->Hkv, c->D, seed + ci, &L));
        int rc = e2e_run(c, &L, seed);
        kv_layer_free(&L);
        if (rc != KV_TEST_PASS) return rc;
    }
    return KV_TEST_PASS;
}
