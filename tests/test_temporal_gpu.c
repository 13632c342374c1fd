/* test_temporal_gpu.c: FreeKV's and RACC's CUDA paths against their C
 * references (skipped without a GPU). FreeKV: the device cosine test's
 * flags equal the CPU's decision bitwise, including at tau equal to a
 * group's cosine; the retriever's selections and correction rate equal the
 * CPU's at every step on queries that drift (so both branches run). RACC:
 * the device vote equals kv_racc_vote to float rounding with some tokens
 * evicted; the retriever's selections (resident sets from the device votes,
 * retrieval through the shared score + top-k) equal the CPU's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/freekv.h"
#include "../kernels/ops/topk.h"
#include "../kernels/quest.h"
#include "../kernels/racc.h"
#include "../retrievers/pages.h"
#include "../retrievers/baselines.h"
#include "kv_test.h"

static int need_gpu(void) {
    if (kv_test_have_gpu()) return 1;
    kv_test_skip_reason("no GPU");
    return 0;
}

/* q_t = 0.9 q_{t-1} + 0.45 noise per head: adjacent cosines around 0.9,
 * so a tau of 0.9 corrects some heads at some steps and not others. */
static void drifting_queries(kv_layer *L, uint64_t seed) {
    kv_rng r;
    kv_rng_seed(&r, seed);
    for (int h = 0; h < L->Hq; h++)
        for (int t = 1; t < L->T; t++)
            for (int d = 0; d < L->D; d++) {
                size_t e = ((size_t)h * L->T + t) * L->D + d;
                L->q[e] = 0.9f * L->q[e - L->D] + 0.45f * (float)kv_rng_normal(&r);
            }
}

int test_freekv_gpu_cosine_flags(void) {
    if (!need_gpu()) return KV_TEST_SKIP;
    CHECK(&kv_freekv_cuda, "built without CUDA");
    int Hq = 12, Hkv = 4, D = 64, G = Hq / Hkv;
    kv_rng r;
    kv_rng_seed(&r, 5);
    float *q = malloc((size_t)Hq * D * 4), *qp = malloc((size_t)Hq * D * 4);
    for (int e = 0; e < Hq * D; e++) {
        qp[e] = (float)kv_rng_normal(&r);
        q[e] = 0.9f * qp[e] + 0.5f * (float)kv_rng_normal(&r);
    }
    for (int d = 0; d < D; d++) q[(size_t)(Hq - 1) * D + d] = 0; /* a zero query: cosine 0 */
    kv_freekv_gpu *g;
    CHECK_OK(kv_freekv_cuda.create(Hq, Hkv, D, &g));
    int flag[4];
    for (int gi = -1; gi < Hkv; gi++) { /* tau = 0.85, then exactly each group's cosine */
        double tau = gi < 0 ? 0.85 : kv_freekv_group_cosine(q + (size_t)gi * G * D, qp + (size_t)gi * G * D, G, D);
        CHECK_OK(kv_freekv_cuda.cosine(g, q, qp, tau, flag));
        for (int k = 0; k < Hkv; k++) {
            int want = kv_freekv_group_cosine(q + (size_t)k * G * D, qp + (size_t)k * G * D, G, D) < tau;
            CHECK(flag[k] == want, "tau %.17g kv head %d: GPU flag %d, CPU %d", tau, k, flag[k], want);
        }
    }
    kv_freekv_cuda.destroy(g);
    free(q); free(qp);
    return KV_TEST_PASS;
}

