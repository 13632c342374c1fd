/* test_csattention.c: CSAttention (retrievers/csattention.c) piece by piece
 * against brute forces written here: the cosine k-means reaches the fixed
 * point of separable data (the normalised cluster means) and is
 * deterministic for a seed; every centroid's list is the brute-force top-L
 * of the partial scores, before and after try-inserting the decode keys
 * (update=1), and frozen with update=0; the reduce-by-key equals a direct
 * per-key sum for both `missing` rules; a whole search equals the top k of
 * the direct sums over the nearest centroids' lists, and its candidate set
 * is the distinct gathered keys. Contract checks at the ablation settings. */
#include <stdlib.h>
#include <string.h>

#include "../kernels/ops/score.h"
#include "../retrievers/query_centric.h"
#include "kv_test.h"

static const float *key_of(const kv_layer *L, int g, int t) { return L->k + ((size_t)g * L->T + t) * L->D; }

int test_csattention_kmeans_fixed_point(void) {
    int d = 8, C = 4, per = 50, n = C * per;
    float *x = malloc((size_t)n * d * sizeof(float)), *c1 = malloc((size_t)C * d * sizeof(float)),
          *c2 = malloc((size_t)C * d * sizeof(float)), *c3 = malloc((size_t)C * d * sizeof(float));
    int *truth = malloc((size_t)n * sizeof(int));
    kv_rng r;
    kv_rng_seed(&r, 17);
    /* cluster a around basis vector 2a (orthogonal centres), points interleaved */
    for (int i = 0; i < n; i++) {
        int a = i % C;
        float v[8];
        for (int j = 0; j < d; j++) v[j] = (j == 2 * a ? 1.f : 0.f) + 0.08f * (float)kv_rng_normal(&r);
        kv_cs_normalise(v, 1, d, d, x + (size_t)i * d);
        truth[i] = a;
    }
    CHECK_OK(kv_cs_kmeans(x, n, d, C, 20, 5, c1));
    CHECK_OK(kv_cs_kmeans(x, n, d, C, 21, 5, c2));
    CHECK_OK(kv_cs_kmeans(x, n, d, C, 20, 5, c3));
    CHECK(!memcmp(c1, c3, (size_t)C * d * sizeof(float)), "same seed, different centroids");
    CHECK(!memcmp(c1, c2, (size_t)C * d * sizeof(float)), "one more round moved the centroids: not a fixed point");
    /* each centroid is the normalised mean of exactly one true cluster */
    int used[4] = {0};
    for (int c = 0; c < C; c++) {
        int a = -1;
        for (int i = 0; i < n; i++)
            if (kv_cs_nearest(x + (size_t)i * d, c1, C, d) == c) {
                CHECK(a < 0 || truth[i] == a, "centroid %d mixes clusters %d and %d", c, a, truth[i]);
                a = truth[i];
            }
        CHECK(a >= 0 && !used[a], "centroid %d: cluster %d (empty or shared)", c, a);
        used[a] = 1;
        double mean[8] = {0}, nn = 0;
        for (int i = a; i < n; i += C)
            for (int j = 0; j < d; j++) mean[j] += x[(size_t)i * d + j];
        for (int j = 0; j < d; j++) nn += mean[j] * mean[j];
        for (int j = 0; j < d; j++) CHECK_CLOSE(c1[(size_t)c * d + j], mean[j] / sqrt(nn), 1e-6, 0);
    }
    /* another seed: the same fixed point up to the order of the centroids */
    CHECK_OK(kv_cs_kmeans(x, n, d, C, 20, 99, c2));
    for (int c = 0; c < C; c++) {
        int found = 0;
        for (int e = 0; e < C; e++) {
            int same = 1;
            for (int j = 0; j < d; j++) same &= fabsf(c2[(size_t)e * d + j] - c1[(size_t)c * d + j]) < 1e-6f;
            found |= same;
        }
        CHECK(found, "seed 99 misses centroid %d of seed 5", c);
    }
    /* the nearest centroid is the largest cosine (double brute force) */
    for (int i = 0; i < n; i++) {
        int best = 0;
        double bv = -1e30;
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int j = 0; j < d; j++) s += (double)x[(size_t)i * d + j] * c1[(size_t)c * d + j];
            if (s > bv) { bv = s; best = c; }
        }
        CHECK(kv_cs_nearest(x + (size_t)i * d, c1, C, d) == best, "point %d", i);
    }
    free(x); free(c1); free(c2); free(c3); free(truth);
    return KV_TEST_PASS;
}

/* (score desc, index asc) */
typedef struct { float v; int i; } pair;
static int cmp_pair(const void *a, const void *b) {
    const pair *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}
static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