/* Both paths of `name` over L, every step: the same lists (in order), the same metric. */
static int both_paths(const char *name, const char *const *params, int np, const kv_layer *L, int P, int sink,
                      int local, int k) {
    kv_test_driver c, g;
    CHECK_OK(kv_test_driver_open(&c, name, params, np, L, P, sink, local, k));
    CHECK_OK(kv_test_driver_open_gpu(&g, name, params, np, L, P, sink, local, k));
    double msum = 0;
    for (int t = P; t < L->T; t++) {
        CHECK_OK(kv_test_driver_step(&c, t, k));
        CHECK_OK(kv_test_driver_step(&g, t, k));
        CHECK(c.sel.metric == g.sel.metric || (isnan(c.sel.metric) && isnan(g.sel.metric)),
              "%s step %d: metric %g on the GPU, %g on the CPU", name, t, g.sel.metric, c.sel.metric);
        msum += c.sel.metric;
        for (int l = 0; l < c.sel.n_lists; l++) {
            CHECK(c.sel.count[l] == g.sel.count[l], "%s step %d list %d: %d selected on the GPU, %d on the CPU", name, t,
                  l, g.sel.count[l], c.sel.count[l]);
            for (int j = 0; j < c.sel.count[l]; j++)
                CHECK(c.sel.idx[(size_t)l * c.sel.cap + j] == g.sel.idx[(size_t)l * g.sel.cap + j],
                      "%s step %d list %d rank %d: %d on the GPU, %d on the CPU", name, t, l, j,
                      g.sel.idx[(size_t)l * g.sel.cap + j], c.sel.idx[(size_t)l * c.sel.cap + j]);
        }
        for (int h = 0; h < L->Hkv; h++) CHECK(c.sel.n_extra[h] == g.sel.n_extra[h], "%s step %d: extra differ", name, t);
    }
    fprintf(stderr, "    %s: mean metric %.4f over %d steps\n", name, msum / (L->T - P), L->T - P);
    kv_test_driver_close(&c);
    kv_test_driver_close(&g);
    return KV_TEST_PASS;
}

int test_freekv_gpu_matches_cpu(void) {
    if (!need_gpu()) return KV_TEST_SKIP;
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(1500, 700, 8, 2, 64, 91, &L));
    drifting_queries(&L, 92);
    const char *p1[] = {"tau=0.9"}, *p2[] = {"tau=0.9", "correct=0"}, *p3[] = {"tau=0.95", "page=8"};
    int rc = both_paths("freekv", p1, 1, &L, 700, 4, 64, 100);
    if (rc == KV_TEST_PASS) rc = both_paths("freekv", p2, 2, &L, 700, 4, 64, 100);
    if (rc == KV_TEST_PASS) rc = both_paths("freekv", p3, 2, &L, 700, 2, 5, 64); /* local < page: extra tokens */
    kv_layer_free(&L);
    return rc;
}

/* One device vote against kv_racc_vote (double, the CPU's order) with ~30%
 * of the tokens evicted. Tolerance: 1e-6 relative on the float votes; the
 * scores are bitwise the CPU's on both device paths (kv_dot_ref's order),
 * only CUDA's exp and the order of the double sums differ (~1e-15), so the
 * bound is float rounding of the result with a wide margin. */
static int racc_vote_case(int Hq, int Hkv, int T, int D, int W, int lo, int hi, uint64_t seed) {
    int G = Hq / Hkv;
    kv_rng r;
    kv_rng_seed(&r, seed);
    float *K = malloc((size_t)Hkv * T * D * 4), *qw = malloc((size_t)Hq * W * D * 4), *vote = malloc((size_t)Hkv * T * 4);
    uint8_t *ev = calloc((size_t)Hkv * T, 1);
    int32_t *cand = malloc((size_t)T * 4);
    double *want = malloc((size_t)T * 8);
    float *scr = malloc((size_t)T * 4);
    CHECK(K && qw && vote && ev && cand && want && scr, "out of memory");
    for (size_t e = 0; e < (size_t)Hkv * T * D; e++) K[e] = (float)kv_rng_normal(&r);
    for (size_t e = 0; e < (size_t)Hq * W * D; e++) qw[e] = (float)kv_rng_normal(&r);
    for (int i = 0; i < Hkv * T; i++) ev[i] = kv_rng_uniform(&r) < 0.3;
    kv_racc_gpu *g;
    CHECK_OK(kv_racc_cuda.create(Hq, Hkv, T, D, W, &g));
    CHECK_OK(kv_racc_cuda.write_keys(g, 0, T, K));
    CHECK_OK(kv_racc_cuda.set_evicted(g, T, ev));
    float scale = 1.0f / sqrtf((float)D);
    CHECK_OK(kv_racc_cuda.vote(g, qw, scale, lo, hi, vote));
    for (int h = 0; h < Hkv; h++) {
        int nc = 0;
        for (int i = lo; i < hi; i++)
            if (!ev[(size_t)h * T + i]) cand[nc++] = i;
            else CHECK(isinf(vote[(size_t)h * (hi - lo) + i - lo]), "D %d: evicted position %d has vote %g", D, i,
                       vote[(size_t)h * (hi - lo) + i - lo]);
        kv_racc_vote(qw + (size_t)h * G * W * D, G, W, K + (size_t)h * T * D, D, cand, nc, scale, want, scr);
        for (int i = 0; i < nc; i++)
            CHECK_CLOSE(vote[(size_t)h * (hi - lo) + cand[i] - lo], (float)want[i], 0, 1e-6);
    }
    kv_racc_cuda.destroy(g);
    free(K); free(qw); free(vote); free(ev); free(cand); free(want); free(scr);
    return KV_TEST_PASS;
}

/* Both vote kernels for D % 8 == 0: the tiled one (racc_scores.cu, the
 * default; D 64, 128, 256) and the fused two-sweep one
 * (KVBENCH_RACC_VOTE=fused; every D % 8 == 0): rows per kv head 64 (one row
 * tile), 10 (a partial one), 80 (two), spans not multiples of the 64-key
 * tile, a span of three 16384-key chunks of the tiled row sums; the fused
 * kernel alone for D 40, the older three-sweep path for
 * D 36. */
int test_racc_gpu_vote_matches_cpu(void) {
    if (!need_gpu()) return KV_TEST_SKIP;
    CHECK(&kv_racc_cuda, "built without CUDA");
    int rc = KV_TEST_PASS;
    for (int pass = 0; pass < 2 && rc == KV_TEST_PASS; pass++) {
        kv_test_env ev;
        kv_test_env_set(&ev, "KVBENCH_RACC_VOTE", pass ? "fused" : "tiled");
        rc = racc_vote_case(8, 2, 3000, 64, 16, 4, 2900, 17);
        if (rc == KV_TEST_PASS) rc = racc_vote_case(6, 3, 2100, 128, 5, 0, 2077, 18);
        if (rc == KV_TEST_PASS) rc = racc_vote_case(16, 4, 2500, 128, 20, 7, 2431, 21);
        if (rc == KV_TEST_PASS) rc = racc_vote_case(4, 2, 1300, 256, 9, 2, 1299, 22);
        if (rc == KV_TEST_PASS) rc = racc_vote_case(2, 1, 40000, 64, 4, 5, 39998, 23); /* row sums in 3 chunks */
        kv_test_env_restore(&ev);
    }
    if (rc == KV_TEST_PASS) rc = racc_vote_case(4, 1, 9000, 40, 33, 3, 8999, 19);
    if (rc == KV_TEST_PASS) rc = racc_vote_case(4, 2, 1500, 36, 8, 1, 1400, 20);
    return rc;
}

int test_racc_gpu_matches_cpu(void) {
    if (!need_gpu()) return KV_TEST_SKIP;
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(1600, 600, 8, 2, 64, 93, &L));
    const char *p1[] = {"Ln=100", "window=16"}, *p2[] = {"Ln=37", "alpha=0.5", "window=8", "beta=0.05"};
    int rc = both_paths("racc", p1, 2, &L, 600, 4, 64, 100);
    if (rc == KV_TEST_PASS) rc = both_paths("racc", p2, 4, &L, 600, 0, 8, 100);
#ifdef KV_HAVE_FAISS /* votes on the device, the Faiss retrieval on the host */
    const char *p3[] = {"Ln=100", "window=16", "index=faiss-ivf", "nlist=8", "nprobe=8"};
    if (rc == KV_TEST_PASS) rc = both_paths("racc", p3, 5, &L, 600, 4, 64, 100);
#endif
    kv_layer_free(&L);
    return rc;
}