/* Every list of the view equals the brute-force top-L of positions [lo, hi). */
static int lists_are_top_l(const kv_cs_view *v, const kv_layer *L, int Hkv, int lo, int hi) {
    int n = hi - lo;
    pair *all = malloc((size_t)n * sizeof(pair));
    int *got = malloc((size_t)v->L * sizeof(int)), *want = malloc((size_t)v->L * sizeof(int));
    for (int g = 0; g < Hkv; g++)
        for (int b = 0; b < v->m; b++)
            for (int c = 0; c < v->C; c++) {
                size_t li = ((size_t)g * v->m + b) * v->C + c;
                const float *cent = v->cent + li * v->ds;
                for (int i = 0; i < n; i++)
                    all[i] = (pair){kv_dot_ref(cent, key_of(L, g, lo + i) + (size_t)b * v->ds, v->ds), lo + i};
                qsort(all, (size_t)n, sizeof(pair), cmp_pair);
                int want_n = n < v->L ? n : v->L;
                CHECK(v->lcnt[li] == want_n, "list (%d,%d,%d): %d entries, want %d", g, b, c, v->lcnt[li], want_n);
                for (int j = 0; j < want_n; j++) {
                    got[j] = v->lidx[li * v->L + j];
                    want[j] = all[j].i;
                    /* the stored score is the key's partial score */
                    float sc = kv_dot_ref(cent, key_of(L, g, got[j]) + (size_t)b * v->ds, v->ds);
                    CHECK(sc == v->lval[li * v->L + j], "list (%d,%d,%d) entry %d: score %g, want %g", g, b, c, j,
                          v->lval[li * v->L + j], sc);
                }
                qsort(got, (size_t)want_n, sizeof(int), cmp_int);
                qsort(want, (size_t)want_n, sizeof(int), cmp_int);
                CHECK(!memcmp(got, want, (size_t)want_n * sizeof(int)), "list (%d,%d,%d) is not the top-%d of [%d, %d)",
                      g, b, c, v->L, lo, hi);
            }
    free(all); free(got); free(want);
    return KV_TEST_PASS;
}

int test_csattention_lists_are_top_l(void) {
    int T = 600, P = 300, sink = 4, local = 16;
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(T, P, 4, 2, 32, 5, &L));
    const char *ps[] = {"m=4", "C=8", "alpha=0.1", "iters=3"};
    kv_test_driver dr, d2;
    CHECK_OK(kv_test_driver_open(&dr, "csattention", ps, 4, &L, P, sink, local, 16));
    kv_cs_view v;
    kv_csattention_view(dr.st, &v);
    CHECK(v.L == (int)ceil(0.1 * (P - sink)) && v.m == 4 && v.ds == 8 && v.C == 8, "L %d m %d ds %d C %d", v.L, v.m,
          v.ds, v.C);
    for (int c = 0; c < 2 * 4 * 8; c++) { /* unit centroids */
        double nn = 0;
        for (int j = 0; j < 8; j++) nn += (double)v.cent[(size_t)c * 8 + j] * v.cent[(size_t)c * 8 + j];
        CHECK_CLOSE(nn, 1.0, 1e-5, 0);
    }
    if (lists_are_top_l(&v, &L, 2, sink, P) != KV_TEST_PASS) return KV_TEST_FAIL;
    /* deterministic: a second build has bitwise the same centroids */
    CHECK_OK(kv_test_driver_open(&d2, "csattention", ps, 4, &L, P, sink, local, 16));
    kv_cs_view v2;
    kv_csattention_view(d2.st, &v2);
    CHECK(!memcmp(v.cent, v2.cent, (size_t)2 * 4 * 8 * 8 * sizeof(float)), "two builds, different centroids");
    kv_test_driver_close(&d2);
    /* try-insert: after 250 decode keys every list is the top-L of all keys seen */
    CHECK_OK(kv_test_driver_step(&dr, P + 250, 16));
    kv_csattention_view(dr.st, &v);
    if (lists_are_top_l(&v, &L, 2, sink, P + 251) != KV_TEST_PASS) return KV_TEST_FAIL;
    kv_test_driver_close(&dr);
    /* update=0: the lists stay those of the prefill */
    const char *ps0[] = {"m=4", "C=8", "alpha=0.1", "iters=3", "update=0"};
    CHECK_OK(kv_test_driver_open(&dr, "csattention", ps0, 5, &L, P, sink, local, 16));
    CHECK_OK(kv_test_driver_step(&dr, P + 250, 16));
    kv_csattention_view(dr.st, &v);
    if (lists_are_top_l(&v, &L, 2, sink, P) != KV_TEST_PASS) return KV_TEST_FAIL;
    kv_test_driver_close(&dr);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}

int test_csattention_reduce_matches_direct(void) {
    enum { M = 3, LL = 40, N = 100 };
    int32_t idx[M][LL];
    float val[M][LL];
    int cnt[M] = {LL, LL - 7, 0 + 25};
    kv_rng r;
    kv_rng_seed(&r, 8);
    for (int b = 0; b < M; b++) {
        int used[N] = {0};
        for (int j = 0; j < cnt[b]; j++) {
            int i;
            do i = (int)(kv_rng_uniform(&r) * N); while (used[i]);
            used[i] = 1;
            idx[b][j] = i;
            val[b][j] = (float)kv_rng_normal(&r);
        }
    }
    const int32_t *ip[M] = {idx[0], idx[1], idx[2]};
    const float *vp[M] = {val[0], val[1], val[2]};
    float acc[N], tmp[N];
    int stamp[N] = {0}, epoch = 0, lo = 5, hi = 90;
    int32_t u[M * LL];
    const float wts[M] = {0.5f, 2.25f, 1.5f};
    for (int mw = 0; mw < 4; mw++) {
        int missing = mw & 1;
        const float *w = mw & 2 ? wts : NULL;
        int nu = kv_cs_reduce(M, ip, vp, cnt, w, lo, hi, missing, u, acc, tmp, stamp, &epoch);
        /* direct: membership and per-key sums in subspace order */
        int inu[N] = {0}, want_n = 0;
        for (int i = lo; i < hi; i++) {
            float s = 0.f;
            int any = 0;
            for (int b = 0; b < M; b++) {
                float miss = 0.f;
                if (missing && cnt[b]) {
                    miss = val[b][0];
                    for (int j = 1; j < cnt[b]; j++) miss = fminf(miss, val[b][j]);
                }
                int found = -1;
                for (int j = 0; j < cnt[b]; j++) found = idx[b][j] == i ? j : found;
                any |= found >= 0;
                s += (w ? w[b] : 1.f) * (found >= 0 ? val[b][found] : miss);
            }
            if (!any) continue;
            want_n++;
            inu[i] = 1;
            int seen = 0;
            for (int a = 0; a < nu; a++) seen += u[a] == i;
            CHECK(seen == 1, "missing=%d: key %d appears %d times in U", missing, i, seen);
            CHECK(acc[i] == s, "missing=%d: key %d sum %.9g, direct %.9g", missing, i, acc[i], s);
        }
        CHECK(nu == want_n, "missing=%d: |U| = %d, want %d", missing, nu, want_n);
        for (int a = 0; a < nu; a++) CHECK(inu[u[a]], "missing=%d: %d in U but in no list inside [lo, hi)", missing, u[a]);
    }

    /* a whole search: top k of the direct sums over the nearest centroids' lists */
    int T = 500, P = 300, sink = 4, local = 16, k = 20, Hq = 4, G = 2, D = 32;
    kv_layer Ly;
    CHECK_OK(kv_test_synth_layer(T, P, Hq, 2, D, 9, &Ly));
    for (int combo = 0; combo < 8; combo++) {
            int missing = combo & 1, pool = (combo >> 1) & 1, weight = combo >> 2;
            char pm[32], pp[32];
            snprintf(pm, sizeof pm, "missing=%s", missing ? "min" : "zero");
            snprintf(pp, sizeof pp, "pool=%s", pool ? "mean" : "none");
            const char *ps[] = {"m=4", "C=6", "alpha=0.15", "iters=4", pm, pp, weight ? "weight=qnorm" : "weight=one"};
            kv_test_driver dr;
            CHECK_OK(kv_test_driver_open(&dr, "csattention", ps, 7, &Ly, P, sink, local, k));
            for (int t = P; t < T; t += 60) {
                CHECK_OK(kv_test_driver_step(&dr, t, k));
                kv_cs_view v;
                kv_csattention_view(dr.st, &v);
                int hi = t + 1 - local;
                for (int h = 0; h < Hq; h++) {
                    int g = h / G;
                    float qv[32];
                    for (int j = 0; j < D; j++) {
                        if (!pool) { qv[j] = Ly.q[((size_t)h * T + t) * D + j]; continue; }
                        float a = 0.f;
                        for (int hh = g * G; hh < (g + 1) * G; hh++) a += Ly.q[((size_t)hh * T + t) * D + j];
                        qv[j] = a / G;
                    }
                    double sum[600];
                    int member[600] = {0}, nmem = 0;
                    for (int i = 0; i < T; i++) sum[i] = 0;
                    for (int b = 0; b < v.m; b++) {
                        size_t cb = ((size_t)g * v.m + b) * v.C;
                        int j = kv_cs_nearest(qv + b * v.ds, v.cent + cb * v.ds, v.C, v.ds);
                        const int32_t *li = v.lidx + (cb + j) * v.L;
                        const float *lv = v.lval + (cb + j) * v.L;
                        int c = v.lcnt[cb + j];
                        float mn = c ? lv[0] : 0.f;
                        for (int a = 1; a < c; a++) mn = fminf(mn, lv[a]);
                        float wb = weight ? sqrtf(kv_dot_ref(qv + b * v.ds, qv + b * v.ds, v.ds)) : 1.f;
                        for (int i = sink; i < hi; i++) {
                            int f = -1;
                            for (int a = 0; a < c; a++) f = li[a] == i ? a : f;
                            if (f >= 0 && !member[i]) { member[i] = 1; nmem++; }
                            sum[i] = (float)(sum[i] + wb * (f >= 0 ? lv[f] : (missing ? mn : 0.f)));
                        }
                    }
                    pair *pr = malloc((size_t)nmem * sizeof(pair));
                    int np = 0;
                    for (int i = sink; i < hi; i++)
                        if (member[i]) pr[np++] = (pair){(float)sum[i], i};
                    qsort(pr, (size_t)np, sizeof(pair), cmp_pair);
                    int want = np < k ? np : k;
                    CHECK(dr.sel.n_cand[h] == nmem, "t %d h %d: %d candidates, want %d", t, h, dr.sel.n_cand[h], nmem);
                    CHECK(dr.sel.count[h] == want, "t %d h %d: %d selected, want %d", t, h, dr.sel.count[h], want);
                    for (int a = 0; a < want; a++)
                        CHECK(dr.sel.idx[(size_t)h * dr.sel.cap + a] == pr[a].i, "%s %s t %d h %d rank %d: %d, want %d",
                              pm, pp, t, h, a, dr.sel.idx[(size_t)h * dr.sel.cap + a], pr[a].i);
                    for (int a = 0; a < dr.sel.n_cand[h]; a++)
                        CHECK(member[dr.sel.cand[(size_t)h * dr.sel.cand_cap + a]], "candidate not in a gathered list");
                    free(pr);
                }
            }
            kv_test_driver_close(&dr);
        }
    kv_layer_free(&Ly);
    return KV_TEST_PASS;
}