/* FreeKV's selection (Quest's search with pool=mean) on the device against
 * the CPU's pages.c: bounds bitwise kv_pages_bound's, pages equal to the top
 * kp of kv_pages_pool_mean by kv_topk_ref, except that two pages may swap
 * where their CPU pooled scores agree within 1e-6 relative (CUDA's expf is
 * within 2 ulp of glibc's). The shapes cover the fused path
 * (kernels/pages_pipe.cu, or pages_mean.cu under KVBENCH_PAGES_PIPE=0:
 * groups of 1, 2, 4, 8; the ring scan and, from 256 scan blocks, the
 * register scan (KVBENCH_PAGES_RSCAN=0|1 forces either on every case:
 * scripts/device_check.sh runs these tests so); one chunk and many,
 * so the last-block merge; a head dimension with a channel tail; float32
 * and float16 summaries; kp <= 4 through the pool's top-4 merge network, larger kp through its argmax
 * rounds) and the unfused path (kp 17 > PM_KMAX, group of 3); two cases
 * with edge values (see pm_case.edge). */
typedef struct {
    int Hq, Hkv, D, page, npages, kp, half; /* half: float16 keys and summaries (the bench's) */
    /* edge: keys on a grid of 0.5 (+0 and -0 among them; with page 1 every min is its max), q with +0 and -0
     * entries, and where page > 1 a key of +inf in channel 0 every 7 tokens, a channel whose q is +-0 in every
     * head. There the CPU's max(q * mx, q * mn) is q * mn (0 * inf is NaN, and NaN > b is false), so the scan's
     * one product per channel must take the min row for q = +-0: a rule q >= 0 -> max row gives NaN bounds. */
    int edge;
} pm_case;

static int pool_mean_case(const pm_case *c, uint64_t seed) {
    const int Hq = c->Hq, Hkv = c->Hkv, D = c->D, G = Hq / Hkv, page = c->page, T = page * c->npages, P = c->npages;
    kv_rng r;
    kv_rng_seed(&r, seed);
    float *k = malloc((size_t)Hkv * T * D * 4), *q = malloc((size_t)Hq * D * 4), *gb = malloc((size_t)Hq * P * 4);
    float *mn = malloc((size_t)Hkv * P * D * 4), *mx = malloc((size_t)Hkv * P * D * 4), *cb = malloc((size_t)Hq * P * 4);
    float *pool = malloc((size_t)P * 4);
    int32_t *pages = malloc((size_t)Hkv * c->kp * 4), *ri = malloc((size_t)c->kp * 4);
    CHECK(k && q && gb && mn && mx && cb && pool && pages && ri, "out of memory");
    for (size_t e = 0; e < (size_t)Hkv * T * D; e++) {
        k[e] = (float)kv_rng_normal(&r);
        if (c->edge) k[e] = roundf(k[e] * 2.f) * 0.5f * (e % 3 ? 1.f : 1e-3f); /* -0 where a small negative rounds */
        if (c->edge && page > 1 && e % D == 0 && e / D % 7 == 0) k[e] = INFINITY; /* every page keeps a finite min */
        if (c->half) k[e] = kv_half_to_float(kv_float_to_half(k[e])); /* the float16 summaries are then exact */
    }
    for (size_t e = 0; e < (size_t)Hq * D; e++) {
        q[e] = 2.0f * (float)kv_rng_normal(&r);
        if (c->edge && (e % 5 == 0 || e % D == 0)) q[e] = e % 2 ? -0.f : 0.f;
    }
    for (int g = 0; g < Hkv; g++)
        for (int j = 0; j < P; j++)
            for (int i = 0; i < D; i++) {
                float a = INFINITY, b = -INFINITY;
                for (int o = 0; o < page; o++) {
                    float v = k[((size_t)g * T + (size_t)j * page + o) * D + i];
                    a = v < a ? v : a;
                    b = v > b ? v : b;
                }
                mn[((size_t)g * P + j) * D + i] = a;
                mx[((size_t)g * P + j) * D + i] = b;
            }
    const float scale = 1.0f / sqrtf((float)D);
    kv_quest_gpu *gq;
    CHECK_OK(kv_quest_cuda.create(Hq, Hkv, T, D, page, 0, P, c->half, &gq));
    CHECK_OK(kv_quest_cuda.build(gq, k, T));
    CHECK_OK(kv_quest_cuda.search(gq, q, scale, 1, P, c->kp, pages, gb));
    int swaps = 0;
    for (int h = 0; h < Hq; h++)
        for (int j = 0; j < P; j++) {
            size_t o = ((size_t)(h / G) * P + j) * D;
            cb[(size_t)h * P + j] = kv_pages_bound(q + (size_t)h * D, mn + o, mx + o, D);
            CHECK(memcmp(&cb[(size_t)h * P + j], &gb[(size_t)h * P + j], 4) == 0, "head %d page %d: bound %.9g, CPU %.9g",
                  h, j, gb[(size_t)h * P + j], cb[(size_t)h * P + j]);
        }
    for (int g = 0; g < Hkv; g++) {
        kv_pages_pool_mean(cb + (size_t)g * G * P, (size_t)P, G, P, scale, pool);
        CHECK(kv_topk_ref(pool, P, c->kp, 0, ri, NULL) == c->kp, "top-k");
        for (int j = 0; j < c->kp; j++) {
            int a = pages[(size_t)g * c->kp + j], b = ri[j];
            if (a == b) continue;
            CHECK(a >= 0 && a < P && fabsf(pool[a] - pool[b]) <= 1e-6f * fabsf(pool[b]),
                  "G %d P %d kp %d kv head %d rank %d: page %d (pooled %.9g), CPU %d (%.9g)", G, P, c->kp, g, j, a,
                  a >= 0 && a < P ? pool[a] : 0.f, b, pool[b]);
            swaps++;
        }
    }
    if (swaps) fprintf(stderr, "    pool=mean G %d P %d: %d ranks swapped between near-equal pages\n", G, P, swaps);
    kv_quest_cuda.destroy(gq);
    free(k); free(q); free(gb); free(mn); free(mx); free(cb); free(pool); free(pages); free(ri);
    return KV_TEST_PASS;
}

int test_freekv_gpu_group_mean_pages(void) {
    if (!need_gpu()) return KV_TEST_SKIP;
    CHECK(&kv_quest_cuda, "built without CUDA");
    static const pm_case cs[] = {
        {8, 2, 64, 16, 700, 7, 0, 0},     /* G 4, one page per thread, one chunk */
        {16, 8, 32, 1, 40000, 16, 0, 0},  /* G 2, the register scan (float32, >= 256 blocks), 20 chunks merged */
        {8, 8, 44, 4, 5000, 5, 0, 0},     /* G 1, channel tail (44 = 5 x 8 + 4) */
        {16, 2, 64, 8, 3000, 16, 0, 0},   /* G 8 */
        {16, 8, 128, 32, 9000, 3, 0, 0},  /* the bench's shape, FreeKV's defaults */
        {8, 2, 64, 16, 700, 17, 0, 0},    /* kp > PM_KMAX: the older path */
        {12, 4, 32, 16, 600, 6, 0, 0},    /* G 3: the older path */
        {16, 8, 128, 32, 700, 3, 1, 0},  /* float16 summaries, one page per thread (pages_pipe.cu) */
        {16, 8, 64, 1, 16400, 5, 1, 0},  /* float16, the register scan (264 blocks), a partial tile, 9 chunks */
        {16, 8, 40, 1, 16400, 5, 1, 0},  /* the same with D 40 (not two register batches): the ring, 2 pages a thread */
        {16, 8, 128, 2, 40000, 4, 1, 0},  /* kp = 4, the most the top-4 merge network takes, 20 chunks, register scan
                                           * (page 2: 80000 keys; at page 32, 1.28M keys, the test took ~100 s) */
        {8, 8, 44, 4, 5000, 1, 0, 0},     /* kp = 1 through the network, G 1 */
        {16, 8, 128, 1, 16400, 3, 1, 1}, /* edge values, float16, page 1 (every min equals its max), register scan */
        {8, 2, 64, 16, 700, 7, 0, 1},    /* edge values, float32, page 16 */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        int rc = pool_mean_case(&cs[i], 31 + i);
        if (rc != KV_TEST_PASS) return rc;
    }
    return KV_TEST_PASS;
}