int test_csattention_variants(void) {
    int T = 500, P = 300, sink = 4, local = 16, k = 20;
    kv_layer L;
    CHECK_OK(kv_test_synth_layer(T, P, 4, 2, 32, 13, &L));
    const char *sets[][4] = {
        {"centroids=keys", "m=8", "C=16", "alpha=0.25"},
        {"pool=mean", "m=2", "C=4", "alpha=0.5"},
        {"missing=min", "update=0", "max_points=100", "iters=0"},
    };
    kv_cs_view vq, vk;
    for (int s = 0; s < 3; s++) {
        kv_test_driver dr;
        CHECK_OK(kv_test_driver_open(&dr, "csattention", sets[s], 4, &L, P, sink, local, k));
        for (int t = P; t < T; t += 37) {
            CHECK_OK(kv_test_driver_step(&dr, t, k));
            for (int h = 0; h < 4; h++) {
                CHECK(dr.sel.count[h] > 0 && dr.sel.count[h] <= k, "%s: count %d", sets[s][0], dr.sel.count[h]);
                for (int a = 0; a < dr.sel.count[h]; a++) {
                    int i = dr.sel.idx[(size_t)h * dr.sel.cap + a];
                    CHECK(i >= sink && i < t + 1 - local, "%s: index %d outside the region at %d", sets[s][0], i, t);
                }
                if (s == 1 && h % 2) /* pool=mean: the group shares one selection */
                    CHECK(dr.sel.count[h] == dr.sel.count[h - 1] &&
                              !memcmp(dr.sel.idx + (size_t)h * dr.sel.cap, dr.sel.idx + (size_t)(h - 1) * dr.sel.cap,
                                      (size_t)dr.sel.count[h] * sizeof(int32_t)),
                          "pool=mean: heads %d and %d differ", h - 1, h);
            }
        }
        if (s == 0) { /* key-centric centroids differ from the query-centric ones */
            kv_test_driver dq;
            const char *pq[] = {"m=8", "C=16", "alpha=0.25"};
            CHECK_OK(kv_test_driver_open(&dq, "csattention", pq, 3, &L, P, sink, local, k));
            kv_csattention_view(dq.st, &vq);
            kv_csattention_view(dr.st, &vk);
            CHECK(memcmp(vq.cent, vk.cent, (size_t)2 * 8 * 16 * 4 * sizeof(float)), "centroids=keys changed nothing");
            kv_test_driver_close(&dq);
        }
        kv_test_driver_close(&dr);
    }
    /* bad m is an input error */
    kv_test_driver dr;
    const char *bad[] = {"m=5"};
    kv_status st = kv_test_driver_open(&dr, "csattention", bad, 1, &L, P, sink, local, k);
    CHECK(st == KV_ERR_INPUT, "m=5 with D=32: status %d", (int)st);
    kv_test_driver_close(&dr);
    kv_layer_free(&L);
    return KV_TEST_PASS;
}
